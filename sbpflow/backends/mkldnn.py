"""torch.backends.mkldnn: sbpflow's CPU kernels are its own (NumPy/numba), not oneDNN's; the
`enabled` flag is kept as set."""

from __future__ import annotations

__all__ = ["enabled", "is_available"]

enabled = True


def is_available() -> bool:
    return False
