"""Rprop: resilient backpropagation, a per-element step size driven by gradient signs."""

from __future__ import annotations

from ..framework import functional as F
from .optimizer import (
    Optimizer,
    _check_lr,
    _check_unsupported,
    _foreach_update,
    _HostScalars,
    _step_counter,
)


class Rprop(Optimizer):
    """Rprop, torch's single-tensor update:

        s = sign(grad * prev)
        step_size = clamp(step_size * (etaplus if s > 0, etaminus if s < 0, else 1),
                          *step_sizes)
        grad = 0 where s < 0                       (a sign change skips this element's step)
        p = p - sign(grad) * step_size;  prev = grad
    """

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), *,
                 capturable=False, foreach=None, maximize=False, differentiable=False):
        _check_lr(lr)
        etaminus, etaplus = etas
        if not 0.0 < etaminus < 1.0 < etaplus:
            raise ValueError(f"Invalid eta values: {etaminus}, {etaplus}")
        _check_unsupported("Rprop", capturable=capturable, differentiable=differentiable)
        defaults = {
            "lr": lr, "etas": etas, "step_sizes": step_sizes, "foreach": foreach,
            "maximize": maximize, "differentiable": differentiable, "capturable": capturable,
        }
        super().__init__(params, defaults)
        self._host = _HostScalars()

    def _state_for(self, p, group) -> dict:
        state = self.state[p]
        if len(state) == 0:
            state["step"] = _step_counter()
            self._host.remember(p, state, "step", 0.0)
            state["prev"] = F.zeros_like(p)
            state["step_size"] = F.full_like(p.grad, group["lr"])
        return state

    def step(self, closure=None):
        return self._step_groups(closure)

    def _foreach_group(self, group, params) -> bool:
        """One `multi_rprop_update` per (device, dtype) bucket, written in place (the op
        advances the step counts); False, with nothing done, where it doesn't apply."""
        etaminus, etaplus = group["etas"]
        step_size_min, step_size_max = group["step_sizes"]
        attrs = {"etaminus": float(etaminus), "etaplus": float(etaplus),
                 "step_size_min": float(step_size_min), "step_size_max": float(step_size_max),
                 "maximize": bool(group["maximize"])}
        return _foreach_update("multi_rprop_update", params,
                               lambda p: self._state_for(p, group), ("prev", "step_size"),
                               ("step",), attrs, ())

    def _single_group(self, group, params) -> None:
        etaminus, etaplus = group["etas"]
        step_size_min, step_size_max = group["step_sizes"]
        for p in params:
            if p.grad.is_sparse:
                raise RuntimeError("Rprop does not support sparse gradients")
            state = self._state_for(p, group)
            self._host.advance(p, state)
            grad = -p.grad if group["maximize"] else p.grad
            prev, step_size = state["prev"], state["step_size"]
            sign = (grad * prev).sign()
            up, down = sign > 0, sign < 0
            # the factors in the gradient's dtype, as torch writes them into `sign`
            factor = sign.masked_fill(up, etaplus).masked_fill(down, etaminus)
            factor = factor.masked_fill(sign == 0, 1)
            step_size.mul_(factor).clamp_(step_size_min, step_size_max)
            grad = grad.masked_fill(down, 0)
            p.addcmul_(grad.sign(), step_size, value=-1)
            prev.copy_(grad)

