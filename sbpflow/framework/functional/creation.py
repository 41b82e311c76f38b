"""Tensor creation: from data, and the factories."""

from __future__ import annotations

import numpy as np

from ..._core import dtype as dt
from ...device import Device
from ..tensor import Tensor
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


def _from_nested_tensors(data):
    if isinstance(data, Tensor):
        return data.detach()._host().copy() if data.dtype not in (dt.bfloat16,) else \
            data._host().copy()
    if isinstance(data, (list, tuple)) and data and any(
        isinstance(x, (Tensor, list, tuple)) for x in data
    ):
        return [_from_nested_tensors(x) for x in data]
    return data


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False) -> Tensor:
    if isinstance(data, Tensor):
        host = data._host()
        dtype = data.dtype if dtype is None else dt.as_dtype(dtype)
    else:
        data = _from_nested_tensors(data)
        if isinstance(data, (list, tuple)) and any(isinstance(x, np.ndarray) for x in data):
            data = np.stack([np.asarray(x) for x in data])
        dtype = _infer_dtype(data) if dtype is None else dt.as_dtype(dtype)
        host = np.asarray(data)
        if host.dtype == object:
            raise TypeError(f"tensor(): could not convert {type(data).__name__} to a tensor")
    dev = _CPU if device is None else Device(device)
    t = Tensor._make(dev.prims.from_host(host, dtype), _meta(host.shape, dtype), dev)
    if requires_grad:
        t.requires_grad = True
    return t


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


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    if dtype is None:
        dtype = dt.scalar_dtype(fill_value)
    t = _apply_creation("full", device, shape=shape_args("full", (size,)),
                        fill_value=fill_value, dtype=dt.as_dtype(dtype))
    return _finish(t, requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(shape_args("zeros", size), 0, dtype=_factory_dtype(dtype), device=device,
                requires_grad=requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(shape_args("ones", size), 1, dtype=_factory_dtype(dtype), device=device,
                requires_grad=requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    return zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)


def _like(fn):
    def like(input, *args, dtype=None, device=None, requires_grad=False, **kw):
        return fn(tuple(input.shape), *args, dtype=input.dtype if dtype is None else dtype,
                  device=input.device if device is None else device,
                  requires_grad=requires_grad, **kw)

    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)
full_like = _like(full)


def _apply_creation(name, device, **attrs):
    from .. import interpreter
    from ...ops import registry

    return interpreter.apply(registry.get(name), (), attrs, device=device)


def _tensor_ctor(*args, **kwargs):
    """Legacy `Tensor(...)`: Tensor(2, 3) allocates; Tensor([..]) copies data as float."""
    if args and all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return zeros(*args, **kwargs)
    if len(args) == 1:
        return tensor(args[0], dtype=kwargs.get("dtype", dt.get_default_dtype()))
    return zeros(0)


METHODS = {
    "new_zeros": lambda self, *size, dtype=None, **kw: zeros(
        *size, dtype=dtype or self.dtype, device=self.device, **kw),
    "new_ones": lambda self, *size, dtype=None, **kw: ones(
        *size, dtype=dtype or self.dtype, device=self.device, **kw),
    "new_full": lambda self, size, fill_value, dtype=None, **kw: full(
        size, fill_value, dtype=dtype or self.dtype, device=self.device, **kw),
    "new_empty": lambda self, *size, dtype=None, **kw: empty(
        *size, dtype=dtype or self.dtype, device=self.device, **kw),
    "new_tensor": lambda self, data, dtype=None, **kw: tensor(
        data, dtype=dtype or self.dtype, device=self.device, **kw),
}

__all__ = [
    "as_tensor", "empty", "empty_like", "from_numpy", "full", "full_like", "ones", "ones_like",
    "scalar_tensor", "tensor", "zeros", "zeros_like",
]
