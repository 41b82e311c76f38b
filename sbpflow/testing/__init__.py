"""torch.testing: assert_close for tensors, NumPy arrays, scalars and nested sequences or
mappings of them, with torch's default tolerances and failure messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._core import dtype as dt
from ..framework.tensor import Tensor

__all__ = ["assert_close"]

# torch's default (rtol, atol) per dtype; exact comparison for integers and bool
_TOLERANCES = {
    dt.float16: (1e-3, 1e-5), dt.bfloat16: (1.6e-2, 1e-5), dt.float32: (1.3e-6, 1e-5),
    dt.float64: (1e-7, 1e-7),
}


class _Mismatch(Exception):
    def __init__(self, exc_type, message, path=()):
        super().__init__(message)
        self.exc_type, self.message, self.path = exc_type, message, path


def _dtype_of(x):
    if isinstance(x, Tensor):
        return x.dtype
    return dt.as_dtype(x.dtype)


def _tolerances(*dtypes):
    pairs = [_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(p[0] for p in pairs), max(p[1] for p in pairs)


def _host(x):
    return x.detach()._host() if isinstance(x, Tensor) else np.asarray(x)


def _item(v):
    return v.item() if hasattr(v, "item") else v


def _close(a, e, rtol, atol, equal_nan):
    if a.dtype == np.bool_ or e.dtype == np.bool_:
        return a == e
    with np.errstate(invalid="ignore", over="ignore"):
        ok = a == e
        if rtol or atol:
            af, ef = a.astype(np.float64), e.astype(np.float64)
            finite = np.isfinite(af) & np.isfinite(ef)
            ok = ok | (finite & (np.abs(af - ef) <= atol + rtol * np.abs(ef)))
        if equal_nan:
            ok = ok | (np.isnan(a.astype(np.float64)) & np.isnan(e.astype(np.float64)))
    return ok


def _argmax_nan(x):
    flat = x.reshape(-1)
    nan = np.flatnonzero(np.isnan(flat))
    return int(nan[0]) if nan.size else int(np.argmax(flat))


def _compare_tensors(actual, expected, rtol, atol, equal_nan, check_dtype, check_device):
    if tuple(actual.shape) != tuple(expected.shape):
        raise _Mismatch(AssertionError, f"The values for attribute 'shape' do not match: "
                        f"{actual.shape} != {expected.shape}.")
    if check_device and isinstance(actual, Tensor) and isinstance(expected, Tensor) and \
            actual._device != expected._device:  # _device: global tensors have no .device
        raise _Mismatch(AssertionError, f"The values for attribute 'device' do not match: "
                        f"{actual._device} != {expected._device}.")
    da, de = _dtype_of(actual), _dtype_of(expected)
    if check_dtype and da is not de:
        raise _Mismatch(AssertionError, f"The values for attribute 'dtype' do not match: "
                        f"{da} != {de}.")
    if rtol is None:
        rtol, atol = _tolerances(da, de)
    a, e = _host(actual), _host(expected)
    if a.dtype != e.dtype:  # compare in the common type, as torch promotes
        common = np.promote_types(a.dtype, e.dtype)
        a, e = a.astype(common), e.astype(common)
    ok = _close(a, e, rtol, atol, equal_nan)
    if ok.all():
        return
    exact = rtol == 0 and atol == 0
    if a.dtype.kind in "biu":
        work = np.float32  # torch divides in the default float dtype
        diff = np.abs(a.astype(np.int64) - e.astype(np.int64))
        denom = np.abs(e.astype(work))
    else:
        work = a.dtype if a.dtype.kind == "f" and a.dtype.itemsize >= 4 else np.float32
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a.astype(work) - e.astype(work))
        denom = np.abs(e.astype(work))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (diff / denom).astype(work)
    diff = np.where(ok, 0, diff)
    rel = np.where(ok, 0, rel)
    n_bad, n = int((~ok).sum()), ok.size
    i_abs, i_rel = _argmax_nan(diff), _argmax_nan(rel)
    idx_abs = tuple(int(i) for i in np.unravel_index(i_abs, ok.shape))
    idx_rel = tuple(int(i) for i in np.unravel_index(i_rel, ok.shape))
    abs_v = _item(diff.reshape(-1)[i_abs])
    rel_v = float(_item(rel.reshape(-1)[i_rel]))
    lines = [f"Tensor-likes are not {'equal' if exact else 'close'}!", "",
             f"Mismatched elements: {n_bad} / {n} ({100 * n_bad / n:.1f}%)"]
    if exact:
        lines += [f"Greatest absolute difference: {abs_v} at index {idx_abs}",
                  f"Greatest relative difference: {rel_v} at index {idx_rel}"]
    else:
        lines += [f"Greatest absolute difference: {abs_v} at index {idx_abs} (up to {atol} "
                  "allowed)",
                  f"Greatest relative difference: {rel_v} at index {idx_rel} (up to {rtol} "
                  "allowed)"]
    raise _Mismatch(AssertionError, "\n".join(lines))


def _compare_scalars(actual, expected, rtol, atol, equal_nan, check_dtype):
    if check_dtype and type(actual) is not type(expected):
        raise _Mismatch(AssertionError, f"The values for attribute 'dtype' do not match: "
                        f"{type(actual)} != {type(expected)}.")
    if rtol is None:
        floaty = isinstance(actual, float) or isinstance(expected, float)
        rtol, atol = (1e-7, 1e-7) if floaty else (0.0, 0.0)
    a, e = float(actual), float(expected)
    if a == e or (equal_nan and a != a and e != e):
        return
    if rtol or atol:
        if np.isfinite(a) and np.isfinite(e) and abs(a - e) <= atol + rtol * abs(e):
            return
    exact = rtol == 0 and atol == 0
    abs_d = abs(actual - expected)
    rel_d = abs_d / abs(expected) if expected else float("inf")
    lines = [f"Scalars are not {'equal' if exact else 'close'}!", "",
             f"Expected {expected} but got {actual}."]
    if exact:
        lines += [f"Absolute difference: {abs_d}", f"Relative difference: {rel_d}"]
    else:
        lines += [f"Absolute difference: {abs_d} (up to {atol} allowed)",
                  f"Relative difference: {rel_d} (up to {rtol} allowed)"]
    raise _Mismatch(AssertionError, "\n".join(lines))


def _is_scalar(x):
    return isinstance(x, (bool, int, float)) and not isinstance(x, Tensor)


def _compare(actual, expected, path, **kw):
    tensorish = (Tensor, np.ndarray)
    if isinstance(actual, tensorish) and isinstance(expected, tensorish):
        try:
            _compare_tensors(actual, expected, kw["rtol"], kw["atol"], kw["equal_nan"],
                             kw["check_dtype"], kw["check_device"])
        except _Mismatch as m:
            m.path = path
            raise
        return
    if _is_scalar(actual) and _is_scalar(expected):
        try:
            _compare_scalars(actual, expected, kw["rtol"], kw["atol"], kw["equal_nan"],
                             kw["check_dtype"])
        except _Mismatch as m:
            m.path = path
            raise
        return
    if isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            missing = sorted(set(expected) - set(actual), key=repr)
            extra = sorted(set(actual) - set(expected), key=repr)
            raise _Mismatch(AssertionError, "The keys of the mappings do not match:\n"
                            f"Missing keys in the actual mapping: {missing}\n"
                            f"Extra keys in the actual mapping: {extra}", path)
        for k in expected:
            _compare(actual[k], expected[k], (*path, k), **kw)
        return
    seq = (Sequence,)
    if isinstance(actual, seq) and isinstance(expected, seq) and not isinstance(
            actual, str) and not isinstance(expected, str):
        if len(actual) != len(expected):
            raise _Mismatch(AssertionError, f"The length of the sequences mismatch: "
                            f"{len(actual)} != {len(expected)}", path)
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, (*path, i), **kw)
        return
    raise _Mismatch(TypeError, f"No comparison pair was able to handle inputs of type "
                    f"{type(actual)} and {type(expected)}.", path)


def assert_close(actual, expected, *, allow_subclasses: bool = True, rtol=None, atol=None,
                 equal_nan: bool = False, check_device: bool = True, check_dtype: bool = True,
                 check_layout: bool = True, check_stride: bool = False, msg=None):
    """torch.testing.assert_close: |actual - expected| <= atol + rtol * |expected| elementwise
    (defaults by dtype, exact for integers), with equal shape, device and dtype."""
    if (rtol is None) != (atol is None):
        raise ValueError(f"Both 'rtol' and 'atol' must be either specified or omitted, but "
                         f"got no {'atol' if atol is None else 'rtol'}.")
    try:
        _compare(actual, expected, (), rtol=rtol, atol=atol, equal_nan=equal_nan,
                 check_dtype=check_dtype, check_device=check_device)
    except _Mismatch as m:
        message = m.message
        if m.exc_type is AssertionError and msg is not None:
            message = msg(message) if callable(msg) else msg
        elif m.path:
            message += "\n\nThe failure occurred for item " + "".join(
                f"[{p!r}]" for p in m.path)
        raise m.exc_type(message) from None
