"""The `mock` device: CPU primitives behind opaque arrays, with a call counter.

A `MockArray` exposes only `.shape`, `.dtype` and `.ndim`.  Arithmetic, indexing and NumPy
conversion raise, so a kernel that bypasses the primitive layer fails loudly on this device.
Every primitive call is counted per name, so tests can see which primitives an op used.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

from .primitives import Primitives


class KernelBypassError(TypeError):
    """A kernel touched a device array without going through a primitive."""


class MockArray:
    __slots__ = ("_a",)

    def __init__(self, a):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)

    def _bypass(self, *args, **kwargs):
        raise KernelBypassError(
            "a kernel used a mock device array directly; kernels must go through primitives"
        )

    __array__ = __getitem__ = __setitem__ = __iter__ = __len__ = __float__ = __int__ = _bypass
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _bypass
    __rtruediv__ = __neg__ = __pow__ = __matmul__ = __lt__ = __gt__ = __le__ = __ge__ = _bypass
    __and__ = __or__ = __invert__ = __bool__ = __array_ufunc__ = __array_function__ = _bypass

    def __getattr__(self, name):
        raise KernelBypassError(
            f"a kernel read '.{name}' of a mock device array; only shape, dtype and ndim are "
            "visible to kernels"
        )


def _unwrap(x):
    if isinstance(x, MockArray):
        return x._a
    if isinstance(x, tuple):
        return tuple(_unwrap(v) for v in x)
    if isinstance(x, list):
        return [_unwrap(v) for v in x]
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return MockArray(x)
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    return x


class MockPrimitives(Primitives):
    name = "mock"

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def to_host(self, x):
        self.calls["to_host"] += 1
        return _unwrap(x)

    def direct_elementwise(self, op):
        return None  # every call goes through the counted primitives

    def direct_reduce(self, op, axes, keepdims):
        return None


def _counted(name):
    base = getattr(Primitives, name)

    @functools.wraps(base)
    def method(self, *args, **kwargs):
        self.calls[name] += 1
        return _wrap(base(self, *_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

    return method


_UNCOUNTED = ("to_host", "words_used", "release")
for _name, _value in vars(Primitives).items():
    if callable(_value) and not _name.startswith("_") and _name not in _UNCOUNTED:
        setattr(MockPrimitives, _name, _counted(_name))


def _release(self, arrays: list) -> None:
    self.calls["release"] += 1
    unwrapped = [_unwrap(arrays.pop()) for _ in range(len(arrays))]
    Primitives.release(self, unwrapped)


MockPrimitives.release = _release
