"""Copies and conversions: clone, to, type casts."""

from __future__ import annotations

from ..._core import dtype as dt
from ...device import Device
from ..tensor import Tensor, check_memory_format
from ._base import call


def clone(input: Tensor, *, memory_format=None) -> Tensor:
    check_memory_format("clone", input, memory_format)
    return call("clone", input)


def to(self: Tensor, *args, dtype=None, device=None, copy=False, non_blocking=False,
       memory_format=None):
    """t.to(dtype), t.to(device), t.to(device, dtype), t.to(other)."""
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, (str, Device)) and not (isinstance(a, str) and a in dt._NAMES):
            device = a
        elif isinstance(a, int) and not isinstance(a, bool):  # an accelerator index
            raise RuntimeError("Cannot access accelerator device when none is available.")
        elif a is not None:
            dtype = a
    check_memory_format("to", self, memory_format)
    out = self
    if dtype is not None and dt.as_dtype(dtype) is not self.dtype:
        out = call("to_dtype", out, dtype=dt.as_dtype(dtype))
    if device is not None and Device(device).check_available() != self.device:
        raise NotImplementedError(f"to(): moving tensors to {device} needs that device's "
                                  "copy primitive, not available yet")
    if copy and out is self:
        out = clone(self)
    return out


def copy_(self: Tensor, src, non_blocking: bool = False) -> Tensor:
    """Write src (broadcast to self's shape, cast to self's dtype) into self."""
    from .. import interpreter
    from ._base import as_tensor_arg

    src = as_tensor_arg("copy_", "src", src, self)
    if src.dtype is not self.dtype:
        src = call("to_dtype", src, dtype=self.dtype)
    if tuple(src.shape) != tuple(self.shape):
        src = call("expand", src, size=tuple(self.shape))
    return interpreter.assign(self, src, "copy_")


def fill_(self: Tensor, value) -> Tensor:
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(
                "fill_ only supports 0-dimension value tensor but got tensor with "
                f"{value.dim()} dimensions."
            )
        return copy_(self, value)
    from ...ops import registry
    from .. import interpreter

    full = interpreter.apply(registry.get("full"), (),
                             {"shape": tuple(self.shape), "fill_value": value,
                              "dtype": self.dtype}, device=self._where())
    return interpreter.assign(self, full, "fill_")


def type_as(self: Tensor, other: Tensor) -> Tensor:
    if not isinstance(other, Tensor):
        raise TypeError(f"type_as(): argument 'other' (position 1) must be Tensor, not "
                        f"{type(other).__name__}")
    return to(self, other.dtype)


def fill(input: Tensor, value) -> Tensor:
    """torch.fill: a new tensor of input's shape and dtype holding value."""
    return fill_(call("clone", input), value)


def zero_(input: Tensor) -> Tensor:
    return fill_(input, 0)


def is_signed(input: Tensor) -> bool:
    return input.dtype.name not in ("bool", "uint8")


def is_same_size(input: Tensor, other: Tensor) -> bool:
    return tuple(input.shape) == tuple(other.shape)


def _is_nonzero(self: Tensor) -> bool:
    n = self.numel()
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(self.item())


def _new(self: Tensor, *args, device=None):
    """The legacy Tensor.new: new(*sizes) (uninitialised, as empty), new(data) or
    new() (an empty tensor), with self's dtype."""
    from .creation import empty, tensor

    where = self._where() if device is None else device
    if not args:
        return empty(0, dtype=self.dtype, device=where)
    if len(args) == 1 and isinstance(args[0], Tensor):
        if args[0].dtype is not self.dtype:
            raise TypeError(f"expected {self.dtype} (got {args[0].dtype})")
        return args[0].detach()
    if len(args) == 1 and not isinstance(args[0], int):
        return tensor(args[0], dtype=self.dtype, device=where)
    return empty(*args, dtype=self.dtype, device=where)


def _cast(d):
    return lambda self, memory_format=None: to(self, d)


def cast(input: Tensor, dtype) -> Tensor:
    """OneFlow's flow.cast(input, dtype): the tensor converted to dtype (itself if it has it,
    as Tensor.to)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"cast(): argument 'input' must be Tensor, not {type(input).__name__}")
    return input.to(dtype)


METHODS = {
    "clone": clone, "to": to, "type_as": type_as, "copy_": copy_, "fill_": fill_,
    "zero_": lambda self: fill_(self, 0),
    "float": _cast(dt.float32), "double": _cast(dt.float64), "half": _cast(dt.float16),
    "bfloat16": _cast(dt.bfloat16), "long": _cast(dt.int64), "int": _cast(dt.int32),
    "short": _cast(dt.int16), "char": _cast(dt.int8), "byte": _cast(dt.uint8),
    "bool": _cast(dt.bool_), "cpu": lambda self: self,
    "is_signed": is_signed, "is_same_size": is_same_size, "is_nonzero": _is_nonzero,
    "ndimension": lambda self: self.ndim,
    "nbytes": property(lambda self: self.numel() * self.dtype.itemsize),
    "itemsize": property(lambda self: self.dtype.itemsize),
    "new": _new,
}

__all__ = ["cast", "clone", "fill", "fill_", "is_same_size", "is_signed", "zero_"]
