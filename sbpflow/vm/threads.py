"""How BLAS threads and VM workers share the cores.

In ASYNC mode the Python thread keeps issuing while the compute worker runs kernels, so BLAS
gets one core less than the machine has (at least one): the issuing thread and the BLAS pool
never fight over a core, and OpenBLAS's spinning threads don't starve the issuer.  In SYNC
mode kernels run on the Python thread, which otherwise sits idle during them, so BLAS gets
every core.  Nothing is changed when the user pinned threads themselves (OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS or MKL_NUM_THREADS set) or set SBPFLOW_BLAS_THREADS explicitly.
"""

from __future__ import annotations

import os

_USER_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_limiter = None


def blas_threads_for(mode_async: bool) -> int | None:
    """The BLAS thread count the policy picks, or None to leave BLAS alone."""
    explicit = os.environ.get("SBPFLOW_BLAS_THREADS")
    if explicit:
        return max(1, int(explicit))
    if any(v in os.environ for v in _USER_VARS):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    return max(1, cores - 1) if mode_async else cores


def apply_policy(mode_async: bool) -> int | None:
    """Set BLAS's thread count for the mode; returns the count set (None: untouched)."""
    global _limiter
    n = blas_threads_for(mode_async)
    if n is None:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the policy needs threadpoolctl; without it BLAS keeps its default
        return None
    _limiter = threadpool_limits(limits=n, user_api="blas")
    return n
