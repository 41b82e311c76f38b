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


def _cast(d):
    return lambda self, memory_format=None: to(self, d)


METHODS = {
    "clone": clone, "to": to, "type_as": type_as, "copy_": copy_, "fill_": fill_,
    "zero_": lambda self: fill_(self, 0),
    "float": _cast(dt.float32), "double": _cast(dt.float64), "half": _cast(dt.float16),
    "bfloat16": _cast(dt.bfloat16), "long": _cast(dt.int64), "int": _cast(dt.int32),
    "short": _cast(dt.int16), "char": _cast(dt.int8), "byte": _cast(dt.uint8),
    "bool": _cast(dt.bool_), "cpu": lambda self: self,
}

__all__ = ["clone"]
