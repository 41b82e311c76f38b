"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay)."""

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


class Adam(Optimizer):
    """Adam, torch's single-tensor update (step t counts from 1):

        g = ±grad (+ weight_decay * p, Adam)       p = p * (1 - lr * weight_decay) (AdamW)
        m = lerp(m, g, 1 - beta1)                  v = beta2 * v + (1 - beta2) * g * g
        v_hat = max(v_hat, v) (amsgrad)
        p = p - lr / (1 - beta1^t) * m / (sqrt(v or v_hat) / sqrt(1 - beta2^t) + eps)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False,
                 do_bias_correction=True):
        if not 0.0 <= _scalar(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        betas = tuple(_scalar(b) for b in betas)
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported(type(self).__name__, capturable=capturable,
                           differentiable=differentiable, fused=fused)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
            "amsgrad": amsgrad, "maximize": maximize, "foreach": foreach,
            "capturable": capturable, "differentiable": differentiable, "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        if not do_bias_correction:
            # OneFlow's switch: no 1 - beta^t corrections of the moments (a group may set
            # it too).  Stored only when off, so a default group is torch's, key for key.
            defaults["do_bias_correction"] = False
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p, amsgrad: bool):
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
            if amsgrad:
                state["max_exp_avg_sq"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_adam_update` per (device, dtype) bucket, written in place (torch's
        foreach path; the op advances the step counters itself, so nothing is read back);
        False, with nothing done, where it doesn't apply."""
        amsgrad = bool(group["amsgrad"])
        grads = [p.grad for p in params]
        if not group.get("do_bias_correction", True) or not _foreach_ok(params + grads):
            return False  # the multi-tensor op always corrects: the per-parameter path
        keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg",
                                                                             "exp_avg_sq")
        blocks = []
        for p, g in zip(params, grads, strict=True):
            if g._meta != p._meta or not p._meta.dtype.is_floating_point:
                return False  # the per-parameter path raises torch's errors
            state = self._state_for(p, amsgrad)
            states = [state.get(k) for k in keys]
            step_t = state.get("step")
            if not (isinstance(step_t, Tensor) and step_t._meta.shape == ()
                    and all(isinstance(s, Tensor) and s._meta == p._meta for s in states)
                    and _foreach_ok([p, *states, step_t])):
                return False
            blocks.append((p, g, states, step_t))
        beta1, beta2 = (float(_scalar(b)) for b in group["betas"])
        attrs = {"beta1": beta1, "beta2": beta2, "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]),
                 "decoupled_weight_decay": bool(group["decoupled_weight_decay"]),
                 "amsgrad": amsgrad, "maximize": bool(group["maximize"])}
        lr = float(_scalar(group["lr"]))
        for bucket in _buckets(blocks, lambda b: (b[0]._device, b[0]._meta.dtype)):
            attrs["n"] = len(bucket)
            tensors = [t for p, g, states, step_t in bucket for t in (p, g, *states, step_t)]
            targets = [t for p, _, states, step_t in bucket for t in (p, *states, step_t)]
            _fused_inplace("multi_adam_update", tensors, (lr,), attrs, targets)
        return True

    def _single_group(self, group, params) -> None:
        beta1, beta2 = (_scalar(b) for b in group["betas"])
        lr = _scalar(group["lr"])
        weight_decay = group["weight_decay"]
        eps = group["eps"]
        amsgrad = group["amsgrad"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            state = self._state_for(p, amsgrad)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            # The count as the host knows it: no read back from the device per step.
            step = self._host.advance(p, state)
            if weight_decay != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * weight_decay)
                else:
                    grad = grad.add(p, alpha=weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            if group.get("do_bias_correction", True):
                bias_correction1 = 1 - beta1**step
                bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            else:
                bias_correction1 = bias_correction2_sqrt = 1.0
            step_size = lr / bias_correction1
            if amsgrad:
                max_exp_avg_sq = state["max_exp_avg_sq"]
                max_exp_avg_sq.copy_(F.maximum(max_exp_avg_sq, exp_avg_sq))
                denom = (state["max_exp_avg_sq"].sqrt() / bias_correction2_sqrt).add_(eps)
            else:
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)


class AdamW(Adam):
    """Adam with decoupled weight decay (default 1e-2): p *= 1 - lr * weight_decay each step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None, do_bias_correction=True):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, do_bias_correction=do_bias_correction)

    def _fix_loaded_groups(self) -> None:
        super()._fix_loaded_groups()
        # Loading any state into AdamW keeps the decay decoupled, as torch does.
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True
