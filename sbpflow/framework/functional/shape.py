"""Shape and view functions."""

from __future__ import annotations

from ...ops.shape import infer_size
from ..tensor import Tensor, _contiguous_strides
from ._base import call, shape_args


def _viewable(t: Tensor, shape) -> bool:
    """Can `shape` be a view of t's memory?  (Contiguous tensors always can.)"""
    return t.is_contiguous()


def view(input: Tensor, *shape):
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list)) and not isinstance(
        shape[0], int
    ):
        from ..._core.dtype import as_dtype

        return call("view_dtype", input, dtype=as_dtype(shape[0]))
    return call("view", input, shape=shape_args("view", shape))


def reshape(input: Tensor, *shape):
    shape = infer_size("reshape", shape_args("reshape", shape), input.numel())
    if shape == input._meta.shape:
        return call("view", input, shape=shape)
    if _viewable(input, shape):
        return call("view", input, shape=shape)
    return call("reshape", input, shape=shape)


def expand(input: Tensor, *size):
    return call("expand", input, size=shape_args("expand", size))


def expand_as(input: Tensor, other: Tensor):
    return call("expand", input, size=tuple(other.shape))


def permute(input: Tensor, *dims):
    return call("permute", input, dims=shape_args("permute", dims))


def transpose(input: Tensor, dim0: int, dim1: int):
    return call("transpose", input, dim0=dim0, dim1=dim1)


def t(input: Tensor):
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else view(input, tuple(input.shape))


def contiguous(input: Tensor, memory_format=None):
    return input if input.is_contiguous() else call("clone", input)


METHODS = {
    "view": view, "reshape": reshape, "expand": expand, "expand_as": expand_as,
    "permute": permute, "transpose": transpose, "t": t, "contiguous": contiguous,
    "view_as": lambda self, other: view(self, tuple(other.shape)),
    "reshape_as": lambda self, other: reshape(self, tuple(other.shape)),
    "T": property(lambda self: permute(self, tuple(reversed(range(self.ndim))))),
    "mT": property(lambda self: transpose(self, -2, -1)),
}

__all__ = ["contiguous", "expand", "permute", "reshape", "t", "transpose", "view"]

_ = _contiguous_strides
