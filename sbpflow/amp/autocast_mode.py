"""torch.amp.autocast_mode: autocast, as torch 2.13's CPU-only build behaves.

sbpflow has no mixed-precision op policy yet.  For device_type="cuda" (no CUDA here) torch
warns and disables itself, and so does this; for device_type="cpu" an enabled autocast raises
NotImplementedError instead of silently running in float32.
"""

from __future__ import annotations

import functools
import warnings

from .._core import dtype as dt
from ..device import TORCH_DEVICE_TYPES, Device

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available"]

_DEFAULT_DTYPE = {"cpu": dt.bfloat16, "cuda": dt.float16}


def is_autocast_available(device_type: str) -> bool:
    """torch: whether autocast has a policy for device_type (cpu and cuda do in torch)."""
    return device_type in ("cpu", "cuda")


def _not_implemented() -> NotImplementedError:
    return NotImplementedError(
        "autocast(device_type='cpu'): automatic mixed precision (AMP) is not implemented yet "
        "in sbpflow; run in full precision (drop autocast) or pass enabled=False")


class autocast:  # noqa: N801 - torch's name
    """torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)."""

    def __init__(self, device_type: str, dtype=None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if device_type not in TORCH_DEVICE_TYPES:
            Device(device_type)  # torch's "Expected one of ... device type" RuntimeError
        self.device = device_type
        self.fast_dtype = _DEFAULT_DTYPE.get(device_type, dt.float16) if dtype is None else dtype
        self._cache_enabled = True if cache_enabled is None else cache_enabled
        self._enabled = bool(enabled)
        if not self._enabled:
            return
        if device_type == "cuda":
            warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast.",
                          UserWarning, stacklevel=2)
            self._enabled = False
        elif device_type == "cpu":
            raise _not_implemented()
        else:
            warnings.warn(f"User specified an unsupported autocast device_type '{device_type}'",
                          UserWarning, stacklevel=2)
            self._enabled = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        return False

    def __call__(self, func):
        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)

        return decorate_autocast


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """Autocast never runs in sbpflow (see autocast): False for every device type."""
    return False


def get_autocast_dtype(device_type: str):
    return _DEFAULT_DTYPE.get(device_type, dt.float16)


def custom_fwd(fwd=None, *, device_type: str, cast_inputs=None):
    """torch.amp.custom_fwd for autograd.Function.forward.  Autocast is never active in
    sbpflow, so the forward runs as written (torch does the same outside autocast)."""
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        return fwd(*args, **kwargs)

    return decorate_fwd


def custom_bwd(bwd=None, *, device_type: str):
    """torch.amp.custom_bwd for autograd.Function.backward (a pass-through, see custom_fwd)."""
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")

    @functools.wraps(bwd)
    def decorate_bwd(*args, **kwargs):
        return bwd(*args, **kwargs)

    return decorate_bwd
