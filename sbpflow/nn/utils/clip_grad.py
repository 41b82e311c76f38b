"""Gradient clipping, as torch.nn.utils does it."""

from __future__ import annotations

import math

from ...autograd import no_grad
from ...framework.tensor import Tensor


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None):
    from ...framework import functional as F
    from ...framework.functional import reduce

    grads = _grads(parameters)
    norm_type = float(norm_type)
    if not grads:
        return F.tensor(0.0)
    with no_grad():
        total, clip_coef = reduce.clip_coef(grads, max_norm, norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is "
                "non-finite, so it cannot be clipped. To disable this error and scale the "
                "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
            )
        for g in grads:
            g.mul_(clip_coef.to(g.dtype))
    return total


def clip_grad_value_(parameters, clip_value: float, foreach=None) -> None:
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(min=-clip_value, max=clip_value)
