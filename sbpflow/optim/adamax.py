"""Adamax: Adam with the infinity norm of past gradients in place of their second moment."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import (
    Optimizer,
    _check_betas,
    _check_lr,
    _check_unsupported,
    _foreach_update,
    _HostScalars,
    _scalar,
    _step_counter,
)


class Adamax(Optimizer):
    """Adamax, torch's single-tensor update (step t counts from 1):

        g = ±grad + weight_decay * p
        m = lerp(m, g, 1 - beta1)                            (exp_avg)
        u = max(beta2 * u, |g| + eps)                        (exp_inf)
        p = p - lr / (1 - beta1^t) * m / u
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 foreach=None, *, maximize=False, differentiable=False, capturable=False):
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        betas = _check_betas(betas)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("Adamax", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
            "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
            "capturable": capturable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_inf"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_adamax_update` per (device, dtype) bucket, written in place (the op
        advances the step counts and reads them itself); False, with nothing done, where it
        doesn't apply."""
        beta1, beta2 = (float(_scalar(b)) for b in group["betas"])
        attrs = {"beta1": beta1, "beta2": beta2, "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_adamax_update", params, self._state_for,
                               ("exp_avg", "exp_inf"), ("step",), attrs,
                               (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        beta1, beta2 = (_scalar(b) for b in group["betas"])
        eps, weight_decay = group["eps"], group["weight_decay"]
        for p in params:
            state = self._state_for(p)
            # The count as the host knows it: no read back from the device per step.
            step = self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                grad = grad.add(p, alpha=weight_decay)
            exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_inf.copy_(F.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps)))
            clr = lr / (1 - beta1**step)
            p.addcdiv_(exp_avg, exp_inf, value=-clr)

