"""ASGD: averaged stochastic gradient descent (torch's ASGD)."""

from __future__ import annotations

import numpy as np

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


class ASGD(Optimizer):
    """ASGD, torch's single-tensor update (step t counts from 1; eta starts at lr, mu at 1):

        g = ±grad + weight_decay * p
        p = p * (1 - lambd * eta) - eta * g
        ax = p if mu == 1 else ax + mu * (p - ax)            (the averaged parameter)
        eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)

    `step`, `eta` and `mu` are 0-d tensors of the state, as in torch.
    """

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0,
                 foreach=None, maximize=False, differentiable=False, capturable=False):
        _check_lr(lr)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        _check_unsupported("ASGD", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0, "weight_decay": weight_decay,
            "foreach": foreach, "maximize": maximize, "differentiable": differentiable,
            "capturable": capturable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p, group) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            lr = _scalar(group["lr"])
            state["eta"] = _step_counter(lr)
            self._host.remember(p, state, "eta", lr)
            state["mu"] = _step_counter(1.0)
            self._host.remember(p, state, "mu", 1.0)
            state["ax"] = F.zeros_like(p)
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_asgd_update` per (device, dtype) bucket, written in place (the op
        advances step, eta and mu and reads them itself); False, with nothing done, where it
        doesn't apply."""
        attrs = {"lambd": float(group["lambd"]), "alpha": float(group["alpha"]),
                 "t0": float(group["t0"]), "weight_decay": float(group["weight_decay"]),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_asgd_update", params,
                               lambda p: self._state_for(p, group), ("ax",),
                               ("step", "eta", "mu"), attrs, (float(_scalar(group["lr"])),))

    def _single_group(self, group, params) -> None:
        lr = _scalar(group["lr"])
        lambd, alpha, t0 = group["lambd"], group["alpha"], group["t0"]
        weight_decay = group["weight_decay"]
        for p in params:
            state = self._state_for(p, group)
            step = self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            if weight_decay != 0:
                grad = grad.add(p, alpha=weight_decay)
            eta = self._host.get(p, state, "eta")
            p.mul_(1 - lambd * eta)
            p.add_(grad, alpha=-eta)
            mu = self._host.get(p, state, "mu")
            ax = state["ax"]
            if mu != 1:
                ax.add_(p.sub(ax).mul_(mu))
            else:
                ax.copy_(p)
            # torch makes both new values float32 tensors (the default dtype) before
            # copying them into the state, whatever the state's dtype: round likewise.
            self._host.set(p, state, "eta", _float32(lr / ((1 + lambd * lr * step) ** alpha)))
            self._host.set(p, state, "mu", _float32(1 / max(1, step - t0)))



def _float32(value: float) -> float:
    return float(np.float32(value))
