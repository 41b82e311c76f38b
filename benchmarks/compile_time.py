"""nn.Graph compile time per op, for training graphs of about 100 to 5,000 ops.

Each graph trains a stack of k blocks (Linear 32->32, then tanh) with SGD (momentum 0.9, so
the update has state); k sets the size.  The first call of a graph traces build(), runs the
passes, compiles the Plan and links the runtime; each part is timed here by wrapping the
functions nn.Graph calls (tracing, the pass runner, the runtime factory), so the library is
unchanged and the numbers are the ones a user's first call pays.

Op counts (every node of the Job, input and output nodes included):
  forward   what build() recorded (forward and the loss)
  traced    forward + the backward ops (autograd pass) + the update ops (optimizer pass):
            the size of the training graph, the count the per-op cost is divided by
  compiled  what is left after constant folding, CSE, DCE and elementwise fusion (a fused
            chain counts once): the ops the Plan runs
Times: trace, states (the optimizer config: a state variable per parameter, SGD's momentum
buffers created), every pass (`--passes` prints each; otherwise the slowest two over all
sizes), compile + link (Job -> Plan -> Runtime: the compute chain's generated code), and
`other` (the rest of the first call: the signature, names and the first run of the plan).
ms/op is the whole first call over the traced ops; linear growth shows as a flat ms/op
column.  The numba kernels of fused chains are cached on disk: the first size of a fresh cache
pays their jit (`--cold` points the cache at an empty folder).  Each size builds `--repeats`
fresh graphs and reports every time as its least over them (so the parts need not add up to
`first` exactly).

Run: python benchmarks/compile_time.py [--threads N] [--sizes 8,32,...] [--passes] [--cold]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--sizes", default=smoke("4,8,16,32,64,128,228", "2,4"))
parser.add_argument("--passes", action="store_true", help="a column per pass")
parser.add_argument("--cold", action="store_true", help="an empty numba cache for this run")
parser.add_argument("--repeats", type=int, default=smoke(3, 1),
                    help="fresh graphs per size; each time is the least over them")
args = parser.parse_args()
threads = pin_threads(args.threads)
if args.cold:
    os.environ["SBPFLOW_NUMBA_CACHE"] = tempfile.mkdtemp(prefix="sbpflow-numba-")

import numpy as np  # noqa: E402

import sbpflow as flow  # noqa: E402
from sbpflow.graph import passes as graph_passes  # noqa: E402
from sbpflow.nn import graph as graph_mod  # noqa: E402

after_import_pin(threads)

# -- instrumentation: wrap what nn.Graph._compile calls -------------------------------------
_rec: dict = {}
_trace_build = graph_mod.trace_build
_run_passes = graph_passes.run_passes
_runner_factory = graph_mod._runner_factory


def _timed_trace(job, *a, **kw):
    t0 = time.perf_counter()
    out = _trace_build(job, *a, **kw)
    _rec["trace"] = time.perf_counter() - t0
    _rec["forward_ops"] = len(job.ops)
    return out


def _counted_passes(job, dump=None, **kw):
    counts = _rec["counts"] = {}

    def count(name, j):
        counts[name] = len(j.ops)
        if dump is not None:
            dump(name, j)

    t0 = time.perf_counter()
    times = _run_passes(job, dump=count, **kw)
    _rec["passes_total"] = time.perf_counter() - t0
    _rec["pass_times"] = times
    return times


def _timed_runner(job):
    t0 = time.perf_counter()
    rt = _runner_factory(job)
    _rec["compile"] = time.perf_counter() - t0
    return rt


_add_optimizer_config = graph_mod.Graph._add_optimizer_config


def _timed_optimizer_config(self, job):
    t0 = time.perf_counter()
    out = _add_optimizer_config(self, job)
    _rec["states"] = time.perf_counter() - t0
    return out


graph_mod.Graph._add_optimizer_config = _timed_optimizer_config
graph_mod.trace_build = _timed_trace
graph_passes.run_passes = _counted_passes
graph_mod._runner_factory = _timed_runner


def make_graph(k: int):
    flow.manual_seed(0)
    blocks = []
    for _ in range(k):
        blocks += [flow.nn.Linear(32, 32), flow.nn.Tanh()]
    model = flow.nn.Sequential(*blocks)
    opt = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).square().mean()
            loss.backward()
            return loss

    return G()


def measure(k: int, x) -> dict:
    g = make_graph(k)
    _rec.clear()
    t0 = time.perf_counter()
    g(x)
    flow.synchronize()
    rec = dict(_rec, first=time.perf_counter() - t0)
    t0 = time.perf_counter()
    g(x)
    flow.synchronize()
    rec["step"] = time.perf_counter() - t0
    rec["other"] = (rec["first"] - rec["trace"] - rec["states"] - rec["passes_total"]
                    - rec["compile"])
    counts = rec["counts"]
    rec["traced_ops"] = counts["optimizer"]  # forward + backward + update, before cleanups
    rec["compiled_ops"] = counts[graph_passes.ORDER[-1]]
    rec["plan_ops"] = g._last.runner.plan.stats.get("ops")
    return rec


def best(recs: list[dict]) -> dict:
    """Each time the least over the repeats (noise on a shared machine only adds time)."""
    out = dict(recs[0])
    for key in ("trace", "states", "passes_total", "compile", "other", "first", "step"):
        out[key] = min(r[key] for r in recs)
    out["pass_times"] = {n: min(r["pass_times"].get(n, 0.0) for r in recs)
                         for n in recs[0]["pass_times"]}
    return out


def main():
    sizes = [int(v) for v in args.sizes.split(",")]
    x = flow.tensor(np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    measure(1, x)  # imports and first-use setup out of the table
    names = list(graph_passes.ORDER)
    print(f"threads: {threads}; numba cache: "
          f"{'empty at start' if args.cold else 'as left by earlier runs'}; "
          f"each time the least of {args.repeats} fresh graphs")
    head = (f"{'blocks':>6}{'fwd':>6}{'traced':>7}{'compiled':>9}{'trace ms':>9}"
            f"{'states ms':>10}{'passes ms':>10}")
    if args.passes:
        head += "".join(f"{n[:9]:>10}" for n in names)
    head += f"{'compile ms':>11}{'other ms':>9}{'first s':>8}{'ms/op':>7}{'step ms':>8}"
    print(head)
    rows = []
    for k in sizes:
        rec = best([measure(k, x) for _ in range(args.repeats)])
        line = (f"{k:>6}{rec['forward_ops']:>6}{rec['traced_ops']:>7}{rec['compiled_ops']:>9}"
                f"{rec['trace'] * 1e3:>9.1f}{rec['states'] * 1e3:>10.1f}"
                f"{rec['passes_total'] * 1e3:>10.1f}")
        if args.passes:
            line += "".join(f"{rec['pass_times'].get(n, 0.0) * 1e3:>10.1f}" for n in names)
        per_op = rec["first"] / rec["traced_ops"] * 1e3
        line += (f"{rec['compile'] * 1e3:>11.1f}{rec['other'] * 1e3:>9.1f}{rec['first']:>8.3f}"
                 f"{per_op:>7.3f}{rec['step'] * 1e3:>8.2f}")
        print(line, flush=True)
        rows.append((rec["traced_ops"], rec["first"], rec))
    if not args.passes:
        total = {n: sum(r[2]["pass_times"].get(n, 0.0) for r in rows) for n in names}
        top = sorted(total, key=total.get, reverse=True)[:2]
        print("slowest passes over all sizes: "
              + ", ".join(f"{n} {total[n] / sum(total.values()):.0%}" for n in top))
    if len(rows) >= 2:
        (n0, t0, _), (n1, t1, _) = rows[0], rows[-1]
        slope = (t1 - t0) / (n1 - n0) * 1e3
        print(f"marginal cost {rows[0][0]}..{rows[-1][0]} traced ops: {slope:.3f} ms/op; "
              f"ms/op at the largest over the smallest: "
              f"{(t1 / n1) / (t0 / n0):.2f}x (1.0 = linear)")


if __name__ == "__main__":
    main()
