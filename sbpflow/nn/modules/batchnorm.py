"""torch.nn.modules.batchnorm's module path: the batch normalisation layers (defined in
normalization.py)."""

from __future__ import annotations

from .normalization import BatchNorm1d, BatchNorm2d, BatchNorm3d, _BatchNorm, _NormBase

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"]
_ = (_BatchNorm, _NormBase)  # torch's base classes live here too
