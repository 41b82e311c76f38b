"""Elementwise ops: unary math, binary arithmetic with broadcasting and type promotion, and
their scalar forms (OneFlow's scalar_add etc.), which avoid materialising a Python number as a
tensor and promote it as torch promotes a wrapped number."""

from __future__ import annotations

import numpy as np

from .._core import dtype as dt
from .._core.meta import TensorMeta
from ..sbp import elementwise_signatures
from ._util import binary_meta, cast_array, float_result, promote, unbroadcast
from .registry import Attr, OpDef, Sample, op, register


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# -- clone / cast ---------------------------------------------------------------------------
register(OpDef(
    "clone",
    inputs=("input",),
    infer_meta=lambda x: x,
    kernel=lambda ctx, x: ctx.prims.contiguous(x),
    grad=lambda ctx, g: (g,),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape, partial=[("P",)]),
    reference="clone",
    samples=lambda rng: [Sample(_rand(rng, 2, 3)), Sample(_rand(rng, 4).astype(np.int32))],
))


def _to_dtype_grad(ctx, g):
    return (op("to_dtype", g, dtype=ctx.in_metas[0].dtype),)


register(OpDef(
    "to_dtype",
    inputs=("input",),
    attrs={"dtype": Attr("dtype")},
    infer_meta=lambda x, dtype: TensorMeta(x.shape, dtype),
    kernel=lambda ctx, x, dtype: ctx.prims.cast(x, dtype),
    grad=_to_dtype_grad,
    # P -> P only into a floating dtype: casting partial sums to int would round each piece.
    sbp=lambda x, dtype: elementwise_signatures(
        [x.shape], x.shape, partial=[("P",)] if dtype.is_floating_point else []),
    reference=lambda torch, x, dtype: x.to(dtype),
    samples=lambda rng: [Sample(_rand(rng, 2, 3), dtype=dt.float32),
                         Sample(_rand(rng, 3), dtype=dt.float16),
                         Sample(_rand(rng, 3) * 10, dtype=dt.int32, grad=False)],
))


# -- binary ---------------------------------------------------------------------------------
def _binary_kernel(name):
    def kernel(ctx, a, b):
        out = ctx.out_metas[0].dtype
        a = cast_array(ctx, a, ctx.in_metas[0].dtype, out)
        b = cast_array(ctx, b, ctx.in_metas[1].dtype, out)
        return ctx.prims.binary(name, a, b)

    return kernel


def _add_grad(ctx, g):
    a, b = ctx.in_metas
    return unbroadcast(g, a), unbroadcast(g, b)


def _mul_grad(ctx, g):
    a, b = ctx.inputs
    ga = unbroadcast(g * b, ctx.in_metas[0]) if ctx.needs_input_grad[0] else None
    gb = unbroadcast(g * a, ctx.in_metas[1]) if ctx.needs_input_grad[1] else None
    return ga, gb


def _binary_samples(rng):
    return [
        Sample(_rand(rng, 2, 3), _rand(rng, 2, 3)),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1)),
        Sample(_rand(rng, 3), np.asarray(1.5)),
        Sample(_rand(rng, 5, 3).astype(np.float32), _rand(rng, 3)),
        Sample((_rand(rng, 2, 3) * 5).astype(np.int64), _rand(rng, 3).astype(np.float32)),
    ]


register(OpDef(
    "add",
    inputs=("input", "other"),
    infer_meta=lambda a, b: binary_meta("add", a, b),
    kernel=_binary_kernel("add"),
    grad=_add_grad,
    # (P, P) -> P: the sum of sums.
    sbp=lambda a, b: elementwise_signatures([a.shape, b.shape], binary_meta("add", a, b).shape,
                                            partial=[("P", "P")]),
    reference="add",
    samples=_binary_samples,
))

register(OpDef(
    "mul",
    inputs=("input", "other"),
    infer_meta=lambda a, b: binary_meta("mul", a, b),
    kernel=_binary_kernel("mul"),
    grad=_mul_grad,
    # (P, B) -> P and (B, P) -> P: linear in each operand separately, never (P, P).
    sbp=lambda a, b: elementwise_signatures([a.shape, b.shape], binary_meta("mul", a, b).shape,
                                            partial=[("P", "B"), ("B", "P")]),
    reference="mul",
    samples=_binary_samples,
))


# -- scalar forms ---------------------------------------------------------------------------
def _scalar_meta(x: TensorMeta, other, reverse=False) -> TensorMeta:
    return TensorMeta(x.shape, promote((x,), (other,)))


def _scalar_kernel(name):
    def kernel(ctx, x, other, reverse=False):
        out = ctx.out_metas[0].dtype
        x = cast_array(ctx, x, ctx.in_metas[0].dtype, out)
        s = np.asarray(other, dtype=out.np)
        return ctx.prims.binary(name, s, x) if reverse else ctx.prims.binary(name, x, s)

    return kernel


def _scalar_samples(rng):
    return [Sample(_rand(rng, 2, 3), other=2.5), Sample(_rand(rng, 3), other=-1),
            Sample(_rand(rng, 3).astype(np.float32), other=3.0, reverse=True),
            Sample((_rand(rng, 4) * 4).astype(np.int32), other=2, grad=False),
            Sample((_rand(rng, 4) * 4).astype(np.int64), other=0.5, grad=False)]


_SCALAR_ATTRS = {"other": Attr("scalar"), "reverse": Attr("bool", False)}

register(OpDef(
    "add_scalar",
    inputs=("input",),
    attrs=_SCALAR_ATTRS,
    infer_meta=_scalar_meta,
    kernel=_scalar_kernel("add"),
    grad=lambda ctx, g: (unbroadcast(g, ctx.in_metas[0]),),
    sbp=lambda x, other, reverse: elementwise_signatures([x.shape], x.shape),
    reference=lambda torch, x, other, reverse=False: other + x if reverse else x + other,
    samples=_scalar_samples,
))

register(OpDef(
    "mul_scalar",
    inputs=("input",),
    attrs=_SCALAR_ATTRS,
    infer_meta=_scalar_meta,
    kernel=_scalar_kernel("mul"),
    grad=lambda ctx, g: (unbroadcast(op("mul_scalar", g, other=ctx.attrs["other"]),
                                     ctx.in_metas[0]),),
    sbp=lambda x, other, reverse: elementwise_signatures([x.shape], x.shape, partial=[("P",)]),
    reference=lambda torch, x, other, reverse=False: other * x if reverse else x * other,
    samples=_scalar_samples,
))


# -- unary ----------------------------------------------------------------------------------
register(OpDef(
    "neg",
    inputs=("input",),
    infer_meta=lambda x: x,
    kernel=lambda ctx, x: ctx.prims.unary("neg", x),
    grad=lambda ctx, g: (op("neg", g),),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape, partial=[("P",)]),
    reference="neg",
    samples=lambda rng: [Sample(_rand(rng, 2, 3)), Sample(_rand(rng, 3).astype(np.int64))],
))


def _float_unary_kernel(name):
    def kernel(ctx, x):
        return ctx.prims.unary(name, cast_array(ctx, x, ctx.in_metas[0].dtype,
                                                ctx.out_metas[0].dtype))

    return kernel


register(OpDef(
    "exp",
    inputs=("input",),
    infer_meta=lambda x: TensorMeta(x.shape, float_result(x)),
    kernel=_float_unary_kernel("exp"),
    grad=lambda ctx, g: (g * ctx.output(0),),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape),
    reference="exp",
    samples=lambda rng: [Sample(_rand(rng, 2, 3)), Sample(_rand(rng, 3).astype(np.int64) * 0)],
))
