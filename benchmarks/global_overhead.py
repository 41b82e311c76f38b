"""Eager overhead of a global op against the same op on a local tensor (goal: at most 1.3x).

Run on one rank (placement [0]) or under MPI (placement [0, 1, ...]):
    python benchmarks/global_overhead.py [--profile 20000]
    mpiexec -n 2 python -m mpi4py benchmarks/global_overhead.py

Per case: sbpflow local op, sbpflow global op, their ratio, and for reference torch on a
local tensor and torch DTensor with the matching placements (gloo, CPU). The global inputs'
SBPs match a signature of the op, so no boxing runs (S(0)+S(0), B@S(1), ...), except for the
rows marked "boxing", which include the collective. Every timed run ends with
`flow.synchronize()`; the runs of a row's columns are interleaved, so a change of load on
the shared machine hits them alike. The last row turns on the consistency check (an
all-gather of each op's description). Under MPI every rank times the same loop (iteration
counts agreed across ranks, since a boxing row is a collective per call) and the slowest
rank's median is shown. `--clock process` times with the process's CPU time instead of the
wall clock: on a shared, loaded machine it leaves out the time the process waits for a core
(small ops run inline on the Python thread, so their work is all counted). `--profile N`
runs cProfile over N calls of the global add 2x2 (rank 0 prints), and lists the functions
where it spends more than the local add.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=smoke(0.2, 0.005))
parser.add_argument("--repeats", type=int, default=smoke(5, 1))
parser.add_argument("--profile", type=int, default=0, help="cProfile N global add 2x2 calls")
parser.add_argument("--no-dtensor", action="store_true", help="skip the torch DTensor column")
parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="wall: time.perf_counter; process: time.process_time (CPU time)")
args = parser.parse_args()
clock = time.process_time if args.clock == "process" else time.perf_counter
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402
from sbpflow import comm  # noqa: E402
from sbpflow.framework import global_tensor  # noqa: E402

after_import_pin(threads)
RANK, WORLD = comm.get_rank(), comm.get_world_size()
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum


# -- timing agreed across ranks -----------------------------------------------------------------
def world_max(x: float) -> float:
    return float(comm.world().all_reduce(np.array([x]), op="max")[0])


def _calibrate(fn, sync) -> int:
    """Calls per timed run (~min_time / repeats), the same on every rank."""
    fn()
    sync()
    n = 1
    while True:
        t0 = clock()
        for _ in range(n):
            fn()
        sync()
        dt = world_max(clock() - t0)
        if dt > args.min_time / 5:
            return max(1, int(n * args.min_time / dt / args.repeats))
        n *= 4


def time_us(*runs) -> list[float]:
    """Per (fn, sync): the median over repeats of the mean µs per call, the slowest rank's.

    The functions' runs are interleaved (a, b, a, b, ...), so a change of load on the shared
    machine hits them alike and their ratio stays fair. Every rank makes the same number of
    calls (a boxing call is a collective)."""
    counts = [_calibrate(fn, sync) for fn, sync in runs]
    samples = [[] for _ in runs]
    for _ in range(args.repeats):
        for (fn, sync), per_run, out in zip(runs, counts, samples):
            comm.world().barrier()
            t0 = clock()
            for _ in range(per_run):
                fn()
            sync()
            out.append((clock() - t0) / per_run * 1e6)
    return [world_max(statistics.median(x)) for x in samples]


# -- torch DTensor, for reference --------------------------------------------------------------
def dtensor_mesh():
    """A gloo device mesh over the same ranks, or None when unavailable."""
    if args.no_dtensor:
        return None
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:
        return None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # One port per job: rank 0 picks it, everyone learns it through sbpflow's broadcast.
    port = np.array([29500 + os.getpid() % 2000 if RANK == 0 else 0], np.int64)
    comm.world().broadcast(port, root=0)
    os.environ.setdefault("MASTER_PORT", str(int(port[0])))
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    return init_device_mesh("cpu", (WORLD,))


def cases(placement, mesh):
    """(name, SBPs, local fn, global fn, torch fn, DTensor fn or None)."""
    rng = np.random.default_rng(0)

    def pair(shape):
        return [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]

    def glob(a, sbp):
        return flow.tensor(a, placement=placement, sbp=sbp)

    if mesh is not None:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        def dt(a, spec):
            return distribute_tensor(torch.from_numpy(a), mesh, [spec])
    rows = []
    for shape in [(2, 2), (64, 64)]:
        a, b = pair(shape)
        la, lb = flow.tensor(a), flow.tensor(b)
        ga, gb = glob(a, S(0)), glob(b, S(0))
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        da = db = None
        if mesh is not None:
            da, db = dt(a, Shard(0)), dt(b, Shard(0))
        size = "x".join(map(str, shape))
        rows.append((f"add {size}", "S(0)+S(0)", lambda la=la, lb=lb: la + lb,
                     lambda ga=ga, gb=gb: ga + gb, lambda ta=ta, tb=tb: ta + tb,
                     None if da is None else (lambda da=da, db=db: da + db)))
        rows.append((f"mul {size}", "S(0)*S(0)", lambda la=la, lb=lb: la * lb,
                     lambda ga=ga, gb=gb: ga * gb, lambda ta=ta, tb=tb: ta * tb,
                     None if da is None else (lambda da=da, db=db: da * db)))
    a, b = pair((64, 64))
    la, lb, ta, tb = flow.tensor(a), flow.tensor(b), torch.from_numpy(a), torch.from_numpy(b)
    gb_, gs1 = glob(a, B), glob(b, S(1))
    gs0 = glob(a, S(0))
    gp = glob(a, P)
    d = {}
    if mesh is not None:
        d = {"B": dt(a, Replicate()), "S1": dt(b, Shard(1)), "S0": dt(a, Shard(0))}
        d["P"] = d["S0"].sum(dim=0)  # a Partial DTensor (pending sum) for the boxing row
    rows += [
        ("matmul 64x64", "B@S(1)->S(1)", lambda: la @ lb, lambda: gb_ @ gs1, lambda: ta @ tb,
         (lambda: d["B"] @ d["S1"]) if d else None),
        ("relu 64x64", "S(0)", lambda: flow.relu(la), lambda: flow.relu(gs0),
         lambda: torch.relu(ta), (lambda: torch.relu(d["S0"])) if d else None),
        ("sum 64x64", "S(0)->P", lambda: la.sum(), lambda: gs0.sum(), lambda: ta.sum(),
         (lambda: d["S0"].sum()) if d else None),
    ]
    rows.append(("boxing P->B 64x64", "all_reduce", lambda: la.clone(),
                 lambda: gp.to_global(placement, B), lambda: ta.clone(),
                 (lambda: d["P"].redistribute(mesh, [Replicate()]).to_local()) if d else None))
    rows.append(("boxing P->S(0) 64x64", "reduce_scatter", lambda: la.clone(),
                 lambda: gp.to_global(placement, S(0)), lambda: ta.clone(),
                 (lambda: d["P"].redistribute(mesh, [Shard(0)]).to_local()) if d else None))
    return rows


def main():
    placement = flow.placement.all("cpu")
    global_tensor.set_consistency_check(False)
    mesh = dtensor_mesh()
    if RANK == 0:
        print(f"threads: {threads} per rank; ranks: {WORLD}; placement {placement.ranks}; "
              f"torch {torch.__version__}; VM mode {flow.vm.get_mode().name.lower()}; "
              f"{args.clock} clock")
        print("local/global: sbpflow; torch: the same op on a local torch tensor; DTensor: "
              "torch.distributed.tensor with the same placements (gloo)")
        print("boxing rows: 'local' is a clone of the same local tensor (no collective exists "
              "locally)")
        print(f"{'op':<22}{'SBPs':<16}{'local us':>10}{'global us':>11}{'global/local':>14}"
              f"{'torch us':>10}{'DTensor us':>12}{'DT/torch':>10}")
    sync = flow.synchronize
    for name, sbps, local_fn, global_fn, torch_fn, dt_fn in cases(placement, mesh):
        none = lambda: None  # noqa: E731 - torch runs synchronously
        runs = [(local_fn, sync), (global_fn, sync), (torch_fn, none)]
        lt, gt, tt, *rest = time_us(*runs, *([(dt_fn, none)] if dt_fn is not None else []))
        dtt = rest[0] if rest else float("nan")
        if RANK == 0:
            print(f"{name:<22}{sbps:<16}{lt:>10.2f}{gt:>11.2f}{gt / lt:>13.2f}x{tt:>10.2f}"
                  f"{dtt:>12.2f}{dtt / tt:>9.1f}x", flush=True)
    check_row(placement, sync)
    if args.profile:
        profile(placement, args.profile)
    if mesh is not None:
        import torch.distributed as dist

        dist.destroy_process_group()


def check_row(placement, sync):
    """The consistency check's cost (an all-gather of the op's description per op)."""
    a = np.ones((2, 2), np.float32)
    ga, gb = (flow.tensor(a, placement=placement, sbp=S(0)) for _ in range(2))
    la = flow.tensor(a)
    global_tensor.set_consistency_check(True)
    try:
        lt, gt = time_us((lambda: la + la, sync), (lambda: ga + gb, sync))
    finally:
        global_tensor.set_consistency_check(False)
    if RANK == 0:
        print(f"{'add 2x2, check on':<22}{'S(0)+S(0)':<16}{lt:>10.2f}{gt:>11.2f}"
              f"{gt / lt:>13.2f}x", flush=True)


def _profiled(fn, n):
    for _ in range(100):
        fn()
    flow.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    flow.synchronize()
    prof.disable()
    return prof


def profile(placement, n):
    """cProfile of the global add 2x2, and where it spends more than the local add."""
    a = np.ones((2, 2), np.float32)
    ga, gb = (flow.tensor(a, placement=placement, sbp=S(0)) for _ in range(2))
    la = flow.tensor(a)
    prof_global = _profiled(lambda: ga + gb, n)
    prof_local = _profiled(lambda: la + la, n)
    if RANK != 0:
        return
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof_global, stream=out).strip_dirs().sort_stats(key).print_stats(18)
        print(f"\ncProfile of {n} x global add 2x2 (S(0)+S(0)), sorted by {key}:")
        print(_trim(out.getvalue()))
    per_fn = {}
    for sign, prof in ((1, prof_global), (-1, prof_local)):
        stats = pstats.Stats(prof).strip_dirs().stats
        for (file, line, name), (_, calls, tottime, _, _) in stats.items():
            key = f"{file}:{line}({name})"
            got = per_fn.setdefault(key, [0.0, 0, 0])
            got[0] += sign * tottime
            got[1 if sign > 0 else 2] += calls
    total_g = pstats.Stats(prof_global).total_tt
    total_l = pstats.Stats(prof_local).total_tt
    print(f"\nunder cProfile: global {total_g / n * 1e6:.1f} us/op, local "
          f"{total_l / n * 1e6:.1f} us/op; the functions with the most extra own time "
          "(global - local), us per op:")
    print(f"{'extra us':>9}{'calls g':>9}{'calls l':>9}  function")
    rows = sorted(per_fn.items(), key=lambda kv: -kv[1][0])[:15]
    for key, (extra, calls_g, calls_l) in rows:
        print(f"{extra / n * 1e6:>9.2f}{calls_g:>9}{calls_l:>9}  {key}")


def _trim(text: str) -> str:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(line for line in lines[start:] if line.strip())


if __name__ == "__main__":
    main()
