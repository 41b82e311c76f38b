"""Shared benchmark helpers: thread pinning and a robust timer.

Threads are pinned before NumPy or torch load: set the environment variables first, then
import.  Every benchmark prints the thread count it used.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path


def pin_threads(n: int = 1) -> int:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    return n


def after_import_pin(n: int) -> None:
    """Pin again through the libraries' own APIs (env vars only act before loading)."""
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:
        pass


def time_us(fn, min_time: float = 0.2, repeats: int = 5, sync=None) -> float:
    """Median over `repeats` of the mean time per call (µs), each run lasting ~min_time.

    `sync` (e.g. sbpflow.synchronize) ends every timed run, so asynchronous work counts."""
    sync = sync or (lambda: None)
    fn()
    sync()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        dt = time.perf_counter() - t0
        if dt > min_time / 5:
            break
        n *= 4
    per_run = max(1, int(n * (min_time / 5) / dt * 5 / repeats) if dt else n)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_run):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / per_run * 1e6)
    return statistics.median(samples)


def run_under_mpiexec(ranks: int) -> None:
    """Restart this script under the project's mpiexec with `ranks` processes, unless it
    already runs in an MPI launch (then return at once)."""
    from sbpflow.comm import env as comm_env  # reads the environment only: no MPI yet

    if not comm_env.is_multi_process():
        mpiexec = str(Path(sys.executable).parent / "mpiexec")
        os.execv(mpiexec, [mpiexec, "-n", str(ranks), sys.executable, *sys.argv])
