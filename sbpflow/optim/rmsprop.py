"""RMSprop: plain or centered, with optional momentum and weight decay (torch's RMSprop)."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import (
    Optimizer,
    _check_unsupported,
    _foreach_update,
    _scalar,
    _step_counter,
)


class RMSprop(Optimizer):
    """RMSprop, torch's single-tensor update:

        g = ±grad + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        centered: m = lerp(m, g, 1 - alpha); avg = sqrt(v - m * m) + eps;  else sqrt(v) + eps
        momentum > 0: b = momentum * b + g / avg; p = p - lr * b;  else p = p - lr * g / avg
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        if not 0.0 <= _scalar(lr):
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        _check_unsupported("RMSprop", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
            "weight_decay": weight_decay, "capturable": capturable, "foreach": foreach,
            "maximize": maximize, "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _state_for(self, p, group) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            state["square_avg"] = F.zeros_like(p)
            if group["momentum"] > 0:
                state["momentum_buffer"] = F.zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_rmsprop_update` per (device, dtype) bucket, written in place (the op
        advances the step counts); False, with nothing done, where it doesn't apply."""
        momentum, centered = float(group["momentum"]), bool(group["centered"])
        keys = ("square_avg",) + (("momentum_buffer",) if momentum > 0 else ()) + (
            ("grad_avg",) if centered else ())
        attrs = {"alpha": float(group["alpha"]), "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]), "momentum": momentum,
                 "centered": centered, "maximize": bool(group["maximize"])}
        return _foreach_update("multi_rmsprop_update", params,
                               lambda p: self._state_for(p, group), keys, ("step",), attrs,
                               (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            state = self._state_for(p, group)
            state["step"] += 1
            if group["weight_decay"] != 0:
                grad = grad.add(p, alpha=group["weight_decay"])
            square_avg = state["square_avg"]
            square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
            if group["centered"]:
                grad_avg = state["grad_avg"]
                grad_avg.lerp_(grad, 1 - alpha)
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            else:
                avg = square_avg.sqrt()
            avg = avg.add_(eps)
            if momentum > 0:
                buf = state["momentum_buffer"]
                buf.mul_(momentum).addcdiv_(grad, avg)
                p.add_(buf, alpha=-lr)
            else:
                p.addcdiv_(grad, avg, value=-lr)
