"""Adagrad with learning-rate decay and an initial accumulator value (torch's Adagrad)."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import Optimizer, _check_unsupported, _scalar, _step_counter


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
        # torch creates Adagrad's state eagerly, so a fresh optimizer's state dict has it.
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group)

    def _init_state(self, p, group) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            state["sum"] = F.full_like(p, group["initial_accumulator_value"])
        return state

    def step(self, closure=None):
        loss = self._closure_loss(closure)
        for group in self.param_groups:
            lr = _scalar(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._init_state(p, group)
                step_t = state["step"]
                step_t += 1
                step = step_t.item()
                grad = -p.grad if group["maximize"] else p.grad
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                clr = lr / (1 + (step - 1) * group["lr_decay"])
                state_sum = state["sum"]
                state_sum.addcmul_(grad, grad, value=1)
                std = state_sum.sqrt().add_(group["eps"])
                p.addcdiv_(grad, std, value=-clr)
        return loss
