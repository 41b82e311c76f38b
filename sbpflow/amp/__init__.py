"""torch.amp: autocast and GradScaler (see autocast_mode.py and grad_scaler.py for what runs
on a machine without CUDA)."""

from __future__ import annotations

from . import autocast_mode, grad_scaler
from .autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "autocast_mode", "custom_bwd", "custom_fwd",
           "grad_scaler", "is_autocast_available"]
