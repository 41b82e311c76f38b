"""Helpers shared by the distributions: broadcasting parameters, probs <-> logits."""

from __future__ import annotations

import functools
import numbers

import numpy as np

from .._core.dtype import get_default_dtype
from ..framework import functional as F
from ..framework.tensor import Tensor

__all__ = ["broadcast_all", "clamp_probs", "lazy_property", "logits_to_probs",
           "probs_to_logits"]


def broadcast_all(*values):
    """Broadcast tensors and numbers to one shape; numbers become tensors of the tensors'
    dtype (the default dtype when there are none)."""
    if not all(isinstance(v, (Tensor, numbers.Number)) for v in values):
        raise ValueError("Input arguments must all be instances of numbers.Number, "
                         "torch.Tensor or objects implementing __torch_function__.")
    if not all(isinstance(v, Tensor) for v in values):
        like = next((v for v in values if isinstance(v, Tensor)), None)
        dtype = like.dtype if like is not None else get_default_dtype()
        values = [v if isinstance(v, Tensor) else F.tensor(float(v), dtype=dtype)
                  for v in values]
    return F.broadcast_tensors(*values)


def draw(fn, shape, like):
    """`fn(shape)` (randn, rand) from the default generator, placed like `like`: on its
    device, or for a global tensor on its placement, broadcast (every rank draws the same
    values, so the logical tensor is one draw)."""
    if getattr(like, "is_global", False):
        from .. import sbp as _sbp

        nd = len(like.sbp)
        return fn(shape, dtype=like.dtype, placement=like.placement,
                  sbp=[_sbp.broadcast] * nd if nd > 1 else _sbp.broadcast)
    return fn(shape, dtype=like.dtype, device=like.device)


def _finfo(dtype):
    return np.finfo(dtype.np)


def clamp_probs(probs):
    """Clamp probabilities into [eps, 1 - eps] of their dtype (keeps logits finite)."""
    eps = float(_finfo(probs.dtype).eps)
    return probs.clamp(min=eps, max=1 - eps)


def logits_to_probs(logits, is_binary=False):
    if is_binary:
        return F.sigmoid(logits)
    return F.softmax(logits, dim=-1)


def probs_to_logits(probs, is_binary=False):
    ps_clamped = clamp_probs(probs)
    if is_binary:
        return F.log(ps_clamped) - F.log1p(-ps_clamped)
    return F.log(ps_clamped)


def softplus(x):
    """log(1 + exp(x)), stable for large |x|."""
    return x.clamp(min=0) + F.log1p(F.exp(-x.abs()))


def sum_rightmost(value, dim: int):
    """Sum out the rightmost `dim` dimensions."""
    if dim == 0:
        return value
    return value.reshape(tuple(value.shape[:-dim]) + (-1,)).sum(-1)


class lazy_property:  # noqa: N801 - torch's name
    """A property computed on first access and then stored on the instance (probs from
    logits and back)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        functools.update_wrapper(self, wrapped)

    def __get__(self, instance, obj_type=None):
        if instance is None:
            return self
        from ..autograd import enable_grad

        with enable_grad():  # cached: must track gradients even if first read under no_grad
            value = self.wrapped(instance)
        instance.__dict__[self.wrapped.__name__] = value
        return value
