"""torch.utils.data.distributed's module path: DistributedSampler (defined in sampler.py)."""

from __future__ import annotations

from .sampler import DistributedSampler

__all__ = ["DistributedSampler"]
