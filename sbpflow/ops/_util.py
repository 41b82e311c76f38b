"""Helpers shared by op definitions: meta inference and gradient plumbing."""

from __future__ import annotations

from .._core import dtype as dt
from .._core.errors import broadcast_shapes, op_error
from .._core.meta import TensorMeta
from .registry import op


def promote(metas=(), scalars=()) -> dt.DType:
    """torch's result type for tensor metas and Python scalars."""
    dim = [m.dtype for m in metas if m.shape]
    zero = [m.dtype for m in metas if not m.shape]
    return dt.result_type(dim, zero, [dt.scalar_dtype(s) for s in scalars])


def binary_meta(name: str, a: TensorMeta, b: TensorMeta, out_dtype=None) -> TensorMeta:
    shape = broadcast_shapes(name, a.shape, b.shape)
    return TensorMeta(shape, out_dtype or promote((a, b)))


def require_float(name: str, arg: str, m: TensorMeta) -> None:
    if not m.dtype.is_floating_point:
        raise op_error(
            name, f"argument '{arg}' must be a floating point tensor, got {m.dtype.name}",
            TypeError,
        )


def float_result(m: TensorMeta) -> dt.DType:
    """Integer inputs to float ops (exp, sqrt, div) compute in the default float dtype."""
    return m.dtype if m.dtype.is_floating_point else dt.get_default_dtype()


def unbroadcast(g, meta: TensorMeta):
    """Reduce a gradient to an input's shape (undoing broadcasting) and cast to its dtype."""
    shape = tuple(g.shape)
    if shape != meta.shape:
        lead = len(shape) - len(meta.shape)
        dims = tuple(range(lead)) + tuple(
            i + lead for i, n in enumerate(meta.shape) if n == 1 and shape[i + lead] != 1
        )
        if dims:
            g = op("sum", g, dim=dims, keepdim=True)
        if lead or g.shape != meta.shape:
            g = op("reshape", g, shape=meta.shape)
    if g.dtype is not meta.dtype:
        g = op("to_dtype", g, dtype=meta.dtype)
    return g


def cast_array(ctx, x, meta_dtype: dt.DType, want: dt.DType):
    """Cast a kernel input array to the compute dtype when it differs."""
    return x if meta_dtype is want else ctx.prims.cast(x, want)
