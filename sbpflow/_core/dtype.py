"""dtypes and PyTorch's type-promotion rules.

A `DType` is a frozen, hashable value wrapping a NumPy dtype.  bfloat16 comes from ml_dtypes.
Promotion follows torch's `result_type`: dimensioned tensors outrank zero-dim tensors, which
outrank Python scalars, but a lower-priority operand still wins when its *category*
(bool < integer < floating) is higher.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

_BOOL, _INT, _FLOAT = 0, 1, 2


class DType:
    __slots__ = ("name", "np", "itemsize", "category", "is_signed", "_rank")

    def __init__(self, name: str, np_dtype, category: int, is_signed: bool, rank: int):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.itemsize = self.np.itemsize
        self.category = category
        self.is_signed = is_signed
        self._rank = rank

    @property
    def is_floating_point(self) -> bool:
        return self.category == _FLOAT

    @property
    def is_complex(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"sbpflow.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


bool_ = DType("bool", np.bool_, _BOOL, False, 0)
uint8 = DType("uint8", np.uint8, _INT, False, 1)
int8 = DType("int8", np.int8, _INT, True, 1)
int16 = DType("int16", np.int16, _INT, True, 2)
int32 = DType("int32", np.int32, _INT, True, 3)
int64 = DType("int64", np.int64, _INT, True, 4)
float16 = DType("float16", np.float16, _FLOAT, True, 1)
bfloat16 = DType("bfloat16", ml_dtypes.bfloat16, _FLOAT, True, 1)
float32 = DType("float32", np.float32, _FLOAT, True, 2)
float64 = DType("float64", np.float64, _FLOAT, True, 3)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
FLOATING = (float16, bfloat16, float32, float64)
INTEGRAL = (uint8, int8, int16, int32, int64)

_NAMES = {d.name: d for d in ALL}
_NAMES.update(
    {"float": float32, "double": float64, "half": float16, "long": int64, "int": int32,
     "short": int16, "bool_": bool_}
)
_FROM_NP = {d.np: d for d in ALL}

_default_float = float32


def _by_name(name: str) -> DType:
    return _NAMES[name]


def get_default_dtype() -> DType:
    return _default_float


def set_default_dtype(d: DType) -> None:
    global _default_float
    if not isinstance(d, DType) or not d.is_floating_point:
        raise TypeError(f"set_default_dtype(): only floating-point dtypes are allowed, got {d}")
    _default_float = d


def from_numpy(np_dtype) -> DType:
    """Map a NumPy dtype to a DType; raise TypeError for unsupported ones."""
    d = _FROM_NP.get(np.dtype(np_dtype))
    if d is None:
        raise TypeError(
            f"can't convert np.ndarray of type {np.dtype(np_dtype)}. The only supported types "
            "are: float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, and bool."
        )
    return d


def as_dtype(obj) -> DType:
    """Accept a DType, a NumPy dtype, a Python type or a name."""
    if isinstance(obj, DType):
        return obj
    if obj is float:
        return _default_float
    if obj is int:
        return int64
    if obj is bool:
        return bool_
    if isinstance(obj, str) and obj in _NAMES:
        return _NAMES[obj]
    try:
        return from_numpy(obj)
    except TypeError:
        raise TypeError(f"expected a dtype, got {obj!r}") from None


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types for two dtypes."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == _FLOAT:
        if a._rank == b._rank:  # float16 with bfloat16
            return float32
        return a if a._rank > b._rank else b
    if a.category == _INT:
        if a.is_signed == b.is_signed:
            return a if a._rank > b._rank else b
        u, s = (a, b) if not a.is_signed else (b, a)
        return s if s._rank > u._rank else int16  # uint8 with int8 -> int16
    return a


def scalar_dtype(value) -> DType:
    """The dtype a wrapped Python scalar contributes (float -> default dtype, as torch)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int64
    if isinstance(value, float):
        return _default_float
    raise TypeError(f"expected a Python number, got {type(value).__name__}")


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.category == _FLOAT:
        return higher
    if higher is bool_ or lower.category == _FLOAT:
        return promote_types(higher, lower)
    return higher


def result_type(dim: list[DType], zero: list[DType], scalars: list[DType]) -> DType:
    """torch.result_type from the dtypes of dimensioned tensors, 0-dim tensors and scalars."""
    states = []
    for group in (dim, zero, scalars):
        r = None
        for d in group:
            r = d if r is None else promote_types(r, d)
        states.append(r)
    out = _combine(states[0], _combine(states[1], states[2]))
    assert out is not None
    return out


def can_cast(src: DType, dst: DType) -> bool:
    """torch.can_cast: no lowering of category (float->int, int->bool)."""
    return src.category <= dst.category
