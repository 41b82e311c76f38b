"""nn.Graph over global tensors on 2 ranks (issue 21): scaling, graph against eager, compile time.

Run: mpiexec -n 2 python -m mpi4py benchmarks/graph_global.py [--rounds 7] [--threads 1]
(or `python benchmarks/graph_global.py`: it starts itself under this environment's mpiexec
with 2 processes). `--profile CASE` runs cProfile on rank 0 instead of the tables: over a
row's steps (CASE: a row's key, e.g. dp2, ddp-256, tp-graph-64) or over the first call of a
compile case (compile-DP-64, compile-TP-16). `--skip scaling,eager,compile` leaves parts out.

Every figure is measured side by side in one run, all rows of a table timed in interleaved
rounds (load drift on the shared machine hits them alike). A row's step is timed on every rank
with `flow.synchronize()` before the clock is read; a step's time is the slowest rank's; a
round's figure is the median of its steps and the table shows the least over the rounds
(noise on a shared machine only adds time), with the median over rounds beside it. Under
each table, every graph's boxing nodes are counted by transition (what its Job runs per step).

1. Weak scaling of a data-parallel training graph (MLP 1024-1024-1024-1024-10, ReLU,
   cross-entropy, SGD momentum 0.9, batch 256 per rank; compute dominates). `dp1`: the graph
   on placement [0] with the batch of one rank. Rank 1 runs the same program, as SPMD
   requires: it traces and compiles the same Job and calls the graph every step, but holds
   no piece of any tensor, so its plan has nothing to compute (its call takes ~0.1 ms) and it
   waits for the next row in a sleeping barrier, leaving its core idle as a 1-rank run
   would. `dp2`: the graph on placement [0, 1] with twice the global batch, split S(0); the
   parameters are B and their P gradients are all-reduced by the Job's boxing nodes.
   `local1`: the same step as a local graph (no global tensors) on rank 0 while rank 1
   sleeps, for reference (both ranks make its first call, which agrees on the plan).
   Efficiency = t(dp1) / t(dp2), ideal 1.0. The NumPy rows are the same step hand-written
   (`np1` on rank 0 alone, `np2` on both ranks with an mpi4py Allreduce per gradient): their
   efficiency is what the machine allows (two busy cores share caches and memory bandwidth,
   and other jobs take their turns on them).
2. Graph against eager where framework overhead matters (small and medium models, batch 32
   per rank): the data-parallel graph against eager DDP
   (`sbpflow.nn.parallel.DistributedDataParallel` on a local replica, default buckets) and
   against the same global program run eagerly; the tensor-parallel (Megatron) MLP graph
   against the same program in eager global mode (blocks of Linear(d, 4d) column-parallel
   S(0), ReLU, Linear(4d, d) row-parallel S(1); input B; MSE loss; SGD momentum).
3. Compile time of 2-rank training graphs (DP: k blocks of Linear(32, 32) + tanh, input S(0);
   TP: k Megatron blocks d=32): trace, optimizer states, passes, compile + link (Job ->
   this rank's Plan -> runtime), timed by wrapping what nn.Graph calls (as
   benchmarks/compile_time.py), the slowest rank's, the least of `--repeats` fresh graphs;
   "first - later" is the first call minus the second. ms/op divides the whole first call by
   the traced ops (forward, backward and update, before the clean-up passes).
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
parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads per rank")
parser.add_argument("--rounds", type=int, default=smoke(7, 1))
parser.add_argument("--round-s", type=float, default=smoke(0.5, 0.01),
                    help="seconds each row runs per round (sets its steps, at least 3)")
parser.add_argument("--warmup", type=int, default=smoke(3, 1))
parser.add_argument("--width", type=int, default=smoke(1024, 32), help="scaling MLP width")
parser.add_argument("--batch", type=int, default=smoke(256, 8), help="scaling batch per rank")
parser.add_argument("--small", default=smoke("64,256", "16"),
                    help="widths of the graph-vs-eager models")
parser.add_argument("--sizes", default=smoke("4,16,64", "2"), help="compile: blocks")
parser.add_argument("--repeats", type=int, default=smoke(3, 1), help="compile: fresh graphs")
parser.add_argument("--skip", default="", help="comma list of parts to skip: scaling,eager,"
                    "compile")
parser.add_argument("--profile", default="", help="cProfile this case on rank 0")
parser.add_argument("--profile-steps", type=int, default=20)
parser.add_argument("--timeout", type=float, default=1200.0, help="seconds for the whole run")
args = parser.parse_args()
threads = pin_threads(args.threads)
os.environ["SBPFLOW_BLAS_THREADS"] = str(threads)

from sbpflow.comm import env as comm_env  # noqa: E402  (reads the environment only)

if not comm_env.is_multi_process():
    import subprocess

    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "mpi4py", *sys.argv]
    try:
        sys.exit(subprocess.run(cmd, timeout=args.timeout).returncode)
    except subprocess.TimeoutExpired:
        sys.exit(f"graph_global.py: the 2-rank run passed {args.timeout:.0f} s; killed")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpflow as flow  # noqa: E402
import sbpflow.nn as nn  # noqa: E402
from sbpflow.graph import passes as graph_passes  # noqa: E402
from sbpflow.nn import graph as graph_mod  # noqa: E402
from sbpflow.nn.parallel import DistributedDataParallel as FlowDDP  # noqa: E402

after_import_pin(threads)
raw = MPI.COMM_WORLD.Dup()  # the benchmark's own barriers and reductions, apart from sbpflow's
rank, size = raw.Get_rank(), raw.Get_size()
if size != 2:
    sys.exit(f"graph_global.py runs on 2 ranks (mpiexec -n 2), not {size}")
B, S = flow.sbp.broadcast, flow.sbp.split
ONE = flow.placement("cpu", [0])
BOTH = flow.placement("cpu", [0, 1])
F = nn.functional


# -- timing --------------------------------------------------------------------------------
def sleeping_barrier() -> None:
    """A barrier that waits with time.sleep, so a waiting rank leaves its core free."""
    req = raw.Ibarrier()
    while not req.Test():
        time.sleep(0.001)


def world_max(values) -> np.ndarray:
    a = np.array(values, dtype=np.float64)
    raw.Allreduce(MPI.IN_PLACE, a, MPI.MAX)
    return a


def timed(step, n: int, ranks: int) -> np.ndarray:
    """Seconds of each of n steps (slowest rank's); ranks >= `ranks` sleep meanwhile."""
    sleeping_barrier()
    out = np.zeros(n)
    if rank < ranks:
        for i in range(n):
            t0 = time.perf_counter()
            step()
            flow.synchronize()
            out[i] = time.perf_counter() - t0
    sleeping_barrier()
    return world_max(out)


def run_table(rows: list) -> dict:
    """rows: [(key, label, ranks, make)]; make() -> step. Every step is built and warmed up
    first, then timed in interleaved rounds. Returns key -> (least, median) of the rounds'
    medians, in seconds."""
    steps = [make() for _, _, _, make in rows]
    counts = []
    for (_, _, ranks, _), step in zip(rows, steps):
        # The first call runs on every rank: a graph's first run is preceded by the ranks'
        # plan agreement (a collective), also for a local graph that later runs on rank 0 only.
        timed(step, 1, size)
        warm = timed(step, args.warmup, ranks)
        counts.append(max(3, int(args.round_s / max(float(np.median(warm)), 1e-6))))
    counts = [int(c) for c in world_max(counts)]  # the same step counts on every rank
    per_round = [[] for _ in rows]
    for _ in range(args.rounds):
        for (_, _, ranks, _), step, n, acc in zip(rows, steps, counts, per_round):
            acc.append(float(np.median(timed(step, n, ranks))))
    global BOXING
    BOXING = {key: boxing_summary(step.graph) for (key, *_), step in zip(rows, steps)
              if hasattr(step, "graph")}
    return {key: (min(r), statistics.median(r)) for (key, *_), r in zip(rows, per_round)}


BOXING: dict = {}  # row key -> its graph's boxing nodes (run_table)


# -- models ----------------------------------------------------------------------------------
def mlp(width: int, layers: int, d_in: int, d_out: int = 10) -> nn.Module:
    flow.manual_seed(0)
    mods, d = [], d_in
    for _ in range(layers):
        mods += [nn.Linear(d, width), nn.ReLU()]
        d = width
    mods.append(nn.Linear(d, d_out))
    return nn.Sequential(*mods)


def megatron(pl, d: int, blocks: int) -> nn.Module:
    """Blocks of Linear(d, 4d) column-parallel (weight and bias S(0)), ReLU, Linear(4d, d)
    row-parallel (weight S(1), bias B): the hidden activation stays split, the output of each
    block is P and reduced before the next block (or the loss)."""
    flow.manual_seed(0)
    mods = []
    for _ in range(blocks):
        mods += [nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d)]
    m = nn.Sequential(*mods).to_global(pl, B)
    for i in range(0, len(mods), 3):
        m[i].weight = nn.Parameter(m[i].weight.to_global(pl, S(0)))
        m[i].bias = nn.Parameter(m[i].bias.to_global(pl, S(0)))
        m[i + 2].weight = nn.Parameter(m[i + 2].weight.to_global(pl, S(1)))
    return m


def sgd(model):
    return flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def mse_loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


class TrainGraph(nn.Graph):
    def __init__(self, model, opt, loss):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.loss = loss

    def build(self, x, y):
        loss = self.loss(self.model, x, y)
        loss.backward()
        return loss


def batch(rows: int, d_in: int, seed: int, classes: int | None = 10):
    """The same (x, y) on every rank: rows x d_in normal floats, integer labels (or, with
    classes None, a float target of d_in columns)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    y = (rng.integers(0, classes, rows) if classes else
         rng.standard_normal((rows, d_in)).astype(np.float32))
    return flow.tensor(x), flow.tensor(y)


def global_pair(x, y, pl, sbp):
    return [t.to_global(pl, B).to_global(pl, sbp) for t in (x, y)]


def graph_step(model, x, y, loss=ce_loss):
    g = TrainGraph(model, sgd(model), loss)

    def step():
        return g(x, y)

    step.graph = g  # for boxing_summary
    return step


def boxing_summary(graph) -> str:
    """The boxing nodes of a compiled training Job, counted by transition ("P -> B x 8")."""
    counts: dict[str, int] = {}
    for op in graph._last.job.ops:
        if op.op_type == "boxing":
            a = op.attrs
            src, dst = ",".join(a["src_sbp"]), ",".join(a["dst_sbp"])
            key = f"{src} -> {dst}" + ("" if a["src_ranks"] == a["dst_ranks"] else
                                        f" ({list(a['src_ranks'])} -> {list(a['dst_ranks'])})")
            counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} x {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) \
        or "none"


def eager_step(model, x, y, loss=ce_loss):
    opt = sgd(model)

    def step():
        opt.zero_grad()
        loss(model, x, y).backward()
        opt.step()

    return step


# -- 1. weak scaling -------------------------------------------------------------------------
def scaling_rows() -> list:
    w, b = args.width, args.batch

    def dp1():  # placement [0]: rank 1 follows the program with empty pieces
        x, y = global_pair(*batch(b, w, 1), ONE, S(0))
        return graph_step(mlp(w, 3, w).to_global(ONE, B), x, y)

    def dp2():
        x, y = global_pair(*batch(2 * b, w, 1), BOTH, S(0))
        return graph_step(mlp(w, 3, w).to_global(BOTH, B), x, y)

    def local1():
        x, y = batch(b, w, 1)
        return graph_step(mlp(w, 3, w), x, y)

    shape = f"MLP {w}x3 hidden, batch {b}/rank"
    return [("np1", f"{shape}: NumPy step, rank 0 (rank 1 sleeps)", 1,
             lambda: numpy_step(w, b, reduce=False)),
            ("np2", f"{shape}: NumPy step on both ranks, an mpi4py Allreduce per gradient", 2,
             lambda: numpy_step(w, b, reduce=True)),
            ("local1", f"{shape}: local graph, rank 0 (rank 1 sleeps)", 1, local1),
            ("dp1", f"{shape}: global graph on [0] (rank 1: empty pieces)", 2, dp1),
            ("dp2", f"{shape}: global graph on [0, 1], batch {2 * b} S(0)", 2, dp2)]


def numpy_step(w: int, b: int, reduce: bool):
    """The scaling MLP's training step hand-written in NumPy (the floor for our kernels):
    forward, softmax cross-entropy, backward, SGD momentum; with `reduce`, each gradient is
    all-reduced in place with mpi4py and averaged (data parallelism with no framework)."""
    rng = np.random.default_rng(5)
    dims = [w, w, w, w, 10]
    params = []
    for d_in, d_out in zip(dims, dims[1:]):
        bound = 1 / np.sqrt(d_in)
        params += [rng.uniform(-bound, bound, (d_out, d_in)).astype(np.float32),
                   rng.uniform(-bound, bound, d_out).astype(np.float32)]
    bufs = [np.zeros_like(p) for p in params]
    x = rng.standard_normal((b, w)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, b)]
    n_layers = len(dims) - 1

    def step():
        hs = [x]
        for i in range(n_layers):
            z = hs[-1] @ params[2 * i].T + params[2 * i + 1]
            hs.append(np.maximum(z, 0) if i + 1 < n_layers else z)
        z = hs[-1]
        e = np.exp(z - z.max(1, keepdims=True))
        dz = (e / e.sum(1, keepdims=True) - onehot) / (b * (size if reduce else 1))
        grads = [None] * len(params)
        for i in reversed(range(n_layers)):
            grads[2 * i] = dz.T @ hs[i]
            grads[2 * i + 1] = dz.sum(0)
            if i:
                dz = (dz @ params[2 * i]) * (hs[i] > 0)
        for g, p, buf in zip(grads, params, bufs):
            if reduce:
                raw.Allreduce(MPI.IN_PLACE, g, MPI.SUM)
            buf *= 0.9
            buf += g
            p -= 0.01 * buf

    return step


# -- 2. graph against eager ------------------------------------------------------------------
def eager_rows(width: int) -> list:
    b = 32
    d_in = width

    def ddp():
        x, y = batch(2 * b, d_in, 2)
        x, y = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]  # this rank's part
        return eager_step(FlowDDP(mlp(width, 3, d_in)), x, y)

    def dp_eager():
        x, y = global_pair(*batch(2 * b, d_in, 2), BOTH, S(0))
        return eager_step(mlp(width, 3, d_in).to_global(BOTH, B), x, y)

    def dp_graph():
        x, y = global_pair(*batch(2 * b, d_in, 2), BOTH, S(0))
        return graph_step(mlp(width, 3, d_in).to_global(BOTH, B), x, y)

    def tp_eager():
        x, y = global_pair(*batch(b, width, 3, classes=None), BOTH, B)
        return eager_step(megatron(BOTH, width, 2), x, y, mse_loss)

    def tp_graph():
        x, y = global_pair(*batch(b, width, 3, classes=None), BOTH, B)
        return graph_step(megatron(BOTH, width, 2), x, y, mse_loss)

    dp = f"DP MLP {width}x3 hidden, batch {b}/rank"
    tp = f"TP Megatron MLP d={width} x2 blocks, batch {b}"
    return [(f"ddp-{width}", f"{dp}: eager DDP", 2, ddp),
            (f"dp-eager-{width}", f"{dp}: eager global", 2, dp_eager),
            (f"dp-graph-{width}", f"{dp}: graph", 2, dp_graph),
            (f"tp-eager-{width}", f"{tp}: eager global", 2, tp_eager),
            (f"tp-graph-{width}", f"{tp}: graph", 2, tp_graph)]


# -- 3. compile time -------------------------------------------------------------------------
_rec: dict = {}


def _wrap(name, fn, key):
    def timed_fn(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        _rec[key] = time.perf_counter() - t0
        return out

    timed_fn.__name__ = name
    return timed_fn


_run_passes = graph_passes.run_passes


def _counted_passes(job, dump=None, **kw):
    counts = _rec["counts"] = {}

    def count(name, j):
        counts[name] = len(j.ops)
        if dump is not None:
            dump(name, j)

    t0 = time.perf_counter()
    times = _run_passes(job, dump=count, **kw)
    _rec["passes"] = time.perf_counter() - t0
    return times


def instrument() -> None:
    graph_mod.trace_build = _wrap("trace_build", graph_mod.trace_build, "trace")
    graph_mod._runner_factory = _wrap("_runner_factory", graph_mod._runner_factory, "compile")
    graph_mod.Graph._add_optimizer_config = _wrap(
        "_add_optimizer_config", graph_mod.Graph._add_optimizer_config, "states")
    graph_passes.run_passes = _counted_passes


def compile_case(kind: str, k: int) -> dict:
    flow.manual_seed(0)
    if kind == "DP":
        blocks = []
        for _ in range(k):
            blocks += [nn.Linear(32, 32), nn.Tanh()]
        model = nn.Sequential(*blocks).to_global(BOTH, B)
        x, y = global_pair(*batch(16, 32, 4, classes=None), BOTH, S(0))
    else:
        model = megatron(BOTH, 32, k)
        x, y = global_pair(*batch(16, 32, 4, classes=None), BOTH, B)
    g = TrainGraph(model, sgd(model), mse_loss)
    sleeping_barrier()
    _rec.clear()
    t0 = time.perf_counter()
    g(x, y)
    flow.synchronize()
    rec = dict(_rec, first=time.perf_counter() - t0)
    sleeping_barrier()
    t0 = time.perf_counter()
    g(x, y)
    flow.synchronize()
    rec["later"] = time.perf_counter() - t0
    rec["traced_ops"] = rec["counts"]["optimizer"]
    rec["final_ops"] = len(g._last.job.ops)
    rec["boxing"] = sum(op.op_type == "boxing" for op in g._last.job.ops)
    return rec


TIMES = ("trace", "states", "passes", "compile", "first", "later")


def compile_table() -> list:
    instrument()
    compile_case("DP", 1)  # first-use setup (imports, numba cache loads) out of the table
    compile_case("TP", 1)
    out = []
    for kind in ("DP", "TP"):
        for k in [int(v) for v in args.sizes.split(",")]:
            recs = [compile_case(kind, k) for _ in range(args.repeats)]
            best = dict(recs[0])
            for key in TIMES:  # the slowest rank's, least over the repeats
                best[key] = min(float(world_max([r[key]])[0]) for r in recs)
            out.append((kind, k, best))
    return out


# -- report ----------------------------------------------------------------------------------
def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def show(rows, res) -> None:
    print("| case | row | ms/step (least of rounds) | median of rounds |")
    print("|---|---|---:|---:|")
    for key, label, _, _ in rows:
        lo, med = res[key]
        print(f"| {key} | {label} | {lo * 1e3:.2f} | {med * 1e3:.2f} |")
    print("\nboxing nodes of each graph's Job, run once per step (B -> S is a local slice):")
    for key, *_ in rows:
        if key in BOXING:
            print(f"  {key}: {BOXING[key]}")


def profile(case: str) -> None:
    """cProfile on rank 0 of `profile_steps` steps of a table row (its key), or of the first
    call of a compile case (compile-DP-64: kind and blocks)."""
    prof = cProfile.Profile()
    if case.startswith("compile-"):
        _, kind, k = case.split("-")
        instrument()
        compile_case(kind, 1)  # first-use setup out of the profile
        label = f"the first call of the {kind} training graph of {k} blocks"
        if rank == 0:
            prof.enable()
        compile_case(kind, int(k))
        prof.disable()
    else:
        rows = scaling_rows() + [r for w in args.small.split(",") for r in eager_rows(int(w))]
        row = {r[0]: r for r in rows}.get(case)
        if row is None:
            sys.exit(f"--profile: no case {case!r}; cases: {', '.join(r[0] for r in rows)}, "
                     "compile-DP-<blocks>, compile-TP-<blocks>")
        _, label, ranks, make = row
        label = f"{args.profile_steps} steps of {label}"
        step = make()
        timed(step, 1, size)  # every rank: the plan agreement (see run_table)
        timed(step, args.warmup, ranks)
        sleeping_barrier()
        if rank < ranks:
            if rank == 0:
                prof.enable()
            for _ in range(args.profile_steps):
                step()
                flow.synchronize()
            prof.disable()
        sleeping_barrier()
    if rank == 0:
        s = io.StringIO()
        st = pstats.Stats(prof, stream=s)
        print(f"cProfile of {label}, rank 0 (load {load()})")
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(25)
        print(s.getvalue())


def main() -> None:
    if args.profile:
        profile(args.profile)
        return
    skip = set(filter(None, args.skip.split(",")))
    load0 = load()
    if rank == 0:
        print(f"2 ranks on {os.cpu_count()} cores; {threads} BLAS/OpenMP thread(s) per rank "
              f"(OMP/OpenBLAS/MKL and SBPFLOW_BLAS_THREADS pinned, threadpoolctl); "
              f"{args.rounds} interleaved rounds of >= {args.round_s} s per row after "
              f"{args.warmup} warm-up steps; a step's time is the slowest rank's; "
              f"load average at start: {load0}", flush=True)
    if "scaling" not in skip:
        rows = scaling_rows()
        res = run_table(rows)
        if rank == 0:
            print("\n1. Weak scaling of the data-parallel graph (per-rank batch fixed)\n")
            show(rows, res)
            print()
            for one, two, what in (("dp1", "dp2", "graph"), ("np1", "np2", "NumPy + mpi4py")):
                print(f"efficiency t({one})/t({two}), {what}: {res[one][0] / res[two][0]:.2f} "
                      f"(medians: {res[one][1] / res[two][1]:.2f})")
            print(f"goal >= 0.9 for the graph; global graph on [0] / local graph: "
                  f"{res['dp1'][0] / res['local1'][0]:.2f}x; graph dp2 / NumPy np2: "
                  f"{res['dp2'][0] / res['np2'][0]:.2f}x; load {load()}", flush=True)
    if "eager" not in skip:
        widths = [int(v) for v in args.small.split(",")]
        rows = [r for w in widths for r in eager_rows(w)]
        res = run_table(rows)
        if rank == 0:
            print("\n2. Graph against eager (2 ranks)\n")
            show(rows, res)
            print("\n| model | graph DP vs eager DDP | graph DP vs eager global | "
                  "graph TP vs eager global |")
            print("|---|---:|---:|---:|")
            for w in widths:
                g, tg = res[f"dp-graph-{w}"][0], res[f"tp-graph-{w}"][0]
                print(f"| width {w} | {res[f'ddp-{w}'][0] / g:.2f}x | "
                      f"{res[f'dp-eager-{w}'][0] / g:.2f}x | {res[f'tp-eager-{w}'][0] / tg:.2f}x |")
            print(f"\n(eager time / graph time, least of rounds; goal >= 1.5x; load {load()})",
                  flush=True)
    if "compile" not in skip:
        table = compile_table()
        if rank == 0:
            print("\n3. Compile time of 2-rank training graphs (slowest rank, least of "
                  f"{args.repeats})\n")
            print("| Job | blocks | traced ops | final ops | boxing nodes | trace ms | states ms "
                  "| passes ms | compile+link ms | first call ms | later call ms "
                  "| first - later ms | ms per traced op |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for kind, k, r in table:
                ms = {key: r[key] * 1e3 for key in TIMES}
                print(f"| {kind} | {k} | {r['traced_ops']} | {r['final_ops']} | {r['boxing']} "
                      f"| {ms['trace']:.1f} | {ms['states']:.1f} | {ms['passes']:.1f} "
                      f"| {ms['compile']:.1f} | {ms['first']:.1f} | {ms['later']:.2f} "
                      f"| {ms['first'] - ms['later']:.1f} "
                      f"| {ms['first'] / r['traced_ops']:.3f} |")
            print(f"\n(goal < 1 ms per op; load {load()})", flush=True)


if __name__ == "__main__":
    main()
