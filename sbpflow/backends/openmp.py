"""torch.backends.openmp: sbpflow's kernels do not run on an OpenMP runtime of their own."""

from __future__ import annotations

__all__ = ["is_available"]


def is_available() -> bool:
    return False
