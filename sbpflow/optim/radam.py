"""RAdam: Adam with a rectified adaptive learning rate (torch's RAdam)."""

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


class RAdam(Optimizer):
    """RAdam, torch's single-tensor update (step t counts from 1):

        g = ±grad (+ weight_decay * p)          p = p * (1 - lr * weight_decay) (decoupled)
        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)
        rho_t > 5:  p = p - lr * m / (1 - beta1^t) * sqrt(1 - beta2^t) / (sqrt(v) + eps) * r_t
                    r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
        otherwise:  p = p - lr * m / (1 - beta1^t)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False):
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        betas = _check_betas(betas)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("RAdam", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
            "maximize": maximize, "foreach": foreach, "capturable": capturable,
            "decoupled_weight_decay": decoupled_weight_decay, "differentiable": differentiable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["exp_avg"] = F.zeros_like(p)
            state["exp_avg_sq"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_radam_update` per (device, dtype) bucket, written in place (the op
        advances the step counts and reads them itself); False, with nothing done, where it
        doesn't apply."""
        beta1, beta2 = (float(_scalar(b)) for b in group["betas"])
        attrs = {"beta1": beta1, "beta2": beta2, "eps": float(group["eps"]),
                 "weight_decay": float(group["weight_decay"]),
                 "decoupled_weight_decay": bool(group["decoupled_weight_decay"]),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_radam_update", params, self._state_for,
                               ("exp_avg", "exp_avg_sq"), ("step",), attrs,
                               (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        beta1, beta2 = (_scalar(b) for b in group["betas"])
        eps, weight_decay = group["eps"], group["weight_decay"]
        for p in params:
            state = self._state_for(p)
            step = self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                if group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * weight_decay)
                else:
                    grad = grad.add(p, alpha=weight_decay)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            update = (exp_avg / bias_correction1) * lr
            rho_inf = 2 / (1 - beta2) - 1
            rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
            if rho_t > 5.0:
                rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                        / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                adaptive = bias_correction2**0.5 / exp_avg_sq.sqrt().add_(eps)
                update = update.mul_(adaptive).mul_(rect)
            p.add_(update, alpha=-1.0)

