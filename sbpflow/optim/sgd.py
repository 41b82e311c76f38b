"""SGD with momentum, dampening, Nesterov momentum, weight decay and maximize (torch's SGD)."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import Optimizer, _buckets, _check_unsupported, _foreach_ok, _fused_inplace, _scalar


class SGD(Optimizer):
    """Stochastic gradient descent, torch's single-tensor update:

        g = ±grad + weight_decay * p
        b = g (first step) else momentum * b + (1 - dampening) * g
        g = g + momentum * b (nesterov) else b
        p = p - lr * g
    """

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        if _scalar(lr) < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        _check_unsupported("SGD", differentiable=differentiable, fused=fused)
        defaults = {
            "lr": lr, "momentum": momentum, "dampening": dampening,
            "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
            "foreach": foreach, "differentiable": differentiable, "fused": fused,
        }
        super().__init__(params, defaults)

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_sgd_update` per (device, dtype, has a buffer) bucket, written in place
        (torch's foreach path); False, with nothing done, where it doesn't apply."""
        momentum = group["momentum"]
        grads = [p.grad for p in params]
        if not _foreach_ok(params + grads):
            return False
        bufs = []
        for p, g in zip(params, grads, strict=True):
            if g._meta != p._meta or not p._meta.dtype.is_floating_point:
                return False  # the per-parameter path raises torch's errors
            buf = self.state[p].get("momentum_buffer") if momentum != 0 else None
            if buf is not None and (buf._meta != p._meta or not _foreach_ok([p, buf])):
                return False
            bufs.append(buf)
        attrs = {"momentum": float(momentum), "dampening": float(group["dampening"]),
                 "nesterov": bool(group["nesterov"]),
                 "weight_decay": float(group["weight_decay"]),
                 "maximize": bool(group["maximize"])}
        lr = float(_scalar(group["lr"]))
        items = list(zip(params, grads, bufs, strict=True))
        for bucket in _buckets(items, lambda i: (i[0]._device, i[0]._meta.dtype, i[2] is None)):
            attrs["n"] = len(bucket)
            if momentum == 0:
                tensors = [t for p, g, _ in bucket for t in (p, g)]
                _fused_inplace("multi_sgd_update", tensors, (lr,), attrs,
                               [p for p, _, _ in bucket])
                continue
            first = bucket[0][2] is None
            if first:  # the first step: the buffer becomes the (decayed) gradient
                bucket = [(p, g, F.empty_like(p)) for p, g, _ in bucket]
            tensors = [t for item in bucket for t in item]
            targets = [t for p, _, b in bucket for t in (p, b)]
            _fused_inplace("multi_sgd_update", tensors, (lr, 1.0 if first else 0.0), attrs,
                           targets)
            if first:
                for p, _, buf in bucket:
                    self.state[p]["momentum_buffer"] = buf
        return True

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        momentum = group["momentum"]
        weight_decay = group["weight_decay"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                grad = grad.add(p, alpha=weight_decay)
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = grad.detach().clone()
                    state["momentum_buffer"] = buf
                else:
                    buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            p.add_(grad, alpha=-lr)
