"""Every registered op's samples inside an nn.Graph on 2 ranks equal the op in eager global
mode: the graph twin of tests/ops/global_ops_check.py.

Run as `mpiexec -n 2 python -m mpi4py tests/ops/graph_global_ops_check.py --shard K --of N`
(launched by tests/ops/test_graph_global_ops.py). The samples, the input SBPs (B, P but not
for bool, S(i) for every axis, short ones too), the global inputs (P as two exact summands)
and the upstream gradients are global_ops_check's own, imported from there. The oracle of
every case is the same op in eager global mode on the same global tensors (which
global_ops_check compares with the single-device op): a graph output must have eager's
placement and SBP, eager's value within the sample's tolerance, and this rank's piece must have
the shape `layout.local_shape` gives.

Which cases run: 18,099 input-SBP combinations forward (146 of them factory outputs) and
5,074 back-propagated, of global_ops_check's 47,159 and 12,883 (a graph compiles in
milliseconds to tens of ms, so the full product, eager twin included, would take several
times the eager check's four minutes; this takes about 200 s of per-rank work in 8 jobs on the
2-core reference machine):

- forward: every input-SBP combination of a sample with at most GRAPH_FULL_PRODUCT of them
  (all but 40 samples); a larger sample runs a deterministic pairwise covering set (every SBP
  of every input meets every SBP of every other input in some case), so every op, sample and
  SBP of every input is covered. The inputs are graph arguments (`input` ops);
- gradients (grad samples, as global_ops_check decides them): every combination of a sample
  with at most GRAPH_GRAD_PRODUCT of them, else a deterministic subset (each SBP of each input
  at least once, and the all-B case; at most GRAPH_GRAD_CASES). The selection and the shards
  live in tests/ops/global_ops_shards.py (`graph_forward_cases`, `graph_grad_cases`,
  `graph_shards`), which the test imports without starting MPI. The graph trains the real
  graph way: the floating inputs are global Parameters (with the case's values, placement and
  SBP) of a module the graph holds, the other inputs and the upstream gradients
  (global_ops_check's values, their SBP varied over B, P, S(i) as there) are arguments;
  build() computes `sum_k (out_k * head_k).sum()`, calls `loss.backward()`, and an
  SGD(lr=1.0) optimizer added to the graph steps. So the autograd pass runs the op's grad
  rule on global tensors, and each parameter is left holding x - grad: (x - p) must equal
  eager global autograd's x.grad for the same upstream gradients within 10x the sample's
  tolerance (as global_ops_check), plus the update's rounding;
- factories (no tensor inputs): every output SBP B, P, S(i), as global_ops_check.

Several cases of a sample share one graph (a build() that runs the op once per case on that
case's inputs; eager runs each case separately): a graph per case would cost its compile
each time. A batch that raises, or any case of it that mismatches, is run again alone in a
graph of its own, and the failure reported names which (`alone` / `only batched`). Random ops
run one graph per case, reseeding before eager and before the graph call (the logical draws
must not depend on SBPs or mode).

EXCLUDED (global_ops_shards.GRAPH_EXCLUDED) lists the ops that cannot run inside a graph at
all, with the reason; it is empty: every registered op runs.

Failures are collected, printed by each rank at once (so a hang after one still names it)
and gathered on rank 0, which prints them and one summary line; the job exits non-zero when
any case failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import zlib
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow.framework.global_tensor import GlobalDevice, _local_alias
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry
from sbpflow.sbp import P, Split, layout
from tests.ops import global_ops_shards
from tests.ops import harness as H
from tests.ops.global_ops_check import (
    RANK,
    SEED,
    SIZE,
    Results,
    local_oracle,
    make_global,
    mismatch,
    output_choices,
    sbp_name,
)
from tests.ops.global_ops_shards import (
    case_row,
    graph_forward_cases,
    graph_grad_cases,
    graph_seconds,
    graph_shards,
    sbp_choices,
    wants_grad,
)

EXCLUDED = global_ops_shards.GRAPH_EXCLUDED  # ops that cannot run in a graph, with why
BATCH = global_ops_shards.GRAPH_BATCH


# -- graphs --------------------------------------------------------------------------------------
class _Graph(nn.Graph):
    """build(*args) = fn(*args); `params` (a module) and an optimizer for gradient graphs."""

    def __init__(self, fn, params=None, optimizer=None):
        super().__init__()
        if params is not None:
            self.params = params
        if optimizer is not None:
            self.add_optimizer(optimizer)
        self.fn = fn

    def build(self, *args):
        return self.fn(*args)


def _call(opdef, flat, attrs, device=None):
    inputs = (tuple(flat),) if opdef.variadic else tuple(flat)
    if device is not None:
        return H.as_tuple(apply(opdef, inputs, dict(attrs), device=device))
    return H.as_tuple(apply(opdef, inputs, dict(attrs)))


@dataclass
class Case:
    what: str
    number: int
    flat: list  # the global inputs (not requiring grad)
    arrays: list = None  # their logical values, dtypes and SBPs
    dtypes: list = None
    combo: list = None
    eager: tuple | None = None  # eager global outputs
    eager_error: str | None = None
    grad_error: str | None = None  # eager backward's
    heads: list | None = None  # upstream gradients (None where an output gets none)
    eager_grads: list | None = None  # per input: eager x.grad (None: no grad / not float)
    device: GlobalDevice | None = None  # a factory's placement and output SBP


def _origin(e: BaseException) -> str:
    """Where the first exception of e's chain was raised (a kernel's line, say)."""
    while e.__cause__ is not None:
        e = e.__cause__
    frames = traceback.extract_tb(e.__traceback__)[-2:]
    return "".join(f"\n    at {os.path.relpath(f.filename)}:{f.lineno} in {f.name}"
                   for f in frames)


def same_values(got, want, rtol, atol) -> str | None:
    """None when two global tensors have equal values within tolerance. With the same placement
    and an SBP without P, this rank's pieces are compared (no communication, and a B whose
    copies differ between ranks is caught on the rank that holds the wrong one); otherwise
    the logical values (a collective: both ranks take this branch, metas agree)."""
    if (got.placement == want.placement and tuple(got.sbp) == tuple(want.sbp)
            and P not in tuple(got.sbp)):
        bad = mismatch(H.host(_local_alias(got)), H.host(_local_alias(want)), rtol, atol)
        return None if bad is None else f"rank {RANK}'s piece: {bad}"
    return mismatch(H.host(got), H.host(want), rtol, atol)


def agree(failed: bool) -> bool:
    """Whether any rank failed (so both ranks take the same path after a check)."""
    flow.synchronize()
    return bool(MPI.COMM_WORLD.allreduce(bool(failed), op=MPI.LOR))


class Checker:
    def __init__(self, placement):
        self.placement = placement
        self.res = Results()
        self.batched_graphs = 0
        self.graphs = 0
        self.cases_in_graphs = 0
        self.cpu = {"eager": 0.0, "graph": 0.0}  # CPU seconds of each side (--timings)

    def fail(self, what, detail):
        self.res.fail(what, detail)

    # -- comparing ---------------------------------------------------------------------------
    def compare(self, got, want, sample, label="") -> list[str]:
        """Mismatches of graph outputs against eager outputs (an empty list: equal)."""
        bad = []
        if len(got) != len(want):
            return [f"{label}{len(got)} outputs, eager gives {len(want)}"]
        for k, (o, e) in enumerate(zip(got, want)):
            if not o.is_global:
                bad.append(f"{label}output {k} is local, eager's is global on {e.placement} "
                           f"sbp {e.sbp}")
                continue
            if o.placement != e.placement:
                bad.append(f"{label}output {k} on {o.placement}, eager's on {e.placement}")
            if tuple(o.sbp) != tuple(e.sbp):
                bad.append(f"{label}output {k} has sbp ({', '.join(map(sbp_name, o.sbp))}), "
                           f"eager's ({', '.join(map(sbp_name, e.sbp))})")
            if tuple(o.shape) != tuple(e.shape) or o.dtype != e.dtype:
                bad.append(f"{label}output {k} is {o.dtype.name}{list(o.shape)}, eager's "
                           f"{e.dtype.name}{list(e.shape)}")
                continue
            rtol, atol = H.tolerance(sample, e.dtype.name)
            m = same_values(o, e, rtol, atol)
            if m:
                bad.append(f"{label}output {k} (sbp {sbp_name(o.sbp[0])}): {m}")
            wantp = layout.local_shape(tuple(o.shape), o.placement, o.sbp, RANK)
            gotp = np.shape(_local_alias(o)._host())
            if tuple(gotp) != tuple(wantp):
                bad.append(f"{label}output {k} (sbp {sbp_name(o.sbp[0])}): rank {RANK}'s piece "
                           f"has shape {list(gotp)}, layout.local_shape says {list(wantp)}")
        return bad

    # -- forward ---------------------------------------------------------------------------
    def forward_graph(self, opdef, sample, cases):
        """One graph running the op on each case's inputs: the outputs per case."""
        counts = []

        def fn(*args):
            outs, i = [], 0
            counts.clear()
            for c in cases:
                n = len(c.flat)
                got = _call(opdef, args[i:i + n], sample.attrs)
                i += n
                counts.append(len(got))
                outs.extend(got)
            return tuple(outs)

        g = _Graph(fn)
        if opdef.random:
            flow.manual_seed(SEED)
        flat = [t for c in cases for t in c.flat]
        outs = list(H.as_tuple(g(*flat)))
        self.graphs += 1
        per, i = [], 0
        for n in counts:
            per.append(tuple(outs[i:i + n]))
            i += n
        return per

    def run_forward(self, opdef, sample, cases):
        size = 1 if opdef.random else BATCH
        for start in range(0, len(cases), size):
            self.run_chunk("", cases[start:start + size],
                           lambda chunk: self.forward_graph(opdef, sample, chunk),
                           lambda c, outs: self.compare(outs, c.eager, sample))

    def run_chunk(self, label, chunk, graph, check):
        """Run graph(chunk) (results per case) and check(case, result) (mismatches) for each
        case. A batch that raised, or a case of it that mismatched, runs again alone. The ranks
        agree on each outcome first, so both take the same path (each reports what it saw)."""
        batched = len(chunk) > 1
        results, error = self._try(graph, chunk)
        if agree(error is not None):
            if batched:
                for c in chunk:
                    self.run_chunk(label, [c], graph, check)
                return
            self.fail(chunk[0].what + label, error or "the graph raised on the other rank")
            return
        if batched:
            self.batched_graphs += 1
            self.cases_in_graphs += len(chunk)
        bads = [self._check(check, c, r) for c, r in zip(chunk, results)]
        flags = MPI.COMM_WORLD.allgather([bool(b) for b in bads])
        for k, (c, bad) in enumerate(zip(chunk, bads)):
            if not any(f[k] for f in flags):
                continue
            if not batched:
                if bad:
                    self.fail(c.what + label, "; ".join(bad))
                continue
            again, error = self._try(graph, [c])
            if agree(error is not None):
                alone = [error or "the graph raised on the other rank"]
            else:
                alone = self._check(check, c, again[0])
            tag = ("(alone too)" if agree(bool(alone))
                   else "(only batched: alone it is right)")
            if bad:
                self.fail(c.what + label, f"{tag} " + "; ".join(bad))

    def _try(self, graph, chunk):
        t0 = time.process_time()
        try:
            return graph(chunk), None
        except Exception as e:
            return None, f"graph raised {type(e).__name__}: {e}{_origin(e)}"
        finally:
            self.cpu["graph"] += time.process_time() - t0

    @staticmethod
    def _check(check, c, result):
        try:
            return check(c, result)
        except Exception as e:
            return [f"comparing raised {type(e).__name__}: {e}"]

    # -- gradients -------------------------------------------------------------------------
    def grad_graph(self, opdef, sample, cases):
        """A training graph: per case the floating inputs are global Parameters (fresh ones,
        with the case's values, placement and SBP) of a module the graph holds, the others
        and the upstream gradients are arguments; build() runs the op, sum_k (out_k *
        head_k).sum() backward, and SGD(lr=1) updates the parameters. Returns (outputs,
        parameters after the step) per case."""
        module = nn.Module()
        params = []
        for ci, c in enumerate(cases):
            rng = np.random.default_rng(zlib.crc32(c.what.encode()) + 1)
            row = []
            for k, (a, d, s) in enumerate(zip(c.arrays, c.dtypes, c.combo)):
                if d.is_floating_point:
                    p = nn.Parameter(make_global(a, d, s, self.placement, rng))
                    setattr(module, f"p{ci}_{k}", p)
                    row.append(p)
                else:
                    row.append(None)
            params.append(row)
        opt = flow.optim.SGD(list(module.parameters()), lr=1.0)
        counts = []

        def fn(*args):
            outs, i = [], 0
            counts.clear()
            for ci, c in enumerate(cases):
                ins = []
                for p in params[ci]:
                    if p is None:
                        ins.append(args[i])
                        i += 1
                    else:
                        ins.append(p)
                got = _call(opdef, ins, sample.attrs)
                counts.append(len(got))
                outs.extend(got)
                loss = None
                for o, h in zip(got, c.heads):
                    if h is None:
                        continue
                    term = (o * args[i]).sum()
                    i += 1
                    loss = term if loss is None else loss + term
                if loss is not None:
                    loss.backward()
            return tuple(outs)

        g = _Graph(fn, module, opt)
        args = []
        for ci, c in enumerate(cases):
            args.extend(x for x, p in zip(c.flat, params[ci]) if p is None)
            args.extend(h for h in c.heads if h is not None)
        if opdef.random:
            flow.manual_seed(SEED)
        outs = list(H.as_tuple(g(*args)))
        self.graphs += 1
        per, i = [], 0
        for n in counts:
            per.append(tuple(outs[i:i + n]))
            i += n
        return per, params

    def grad_mismatch(self, c, outs, params, sample):
        """The step left x - 1.0 * grad in each parameter: (x - p) must be eager's x.grad
        within 10x the sample's tolerance (as global_ops_check), plus the rounding of the
        update (two ulps of |x| + |grad|)."""
        bad = self.compare(outs, c.eager, sample, "training graph: ")
        up = ", ".join(sbp_name(h.sbp[0]) for h in c.heads if h is not None)
        for k, (x, p, want) in enumerate(zip(c.arrays, params, c.eager_grads)):
            if p is None:
                continue
            if tuple(p.sbp) != (c.combo[k],) or p.placement != self.placement:
                bad.append(f"parameter {k} is now on {p.placement} sbp {p.sbp}")
            rtol, atol = H.tolerance(sample, p.dtype.name)
            x64 = np.asarray(x).astype(p.dtype.np).astype(np.float64)
            p64 = H.host(p).astype(np.float64)
            g64 = (np.zeros_like(x64) if want is None
                   else H.host(want).astype(np.float64))
            with np.errstate(all="ignore"):
                span = np.nan_to_num(np.abs(x64) + np.abs(g64), posinf=0.0)
                ulps = 2 * float(np.finfo(np.float32 if p.dtype.name == "bfloat16"
                                          else p.dtype.np).eps) * float(span.max(initial=0))
                if p.dtype.name == "bfloat16":
                    ulps *= 2.0 ** 16
                m = mismatch(x64 - p64, g64, rtol * 10, atol * 10 + ulps)
            if m:
                what = "no grad in eager" if want is None else f"upstream sbp {up}"
                bad.append(f"grad of input {k} (sbp {sbp_name(c.combo[k])}, {what}; the graph's "
                           f"is x - p after the SGD(lr=1) step): {m}")
        return bad

    def run_grads(self, opdef, sample, cases):
        cases = [c for c in cases if c.heads is not None and c.grad_error is None]
        size = 1 if opdef.random else BATCH
        for start in range(0, len(cases), size):
            chunk = cases[start:start + size]
            self.res.grads += len(chunk)

            def graph(chunk):
                per, zs = self.grad_graph(opdef, sample, chunk)
                return list(zip(per, zs))

            self.run_chunk(" grad", chunk, graph,
                           lambda c, r: self.grad_mismatch(c, r[0], r[1], sample))

    # -- eager --------------------------------------------------------------------------------
    def eager_forward(self, opdef, sample, c):
        if opdef.random:
            flow.manual_seed(SEED)
        try:
            c.eager = _call(opdef, c.flat, sample.attrs)
        except Exception as e:
            c.eager_error = f"{type(e).__name__}: {e}"

    def eager_grad(self, opdef, sample, c, cots):
        """Eager global autograd with global_ops_check's upstream gradients for case c."""
        leaves = [t.detach().requires_grad_() if t.dtype.is_floating_point else t
                  for t in c.flat]
        if opdef.random:
            flow.manual_seed(SEED)
        outs = _call(opdef, leaves, sample.attrs)
        heads, roots, rng = [], [], np.random.default_rng(c.number)
        for k, (o, cot) in enumerate(zip(outs, cots)):
            if cot is None:
                heads.append(None)
                continue
            if not o.requires_grad:
                raise RuntimeError(f"eager output {k} does not require grad, the local op's "
                                   "does")
            options = output_choices(cot.ndim)
            sbp = options[(c.number + k) % len(options)]
            h = make_global(cot, o.dtype, sbp, self.placement, rng)
            heads.append(h)
            roots.append((o, h))
        if not roots:
            return
        flow.autograd.backward([o for o, _ in roots], [h for _, h in roots])
        c.heads = heads
        c.eager_grads = [None if not t.dtype.is_floating_point or t.grad is None
                         else t.grad.detach() for t in leaves]
        if c.eager is None:
            c.eager = tuple(o.detach() for o in outs)

    # -- one sample -------------------------------------------------------------------------------
    def run_sample(self, name, opdef, index, sample):
        res = self.res
        arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
        want_grad = wants_grad(opdef, sample, arrays)
        try:
            expected, cots, _, local_in = local_oracle(opdef, sample, want_grad, index)
        except Exception as e:
            self.fail(f"{name}[{index}] local", f"{type(e).__name__}: {e}")
            return
        res.samples.add((name, index))
        if not arrays:
            self.run_creation(name, opdef, index, sample, expected)
            return
        dtypes = [t.dtype for t in local_in]
        choices = [sbp_choices(a) for a in arrays]
        sizes = [len(ch) for ch in choices]
        fwd = graph_forward_cases(sizes)
        grd = graph_grad_cases(sizes) if cots is not None else []
        cases: dict[int, Case] = {}
        for n in sorted(set(fwd) | set(grd)):
            combo = [choices[i][a] for i, a in enumerate(case_row(n, sizes))]
            what = f"{name}[{index}] {sample!r} in=({', '.join(map(sbp_name, combo))})"
            rng = np.random.default_rng(zlib.crc32(what.encode()))
            try:
                flat = [make_global(a, d, s, self.placement, rng)
                        for a, d, s in zip(arrays, dtypes, combo)]
            except Exception as e:
                self.fail(what, f"making the inputs raised {type(e).__name__}: {e}")
                continue
            cases[n] = Case(what, n, flat, arrays, dtypes, combo)
        t0 = time.process_time()
        for n in fwd:
            if n in cases:
                res.combos += 1
                self.eager_forward(opdef, sample, cases[n])
        for n in grd:
            if n not in cases:
                continue
            c = cases[n]
            try:
                self.eager_grad(opdef, sample, c, cots)
            except Exception as e:
                c.grad_error = f"{type(e).__name__}: {e}"
        self.cpu["eager"] += time.process_time() - t0
        for c in cases.values():
            for error in (c.eager_error, c.grad_error):
                if error is not None:
                    self.fail(c.what, f"eager global raised {error} (global_ops_check's "
                                      "business; the graph is not compared)")
        self.run_forward(opdef, sample,
                         [cases[n] for n in fwd if n in cases and cases[n].eager_error is None])
        self.run_grads(opdef, sample, [cases[n] for n in grd if n in cases])

    def run_creation(self, name, opdef, index, sample, expected):
        """A factory: each output SBP, the op made inside build() with that placement/SBP."""
        ndim = max(len(e.shape) for e in expected)
        cases = []
        for sbp in output_choices(ndim):
            if any(isinstance(sbp, Split) and sbp.axis >= len(e.shape) for e in expected):
                continue
            c = Case(f"{name}[{index}] {sample!r} out={sbp_name(sbp)}", 0, [],
                     device=GlobalDevice(self.placement, (sbp,)))
            self.res.combos += 1
            self.res.creations += 1
            if opdef.random:
                flow.manual_seed(SEED)
            try:
                c.eager = _call(opdef, (), sample.attrs, c.device)
            except Exception as e:
                self.fail(c.what, f"eager global raised {type(e).__name__}: {e}")
                continue
            cases.append(c)

        def graph(chunk):
            def fn():
                return tuple(o for c in chunk for o in _call(opdef, (), sample.attrs, c.device))

            g = _Graph(fn)
            if opdef.random:
                flow.manual_seed(SEED)
            outs = list(H.as_tuple(g()))
            self.graphs += 1
            per, i = [], 0
            for c in chunk:
                per.append(tuple(outs[i:i + len(c.eager)]))
                i += len(c.eager)
            return per

        def check(c, outs):
            bad = self.compare(outs, c.eager, sample)
            for k, o in enumerate(outs):
                if o.is_global and tuple(o.sbp) != tuple(c.device.sbp):
                    bad.append(f"output {k} has sbp {o.sbp}, asked for {c.device.sbp}")
            return bad

        size = 1 if opdef.random else max(len(cases), 1)
        for start in range(0, len(cases), size):
            self.run_chunk("", cases[start:start + size], graph, check)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--of", type=int, default=1)
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--timings", action="store_true",
                        help="print each sample's seconds (rank 0), to tune the estimates")
    args = parser.parse_args()
    assert SIZE == 2, f"graph_global_ops_check runs on 2 ranks, got {SIZE}"
    start = time.perf_counter()
    every = args.ops.split(",") if args.ops else registry.list_ops()
    groups = graph_shards(every, args.of)
    placement = flow.placement("cpu", [0, 1])
    chk = Checker(placement)
    res = chk.res
    for w in groups[args.shard]:
        res.ops.add(w.name)
        if w.index is None:
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        sample = H.op_samples(w.name)[w.index]
        chk.run_sample(w.name, registry.get(w.name), w.index, sample)
        if args.timings and RANK == 0:
            print(f"timing {w.name}[{w.index}] fwd {w.forward} grad {w.grads} est "
                  f"{graph_seconds(w):.3f} s, took {time.perf_counter() - t0:.3f} s "
                  f"({time.process_time() - c0:.3f} s CPU)", flush=True)
    if args.timings and RANK == 0:
        print(f"timing CPU: eager {chk.cpu['eager']:.1f} s, graphs {chk.cpu['graph']:.1f} s",
              flush=True)
    flow.synchronize()
    everyone = MPI.COMM_WORLD.gather(res.failures, root=0)
    elapsed = time.perf_counter() - start
    failed = 0
    if RANK == 0:
        lines = []
        for r, fails in enumerate(everyone):
            lines += [f"rank {r}: {f}" for f in fails]
        failed = len(lines)
        for line in lines:
            print("FAILED", line)
        covered = len({n for n in every if n not in EXCLUDED})
        print(f"graph global ops shard {args.shard}/{args.of}: {len(res.ops)} ops, "
              f"{len(res.samples)} samples, {res.combos} SBP combinations "
              f"({res.creations} factory outputs), {res.grads} gradients checked, "
              f"{chk.graphs} graphs ({chk.batched_graphs} batched, {chk.cases_in_graphs} "
              f"cases in them), {failed} failures, {elapsed:.1f} s "
              f"({time.process_time():.1f} s CPU on rank 0); the shards cover {covered} ops, "
              f"{len(EXCLUDED)} excluded", flush=True)
    failed = MPI.COMM_WORLD.bcast(failed, root=0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
