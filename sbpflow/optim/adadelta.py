"""Adadelta: learning rates from running averages of squared gradients and updates."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import (
    Optimizer,
    _check_lr,
    _check_unsupported,
    _foreach_update,
    _HostScalars,
    _scalar,
    _step_counter,
)


class Adadelta(Optimizer):
    """Adadelta, torch's single-tensor update:

        g = ±grad + weight_decay * p
        v = rho * v + (1 - rho) * g * g                      (square_avg)
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta              (acc_delta)
        p = p - lr * delta
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        _check_lr(lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("Adadelta", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay,
            "maximize": maximize, "capturable": capturable, "foreach": foreach,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["square_avg"] = F.zeros_like(p)
            state["acc_delta"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_adadelta_update` per (device, dtype) bucket, written in place (the op
        advances the step counts); False, with nothing done, where it doesn't apply."""
        attrs = {"rho": float(group["rho"]), "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_adadelta_update", params, self._state_for,
                               ("square_avg", "acc_delta"), ("step",), attrs,
                               (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        rho, eps, weight_decay = group["rho"], group["eps"], group["weight_decay"]
        for p in params:
            state = self._state_for(p)
            self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                grad = grad.add(p, alpha=weight_decay)
            square_avg, acc_delta = state["square_avg"], state["acc_delta"]
            square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
            std = square_avg.add(eps).sqrt_()
            delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
            acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
            p.add_(delta, alpha=-lr)

