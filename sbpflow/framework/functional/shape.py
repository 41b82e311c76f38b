"""Shape and view functions: views, splits, joins, flips, padding, repetition.

View functions return tensors sharing memory with their input, as torch's do.  Where torch
returns "a view if possible, else a copy" (reshape, flatten), `compute_stride` decides from the
input's strides, with torch's own algorithm.
"""

from __future__ import annotations

import operator

import numpy as np

from ..._core.errors import normalize_dim
from ...ops.shape import flatten_dims, flatten_shape, infer_size, view_dtype_error
from ..tensor import Tensor
from ._base import call, inplace_method, shape_args


def compute_stride(oldshape, oldstride, newshape):
    """The strides a view of shape `newshape` would need, or None when no view exists.

    torch's `computeStride`: walk the old axes from the last, grouping runs of axes that are
    contiguous with each other ("chunks"); every new axis must fall inside one chunk.
    """
    oldshape, oldstride, newshape = tuple(oldshape), tuple(oldstride), tuple(newshape)
    if not oldshape:
        return (1,) * len(newshape)
    numel = 1
    for s in oldshape:
        numel *= s
    if numel == 0:
        if oldshape == newshape:
            return oldstride
        out, acc = [], 1  # any strides work for an empty tensor: take contiguous ones
        for s in reversed(newshape):
            out.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(out))
    newstride = [0] * len(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[tensor_d]
        # a chunk ends where the next-outer axis is not laid out right after this run
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1
                             and oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(newstride)


def _viewable(t: Tensor, shape) -> bool:
    """Can `shape` be a view of t's memory?  (From strides, as torch decides.)"""
    if t._gl is not None:
        # A global tensor's stride() is the logical contiguous one, not its piece's: only a
        # contiguous piece is sure to take any view of the piece's shape.
        return t.is_contiguous()
    return compute_stride(t._meta.shape, t.stride(), shape) is not None


def _int(x, what="index"):
    """An int from an int or a one-element integer tensor (torch accepts both)."""
    if isinstance(x, Tensor):
        return x.__index__()
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"argument '{what}' must be int, not {type(x).__name__}") from None


# -- view / reshape ----------------------------------------------------------------------------
def view(input: Tensor, *shape):
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list)) and not isinstance(
        shape[0], int
    ):
        from ..._core.dtype import DType

        if not isinstance(shape[0], DType):  # torch takes a dtype object, never a string
            got = type(shape[0]).__name__
            raise TypeError(
                f"view() received an invalid combination of arguments - got ({got}), but "
                "expected one of:\n * (sbpflow.dtype dtype)\n * (tuple of ints size)\n")
        return _view_dtype(input, shape[0])
    return call("view", input, shape=shape_args("view", shape))


def _view_dtype(input: Tensor, dtype):
    """Tensor.view(dtype): the same bytes as another dtype, with torch's layout checks (made
    here, where strides and the storage offset are known, in torch's order)."""
    old, new = input.dtype.itemsize, dtype.itemsize
    if old != new and input.ndim:
        strides = input.stride()
        if old < new:
            r = new // old
            if input.shape[-1] % r:
                raise view_dtype_error(input.dtype, dtype,
                                       f"self.size(-1) must be divisible by {r}", input.shape[-1])
            if input.storage_offset() % r:
                raise view_dtype_error(input.dtype, dtype,
                                       f"self.storage_offset() must be divisible by {r}",
                                       input.storage_offset())
        if strides[-1] != 1:
            raise view_dtype_error(input.dtype, dtype, "self.stride(-1) must be 1", strides[-1])
        if old < new:
            for i, st in enumerate(strides[:-1]):
                if st % r:
                    raise view_dtype_error(input.dtype, dtype,
                                           f"self.stride({i}) must be divisible by {r}", st)
    return call("view_dtype", input, dtype=dtype)


def reshape(input: Tensor, *shape):
    shape = infer_size("reshape", shape_args("reshape", shape), input.numel())
    if shape == input._meta.shape or _viewable(input, shape):
        return call("view", input, shape=shape)
    return call("reshape", input, shape=shape)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1):
    s, e = flatten_dims(input.ndim, start_dim, end_dim)
    if input.ndim and s == e:
        return input  # torch returns the tensor itself
    if _viewable(input, flatten_shape(input._meta.shape, s, e)):
        return call("flatten", input, start_dim=s, end_dim=e)
    return call("reshape", input, shape=flatten_shape(input._meta.shape, s, e))


def ravel(input: Tensor):
    return reshape(input, -1)


def unflatten(input: Tensor, dim: int, sizes):
    return call("unflatten", input, dim=dim, sizes=shape_args("unflatten", (sizes,)))


def expand(input: Tensor, *size):
    return call("expand", input, size=shape_args("expand", size))


def expand_as(input: Tensor, other: Tensor):
    return call("expand", input, size=tuple(other.shape))


def permute(input: Tensor, *dims):
    return call("permute", input, dims=shape_args("permute", dims))


def transpose(input: Tensor, dim0: int, dim1: int):
    return call("transpose", input, dim0=dim0, dim1=dim1)


swapaxes = swapdims = transpose


def t(input: Tensor):
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else view(input, tuple(input.shape))


def contiguous(input: Tensor, memory_format=None):
    from ..tensor import check_memory_format

    check_memory_format("contiguous", input, memory_format)
    return input if input.is_contiguous() else call("clone", input)


def squeeze(input: Tensor, dim=None):
    return call("squeeze", input, dim=dim)


def unsqueeze(input: Tensor, dim: int):
    return call("unsqueeze", input, dim=dim)


def movedim(input: Tensor, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should "
            f"contain the same number of dims as destination ({list(dst)} dims)")
    n = input.ndim
    src_n = [normalize_dim("movedim", d, n, "source") for d in src]
    dst_n = [normalize_dim("movedim", d, n, "destination") for d in dst]
    for name, dims, given in (("source", src_n, src), ("destination", dst_n, dst)):
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"movedim: repeated dim in `{name}` ({list(given)})")
    order = [None] * n
    for s, d in zip(src_n, dst_n, strict=True):
        order[d] = s
    rest = iter(i for i in range(n) if i not in src_n)
    perm = tuple(o if o is not None else next(rest) for o in order)
    return call("permute", input, dims=perm)


moveaxis = movedim


def narrow(input: Tensor, dim: int, start, length: int):
    return call("narrow", input, dim=dim, start=_int(start, "start"),
                length=_int(length, "length"))


def select(input: Tensor, dim: int, index):
    return call("select", input, dim=dim, index=_int(index))


def _diagonal_viewable(input: Tensor, dim1: int, dim2: int) -> bool:
    """Can the two axes merge into one (in either order), so the diagonal is a slice?"""
    st, shape = input.stride(), input._meta.shape
    d1 = normalize_dim("diagonal", dim1, input.ndim, "dim1")
    d2 = normalize_dim("diagonal", dim2, input.ndim, "dim2")
    return any(
        compute_stride((shape[a], shape[b]), (st[a], st[b]), (shape[a] * shape[b],)) is not None
        for a, b in ((d1, d2), (d2, d1)))


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """A view when the two axes can merge into one (matrices, batches of matrices, their
    transposes); otherwise a copy, since the primitives have no general strided view."""
    if input.ndim >= 2 and _diagonal_viewable(input, dim1, dim2):
        return call("diagonal", input, offset=offset, dim1=dim1, dim2=dim2)
    return call("diagonal_copy", input, offset=offset, dim1=dim1, dim2=dim2)


def diagonal_copy(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1):
    return call("diagonal_copy", input, offset=offset, dim1=dim1, dim2=dim2)


# -- splitting (views through narrow / select) -------------------------------------------------
def _split_dim(op: str, input: Tensor, dim: int) -> int:
    if input.ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return normalize_dim(op, dim, input.ndim)


def _pieces(input: Tensor, d: int, sizes) -> tuple:
    out, start = [], 0
    for n in sizes:
        out.append(call("narrow", input, dim=d, start=start, length=n))
        start += n
    return tuple(out)


def split(tensor: Tensor, split_size_or_sections, dim: int = 0):
    d = _split_dim("split", tensor, dim)
    n = tensor.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [_int(s, "split_sizes") for s in split_size_or_sections]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise RuntimeError(
                f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's "
                f"size at dimension {d}), but got split_sizes={sizes}")
        return _pieces(tensor, d, sizes)
    size = _int(split_size_or_sections, "split_size")
    if size < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got "
                           f"split_size={size}")
    if size == 0 and n != 0:
        raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got "
                           f"dimension size of {n}")
    count = max(-(-n // size), 1) if size else 1
    sizes = [size] * (count - 1) + [n - size * (count - 1)]
    return _pieces(tensor, d, sizes)


def chunk(input: Tensor, chunks: int, dim: int = 0):
    chunks = _int(chunks, "chunks")
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = _split_dim("chunk", input, dim)
    n = input.shape[d]
    size = -(-n // chunks)
    if size == 0:  # an empty axis gives `chunks` empty pieces
        return _pieces(input, d, [0] * chunks)
    return split(input, size, d)


def tensor_split(input: Tensor, indices_or_sections, dim: int = 0):
    d = _split_dim("tensor_split", input, dim)
    n = input.shape[d]
    spec = indices_or_sections
    if isinstance(spec, Tensor):
        if spec.dtype.is_floating_point or spec.ndim > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a "
                               "zero-dimensional or one-dimensional tensor of integer dtype")
        spec = spec.item() if spec.ndim == 0 else [int(v) for v in spec.tolist()]
    if isinstance(spec, (list, tuple)):
        bounds, prev = [], 0
        for idx in list(spec) + [None]:
            lo, hi, _ = slice(prev, idx).indices(n)
            bounds.append((lo, max(hi - lo, 0)))
            prev = idx
        return tuple(call("narrow", input, dim=d, start=lo, length=k) for lo, k in bounds)
    sections = _int(spec, "sections")
    if sections <= 0:
        raise RuntimeError(f"number of sections must be larger than 0, got {sections}")
    q, r = divmod(n, sections)
    return _pieces(input, d, [q + (i < r) for i in range(sections)])


def unbind(input: Tensor, dim: int = 0):
    d = _split_dim("unbind", input, dim)
    return tuple(call("select", input, dim=d, index=i) for i in range(input.shape[d]))


# -- joining -----------------------------------------------------------------------------------
def _tensor_list(op: str, tensors):
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): argument 'tensors' (position 1) must be tuple of Tensors, "
                        f"not {type(tensors).__name__}")
    for i, t_ in enumerate(tensors):
        if not isinstance(t_, Tensor):
            raise TypeError(f"{op}(): argument 'tensors' (position 1) must be tuple of "
                            f"Tensors, but found element of type {type(t_).__name__} at pos {i}")
    return tuple(tensors)


def cat(tensors, dim: int = 0):
    return call("cat", _tensor_list("cat", tensors), dim=dim)


concat = concatenate = cat


def stack(tensors, dim: int = 0):
    return call("stack", _tensor_list("stack", tensors), dim=dim)


# -- flips, rolls, triangles, padding, repetition ------------------------------------------
def flip(input: Tensor, dims):
    if not isinstance(dims, (list, tuple)):
        raise TypeError(f"flip(): argument 'dims' (position 2) must be tuple of ints, not "
                        f"{type(dims).__name__}")
    return call("flip", input, dims=tuple(dims))


def _flip_method(self: Tensor, *dims, **kwargs):
    if "dims" in kwargs:
        return flip(self, kwargs.pop("dims"), **kwargs)
    return flip(self, shape_args("flip", dims))


def fliplr(input: Tensor):
    if input.ndim < 2:
        raise RuntimeError("Input must be >= 2-d.")
    return call("flip", input, dims=(1,))


def flipud(input: Tensor):
    if input.ndim < 1:
        raise RuntimeError("Input must be >= 1-d.")
    return call("flip", input, dims=(0,))


def roll(input: Tensor, shifts, dims=None):
    return call("roll", input, shifts=shifts, dims=dims)


def tril(input: Tensor, diagonal: int = 0):
    return call("tril", input, diagonal=diagonal)


def triu(input: Tensor, diagonal: int = 0):
    return call("triu", input, diagonal=diagonal)


def pad(input: Tensor, pad, mode: str = "constant", value=None):
    """torch.nn.functional.pad: `pad` lists (before, after) pairs starting from the last axis;
    negative amounts crop."""
    if not isinstance(pad, (list, tuple)):
        raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, not "
                        f"{type(pad).__name__}")
    for i, p in enumerate(pad):
        if not isinstance(p, int) or isinstance(p, bool):
            raise TypeError(f"pad(): argument 'pad' (position 2) must be tuple of ints, but "
                            f"found element of type {type(p).__name__} at pos {i}")
    return call("pad", input, pad=tuple(pad), mode=mode, value=value)


def _repeat_method(self: Tensor, *sizes):
    return call("repeat", self, repeats=shape_args("repeat", sizes))


def repeat_interleave(input: Tensor, repeats=None, dim=None, *, output_size=None):
    from .creation import tensor as _tensor

    if repeats is None:  # torch.repeat_interleave(repeats): indices repeated by count
        counts = input._host()
        if input.ndim > 1 or input.dtype.is_floating_point:
            raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
        return _tensor(np.repeat(np.arange(len(counts)), counts), device=input._where())
    if dim is None:
        input, d = reshape(input, -1), 0
    else:
        d = normalize_dim("repeat_interleave", dim, input.ndim)
    n = input.shape[d] if input.ndim else 1
    if isinstance(repeats, Tensor) and repeats.numel() != 1:
        counts = repeats._host().reshape(-1)
        if repeats.ndim != 1 or counts.shape[0] != n:
            raise RuntimeError(
                f"repeats must have the same size as input along dim, but got "
                f"repeats.size(0) = {counts.shape[0]} and input.size({d}) = {n}")
        if (counts < 0).any():
            raise RuntimeError("repeats can not be negative")
        index = _tensor(np.repeat(np.arange(n), counts), device=input._where())
        return call("index_select", input, index, dim=d)
    r = _int(repeats, "repeats")
    if r < 0:
        raise RuntimeError("repeats can not be negative")
    if input.ndim == 0:
        input, d = reshape(input, 1), 0
    wide = call("unsqueeze", input, dim=d + 1)
    size = list(wide.shape)
    size[d + 1] = r
    return flatten(call("expand", wide, size=tuple(size)), d, d + 1)


# -- broadcasting ------------------------------------------------------------------------------
def broadcast_shapes(*shapes):
    """torch.broadcast_shapes: ints or sequences of ints, broadcast as tensors would be."""
    from ..._core.errors import broadcast_shapes as _bshapes
    from ..tensor import Size

    norm = []
    for s in shapes:
        if isinstance(s, int) and not isinstance(s, bool):
            norm.append((s,))
        elif isinstance(s, (tuple, list)):
            norm.append(tuple(_int(v, "shape") for v in s))
        else:
            raise RuntimeError(f"Input shapes should be of type ints, a tuple of ints, or a list "
                               f"of ints, got {s!r}")
    for s in norm:
        if any(v < 0 for v in s):
            raise RuntimeError(f"Trying to create tensor with negative dimension {min(s)}: "
                               f"{list(s)}")
    if not norm:
        return Size(())
    try:
        return Size(_bshapes("broadcast_shapes", *norm))
    except RuntimeError:
        raise RuntimeError("Shape mismatch: objects cannot be broadcast to a single "
                           "shape") from None


def broadcast_to(input: Tensor, size):
    return expand(input, size)


def broadcast_tensors(*tensors):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    tensors = _tensor_list("broadcast_tensors", tensors)
    from ..._core.errors import broadcast_shapes as _bshapes

    shape = _bshapes("broadcast_tensors", *[x._meta.shape for x in tensors]) if tensors else ()
    return tuple(x if x._meta.shape == shape else call("expand", x, size=shape)
                 for x in tensors)


def meshgrid(*tensors, indexing=None):
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    tensors = _tensor_list("meshgrid", tensors)
    if indexing is None:
        import warnings

        warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass the "
                      "indexing argument.", UserWarning, stacklevel=2)
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but '
                           f"received: {indexing}")
    if not tensors:
        raise RuntimeError("meshgrid expects a non-empty TensorList")
    for x in tensors:
        if x.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list "
                               f"but got: {x!r}")
        if x.dtype is not tensors[0].dtype:
            raise RuntimeError("torch.meshgrid: Expected all tensors in the tensor list to have "
                               "the same dtype.")
        if x._device != tensors[0]._device:  # (a global tensor has no .device)
            raise RuntimeError("torch.meshgrid: Expected all tensors in the tensor list to have "
                               "the same device.")
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:  # the first two axes swap
        order[0], order[1] = 1, 0
    grid = [tensors[i] for i in order]
    shape = tuple(x.numel() for x in grid)
    out = []
    for i, x in enumerate(grid):
        view_shape = [1] * len(grid)
        view_shape[i] = shape[i]
        out.append(call("expand", reshape(x, tuple(view_shape)), size=shape))
    if indexing == "xy" and len(tensors) >= 2:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


# -- atleast_Nd, stacking ----------------------------------------------------------------------
def _atleast(op, tensors, fix):
    if len(tensors) == 1 and isinstance(tensors[0], Tensor):
        return fix(tensors[0])
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    return tuple(fix(x) for x in _tensor_list(op, tensors))


def _at1(x):
    return reshape(x, (1,)) if x.ndim == 0 else x


def _at2(x):
    if x.ndim == 0:
        return reshape(x, (1, 1))
    return unsqueeze(x, 0) if x.ndim == 1 else x


def _at3(x):
    if x.ndim == 0:
        return reshape(x, (1, 1, 1))
    if x.ndim == 1:
        return unsqueeze(unsqueeze(x, 0), -1)
    return unsqueeze(x, -1) if x.ndim == 2 else x


def atleast_1d(*tensors):
    return _atleast("atleast_1d", tensors, _at1)


def atleast_2d(*tensors):
    return _atleast("atleast_2d", tensors, _at2)


def atleast_3d(*tensors):
    return _atleast("atleast_3d", tensors, _at3)


def _stack_list(op, tensors):
    tensors = _tensor_list(op, tensors)
    if not tensors:
        raise RuntimeError(f"{op} expects a non-empty TensorList")
    return tensors


def hstack(tensors):
    ts = [_at1(x) for x in _stack_list("hstack", tensors)]
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors):
    return cat([_at2(x) for x in _stack_list("vstack", tensors)], 0)


row_stack = vstack


def dstack(tensors):
    return cat([_at3(x) for x in _stack_list("dstack", tensors)], 2)


def column_stack(tensors):
    ts = _stack_list("column_stack", tensors)
    return cat([reshape(x, (x.numel(), 1)) if x.ndim <= 1 else x for x in ts], 1)


def _dir_split(op, input, spec, dim, need):
    if input.ndim < need:
        raise RuntimeError(f"torch.{op} requires a tensor with at least {need} dimension"
                           f"{'s' if need > 1 else ''}, but got a tensor with {input.ndim} "
                           "dimensions!")
    if not isinstance(spec, (list, tuple, Tensor)):
        sections = _int(spec, "sections")
        n = input.shape[dim]
        if sections == 0 or n % sections:
            raise RuntimeError(f"torch.{op} attempted to split along dimension {dim}, but the "
                               f"size of the dimension {n} is not divisible by the split_size "
                               f"{sections}!")
    return tensor_split(input, spec, dim)


def hsplit(input: Tensor, indices_or_sections):
    return _dir_split("hsplit", input, indices_or_sections, 1 if input.ndim > 1 else 0, 1)


def vsplit(input: Tensor, indices_or_sections):
    return _dir_split("vsplit", input, indices_or_sections, 0, 2)


def dsplit(input: Tensor, indices_or_sections):
    return _dir_split("dsplit", input, indices_or_sections, 2, 3)


def split_with_sizes(input: Tensor, split_sizes, dim: int = 0):
    return split(input, list(split_sizes), dim)


unsafe_split = split
unsafe_chunk = chunk


def unsafe_split_with_sizes(input: Tensor, split_sizes, dim: int = 0):
    return split(input, list(split_sizes), dim)


def tile(input: Tensor, dims):
    dims = shape_args("tile", (dims,) if isinstance(dims, int) else tuple(dims))
    if len(dims) < input.ndim:
        dims = (1,) * (input.ndim - len(dims)) + dims
    return call("repeat", input, repeats=dims)


# -- diagonals and triangles -------------------------------------------------------------------
def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1):
    """Batches of diagonal matrices; the adjoint of diagonal (the `diagonal_grad` op)."""
    if input.ndim == 0:
        raise RuntimeError("diag_embed(): input must be at least 1-dimensional")
    n = input.ndim + 1
    d1 = normalize_dim("diag_embed", dim1, n, "dim1")
    d2 = normalize_dim("diag_embed", dim2, n, "dim2")
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    size = input.shape[-1] + abs(offset)
    shape = list(input.shape[:-1])
    for d in sorted((d1, d2)):
        shape.insert(d, size)
    return call("diagonal_grad", input, shape=tuple(shape), offset=offset, dim1=d1, dim2=d2)


def diag(input: Tensor, diagonal: int = 0):
    if input.ndim == 1:
        return diag_embed(input, diagonal, 0, 1)
    if input.ndim == 2:
        return call("diagonal_copy", input, offset=diagonal, dim1=0, dim2=1)
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")


def diagflat(input: Tensor, offset: int = 0):
    return diag_embed(reshape(input, -1), offset, 0, 1)


def trace(input: Tensor):
    if input.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return call("diagonal_copy", input, offset=0, dim1=0, dim2=1).sum()


def _tri_indices(op, lower, row, col, offset, dtype, device):
    from ..._core import dtype as dt
    from .creation import tensor as _tensor

    row, col, offset = _int(row, "row"), _int(col, "col"), _int(offset, "offset")
    if row < 0:
        raise RuntimeError(f"row must be non-negative, got{row}")
    if col < 0:
        raise RuntimeError(f"col must be non-negative, got{col}")
    dtype = dt.int64 if dtype is None else dt.as_dtype(dtype)
    if dtype not in (dt.int64, dt.int32):
        raise RuntimeError(f"\"{op}\" not implemented for '{dtype}'")
    rows, cols = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    return _tensor(np.stack([rows, cols]).astype(np.int64).reshape(2, -1), dtype=dtype,
                   device=device)


def tril_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    return _tri_indices("tril_indices", True, row, col, offset, dtype, device)


def triu_indices(row, col, offset=0, *, dtype=None, device=None, layout=None):
    return _tri_indices("triu_indices", False, row, col, offset, dtype, device)


def block_diag(*tensors):
    from ..._core import dtype as dt
    from .creation import zeros

    mats = []
    for i, x in enumerate(_tensor_list("block_diag", tensors)):
        if x.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer "
                               f"dimensions. Input {i} has {x.ndim} dimensions")
        mats.append(reshape(x, (1, x.numel())) if x.ndim == 1 else
                    reshape(x, (1, 1)) if x.ndim == 0 else x)
    if not mats:
        return zeros(1, 0)
    dtype = mats[0].dtype
    for m in mats[1:]:
        dtype = dt.promote_types(dtype, m.dtype)
    width = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        if m.dtype is not dtype:
            m = call("to_dtype", m, dtype=dtype)
        right = width - left - m.shape[1]
        rows.append(call("pad", m, pad=(left, right), mode="constant", value=None))
        left += m.shape[1]
    return cat(rows, 0)


def cartesian_prod(*tensors):
    tensors = _tensor_list("cartesian_prod", tensors)
    for x in tensors:
        if x.ndim != 1:
            raise RuntimeError(f"Expect a 1D vector, but got shape {list(x.shape)}")
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([reshape(g, -1) for g in grids], 1)


def _combination_indices(n: int, r: int, with_replacement: bool) -> np.ndarray:
    """All r-combinations of range(n) in lexicographic order (itertools' order), as rows;
    built one column at a time: each row is followed by every larger (or equal) value."""
    rows = np.arange(n, dtype=np.int64)[:, None]
    for _ in range(r - 1):
        first = rows[:, -1] + (0 if with_replacement else 1)  # the smallest next value
        counts = np.maximum(n - first, 0)
        starts = np.cumsum(counts) - counts
        nxt = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)
               + np.repeat(first, counts))
        rows = np.concatenate([np.repeat(rows, counts, axis=0), nxt[:, None]], axis=1)
    return rows


def combinations(input: Tensor, r: int = 2, with_replacement: bool = False):
    from ..._core import dtype as dt
    from .creation import tensor as _tensor

    if input.ndim != 1:
        raise RuntimeError(f"Expect a 1D vector, but got shape {list(input.shape)}")
    r = _int(r, "r")
    if r < 0:
        raise RuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return call("narrow", input, dim=0, start=0, length=0)
    idx = _combination_indices(input.shape[0], r, with_replacement)
    flat = _tensor(idx.reshape(-1), dtype=dt.int64, device=input._where())
    out = call("index_select", input, flat, dim=0)
    return reshape(out, (idx.shape[0], r))


def rot90(input: Tensor, k: int = 1, dims=(0, 1)):
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if input.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {input.ndim}")
    if dims[0] == dims[1] or abs(dims[0] - dims[1]) == input.ndim:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {dims[0]} "
                           f"and dim1 = {dims[1]}")
    d0 = normalize_dim("rot90", dims[0], input.ndim)
    d1 = normalize_dim("rot90", dims[1], input.ndim)
    k = _int(k, "k") % 4
    if k == 1:
        return transpose(call("flip", input, dims=(d1,)), d0, d1)
    if k == 2:
        return call("flip", input, dims=(d0, d1))
    if k == 3:
        return transpose(call("flip", input, dims=(d0,)), d0, d1)
    return call("clone", input)


def diff(input: Tensor, n: int = 1, dim: int = -1, prepend=None, append=None):
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    n = _int(n, "n")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    d = normalize_dim("diff", dim, input.ndim)
    parts = [p for p in (prepend, input, append) if p is not None]
    for p in parts:
        if not isinstance(p, Tensor):
            raise TypeError(f"diff(): argument 'prepend'/'append' must be Tensor, not "
                            f"{type(p).__name__}")
        if p.ndim != input.ndim:
            raise RuntimeError("diff expects prepend or append to be the same dimension as "
                               "input")
    x = cat(parts, d) if len(parts) > 1 else input
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        hi = call("narrow", x, dim=d, start=1, length=length - 1)
        lo = call("narrow", x, dim=d, start=0, length=length - 1)
        x = hi.logical_xor(lo) if x.dtype.name == "bool" else hi - lo
    return x


def narrow_copy(input: Tensor, dim: int, start, length: int):
    return call("clone", narrow(input, dim, start, length))


def _unfold_method(self: Tensor, dimension: int, size: int, step: int):
    """Tensor.unfold: windows of `size` every `step` along `dimension`, as a new last axis
    (a copy here: the primitives have no overlapping strided views)."""
    from ..._core import dtype as dt
    from .creation import tensor as _tensor

    size, step = _int(size, "size"), _int(step, "step")
    x = reshape(self, (1,)) if self.ndim == 0 else self
    d = normalize_dim("unfold", dimension, max(self.ndim, 1))
    n = x.shape[d]
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is "
                           f"{size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    count = (n - size) // step + 1
    idx = (np.arange(count, dtype=np.int64)[:, None] * step
           + np.arange(size, dtype=np.int64)[None, :]).reshape(-1)
    picked = call("index_select", x, _tensor(idx, dtype=dt.int64, device=x._where()), dim=d)
    out = movedim(unflatten(picked, d, (count, size)), d + 1, -1)
    return reshape(out, (size,)) if self.ndim == 0 else out


# -- in-place view ops (squeeze_, t_, ...): the tensor takes the view's layout ---------------
def _become_view(self: Tensor, view: Tensor) -> Tensor:
    from ..interpreter import check_inplace

    check_inplace("view_", self)
    if "_lazy" in view.__dict__ and "_lazy" not in self.__dict__:
        raise NotImplementedError(
            "an in-place view op (t_, squeeze_, ...) on a tensor from outside "
            "nn.Graph.build() is not supported inside it; use the out-of-place op")
    self._blob, self._meta = view._blob, view._meta
    self._strides, self._offset = view._strides, view._offset
    self._gl = view._gl
    if view._base is not None and view._base is not self:
        self._base, self._view_chain = view._base, view._view_chain
    if view._grad_fn is not None:
        self._grad_fn, self._output_nr = view._grad_fn, view._output_nr
        self._grad_fn_version = view._grad_fn_version
    lazy, mine = view.__dict__, self.__dict__
    if "_lazy" in lazy:  # inside nn.Graph.build(): the tensor now names the view's Job tensor
        mine["_lazy"], mine["_lazy_rg"] = lazy["_lazy"], lazy.get("_lazy_rg", False)
        base = lazy.get("_lazy_view")
        if base is not None and base[0] is not self:
            mine["_lazy_view"] = base
        else:
            mine.pop("_lazy_view", None)
    return self


def _inplace_view(fn):
    def method(self, *args, **kwargs):
        return _become_view(self, fn(self, *args, **kwargs))

    method.__name__ = fn.__name__ + "_"
    return method


def _resize_(self: Tensor, *sizes, memory_format=None):
    """Tensor.resize_: the same memory when the size shrinks or stays; grown tensors get a
    new contiguous buffer holding the old elements first (torch leaves the rest
    uninitialised; here they are zeros)."""
    from .. import interpreter
    from .creation import zeros

    shape = shape_args("resize_", sizes)
    if any(s < 0 for s in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(shape)}: "
                           f"{list(shape)}")
    if self._requires_grad and interpreter.is_grad_enabled():
        raise RuntimeError("cannot resize variables that require grad")
    numel = 1
    for s in shape:
        numel *= s
    if shape == self._meta.shape:
        return self
    if self.is_contiguous() and numel <= self.numel():
        flat = call("view", self, shape=(self.numel(),))
        new = call("view", call("narrow", flat, dim=0, start=0, length=numel), shape=shape)
    else:
        new = zeros(max(numel, self.numel()), dtype=self.dtype, device=self._where())
        call("narrow", new, dim=0, start=0, length=self.numel()).copy_(reshape(self, -1))
        new = reshape(call("narrow", new, dim=0, start=0, length=numel), shape)
    Tensor.data.fset(self, new.detach())
    return self


def _resize_as_(self: Tensor, other: Tensor, memory_format=None):
    return _resize_(self, tuple(other.shape))


def _sum_to_size(self: Tensor, *size):
    shape = shape_args("sum_to_size", size)
    from ..._core.errors import broadcast_shapes as _bshapes

    try:
        ok = _bshapes("sum_to_size", shape, self._meta.shape) == self._meta.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise RuntimeError(f"size {{{list(shape)}}} is not expandable to size "
                           f"{{{list(self.shape)}}}.")
    lead = self.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and self.shape[lead + i] != 1)
    out = self.sum(dims, keepdim=True) if dims else self
    return reshape(out, shape) if lead else out


# -- as_strided (a copy over the root tensor's memory) -----------------------------------------
def as_strided(input: Tensor, size, stride, storage_offset=None):
    """torch.as_strided read from the memory of the tensor's root (the tensor views share).

    Unlike torch's, the result is a copy, not a view: the primitive set has no overlapping
    strided views, so writes into the result do not reach the input."""
    from ..._core import dtype as dt
    from .creation import tensor as _tensor

    size = shape_args("as_strided", (size,))
    stride = shape_args("as_strided", (stride,))
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got "
                           f"strides: {list(stride)}")
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: "
                           f"{list(size)}")
    if input._gl is not None:
        raise NotImplementedError("as_strided: global tensors are not supported (their pieces "
                                  "have no common storage)")
    root = input if input._base is None else input._base
    if root.storage_offset() != 0 or not root.is_contiguous():
        raise NotImplementedError("as_strided: the tensor's root is not a contiguous tensor at "
                                  "offset 0 (not supported)")
    offset = input.storage_offset() if storage_offset is None else _int(storage_offset,
                                                                         "storage_offset")
    numel = 1
    for s in size:
        numel *= s
    itemsize = input.dtype.itemsize
    need = 0 if numel == 0 else offset + sum((n - 1) * st for n, st in zip(size, stride,
                                                                          strict=True)) + 1
    if need > root.numel():
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
            f"and itemsize {itemsize} requiring a storage size of {need * itemsize} are out "
            f"of bounds for storage of size {root.numel() * itemsize}")
    grids = np.indices(size, dtype=np.int64) if size else np.zeros((0,), np.int64)
    pos = np.full(size, offset, np.int64)
    for k, st in enumerate(stride):
        pos = pos + grids[k] * st
    flat = reshape(root, -1)
    picked = call("index_select", flat, _tensor(pos.reshape(-1), dtype=dt.int64,
                                                device=input._where()), dim=0)
    return reshape(picked, size)


# -- *_copy: the view functions' copying forms (torch's functionalisation names) ---------------
def _copy_of(fn):
    def copying(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(call("clone", o) for o in out)
        return call("clone", out)

    copying.__name__ = fn.__name__ + "_copy"
    return copying


def _slice(input: Tensor, dim: int = 0, start=None, end=None, step: int = 1):
    d = normalize_dim("slice", dim, input.ndim)
    from ...ops.index import FULL

    return call("slice", input, key=(FULL,) * d + (("slice", start, end, step),))


def _alias(input: Tensor):
    return call("view", input, shape=tuple(input.shape))


expand_copy = _copy_of(expand)
permute_copy = _copy_of(permute)
t_copy = _copy_of(t)
transpose_copy = _copy_of(transpose)
squeeze_copy = _copy_of(squeeze)
unsqueeze_copy = _copy_of(unsqueeze)
view_copy = _copy_of(view)
select_copy = _copy_of(select)
slice_copy = _copy_of(_slice)
split_copy = _copy_of(split)
split_with_sizes_copy = _copy_of(split_with_sizes)
unbind_copy = _copy_of(unbind)
unfold_copy = _unfold_method  # already a copy
alias_copy = _copy_of(_alias)
as_strided_copy = as_strided  # already a copy


def vander(x: Tensor, N=None, increasing: bool = False):
    """Columns x**(N-1), ..., x**0 (or the reverse with increasing=True)."""
    from ..._core import dtype as dt
    from .creation import arange

    if x.ndim != 1:
        raise RuntimeError("x must be a one-dimensional tensor.")
    n = x.shape[0] if N is None else _int(N, "N")
    if n < 0:
        raise RuntimeError("N must be non-negative.")
    if not x.dtype.is_floating_point and x.dtype is not dt.int64:
        x = call("to_dtype", x, dtype=dt.int64)
    powers = arange(n, dtype=dt.int64, device=x._where())
    if not increasing:
        powers = call("flip", powers, dims=(0,))
    return unsqueeze(x, -1).pow(powers)


def resize_as_(input: Tensor, the_template: Tensor, *, memory_format=None):
    return _resize_as_(input, the_template)


def _matrix_transpose(what: str):
    def fn(input: Tensor):
        if input.ndim < 2:
            raise RuntimeError(f"tensor.{what} is only supported on matrices or batches of "
                               f"matrices. Got {input.ndim}-D tensor.")
        return transpose(input, -2, -1)  # real dtypes only: the conjugate is the tensor
    return fn


adjoint = _matrix_transpose("adjoint()")


def _h(self: Tensor):
    if self.ndim != 2:
        raise RuntimeError(f"tensor.H is only supported on matrices (2-D tensors). Got "
                           f"{self.ndim}-D tensor."
                           + (" For batches of matrices, consider using tensor.mH"
                              if self.ndim > 2 else ""))
    return transpose(self, 0, 1)


def constant_pad_nd(input: Tensor, pad, value=0):
    return call("pad", input, pad=tuple(pad), mode="constant", value=value)


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, requires_grad=False,
                  pin_memory=False):
    """An uninitialised tensor with the given strides, for dense layouts (a permutation of
    contiguous strides, as channels_last); overlapping or gapped strides are not supported."""
    from .creation import empty

    size = shape_args("empty_strided", (size,))
    stride = shape_args("empty_strided", (stride,))
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: "
                           f"{list(size)}")
    order = sorted(range(len(size)), key=lambda i: (-stride[i], i))  # outermost axis first
    base = empty(*[size[i] for i in order], dtype=dtype, device=device)
    inverse = tuple(order.index(i) for i in range(len(size)))
    out = call("permute", base, dims=inverse) if inverse != tuple(range(len(size))) else base
    got = out.stride()
    if out.numel() and any(n > 1 and got[i] != stride[i] for i, n in enumerate(size)):
        raise NotImplementedError(
            f"empty_strided: strides {list(stride)} for size {list(size)} are not a dense "
            "layout (a permutation of contiguous strides); sbpflow tensors cannot overlap or "
            "have gaps")
    return out.requires_grad_() if requires_grad else out


def _new_empty_strided(self: Tensor, size, stride, *, dtype=None, layout=None, device=None,
                       requires_grad=False, pin_memory=False):
    return empty_strided(size, stride, dtype=self.dtype if dtype is None else dtype,
                         device=self._where() if device is None else device,
                         requires_grad=requires_grad)


def as_strided_scatter(input: Tensor, src: Tensor, size, stride, storage_offset=None):
    """A copy of input (as a fresh contiguous tensor) with the elements that
    `as_strided(size, stride, storage_offset)` of that copy would show replaced by src."""
    from ..._core import dtype as dt
    from .creation import tensor as _tensor

    size = shape_args("as_strided_scatter", (size,))
    stride = shape_args("as_strided_scatter", (stride,))
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got "
                           f"strides: {list(stride)}")
    if tuple(src.shape) != size:
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(size)}")
    offset = 0 if storage_offset is None else _int(storage_offset, "storage_offset")
    numel = input.numel()
    n_out = 1
    for n in size:
        n_out *= n
    need = 0 if n_out == 0 else offset + sum((n - 1) * st for n, st in zip(size, stride,
                                                                          strict=True)) + 1
    if need > numel:
        item = input.dtype.itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
            f"and itemsize {item} requiring a storage size of {need * item} are out of bounds "
            f"for storage of size {numel * item}")
    pos = np.full(size, offset, np.int64)
    if size:
        grids = np.indices(size, dtype=np.int64)
        for k, st in enumerate(stride):
            pos = pos + grids[k] * st
    if src.dtype is not input.dtype:
        src = call("to_dtype", src, dtype=input.dtype)
    index = _tensor(pos.reshape(-1), dtype=dt.int64, device=input._where())
    # torch's copy keeps a dense input's memory order (clone preserves its strides), and the
    # positions count in that order
    st = input.stride()
    order = tuple(sorted(range(input.ndim), key=lambda i: (-st[i], i)))
    moved = permute(input, order) if order != tuple(range(input.ndim)) else input
    if not moved.is_contiguous():
        moved, order = input, tuple(range(input.ndim))
    out = call("index_put", [reshape(moved, -1), reshape(src, -1), index],
               key=(("tensor", 0),), accumulate=False)
    out = reshape(out, tuple(moved.shape))
    if order != tuple(range(input.ndim)):
        out = permute(out, tuple(order.index(i) for i in range(input.ndim)))
    return out


def _deprecated_resize(self: Tensor, *sizes):
    """Tensor.resize (deprecated in torch): the same elements in a new shape."""
    import warnings

    warnings.warn("non-inplace resize is deprecated", UserWarning, stacklevel=2)
    return _same_numel_resize(self, shape_args("resize", sizes))


def _deprecated_resize_as(self: Tensor, other: Tensor):
    import warnings

    warnings.warn("non-inplace resize_as is deprecated", UserWarning, stacklevel=2)
    return _same_numel_resize(self, tuple(other.shape))


def _same_numel_resize(self: Tensor, shape):
    numel = 1
    for n in shape:
        numel *= n
    if numel != self.numel():
        raise RuntimeError(
            f"requested resize to {'x'.join(map(str, shape))} ({numel} elements in total), but "
            f"the given tensor has a size of {'x'.join(map(str, self.shape))} ({self.numel()} "
            "elements). autograd's resize can only change the shape of a given tensor, while "
            "preserving the number of elements. ")
    return reshape(self, shape)


METHODS = {
    "view": view, "reshape": reshape, "expand": expand, "expand_as": expand_as,
    "permute": permute, "transpose": transpose, "t": t, "contiguous": contiguous,
    "swapaxes": swapaxes, "swapdims": swapdims,
    "view_as": lambda self, other: view(self, tuple(other.shape)),
    "reshape_as": lambda self, other: reshape(self, tuple(other.shape)),
    "T": property(lambda self: permute(self, tuple(reversed(range(self.ndim))))),
    "mT": property(lambda self: transpose(self, -2, -1)),
    "flatten": flatten, "ravel": ravel, "unflatten": unflatten,
    "squeeze": squeeze,
    "unsqueeze": unsqueeze, "movedim": movedim, "moveaxis": moveaxis,
    "narrow": narrow, "select": select, "diagonal": diagonal,
    "split": split, "chunk": chunk, "tensor_split": tensor_split, "unbind": unbind,
    "flip": _flip_method,
    "fliplr": fliplr, "flipud": flipud, "roll": roll, "tril": tril, "triu": triu,
    "tril_": inplace_method("tril_", tril), "triu_": inplace_method("triu_", triu),
    "repeat": _repeat_method, "repeat_interleave": repeat_interleave,
    "broadcast_to": broadcast_to, "diag": diag, "diag_embed": diag_embed,
    "diagflat": diagflat, "trace": trace, "rot90": rot90, "diff": diff,
    "narrow_copy": narrow_copy, "unfold": _unfold_method,
    "hsplit": hsplit, "vsplit": vsplit, "dsplit": dsplit,
    "split_with_sizes": split_with_sizes, "unsafe_split": unsafe_split,
    "unsafe_chunk": unsafe_chunk, "unsafe_split_with_sizes": unsafe_split_with_sizes,
    "tile": lambda self, *dims: tile(self, shape_args("tile", dims)), "sum_to_size": _sum_to_size,
    "squeeze_": _inplace_view(squeeze), "unsqueeze_": _inplace_view(unsqueeze),
    "t_": _inplace_view(t), "transpose_": _inplace_view(transpose),
    "swapaxes_": _inplace_view(transpose), "swapdims_": _inplace_view(transpose),
    "resize_": _resize_, "resize_as_": _resize_as_, "as_strided": as_strided,
    "adjoint": adjoint, "H": property(_h), "mH": property(_matrix_transpose("mH")),
    "new_empty_strided": _new_empty_strided, "as_strided_scatter": as_strided_scatter,
    "resize": _deprecated_resize, "resize_as": _deprecated_resize_as,
}

__all__ = [
    "cat", "chunk", "concat", "concatenate", "contiguous", "diagonal", "diagonal_copy",
    "expand", "flatten",
    "flip", "fliplr", "flipud", "movedim", "moveaxis", "narrow", "pad", "permute", "ravel",
    "repeat_interleave", "reshape", "roll", "select", "split", "squeeze", "stack", "swapaxes",
    "swapdims", "t", "tensor_split", "transpose", "tril", "triu", "unbind", "unflatten",
    "unsqueeze", "view",
    "atleast_1d", "atleast_2d", "atleast_3d", "block_diag", "broadcast_shapes",
    "broadcast_tensors", "broadcast_to", "cartesian_prod", "column_stack", "combinations",
    "diag", "diag_embed", "diagflat", "diff", "dsplit", "dstack", "hsplit", "hstack",
    "meshgrid", "narrow_copy", "rot90", "row_stack", "split_with_sizes", "tile", "trace",
    "tril_indices", "triu_indices", "unsafe_chunk", "unsafe_split", "unsafe_split_with_sizes",
    "vsplit", "vstack",
    "alias_copy", "as_strided", "as_strided_copy", "expand_copy", "permute_copy",
    "select_copy", "slice_copy", "split_copy", "split_with_sizes_copy", "squeeze_copy",
    "t_copy", "transpose_copy", "unbind_copy", "unfold_copy", "unsqueeze_copy", "vander",
    "view_copy", "adjoint", "constant_pad_nd", "resize_as_", "empty_strided",
    "as_strided_scatter",
]
