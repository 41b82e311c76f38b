"""Printing tensors exactly the way torch does.

The rules, reproduced from observing torch's output:

- One format is chosen for the whole tensor (from the elements actually shown, so a summarised
  tensor's hidden middle does not influence it) and every element is right-aligned to the
  widest one.
- Floats: if every finite non-zero value is a whole number, they print as `3.` ("integer
  mode"); otherwise with `precision` decimals.  Scientific notation takes over when the finite
  non-zero magnitudes span more than a factor 1000, exceed 1e8, or (outside integer mode) go
  below 1e-4.  `set_printoptions(sci_mode=...)` forces it either way.
- A tensor with more than `threshold` elements is summarised: every axis longer than
  2 * `edgeitems` shows its first and last `edgeitems` entries around `...`.
- Rows of a vector wrap to fit `linewidth`; nested brackets indent by one column per level and
  sub-tensors of rank k are separated by k - 1 blank lines.
- Suffixes (`device=`, `size=`, `dtype=`, `grad_fn=` / `requires_grad=True`) follow the data,
  each moving to a new line when it would overflow `linewidth`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from .._core import dtype as dt


@dataclasses.dataclass
class _PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


_OPTS = _PrintOptions()

_PROFILES = {
    "default": dict(precision=4, threshold=1000, edgeitems=3, linewidth=80),
    "short": dict(precision=2, threshold=1000, edgeitems=2, linewidth=80),
    "full": dict(precision=4, threshold=math.inf, edgeitems=3, linewidth=80),
}


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None) -> None:
    """torch.set_printoptions: unspecified options keep their value, except `sci_mode`,
    which is always set (None restores the automatic choice), as in torch."""
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(
                f"set_printoptions(): argument 'profile' must be one of {sorted(_PROFILES)}, "
                f"got {profile!r}"
            )
        for key, value in _PROFILES[profile].items():
            setattr(_OPTS, key, value)
    for key, value in (("precision", precision), ("threshold", threshold),
                       ("edgeitems", edgeitems), ("linewidth", linewidth)):
        if value is not None:
            setattr(_OPTS, key, value)
    _OPTS.sci_mode = sci_mode


def get_printoptions() -> dict:
    """torch.get_printoptions: the current options as a dict."""
    return dataclasses.asdict(_OPTS)


@contextlib.contextmanager
def printoptions(**kwargs):
    """Temporarily change print options (torch._tensor_str.printoptions)."""
    saved = dataclasses.replace(_OPTS)
    set_printoptions(**kwargs)
    try:
        yield
    finally:
        for field in dataclasses.fields(_OPTS):
            setattr(_OPTS, field.name, getattr(saved, field.name))


# -- element formatting ----------------------------------------------------------------------
class _ElementFormat:
    """The single format shared by all elements of one tensor, and its column width."""

    def __init__(self, shown: np.ndarray, is_float: bool):
        self.is_float = is_float
        self.whole = True  # floats: every finite non-zero value is a whole number
        self.sci = False
        self.width = 1
        values = shown.reshape(-1)
        if not is_float:
            for v in values.tolist():
                self.width = max(self.width, len(str(v)))
            return
        finite_nonzero = values[np.isfinite(values) & (values != 0)]
        if finite_nonzero.size == 0:
            # Zeros, infs and nans only: torch keeps integer mode even under sci_mode=True.
            return
        magnitudes = np.abs(finite_nonzero)
        lo, hi = float(magnitudes.min()), float(magnitudes.max())
        self.whole = bool(np.all(finite_nonzero == np.ceil(finite_nonzero)))
        wide_range = hi / lo > 1000.0 or hi > 1.0e8
        if _OPTS.sci_mode is not None:
            self.sci = _OPTS.sci_mode
        else:
            self.sci = wide_range if self.whole else (wide_range or lo < 1.0e-4)
        samples = finite_nonzero.tolist()
        if self.sci:
            self.width = max(len(self._sci(v)) for v in samples)
        elif self.whole:
            self.width = max(len(f"{v:.0f}") + 1 for v in samples)
        else:
            self.width = max(len(self._fixed(v)) for v in samples)

    @staticmethod
    def _sci(v: float) -> str:
        return f"{v:.{_OPTS.precision}e}"

    @staticmethod
    def _fixed(v: float) -> str:
        return f"{v:.{_OPTS.precision}f}"

    def __call__(self, v) -> str:
        if not self.is_float:
            text = str(v)
        elif self.sci:
            text = self._sci(v)
        elif self.whole:
            text = f"{v:.0f}"
            if math.isfinite(v):
                text += "."
        else:
            text = self._fixed(v)
        return text.rjust(self.width)


# -- layout ----------------------------------------------------------------------------------
# A summarised tensor is formatted from its shown part only (so printing a huge tensor copies
# little); `elided[k]` says whether axis k was cut to `edgeitems` on each side of "...".
def _shown_part(a: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]:
    """The elements a summarised print shows, and which axes were cut."""
    e = _OPTS.edgeitems
    elided = tuple(n > 2 * e for n in a.shape)
    for axis, cut in enumerate(elided):
        if cut:
            n = a.shape[axis]
            a = np.take(a, list(range(e)) + list(range(n - e, n)), axis=axis)
    return a, elided


def _format_vector(v: np.ndarray, indent: int, elided: bool, fmt: _ElementFormat) -> str:
    items = [fmt(x) for x in v.tolist()]
    e = _OPTS.edgeitems
    if elided and e == 0:
        items = ["..."]  # torch's spelling when no edge items are shown
    elif elided:
        items = items[:e] + [" ..."] + items[e:]
    per_line = max(1, (_OPTS.linewidth - indent) // (fmt.width + 2))
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _format_array(a: np.ndarray, indent: int, elided: tuple[bool, ...],
                  fmt: _ElementFormat) -> str:
    if a.ndim == 0:
        return fmt(a.item())
    if a.ndim == 1:
        return _format_vector(a, indent, elided[0], fmt)
    rows = [_format_array(a[i], indent + 1, elided[1:], fmt) for i in range(a.shape[0])]
    if elided[0]:
        e = _OPTS.edgeitems
        rows = rows[:e] + ["..."] + rows[e:]
    separator = "," + "\n" * (a.ndim - 1) + " " * (indent + 1)
    return "[" + separator.join(rows) + "]"


def _data_str(t, indent: int) -> str:
    host = np.asarray(t._host())
    if host.size > _OPTS.threshold:
        host, elided = _shown_part(host)
    else:
        elided = (False,) * host.ndim
    is_float = t.dtype.is_floating_point
    # Every float dtype converts exactly to float64, so values print with full fidelity.
    values = host.astype(np.float64) if is_float else host
    fmt = _ElementFormat(values, is_float)
    return _format_array(values, indent, elided, fmt)


def _join_suffixes(body: str, suffixes: list[str], indent: int) -> str:
    parts = [body]
    # torch measures the last line as its length plus two (the ", " to come), and a
    # one-line body counts the same way; matching this keeps the wrap points identical.
    line_len = len(body) - body.rfind("\n") + 1
    for suffix in suffixes:
        # Wrap where torch wraps: measure a suffix as torch spells it ("torch.float64").
        width = len(suffix.replace(_DTYPE_PREFIX, "torch."))
        if line_len + width + 2 > _OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            line_len = indent + width
        else:
            parts.append(", " + suffix)
            line_len += width + 2
    return "".join(parts) + ")"


_DTYPE_PREFIX = "sbpflow."


def _dtype_name(d) -> str:
    return _DTYPE_PREFIX + d.name


def tensor_repr(t) -> str:
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if t.is_global:
        # OneFlow prints a global tensor's logical value, then where it lives.
        suffixes.append(f"placement={t.placement}")
        suffixes.append(f"sbp={_sbp_str(t.sbp)}")
    elif t.device.type != "cpu":
        suffixes.append(f"device='{t.device}'")
    # The dtypes torch.tensor infers from data are left implicit; an empty tensor has no data
    # to infer from, so only the default float dtype is.
    implicit_dtype = t.dtype in (dt.get_default_dtype(), dt.int64, dt.bool_)
    if t.numel() == 0:
        implicit_dtype = t.dtype is dt.get_default_dtype()
        if t.ndim != 1:
            suffixes.append(f"size={tuple(t.shape)}")
        body = "[]"
    else:
        if not _OPTS.edgeitems:
            suffixes.append(f"size={tuple(t.shape)}")
        body = _data_str(t, indent)
    if not implicit_dtype:
        suffixes.append(f"dtype={_dtype_name(t.dtype)}")
    grad_fn = t.grad_fn
    if grad_fn is not None:
        suffixes.append(f"grad_fn=<{grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _join_suffixes(prefix + body, suffixes, indent)


def _sbp_str(sbp) -> str:
    return "(" + ", ".join(map(repr, sbp)) + ("," if len(sbp) == 1 else "") + ")"


__all__ = ["get_printoptions", "printoptions", "set_printoptions", "tensor_repr"]
