"""Creation ops: no tensor inputs; shape, value and dtype come as attrs.  Kernels fill only
their piece of the logical output (ctx.piece()), so global tensors reuse them."""

from __future__ import annotations

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, Signature, Split
from .registry import Attr, OpDef, Sample, register


def _check_shape(name, shape):
    for s in shape:
        if s < 0:
            raise op_error(name, f"Trying to create tensor with negative dimension {s}: "
                           f"{list(shape)}")
    return tuple(shape)


def creation_sbp(shape):
    """A creation op can produce any split or broadcast directly (never partial)."""
    return [Signature((), (B,))] + [
        Signature((), (Split(i),)) for i, n in enumerate(shape) if n > 1
    ]


register(OpDef(
    "full",
    inputs=(),
    attrs={"shape": Attr("ints"), "fill_value": Attr("scalar"), "dtype": Attr("dtype")},
    infer_meta=lambda shape, fill_value, dtype: TensorMeta(_check_shape("full", shape), dtype),
    kernel=lambda ctx, shape, fill_value, dtype: ctx.prims.full(ctx.out_metas[0].shape, dtype,
                                                                fill_value),
    sbp=lambda shape, fill_value, dtype: creation_sbp(shape),
    reference=lambda torch, shape, fill_value, dtype: torch.full(shape, fill_value, dtype=dtype),
    samples=lambda rng: [Sample(shape=(2, 3), fill_value=1.5, dtype=dt.float32),
                         Sample(shape=(3,), fill_value=7, dtype=dt.int64)],
))
