"""The cost of the default divergence check: per collective and per global op, check on
against check off, side by side in one run.

Run: python benchmarks/divergence_check.py [--ranks 2] [--threads 1] [--rounds 9]
(it starts itself under this environment's mpiexec with --ranks processes; one BLAS/OpenMP
thread per rank unless --threads says otherwise).

Four settings of `sbpflow.comm.set_divergence_check` / `set_full_check`, switched together
on every rank between rounds: "off"; "hash only" (every call fingerprinted, none compared:
the bookkeeping alone); "sampled" (the default: every call fingerprinted, the
first 64 calls of a sequence and then one in 64 compared across ranks; the timed loops run
far past the first 64); "every call" (the debug mode, SBPFLOW_CHECK_GLOBAL=1's schedule for
collectives, without the full global-op check). Rounds alternate the settings so that drift
hits all of them; each round is a loop between barriers timed by the slowest rank. It prints
the median time per call, the ratio to "off" (the median of per-round ratios) and the ratio
of the best rounds (the least disturbed by other processes on a shared machine).

Cases: `comm.world().all_reduce` of 8 B, 4 KB and 1 MB of float32 (the array collective:
the check's bookkeeping against MPI's own latency), `flow.comm.all_reduce(t)` of 4 KB (the
tensor-level call), and global ops on 2 ranks: an add of broadcast 4x4 tensors (no
communication: the op's own overhead is what the check adds to) and a split tensor boxed
to broadcast (`to_global`, S(0) -> B: an all-gather on the comm stream). Last, an all_reduce
on a communicator of one rank (MPI.COMM_SELF): the check's software cost without a peer's
scheduling noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, run_under_mpiexec, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--ranks", type=int, default=2)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--rounds", type=int, default=smoke(9, 1))
args = parser.parse_args()
threads = pin_threads(args.threads)

run_under_mpiexec(args.ranks)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpflow as flow  # noqa: E402
import sbpflow.distributed  # noqa: E402, F401  (flow.comm's tensor functions)
from sbpflow import comm  # noqa: E402

after_import_pin(threads)
flow.env.check_global_consistency(False)  # the full global-op check is not what is measured
world = comm.world()
raw = MPI.COMM_WORLD
rank, size = raw.Get_rank(), raw.Get_size()

DEFAULT = {"first": comm.communicator.DEFAULT_FIRST, "every": comm.communicator.DEFAULT_EVERY}
SETTINGS = {
    "off": lambda: comm.set_divergence_check(False),
    # Every call fingerprinted, none compared: the bookkeeping alone.
    "hash only": lambda: (comm.set_divergence_check(True, first=0, every=1 << 62),
                          comm.set_full_check(False)),
    "sampled": lambda: (comm.set_divergence_check(True, **DEFAULT), comm.set_full_check(False)),
    "every call": lambda: (comm.set_divergence_check(True, **DEFAULT), comm.set_full_check(True)),
}


def loop_seconds(fn, n: int) -> float:
    """Seconds per call of fn over n calls, as seen by the slowest rank."""
    flow.synchronize()
    raw.Barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    flow.synchronize()
    elapsed = np.array([(time.perf_counter() - t0) / n])
    raw.Allreduce(MPI.IN_PLACE, elapsed, MPI.MAX)
    return float(elapsed[0])


def measure(fn, n: int) -> dict:
    """Median seconds per call under each setting, and the median per-round ratio to off."""
    for setting in SETTINGS.values():  # warm up under each (caches, first-call checks)
        setting()
        for _ in range(smoke(100, 2)):
            fn()
    times = {name: [] for name in SETTINGS}
    names = list(SETTINGS)
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            SETTINGS[name]()
            times[name].append(loop_seconds(fn, n))
    SETTINGS["sampled"]()
    # (median s per call, median of the per-round ratios to off, best round's ratio: the
    # least disturbed rounds of each, on a shared machine)
    return {name: (statistics.median(ts),
                   statistics.median(t / o for t, o in zip(ts, times["off"])),
                   min(ts) / min(times["off"]))
            for name, ts in times.items()}


def cases():
    for label, nbytes, n in (("8 B", 8, 2000), ("4 KB", 4 << 10, 2000), ("1 MB", 1 << 20, 200)):
        x = np.ones(nbytes // 4, np.float32)
        yield f"world.all_reduce {label}", (lambda x=x: world.all_reduce(x)), n
    t = flow.ones(1024)
    yield "flow.comm.all_reduce(t) 4 KB", (lambda: flow.comm.all_reduce(t)), 1000
    placement = flow.placement("cpu", list(range(size)))
    a = flow.ones(4, 4).to_global(placement, flow.sbp.broadcast)
    b = flow.ones(4, 4).to_global(placement, flow.sbp.broadcast)
    yield "global add (B, B) 4x4", (lambda: flow.add(a, b)), 2000
    s = flow.ones(4, 4).to_global(placement, flow.sbp.split(0))
    yield f"to_global S(0)->B {4 * size}x4", (lambda: s.to_global(placement,
                                                                flow.sbp.broadcast)), 1000


def solo_cases():
    """The check's own software cost, free of a peer's scheduling noise: a communicator of
    this rank alone (MPI.COMM_SELF), where a collective is a local copy."""
    from sbpflow.comm.mpi import MpiCommunicator

    solo = MpiCommunicator(MPI.COMM_SELF.Dup(), (rank,), "self", world._watchdog)
    x = np.ones(2, np.float32)
    yield "all_reduce 8 B on COMM_SELF", (lambda: solo.all_reduce(x)), 5000


rows = [(name, measure(fn, smoke(n, 3))) for name, fn, n in cases()]
rows += [(name, measure(fn, smoke(n, 3))) for name, fn, n in solo_cases()]
if rank == 0:
    print(f"divergence check overhead: {size} ranks, {threads} BLAS/OpenMP thread(s), "
          f"{args.rounds} rounds; median µs per call, and the ratio to the check off")
    print("columns per setting: median µs, median ratio to off, best-round ratio to off")
    print(f"{'case':30s} {'off':>8s}" + "".join(f" {k:>22s}" for k in SETTINGS if k != "off"))
    for name, r in rows:
        print(f"{name:30s} {r['off'][0] * 1e6:8.1f}" + "".join(
            f" {r[k][0] * 1e6:8.1f} {r[k][1]:6.3f} {r[k][2]:6.3f}" for k in SETTINGS
            if k != "off"))
