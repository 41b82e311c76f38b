"""Indexing: `Tensor.__getitem__`/`__setitem__`, gather/scatter, index_select/index_add/
index_put, masked_fill/masked_select and friends.

`x[key]` follows torch's two steps (see sbpflow/ops/index.py for the key encoding):

1. ints, slices, None and Ellipsis make a view with the `slice` op (ints select, so they never
   take part in advanced indexing: `x[0, :, [0, 1]]` is `x[0][:, [0, 1]]`, unlike NumPy);
2. the index tensors (lists, integer tensors, bool masks, Python bools) then index that view
   with the `index` op, a copy.  Bool masks become the integer tensors of their nonzero
   positions first, since an op's output shape must follow from metas alone.

`x[key] = value` writes through: a basic key copies `value` (broadcast, cast) into the view with
`interpreter.assign`; an advanced key runs `index_put` out of place and assigns its result into
the (view of the) tensor with `interpreter.inplace`, so autograd and version counters see one
in-place write, as in torch.

Index values are checked on the host here, before the op runs: metas cannot see them and
kernels must not raise for user errors.  That is a synchronisation point, as in torch.
"""

from __future__ import annotations

import operator

import numpy as np

from ..._core import dtype as dt
from ..._core.errors import normalize_dim
from ...ops import registry
from ...ops.index import FULL
from ...sbp import B
from .. import interpreter
from ..tensor import Tensor
from ._base import call, inplace_method, is_scalar

_INT_INDEX = (dt.int64, dt.int32)
_MASK = (dt.bool_, dt.uint8)


def _tensor(data, dtype=None, device=None) -> Tensor:
    from .creation import tensor

    return tensor(data, dtype=dtype, device=device)


def _host_values(t: Tensor) -> np.ndarray:
    return np.asarray(t._host())


def _meta_check(name: str, inputs, **attrs) -> None:
    """Run an op's meta validation now, so shape errors come before bounds errors."""
    opdef = registry.get(name)
    tensors = list(inputs[0]) if opdef.variadic else list(inputs)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}(): expected Tensor arguments, got {type(t).__name__}")
    opdef.meta(tuple(t._meta for t in tensors), opdef.bind_attrs(attrs))


def _check_range(index: Tensor, size: int, message, negative_ok: bool = False) -> None:
    """Raise message(value) for the first index value outside [-size or 0, size)."""
    if index.numel() == 0:
        return
    values = _host_values(index).reshape(-1)
    lo = -size if negative_ok else 0
    bad = np.nonzero((values < lo) | (values >= size))[0]
    if bad.size:
        raise message(int(values[bad[0]]))


# -- the key -----------------------------------------------------------------------------------
def _treat_as_tuple(seq) -> bool:
    """torch's rule for a non-tuple sequence key: a list holding slices, Ellipsis, None,
    tensors or sequences is a tuple of indices; otherwise it is one index tensor."""
    if len(seq) >= 32:
        return False
    return any(
        x is None or x is Ellipsis
        or isinstance(x, (slice, Tensor, list, tuple, range, np.ndarray))
        for x in seq)


def _slice_entry(s: slice) -> tuple:
    def bound(v):
        return None if v is None else _as_int(v)

    step = bound(s.step)
    if step == 0:
        raise ValueError("slice step cannot be zero")
    if step is not None and step < 0:
        raise ValueError("step must be greater than zero")
    return ("slice", bound(s.start), bound(s.stop), 1 if step is None else step)


def _as_int(v) -> int:
    if isinstance(v, Tensor):
        return v.__index__()
    return operator.index(v)


def _index_tensor(obj, device) -> Tensor:
    """A list / NumPy array index as a tensor: bools stay a mask, anything else becomes int64
    (torch truncates floats in index lists; an empty list is an integer index)."""
    if isinstance(obj, (list, tuple)) and any(isinstance(v, Tensor) for v in obj):
        obj = [v.tolist() if isinstance(v, Tensor) else v for v in obj]
    try:
        arr = np.asarray(obj)
    except ValueError:
        raise IndexError(f"could not convert the index {obj!r} to a tensor") from None
    if arr.dtype.kind not in "biuf":
        raise IndexError(
            "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables "
            f"are valid indices (got {type(obj).__name__})")
    if arr.dtype.kind != "b":
        arr = arr.astype(np.int64)
    return _tensor(arr, device=device)


def _classify(k, device):
    """One key item as (kind, value, number of source axes it consumes)."""
    if k is None:
        return "none", None, 0
    if k is Ellipsis:
        return "ellipsis", None, 0
    if isinstance(k, bool):
        return "bool", k, 0
    if isinstance(k, slice):
        return "slice", _slice_entry(k), 1
    if isinstance(k, Tensor):
        if k.ndim == 0 and k.dtype is dt.bool_:
            return "bool", bool(k.item()), 0
        if k.ndim == 0 and k.dtype in _INT_INDEX + (dt.int16, dt.int8):
            return "int", int(k.item()), 1  # a 0-d integer tensor selects, as in torch
        return _tensor_item(k)
    if isinstance(k, (int, np.integer)):
        return "int", int(k), 1
    if isinstance(k, (list, tuple, range, np.ndarray)):  # range: a sequence, as in torch
        return _tensor_item(_index_tensor(k, device))
    raise IndexError(
        "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are "
        f"valid indices (got {type(k).__name__})")


def _tensor_item(t: Tensor):
    if t.dtype in _MASK:
        return "mask", t, t.ndim
    if t.dtype not in _INT_INDEX:
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    return "tensor", t, 1


def _split_key(x: Tensor, key):
    """(basic key for the `slice` op, [(axis of the sliced view, index tensor or mask)])."""
    if isinstance(key, tuple):
        items = key
    elif isinstance(key, list) and _treat_as_tuple(key):
        items = tuple(key)
    else:
        items = (key,)
    parsed = [_classify(k, x._where()) for k in items]
    # torch lets the first Ellipsis take every unmentioned axis and later ones take none
    first = next((i for i, (kind, _, _) in enumerate(parsed) if kind == "ellipsis"), None)
    parsed = [p for i, p in enumerate(parsed) if p[0] != "ellipsis" or i == first]
    consumed = sum(n for _, _, n in parsed)
    if consumed > x.ndim:
        if x.ndim == 0 and any(kind == "int" for kind, _, _ in parsed):
            raise IndexError(
                "invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
        raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
    basic, advanced = [], []
    axis = 0  # axis of the sliced view
    for kind, value, n in parsed:
        if kind == "int":
            basic.append(("int", value))
        elif kind == "slice":
            basic.append(value)
            axis += 1
        elif kind == "none":
            basic.append(("none",))
            axis += 1
        elif kind == "ellipsis":
            basic.append(("ellipsis",))
            axis += x.ndim - consumed
        elif kind == "bool":  # x[True] adds an axis and keeps it, x[False] empties it
            basic.append(("none",))
            advanced.append((axis, _tensor([0] if value else [], dtype=dt.int64,
                                           device=x._where())))
            axis += 1
        else:
            basic.extend([FULL] * n)
            advanced.append((axis, value))
            axis += n
    return tuple(basic), advanced


def _is_identity(basic) -> bool:
    return all(e == FULL or e == ("ellipsis",) for e in basic)


def _advanced_key(view: Tensor, advanced):
    """The `index` op key and index tensors for the advanced part, with torch's checks."""
    entries = [FULL] * view.ndim
    indices = []
    for axis, t in advanced:
        if t.dtype in _MASK:
            if t.dtype is dt.uint8:
                t = call("to_dtype", t, dtype=dt.bool_)
            shape = view._meta.shape
            for j, n in enumerate(t._meta.shape):
                if shape[axis + j] != n:
                    raise IndexError(
                        f"The shape of the mask {list(t.shape)} at index {j} does not match "
                        f"the shape of the indexed tensor {list(shape)} at index {axis + j}")
            for j, positions in enumerate(np.nonzero(_host_values(t))):
                entries[axis + j] = ("tensor", len(indices))
                indices.append(_tensor(positions.astype(np.int64), device=view._where()))
        else:
            entries[axis] = ("tensor", len(indices))
            indices.append(t)
    # torch numbers the dimension in its message among the indexed axes only
    indexed = [(axis, e[1]) for axis, e in enumerate(entries) if e != FULL]
    for k, (axis, i) in enumerate(indexed):
        size = view._meta.shape[axis]

        def out_of_bounds(v, k=k, size=size):
            return IndexError(f"index {v} is out of bounds for dimension {k} with size {size}")

        _check_range(indices[i], size, out_of_bounds, negative_ok=True)
    last = max(i for i, e in enumerate(entries) if e != FULL)
    return tuple(entries[:last + 1]), indices


_apply = interpreter.apply
_SLICE = registry.get("slice")


def _basic_entry(k):
    """The slice-op entry of an int or plain-int slice, or None for anything else."""
    t = type(k)
    if t is int:
        return ("int", k)
    if (t is slice and type(k.start) in _PLAIN and type(k.stop) in _PLAIN
            and (k.step is None or (type(k.step) is int and k.step > 0))):
        return ("slice", k.start, k.stop, 1 if k.step is None else k.step)
    return None


_PLAIN = (int, type(None))


def getitem(self: Tensor, key):
    # The common keys (an int, a slice, a short tuple of them) go straight to the slice op;
    # it checks bounds itself.  Everything else is parsed below.
    if type(key) is tuple:
        if len(key) <= len(self._meta.shape):
            basic = tuple([_basic_entry(k) for k in key])
            if None not in basic:
                return _apply(_SLICE, (self,), {"key": basic})
    elif self._meta.shape:
        entry = _basic_entry(key)
        if entry is not None:
            return _apply(_SLICE, (self,), {"key": (entry,)})
    basic, advanced = _split_key(self, key)
    if not advanced:
        return call("slice", self, key=basic)
    view = self if _is_identity(basic) else call("slice", self, key=basic)
    index_key, indices = _advanced_key(view, advanced)
    if any(i._device != view._device for i in indices):
        raise RuntimeError("indices should be either on cpu or on the same device as the "
                           f"indexed tensor ({view._device})")
    return call("index", [view, *indices], key=index_key)


def _strip_leading_ones(value: Tensor) -> Tensor:
    """torch drops a value's leading size-1 axes before broadcasting it into x[key]."""
    shape = value._meta.shape
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return call("view", value, shape=shape[k:]) if k and value.is_contiguous() else (
        call("reshape", value, shape=shape[k:]) if k else value)


def _value_tensor(value, like: Tensor) -> Tensor:
    if isinstance(value, Tensor):
        return _strip_leading_ones(value)
    if is_scalar(value):
        return interpreter.apply(registry.get("full"), (),
                                 {"shape": (), "fill_value": value, "dtype": like.dtype},
                                 device=like._where())
    try:
        return _strip_leading_ones(_tensor(value, dtype=like.dtype, device=like._where()))
    except (TypeError, ValueError):
        raise TypeError(f"can't assign a {type(value).__name__} to a "
                        f"{like._type_name().replace('torch', 'sbpflow')}") from None


def _index_put_fn(src: Tensor, values: Tensor, *indices, key, accumulate=False) -> Tensor:
    return call("index_put", [src, values, *indices], key=key, accumulate=accumulate)


def setitem(self: Tensor, key, value) -> None:
    if self._gl is not None and any(x != B for x in self._gl.sbp):
        # A piece cannot take a write along its split axis as a view: write into the whole
        # (B) tensor, then copy back, which boxes to self's SBP (a local slice, no traffic).
        whole = self.to_global(self._gl.placement, (B,) * self._gl.placement.ndim)
        setitem(whole, key, value)
        interpreter.assign(self, whole, "copy_")
        return
    basic, advanced = _split_key(self, key)
    if not advanced:
        view = call("slice", self, key=basic)
        v = _value_tensor(value, view)
        if v.dtype is not view.dtype:
            v = call("to_dtype", v, dtype=view.dtype)
        if v._meta.shape != view._meta.shape:
            v = call("expand", v, size=view._meta.shape)
        interpreter.assign(view, v, "copy_")
        return
    view = self if _is_identity(basic) else call("slice", self, key=basic)
    index_key, indices = _advanced_key(view, advanced)
    v = _value_tensor(value, view)
    interpreter.inplace("index_put_", view, _index_put_fn, (v, *indices), {"key": index_key})


# -- index_put ---------------------------------------------------------------------------------
def _put_key(input: Tensor, indices):
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put(): argument 'indices' (position 1) must be tuple of "
                        f"Tensors, not {type(indices).__name__}")
    advanced, axis = [], 0
    for i, t in enumerate(indices):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got "
                            f"{type(t).__name__}")
        _, value, n = _tensor_item(t)
        advanced.append((axis, value))
        axis += n
    if axis > input.ndim:
        raise IndexError(f"too many indices for tensor of dimension {input.ndim} (got {axis})")
    if not advanced:
        raise RuntimeError("index_put(): expected at least one index tensor")
    return _advanced_key(input, advanced)


def index_put(input: Tensor, indices, values: Tensor, accumulate: bool = False) -> Tensor:
    if not isinstance(values, Tensor):
        raise TypeError(f"index_put(): argument 'values' (position 2) must be Tensor, not "
                        f"{type(values).__name__}")
    key, tensors = _put_key(input, indices)
    return call("index_put", [input, values, *tensors], key=key, accumulate=accumulate)


# -- gather / scatter --------------------------------------------------------------------------
def _dim_size(t: Tensor, dim: int) -> tuple[int, int]:
    d = normalize_dim("index", dim, t.ndim)
    return d, (t.shape[d] if t.ndim else 1)


def _bounds_error(name, d, size):
    return lambda v: RuntimeError(f"{name}(): index {v} is out of bounds for dimension {d} "
                                  f"with size {size}")


def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    _meta_check("gather", (input, index), dim=dim)
    d, size = _dim_size(input, dim)
    _check_range(index, size, _bounds_error("gather", d, size))
    return call("gather", input, index, dim=dim)


def _scatter_checked(name, inputs, dim, **attrs):
    _meta_check(name, inputs, dim=dim, **attrs)
    d, size = _dim_size(inputs[0], dim)
    _check_range(inputs[1], size, _bounds_error("scatter", d, size))
    return call(name, *inputs, dim=dim, **attrs)


def scatter(input: Tensor, dim: int, index: Tensor, src=None, value=None, *, reduce=None):
    if src is None and value is None:
        raise TypeError("scatter(): expected a src tensor or a value")
    if src is not None and not isinstance(src, Tensor):
        src, value = None, src
    if src is not None:
        return _scatter_checked("scatter", (input, index, src), dim, reduce=reduce)
    return _scatter_checked("scatter_value", (input, index), dim, value=value, reduce=reduce)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return _scatter_checked("scatter_add", (input, index, src), dim)


def take_along_dim(input: Tensor, indices: Tensor, dim=None) -> Tensor:
    if dim is None:
        return gather(reshape_flat(input), 0, reshape_flat(indices))
    if input.ndim != indices.ndim:
        raise RuntimeError(
            "torch.take_along_dim(): input and indices should have the same number of "
            f"dimensions, but got {input.ndim} dimensions for input, and {indices.ndim} "
            "dimensions for indices")
    d = normalize_dim("take_along_dim", dim, input.ndim)
    from ..._core.errors import broadcast_shapes

    in_shape = list(input.shape)
    idx_shape = list(indices.shape)
    in_shape[d] = idx_shape[d] = 1
    common = broadcast_shapes("take_along_dim", tuple(in_shape), tuple(idx_shape))
    want_in = common[:d] + (input.shape[d],) + common[d + 1:]
    want_idx = common[:d] + (indices.shape[d],) + common[d + 1:]
    if tuple(input.shape) != want_in:
        input = call("expand", input, size=want_in)
    if tuple(indices.shape) != want_idx:
        indices = call("expand", indices, size=want_idx)
    return gather(input, d, indices)


def reshape_flat(t: Tensor) -> Tensor:
    from .shape import reshape

    return reshape(t, -1)


def take(input: Tensor, index: Tensor) -> Tensor:
    if index.dtype is not dt.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got "
                           f"{_torch_type(index.dtype)}")
    n = input.numel()
    if n == 0 and index.numel():
        raise IndexError("take(): tried to take from an empty tensor")
    _check_range(index, n, lambda v: IndexError(
        f"out of range: tried to access index {v} on a tensor of {n} elements."),
        negative_ok=True)
    flat = reshape_flat(input)
    return getitem(flat, index) if index.ndim else call(
        "reshape", getitem(flat, call("reshape", index, shape=(1,))), shape=())


# -- index_select / index_add ------------------------------------------------------------------
def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    _meta_check("index_select", (input, index), dim=dim)
    d, size = _dim_size(input, dim)

    def error(v):  # torch raises IndexError or RuntimeError depending on the layout
        return IndexError(f"index_select(): index {v} is out of range in self (dimension {d} "
                          f"has size {size})")

    _check_range(index, size, error)
    return call("index_select", input, index, dim=dim)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    _meta_check("index_add", (input, index, source), dim=dim, alpha=alpha)
    d, size = _dim_size(input, dim)
    _check_range(index, size, _bounds_error("index_add", d, size))
    return call("index_add", input, index, source, dim=dim, alpha=alpha)


# -- masks -------------------------------------------------------------------------------------
def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    if isinstance(value, Tensor):
        return call("masked_fill_tensor", input, mask, value)
    if not is_scalar(value):
        raise TypeError(f"masked_fill(): argument 'value' must be Number or Tensor, not "
                        f"{type(value).__name__}")
    return call("masked_fill", input, mask, value=value)


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    if mask.dtype is not dt.bool_:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got "
                           f"{mask._type_name()}")
    from ..._core.errors import broadcast_shapes

    shape = broadcast_shapes("masked_select", input._meta.shape, mask._meta.shape)
    if input._meta.shape != shape:
        input = call("expand", input, size=shape)
    if mask._meta.shape != shape:
        mask = call("expand", mask, size=shape)
    if not shape:  # a 0-d mask indexes as x[True] / x[False]
        return getitem(input, bool(mask.item()))
    return getitem(input, mask)


def nonzero(input: Tensor, *, as_tuple: bool = False):
    """Positions of the non-zero elements (read on the host: the size depends on values)."""
    host = _host_values(input)
    if as_tuple:
        if host.ndim == 0:
            return (_tensor(np.zeros(int(host != 0), np.int64), device=input._where()),)
        return tuple(_tensor(p.astype(np.int64), device=input._where())
                     for p in np.nonzero(host))
    positions = np.argwhere(host).astype(np.int64) if host.ndim else np.zeros(
        (int(host != 0), 0), np.int64)
    return _tensor(positions, device=input._where())


def argwhere(input: Tensor) -> Tensor:
    return nonzero(input)


# -- index_copy / index_fill / put / masked_scatter (compositions over index_put) -------------
def _torch_type(d) -> str:
    from ...ops.index import _torch_name

    return _torch_name(d)


def _dim_key(d: int) -> tuple:
    return (FULL,) * d + (("tensor", 0),)


def _index_vector(name, index: Tensor, *, long_msg) -> Tensor:
    if index.dtype is not dt.int64:
        raise long_msg(index)
    if index.ndim > 1:
        raise IndexError(f"{name}(): Index should have dimension 1 or 0 (got {index.ndim})")
    return index if index.ndim == 1 else call("reshape", index, shape=(1,))


def _as_vector(t: Tensor) -> Tensor:
    return call("reshape", t, shape=(1,)) if t.ndim == 0 else t


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    name = "index_copy_"
    index = _index_vector(name, index, long_msg=lambda i: RuntimeError(
        f"{name}(): Expected a long tensor for index, but got {_torch_type(i.dtype)}"))
    if source.dtype is not input.dtype:
        raise RuntimeError(f"{name}(): self and source expected to have the same dtype, but got "
                           f"(self) {_torch_type(input.dtype)} and (source) "
                           f"{_torch_type(source.dtype)}")
    d = normalize_dim(name, dim, input.ndim)
    x, src = _as_vector(input), _as_vector(source)
    n_src = src.shape[d] if source.ndim else 1
    if index.numel() != n_src:
        raise IndexError(f"{name}(): Number of indices ({index.numel()}) should be equal to "
                         f"source.size(dim) ({n_src})")
    if src.ndim != x.ndim:
        raise IndexError(f"{name}(): When source and destination are not scalars, their "
                         "dimensionality must match. Source dimensionality "
                         f"({source.ndim}), destination dimensionality ({input.ndim})")
    for i in range(x.ndim):
        if i != d and x.shape[i] != src.shape[i]:
            raise RuntimeError(
                f"{name}(): Source/destination tensor must have same slice shapes. Destination "
                f"slice shape: {x.shape[i]} at dimension {i} and source slice shape: "
                f"{src.shape[i]} at dimension {i}.")
    size = x.shape[d]
    _check_range(index, size, lambda v: IndexError(
        f"{name}(): index {v} is out of bounds for dimension {d} with size {size}"))
    out = call("index_put", [x, src, index], key=_dim_key(d), accumulate=False)
    return call("reshape", out, shape=()) if input.ndim == 0 else out


def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    name = "index_fill_"
    index = _index_vector(name, index, long_msg=lambda i: IndexError(
        f"{name}(): Expected dtype int64 for index."))
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"{name} only supports a 0-dimensional value tensor, but got "
                               f"tensor with {value.ndim} dimension(s).")
        v = value if value.dtype is input.dtype else call("to_dtype", value, dtype=input.dtype)
    elif is_scalar(value):
        v = interpreter.apply(registry.get("full"), (),
                              {"shape": (), "fill_value": value, "dtype": input.dtype},
                              device=input._where())
    else:
        raise TypeError(f"index_fill(): argument 'value' must be Number or Tensor, not "
                        f"{type(value).__name__}")
    d = normalize_dim(name, dim, input.ndim)
    x = _as_vector(input)
    size = x.shape[d]
    _check_range(index, size, lambda v_: IndexError(
        f"index {v_} is out of bounds for dimension {d} with size {size}"), negative_ok=True)
    out = call("index_put", [x, v, index], key=_dim_key(d), accumulate=False)
    return call("reshape", out, shape=()) if input.ndim == 0 else out


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    if index.dtype is not dt.int64:
        raise RuntimeError(f"put_(): Expected a long tensor for index, but got "
                           f"{_torch_type(index.dtype)}")
    if source.dtype is not input.dtype:
        raise RuntimeError(f"put_(): self and source expected to have the same dtype, but got "
                           f"self.dtype = {_torch_type(input.dtype)} and source.dtype = "
                           f"{_torch_type(source.dtype)}")
    if index.numel() != source.numel():
        raise IndexError(f"put_(): Expected source and index to have the same number of "
                         f"elements, but got source.numel() = {source.numel()}, index.numel() "
                         f"= {index.numel()}")
    n = input.numel()
    _check_range(index, n, lambda v: IndexError(
        f"out of range: tried to access index {v} on a tensor of {n} elements."),
        negative_ok=True)
    flat = reshape_flat(input)
    out = call("index_put", [flat, reshape_flat(source), reshape_flat(index)],
               key=(("tensor", 0),), accumulate=bool(accumulate))
    return call("reshape", out, shape=tuple(input.shape))


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    if mask.dtype is not dt.bool_:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with "
                           f"dtype {_torch_type(mask.dtype)}")
    if source.dtype is not input.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but "
                           f"got{_torch_type(input.dtype)} and {_torch_type(source.dtype)}")
    from ..._core.errors import broadcast_shapes

    shape = broadcast_shapes("masked_scatter", input._meta.shape, mask._meta.shape)
    if input._meta.shape != shape:
        input = call("expand", input, size=shape)
    if mask._meta.shape != shape:
        mask = call("expand", mask, size=shape)
    if not shape:
        input, mask = _as_vector(input), _as_vector(mask)
    positions = np.nonzero(_host_values(mask))  # data-dependent: read on the host
    k = int(positions[0].size)
    if source.numel() < k:
        raise RuntimeError("Number of elements of source < number of ones in mask")
    values = call("narrow", reshape_flat(source), dim=0, start=0, length=k)
    idx = [_tensor(p.astype(np.int64), device=input._where()) for p in positions]
    key = tuple(("tensor", i) for i in range(len(idx)))
    out = call("index_put", [input, values, *idx], key=key, accumulate=False)
    return call("reshape", out, shape=()) if not shape else out


# -- *_scatter: a copy of input with one view region replaced ---------------------------------
def _embed_into(input: Tensor, src: Tensor, region_shape, embed) -> Tensor:
    """where(inside the region, src embedded by `embed`, input): out of place, so it works on
    any layout, on split global tensors and inside nn.Graph alike."""
    if tuple(src.shape) != tuple(region_shape):
        raise RuntimeError(f"expected src to have a size equal to the slice of self. src size = "
                           f"{list(src.shape)}, slice size = {list(region_shape)}")
    if src.dtype is not input.dtype:
        src = call("to_dtype", src, dtype=input.dtype)
    ones = interpreter.apply(registry.get("full"), (),
                             {"shape": tuple(src.shape), "fill_value": True, "dtype": dt.bool_},
                             device=input._where())
    return call("where", embed(ones), embed(src), input)


def _key_scatter(name: str, input: Tensor, src: Tensor, key) -> Tensor:
    from ...ops.index import basic_shape

    shape = tuple(input.shape)
    region = basic_shape(name, shape, key)
    return _embed_into(input, src, region,
                       lambda t: call("slice_grad", t, key=key, shape=shape))


def select_scatter(input: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    if input.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = normalize_dim("select_scatter", dim, input.ndim)
    index = _as_int(index)
    n = input.shape[d]
    if index < -n or index >= n:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(input.shape)} at dimension {d}")
    return _key_scatter("select_scatter", input, src, (FULL,) * d + (("int", index),))


def slice_scatter(input: Tensor, src: Tensor, dim: int = 0, start=None, end=None,
                  step: int = 1) -> Tensor:
    d = normalize_dim("slice_scatter", dim, input.ndim)
    return _key_scatter("slice_scatter", input, src,
                        (FULL,) * d + (("slice", start, end, step),))


def diagonal_scatter(input: Tensor, src: Tensor, offset: int = 0, dim1: int = 0,
                     dim2: int = 1) -> Tensor:
    region = call("diagonal_copy", input, offset=offset, dim1=dim1, dim2=dim2)
    attrs = {"shape": tuple(input.shape), "offset": offset, "dim1": dim1, "dim2": dim2}
    return _embed_into(input, src, tuple(region.shape),
                       lambda t: call("diagonal_grad", t, **attrs))


def fill_diagonal_(self: Tensor, fill_value, wrap: bool = False) -> Tensor:
    if self.ndim < 2:
        raise RuntimeError("dimensions must larger than 1")
    shape = tuple(self.shape)
    if self.ndim > 2 and len(set(shape)) != 1:
        raise RuntimeError("all dimensions of input must be of equal length")
    n = min(shape)
    if self.ndim == 2 and wrap and shape[0] > shape[1] + 1:
        flat = np.arange(0, self.numel(), shape[1] + 1)
        rows, cols = np.unravel_index(flat, shape)
        idx = (rows, cols)
    else:
        idx = (np.arange(n),) * self.ndim
    key = tuple(_tensor(i.astype(np.int64), device=self._where()) for i in idx)
    setitem(self, key, fill_value)
    return self


# -- scatter_reduce ----------------------------------------------------------------------------
_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got "
                           f"{reduce}")
    _meta_check("scatter_reduce", (input, index, src), dim=dim, reduce=reduce,
                include_self=include_self)
    d, size = _dim_size(input, dim)
    _check_range(index, size, lambda v: RuntimeError(
        f"index {v} is out of bounds for dimension {d} with size {size}"))
    return call("scatter_reduce", input, index, src, dim=dim, reduce=reduce,
                include_self=bool(include_self))


def index_reduce(input: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str, *,
                 include_self: bool = True) -> Tensor:
    """index_reduce as scatter_reduce with the index repeated across source's other axes."""
    name = "index_reduce_"
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or "
                           f"amin but got {reduce}.")
    if index.dtype not in _INT_INDEX:
        raise RuntimeError(f"{name}(): Expected dtype int32/int64 for index but got: "
                           f"{_torch_type(index.dtype)}")
    if index.ndim > 1:
        raise IndexError(f"{name}(): Index is supposed to be a vector, but got dim: {index.ndim} "
                         f"with type: {_torch_type(index.dtype)} and size: {list(index.shape)}")
    if source.dtype is not input.dtype:
        raise RuntimeError(f"{name}(): self ({_torch_type(input.dtype)}) and source "
                           f"({_torch_type(source.dtype)}) must have the same scalar type")
    d = normalize_dim(name, dim, input.ndim)
    x, src, idx = _as_vector(input), _as_vector(source), _as_vector(index)
    if src.ndim != x.ndim or any(i != d and src.shape[i] != x.shape[i] for i in range(x.ndim)):
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified "
            f"dimension. Got self.shape = {list(input.shape)} source.shape = "
            f"{list(source.shape)}")
    if idx.numel() != src.shape[d]:
        raise RuntimeError(f"{name}(): Number of indices ({idx.numel()}) should be equal to "
                           f"source.size(dim): ({src.shape[d]}), for dim: {d}")
    size = x.shape[d]
    _check_range(idx, size, lambda v: IndexError("index out of range in self"))
    shape = [1] * x.ndim
    shape[d] = idx.numel()
    full_index = call("expand", call("reshape", idx, shape=tuple(shape)), size=tuple(src.shape))
    out = call("scatter_reduce", x, full_index, src, dim=d, reduce=reduce,
               include_self=bool(include_self))
    return call("reshape", out, shape=()) if input.ndim == 0 else out


def unravel_index(indices, shape):
    """The coordinates of flat indices in `shape` (each axis taken modulo its size, as
    torch)."""
    if not isinstance(indices, Tensor):
        raise TypeError(f"expected 'indices' to be a tensor, but got {type(indices).__name__}")
    if indices.dtype.is_floating_point or indices.dtype is dt.bool_:
        raise TypeError(f"expected 'indices' to be integer dtype, but got "
                        f"{indices.dtype}".replace("sbpflow.", "torch."))
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(_as_int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"'shape' cannot have negative values, but got {shape}")
    if indices.dtype is not dt.int64:
        indices = call("to_dtype", indices, dtype=dt.int64)
    out, stride = [], 1
    for s in reversed(shape):
        q = indices if stride == 1 else indices // stride
        out.append(q % s if s else q)
        stride *= s
    return tuple(reversed(out))


def index_put_(input: Tensor, indices, values: Tensor, accumulate: bool = False) -> Tensor:
    return input.index_put_(indices, values, accumulate)


def nonzero_static(input: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """nonzero padded with fill_value (or cut) to exactly `size` rows."""
    size = _as_int(size)
    if size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    host = _host_values(input)
    positions = np.argwhere(host).astype(np.int64) if host.ndim else np.zeros(
        (int(host != 0), 0), np.int64)
    out = np.full((size, host.ndim), fill_value, np.int64)
    k = min(size, positions.shape[0])
    out[:k] = positions[:k]
    return _tensor(out, device=input._where())


METHODS = {
    "__getitem__": getitem, "__setitem__": setitem,
    "gather": gather, "scatter": scatter, "scatter_add": scatter_add,
    "scatter_": inplace_method("scatter_", scatter),
    "scatter_add_": inplace_method("scatter_add_", scatter_add),
    "index_select": index_select, "index_add": index_add,
    "index_add_": inplace_method("index_add_", index_add),
    "index_put": index_put, "index_put_": inplace_method("index_put_", index_put),
    "masked_fill": masked_fill, "masked_fill_": inplace_method("masked_fill_", masked_fill),
    "masked_select": masked_select, "take_along_dim": take_along_dim, "take": take,
    "nonzero": nonzero, "argwhere": argwhere,
    "index_copy": index_copy, "index_copy_": inplace_method("index_copy_", index_copy),
    "index_fill": index_fill, "index_fill_": inplace_method("index_fill_", index_fill),
    "put": put, "put_": inplace_method("put_", put),
    "masked_scatter": masked_scatter,
    "masked_scatter_": inplace_method("masked_scatter_", masked_scatter),
    "select_scatter": select_scatter, "slice_scatter": slice_scatter,
    "diagonal_scatter": diagonal_scatter, "fill_diagonal_": fill_diagonal_,
    "scatter_reduce": scatter_reduce,
    "scatter_reduce_": inplace_method("scatter_reduce_", scatter_reduce),
    "index_reduce": index_reduce,
    "index_reduce_": inplace_method("index_reduce_", index_reduce),
    "nonzero_static": nonzero_static,
}

__all__ = [
    "argwhere", "gather", "index_add", "index_put", "index_select", "masked_fill",
    "masked_select", "nonzero", "scatter", "scatter_add", "take", "take_along_dim",
    "diagonal_scatter", "index_copy", "index_fill", "masked_scatter", "put", "scatter_reduce",
    "select_scatter", "slice_scatter", "index_reduce", "unravel_index", "index_put_",
    "nonzero_static",
]
