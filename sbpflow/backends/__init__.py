"""torch.backends: flags for the native backends torch can use.

sbpflow runs its own NumPy/numba kernels on the CPU, so no backend listed here is available;
the flags programs set (cudnn.benchmark, cuda.matmul.allow_tf32, ...) are accepted and kept,
and read back as set, as in torch's CPU build.
"""

from __future__ import annotations

from . import cuda, cudnn, mkl, mkldnn, mps, openmp

__all__ = ["cuda", "cudnn", "mkl", "mkldnn", "mps", "openmp"]
