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
}

__all__ = [
    "cat", "chunk", "concat", "concatenate", "contiguous", "diagonal", "diagonal_copy",
    "expand", "flatten",
    "flip", "fliplr", "flipud", "movedim", "moveaxis", "narrow", "pad", "permute", "ravel",
    "repeat_interleave", "reshape", "roll", "select", "split", "squeeze", "stack", "swapaxes",
    "swapdims", "t", "tensor_split", "transpose", "tril", "triu", "unbind", "unflatten",
    "unsqueeze", "view",
]
