"""Matrix products."""

from __future__ import annotations

from .._core.errors import broadcast_shapes, op_error
from .._core.meta import TensorMeta
from ..sbp import einsum_signatures
from ._util import cast_array, promote, unbroadcast
from .registry import OpDef, Sample, op, register


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _matmul_meta(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise op_error("matmul", "both arguments to matmul need to be at least 1D, but they are "
                       f"{a.ndim}D and {b.ndim}D")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        sa = "x".join(map(str, a.shape if a.ndim > 1 else (1,) + a.shape))
        sb = "x".join(map(str, b.shape))
        raise op_error("matmul", f"mat1 and mat2 shapes cannot be multiplied ({sa} and {sb})")
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    shape = batch + (a.shape[-2],) * (a.ndim >= 2) + (b.shape[-1],) * (b.ndim >= 2)
    dtype = promote((a, b))
    if a.dtype is not b.dtype:
        raise op_error("matmul", f"expected m1 and m2 to have the same dtype, but got: "
                       f"{a.dtype.name} != {b.dtype.name}")
    return TensorMeta(shape, dtype)


def _matmul_kernel(ctx, a, b):
    return ctx.prims.matmul(a, b)


def _matmul_grad(ctx, g):
    a, b = ctx.inputs
    am, bm = ctx.in_metas
    ga = gb = None
    # Promote 1-D operands to matrices so the products below are plain batched matmuls.
    a2 = a if am.ndim > 1 else op("reshape", a, shape=(1, am.shape[0]))
    b2 = b if bm.ndim > 1 else op("reshape", b, shape=(bm.shape[0], 1))
    g2 = g
    if am.ndim == 1:
        g2 = op("reshape", g2, shape=g2.shape[:-1] + (1,) + g2.shape[-1:]) if bm.ndim > 1 else \
            op("reshape", g2, shape=(1,) + tuple(g2.shape))
    if bm.ndim == 1:
        g2 = op("reshape", g2, shape=tuple(g2.shape) + (1,))
    if ctx.needs_input_grad[0]:
        ga = op("matmul", g2, op("transpose", b2, dim0=-1, dim1=-2))
        ga = unbroadcast(ga, TensorMeta(a2.shape if am.ndim > 1 else (1,) + am.shape, am.dtype))
        if am.ndim == 1:
            ga = op("reshape", ga, shape=am.shape)
    if ctx.needs_input_grad[1]:
        gb = op("matmul", op("transpose", a2, dim0=-1, dim1=-2), g2)
        gb = unbroadcast(gb, TensorMeta(b2.shape if bm.ndim > 1 else bm.shape + (1,), bm.dtype))
        if bm.ndim == 1:
            gb = op("reshape", gb, shape=bm.shape)
    return ga, gb


def matmul_spec(an: int, bn: int) -> str:
    """The einsum string of matmul for operands of an and bn dims (batch dims broadcast)."""
    nb = max(an, bn) - 2
    batch = "abcdefgh"[: max(nb, 0)]
    if an == 1 and bn == 1:
        return "k,k->"
    if an == 1:
        return f"k,{batch[nb - (bn - 2):]}kn->{batch}n"
    if bn == 1:
        return f"{batch[nb - (an - 2):]}mk,k->{batch}m"
    return f"{batch[nb - (an - 2):]}mk,{batch[nb - (bn - 2):]}kn->{batch}mn"


def _matmul_sbp(a, b):
    return einsum_signatures(matmul_spec(a.ndim, b.ndim), [a.shape, b.shape])


register(OpDef(
    "matmul",
    inputs=("input", "other"),
    infer_meta=_matmul_meta,
    kernel=_matmul_kernel,
    grad=_matmul_grad,
    sbp=_matmul_sbp,
    reference="matmul",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _rand(rng, 4, 5)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 2, 4, 5)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 4, 2)),
        Sample(_rand(rng, 4), _rand(rng, 4, 3)),
        Sample(_rand(rng, 3, 4), _rand(rng, 4)),
        Sample(_rand(rng, 4), _rand(rng, 4)),
    ],
))
