"""View and shape ops.  View ops (view=True) return arrays sharing memory with their input."""

from __future__ import annotations

import numpy as np

from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from .registry import Attr, OpDef, Sample, op, register


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def infer_size(name: str, shape, numel: int) -> tuple[int, ...]:
    """Resolve one -1 in a requested shape, with torch's errors."""
    shape = tuple(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise op_error(name, "only one dimension can be inferred")
    if any(s < -1 for s in shape):
        raise op_error(name, f"invalid shape dimension {min(shape)}")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if neg:
        if known == 0 or numel % known:
            raise op_error(name, f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape = shape[: neg[0]] + (numel // known,) + shape[neg[0] + 1:]
    elif known != numel:
        raise op_error(name, f"shape '{list(shape)}' is invalid for input of size {numel}")
    return shape


def _reshape_meta(name):
    def meta(x, shape):
        return TensorMeta(infer_size(name, shape, x.numel), x.dtype)

    return meta


def _view_kernel(ctx, x, shape):
    try:
        return ctx.prims.reshape(x, ctx.out_metas[0].shape)
    except (ValueError, AttributeError):
        raise op_error(
            "view",
            "view size is not compatible with input tensor's size and stride (at least one "
            "dimension spans across two contiguous subspaces). Use .reshape(...) instead.",
        ) from None


def _reshape_grad(ctx, g):
    return (op("reshape", g, shape=ctx.in_metas[0].shape),)


def _reshape_sbp(x, shape):
    # Splits survive a reshape when the leading axis keeps its size: S(0) -> S(0).
    out = infer_size("reshape", shape, x.numel)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]
    if x.ndim and out and x.shape[0] == out[0] and x.shape[0] > 1:
        sigs.append(Signature((Split(0),), (Split(0),)))
    return sigs


_reshape_samples = lambda rng: [  # noqa: E731
    Sample(_rand(rng, 2, 3), shape=(3, 2)),
    Sample(_rand(rng, 2, 3, 4), shape=(2, -1)),
    Sample(_rand(rng, 6), shape=(1, 6, 1)),
]

register(OpDef(
    "view",
    inputs=("input",),
    attrs={"shape": Attr("ints")},
    infer_meta=_reshape_meta("view"),
    kernel=_view_kernel,
    grad=_reshape_grad,
    sbp=_reshape_sbp,
    reference=lambda torch, x, shape: x.view(shape),
    samples=_reshape_samples,
    view=True,
))

register(OpDef(
    "reshape",
    inputs=("input",),
    attrs={"shape": Attr("ints")},
    infer_meta=_reshape_meta("reshape"),
    # Always a fresh array; the functional reshape() picks the view op when strides allow.
    kernel=lambda ctx, x, shape: ctx.prims.reshape(ctx.prims.contiguous(x),
                                                   ctx.out_metas[0].shape),
    grad=_reshape_grad,
    sbp=_reshape_sbp,
    reference="reshape",
    samples=_reshape_samples,
))


def _expand_meta(x, size):
    size = tuple(size)
    if len(size) < x.ndim:
        raise op_error(
            "expand",
            f"the number of sizes provided ({len(size)}) must be greater or equal to the number "
            f"of dimensions in the tensor ({x.ndim})",
        )
    lead = len(size) - x.ndim
    out = []
    for i, s in enumerate(size):
        src = x.shape[i - lead] if i >= lead else None
        if s == -1:
            if src is None:
                raise op_error("expand", f"-1 is not allowed in a leading, non-existing "
                               f"dimension {i}")
            s = src
        elif src is not None and src != s and src != 1:
            raise op_error(
                "expand",
                f"The expanded size of the tensor ({s}) must match the existing size ({src}) at "
                f"non-singleton dimension {i}.  Target sizes: {list(size)}.  Tensor sizes: "
                f"{list(x.shape)}",
            )
        out.append(s)
    return TensorMeta(tuple(out), x.dtype)


def _expand_grad(ctx, g):
    from ._util import unbroadcast

    return (unbroadcast(g, ctx.in_metas[0]),)


def _expand_sbp(x, size):
    out = _expand_meta(x, size).shape
    lead = len(out) - x.ndim
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]
    for i in range(x.ndim):
        if x.shape[i] > 1:
            sigs.append(Signature((Split(i),), (Split(i + lead),)))
    return sigs


register(OpDef(
    "expand",
    inputs=("input",),
    attrs={"size": Attr("ints")},
    infer_meta=_expand_meta,
    kernel=lambda ctx, x, size: ctx.prims.broadcast_to(x, ctx.out_metas[0].shape),
    grad=_expand_grad,
    sbp=_expand_sbp,
    reference=lambda torch, x, size: x.expand(*size),
    samples=lambda rng: [Sample(_rand(rng, 3, 1), size=(3, 4)),
                         Sample(_rand(rng, 3), size=(2, -1)),
                         Sample(_rand(rng, 1, 2, 1), size=(2, 3, 2, 4))],
    view=True,
))


def _permute_meta(x, dims):
    from .._core.errors import normalize_dim

    if len(dims) != x.ndim:
        raise op_error(
            "permute",
            f"number of dims don't match in permute: input has {x.ndim} dims but dims has "
            f"{len(dims)}",
        )
    d = tuple(normalize_dim("permute", i, x.ndim, "dims") for i in dims)
    if len(set(d)) != len(d):
        raise op_error("permute", "repeated dim in permute: " + str(list(dims)))
    return TensorMeta(tuple(x.shape[i] for i in d), x.dtype)


def _norm_perm(dims, ndim):
    return tuple(i % ndim for i in dims) if ndim else ()


def _permute_grad(ctx, g):
    perm = _norm_perm(ctx.attrs["dims"], ctx.in_metas[0].ndim)
    inv = tuple(int(i) for i in np.argsort(perm))
    return (op("permute", g, dims=inv),)


def _permute_sbp(x, dims):
    perm = _norm_perm(dims, x.ndim)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]
    for out_axis, in_axis in enumerate(perm):
        if x.shape[in_axis] > 1:
            sigs.append(Signature((Split(in_axis),), (Split(out_axis),)))
    return sigs


register(OpDef(
    "permute",
    inputs=("input",),
    attrs={"dims": Attr("ints")},
    infer_meta=_permute_meta,
    kernel=lambda ctx, x, dims: ctx.prims.permute(x, _norm_perm(dims, ctx.in_metas[0].ndim)),
    grad=_permute_grad,
    sbp=_permute_sbp,
    reference="permute",
    samples=lambda rng: [Sample(_rand(rng, 2, 3, 4), dims=(2, 0, 1)),
                         Sample(_rand(rng, 2, 3), dims=(-1, 0))],
    view=True,
))


def _transpose_perm(ndim, dim0, dim1):
    from .._core.errors import normalize_dim

    d0 = normalize_dim("transpose", dim0, ndim, "dim0")
    d1 = normalize_dim("transpose", dim1, ndim, "dim1")
    perm = list(range(ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return tuple(perm)


register(OpDef(
    "transpose",
    inputs=("input",),
    attrs={"dim0": Attr("int"), "dim1": Attr("int")},
    infer_meta=lambda x, dim0, dim1: _permute_meta(x, _transpose_perm(x.ndim, dim0, dim1)),
    kernel=lambda ctx, x, dim0, dim1: ctx.prims.permute(
        x, _transpose_perm(ctx.in_metas[0].ndim, dim0, dim1)),
    grad=lambda ctx, g: (op("transpose", g, **ctx.attrs),),
    sbp=lambda x, dim0, dim1: _permute_sbp(x, _transpose_perm(x.ndim, dim0, dim1)),
    reference="transpose",
    samples=lambda rng: [Sample(_rand(rng, 2, 3, 4), dim0=0, dim1=2),
                         Sample(_rand(rng, 2, 3), dim0=-1, dim1=0)],
    view=True,
))
