"""View and shape ops.  View ops (view=True) return arrays sharing memory with their input."""

from __future__ import annotations

import numpy as np

from .._core import dtype as dt
from .._core.errors import normalize_dim, op_error
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
        return ctx.prims.view_shape(x, ctx.out_metas[0].shape)
    except ValueError:
        raise op_error(
            "view",
            "view size is not compatible with input tensor's size and stride (at least one "
            "dimension spans across two contiguous subspaces). Use .reshape(...) instead.",
        ) from None


def _view_direct(ctx, attrs):
    """specialize: the reshape primitive with the output shape bound."""
    shape, view_shape = ctx.out_metas[0].shape, ctx.prims.view_shape

    def fn(x):
        try:
            return view_shape(x, shape)
        except ValueError:
            return _view_kernel(ctx, x, shape)  # raises the op's error

    return fn


def _reshape_grad(ctx, g):
    return (op("reshape", g, shape=ctx.in_metas[0].shape),)


def _reshape_groups(src: tuple, dst: tuple):
    """(first input axis, first output axis) of each group of axes a reshape maps onto each
    other (equal products, size-1 axes skipped): (4, 3, 5) -> (12, 5) has (0, 0) and (2, 1)."""
    groups, i, j = [], 0, 0
    while i < len(src) and j < len(dst):
        if src[i] == 1:
            i += 1
            continue
        if dst[j] == 1:
            j += 1
            continue
        groups.append((i, j))
        ps, pd = src[i], dst[j]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                ps, i = ps * src[i], i + 1
            else:
                pd, j = pd * dst[j], j + 1
    return groups


def _reshape_sbp(x, shape):
    out = infer_size("reshape", shape, x.numel)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]  # the values move, never change
    if not x.numel:
        return sigs
    for a, b in _reshape_groups(x.shape, out):
        if x.shape[a] == out[b]:
            # S(a) -> S(b): the axis keeps its size, so every balanced cut carries over
            sigs.append(Signature((Split(a),), (Split(b),)))
        else:
            # S(a) -> S(b) where the leading axis of a group merges or splits: each piece is
            # whole rows of both shapes only when both leading axes divide evenly
            sigs.append(Signature((Split(a),), (Split(b),), even=(0, 1)))
    return sigs


_reshape_samples = lambda rng: [  # noqa: E731
    Sample(_rand(rng, 2, 3), shape=(3, 2)),
    Sample(_rand(rng, 2, 3, 4), shape=(2, -1)),
    Sample(_rand(rng, 6), shape=(1, 6, 1)),
    # merges and splits of a leading axis that 2 and 3 ranks cut evenly (the even S rules)
    Sample(_rand(rng, 6, 2, 3), shape=(12, 3)),
    Sample(_rand(rng, 12, 2), shape=(6, 2, 2)),
    Sample(_rand(rng, 6, 12), shape=(12, 6)),
]

register(OpDef(
    "view",
    inputs=("input",),
    attrs={"shape": Attr("ints")},
    infer_meta=_reshape_meta("view"),
    kernel=_view_kernel,
    specialize=_view_direct,
    saves=(),
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
    saves=(),
    grad=_reshape_grad,
    sbp=_reshape_sbp,
    reference="reshape",
    samples=_reshape_samples,
))


_TORCH_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half",
               "bfloat16": "BFloat16", "int64": "Long", "int32": "Int", "int16": "Short",
               "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def view_dtype_error(src: dt.DType, dtype: dt.DType, what: str, got=None) -> Exception:
    """torch's RuntimeError for a view(dtype) that the shape or layout does not allow."""
    msg = (f"{what} to view {_TORCH_TYPE[src.name]} as {_TORCH_TYPE[dtype.name]} (different "
           "element sizes)")
    return RuntimeError(msg if got is None else f"{msg}, but got {got}")


def _view_dtype_meta(x, dtype):
    old, new = x.dtype.np.itemsize, dtype.np.itemsize
    shape = x.shape
    if old != new:
        if not shape:
            raise view_dtype_error(x.dtype, dtype, "self.dim() cannot be 0")
        if old > new:
            shape = shape[:-1] + (shape[-1] * (old // new),)
        else:
            r = new // old
            if shape[-1] % r:
                raise view_dtype_error(x.dtype, dtype, f"self.size(-1) must be divisible by {r}",
                                       shape[-1])
            shape = shape[:-1] + (shape[-1] // r,)
    return TensorMeta(shape, dtype)


def _view_dtype_kernel(ctx, x, dtype):
    if dtype == ctx.in_metas[0].dtype:
        return ctx.prims.view_shape(x, ctx.out_metas[0].shape)
    try:
        return ctx.prims.bitcast(x, dtype)
    except ValueError:
        raise view_dtype_error(ctx.in_metas[0].dtype, dtype,
                               "self.stride(-1) must be 1") from None


def _view_dtype_sbp(x, dtype):
    _view_dtype_meta(x, dtype)
    sigs = [Signature((B,), (B,))]  # no P: reinterpreted partial sums do not add up
    for i in range(x.ndim):
        if i < x.ndim - 1 or x.dtype.np.itemsize == dtype.np.itemsize:
            sigs.append(Signature((Split(i),), (Split(i),)))
        else:  # the last axis rescales: whole elements per piece only for even cuts
            sigs.append(Signature((Split(i),), (Split(i),), even=(0, 1)))
    return sigs


register(OpDef(
    "view_dtype",
    inputs=("input",),
    attrs={"dtype": Attr("dtype")},
    infer_meta=_view_dtype_meta,
    kernel=_view_dtype_kernel,
    # torch: view(dtype) is not differentiable (its output never requires grad)
    sbp=_view_dtype_sbp,
    reference=lambda torch, x, dtype: x.view(dtype),
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3), dtype=dt.float32),
        Sample(_rand(rng, 2, 3), dtype=dt.int64),
        Sample(_rand(rng, 4, 2).astype(np.float32), dtype=dt.float64),
        Sample(_rand(rng, 6, 4).astype(np.float32), dtype=dt.bfloat16),
        Sample(rng.integers(-9, 9, (6, 4)).astype(np.int32), dtype=dt.int16),
        Sample(rng.integers(-9, 9, (3, 8)).astype(np.int16), dtype=dt.int64),
        Sample(rng.integers(0, 2, (4, 3)).astype(np.uint8), dtype=dt.bool_),
        Sample(rng.integers(-9, 9, (2,)).astype(np.int64), dtype=dt.uint8),
        Sample(np.array(1.5, np.float32), dtype=dt.int32),
        Sample(_rand(rng, 2, 3), dtype=dt.float64),
    ],
    view=True,
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
    saves=(),
    grad=_expand_grad,
    sbp=_expand_sbp,
    reference=lambda torch, x, size: x.expand(*size),
    samples=lambda rng: [Sample(_rand(rng, 3, 1), size=(3, 4)),
                         Sample(_rand(rng, 3), size=(2, -1)),
                         Sample(_rand(rng, 1, 2, 1), size=(2, 3, 2, 4))],
    view=True,
))


def _permute_meta(x, dims):
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
    saves=(),
    grad=_permute_grad,
    sbp=_permute_sbp,
    reference="permute",
    samples=lambda rng: [Sample(_rand(rng, 2, 3, 4), dims=(2, 0, 1)),
                         Sample(_rand(rng, 2, 3), dims=(-1, 0))],
    view=True,
))


def _transpose_perm(ndim, dim0, dim1):
    d0 = normalize_dim("transpose", dim0, ndim, "dim0")
    d1 = normalize_dim("transpose", dim1, ndim, "dim1")
    if ndim == 0:  # transposing dims 0/-1 of a 0-d tensor is allowed and changes nothing
        return ()
    perm = list(range(ndim))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return tuple(perm)


def _transpose_direct(ctx, attrs):
    """specialize: the permute primitive with the permutation computed once."""
    perm, permute = _transpose_perm(ctx.in_metas[0].ndim, **attrs), ctx.prims.permute
    return lambda x: permute(x, perm)


register(OpDef(
    "transpose",
    inputs=("input",),
    attrs={"dim0": Attr("int"), "dim1": Attr("int")},
    infer_meta=lambda x, dim0, dim1: _permute_meta(x, _transpose_perm(x.ndim, dim0, dim1)),
    kernel=lambda ctx, x, dim0, dim1: ctx.prims.permute(
        x, _transpose_perm(ctx.in_metas[0].ndim, dim0, dim1)),
    specialize=_transpose_direct,
    saves=(),
    grad=lambda ctx, g: (op("transpose", g, **ctx.attrs),),
    sbp=lambda x, dim0, dim1: _permute_sbp(x, _transpose_perm(x.ndim, dim0, dim1)),
    reference="transpose",
    samples=lambda rng: [Sample(_rand(rng, 2, 3, 4), dim0=0, dim1=2),
                         Sample(_rand(rng, 2, 3), dim0=-1, dim1=0),
                         Sample(np.asarray(1.5), dim0=0, dim1=-1)],
    view=True,
))


# -- views: flatten, unflatten, squeeze, unsqueeze, narrow, select ---------------------------
def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _reshape_view_kernel(name):
    """Kernel of a view op that only regroups axes; the functional layer calls it only when
    the strides allow a view (see framework/functional/shape.py compute_stride)."""

    def kernel(ctx, x, **attrs):
        try:
            return ctx.prims.view_shape(x, ctx.out_metas[0].shape)
        except ValueError:
            raise op_error(name, "view size is not compatible with input tensor's size and "
                           "stride; use reshape() instead") from None

    return kernel


def _regroup_grad(ctx, g):
    # Only metas: view grads also replay writes through views (interpreter._embed).
    return (op("reshape", g, shape=ctx.in_metas[0].shape),)


def flatten_dims(ndim, start_dim, end_dim):
    s = normalize_dim("flatten", start_dim, ndim, "start_dim")
    e = normalize_dim("flatten", end_dim, ndim, "end_dim")
    if s > e:
        raise op_error("flatten", "flatten() has invalid args: start_dim cannot come after "
                       "end_dim")
    return s, e


def flatten_shape(shape, s, e):
    if not shape:
        return (1,)
    return tuple(shape[:s]) + (_prod(shape[s:e + 1]),) + tuple(shape[e + 1:])


def _flatten_meta(x, start_dim=0, end_dim=-1):
    s, e = flatten_dims(x.ndim, start_dim, end_dim)
    return TensorMeta(flatten_shape(x.shape, s, e), x.dtype)


def _flatten_sbp(x, start_dim=0, end_dim=-1):
    s, e = flatten_dims(x.ndim, start_dim, end_dim)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]  # P -> P: regrouping is linear
    big = [i for i in range(s, e + 1) if x.ndim and x.shape[i] > 1]
    for i in range(x.ndim):
        if x.shape[i] <= 1:
            continue
        if i < s:
            sigs.append(Signature((Split(i),), (Split(i),)))  # axes before: unchanged
        elif i > e:
            sigs.append(Signature((Split(i),), (Split(i - (e - s)),)))  # axes after: shifted
        elif big == [i]:
            # the only non-1 axis of the merged group: its pieces are the group's pieces
            sigs.append(Signature((Split(i),), (Split(s),)))
        elif big and i == big[0]:
            # the group's leading axis: even cuts of it are whole runs of the merged axis
            sigs.append(Signature((Split(i),), (Split(s),), even=(0, 1)))
    return sigs


register(OpDef(
    "flatten",
    inputs=("input",),
    attrs={"start_dim": Attr("int", 0), "end_dim": Attr("int", -1)},
    infer_meta=_flatten_meta,
    kernel=_reshape_view_kernel("flatten"),
    saves=(),
    grad=_regroup_grad,
    sbp=_flatten_sbp,
    reference="flatten",
    samples=lambda rng: [Sample(_rand(rng, 2, 3, 4)),
                         Sample(_rand(rng, 2, 3, 4, 5), start_dim=1, end_dim=-2),
                         Sample(_rand(rng, 3, 1, 1, 2), start_dim=0, end_dim=2),
                         Sample(_rand(rng, 4, 2), start_dim=1),
                         Sample(np.asarray(1.5)),
                         Sample(_rand(rng, 6, 2, 3), start_dim=0, end_dim=1)],
    view=True,
))


def _unflatten_meta(x, dim, sizes):
    if x.ndim == 0:
        raise IndexError("unflatten(): Dimension specified as 0 but tensor has no dimensions")
    d = normalize_dim("unflatten", dim, x.ndim)
    if not sizes:
        raise op_error("unflatten", "unflatten: sizes must be non-empty")
    n = x.shape[d]
    if list(sizes).count(-1) > 1:
        raise op_error("unflatten", "only one dimension can be inferred")
    known = _prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if known == 0 or n % known:
            raise op_error("unflatten", f"unflatten: Provided sizes {list(sizes)} don't multiply "
                           f"up to the size of dim {d} ({n}) in the input tensor")
        sizes = tuple(n // known if s == -1 else s for s in sizes)
    elif known != n:
        raise op_error("unflatten", f"unflatten: Provided sizes {list(sizes)} don't multiply up "
                       f"to the size of dim {d} ({n}) in the input tensor")
    return TensorMeta(x.shape[:d] + tuple(sizes) + x.shape[d + 1:], x.dtype)


def _unflatten_sbp(x, dim, sizes):
    d = normalize_dim("unflatten", dim, x.ndim)
    out = _unflatten_meta(x, dim, sizes).shape
    k = len(out) - x.ndim + 1
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]  # P -> P: regrouping is linear
    for i in range(x.ndim):
        if x.shape[i] <= 1:
            continue
        if i < d:
            sigs.append(Signature((Split(i),), (Split(i),)))
        elif i > d:
            sigs.append(Signature((Split(i),), (Split(i + k - 1),)))
        else:
            big = [j for j in range(k) if out[d + j] > 1]
            if len(big) == 1:  # the only non-1 new axis carries the whole split axis
                sigs.append(Signature((Split(d),), (Split(d + big[0]),)))
    return sigs


register(OpDef(
    "unflatten",
    inputs=("input",),
    attrs={"dim": Attr("int"), "sizes": Attr("ints")},
    infer_meta=_unflatten_meta,
    kernel=_reshape_view_kernel("unflatten"),
    saves=(),
    grad=_regroup_grad,
    sbp=_unflatten_sbp,
    reference=lambda torch, x, dim, sizes: torch.unflatten(x, dim, sizes),
    samples=lambda rng: [Sample(_rand(rng, 2, 12), dim=1, sizes=(3, 4)),
                         Sample(_rand(rng, 6, 3), dim=0, sizes=(-1, 3)),
                         Sample(_rand(rng, 2, 5), dim=-1, sizes=(1, 5, 1))],
    view=True,
))


def squeeze_dims(x, dim):
    if dim is None:
        return tuple(i for i, n in enumerate(x.shape) if n == 1)
    dims = [normalize_dim("squeeze", d, x.ndim) for d in dim]
    for d in dims:
        if dims.count(d) > 1:
            raise op_error("squeeze", f"dim {d} appears multiple times in the list of dims")
    return tuple(d for d in dims if x.ndim and x.shape[d] == 1)


def _squeeze_meta(x, dim=None):
    drop = squeeze_dims(x, dim)
    return TensorMeta(tuple(n for i, n in enumerate(x.shape) if i not in drop), x.dtype)


def _squeeze_sbp(x, dim=None):
    drop = squeeze_dims(x, dim)
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]  # P -> P: regrouping is linear
    kept = [i for i in range(x.ndim) if i not in drop]
    for o, i in enumerate(kept):
        if x.shape[i] > 1:
            sigs.append(Signature((Split(i),), (Split(o),)))  # only size-1 axes go away
    return sigs


register(OpDef(
    "squeeze",
    inputs=("input",),
    attrs={"dim": Attr("ints", None)},
    infer_meta=_squeeze_meta,
    kernel=_reshape_view_kernel("squeeze"),
    saves=(),
    grad=_regroup_grad,
    sbp=_squeeze_sbp,
    reference=lambda torch, x, dim=None: x.squeeze() if dim is None else x.squeeze(dim),
    samples=lambda rng: [Sample(_rand(rng, 2, 1, 3, 1)),
                         Sample(_rand(rng, 2, 1, 3, 1), dim=-1),
                         Sample(_rand(rng, 2, 1, 3, 1), dim=(0, 1)),
                         Sample(np.asarray(2.0), dim=0),
                         Sample((_rand(rng, 1, 3) * 3).astype(np.int32), grad=False)],
    view=True,
))


def _unsqueeze_meta(x, dim):
    d = normalize_dim("unsqueeze", dim, x.ndim + 1)
    return TensorMeta(x.shape[:d] + (1,) + x.shape[d:], x.dtype)


def _unsqueeze_sbp(x, dim):
    d = normalize_dim("unsqueeze", dim, x.ndim + 1)
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(i),), (Split(i + (i >= d)),))  # a new size-1 axis shifts the rest
        for i in range(x.ndim) if x.shape[i] > 1]


register(OpDef(
    "unsqueeze",
    inputs=("input",),
    attrs={"dim": Attr("int")},
    infer_meta=_unsqueeze_meta,
    kernel=_reshape_view_kernel("unsqueeze"),
    saves=(),
    grad=_regroup_grad,
    sbp=_unsqueeze_sbp,
    reference="unsqueeze",
    samples=lambda rng: [Sample(_rand(rng, 2, 3), dim=1),
                         Sample(_rand(rng, 2, 3), dim=-1),
                         Sample(np.asarray(2.0), dim=0)],
    view=True,
))


def _narrow_bounds(x, dim, start, length):
    if x.ndim == 0:
        raise op_error("narrow", "narrow() cannot be applied to a 0-dim tensor.")
    d = normalize_dim("narrow", dim, x.ndim)
    n = x.shape[d]
    if start < -n or start > n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got "
                         f"{start})")
    if start < 0:
        start += n
    if length < 0:
        raise op_error("narrow", "narrow(): length must be non-negative.")
    if start + length > n:
        raise op_error("narrow", f"start ({start}) + length ({length}) exceeds dimension size "
                       f"({n}).")
    return d, start


def narrow_key(ndim, d, start, length):
    full = ("slice", None, None, None)
    return (full,) * d + (("slice", start, start + length, 1),)


def _narrow_meta(x, dim, start, length):
    d, _ = _narrow_bounds(x, dim, start, length)
    return TensorMeta(x.shape[:d] + (length,) + x.shape[d + 1:], x.dtype)


def _narrow_kernel(ctx, x, dim, start, length):
    d, s = _narrow_bounds(ctx.in_metas[0], dim, start, length)
    return ctx.prims.slice(x, (slice(None),) * d + (slice(s, s + length),))


def _narrow_grad(ctx, g):
    m = ctx.in_metas[0]
    d, s = _narrow_bounds(m, ctx.attrs["dim"], ctx.attrs["start"], ctx.attrs["length"])
    return (op("slice_grad", g, key=narrow_key(m.ndim, d, s, ctx.attrs["length"]),
               shape=m.shape),)


def _narrow_sbp(x, dim, start, length):
    d, _ = _narrow_bounds(x, dim, start, length)
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(i),), (Split(i),))  # other axes are untouched
        for i in range(x.ndim) if i != d and x.shape[i] > 1]


register(OpDef(
    "narrow",
    inputs=("input",),
    attrs={"dim": Attr("int"), "start": Attr("int"), "length": Attr("int")},
    infer_meta=_narrow_meta,
    kernel=_narrow_kernel,
    saves=(),
    grad=_narrow_grad,
    sbp=_narrow_sbp,
    node_name=lambda x, **attrs: "SliceBackward0",  # torch narrows by slicing
    reference="narrow",
    samples=lambda rng: [Sample(_rand(rng, 4, 3), dim=0, start=1, length=2),
                         Sample(_rand(rng, 2, 5), dim=-1, start=-3, length=3),
                         Sample(_rand(rng, 3, 4), dim=1, start=4, length=0)],
    view=True,
))


def _select_index(x, dim, index):
    if x.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = normalize_dim("select", dim, x.ndim)
    n = x.shape[d]
    if index < -n or index >= n:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(x.shape)} at dimension {d}")
    return d, index % n


def _select_meta(x, dim, index):
    d, _ = _select_index(x, dim, index)
    return TensorMeta(x.shape[:d] + x.shape[d + 1:], x.dtype)


def _select_kernel(ctx, x, dim, index):
    d, i = _select_index(ctx.in_metas[0], dim, index)
    return ctx.prims.slice(x, (slice(None),) * d + (i, Ellipsis))


def _select_grad(ctx, g):
    m = ctx.in_metas[0]
    d, i = _select_index(m, ctx.attrs["dim"], ctx.attrs["index"])
    key = (("slice", None, None, None),) * d + (("int", i),)
    return (op("slice_grad", g, key=key, shape=m.shape),)


def _select_sbp(x, dim, index):
    d, _ = _select_index(x, dim, index)
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(i),), (Split(i - (i > d)),))  # other axes are untouched
        for i in range(x.ndim) if i != d and x.shape[i] > 1]


register(OpDef(
    "select",
    inputs=("input",),
    attrs={"dim": Attr("int"), "index": Attr("int")},
    infer_meta=_select_meta,
    kernel=_select_kernel,
    saves=(),
    grad=_select_grad,
    sbp=_select_sbp,
    reference="select",
    samples=lambda rng: [Sample(_rand(rng, 4, 3), dim=0, index=1),
                         Sample(_rand(rng, 2, 5, 3), dim=-2, index=-1),
                         Sample(_rand(rng, 3), dim=0, index=2)],
    view=True,
))


# -- diagonal ----------------------------------------------------------------------------------
# `diagonal` is a view when the two axes can merge into one (after moving them last): the
# diagonal is then a strided slice of the merged axis.  That covers matrices and batches of
# matrices, transposed or not.  Other layouts need a strided view the primitive set cannot
# express, so the functional layer (which sees strides) uses `diagonal_copy` for them.
def _diag_layout(name, x, offset, dim1, dim2):
    d1 = normalize_dim(name, dim1, x.ndim, "dim1")
    d2 = normalize_dim(name, dim2, x.ndim, "dim2")
    if d1 == d2:
        raise op_error(name, f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n, m = x.shape[d1], x.shape[d2]
    length = max(min(n, m - offset) if offset >= 0 else min(n + offset, m), 0)
    rest = [i for i in range(x.ndim) if i not in (d1, d2)]
    return d1, d2, length, rest


def _diag_positions(offset, length):
    rows = np.arange(length, dtype=np.int64) + max(-offset, 0)
    return rows, rows + offset


def _diagonal_meta(x, offset=0, dim1=0, dim2=1):
    _, _, length, rest = _diag_layout("diagonal", x, offset, dim1, dim2)
    return TensorMeta(tuple(x.shape[i] for i in rest) + (length,), x.dtype)


def _diag_key(ctx, offset, length):
    rows, cols = _diag_positions(offset, length)
    return (Ellipsis, ctx.prims.from_host(rows, dt.int64), ctx.prims.from_host(cols, dt.int64))


def _diagonal_view_kernel(ctx, x, offset=0, dim1=0, dim2=1):
    xm = ctx.in_metas[0]
    d1, d2, length, rest = _diag_layout("diagonal", xm, offset, dim1, dim2)
    lead = tuple(xm.shape[i] for i in rest)
    # The diagonal of x^T with offset -k is the diagonal of x with offset k, in the same order.
    for a, b, off in ((d1, d2, offset), (d2, d1, -offset)):
        moved = ctx.prims.permute(x, tuple(rest) + (a, b))
        try:
            merged = ctx.prims.view_shape(moved, lead + (xm.shape[a] * xm.shape[b],))
        except ValueError:
            continue
        step = xm.shape[b] + 1
        start = max(-off, 0) * xm.shape[b] + max(off, 0)
        stop = start + (length - 1) * step + 1 if length else start
        return ctx.prims.slice(merged, (Ellipsis, slice(start, stop, step)))
    # Unmergeable layouts reach here only when a write through a diagonal view is replayed on
    # a gradient (interpreter._replay), where sharing memory does not matter.
    return _diagonal_copy_kernel(ctx, x, offset, dim1, dim2)


def _diagonal_copy_kernel(ctx, x, offset=0, dim1=0, dim2=1):
    d1, d2, length, rest = _diag_layout("diagonal", ctx.in_metas[0], offset, dim1, dim2)
    moved = ctx.prims.permute(x, tuple(rest) + (d1, d2))
    return ctx.prims.index(moved, _diag_key(ctx, offset, length))


def _diagonal_sbp(x, offset=0, dim1=0, dim2=1):
    _, _, _, rest = _diag_layout("diagonal", x, offset, dim1, dim2)
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(i),), (Split(o),))  # batch axes are independent
        for o, i in enumerate(rest) if x.shape[i] > 1]


def _diagonal_samples(rng):
    return [Sample(_rand(rng, 3, 4)),
            Sample(_rand(rng, 3, 4), offset=1),
            Sample(_rand(rng, 2, 3, 4), offset=-1, dim1=2, dim2=1),
            Sample(_rand(rng, 2, 3, 4), offset=-1, dim1=2, dim2=0),
            Sample(_rand(rng, 3, 4), offset=5)]


def _diagonal_grad(ctx, g):
    return (op("diagonal_grad", g, shape=ctx.in_metas[0].shape, **ctx.attrs),)


register(OpDef(
    "diagonal",
    inputs=("input",),
    attrs={"offset": Attr("int", 0), "dim1": Attr("int", 0), "dim2": Attr("int", 1)},
    infer_meta=_diagonal_meta,
    kernel=_diagonal_view_kernel,
    saves=(),
    grad=_diagonal_grad,
    sbp=_diagonal_sbp,
    reference="diagonal",
    samples=_diagonal_samples,
    view=True,
    doc="The diagonal of two axes as a view (when the axes can merge; else diagonal_copy).",
))

register(OpDef(
    "diagonal_copy",
    inputs=("input",),
    attrs={"offset": Attr("int", 0), "dim1": Attr("int", 0), "dim2": Attr("int", 1)},
    infer_meta=_diagonal_meta,
    kernel=_diagonal_copy_kernel,
    saves=(),
    grad=_diagonal_grad,
    sbp=_diagonal_sbp,
    reference="diagonal_copy",
    samples=_diagonal_samples,
))


def _diagonal_grad_meta(g, shape, offset=0, dim1=0, dim2=1):
    want = _diagonal_meta(TensorMeta(tuple(shape), g.dtype), offset, dim1, dim2)
    if want.shape != g.shape:
        raise op_error("diagonal_grad", f"grad has shape {list(g.shape)}, expected "
                       f"{list(want.shape)}")
    return TensorMeta(tuple(shape), g.dtype)


def _diagonal_grad_kernel(ctx, g, shape, offset=0, dim1=0, dim2=1):
    out_meta = ctx.out_metas[0]
    d1, d2, length, rest = _diag_layout("diagonal_grad", out_meta, offset, dim1, dim2)
    out = ctx.prims.full(out_meta.shape, out_meta.dtype, 0)
    moved = ctx.prims.permute(out, tuple(rest) + (d1, d2))  # a view: writes land in out
    ctx.prims.index_put(moved, _diag_key(ctx, offset, length), g, False)
    return out


def _diagonal_grad_sbp(g, shape, offset=0, dim1=0, dim2=1):
    meta = TensorMeta(tuple(shape), g.dtype)
    _, _, _, rest = _diag_layout("diagonal_grad", meta, offset, dim1, dim2)
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(o),), (Split(i),))  # batch axes are independent
        for o, i in enumerate(rest) if shape[i] > 1]


def _diagonal_grad_reference(torch, g, shape, offset=0, dim1=0, dim2=1):
    z = torch.zeros(tuple(shape), dtype=g.dtype)
    z.diagonal(offset, dim1, dim2).copy_(g)
    return z


register(OpDef(
    "diagonal_grad",
    inputs=("grad",),
    attrs={"shape": Attr("ints"), "offset": Attr("int", 0), "dim1": Attr("int", 0),
           "dim2": Attr("int", 1)},
    infer_meta=_diagonal_grad_meta,
    kernel=_diagonal_grad_kernel,
    saves=(),
    grad=lambda ctx, gg: (op("diagonal_copy", gg, offset=ctx.attrs["offset"],
                             dim1=ctx.attrs["dim1"], dim2=ctx.attrs["dim2"]),),
    sbp=_diagonal_grad_sbp,
    reference=_diagonal_grad_reference,
    samples=lambda rng: [Sample(_rand(rng, 3), shape=(3, 4)),
                         Sample(_rand(rng, 3, 2), shape=(2, 3, 4), offset=-1, dim1=2, dim2=0)],
    doc="The adjoint of diagonal: zeros of `shape` with the diagonal set to grad.",
))


# -- cat / stack -----------------------------------------------------------------------------
def _is_legacy_empty(m):
    # torch still skips 1-D empty tensors in cat, whatever the other shapes are
    return m.shape == (0,)


def _cat_layout(metas, dim):
    if not metas:
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    for i, m in enumerate(metas):
        if m.ndim == 0:
            raise op_error("cat", f"zero-dimensional tensor (at position {i}) cannot be "
                           "concatenated")
    dtype = metas[0].dtype
    for m in metas[1:]:
        dtype = dt.promote_types(dtype, m.dtype)
    real = [(i, m) for i, m in enumerate(metas) if not _is_legacy_empty(m)]
    if not real:
        return TensorMeta((0,), dtype), 0
    ref = real[0][1]
    d = normalize_dim("cat", dim, ref.ndim)
    total = 0
    for i, m in real:
        if m.ndim != ref.ndim:
            raise op_error("cat", f"Tensors must have same number of dimensions: got "
                           f"{ref.ndim} and {m.ndim}")
        for a in range(ref.ndim):
            if a != d and m.shape[a] != ref.shape[a]:
                raise op_error("cat", f"Sizes of tensors must match except in dimension {d}. "
                               f"Expected size {ref.shape[a]} but got size {m.shape[a]} for "
                               f"tensor number {i} in the list.")
        total += m.shape[d]
    return TensorMeta(ref.shape[:d] + (total,) + ref.shape[d + 1:], dtype), d


def _cat_meta(*metas, dim=0):
    return _cat_layout(metas, dim)[0]


def _cat_kernel(ctx, arrays, dim=0):
    out_meta = ctx.out_metas[0]
    _, d = _cat_layout(ctx.in_metas, dim)
    out = ctx.prims.empty(out_meta.shape, out_meta.dtype)
    offset = 0
    for a, m in zip(arrays, ctx.in_metas, strict=True):
        if _is_legacy_empty(m):
            continue
        n = m.shape[d]
        region = ctx.prims.slice(out, (slice(None),) * d + (slice(offset, offset + n),))
        ctx.prims.copy(region, a)  # copy casts to the promoted dtype
        offset += n
    return out


def _cat_grad(ctx, g):
    _, d = _cat_layout(ctx.in_metas, ctx.attrs["dim"])
    grads = []
    offset = 0
    for m, need in zip(ctx.in_metas, ctx.needs_input_grad, strict=True):
        if _is_legacy_empty(m):
            grads.append(_zeros_like_meta(m, g) if need else None)
            continue
        n = m.shape[d]
        if need:
            gi = op("narrow", g, dim=d, start=offset, length=n)
            grads.append(gi if gi.dtype is m.dtype else op("to_dtype", gi, dtype=m.dtype))
        else:
            grads.append(None)
        offset += n
    return tuple(grads)


def _zeros_like_meta(m, like):
    return op("full", shape=m.shape, fill_value=0, dtype=m.dtype, _device=like._where())


def _cat_sbp(*metas, dim=0):
    out, d = _cat_layout(metas, dim)
    k = len(metas)
    sigs = [Signature((B,) * k, (B,)),
            Signature((P,) * k, (P,))]  # P -> P: concatenation is linear in all inputs
    if any(_is_legacy_empty(m) for m in metas):
        return sigs
    for a in range(out.ndim):
        if a != d and out.shape[a] > 1:
            sigs.append(Signature((Split(a),) * k, (Split(a),)))  # off-axis splits line up
    return sigs


register(OpDef(
    "cat",
    inputs=("*tensors",),
    attrs={"dim": Attr("int", 0)},
    infer_meta=_cat_meta,
    kernel=_cat_kernel,
    saves=(),
    grad=_cat_grad,
    sbp=_cat_sbp,
    reference=lambda torch, tensors, dim=0: torch.cat(tensors, dim),
    samples=lambda rng: [
        Sample([_rand(rng, 2, 3), _rand(rng, 4, 3)]),
        Sample([_rand(rng, 2, 3), _rand(rng, 2, 1), _rand(rng, 2, 2)], dim=-1),
        Sample([_rand(rng, 3, 2), _rand(rng, 3, 2).astype(np.float32), np.zeros((0,))], dim=0),
        Sample([(_rand(rng, 2, 2) * 3).astype(np.int32), _rand(rng, 1, 2)], dim=0),
        Sample([(_rand(rng, 2, 2) * 3).astype(np.int64), _rand(rng, 2, 2) > 0], dim=1,
               grad=False),
        Sample([_rand(rng, 3)]),
    ],
))


def _stack_meta(*metas, dim=0):
    if not metas:
        raise op_error("stack", "stack expects a non-empty TensorList")
    for i, m in enumerate(metas[1:], 1):
        if m.shape != metas[0].shape:
            raise op_error("stack", f"stack expects each tensor to be equal size, but got "
                           f"{list(metas[0].shape)} at entry 0 and {list(m.shape)} at entry {i}")
    d = normalize_dim("stack", dim, metas[0].ndim + 1)
    dtype = metas[0].dtype
    for m in metas[1:]:
        dtype = dt.promote_types(dtype, m.dtype)
    shape = metas[0].shape
    return TensorMeta(shape[:d] + (len(metas),) + shape[d:], dtype)


def _stack_kernel(ctx, arrays, dim=0):
    out_meta = ctx.out_metas[0]
    d = normalize_dim("stack", dim, ctx.in_metas[0].ndim + 1)
    out = ctx.prims.empty(out_meta.shape, out_meta.dtype)
    for i, a in enumerate(arrays):
        ctx.prims.copy(ctx.prims.slice(out, (slice(None),) * d + (i, Ellipsis)), a)
    return out


def _stack_grad(ctx, g):
    d = normalize_dim("stack", ctx.attrs["dim"], ctx.in_metas[0].ndim + 1)
    grads = []
    for i, (m, need) in enumerate(zip(ctx.in_metas, ctx.needs_input_grad,
                                                 strict=True)):
        if not need:
            grads.append(None)
            continue
        gi = op("select", g, dim=d, index=i)
        grads.append(gi if gi.dtype is m.dtype else op("to_dtype", gi, dtype=m.dtype))
    return tuple(grads)


def _stack_sbp(*metas, dim=0):
    d = normalize_dim("stack", dim, metas[0].ndim + 1)
    k = len(metas)
    return [Signature((B,) * k, (B,)),
            Signature((P,) * k, (P,))] + [  # P -> P: stacking is linear in all inputs
        Signature((Split(a),) * k, (Split(a + (a >= d)),))  # the new axis shifts the rest
        for a in range(metas[0].ndim) if metas[0].shape[a] > 1]


register(OpDef(
    "stack",
    inputs=("*tensors",),
    attrs={"dim": Attr("int", 0)},
    infer_meta=_stack_meta,
    kernel=_stack_kernel,
    saves=(),
    grad=_stack_grad,
    sbp=_stack_sbp,
    reference=lambda torch, tensors, dim=0: torch.stack(tensors, dim),
    samples=lambda rng: [
        Sample([_rand(rng, 2, 3), _rand(rng, 2, 3)]),
        Sample([_rand(rng, 2, 3), _rand(rng, 2, 3), _rand(rng, 2, 3)], dim=-1),
        Sample([np.asarray(1.0), np.asarray(2.0, dtype=np.float32)]),
        Sample([(_rand(rng, 3) * 3).astype(np.int32), (_rand(rng, 3) * 3).astype(np.int64)],
               dim=1, grad=False),
    ],
))


# -- flip / roll / tril / triu -----------------------------------------------------------------
def _unique_dims(name, dims, ndim):
    out = [normalize_dim(name, d, ndim) for d in dims]
    for d in out:
        if out.count(d) > 1:
            raise op_error(name, f"dim {d} appears multiple times in the list of dims")
    return tuple(out)


def _axis_sbp(x, touched):
    """B, P and S(i) for every axis the op leaves alone (it is linear and acts per axis)."""
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [
        Signature((Split(i),), (Split(i),))
        for i in range(x.ndim) if i not in touched and x.shape[i] > 1]


def _flip_kernel(ctx, x, dims):
    axes = _unique_dims("flip", dims, ctx.in_metas[0].ndim)
    if not ctx.in_metas[0].ndim:  # dim 0 of a 0-d tensor is allowed and changes nothing
        return ctx.prims.contiguous(x)
    return ctx.prims.contiguous(ctx.prims.flip(x, axes))


register(OpDef(
    "flip",
    inputs=("input",),
    attrs={"dims": Attr("ints")},
    infer_meta=lambda x, dims: (_unique_dims("flip", dims, x.ndim), x)[1],
    kernel=_flip_kernel,
    saves=(),
    grad=lambda ctx, g: (op("flip", g, dims=ctx.attrs["dims"]),),
    # a flipped axis reverses the order of its pieces, so only other axes keep a split
    sbp=lambda x, dims: _axis_sbp(x, _unique_dims("flip", dims, x.ndim)),
    reference="flip",
    samples=lambda rng: [Sample(_rand(rng, 3, 4), dims=(0,)),
                         Sample(_rand(rng, 2, 3, 4), dims=(-1, 0)),
                         Sample(np.asarray(1.5), dims=(0,)),
                         Sample((_rand(rng, 4) * 3).astype(np.int64), dims=(0,), grad=False)],
))


def _roll_dims(x, shifts, dims):
    if not shifts:
        raise op_error("roll", "`shifts` required")
    if dims is None:
        if len(shifts) != 1:
            raise op_error("roll", f"shifts and dimensions must align. shifts: {len(shifts)}, "
                           "dims:0")
        return None
    if len(shifts) != len(dims):
        raise op_error("roll", f"shifts and dimensions must align. shifts: {len(shifts)}, "
                       f"dims:{len(dims)}")
    if x.ndim == 0:
        raise IndexError(f"Dimension specified as {dims[0]} but tensor has no dimensions")
    return tuple(normalize_dim("roll", d, x.ndim) for d in dims)


def _roll_axis(prims, x, shape, dtype, axis, shift):
    n = shape[axis]
    if n == 0 or shift % n == 0:
        return x
    s = shift % n
    out = prims.empty(shape, dtype)
    lead = (slice(None),) * axis
    prims.copy(prims.slice(out, lead + (slice(s, n),)), prims.slice(x, lead + (slice(0, n - s),)))
    prims.copy(prims.slice(out, lead + (slice(0, s),)), prims.slice(x, lead + (slice(n - s, n),)))
    return out


def _roll_kernel(ctx, x, shifts, dims=None):
    m = ctx.in_metas[0]
    axes = _roll_dims(m, shifts, dims)
    if axes is None:
        flat = ctx.prims.reshape(ctx.prims.contiguous(x), (m.numel,))
        out = _roll_axis(ctx.prims, flat, (m.numel,), m.dtype, 0, shifts[0])
        return ctx.prims.reshape(ctx.prims.contiguous(out) if out is flat else out, m.shape)
    out = x
    for axis, shift in zip(axes, shifts, strict=True):
        out = _roll_axis(ctx.prims, out, m.shape, m.dtype, axis, shift)
    return ctx.prims.contiguous(x) if out is x else out


def _roll_sbp(x, shifts, dims=None):
    axes = _roll_dims(x, shifts, dims)
    if axes is None:  # the flattened roll mixes every axis
        return [Signature((B,), (B,)), Signature((P,), (P,))]
    return _axis_sbp(x, axes)  # a rolled axis moves rows across pieces


register(OpDef(
    "roll",
    inputs=("input",),
    attrs={"shifts": Attr("ints"), "dims": Attr("ints", None)},
    infer_meta=lambda x, shifts, dims=None: (_roll_dims(x, shifts, dims), x)[1],
    kernel=_roll_kernel,
    saves=(),
    grad=lambda ctx, g: (op("roll", g, shifts=tuple(-s for s in ctx.attrs["shifts"]),
                            dims=ctx.attrs["dims"]),),
    sbp=_roll_sbp,
    reference=lambda torch, x, shifts, dims=None: torch.roll(x, shifts, dims),
    samples=lambda rng: [Sample(_rand(rng, 3, 4), shifts=1),
                         Sample(_rand(rng, 3, 4), shifts=(2, -5), dims=(0, 1)),
                         Sample(_rand(rng, 3, 4), shifts=-1, dims=1),
                         Sample(_rand(rng, 2, 3), shifts=7, dims=-1),
                         Sample((_rand(rng, 5) * 3).astype(np.int32), shifts=3, grad=False)],
))


def _tri_meta(name):
    def meta(x, diagonal=0):
        if x.ndim < 2:
            raise op_error(name, f"{name}: input tensor must have at least 2 dimensions")
        return x

    return meta


def _tri_kernel(name):
    lower = name == "tril"

    def kernel(ctx, x, diagonal=0):
        # The mask comes from this piece's logical rows and columns, so split matrices work.
        piece = ctx.piece(0)
        rows = np.arange(piece[-2].start, piece[-2].stop)[:, None]
        cols = np.arange(piece[-1].start, piece[-1].stop)[None, :]
        keep = (cols - rows <= diagonal) if lower else (cols - rows >= diagonal)
        mask = ctx.prims.from_host(keep, dt.bool_)
        m = ctx.out_metas[0]
        return ctx.prims.where(mask, x, ctx.prims.full((), m.dtype, 0))

    return kernel


for _name in ("tril", "triu"):
    register(OpDef(
        _name,
        inputs=("input",),
        attrs={"diagonal": Attr("int", 0)},
        infer_meta=_tri_meta(_name),
        kernel=_tri_kernel(_name),
        saves=(),
        grad=(lambda n: lambda ctx, g: (op(n, g, diagonal=ctx.attrs["diagonal"]),))(_name),
        # masking is linear and elementwise (the kernel knows its piece's position)
        sbp=lambda x, diagonal=0: _axis_sbp(x, ()),
        reference=_name,
        samples=lambda rng: [Sample(_rand(rng, 3, 4)),
                             Sample(_rand(rng, 2, 4, 3), diagonal=-1),
                             Sample(_rand(rng, 3, 5), diagonal=2),
                             Sample(_rand(rng, 3, 3) > 0, diagonal=0, grad=False)],
    ))


# -- pad ---------------------------------------------------------------------------------------
PAD_MODES = ("constant", "reflect", "replicate", "circular")
_AXIS_LETTERS = "WHD"


def pad_pairs(x, pad, mode="constant", value=None):
    """Validate torch's F.pad arguments; returns [(axis, before, after)] from the last axis."""
    if mode not in PAD_MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if len(pad) % 2:
        raise op_error("pad", "Padding length must be divisible by 2")
    k = len(pad) // 2
    if k > x.ndim:
        raise op_error("pad", f"Padding length should be less than or equal to two times the "
                       f"input dimension but got padding length {len(pad)} and input of "
                       f"dimension {x.ndim}")
    pairs = [(x.ndim - 1 - j, pad[2 * j], pad[2 * j + 1]) for j in range(k)]
    if mode == "constant":
        for axis, b, a in pairs:
            if x.shape[axis] + b + a < 0:
                raise op_error("pad", "narrow(): length must be non-negative.")
        return pairs
    if value is not None and value != 0:
        raise op_error("pad", f'Padding mode "{mode}" doesn\'t take in value argument')
    if k not in (1, 2, 3) or x.ndim not in (k + 1, k + 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {x.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    if mode != "circular":
        if x.dtype is dt.bool_:
            kind = "reflection" if mode == "reflect" else "replication"
            raise NotImplementedError(f'"{kind}_pad{k}d" not implemented for \'Bool\'')
        if any(n == 0 for n in x.shape[-(k + 1):]):
            raise op_error("pad", f"Expected {k + 1}D or {k + 2}D (batch mode) tensor with "
                           "possibly 0 batch size and other non-zero dimensions for input, but "
                           f"got: {list(x.shape)}")
    for j, (axis, b, a) in enumerate(pairs):
        n = x.shape[axis]
        if mode == "reflect" and (b >= n or a >= n):
            raise op_error("pad", f"Argument #{4 + 2 * j}: Padding size should be less than the "
                           f"corresponding input dimension, but got: padding ({b}, {a}) at "
                           f"dimension {axis} of input {list(x.shape)}")
        if mode == "circular":
            kept = n - max(-b, 0) - max(-a, 0)  # wrapping copies from the cropped input
            if b > n or a > n or b > kept or a > kept:
                raise op_error("pad", "Padding value causes wrapping around more than once.")
            if n + b + a < 0:
                raise op_error("pad", "narrow(): length must be non-negative.")
        elif n + b + a < 1:
            raise op_error("pad", f"input ({_AXIS_LETTERS[j]}: {n}) is too small. Calculated "
                           f"output {_AXIS_LETTERS[j]}: {n + b + a}")
    return pairs


def _source_positions(n, b, a, mode):
    """For each output position along one padded axis, the input position it copies."""
    j = np.arange(n + b + a, dtype=np.int64) - b
    if mode == "reflect":
        j = np.where(j < 0, -j, j)
        return np.where(j >= n, 2 * (n - 1) - j, j)
    if mode == "replicate":
        return np.clip(j, 0, n - 1)
    lo, hi = max(-b, 0), n - max(-a, 0)  # circular: crop first, then wrap the rest
    p = np.arange(n + b + a, dtype=np.int64) - max(b, 0)
    return lo + np.mod(p, max(hi - lo, 1))


def _pad_key(ctx, shape, pairs, mode):
    """The advanced-index key that reads a non-constant padding out of the input."""
    k = len(pairs)
    first = len(shape) - k
    arrays = []
    for axis, b, a in sorted(pairs):
        src = _source_positions(shape[axis], b, a, mode)
        view_shape = [1] * k
        view_shape[axis - first] = -1
        arrays.append(ctx.prims.from_host(src.reshape(view_shape), dt.int64))
    return (slice(None),) * first + tuple(arrays)


def _pad_meta(x, pad, mode="constant", value=None):
    shape = list(x.shape)
    for axis, b, a in pad_pairs(x, pad, mode, value):
        shape[axis] += b + a
    return TensorMeta(tuple(shape), x.dtype)


def _pad_kernel(ctx, x, pad, mode="constant", value=None):
    xm, om = ctx.in_metas[0], ctx.out_metas[0]
    pairs = pad_pairs(xm, pad, mode, value)
    if mode != "constant":
        return ctx.prims.index(x, _pad_key(ctx, xm.shape, pairs, mode))
    out = ctx.prims.full(om.shape, om.dtype, 0 if value is None else value)
    dst = [slice(None)] * xm.ndim
    src = [slice(None)] * xm.ndim
    for axis, b, a in pairs:
        n = xm.shape[axis]
        lo, hi = max(-b, 0), n - max(-a, 0)
        if hi <= lo:
            return out
        src[axis] = slice(lo, hi)
        dst[axis] = slice(max(b, 0), max(b, 0) + hi - lo)
    # a trailing Ellipsis keeps the empty key of a 0-d tensor a view
    ctx.prims.copy(ctx.prims.slice(out, (*dst, Ellipsis)), ctx.prims.slice(x, (*src, Ellipsis)))
    return out


def _pad_grad(ctx, g):
    pad, mode = ctx.attrs["pad"], ctx.attrs["mode"]
    if mode == "constant":  # the adjoint crops what was added (and zero-fills what was cut)
        return (op("pad", g, pad=tuple(-p for p in pad), mode="constant", value=0),)
    return (op("pad_grad", g, pad=pad, mode=mode),)


def _pad_sbp(x, pad, mode="constant", value=None):
    touched = [axis for axis, b, a in pad_pairs(x, pad, mode, value) if (b, a) != (0, 0)]
    sigs = [Signature((B,), (B,))]
    if mode != "constant" or not value:
        sigs.append(Signature((P,), (P,)))  # copying and zero padding are linear
    return sigs + [Signature((Split(i),), (Split(i),))  # unpadded axes are independent
                   for i in range(x.ndim) if i not in touched and x.shape[i] > 1]


def _pad_reference(torch, x, pad, mode="constant", value=None):
    return torch.nn.functional.pad(x, pad, mode=mode, value=value)


register(OpDef(
    "pad",
    inputs=("input",),
    attrs={"pad": Attr("ints"), "mode": Attr("str", "constant"), "value": Attr("scalar", None)},
    infer_meta=_pad_meta,
    kernel=_pad_kernel,
    saves=(),
    grad=_pad_grad,
    sbp=_pad_sbp,
    reference=_pad_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3, 4), pad=(1, 2)),
        Sample(_rand(rng, 2, 3, 4), pad=(1, -2, 0, 3), value=1.5),
        Sample(_rand(rng, 2, 3, 4), pad=(0, 0, 0, 0, 1, 1)),
        Sample(_rand(rng, 2, 3, 5), pad=(3, -1), mode="reflect"),
        Sample(_rand(rng, 1, 2, 3, 4), pad=(1, 2, 2, 1), mode="reflect"),
        Sample(_rand(rng, 2, 3, 4), pad=(2, 5, -1, 1), mode="replicate"),
        Sample(_rand(rng, 1, 2, 3, 2, 2), pad=(1, 1, 1, 0, 2, 1), mode="replicate"),
        Sample(_rand(rng, 2, 5), pad=(2, -1), mode="circular"),
        Sample(_rand(rng, 2, 3, 4), pad=(4, 1, 3, 3), mode="circular"),
        Sample((_rand(rng, 2, 3) * 4).astype(np.int64), pad=(1, 1), value=7, grad=False),
        Sample(_rand(rng, 3, 3) > 0, pad=(1, 2), mode="circular", grad=False),
    ],
    doc="torch.nn.functional.pad: pad holds (before, after) pairs from the last axis.",
))


def _pad_grad_meta(g, pad, mode):
    if mode == "constant" or mode not in PAD_MODES:
        raise op_error("pad_grad", f"mode must be reflect, replicate or circular, got {mode!r}")
    shape = list(g.shape)
    k = len(pad) // 2
    for j in range(k):
        shape[g.ndim - 1 - j] -= pad[2 * j] + pad[2 * j + 1]
    meta = TensorMeta(tuple(shape), g.dtype)
    if any(n < 0 for n in shape) or _pad_meta(meta, pad, mode).shape != g.shape:
        raise op_error("pad_grad", f"grad of shape {list(g.shape)} does not fit padding "
                       f"{list(pad)}")
    return meta


def _pad_grad_kernel(ctx, g, pad, mode):
    om = ctx.out_metas[0]
    pairs = pad_pairs(om, pad, mode)
    out = ctx.prims.full(om.shape, om.dtype, 0)
    # Each padded output position adds its gradient to the input position it copied.
    return ctx.prims.index_put(out, _pad_key(ctx, om.shape, pairs, mode), g, True)


def _pad_grad_sbp(g, pad, mode):
    x = _pad_grad_meta(g, pad, mode)
    touched = [axis for axis, b, a in pad_pairs(x, pad, mode) if (b, a) != (0, 0)]
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [  # P -> P: a linear adjoint
        Signature((Split(i),), (Split(i),))  # unpadded axes are independent
        for i in range(g.ndim) if i not in touched and g.shape[i] > 1]


def _pad_grad_reference(torch, g, pad, mode):
    shape = list(g.shape)
    for j in range(len(pad) // 2):
        shape[g.ndim - 1 - j] -= pad[2 * j] + pad[2 * j + 1]
    x = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
    y = torch.nn.functional.pad(x, pad, mode=mode)
    return torch.autograd.grad(y, x, g, create_graph=True)[0]


register(OpDef(
    "pad_grad",
    inputs=("grad",),
    attrs={"pad": Attr("ints"), "mode": Attr("str")},
    infer_meta=_pad_grad_meta,
    kernel=_pad_grad_kernel,
    saves=(),
    grad=lambda ctx, gg: (op("pad", gg, pad=ctx.attrs["pad"], mode=ctx.attrs["mode"]),),
    sbp=_pad_grad_sbp,
    reference=_pad_grad_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3, 7), pad=(3, -1), mode="reflect"),
        Sample(_rand(rng, 2, 4, 10), pad=(2, 5, -1, 1), mode="replicate"),
        Sample(_rand(rng, 2, 9, 6).astype(np.float32), pad=(3, -1, 3, 3), mode="circular"),
    ],
    doc="The adjoint of a reflect/replicate/circular pad: sums grads onto their sources.",
))


# -- repeat ------------------------------------------------------------------------------------
def _repeat_meta(x, repeats):
    if len(repeats) < x.ndim:
        raise op_error("repeat", "Number of dimensions of repeat dims can not be smaller than "
                       "number of dimensions of tensor")
    lead = len(repeats) - x.ndim
    shape = tuple(r * n for r, n in zip(repeats, (1,) * lead + x.shape, strict=True))
    for s in shape:
        if s < 0:
            raise op_error("repeat", f"Trying to create tensor with negative dimension {s}: "
                           f"{list(shape)}")
    return TensorMeta(shape, x.dtype)


def _interleave(a, b):
    return tuple(v for pair in zip(a, b, strict=True) for v in pair)


def _repeat_kernel(ctx, x, repeats):
    xm, om = ctx.in_metas[0], ctx.out_metas[0]
    lead = len(repeats) - xm.ndim
    sizes = (1,) * lead + xm.shape
    out = ctx.prims.empty(om.shape, om.dtype)
    if om.numel == 0:
        return out
    # out viewed as (r0, s0, r1, s1, ...) receives x viewed as (1, s0, 1, s1, ...)
    blocks = ctx.prims.reshape(out, _interleave(repeats, sizes))
    ctx.prims.copy(blocks, ctx.prims.reshape(x, _interleave((1,) * len(sizes), sizes)))
    return out


def _repeat_grad(ctx, g):
    xm = ctx.in_metas[0]
    repeats = ctx.attrs["repeats"]
    sizes = (1,) * (len(repeats) - xm.ndim) + xm.shape
    blocks = op("reshape", g, shape=_interleave(repeats, sizes))
    summed = op("sum", blocks, dim=tuple(range(0, 2 * len(sizes), 2)))
    return (op("reshape", summed, shape=xm.shape),)


def _repeat_sbp(x, repeats):
    lead = len(repeats) - x.ndim
    return [Signature((B,), (B,)), Signature((P,), (P,))] + [  # P -> P: tiling is linear
        Signature((Split(i),), (Split(i + lead),))  # an axis repeated once keeps its split
        for i in range(x.ndim) if repeats[i + lead] == 1 and x.shape[i] > 1]


register(OpDef(
    "repeat",
    inputs=("input",),
    attrs={"repeats": Attr("ints")},
    infer_meta=_repeat_meta,
    kernel=_repeat_kernel,
    saves=(),
    grad=_repeat_grad,
    sbp=_repeat_sbp,
    reference=lambda torch, x, repeats: x.repeat(*repeats) if repeats else x.repeat(()),
    samples=lambda rng: [Sample(_rand(rng, 2, 3), repeats=(2, 1)),
                         Sample(_rand(rng, 2, 3), repeats=(3, 1, 2)),
                         Sample(np.asarray(1.5), repeats=(2,)),
                         Sample(_rand(rng, 3), repeats=(0, 2)),
                         Sample((_rand(rng, 2) * 3).astype(np.int32), repeats=(2, 2),
                                grad=False)],
))
