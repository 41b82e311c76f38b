"""Devices and their primitives.

A device type registers a `Primitives` instance; kernels reach it through their context.
`cpu` runs NumPy; `mock` runs the same primitives behind opaque arrays and counts calls.
"""

from __future__ import annotations

from .mock import KernelBypassError, MockArray, MockPrimitives
from .primitives import Primitives

_PRIMITIVES: dict[str, Primitives] = {}


def register_device(type_: str, prims: Primitives) -> None:
    _PRIMITIVES[type_] = prims


def primitives(type_: str) -> Primitives:
    try:
        return _PRIMITIVES[type_]
    except KeyError:
        raise RuntimeError(
            f"Expected one of {sorted(_PRIMITIVES)} device type at start of device string: "
            f"{type_}"
        ) from None


def device_types() -> list[str]:
    return sorted(_PRIMITIVES)


class Device:
    """A device value: type plus index.  Frozen and hashable."""

    __slots__ = ("type", "index", "prims")

    def __init__(self, type_: str = "cpu", index: int | None = None):
        if isinstance(type_, Device):
            type_, index = type_.type, type_.index
        elif ":" in type_:
            type_, _, idx = type_.partition(":")
            index = int(idx)
        object.__setattr__(self, "prims", primitives(type_))
        object.__setattr__(self, "type", type_)
        object.__setattr__(self, "index", index)

    def __setattr__(self, name, value):
        raise AttributeError("device is immutable")

    def __eq__(self, other):
        if isinstance(other, str):
            other = Device(other)
        return isinstance(other, Device) and (self.type, self.index or 0) == (
            other.type, other.index or 0)

    def __hash__(self):
        return hash((self.type, self.index or 0))

    def __repr__(self):
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


register_device("cpu", Primitives())
register_device("mock", MockPrimitives())

__all__ = [
    "Device", "KernelBypassError", "MockArray", "MockPrimitives", "Primitives",
    "device_types", "primitives", "register_device",
]
