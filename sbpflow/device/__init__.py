"""Devices and their primitives.

A device type registers a `Primitives` instance; kernels reach it through their context.
`cpu` runs NumPy; `mock` runs the same primitives behind opaque arrays and counts calls.
"""

from __future__ import annotations

from .mock import KernelBypassError, MockArray, MockPrimitives
from .primitives import Primitives

_PRIMITIVES: dict[str, Primitives] = {}
_INTERNED: dict = {}  # (type argument, index) -> Device, for registered device types


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


# torch's device types: a value of one of them exists (torch.device("cuda") is just a value)
# even where sbpflow has no primitives for it; using it (allocating, moving a tensor there)
# raises what torch's CPU-only build raises.
TORCH_DEVICE_TYPES = (
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga",
    "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
)


def unavailable_error(type_: str) -> Exception:
    """What using a device type without primitives raises (torch 2.13's CPU build's error)."""
    if type_ == "cuda":
        return AssertionError("Torch not compiled with CUDA enabled")
    if type_ == "xpu":
        return AssertionError("Torch not compiled with XPU enabled")
    if type_ in ("meta", "lazy", "privateuseone", "hpu", "mtia"):
        return NotImplementedError(
            f"sbpflow has no '{type_}' device: tensors live on the CPU (device 'cpu')")
    return RuntimeError(f"PyTorch is not linked with support for {type_} devices")


class Device:
    """A device value: type plus index.  Frozen and hashable.  Values of registered device
    types are interned (`Device("cpu") is Device("cpu")`), so the interpreter can tell devices
    apart by identity on its hot path."""

    __slots__ = ("type", "index", "prims")

    def __new__(cls, type_: str = "cpu", index: int | None = None):
        if isinstance(type_, Device):
            type_, index = type_.type, type_.index
        try:
            hit = _INTERNED.get((type_, index))
        except TypeError:  # an unhashable argument: the checks below explain
            hit = None
        if hit is not None:
            return hit
        key = (type_, index)
        if not isinstance(type_, str):
            raise TypeError(f"device(): argument 'type' must be str, not {type(type_).__name__}")
        if ":" in type_:
            name, _, idx = type_.partition(":")
            if not (idx.isascii() and idx.isdigit()):  # torch: no sign, no second colon
                raise RuntimeError(f"Invalid device string: '{type_}'")
            type_, index = name, int(idx)
        if index is not None and index < 0:
            raise RuntimeError("Device index must not be negative")
        hit = _INTERNED.get((type_, index))  # "cpu:0" is the value of ("cpu", 0)
        if hit is not None:
            if len(_INTERNED) < 4096:
                _INTERNED[key] = hit
            return hit
        self = object.__new__(cls)
        if type_ in _PRIMITIVES:
            object.__setattr__(self, "prims", _PRIMITIVES[type_])
        elif type_ not in TORCH_DEVICE_TYPES:
            raise RuntimeError(f"Expected one of {', '.join(TORCH_DEVICE_TYPES)} device type at "
                               f"start of device string: {type_}")
        # else: a device value without primitives; `prims` stays unset (see __getattr__)
        object.__setattr__(self, "type", type_)
        object.__setattr__(self, "index", index)
        if type_ in _PRIMITIVES and len(_INTERNED) < 4096:
            _INTERNED[key] = _INTERNED[type_, index] = self
        return self

    def __getattr__(self, name):
        # Only reached for an unset slot: the primitives of a device type sbpflow lacks.
        if name == "prims":
            raise unavailable_error(self.type)
        raise AttributeError(f"'device' object has no attribute '{name}'")

    def __reduce__(self):
        return (Device, (self.type, self.index))

    def check_available(self) -> Device:
        """Raise torch's error if tensors cannot be made on this device; return self."""
        self.prims  # noqa: B018
        return self

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
    "TORCH_DEVICE_TYPES", "device_types", "primitives", "register_device", "unavailable_error",
]
