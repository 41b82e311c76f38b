"""Shared benchmark helpers: thread pinning, a robust timer, and the smoke switch.

Threads are pinned before NumPy or torch load: set the environment variables first, then
import.  Every benchmark prints the thread count it used.

Smoke runs: `--smoke` on any benchmark's command line (or SBPFLOW_BENCH_SMOKE=1) runs it with
its smallest settings (tiny sizes, one round, a few calls), to check that it runs to the end
and prints its table, not to measure anything. Each benchmark picks its smoke settings with
`smoke(normal, small)`; options given explicitly still win. The flag travels to the ranks of
a multi-rank benchmark as the environment variable (mpiexec passes the environment on).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

SMOKE_ENV = "SBPFLOW_BENCH_SMOKE"
# Taken off the command line here, before any benchmark's argparse sees it, so that every
# benchmark accepts it without an option of its own.
if "--smoke" in sys.argv[1:]:
    sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if a != "--smoke"]
    os.environ[SMOKE_ENV] = "1"
SMOKE = os.environ.get(SMOKE_ENV, "").strip() not in ("", "0")


def smoke(normal, small):
    """`small` in a smoke run, else `normal`: a benchmark's setting (a default, a size)."""
    return small if SMOKE else normal


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
    repeats = smoke(repeats, 1)
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
