"""How BLAS threads and VM workers share the cores.

BLAS gets one core less than the machine has (at least one), in both VM modes: in ASYNC mode the
Python thread keeps issuing while the compute worker runs kernels, so the issuing thread and the
BLAS pool never fight over a core, and OpenBLAS's spinning threads don't starve the issuer.
SYNC mode keeps the same count because a GEMM's result can depend on its thread count (OpenBLAS
0.3.31 on AMD EPYC: 96x96 float32 and larger differ in the last bits between 1 and 2 threads),
and switching to SYNC to debug must not change the numbers.  Nothing is changed when the user
pinned threads themselves (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS or MKL_NUM_THREADS set) or set
SBPFLOW_BLAS_THREADS explicitly.
"""

from __future__ import annotations

import os

_USER_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_limiter = None


def blas_threads_for() -> int | None:
    """The BLAS thread count the policy picks, or None to leave BLAS alone."""
    explicit = os.environ.get("SBPFLOW_BLAS_THREADS")
    if explicit:
        return max(1, int(explicit))
    if any(v in os.environ for v in _USER_VARS):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, cores - 1)


def apply_policy() -> int | None:
    """Set BLAS's thread count; returns the count set (None: untouched)."""
    global _limiter
    n = blas_threads_for()
    if n is None:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the policy needs threadpoolctl; without it BLAS keeps its default
        return None
    _limiter = threadpool_limits(limits=n, user_api="blas")
    return n
