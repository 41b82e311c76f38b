"""Reductions."""

from __future__ import annotations

import numpy as np

from .._core import dtype as dt
from .._core.errors import normalize_dims
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from .registry import Attr, OpDef, Sample, op, register


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _sum_dtype(x: TensorMeta, dtype):
    if dtype is not None:
        return dtype
    # torch: integral and bool sums accumulate in int64
    return x.dtype if x.dtype.is_floating_point else dt.int64


def _sum_meta(x, dim=None, keepdim=False, dtype=None):
    dims = normalize_dims("sum", dim, x.ndim)
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), _sum_dtype(x, dtype))


def _sum_kernel(ctx, x, dim=None, keepdim=False, dtype=None):
    dims = normalize_dims("sum", dim, ctx.in_metas[0].ndim)
    out = ctx.out_metas[0].dtype
    if ctx.in_metas[0].dtype is not out:
        x = ctx.prims.cast(x, out)
    r = ctx.prims.reduce("sum", x, dims, keepdim)
    # A reduction over nothing returns the input itself: copy so outputs never alias inputs.
    return ctx.prims.contiguous(r) if not dims else r


def _sum_grad(ctx, g):
    x = ctx.in_metas[0]
    dims = normalize_dims("sum", ctx.attrs["dim"], x.ndim)
    if not ctx.attrs["keepdim"]:
        g = op("reshape", g, shape=_reduced_shape(x.shape, dims, True))
    g = op("expand", g, size=x.shape)
    if g.dtype is not x.dtype:
        g = op("to_dtype", g, dtype=x.dtype)
    return (g,)


def _sum_sbp(x, dim=None, keepdim=False, dtype=None):
    dims = normalize_dims("sum", dim, x.ndim)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]
    kept = 0
    for i in range(x.ndim):
        if x.shape[i] <= 1:
            kept += i not in dims
            continue
        if i in dims:
            sigs.append(Signature((Split(i),), (P,)))  # (S(i)) -> P: partial sums per piece
        else:
            out_axis = i if keepdim else kept
            sigs.append(Signature((Split(i),), (Split(out_axis),)))
        kept += i not in dims
    return sigs


register(OpDef(
    "sum",
    inputs=("input",),
    attrs={"dim": Attr("ints", None), "keepdim": Attr("bool", False),
           "dtype": Attr("dtype", None)},
    infer_meta=_sum_meta,
    kernel=_sum_kernel,
    grad=_sum_grad,
    sbp=_sum_sbp,
    reference="sum",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3)),
        Sample(_rand(rng, 2, 3, 4), dim=1),
        Sample(_rand(rng, 2, 3, 4), dim=(0, 2), keepdim=True),
        Sample(_rand(rng, 5, 3), dim=-1),
        Sample((_rand(rng, 4, 3) * 3).astype(np.int32), dim=0, grad=False),
    ],
))
