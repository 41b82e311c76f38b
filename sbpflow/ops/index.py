"""Indexing ops: basic-index views, advanced indexing and its adjoint, gather/scatter,
index_select/index_add and masked_fill.

Index keys
----------
Attrs must be hashable, so an index key travels as a tuple of entries:

    ('int', i)                    select position i (negative counts from the end)
    ('slice', start, stop, step)  start/stop are ints or None, step is an int > 0
    ('none',)                     insert an axis of size 1
    ('ellipsis',)                 as many full slices as the unmentioned axes
    ('tensor', k)                 advanced index: the k-th *index tensor input* of the op

Two ops consume keys, mirroring torch's split between basic and advanced indexing:

- `slice(input, key)` (a view) takes 'int', 'slice', 'none' and 'ellipsis' entries.  Its
  adjoint `slice_grad(grad, key, shape)` writes a view-shaped tensor into zeros.
- `index(*tensors, key)` is aten::index: tensors = [source, *indices], and the key holds only
  full slices ('slice', None, None, None) and ('tensor', k) entries (k counts from 0 over the
  index tensors), so NumPy's placement rule for the broadcast index dims (in place when the
  tensor entries are adjacent, else in front) is exactly torch's.  Its adjoint is
  `index_put(*tensors, key, accumulate)` with tensors = [source, values, *indices].

`Tensor.__getitem__` (framework/functional/index.py) first applies the ints, slices and Nones
with `slice`, as torch does, then the tensors with `index` on the result; bool masks become
integer index tensors there (their nonzero positions), because an op's output shape must
follow from metas alone.  Index *values* (bounds) are checked there too, since infer_meta sees
only metas and kernels must not raise for bad user input.
"""

from __future__ import annotations

import functools

import numpy as np

from .._core import dtype as dt
from .._core.errors import broadcast_shapes, normalize_dim, op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split, elementwise_signatures
from ._util import unbroadcast
from .registry import Attr, OpDef, Sample, op, register

FULL = ("slice", None, None, None)
_INDEX_DTYPES = (dt.int64, dt.int32)


def _rand(rng, *shape):
    return rng.standard_normal(shape)


def _zeros(shape, like):
    """Zeros of `shape` with like's dtype, on like's device (for grad rules)."""
    return op("full", shape=tuple(shape), fill_value=0, dtype=like.dtype, _device=like._where())


def _index_dtype_error():
    return IndexError("tensors used as indices must be long, int, byte or bool tensors")


# -- basic keys ------------------------------------------------------------------------------
def expand_key(name: str, key, ndim: int) -> list:
    """Validate a basic key's entries and replace an ellipsis with full slices."""
    if not isinstance(key, tuple):
        raise op_error(name, f"argument 'key' must be a tuple of index entries, got {key!r}",
                       TypeError)
    used = 0
    ellipsis = 0
    for e in key:
        if not isinstance(e, tuple) or not e:
            raise op_error(name, f"invalid index entry {e!r}", TypeError)
        kind = e[0]
        if kind in ("int", "slice"):
            used += 1
        elif kind == "ellipsis":
            ellipsis += 1
        elif kind != "none":
            raise op_error(name, f"invalid index entry {e!r} (expected int, slice, none or "
                           "ellipsis)", TypeError)
    if ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if used > ndim:
        if ndim == 0 and any(e[0] == "int" for e in key):
            raise IndexError(
                "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    out = []
    for e in key:
        if e[0] == "ellipsis":
            out.extend([FULL] * (ndim - used))
        else:
            out.append(e)
    if not ellipsis:
        out.extend([FULL] * (ndim - used))
    return out


def _slice_bounds(e, n):
    """(start, stop, step) of a ('slice', ...) entry on an axis of size n, clamped as Python."""
    _, start, stop, step = e
    for v in (start, stop, step):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise TypeError(f"slice indices must be integers or None, got {v!r}")
    if step is None:
        step = 1
    if step == 0:
        raise ValueError("slice step cannot be zero")
    if step < 0:
        raise ValueError("step must be greater than zero")
    return slice(start, stop, step).indices(n)


def _walk(key, shape):
    """Yield (entry, in_axis, out_axis) over an expanded basic key.

    in_axis is None for 'none' entries, out_axis is None for 'int' entries."""
    i = o = 0
    for e in key:
        if e[0] == "none":
            yield e, None, o
            o += 1
        elif e[0] == "int":
            yield e, i, None
            i += 1
        else:
            yield e, i, o
            i += 1
            o += 1


def basic_shape(name: str, shape, key) -> tuple[int, ...]:
    """The shape of `x[key]` for a basic key, with torch's errors."""
    ex = expand_key(name, key, len(shape))
    out = []
    for e, i, _ in _walk(ex, shape):
        if e[0] == "none":
            out.append(1)
        elif e[0] == "int":
            n, idx = shape[i], e[1]
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise op_error(name, f"index entry {e!r} must hold an int", TypeError)
            if idx < -n or idx >= n:
                raise IndexError(f"index {idx} is out of bounds for dimension {i} with size {n}")
        else:
            start, stop, step = _slice_bounds(e, shape[i])
            out.append(len(range(start, stop, step)))
    return tuple(out)


def numpy_key(key, ndim: int) -> tuple:
    """The NumPy/torch key of an expanded basic key (pure Python: ints, slices, None)."""
    out = []
    for e in expand_key("slice", key, ndim):
        if e[0] == "int":
            out.append(e[1])
        elif e[0] == "none":
            out.append(None)
        else:
            out.append(slice(e[1], e[2], 1 if e[3] is None else e[3]))
    # A trailing Ellipsis keeps an all-int key a 0-d view (NumPy returns a scalar copy).
    return tuple(out) + (Ellipsis,)


def _is_full(e, n):
    if e[0] != "slice":
        return False
    start, stop, step = e[1], e[2], e[3]
    return (start in (None, 0)) and (stop is None or stop >= n) and step in (None, 1)


def _slice_meta(x, key):
    return TensorMeta(basic_shape("slice", x.shape, key), x.dtype)


def _slice_sbp(x, key):
    sigs = [Signature((B,), (B,)),
            Signature((P,), (P,))]  # P -> P: a view of each partial piece sums to the view
    for e, i, o in _walk(expand_key("slice", key, x.ndim), x.shape):
        if i is not None and o is not None and x.shape[i] > 1 and _is_full(e, x.shape[i]):
            sigs.append(Signature((Split(i),), (Split(o),)))  # an untouched axis keeps its split
    return sigs


def _slice_samples(rng):
    s = lambda *a: ("slice",) + a  # noqa: E731
    return [
        Sample(_rand(rng, 4, 5), key=(("int", 1),)),
        Sample(_rand(rng, 4, 5), key=(s(1, None, 2), ("int", -1))),
        Sample(_rand(rng, 3, 4, 5), key=(("ellipsis",), s(None, -1, None), ("none",))),
        Sample(_rand(rng, 3, 4, 5), key=(("none",), s(None, None, None), ("int", 0),
                                         s(-3, 10, 2))),
        Sample(_rand(rng, 3, 4), key=(s(5, 7, 1),)),
        Sample(np.asarray(2.5), key=(("none",), ("ellipsis",))),
        Sample((_rand(rng, 4, 3) * 5).astype(np.int64), key=(s(None, None, 3),), grad=False),
    ]


def _slice_direct(ctx, attrs):
    """specialize: the slice primitive with the NumPy key built once."""
    key, slice_ = numpy_key(attrs["key"], ctx.in_metas[0].ndim), ctx.prims.slice
    return lambda x: slice_(x, key)


@functools.lru_cache(maxsize=1024)  # once per (meta, key): it runs per recorded slice
def _slice_node_name(x, key):
    """torch's node name for x[key]: after its last step that does something (an int
    selects, None unsqueezes, a slice that keeps less than its whole axis slices); a key of
    whole slices only is an alias.  A key of one slice always slices (torch's x[:] and
    x[0:n] are SliceBackward0: it skips whole slices only in a tuple of several)."""
    if len(key) == 1 and key[0][0] == "slice":
        return "SliceBackward0"
    name, axis = "AliasBackward0", 0
    for e in expand_key("slice", key, x.ndim):
        if e[0] == "int":
            name = "SelectBackward0"
        elif e[0] == "none":
            name = "UnsqueezeBackward0"
            continue
        elif _slice_bounds(e, x.shape[axis]) != (0, x.shape[axis], 1):
            name = "SliceBackward0"
        axis += 1
    return name


register(OpDef(
    "slice",
    inputs=("input",),
    attrs={"key": Attr("any")},
    infer_meta=_slice_meta,
    kernel=lambda ctx, x, key: ctx.prims.slice(x, numpy_key(key, ctx.in_metas[0].ndim)),
    specialize=_slice_direct,
    # Only metas and attrs: the grad also replays writes through views (interpreter._embed).
    saves=(),
    grad=lambda ctx, g: (op("slice_grad", g, key=ctx.attrs["key"], shape=ctx.in_metas[0].shape),),
    sbp=_slice_sbp,
    node_name=_slice_node_name,
    reference=lambda torch, x, key: x[numpy_key(key, x.ndim)],
    samples=_slice_samples,
    view=True,
    doc="Basic indexing x[ints, slices, None, ...] as a view.",
))


def _slice_grad_meta(g, key, shape):
    want = basic_shape("slice_grad", tuple(shape), key)
    if want != g.shape:
        raise op_error("slice_grad", f"grad has shape {list(g.shape)} but the key selects "
                       f"{list(want)} from {list(shape)}")
    return TensorMeta(tuple(shape), g.dtype)


def _slice_grad_kernel(ctx, g, key, shape):
    out_meta = ctx.out_metas[0]
    out = ctx.prims.full(out_meta.shape, out_meta.dtype, 0)
    ctx.prims.copy(ctx.prims.slice(out, numpy_key(key, out_meta.ndim)), g)
    return out


def _slice_grad_sbp(g, key, shape):
    sigs = [Signature((B,), (B,)), Signature((P,), (P,))]  # P -> P: linear
    for e, i, o in _walk(expand_key("slice_grad", key, len(shape)), shape):
        if i is not None and o is not None and shape[i] > 1 and _is_full(e, shape[i]):
            sigs.append(Signature((Split(o),), (Split(i),)))  # untouched axis: split passes
    return sigs


def _slice_grad_reference(torch, g, key, shape):
    z = torch.zeros(tuple(shape), dtype=g.dtype)
    z[numpy_key(key, len(shape))] = g
    return z


register(OpDef(
    "slice_grad",
    inputs=("grad",),
    attrs={"key": Attr("any"), "shape": Attr("ints")},
    infer_meta=_slice_grad_meta,
    kernel=_slice_grad_kernel,
    saves=(),
    grad=lambda ctx, gg: (op("slice", gg, key=ctx.attrs["key"]),),
    sbp=_slice_grad_sbp,
    reference=_slice_grad_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 5), key=(("int", 1),), shape=(4, 5)),
        Sample(_rand(rng, 1, 4, 2), key=(("none",), ("slice", None, None, None),
                                       ("slice", 1, None, 2)), shape=(4, 5)),
        Sample(_rand(rng, 3).astype(np.float32), key=(("ellipsis",), ("int", -1)),
               shape=(3, 2)),
    ],
    doc="The adjoint of slice: zeros of `shape` with the view region set to grad.",
))


# -- advanced indexing -----------------------------------------------------------------------
def _check_index_key(name, key, ndim, n_indices):
    if not isinstance(key, tuple):
        raise op_error(name, f"argument 'key' must be a tuple of index entries, got {key!r}",
                       TypeError)
    if len(key) > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    seen = []
    for e in key:
        if e == FULL:
            continue
        if not (isinstance(e, tuple) and len(e) == 2 and e[0] == "tensor"
                and isinstance(e[1], int) and 0 <= e[1] < n_indices):
            raise op_error(name, f"invalid index entry {e!r}: the key of an advanced index "
                           f"holds full slices and ('tensor', k) with 0 <= k < {n_indices}",
                           TypeError)
        seen.append(e[1])
    if sorted(seen) != list(range(n_indices)):
        raise op_error(name, f"every index tensor must appear exactly once in the key, got "
                       f"{key!r} for {n_indices} index tensors", TypeError)
    if not seen:
        raise op_error(name, "an advanced index needs at least one index tensor")


def _positions(key):
    """Axes of the source that take an index tensor, in order."""
    return [a for a, e in enumerate(key) if e != FULL]


def index_layout(name, src_shape, key, idx_metas):
    """(result shape, broadcast index shape, where the broadcast dims start, map of source
    axis -> result axis for the non-indexed axes)."""
    for m in idx_metas:
        if m.dtype not in _INDEX_DTYPES:
            raise _index_dtype_error()
    _check_index_key(name, key, len(src_shape), len(idx_metas))
    if len(idx_metas) > 1:
        try:
            bshape = broadcast_shapes(name, *[m.shape for m in idx_metas])
        except RuntimeError:
            shapes = ", ".join(str(list(m.shape)) for m in idx_metas)
            raise IndexError(
                f"shape mismatch: indexing tensors could not be broadcast together with "
                f"shapes {shapes}") from None
    else:
        bshape = idx_metas[0].shape
    pos = _positions(key)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    start = pos[0] if adjacent else 0
    axis_map = {}
    out = []
    if not adjacent:
        out.extend(bshape)
    for a in range(len(src_shape)):
        if a in pos:
            if adjacent and a == pos[0]:
                out.extend(bshape)
            continue
        axis_map[a] = len(out)
        out.append(src_shape[a])
    return tuple(out), tuple(bshape), start, axis_map


def _advanced_key(key, index_arrays):
    return tuple(slice(None) if e == FULL else index_arrays[e[1]] for e in key)


def _index_meta(src, *indices, key):
    shape, _, _, _ = index_layout("index", src.shape, key, indices)
    return TensorMeta(shape, src.dtype)


def _index_kernel(ctx, arrays, key):
    return ctx.prims.index(arrays[0], _advanced_key(key, arrays[1:]))


def _index_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return (None,) * len(ctx.in_metas)
    indices = [ctx.input(i) for i in range(1, len(ctx.in_metas))]  # not the source
    zeros = _zeros(ctx.in_metas[0].shape, g)
    gx = op("index_put", [zeros, g, *indices], key=ctx.attrs["key"], accumulate=True)
    return (gx,) + (None,) * len(indices)


def _index_sbp(src, *indices, key):
    shape, bshape, start, axis_map = index_layout("index", src.shape, key, indices)
    n = len(indices)
    sigs = [Signature((B,) * (n + 1), (B,)),
            Signature((P,) + (B,) * n, (P,))]  # (P, B..) -> P: gathering is linear in source
    for a, o in axis_map.items():
        if src.shape[a] > 1:  # a non-indexed axis keeps its split
            sigs.append(Signature((Split(a),) + (B,) * n, (Split(o),)))
    for j, size in enumerate(bshape):
        if size <= 1:
            continue
        ins = []
        for m in indices:
            ax = j - (len(bshape) - m.ndim)
            ins.append(Split(ax) if ax >= 0 and m.shape[ax] == size else B)
        # Each output element reads only the index elements at its own broadcast position.
        sigs.append(Signature((B,) + tuple(ins), (Split(start + j),)))
    return sigs


def _torch_key(torch, key, indices):
    return tuple(slice(None) if e == FULL else indices[e[1]] for e in key)


def _index_samples(rng):
    t = lambda k: ("tensor", k)  # noqa: E731
    ix = lambda *a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return [
        Sample([_rand(rng, 5, 3), ix(0, 4, 4, -1)], key=(t(0),)),
        Sample([_rand(rng, 4, 5, 3), ix([0], [3]), ix(1, 4, 0)], key=(t(0), t(1))),
        Sample([_rand(rng, 4, 5, 3), ix(2, 0)], key=(FULL, t(0))),
        # separated index tensors: the broadcast dims go first
        Sample([_rand(rng, 4, 5, 3), ix(1, 3), ix(2, -1)], key=(t(0), FULL, t(1))),
        Sample([_rand(rng, 4, 5), np.asarray(3, dtype=np.int32)], key=(FULL, t(0))),
        Sample([_rand(rng, 3, 4).astype(np.float32), ix([0, 2], [1, 1])], key=(t(0),)),
        Sample([(_rand(rng, 6) * 4).astype(np.int64), ix(5, 0, 5)], key=(t(0),), grad=False),
        Sample([_rand(rng, 4, 3), np.zeros((0,), np.int64)], key=(t(0),)),
    ]


register(OpDef(
    "index",
    inputs=("*tensors",),
    attrs={"key": Attr("any")},
    infer_meta=_index_meta,
    kernel=_index_kernel,
    saves=("tensors[1:]",),  # the indices, not the source
    grad=_index_grad,
    sbp=_index_sbp,
    reference=lambda torch, tensors, key: tensors[0][_torch_key(torch, key, tensors[1:])],
    samples=_index_samples,
    doc="aten::index: tensors = [source, *indices]; see the module docstring for the key.",
))


def _index_put_meta(src, values, *indices, key, accumulate=False):
    if values.dtype is not src.dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{_torch_name(src.dtype)} for the destination and {_torch_name(values.dtype)} "
            "for the source.")
    shape, _, _, _ = index_layout("index_put", src.shape, key, indices)
    if not _broadcastable_to(values.shape, shape):
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values.shape)} cannot "
                           f"be broadcast to indexing result of shape {list(shape)}")
    return src


def _broadcastable_to(vshape, shape) -> bool:
    """Can values of vshape be broadcast to a region of `shape` (as torch's index_put)?"""
    if len(vshape) > len(shape):
        return False
    return all(a in (b, 1) for a, b in zip(reversed(vshape), reversed(shape), strict=False))


def _index_put_kernel(ctx, arrays, key, accumulate=False):
    out = ctx.prims.contiguous(arrays[0])
    return ctx.prims.index_put(out, _advanced_key(key, arrays[2:]), arrays[1], accumulate)


def _index_put_grad(ctx, g):
    key, accumulate = ctx.attrs["key"], ctx.attrs["accumulate"]
    need_src, need_values = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_src or need_values):
        return (None,) * len(ctx.in_metas)
    indices = [ctx.input(i) for i in range(2, len(ctx.in_metas))]  # only what is needed
    gs = gv = None
    if need_src:
        if accumulate:
            gs = g
        else:  # overwritten positions do not reach the source
            zero = _zeros((), g)
            gs = op("index_put", [g, zero, *indices], key=key, accumulate=False)
    if need_values:
        gv = unbroadcast(op("index", [g, *indices], key=key), ctx.in_metas[1])
    return (gs, gv) + (None,) * len(indices)


def _index_put_sbp(src, values, *indices, key, accumulate=False):
    shape, _, _, axis_map = index_layout("index_put", src.shape, key, indices)
    n = len(indices)
    sigs = [Signature((B,) * (n + 2), (B,)),
            # (P, P, B..) -> P: the result is linear in source and values jointly
            Signature((P, P) + (B,) * n, (P,))]
    lead = len(shape) - values.ndim
    for a, r in axis_map.items():
        if src.shape[a] <= 1:
            continue
        va = r - lead
        if va >= 0 and values.shape[va] == shape[r]:
            vs = Split(va)
        elif va < 0 or values.shape[va] == 1:
            vs = B
        else:
            continue
        # A non-indexed axis: each piece writes its own slab, values split alike.
        sigs.append(Signature((Split(a), vs) + (B,) * n, (Split(a),)))
    return sigs


def _index_put_reference(torch, tensors, key, accumulate=False):
    src, values, indices = tensors[0], tensors[1], tensors[2:]
    full = [None if e == FULL else indices[e[1]] for e in key]
    return torch.ops.aten.index_put.default(src, full, values, accumulate)


def _index_put_samples(rng):
    t = lambda k: ("tensor", k)  # noqa: E731
    ix = lambda *a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return [
        Sample([_rand(rng, 5, 3), _rand(rng, 3, 3), ix(0, 4, -2)], key=(t(0),)),
        Sample([_rand(rng, 5, 3), _rand(rng, 3), ix(0, 4, 0)], key=(t(0),), accumulate=True),
        Sample([_rand(rng, 4, 5, 3), _rand(rng, 2, 3), ix(1, 3), ix(2, 0)], key=(t(0), t(1))),
        Sample([_rand(rng, 4, 5, 3), _rand(rng, 4, 1, 3), ix(4, 1)], key=(FULL, t(0), FULL),
               accumulate=True),
        Sample([_rand(rng, 4, 5, 3), _rand(rng, 1, 5), ix(1, 3), ix(2, 0)],
               key=(t(0), FULL, t(1))),
        Sample([_rand(rng, 4, 3), np.asarray(1.5), ix([0, 2], [1, 3])], key=(t(0),)),
        Sample([_rand(rng, 3, 4).astype(np.float32), _rand(rng, 3, 1).astype(np.float32),
                np.asarray([1, 3], dtype=np.int32)], key=(FULL, t(0)), accumulate=True),
        Sample([(_rand(rng, 6) * 4).astype(np.int64), ix(7, 8), ix(5, 5)], key=(t(0),),
               accumulate=True, grad=False),
    ]


register(OpDef(
    "index_put",
    inputs=("*tensors",),
    attrs={"key": Attr("any"), "accumulate": Attr("bool", False)},
    infer_meta=_index_put_meta,
    kernel=_index_put_kernel,
    saves=("tensors[2:]",),  # the indices, not the source or values
    grad=_index_put_grad,
    sbp=_index_put_sbp,
    reference=_index_put_reference,
    samples=_index_put_samples,
    doc="aten::index_put: tensors = [source, values, *indices]; a copy of source with the "
        "indexed positions set to (or, with accumulate, incremented by) values.",
))


def _torch_name(d: dt.DType) -> str:
    return {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
            "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}[d.name]


# -- gather / scatter ------------------------------------------------------------------------
def _dim_check(name, x, index, dim, *, src=None, what="self"):
    """torch's gather/scatter shape rules; returns the normalised dim."""
    if index.dtype not in _INDEX_DTYPES:
        raise op_error(name, "Expected dtype int32/int64 for index")
    d = normalize_dim(name, dim, x.ndim)
    if max(index.ndim, 1) != max(x.ndim, 1):
        raise RuntimeError(
            f"Index tensor must have the same number of dimensions as {what} tensor")
    if index.ndim and x.ndim:
        for i in range(x.ndim):
            if i == d:
                continue
            if index.shape[i] > x.shape[i] or (src is not None and src.ndim
                                                 and index.shape[i] > src.shape[i]):
                if name == "gather":
                    raise RuntimeError(
                        f"Size does not match at dimension {i} expected index "
                        f"{list(index.shape)} to be no larger than self {list(x.shape)} apart "
                        f"from dimension {d}")
                raise RuntimeError(
                    f"Expected index {list(index.shape)} to be no larger than self "
                    f"{list(x.shape)} apart from dimension {d} and to be no larger size than "
                    f"src {list(src.shape)}")
    if src is not None and src.ndim and index.ndim:
        if src.ndim != index.ndim:
            raise RuntimeError("Index tensor must have the same number of dimensions as src "
                               "tensor")
        if index.shape[d] > src.shape[d]:
            raise RuntimeError(
                f"Expected index {list(index.shape)} to be no larger than self "
                f"{list(x.shape)} apart from dimension {d} and to be no larger size than src "
                f"{list(src.shape)}")
    return d


def _as_1d(ctx, a, meta):
    """0-d arrays take part in gather/scatter as 1-element vectors, as in torch."""
    return ctx.prims.reshape(a, (1,)) if meta.ndim == 0 else a


def _gather_meta(x, index, dim):
    _dim_check("gather", x, index, dim, what="input")
    return TensorMeta(index.shape, x.dtype)


def _gather_kernel(ctx, x, index, dim):
    xm, im = ctx.in_metas
    d = normalize_dim("gather", dim, xm.ndim)
    x1, i1 = _as_1d(ctx, x, xm), _as_1d(ctx, index, im)
    if xm.ndim:
        # take_along_axis needs equal extents off `dim`.  A piece of index whose source axis
        # is whole (not split with it) reads the source rows at its own logical offset.
        piece = ctx.piece(0)
        key = []
        for a in range(xm.ndim):
            if a == d:
                key.append(slice(None))
                continue
            lo = piece[a].start if xm.shape[a] == ctx.logical_in[0].shape[a] else 0
            key.append(slice(lo, lo + im.shape[a]))
        x1 = ctx.prims.slice(x1, tuple(key))
    out = ctx.prims.gather(x1, d, i1)
    return ctx.prims.reshape(out, ()) if im.ndim == 0 else out


def _gather_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return None, None
    index = ctx.input(1)
    zeros = _zeros(ctx.in_metas[0].shape, g)
    return op("scatter_add", zeros, index, g, dim=ctx.attrs["dim"]), None


def _gather_sbp(x, index, dim):
    d = normalize_dim("gather", dim, x.ndim)
    sigs = [Signature((B, B), (B,)),
            Signature((P, B), (P,))]  # (P, B) -> P: gathering is linear in the source
    for i in range(index.ndim):
        if index.shape[i] <= 1:
            continue
        # Each output element reads the index element at its own position.
        sigs.append(Signature((B, Split(i)), (Split(i),)))
        if i != d and x.ndim and x.shape[i] == index.shape[i]:
            sigs.append(Signature((Split(i), Split(i)), (Split(i),)))  # rows stay together
    return sigs


def _perm_index(rng, shape, dim, n):
    """An index of `shape` whose entries along dim are distinct positions in range(n)."""
    out = np.empty(shape, np.int64)
    it = np.ndindex(*[s for i, s in enumerate(shape) if i != dim])
    for rest in it:
        vals = rng.permutation(n)[: shape[dim]]
        key = list(rest)
        key.insert(dim, slice(None))
        out[tuple(key)] = vals
    return out


register(OpDef(
    "gather",
    inputs=("input", "index"),
    attrs={"dim": Attr("int")},
    infer_meta=_gather_meta,
    kernel=_gather_kernel,
    saves=("index for input",),
    grad=_gather_grad,
    sbp=_gather_sbp,
    reference=lambda torch, x, index, dim: torch.gather(x, dim, index),
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), rng.integers(0, 4, (3, 5)), dim=1),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (2, 3)), dim=0),
        Sample(_rand(rng, 4, 5, 3), rng.integers(0, 5, (2, 4, 2)), dim=-2),
        Sample(_rand(rng, 5), rng.integers(0, 5, (3,)).astype(np.int32), dim=0),
        Sample(np.asarray(1.5), np.asarray(0), dim=0),
        Sample((_rand(rng, 3, 4) * 5).astype(np.int32), rng.integers(0, 3, (2, 4)), dim=0,
               grad=False),
    ],
))


def _scatter_check_reduce(reduce):
    if reduce is not None and reduce not in ("add", "multiply"):
        raise RuntimeError("reduce argument must be either add or multiply.")


def _scatter_meta(x, index, src, dim, reduce=None):
    if src.dtype is not x.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    _dim_check("scatter", x, index, dim, src=src)
    _scatter_check_reduce(reduce)
    return x


def _scatter_value_meta(x, index, dim, value, reduce=None):
    _dim_check("scatter", x, index, dim)
    _scatter_check_reduce(reduce)
    return x


def _scatter_kernel(ctx, x, index, src, dim, reduce=None):
    return _scatter_common(ctx, x, index, src, dim, reduce, None)


def _scatter_value_kernel(ctx, x, index, dim, value, reduce=None):
    return _scatter_common(ctx, x, index, None, dim, reduce, value)


def _scatter_common(ctx, x, index, src, dim, reduce, value):
    xm, im = ctx.in_metas[0], ctx.in_metas[1]
    d = normalize_dim("scatter", dim, xm.ndim)
    out = ctx.prims.contiguous(x)
    target = _as_1d(ctx, out, xm)
    i1 = _as_1d(ctx, index, im)
    if src is None:
        s1 = ctx.prims.full(tuple(i1.shape), xm.dtype, value)
    else:
        s1 = _as_1d(ctx, src, ctx.in_metas[2])
    ctx.prims.scatter(target, d, i1, s1, reduce)
    return out


def _scatter_src_grad(ctx, g, dim):
    """grad of src: gather g at the index, zero beyond the index's extent."""
    index = ctx.input(1)
    gs = op("gather", g, index, dim=dim)
    sm, im = ctx.in_metas[2], ctx.in_metas[1]
    if tuple(gs.shape) != sm.shape:
        key = tuple(("slice", 0, n, 1) for n in im.shape)
        gs = op("slice_grad", gs, key=key, shape=sm.shape)
    return gs


def _scatter_grad(ctx, g):
    dim, reduce = ctx.attrs["dim"], ctx.attrs["reduce"]
    if reduce is not None:
        raise RuntimeError("derivative for aten::scatter is not implemented")
    gx = gs = None
    if ctx.needs_input_grad[0]:
        gx = op("scatter_value", g, ctx.input(1), dim=dim, value=0)
    if ctx.needs_input_grad[2]:
        gs = _scatter_src_grad(ctx, g, dim)
    return gx, None, gs


def _scatter_split_sigs(x, index, dim, extra):
    """(S(i), S(i), ...) -> S(i) for axes off `dim` where every operand has the same extent."""
    d = normalize_dim("scatter", dim, x.ndim)
    sigs = []
    for i in range(x.ndim if index.ndim else 0):
        if i == d or x.shape[i] <= 1:
            continue
        if index.shape[i] == x.shape[i] and all(m.shape[i] == x.shape[i] for m in extra):
            sigs.append(Signature((Split(i),) * (2 + len(extra)), (Split(i),)))
    return sigs


def _scatter_sbp(x, index, src, dim, reduce=None):
    sigs = [Signature((B, B, B), (B,))]
    if reduce == "multiply":
        sigs.append(Signature((P, B, B), (P,)))  # scaling positions is linear in the source
    else:
        # (P, B, P) -> P: overwriting (or adding) values is linear in (source, src) jointly
        sigs.append(Signature((P, B, P), (P,)))
    if src.ndim == index.ndim:
        sigs += _scatter_split_sigs(x, index, dim, [src])  # rows are independent off dim
    return sigs


def _scatter_value_sbp(x, index, dim, value, reduce=None):
    sigs = [Signature((B, B), (B,))]
    if reduce == "multiply" or value == 0:
        sigs.append(Signature((P, B), (P,)))  # writing zeros or scaling is linear in source
    return sigs + _scatter_split_sigs(x, index, dim, [])  # rows are independent off dim


def _scatter_samples(rng):
    return [
        Sample(_rand(rng, 3, 5), _perm_index(rng, (3, 2), 1, 5), _rand(rng, 3, 2), dim=1),
        Sample(_rand(rng, 4, 3), _perm_index(rng, (2, 3), 0, 4), _rand(rng, 2, 3), dim=0),
        Sample(_rand(rng, 4, 3), _perm_index(rng, (4, 2), 0, 4), _rand(rng, 4, 2), dim=-2),
        # torch cannot differentiate a src larger than the index (its grad has the index's
        # shape); tests/framework/test_indexing.py checks ours by finite differences
        Sample(_rand(rng, 3, 5), _perm_index(rng, (3, 2), 1, 5), _rand(rng, 3, 4), dim=1,
               grad=False),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (3, 3)), _rand(rng, 3, 3), dim=0,
               reduce="add", grad=False),
        Sample(_rand(rng, 3, 4), rng.integers(0, 4, (3, 3)), _rand(rng, 3, 3), dim=1,
               reduce="multiply", grad=False),
        Sample(np.asarray(1.0), np.asarray(0), np.asarray(3.0), dim=0),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int64),
               _perm_index(rng, (3, 2), 1, 4).astype(np.int32),
               (_rand(rng, 3, 2) * 4).astype(np.int64), dim=1, grad=False),
    ]


def _scatter_reference(torch, x, index, src, dim, reduce=None):
    if reduce is None:
        return torch.scatter(x, dim, index, src)
    return torch.scatter(x, dim, index, src, reduce=reduce)


register(OpDef(
    "scatter",
    inputs=("input", "index", "src"),
    attrs={"dim": Attr("int"), "reduce": Attr("str", None)},
    infer_meta=_scatter_meta,
    kernel=_scatter_kernel,
    saves=("index",),
    grad=_scatter_grad,
    sbp=_scatter_sbp,
    reference=_scatter_reference,
    samples=_scatter_samples,
))


def _scatter_value_grad(ctx, g):
    if ctx.attrs["reduce"] is not None:
        raise RuntimeError("derivative for aten::scatter is not implemented")
    if not ctx.needs_input_grad[0]:
        return None, None
    return op("scatter_value", g, ctx.input(1), dim=ctx.attrs["dim"], value=0), None


def _scatter_value_reference(torch, x, index, dim, value, reduce=None):
    if reduce is None:
        return torch.scatter(x, dim, index, value)
    return torch.scatter(x, dim, index, value, reduce=reduce)


register(OpDef(
    "scatter_value",
    inputs=("input", "index"),
    attrs={"dim": Attr("int"), "value": Attr("scalar"), "reduce": Attr("str", None)},
    infer_meta=_scatter_value_meta,
    kernel=_scatter_value_kernel,
    saves=("index for input",),
    grad=_scatter_value_grad,
    sbp=_scatter_value_sbp,
    reference=_scatter_value_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 3, 5), rng.integers(0, 5, (3, 2)), dim=1, value=2.5),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (2, 3)), dim=0, value=0),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (2, 2)), dim=0, value=-1.0,
               reduce="multiply", grad=False),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int32), rng.integers(0, 4, (3, 4)), dim=1,
               value=7, reduce="add", grad=False),
    ],
    doc="scatter with a scalar value (torch's scatter.value).",
))


def _scatter_add_meta(x, index, src, dim):
    if src.dtype is not x.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    _dim_check("scatter_add", x, index, dim, src=src)
    return x


def _scatter_add_grad(ctx, g):
    gx = g if ctx.needs_input_grad[0] else None
    gs = _scatter_src_grad(ctx, g, ctx.attrs["dim"]) if ctx.needs_input_grad[2] else None
    return gx, None, gs


def _scatter_add_sbp(x, index, src, dim):
    sigs = [Signature((B, B, B), (B,)),
            Signature((P, B, P), (P,))]  # x + scatter(src) is linear in (x, src) jointly
    if src.ndim != index.ndim or not index.ndim:
        return sigs
    d = normalize_dim("scatter_add", dim, x.ndim)
    if index.shape[d] > 1 and src.shape[d] == index.shape[d]:
        # each piece adds its own (index, src) entries; the input counted once via P
        sigs.append(Signature((P, Split(d), Split(d)), (P,)))
    return sigs + _scatter_split_sigs(x, index, dim, [src])  # rows independent off dim


register(OpDef(
    "scatter_add",
    inputs=("input", "index", "src"),
    attrs={"dim": Attr("int")},
    infer_meta=_scatter_add_meta,
    kernel=lambda ctx, x, index, src, dim: _scatter_common(ctx, x, index, src, dim, "add",
                                                           None),
    saves=("index",),
    grad=_scatter_add_grad,
    # (P, B, P) -> P: x + scatter(src) is linear in (x, src) jointly; rows independent off dim
    sbp=_scatter_add_sbp,
    reference=lambda torch, x, index, src, dim: torch.scatter_add(x, dim, index, src),
    samples=lambda rng: [
        Sample(_rand(rng, 3, 5), rng.integers(0, 5, (3, 4)), _rand(rng, 3, 4), dim=1),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (6, 3)), _rand(rng, 6, 3), dim=0),
        Sample(_rand(rng, 4, 3), rng.integers(0, 4, (6, 2)), _rand(rng, 7, 3), dim=0,
               grad=False),
        Sample(_rand(rng, 2, 4, 3), rng.integers(0, 3, (2, 4, 2)), _rand(rng, 2, 4, 2),
               dim=-1),
        Sample(np.asarray(1.0), np.asarray(0), np.asarray(3.0), dim=0),
        Sample((_rand(rng, 5) * 4).astype(np.int64), rng.integers(0, 5, (8,)),
               (_rand(rng, 8) * 4).astype(np.int64), dim=0, grad=False),
    ],
))


# -- index_select / index_add ----------------------------------------------------------------
def _vector_index(name, index, what="index_select(): Index is supposed to be a vector"):
    if index.dtype not in _INDEX_DTYPES:
        raise op_error(name, "Expected dtype int32 or int64 for index")
    if index.ndim > 1:
        raise IndexError(what)


def _index_select_meta(x, index, dim):
    _vector_index("index_select", index)
    d = normalize_dim("index_select", dim, x.ndim)
    if x.ndim == 0:
        if index.numel != 1:
            raise IndexError("index_select(): Index to scalar can have only 1 value, got "
                             f"{index.numel} value(s)")
        return TensorMeta((), x.dtype)
    shape = list(x.shape)
    shape[d] = index.numel
    return TensorMeta(tuple(shape), x.dtype)


def _dim_key(ndim, d, arr):
    return (slice(None),) * d + (arr,)


def _index_select_kernel(ctx, x, index, dim):
    xm, im = ctx.in_metas
    i1 = _as_1d(ctx, index, im)
    if xm.ndim == 0:
        return ctx.prims.reshape(ctx.prims.index(ctx.prims.reshape(x, (1,)), (i1,)), ())
    d = normalize_dim("index_select", dim, xm.ndim)
    return ctx.prims.index(x, _dim_key(xm.ndim, d, i1))


def _index_select_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return None, None
    zeros = _zeros(ctx.in_metas[0].shape, g)
    return op("index_add", zeros, ctx.input(1), g, dim=ctx.attrs["dim"]), None


def _index_select_sbp(x, index, dim):
    d = normalize_dim("index_select", dim, x.ndim)
    sigs = [Signature((B, B), (B,)),
            Signature((P, B), (P,))]  # (P, B) -> P: selecting rows is linear
    for i in range(x.ndim):
        if i != d and x.shape[i] > 1:
            sigs.append(Signature((Split(i), B), (Split(i),)))  # other axes keep their split
    if x.ndim and index.ndim == 1 and index.shape[0] > 1:
        sigs.append(Signature((B, Split(0)), (Split(d),)))  # each piece selects its own rows
    return sigs


register(OpDef(
    "index_select",
    inputs=("input", "index"),
    attrs={"dim": Attr("int")},
    infer_meta=_index_select_meta,
    kernel=_index_select_kernel,
    saves=("index for input",),
    grad=_index_select_grad,
    sbp=_index_select_sbp,
    reference=lambda torch, x, index, dim: torch.index_select(x, dim, index),
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3), np.asarray([3, 0, 3, 1]), dim=0),
        Sample(_rand(rng, 2, 5, 3), np.asarray([4, 1], np.int32), dim=-2),
        Sample(_rand(rng, 3, 4), np.asarray(2), dim=1),
        Sample(np.asarray(2.0), np.asarray([0]), dim=0),
        Sample(_rand(rng, 3, 4), np.zeros((0,), np.int64), dim=1),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int32), np.asarray([1, 1]), dim=0,
               grad=False),
    ],
))


def _index_add_meta(x, index, source, dim, alpha=1):
    if index.dtype not in _INDEX_DTYPES:
        raise RuntimeError(
            f"index_add_(): Expected dtype int32/int64 for index but got: "
            f"{_torch_name(index.dtype)}")
    if index.ndim > 1:
        raise IndexError(
            f"index_add_(): Index is supposed to be a vector, but got dim: {index.ndim} with "
            f"type: {_torch_name(index.dtype)} and size: {list(index.shape)}")
    d = normalize_dim("index_add", dim, x.ndim)
    if source.dtype is not x.dtype:
        raise RuntimeError(
            f"index_add_(): self ({_torch_name(x.dtype)}) and source "
            f"({_torch_name(source.dtype)}) must have the same scalar type")
    bad = source.ndim != x.ndim or any(
        i != d and source.shape[i] != x.shape[i] for i in range(x.ndim))
    if x.ndim == 0:
        bad = source.ndim != 0
    if bad:
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified "
            f"dimension. Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}")
    n_src = source.shape[d] if source.ndim else 1
    if index.numel != n_src:
        raise RuntimeError(
            f"index_add_(): Number of indices ({index.numel}) should be equal to "
            f"source.size(dim): ({n_src}), for dim: {d}")
    if isinstance(alpha, float) and not x.dtype.is_floating_point:
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating "
                           "point number.")
    return x


def _index_add_kernel(ctx, x, index, source, dim, alpha=1):
    xm, im, sm = ctx.in_metas
    out = ctx.prims.contiguous(x)
    if alpha != 1:
        source = ctx.prims.binary("mul", source, ctx.prims.full((), sm.dtype, alpha))
        if source.dtype != sm.dtype.np:
            source = ctx.prims.cast(source, sm.dtype)
    i1 = _as_1d(ctx, index, im)
    if xm.ndim == 0:
        ctx.prims.index_put(ctx.prims.reshape(out, (1,)), (i1,),
                            ctx.prims.reshape(source, (1,)), True)
        return out
    d = normalize_dim("index_add", dim, xm.ndim)
    return ctx.prims.index_put(out, _dim_key(xm.ndim, d, i1), source, True)


def _index_add_grad(ctx, g):
    gx = g if ctx.needs_input_grad[0] else None
    gs = None
    if ctx.needs_input_grad[2]:
        gs = op("index_select", g, ctx.input(1), dim=ctx.attrs["dim"])
        if ctx.in_metas[2].ndim == 0:
            gs = op("reshape", gs, shape=())
        if ctx.attrs["alpha"] != 1:
            gs = op("mul_scalar", gs, other=ctx.attrs["alpha"])
    return gx, None, gs


def _index_add_sbp(x, index, source, dim, alpha=1):
    d = normalize_dim("index_add", dim, x.ndim)
    sigs = [Signature((B, B, B), (B,)),
            Signature((P, B, P), (P,))]  # x + alpha * scatter(src) is linear in (x, src)
    for i in range(x.ndim):
        if i != d and x.shape[i] > 1:
            sigs.append(Signature((Split(i), B, Split(i)), (Split(i),)))  # slabs independent
    if x.ndim and index.ndim == 1 and index.shape[0] > 1:
        # each piece adds its own (index, source) rows; the input counted once via P
        sigs.append(Signature((P, Split(0), Split(d)), (P,)))
    return sigs


register(OpDef(
    "index_add",
    inputs=("input", "index", "source"),
    attrs={"dim": Attr("int"), "alpha": Attr("scalar", 1)},
    infer_meta=_index_add_meta,
    kernel=_index_add_kernel,
    saves=("index for source",),
    grad=_index_add_grad,
    sbp=_index_add_sbp,
    reference=lambda torch, x, index, source, dim, alpha=1: torch.index_add(
        x, dim, index, source, alpha=alpha),
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3), np.asarray([3, 0, 3]), _rand(rng, 3, 3), dim=0),
        Sample(_rand(rng, 2, 5, 3), np.asarray([4, 1], np.int32), _rand(rng, 2, 2, 3), dim=1,
               alpha=-2.5),
        Sample(np.asarray(2.0), np.asarray([0]), np.asarray(1.5), dim=0),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int64), np.asarray([1, 1]),
               (_rand(rng, 3, 2) * 4).astype(np.int64), dim=1, alpha=3, grad=False),
    ],
))


# -- masked_fill -----------------------------------------------------------------------------
_C_TYPE_NAMES = {
    "float32": "float", "float64": "double", "float16": "c10::Half",
    "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int", "int16": "short int",
    "int8": "signed char", "uint8": "unsigned char", "bool": "bool",
}


def _mask_check(mask):
    if mask.dtype is not dt.bool_:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                           + _C_TYPE_NAMES[mask.dtype.name])


def _masked_fill_meta(x, mask, value):
    _mask_check(mask)
    return TensorMeta(broadcast_shapes("masked_fill", x.shape, mask.shape), x.dtype)


def _masked_fill_kernel(ctx, x, mask, value):
    dtype = ctx.out_metas[0].dtype
    return ctx.prims.where(mask, ctx.prims.full((), dtype, value), x)


def _masked_fill_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return (None,) * len(ctx.in_metas)
    mask = ctx.input(1)
    gx = unbroadcast(op("masked_fill", g, mask, value=0), ctx.in_metas[0])
    return (gx,) + (None,) * (len(ctx.in_metas) - 1)


def _masked_fill_sbp(x, mask, value):
    out = _masked_fill_meta(x, mask, value).shape
    # (P, B) -> P only when zeros are written: filling is affine in the source otherwise.
    return elementwise_signatures([x.shape, mask.shape], out,
                                  partial=[("P", "B")] if value == 0 else [])


def _bool(rng, *shape):
    return rng.random(shape) < 0.5


register(OpDef(
    "masked_fill",
    inputs=("input", "mask"),
    attrs={"value": Attr("scalar")},
    infer_meta=_masked_fill_meta,
    kernel=_masked_fill_kernel,
    saves=("mask for input",),
    grad=_masked_fill_grad,
    sbp=_masked_fill_sbp,
    reference=lambda torch, x, mask, value: torch.masked_fill(x, mask, value),
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _bool(rng, 3, 4), value=2.5),
        Sample(_rand(rng, 3, 4), _bool(rng, 4), value=0),
        Sample(_rand(rng, 4), _bool(rng, 2, 4), value=-1.0),
        Sample(np.asarray(1.5), np.asarray(True), value=3),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int64), _bool(rng, 3, 1), value=1.7,
               grad=False),
        Sample(_bool(rng, 5), _bool(rng, 5), value=True, grad=False),
    ],
    doc="out = where(mask, value, input) with a Python-number value (broadcasting).",
))


def _masked_fill_tensor_meta(x, mask, value):
    _mask_check(mask)
    if value.ndim != 0:
        raise RuntimeError("masked_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {value.ndim} dimension(s).")
    return TensorMeta(broadcast_shapes("masked_fill", x.shape, mask.shape), x.dtype)


def _masked_fill_tensor_kernel(ctx, x, mask, value):
    dtype = ctx.out_metas[0].dtype
    if ctx.in_metas[2].dtype is not dtype:
        value = ctx.prims.cast(value, dtype)
    return ctx.prims.where(mask, value, x)


def _masked_fill_tensor_grad(ctx, g):
    gx, _, _ = _masked_fill_grad(ctx, g)
    gv = None
    if ctx.needs_input_grad[2]:
        mask = ctx.input(1)
        kept = op("sum", op("masked_fill", g, mask, value=0))
        gv = unbroadcast(op("sub", op("sum", g), kept), ctx.in_metas[2])
    return gx, None, gv


register(OpDef(
    "masked_fill_tensor",
    inputs=("input", "mask", "value"),
    infer_meta=_masked_fill_tensor_meta,
    kernel=_masked_fill_tensor_kernel,
    saves=("mask for input,value",),
    grad=_masked_fill_tensor_grad,
    # (P, B, P) -> P: where(mask, v, x) is linear in (x, v) jointly, unless casting v to
    # x's dtype is not additive (a float value truncated into an integer tensor).
    sbp=lambda x, mask, value: elementwise_signatures(
        [x.shape, mask.shape, value.shape],
        _masked_fill_tensor_meta(x, mask, value).shape,
        partial=[("P", "B", "P")] if x.dtype.is_floating_point or dt.bool_ not in (
            x.dtype, value.dtype) and not value.dtype.is_floating_point else []),
    reference="masked_fill",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _bool(rng, 3, 4), np.asarray(2.5)),
        Sample(_rand(rng, 4), _bool(rng, 2, 4), np.asarray(-1.0)),
        Sample(_rand(rng, 3, 4).astype(np.float32), _bool(rng, 4),
               np.asarray(0.5, dtype=np.float32)),
        Sample((_rand(rng, 3, 4) * 4).astype(np.int64), _bool(rng, 3, 1), np.asarray(1.7),
               grad=False),
    ],
    doc="masked_fill with a 0-dim tensor value (differentiable in the value).",
))


# -- scatter_reduce --------------------------------------------------------------------------
_SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
_SCATTER_PRIM = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "amax",
                 "amin": "amin"}


def _scatter_reduce_meta(x, index, src, dim, reduce, include_self=True):
    if reduce not in _SCATTER_REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    if src.dtype is not x.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    _dim_check("scatter_reduce", x, index, dim, src=src)
    return x


def _reduce_identity(reduce, dtype):
    """The value a position starts from when include_self=False."""
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    kind = np.dtype(dtype.np).kind
    if kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    if kind == "b":
        return reduce != "amax"
    info = np.iinfo(dtype.np)
    return info.min if reduce == "amax" else info.max


def _scatter_reduce_kernel(ctx, x, index, src, dim, reduce, include_self=True):
    xm, im, sm = ctx.in_metas
    prims, dtype = ctx.prims, xm.dtype
    d = normalize_dim("scatter_reduce", dim, xm.ndim)
    out = prims.contiguous(x)
    target, i1, s1 = _as_1d(ctx, out, xm), _as_1d(ctx, index, im), _as_1d(ctx, src, sm)
    if not include_self:  # scattered positions forget their own value first
        prims.scatter(target, d, i1, prims.full(tuple(i1.shape), dtype,
                                                _reduce_identity(reduce, dtype)), None)
    prims.scatter(target, d, i1, s1, _SCATTER_PRIM[reduce])
    if reduce == "mean":
        count = prims.full(tuple(target.shape), dtype, 1 if include_self else 0)
        prims.scatter(count, d, i1, prims.full(tuple(i1.shape), dtype, 1), "add")
        count = prims.binary("maximum", count, prims.full((), dtype, 1))
        quotient = "div" if dtype.is_floating_point else "floor_divide"
        target = prims.cast(prims.binary(quotient, target, count), dtype)
    return prims.reshape(target, ()) if xm.ndim == 0 else target


def _scatter_reduce_grad(ctx, g):
    dim, reduce, include_self = (ctx.attrs["dim"], ctx.attrs["reduce"],
                                 ctx.attrs["include_self"])
    need_x, need_src = ctx.needs_input_grad[0], ctx.needs_input_grad[2]
    if not (need_x or need_src):
        return None, None, None
    index = ctx.input(1)
    im, sm = ctx.in_metas[1], ctx.in_metas[2]
    x, src, result = ctx.input(0), ctx.input(2), ctx.output(0)
    if tuple(im.shape) != tuple(sm.shape):  # only the index's extent of src takes part
        src = op("slice", src, key=tuple(("slice", 0, n, 1) for n in im.shape))
    def gather(t):  # the op itself: the functional form checks index values on the host
        return op("gather", t, index, dim=dim)

    if reduce == "sum":
        gx, gs = g, gather(g)
    elif reduce == "mean":
        count = op("full", shape=tuple(g.shape), fill_value=1 if include_self else 0,
                   dtype=g.dtype, _device=g._where())
        ones = op("full", shape=tuple(index.shape), fill_value=1, dtype=g.dtype,
                  _device=g._where())
        count = op("scatter_add", count, index, ones, dim=dim).clamp(min=1)
        gx = g / count
        gs = gather(gx)
    elif reduce in ("amax", "amin"):
        # ties share the gradient evenly, as torch does
        value = gather(result)
        self_is = (x == result).to(g.dtype)
        src_is = (src == value).to(g.dtype)
        share = g / op("scatter_add", self_is, index, src_is, dim=dim)
        gx = self_is * share
        gs = src_is * gather(share)
    else:  # prod: products of the other factors, exact where one factor is zero
        masked_x = x.masked_fill(x == 0, 1)
        masked_result = op("scatter_reduce", masked_x, index, src, dim=dim, reduce="prod",
                           include_self=include_self)
        gx = g * masked_result / masked_x
        src_zero = src == 0
        zeros = op("full", shape=tuple(x.shape), fill_value=0, dtype=g.dtype,
                   _device=g._where())
        n_zero = gather(op("scatter_add", zeros, index, src_zero.to(g.dtype), dim=dim))
        single_zero = src_zero.logical_and(n_zero == 1)
        masked_src_result = op("scatter_reduce", x, index, src.masked_fill(single_zero, 1),
                               dim=dim, reduce="prod", include_self=include_self)
        gs = op("where", single_zero, gather(g * masked_src_result),
                gather(g * result) / src.masked_fill(src_zero, 1))
    if not include_self:  # the scattered positions' own values were dropped
        gx = op("scatter_value", gx, index, dim=dim, value=0)
    if need_src and tuple(im.shape) != tuple(sm.shape):
        gs = op("slice_grad", gs, key=tuple(("slice", 0, n, 1) for n in im.shape),
                shape=sm.shape)
    return (gx if need_x else None), None, (gs if need_src else None)


def _scatter_reduce_sbp(x, index, src, dim, reduce, include_self=True):
    sigs = [Signature((B, B, B), (B,))]
    if reduce in ("sum", "mean") and x.dtype.is_floating_point:
        # the result is linear in (x, src) jointly: the counts depend on the index only
        sigs.append(Signature((P, B, P), (P,)))
    if (reduce == "sum" and include_self and x.dtype.is_floating_point and index.ndim
            and src.ndim == index.ndim):
        d = normalize_dim("scatter_reduce", dim, x.ndim)
        if index.shape[d] > 1 and src.shape[d] == index.shape[d]:
            # each piece adds its own (index, src) entries; the input counted once via P
            sigs.append(Signature((P, Split(d), Split(d)), (P,)))
    return sigs + _scatter_split_sigs(x, index, dim, [src])  # rows independent off dim


def _scatter_reduce_reference(torch, x, index, src, dim, reduce, include_self=True):
    return torch.scatter_reduce(x, dim, index, src, reduce, include_self=include_self)


def _scatter_reduce_samples(rng):
    out = []
    for reduce in _SCATTER_REDUCTIONS:
        for include_self in (True, False):
            out.append(Sample(_rand(rng, 4, 3), rng.integers(0, 4, (5, 3)), _rand(rng, 5, 3),
                              dim=0, reduce=reduce, include_self=include_self))
    return out + [
        # a src larger than the index: torch has no gradient for that case
        Sample(_rand(rng, 2, 5), rng.integers(0, 5, (2, 3)), _rand(rng, 2, 4), dim=-1,
               reduce="mean", include_self=False, grad=False),
        Sample(_rand(rng, 2, 5), rng.integers(0, 5, (2, 3)), _rand(rng, 2, 3), dim=-1,
               reduce="mean", include_self=False),
        Sample(_rand(rng, 3, 4), rng.integers(0, 3, (2, 4)), _rand(rng, 2, 4), dim=0,
               reduce="amax"),
        Sample(np.asarray(1.5), np.asarray(0), np.asarray(-2.0), dim=0, reduce="prod"),
        Sample((_rand(rng, 4, 3) * 4).astype(np.int64), rng.integers(0, 4, (5, 3)),
               (_rand(rng, 5, 3) * 4).astype(np.int64), dim=0, reduce="mean",
               include_self=False, grad=False),
        Sample((_rand(rng, 4, 3) * 4).astype(np.int32), rng.integers(0, 4, (5, 3)),
               (_rand(rng, 5, 3) * 4).astype(np.int32), dim=0, reduce="amin",
               include_self=False, grad=False),
    ]


register(OpDef(
    "scatter_reduce",
    inputs=("input", "index", "src"),
    attrs={"dim": Attr("int"), "reduce": Attr("str"), "include_self": Attr("bool", True)},
    infer_meta=_scatter_reduce_meta,
    kernel=_scatter_reduce_kernel,
    saves=("input", "index", "src", "out"),
    grad=_scatter_reduce_grad,
    sbp=_scatter_reduce_sbp,
    reference=_scatter_reduce_reference,
    samples=_scatter_reduce_samples,
    doc="torch.scatter_reduce (two-argument reduce: sum, prod, mean, amax, amin).",
))
