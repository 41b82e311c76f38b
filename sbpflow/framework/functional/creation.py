"""Tensor creation: from data, and the factories."""

from __future__ import annotations

import numpy as np

from ..._core import dtype as dt
from ...device import Device
from ...ops import registry
from ...sbp import Placement, normalize_sbp
from .. import interpreter
from ..generator import get_rng_state, set_rng_state  # re-exported as sbpflow.*
from ..global_tensor import GlobalDevice, from_logical, global_mode_device
from ..tensor import Tensor, check_memory_format
from . import _pyconvert as _pyc
from ._base import call, shape_args

_CPU = Device("cpu")


def _infer_dtype(data) -> dt.DType:
    """torch.tensor's dtype inference: Python floats -> default dtype, ints -> int64."""
    if isinstance(data, np.ndarray):
        return dt.from_numpy(data.dtype)
    if isinstance(data, np.generic):
        return dt.from_numpy(data.dtype)
    arr = np.asarray(data)
    if arr.dtype == np.bool_:
        return dt.bool_
    if arr.dtype.kind in "iu":
        return dt.int64
    if arr.dtype.kind == "f":
        return dt.get_default_dtype()
    if arr.dtype == object:
        # Lists of tensors: take their dtype.
        raise TypeError(f"tensor(): could not infer dtype of {type(data).__name__}")
    raise TypeError(f"tensor(): could not infer dtype of {arr.dtype}")


def _python_leaf_types(data):
    """The leaf types of `data` if it is a Python number or a rectangular nested list/tuple
    of them (bool, int, float exactly: NumPy scalars and tensors take the general path),
    else None."""
    if type(data) in _pyc.PY_SCALARS:
        return {type(data)}
    if type(data) not in _pyc.SEQS:
        return None
    types = _pyc.leaf_types(data)
    return types if types is not None and types <= _pyc.PY_SCALARS else None


def _from_nested_tensors(data):
    if isinstance(data, Tensor):
        return data.detach()._host().copy() if data.dtype not in (dt.bfloat16,) else \
            data._host().copy()
    if isinstance(data, (list, tuple)) and data and any(
        isinstance(x, (Tensor, list, tuple)) for x in data
    ):
        return [_from_nested_tensors(x) for x in data]
    return data


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False, *,
           placement=None, sbp=None) -> Tensor:
    """torch.tensor; with placement= and sbp= a global tensor whose logical value is `data`
    (every rank passes the same data and keeps its own piece)."""
    device = _where("tensor", device, placement, sbp)
    if isinstance(data, Tensor):
        host = data._host()
        dtype = data.dtype if dtype is None else dt.as_dtype(dtype)
    elif (types := _python_leaf_types(data)) is not None:
        # Python numbers (the common case): one C-speed pass for the leaf types gives
        # torch's dtype inference, then each value must fit that dtype as in torch
        dtype = _pyc.infer_python_dtype(types) if dtype is None else dt.as_dtype(dtype)
        host = _pyc.checked_host(np.asarray(data), data, dtype, "tensor", float in types)
    else:
        checked = not isinstance(data, np.ndarray)  # an array is cast, as torch casts it
        data = _from_nested_tensors(data)
        if isinstance(data, (list, tuple)):
            _check_rectangular(data)
        if isinstance(data, (list, tuple)) and any(isinstance(x, np.ndarray) for x in data):
            data = np.stack([np.asarray(x) for x in data])
        dtype = _infer_dtype(data) if dtype is None else dt.as_dtype(dtype)
        host = np.asarray(data)
        if host.dtype == object:
            raise TypeError(f"tensor(): could not convert {type(data).__name__} to a tensor")
        if checked:  # NumPy scalars, lists of arrays or tensors: each value is checked
            host = _pyc.checked_host(host, host, dtype, "tensor", host.dtype.kind == "f")
    if isinstance(device, GlobalDevice):
        t = from_logical(np.asarray(host), dtype, device)
        if requires_grad:
            t.requires_grad = True
        return t
    dev = _CPU if device is None else Device(device)
    t = Tensor._make(dev.prims.from_host(host, dtype), _meta(host.shape, dtype), dev)
    if requires_grad:
        t.requires_grad = True
    return t


def _check_rectangular(data, dim: int = 0) -> None:
    """torch's error for ragged nested sequences, before NumPy gives its own."""
    if not isinstance(data, (list, tuple)) or not data:
        return
    first = data[0]
    is_seq = isinstance(first, (list, tuple))
    want = len(first) if is_seq else None
    for x in data:
        if isinstance(x, (list, tuple)) != is_seq or (is_seq and len(x) != want):
            got = len(x) if isinstance(x, (list, tuple)) else 0
            raise ValueError(f"expected sequence of length {want or 0} at dim {dim + 1} "
                             f"(got {got})")
    if is_seq:
        for x in data:
            _check_rectangular(x, dim + 1)


def _meta(shape, dtype):
    from ..._core.meta import TensorMeta

    return TensorMeta(tuple(int(s) for s in shape), dtype)


def scalar_tensor(value, dtype=None, device=None) -> Tensor:
    return tensor(value, dtype=dtype if dtype is not None else dt.scalar_dtype(value),
                  device=device)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A tensor sharing memory with a NumPy array (CPU)."""
    d = dt.from_numpy(arr.dtype)
    return Tensor._make(arr, _meta(arr.shape, d), _CPU)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    if isinstance(data, Tensor) and (dtype is None or data.dtype is dt.as_dtype(dtype)):
        return data
    if isinstance(data, np.ndarray) and dtype is None and device is None:
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


def _factory_dtype(dtype, default=None):
    if dtype is None:
        return default or dt.get_default_dtype()
    return dt.as_dtype(dtype)


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    if requires_grad:
        t.requires_grad = True
    return t


def full(size, fill_value, *, dtype=None, device=None,
         placement=None, sbp=None, requires_grad=False) -> Tensor:
    if dtype is None:
        dtype = dt.scalar_dtype(fill_value)
    where = _where("full", device, placement, sbp)
    t = _apply_creation("full", where, shape=shape_args("full", (size,)),
                        fill_value=fill_value, dtype=dt.as_dtype(dtype))
    return _finish(t, requires_grad)


def zeros(*size, dtype=None, device=None, placement=None, sbp=None,
          requires_grad=False, **kw) -> Tensor:
    """zeros(2, 3), zeros((2, 3)) or zeros(size=(2, 3))."""
    return full(_size_kw("zeros", size, kw), 0, dtype=_factory_dtype(dtype), device=device,
                placement=placement, sbp=sbp, requires_grad=requires_grad)


def ones(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad=False,
         **kw) -> Tensor:
    """ones(2, 3), ones((2, 3)) or ones(size=(2, 3))."""
    return full(_size_kw("ones", size, kw), 1, dtype=_factory_dtype(dtype), device=device,
                placement=placement, sbp=sbp, requires_grad=requires_grad)


def empty(*size, dtype=None, device=None, placement=None, sbp=None, requires_grad=False,
          memory_format=None, **kw) -> Tensor:
    """empty(2, 3), empty((2, 3)) or empty(size=(2, 3)) (zero-filled here)."""
    return full(_size_kw("empty", size, kw), 0, dtype=_factory_dtype(dtype), device=device,
                placement=placement, sbp=sbp, requires_grad=requires_grad)


def _like(fn):
    def like(input, *args, dtype=None, device=None, requires_grad=False, memory_format=None,
             **kw):
        check_memory_format(fn.__name__ + "_like", input, memory_format)
        return fn(tuple(input.shape), *args, dtype=input.dtype if dtype is None else dtype,
                  device=_where_of(input) if device is None else device,
                  requires_grad=requires_grad, **kw)

    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)
full_like = _like(full)


def _where(op: str, device, placement, sbp):
    """The device, or for placement= and sbp= (OneFlow's factories) a GlobalDevice."""
    if placement is None:
        if sbp is not None:
            raise TypeError(f"{op}(): sbp= needs a placement= as well")
        return global_mode_device(device) or device  # global_view.global_mode: global
    if device is not None:
        raise TypeError(f"{op}(): give either device= (a local tensor) or placement= and sbp= "
                        "(a global tensor), not both")
    if sbp is None:
        raise TypeError(f"{op}(): placement= needs an sbp= as well (e.g. sbpflow.sbp.broadcast)")
    if not isinstance(placement, Placement):
        raise TypeError(f"{op}(): argument 'placement' must be sbpflow.placement, got "
                        f"{type(placement).__name__}")
    return GlobalDevice(placement, normalize_sbp(sbp, placement, op))


def _where_of(t: Tensor):
    """Where a tensor made "like" t goes: t's device, or t's placement and SBP."""
    return t.device if t._gl is None else GlobalDevice(t._gl.placement, t._gl.sbp)


def _apply_creation(name, device, generator=None, **attrs):
    return interpreter.apply(registry.get(name), (), attrs, device=device, generator=generator)


def _number(op: str, arg: str, x):
    """A Python number from a number, a NumPy scalar or a one-element tensor (torch accepts
    0-d tensors for arange's and linspace's bounds)."""
    if isinstance(x, Tensor):
        if x.numel() != 1:
            raise TypeError(f"{op}(): argument '{arg}' must be Number, not a tensor of "
                            f"{x.numel()} elements")
        return x.item()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (bool, int, float)):
        return x
    raise TypeError(f"{op}(): argument '{arg}' must be Number, not {type(x).__name__}")


def _size(op: str, args, size):
    """The size of f(*size) or f(size=...): f(2, 3), f((2, 3)), f([2, 3]), f(Size)."""
    if size is not None:
        if args:
            raise TypeError(f"{op}() got multiple values for argument 'size'")
        args = (size,)
    return shape_args(op, args)


# -- ranges -----------------------------------------------------------------------------------
def arange(start=0, end=None, step=1, *, dtype=None, device=None,
           placement=None, sbp=None, requires_grad=False) -> Tensor:
    """arange(end), arange(start, end), arange(start, end, step): torch's values and length;
    the dtype is int64 unless a bound or the step is a float (then the default dtype)."""
    if end is None:
        start, end = 0, start
    start = _number("arange", "start", start)
    end = _number("arange", "end", end)
    step = _number("arange", "step", step)
    if dtype is None:
        floats = any(isinstance(v, float) for v in (start, end, step))
        dtype = dt.get_default_dtype() if floats else dt.int64
    where = _where("arange", device, placement, sbp)
    t = _apply_creation("arange", where, start=start, end=end, step=step,
                        dtype=dt.as_dtype(dtype))
    return _finish(t, requires_grad)


def linspace(start, end, steps, *, dtype=None, device=None,
             placement=None, sbp=None, requires_grad=False) -> Tensor:
    where = _where("linspace", device, placement, sbp)
    t = _apply_creation("linspace", where, start=_number("linspace", "start", start),
                        end=_number("linspace", "end", end), steps=steps,
                        dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None,
             placement=None, sbp=None,
             requires_grad=False) -> Tensor:
    where = _where("logspace", device, placement, sbp)
    t = _apply_creation("logspace", where, start=_number("logspace", "start", start),
                        end=_number("logspace", "end", end), steps=steps, base=base,
                        dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


def eye(n, m=None, *, dtype=None, device=None,
        placement=None, sbp=None, requires_grad=False) -> Tensor:
    where = _where("eye", device, placement, sbp)
    t = _apply_creation("eye", where, n=n, m=m, dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


# -- random -----------------------------------------------------------------------------------
def _size_kw(op: str, size, kw):
    """The size of a factory that takes `size=` besides its named keywords (torch's)."""
    unknown = [k for k in kw if k != "size"]
    if unknown:
        raise TypeError(f"{op}() got an unexpected keyword argument '{unknown[0]}'")
    return _size(op, size, kw.get("size"))


def rand(*size, generator=None, dtype=None, device=None,
         placement=None, sbp=None, requires_grad=False, **kw) -> Tensor:
    """Uniform on [0, 1): rand(2, 3), rand((2, 3)) or rand(size=(2, 3))."""
    where = _where("rand", device, placement, sbp)
    t = _apply_creation("uniform", where, generator, shape=_size_kw("rand", size, kw),
                        low=0.0, high=1.0, dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


def randn(*size, generator=None, dtype=None, device=None,
          placement=None, sbp=None, requires_grad=False, **kw) -> Tensor:
    """Standard normal: randn(2, 3), randn((2, 3)) or randn(size=(2, 3))."""
    where = _where("randn", device, placement, sbp)
    t = _apply_creation("normal", where, generator, shape=_size_kw("randn", size, kw),
                        mean=0.0, std=1.0, dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


def _int_arg(x):
    """A one-element integer tensor as an int; anything else is left to the op's attr check,
    which raises torch's TypeError for non-integers."""
    if isinstance(x, Tensor) and x.numel() == 1 and not x.dtype.is_floating_point:
        return int(x.item())
    return x


def randint(*args, size=None, low=None, high=None, generator=None, dtype=None, device=None,
            placement=None, sbp=None,
            requires_grad=False) -> Tensor:
    """randint(high, size) or randint(low, high, size): integers in [low, high)."""
    args = list(args)
    if size is None:
        if not args:
            raise TypeError("randint(): missing required argument 'size'")
        size = args.pop()
    if len(args) == 2:
        low, high = args
    elif len(args) == 1:
        if high is None:
            high = args[0]
        else:
            low = args[0]
    elif len(args) > 2:
        raise TypeError(f"randint(): takes at most 3 positional arguments ({len(args) + 1} "
                        "given)")
    if high is None:
        raise TypeError("randint(): missing required argument 'high'")
    low = 0 if low is None else low
    where = _where("randint", device, placement, sbp)
    t = _apply_creation("randint", where, generator, shape=shape_args("randint", (size,)),
                        low=_int_arg(low),
                        high=_int_arg(high),
                        dtype=dt.int64 if dtype is None else dt.as_dtype(dtype))
    return _finish(t, requires_grad)


def randperm(n, *, generator=None, dtype=None, device=None,
             placement=None, sbp=None, requires_grad=False) -> Tensor:
    where = _where("randperm", device, placement, sbp)
    t = _apply_creation("randperm", where, generator, n=_int_arg(n),
                        dtype=dt.int64 if dtype is None else dt.as_dtype(dtype))
    return _finish(t, requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           placement=None, sbp=None,
           requires_grad=False) -> Tensor:
    """normal(mean, std, size) with numbers, or normal(mean, std) with a tensor mean and/or std
    (broadcast).  With tensors the result is mean + std * z with z drawn from the generator;
    like torch it carries no gradient to mean or std (here: it does not require grad)."""
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        return _normal_tensors(mean, std, size, generator)
    if size is None:
        raise TypeError("normal(): with Number mean and std, argument 'size' is required")
    where = _where("normal", device, placement, sbp)
    t = _apply_creation("normal", where, generator, shape=shape_args("normal", (size,)),
                        mean=mean, std=std, dtype=_factory_dtype(dtype))
    return _finish(t, requires_grad)


def _normal_tensors(mean, std, size, generator):
    from ..._core.errors import broadcast_shapes
    from .elementwise import add, mul

    if size is not None:
        raise TypeError("normal(): 'size' cannot be given with a tensor mean or std")
    tensors = [x for x in (mean, std) if isinstance(x, Tensor)]
    dtype = tensors[0].dtype
    for x in tensors[1:]:
        dtype = dt.promote_types(dtype, x.dtype)
    if not dtype.is_floating_point:
        raise NotImplementedError(f'normal(): "normal_kernel_cpu" not implemented for '
                                  f"'{dtype.name}'")
    if isinstance(std, (int, float)) and std < 0:
        raise RuntimeError(f"normal(): normal expects std >= 0.0, but found std {std}")
    shape = broadcast_shapes("normal", *(tuple(x.shape) for x in tensors))
    z = randn(shape, generator=generator, dtype=dtype, device=_where_of(tensors[0]))
    mean = mean.detach() if isinstance(mean, Tensor) else mean
    std = std.detach() if isinstance(std, Tensor) else std
    return add(mul(z, std), mean)


def bernoulli(input, p=None, *, generator=None) -> Tensor:
    """0/1 draws with probabilities `input` (or the number p for every element), in input's
    dtype."""
    probs = input
    if p is not None:
        pd = input.dtype if input.dtype.is_floating_point else dt.get_default_dtype()
        probs = full(tuple(input.shape), _number("bernoulli", "p", p), dtype=pd,
                     device=_where_of(input))
    out = interpreter.apply(registry.get("bernoulli"), (probs,), {}, generator=generator)
    if out.dtype is not input.dtype:
        out = call("to_dtype", out, dtype=input.dtype)
    return out


def multinomial(input, num_samples, replacement=False, *, generator=None, out=None) -> Tensor:
    """Category indices drawn from the rows of `input` (non-negative weights, 1-D or 2-D),
    with or without replacement; int64 of shape (*rows, num_samples)."""
    if out is not None:
        raise NotImplementedError("multinomial(): out= is not supported")
    return interpreter.apply(registry.get("multinomial"), (input.detach(),),
                             {"num_samples": num_samples, "replacement": replacement},
                             generator=generator)


def rand_like(input, *, dtype=None, device=None, requires_grad=False, generator=None,
              memory_format=None):
    return rand(tuple(input.shape), dtype=input.dtype if dtype is None else dtype,
                device=_where_of(input) if device is None else device, generator=generator,
                requires_grad=requires_grad)


def randn_like(input, *, dtype=None, device=None, requires_grad=False, generator=None,
               memory_format=None):
    return randn(tuple(input.shape), dtype=input.dtype if dtype is None else dtype,
                 device=_where_of(input) if device is None else device, generator=generator,
                 requires_grad=requires_grad)


def randint_like(input, *args, low=None, high=None, dtype=None, device=None,
                 requires_grad=False, generator=None, memory_format=None):
    """randint_like(input, high) or randint_like(input, low, high)."""
    return randint(*args, size=tuple(input.shape), low=low, high=high, generator=generator,
                   dtype=input.dtype if dtype is None else dtype,
                   device=_where_of(input) if device is None else device,
                   requires_grad=requires_grad)


# -- in-place sampling methods -----------------------------------------------------------------
def _sample_inplace(name, draw):
    """The Tensor method `name` that overwrites self with `draw(self, ...)` (same shape, dtype
    and device), through the interpreter's in-place path (version bump, autograd checks)."""
    def method(self, *args, **kwargs):
        return interpreter.inplace(name, self, draw, args, kwargs)

    method.__name__ = name
    return method


def _uniform_draw(src, *args, generator=None, **kw):
    low, high = (list(args) + [kw.pop("from", 0.0), kw.pop("to", 1.0)][len(args):])[:2]
    return _apply_creation("uniform", _where_of(src), generator, shape=tuple(src.shape), low=low,
                           high=high, dtype=src.dtype, **kw)


def _normal_draw(src, mean=0.0, std=1.0, *, generator=None):
    return _apply_creation("normal", _where_of(src), generator, shape=tuple(src.shape), mean=mean,
                           std=std, dtype=src.dtype)


def _random_draw(src, *args, generator=None, **kw):
    """random_(): [0, 2**digits] for floats, [0, max] for integers; random_(to): [0, to);
    random_(from, to): [from, to)."""
    args = list(args)
    low, high = kw.pop("from", None), kw.pop("to", None)
    if len(args) == 2:
        low, high = args
    elif len(args) == 1:
        high = args[0]
    low = 0 if low is None else low
    if high is None:
        d = src.dtype
        if d.is_floating_point:
            high = 2 ** _digits(d) + 1
        else:
            high = 2 if d is dt.bool_ else int(np.iinfo(d.np).max) + 1
    return _apply_creation("randint", _where_of(src), generator, shape=tuple(src.shape),
                           low=_int_arg(low),
                           high=_int_arg(high), dtype=src.dtype, **kw)


def _digits(d) -> int:
    from ...device.random import mantissa_bits

    return mantissa_bits(d)


def _bernoulli_draw(src, p=0.5, *, generator=None):
    if isinstance(p, Tensor):
        probs = p.detach()
        if tuple(probs.shape) != tuple(src.shape):
            probs = probs.expand(*src.shape)
        out = bernoulli(probs, generator=generator)
    else:
        out = bernoulli(src.detach(), p, generator=generator)
    return out if out.dtype is src.dtype else call("to_dtype", out, dtype=src.dtype)

def _tensor_ctor(*args, **kwargs):
    """Legacy `Tensor(...)`: Tensor(2, 3) allocates; Tensor([..]) copies data as float."""
    if args and all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return zeros(*args, **kwargs)
    if len(args) == 1:
        return tensor(args[0], dtype=kwargs.get("dtype", dt.get_default_dtype()))
    return zeros(0)


METHODS = {
    "new_zeros": lambda self, *size, dtype=None, **kw: zeros(
        *size, dtype=dtype or self.dtype, device=_where_of(self), **kw),
    "new_ones": lambda self, *size, dtype=None, **kw: ones(
        *size, dtype=dtype or self.dtype, device=_where_of(self), **kw),
    "new_full": lambda self, size, fill_value, dtype=None, **kw: full(
        size, fill_value, dtype=dtype or self.dtype, device=_where_of(self), **kw),
    "new_empty": lambda self, *size, dtype=None, **kw: empty(
        *size, dtype=dtype or self.dtype, device=_where_of(self), **kw),
    "new_tensor": lambda self, data, dtype=None, **kw: tensor(
        data, dtype=dtype or self.dtype, device=_where_of(self), **kw),
    "uniform_": _sample_inplace("uniform_", _uniform_draw),
    "normal_": _sample_inplace("normal_", _normal_draw),
    "random_": _sample_inplace("random_", _random_draw),
    "bernoulli_": _sample_inplace("bernoulli_", _bernoulli_draw),
    "bernoulli": bernoulli,
    "multinomial": multinomial,
}

__all__ = [
    "arange", "as_tensor", "bernoulli", "empty", "empty_like", "eye", "from_numpy", "full",
    "full_like", "get_rng_state", "linspace", "logspace", "multinomial", "normal", "ones",
    "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like",
    "randperm", "scalar_tensor", "set_rng_state", "tensor", "zeros", "zeros_like",
]
