"""sbpflow's collectives against raw mpi4py on the same buffers, side by side in one run.

Run: python benchmarks/collectives.py [--ranks 2] [--threads 1]
(it starts itself under this environment's mpiexec with --ranks processes; under an existing
`mpiexec -n N` it runs as it is).

For each op and size (4 KB, 1 MB, 64 MB of float32) it times `comm.world().<op>` and the
equivalent upper-case mpi4py call on MPI.COMM_WORLD, in alternating rounds (so drift hits
both), each round a loop between barriers timed by the slowest rank. It prints the median
time per call, the bandwidth ratio raw/sbpflow (the median of the per-round ratios; goal
>= 0.95 at >= 1 MB), the same from each one's best round, and the time sbpflow adds (goal
< 20 µs at 4 KB); then the software overhead alone, on MPI.COMM_SELF. all_gather and
reduce_scatter receive into preallocated buffers (`out=`), as the raw calls do. The
`flow.comm.all_reduce(t)` rows time the tensor-level call, which adds the host read (a VM
sync) and the framework's in-place write (`copy_`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
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
world = comm.world()
raw = MPI.COMM_WORLD
rank, size = raw.Get_rank(), raw.Get_size()

SIZES = smoke({"4 KB": 4 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}, {"4 KB": 4 << 10})


def iterations(nbytes: int) -> int:
    return smoke(max(3, min(2000, (1 << 30) // (nbytes * 16))), 2)


def loop_seconds(fn, n: int) -> float:
    """Seconds per call of fn over n calls, as seen by the slowest rank."""
    raw.Barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = np.array([(time.perf_counter() - t0) / n])
    raw.Allreduce(MPI.IN_PLACE, elapsed, MPI.MAX)
    return float(elapsed[0])


def compare(ours, theirs, nbytes: int) -> tuple[float, float, float, float, float]:
    """Median seconds per call of each, the median of the paired per-round ratios (raw/ours:
    adjacent rounds share the machine's load, so the pairs cancel its drift), and each one's
    best round (the least disturbed by other processes on a shared machine)."""
    n = iterations(nbytes)
    ours(), theirs()  # warm up (first-touch, MPI connection set-up)
    a, b = [], []
    for i in range(args.rounds):
        if i % 2:  # alternate which goes first, so neither always follows the other
            b.append(loop_seconds(theirs, n))
            a.append(loop_seconds(ours, n))
        else:
            a.append(loop_seconds(ours, n))
            b.append(loop_seconds(theirs, n))
    ratio = statistics.median(y / x for x, y in zip(a, b))
    return statistics.median(a), statistics.median(b), ratio, min(a), min(b)


def cases(nbytes: int):
    count = nbytes // 4
    x = np.ones(count, np.float32)
    y = np.ones(count, np.float32)
    per_rank = np.ones(count // size, np.float32)
    gathered = np.empty(count // size * size, np.float32)
    scattered = np.empty(count // size, np.float32)
    yield ("all_reduce", lambda: world.all_reduce(x),
           lambda: raw.Allreduce(MPI.IN_PLACE, [y, MPI.FLOAT], MPI.SUM))
    sizes = [count // size] * size
    ours_gathered, ours_scattered = np.empty_like(gathered), np.empty_like(scattered)
    yield ("all_gather", lambda: world.all_gather(per_rank, sizes=sizes, out=ours_gathered),
           lambda: raw.Allgather([per_rank, MPI.FLOAT], [gathered, MPI.FLOAT]))
    yield ("reduce_scatter", lambda: world.reduce_scatter(x, out=ours_scattered),
           lambda: raw.Reduce_scatter_block([y, MPI.FLOAT], [scattered, MPI.FLOAT], MPI.SUM))
    yield ("broadcast", lambda: world.broadcast(x, 0), lambda: raw.Bcast([y, MPI.FLOAT], 0))
    t = flow.ones(count)
    host = np.ones(count, np.float32)
    yield ("flow.comm.all_reduce(t)", lambda: flow.comm.all_reduce(t),
           lambda: raw.Allreduce(MPI.IN_PLACE, [host, MPI.FLOAT], MPI.SUM))


def self_overhead() -> list[tuple[str, float, float]]:
    """Per-call time on a communicator of this rank alone (MPI.COMM_SELF): the collective is a
    local copy, so the difference is the software added on top of mpi4py, free of the
    scheduling noise a peer brings."""
    from sbpflow.comm.mpi import MpiCommunicator

    solo_raw = MPI.COMM_SELF.Dup()
    solo = MpiCommunicator(MPI.COMM_SELF.Dup(), (rank,), "self", world._watchdog)
    x, y = np.ones(1024, np.float32), np.ones(1024, np.float32)
    out = np.empty(1024, np.float32)
    pairs = {
        "all_reduce": (lambda: solo.all_reduce(x),
                       lambda: solo_raw.Allreduce(MPI.IN_PLACE, [y, MPI.FLOAT], MPI.SUM)),
        "all_gather": (lambda: solo.all_gather(x, sizes=[1024], out=out),
                       lambda: solo_raw.Allgather([x, MPI.FLOAT], [out, MPI.FLOAT])),
        "reduce_scatter": (lambda: solo.reduce_scatter(x, out=out),
                           lambda: solo_raw.Reduce_scatter_block([x, MPI.FLOAT],
                                                                 [out, MPI.FLOAT], MPI.SUM)),
        "broadcast": (lambda: solo.broadcast(x, 0), lambda: solo_raw.Bcast([y, MPI.FLOAT], 0)),
    }
    result = []
    for name, (ours, theirs) in pairs.items():
        best = [min(timeit(fn) for _ in range(smoke(5, 1))) for fn in (ours, theirs)]
        result.append((name, *best))
    return result


def timeit(fn, n: int = smoke(5000, 20)) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


solo_rows = self_overhead()
rows = []
for label, nbytes in SIZES.items():
    for name, ours, theirs in cases(nbytes):
        rows.append((name, label, *compare(ours, theirs, nbytes)))

if rank == 0:
    level = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
             MPI.THREAD_SERIALIZED: "SERIALIZED", MPI.THREAD_MULTIPLE: "MULTIPLE"}
    names = ", ".join(t.name for t in threading.enumerate())
    print(f"{size} ranks, {threads} BLAS/OpenMP thread(s) per rank, "
          f"{threading.active_count()} Python threads per rank ({names}), "
          f"MPI thread level {level[MPI.Query_thread()]}, {MPI.Get_library_version().split()[2]}"
          f" MPICH, mpi4py {__import__('mpi4py').__version__}; median of {args.rounds} rounds")
    print()
    print("| op | size | sbpflow µs | mpi4py µs | ratio mpi4py/sbpflow | best-round ratio "
          "| best-round added µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, label, s_ours, s_raw, ratio, best_ours, best_raw in rows:
        print(f"| {name} | {label} | {s_ours * 1e6:.1f} | {s_raw * 1e6:.1f} | {ratio:.3f} | "
              f"{best_raw / best_ours:.3f} | {(best_ours - best_raw) * 1e6:+.1f} |")
    print()
    print("Software overhead per call, 4 KB, on MPI.COMM_SELF (no peer; best of 5 x 5000 calls):")
    print()
    print("| op | sbpflow µs | mpi4py µs | added µs |")
    print("|---|---:|---:|---:|")
    for name, ours, theirs in solo_rows:
        print(f"| {name} | {ours * 1e6:.2f} | {theirs * 1e6:.2f} | {(ours - theirs) * 1e6:+.2f} |")
