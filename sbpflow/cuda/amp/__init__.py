"""torch.cuda.amp: the deprecated CUDA spellings of torch.amp's autocast and GradScaler."""

from __future__ import annotations

from . import autocast_mode, common, grad_scaler
from .autocast_mode import autocast, custom_bwd, custom_fwd
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "autocast_mode", "common", "custom_bwd", "custom_fwd",
           "grad_scaler"]
