"""Adagrad with learning-rate decay and an initial accumulator value (torch's Adagrad)."""

from __future__ import annotations

from ..framework import functional as F
from ..framework.tensor import Tensor
from .optimizer import (
    Optimizer,
    _buckets,
    _check_unsupported,
    _foreach_ok,
    _fused_inplace,
    _HostScalars,
    _scalar,
    _step_counter,
)


class Adagrad(Optimizer):
    """Adagrad, torch's single-tensor update (step t counts from 1):

        g = ±grad + weight_decay * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g                  (s starts at initial_accumulator_value)
        p = p - clr * g / (sqrt(s) + eps)
    """

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        if not 0.0 <= _scalar(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError(
                f"Invalid initial_accumulator_value value: {initial_accumulator_value}"
            )
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        _check_unsupported("Adagrad", differentiable=differentiable, fused=fused)
        defaults = {
            "lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value, "foreach": foreach,
            "maximize": maximize, "differentiable": differentiable, "fused": fused,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()
        # torch creates Adagrad's state eagerly, so a fresh optimizer's state dict has it.
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group)

    def _init_state(self, p, group) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["sum"] = F.full_like(p, group["initial_accumulator_value"])
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_adagrad_update` per (device, dtype) bucket, written in place (the op
        advances the step counters itself, so nothing is read back); False, with nothing
        done, where it doesn't apply."""
        grads = [p.grad for p in params]
        if not _foreach_ok(params + grads):
            return False
        blocks = []
        for p, g in zip(params, grads, strict=True):
            if g._meta != p._meta or not p._meta.dtype.is_floating_point:
                return False  # the per-parameter path raises torch's errors
            state = self._init_state(p, group)
            s, step_t = state.get("sum"), state.get("step")
            if not (isinstance(step_t, Tensor) and step_t._meta.shape == ()
                    and isinstance(s, Tensor) and s._meta == p._meta
                    and _foreach_ok([p, s, step_t])):
                return False
            blocks.append((p, g, s, step_t))
        attrs = {"lr_decay": float(group["lr_decay"]),
                 "weight_decay": float(group["weight_decay"]), "eps": float(group["eps"]),
                 "maximize": bool(group["maximize"])}
        lr = float(_scalar(group["lr"]))
        for bucket in _buckets(blocks, lambda b: (b[0]._device, b[0]._meta.dtype)):
            attrs["n"] = len(bucket)
            tensors = [t for block in bucket for t in block]
            targets = [t for p, _, s, step_t in bucket for t in (p, s, step_t)]
            _fused_inplace("multi_adagrad_update", tensors, (lr,), attrs, targets)
        return True

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        for p in params:
            state = self._init_state(p, group)
            # The count as the host knows it: no read back from the device per step.
            step = self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if group["weight_decay"] != 0:
                grad = grad.add(p, alpha=group["weight_decay"])
            clr = lr / (1 + (step - 1) * group["lr_decay"])
            state_sum = state["sum"]
            state_sum.addcmul_(grad, grad, value=1)
            std = state_sum.sqrt().add_(group["eps"])
            p.addcdiv_(grad, std, value=-clr)
