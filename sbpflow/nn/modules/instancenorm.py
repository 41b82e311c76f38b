"""torch.nn.modules.instancenorm's module path: the instance normalisation layers (defined in
normalization.py)."""

from __future__ import annotations

from .normalization import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, _InstanceNorm

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]
_ = _InstanceNorm  # torch's base class lives here too
