"""Data parallelism over ranks (torch.nn.parallel)."""

from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
