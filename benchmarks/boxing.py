"""Boxing transitions (`BoxingRoute.run`) against the raw mpi4py / NumPy work they do, side by side.

The companion `global_overhead.py` measures the eager overhead of a global op against the same
op on a local tensor.

Run: python benchmarks/boxing.py [--ranks 2] [--threads 1] [--rounds 9]
(it starts itself under this environment's mpiexec with --ranks processes; under an existing
`mpiexec -n 2 python benchmarks/boxing.py` it runs as it is).

For each 1-D transition on placement [0, 1] (P->B, P->S(0), S(0)->B, S(0)->S(1), B->S(0),
S(0)->P, B->P) and a move between placements ([0] -> [1], B), at 1 MB and 64 MB of float32,
it times `BoxingRoute.run` and the raw equivalent on the same input buffers: the upper-case mpi4py
collective it uses, receiving into a preallocated buffer (Allreduce, Reduce_scatter_block,
Allgather, Alltoall, Send/Recv), or the NumPy copy a local step amounts to. Rounds alternate
(so drift hits both), each a loop between barriers timed by the slowest rank; the table shows
the median time per call and the median of the per-round ratios boxing/raw (1.0 = no cost
added).

Boxing returns a fresh array each call; here, as the VM does when a tensor dies, each result
is handed back to the device's caching allocator, so the next call reuses its buffer. The
"fresh" column is the ratio when results are simply dropped (every call faults in new pages).
S(0)->S(1)'s raw baseline sends a pre-packed buffer; the "raw+pack" row adds the NumPy copy
that puts each destination's columns end to end, which boxing does too (no MPI datatypes).
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

from sbpflow import comm  # noqa: E402
from sbpflow._core import dtype as D  # noqa: E402
from sbpflow._core.meta import TensorMeta  # noqa: E402
from sbpflow.device import primitives  # noqa: E402
from sbpflow.sbp import B, P, S, boxing, local_shape, placement  # noqa: E402

after_import_pin(threads)
world = comm.world()
raw = MPI.COMM_WORLD
rank, size = raw.Get_rank(), raw.Get_size()
if size != 2:
    raise SystemExit(f"boxing.py runs on 2 ranks, got {size}")
prims = primitives("cpu")
SIZES = smoke({"1 MB": 1 << 20, "64 MB": 64 << 20}, {"64 KB": 64 << 10})
F = MPI.FLOAT


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


def compare(fns, nbytes: int):
    """Median seconds per call of each fn, and the median per-round ratio of each to the last
    (the raw baseline): adjacent rounds share the machine's load, so the pairs cancel drift."""
    n = iterations(nbytes)
    for fn in fns:
        fn()  # warm up: first touch, MPI connections, the route's prepared closures
    times = [[] for _ in fns]
    for i in range(args.rounds):
        order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
        for k in order:
            times[k].append(loop_seconds(fns[k], n))
    ratios = [statistics.median(a / b for a, b in zip(t, times[-1])) for t in times[:-1]]
    return [statistics.median(t) for t in times], ratios


def boxed(route, x):
    """BoxingRoute.run, its result handed back to the allocator as the VM does when it dies."""
    def run():
        result = [route.run(x, world)]
        prims.release(result)
    return run


def dropped(route, x):
    return lambda: route.run(x, world)


def cases(nbytes: int):
    side = int(round((nbytes // 4) ** 0.5))  # a square float32 matrix of nbytes
    meta = TensorMeta((side, side), D.float32)
    both = placement("cpu", [0, 1])
    half = side // 2

    def piece(sbp):
        shape = local_shape(meta.shape, both, (sbp,), rank)
        return np.ones(shape, np.float32)

    def route(src, dst, src_pl=both, dst_pl=both):
        return boxing.route(meta, src_pl, (src,), dst_pl, (dst,))

    full, rows = piece(B), piece(S(0))
    out_full, out_rows = np.empty_like(full), np.empty_like(rows)

    x = full
    yield ("P->B", route(P, B), x,
           lambda: raw.Allreduce([x, F], [out_full, F], MPI.SUM), "Allreduce")
    yield ("P->S(0)", route(P, S(0)), x,
           lambda: raw.Reduce_scatter_block([x, F], [out_rows, F], MPI.SUM),
           "Reduce_scatter_block")
    yield ("S(0)->B", route(S(0), B), rows,
           lambda: raw.Allgather([rows, F], [out_full, F]), "Allgather")
    packed = np.ascontiguousarray(rows.reshape(half, 2, half).transpose(1, 0, 2))
    out_cols = np.empty((side, half), np.float32)
    yield ("S(0)->S(1)", route(S(0), S(1)), rows,
           lambda: raw.Alltoall([packed, F], [out_cols, F]), "Alltoall (pre-packed)")

    def pack_and_send():
        np.copyto(packed, rows.reshape(half, 2, half).transpose(1, 0, 2))
        raw.Alltoall([packed, F], [out_cols, F])

    yield ("S(0)->S(1)", route(S(0), S(1)), rows, pack_and_send, "raw+pack: copy + Alltoall")
    lo = rank * half
    yield ("B->S(0)", route(B, S(0)), full,
           lambda: np.copyto(out_rows, full[lo:lo + half]), "NumPy slice copy")

    def pad():
        out_full.fill(0)
        out_full[lo:lo + half] = rows

    yield ("S(0)->P", route(S(0), P), rows, pad, "NumPy zeros + copy")

    def keep_or_zero():
        if rank == 0:
            np.copyto(out_full, full)
        else:
            out_full.fill(0)

    yield ("B->P", route(B, P), full, keep_or_zero, "NumPy copy / zeros")
    one, other = placement("cpu", [0]), placement("cpu", [1])
    move = route(B, B, one, other)
    local = full if rank == 0 else None

    def send_recv():
        if rank == 0:
            raw.Send([full, F], 1, 7)
        else:
            raw.Recv([out_full, F], 0, 7)

    yield ("[0]->[1] B", move, local, send_recv, "Send/Recv")


rows_out = []
for label, nbytes in SIZES.items():
    for name, route, x, raw_fn, raw_name in cases(nbytes):
        (t_box, t_fresh, t_raw), (ratio, ratio_fresh) = compare(
            [boxed(route, x), dropped(route, x), raw_fn], nbytes)
        steps = " + ".join(s.name for s in route.steps)
        rows_out.append((name, label, steps, raw_name, t_box, t_raw, ratio, ratio_fresh))

if rank == 0:
    print(f"{size} ranks, {threads} BLAS/OpenMP thread(s) per rank, "
          f"{MPI.Get_library_version().split()[2]} MPICH, mpi4py "
          f"{__import__('mpi4py').__version__}; median of {args.rounds} rounds; float32")
    print()
    print("| transition | size | boxing step | raw | boxing µs | raw µs | boxing/raw "
          "| boxing/raw, fresh |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for name, label, steps, raw_name, t_box, t_raw, ratio, ratio_fresh in rows_out:
        print(f"| {name} | {label} | {steps} | {raw_name} | {t_box * 1e6:.0f} | "
              f"{t_raw * 1e6:.0f} | {ratio:.2f} | {ratio_fresh:.2f} |")
