"""Python numbers into a tensor's dtype, with torch's overflow rules.

torch.tensor stores each Python number on its own: an int must fit int64 ("Overflow when
unpacking long long", ValueError), then the target type ("value cannot be converted to type
uint8 without overflow", RuntimeError); a float into an integer type must be finite and in
range; an int into a float type must fit a double (OverflowError); anything goes into bool.
Unsigned targets take negative ints down to -max (they wrap, as two's complement), but not
negative floats. NumPy instead wraps, or makes an object array, or a float64 one (for
[1, 2**63]), so its array is only trusted after a vectorised range check; the exact,
element-by-element path below runs only when that check fails, and names the value.
"""

from __future__ import annotations

import numpy as np

from ..._core import dtype as dt

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
PY_SCALARS = frozenset((bool, int, float))
SEQS = frozenset((list, tuple))


def _int_range(dtype: dt.DType) -> tuple[int, int]:
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


def leaf_types(data) -> set | None:
    """The types of the leaves of a rectangular nested list/tuple, level by level with
    C-speed builtins (a Python loop per element would dominate tensor() of a long list);
    None where a level mixes sequences with other things or lengths differ (the general
    path then gives torch's errors)."""
    level = data
    while level:
        types = set(map(type, level))
        if not types <= SEQS:
            return None if types & SEQS else types
        if len(set(map(len, level))) > 1:
            return None
        level = [x for seq in level for x in seq]
    return set()  # empty at some depth: no leaves


def infer_python_dtype(types) -> dt.DType:
    """torch's inference for Python numbers: any float -> default dtype, else any int ->
    int64, else bool (an empty sequence is the default float dtype)."""
    if float in types or not types:
        return dt.get_default_dtype()
    if int in types:
        return dt.int64
    return dt.bool_


def checked_host(arr: np.ndarray, data, dtype: dt.DType, op: str,
                 floats_present: bool) -> np.ndarray:
    """`arr` (np.asarray(data)) if every value converts to `dtype` as torch converts it,
    else the exact conversion of `data` (or the error torch raises). `floats_present`:
    whether a Python float may be among the values (then an int target takes the exact
    path: NumPy's float array would have rounded the ints through a double, and a negative
    int may wrap into an unsigned type where a negative float may not)."""
    kind = arr.dtype.kind
    if kind not in "biuf":
        return exact_host(data, dtype, op)  # object: ints beyond 64 bits, or mixed
    if dtype is dt.bool_ or dtype.is_floating_point or kind == "b" or arr.size == 0:
        return arr  # any number is a bool; every int NumPy holds fits a double
    if kind == "i" and not floats_present:
        lo, hi = _int_range(dtype)
        amin, amax = int(arr.min()), int(arr.max())
        # negatives down to -max wrap into an unsigned type, as torch's checked_convert
        if (lo <= amin if lo < 0 else -hi <= amin) and amax <= hi:
            return arr
    # a float into an int type, a uint64 array (a value above int64's max), or a value out
    # of range: the exact path converts or raises naming the value
    return exact_host(data, dtype, op)


def exact_host(data, dtype: dt.DType, op: str) -> np.ndarray:
    """Element by element, as torch's store_scalar: slow, for the rare values the
    vectorised check could not clear."""
    obj = np.asarray(data, dtype=object)
    flat = obj.ravel()
    if dtype is dt.bool_:
        store = _to_bool
    elif dtype.is_floating_point:
        store = _to_float
    else:
        store = _int_store(dtype)
    out = []
    for i, v in enumerate(flat):
        try:
            out.append(store(v))
        except (ValueError, RuntimeError, OverflowError, TypeError) as e:
            shown = v.item() if isinstance(v, np.generic) else v
            index = [int(k) for k in np.unravel_index(i, obj.shape)]
            where = f" at index {index}" if obj.ndim else ""
            raise type(e)(f"{op}(): {e.args[0]}: the value {shown!r}{where}") from None
    np_dtype = np.float64 if dtype.is_floating_point else dtype.np
    return np.array(out, dtype=np_dtype).reshape(obj.shape)


def _to_bool(v):
    if isinstance(v, complex):
        return v != 0
    return bool(v)


def _to_float(v):
    if isinstance(v, (complex, np.complexfloating)):
        raise TypeError("must be real number, not complex")
    return float(v)  # an int above ~1.8e308: OverflowError "int too large to convert"


def _int_store(dtype: dt.DType):
    lo, hi = _int_range(dtype)
    unsigned = lo == 0
    modulus = hi + 1
    name = dtype.name

    def overflow():
        return RuntimeError(f"value cannot be converted to type {name} without overflow")

    flo, fhi = float(lo), float(hi)

    def store(v):
        if isinstance(v, (float, np.floating)):
            f = float(v)
            # torch compares the double with the limits as doubles (NaN fails both)
            if not (flo <= f <= fhi):
                raise overflow()
            i = int(f)
            # int64's max rounds up to 2**63 as a double, which passes the check; the C cast
            # then gives int64's min (x86), which is what torch returns
            return _INT64_MIN if i > _INT64_MAX else i
        if isinstance(v, (complex, np.complexfloating)):
            raise TypeError("'complex' object cannot be interpreted as an integer")
        i = int(v)  # bool, int, NumPy integer
        if not (_INT64_MIN <= i <= _INT64_MAX):
            raise ValueError("Overflow when unpacking long long")
        if unsigned:
            if i > hi or -i > hi:
                raise overflow()
            return i % modulus
        if not (lo <= i <= hi):
            raise overflow()
        return i

    return store
