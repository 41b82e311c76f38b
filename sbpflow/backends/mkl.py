"""torch.backends.mkl: sbpflow calls no MKL routines of its own."""

from __future__ import annotations

__all__ = ["is_available"]


def is_available() -> bool:
    return False
