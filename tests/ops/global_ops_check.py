"""Every registered op on global tensors over 2 ranks equals its single-device result.

Run as `mpiexec -n 2 python -m mpi4py tests/ops/global_ops_check.py --shard K --of N`
(launched by tests/ops/test_global_ops.py; tests/ops/global_ops_shards.py deals the cases to
the N shards). For every op and every registry sample (`harness.op_samples`) in this shard,
or the part of its cases the shard holds:

- every combination of input SBPs, one per tensor input, from B, P (not for bool) and S(i)
  for each axis i of that input (short axes too: their pieces may be empty), on the 1-D
  placement [0, 1]. S and B inputs are cut from the logical array with no communication; a
  P input is two summands, one per rank, whose sum is exactly the logical array in its own
  dtype (random small integers where that is exact), made global with to_global(P);
- the op runs through `interpreter.apply` (as tests/ops/test_registry.py does) and every
  output's logical value (`numpy()`) must equal the same op on local tensors, within the
  sample's tolerance; each output's own piece must have the shape `layout.local_shape` gives
  for its placement and SBP;
- for grad samples the global inputs are leaves requiring grad; a fixed upstream gradient
  (the same logical values as the local run, its SBP varied over B, P and S(i)) is
  back-propagated, and every input's gradient must equal the local gradient and carry the
  leaf's placement and SBP;
- random ops reseed the default generator before the local and every global run: the logical
  result must not depend on the SBPs (OneFlow's global random contract);
- ops without tensor inputs (factories) run with each output SBP in B, P, S(i).

Failures are collected (op, sample, SBPs, max error) rather than stopping at the first; rank
0 prints them all and a summary line, and the job exits non-zero when any case failed.
A rank that meets a failure prints it at once, so a hang that follows one (ranks diverged)
still names the case; the collective watchdog (SBPFLOW_COLLECTIVE_TIMEOUT) ends such a job.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import traceback
import zlib

import numpy as np
from mpi4py import MPI

import sbpflow as flow
from sbpflow import comm
from sbpflow.framework.global_tensor import GlobalDevice, _local_alias
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry
from sbpflow.sbp import B, P, S, Split, layout
from tests.ops import global_ops_shards
from tests.ops import harness as H
from tests.ops.global_ops_shards import sbp_choices

RANK, SIZE = comm.get_rank(), comm.get_world_size()
SEED = 20240606  # the generator seed of random ops, local and global alike


def sbp_name(x) -> str:
    return "P" if x == P else "B" if x == B else f"S({x.axis})"


def output_choices(ndim: int):
    return [B, P] + [S(i) for i in range(ndim)]


# -- partial-sum summands ----------------------------------------------------------------------
def _exact(total: np.ndarray, arr: np.ndarray) -> np.ndarray:
    same = total == arr
    if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
        same |= np.isnan(total.astype(np.float64)) & np.isnan(arr.astype(np.float64))
    return same


def summands(arr: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays (rank 0's, rank 1's) whose sum in arr's dtype is exactly arr.

    Integers: arr - r and r for random small r (wrap-around keeps the sum exact). Floats:
    per element the first exact split of (arr - r, r) with random small integer r,
    (arr - round(arr), round(arr)), (arr, 0) — exact, so even comparisons and floor see the
    logical value after P is reduced, while both summands differ from arr."""
    if arr.dtype.kind in "iu":
        r = rng.integers(-3, 4, size=arr.shape).astype(arr.dtype)
        with np.errstate(over="ignore"):
            return arr - r, r
    span = 1 if arr.dtype.itemsize <= 2 else 3
    r = rng.integers(-span, span + 1, size=arr.shape).astype(arr.dtype)
    rounded = np.round(arr.astype(np.float64)).astype(arr.dtype)
    zero = np.zeros_like(arr)
    first, second = arr.copy(), zero.copy()
    pending = np.ones(arr.shape, bool)
    with np.errstate(all="ignore"):
        for s1 in (r, rounded, zero):
            s0 = (arr - s1).astype(arr.dtype)
            take = pending & _exact((s0 + s1).astype(arr.dtype), arr)
            first = np.where(take, s0, first)
            second = np.where(take, s1, second)
            pending &= ~take
    return first.astype(arr.dtype), second.astype(arr.dtype)


# -- making global tensors -----------------------------------------------------------------------
def make_global(arr, dtype, sbp, placement, rng, requires_grad=False):
    """A global tensor of `dtype` whose logical value is arr, with the 1-D sbp on placement."""
    arr = np.asarray(arr).astype(dtype.np, copy=False)  # split P after the cast: exact sums
    if sbp == P:
        parts = summands(arr, rng)
        mine = flow.tensor(np.array(parts[RANK], order="C"), dtype=dtype)
        # The logical shape equals each rank's for P: no need to exchange metas.
        t = mine.to_global(placement, (P,), check_meta=False)
    else:
        t = flow.tensor(arr, dtype=dtype, placement=placement, sbp=(sbp,))
    if requires_grad:
        t.requires_grad_()
    return t


# -- comparing ----------------------------------------------------------------------------------
def mismatch(actual, expected, rtol, atol) -> str | None:
    """None when equal within tolerance, else a description with the max error."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return f"shape {list(actual.shape)} != {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != {expected.dtype}"
    if actual.size == 0:
        return None
    if expected.dtype.kind in "fc" or expected.dtype.name == "bfloat16":
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        nan_ok = np.isnan(a) == np.isnan(e)
        inf_ok = (a == e) | ~(np.isinf(a) | np.isinf(e))
        with np.errstate(invalid="ignore"):
            err = np.where(np.isfinite(a) & np.isfinite(e), np.abs(a - e), 0.0)
        bad = ~nan_ok | ~inf_ok | (err > atol + rtol * np.abs(np.nan_to_num(e)))
        if bad.any():
            return (f"max error {float(err.max()):.3g} (rtol {rtol}, atol {atol}); "
                    f"{int(bad.sum())} of {bad.size} elements differ")
        return None
    if not np.array_equal(actual, expected):
        diff = actual != expected
        with np.errstate(over="ignore"):
            err = np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max()
        return f"max error {err:.3g}; {int(diff.sum())} of {diff.size} elements differ"
    return None


class Results:
    def __init__(self):
        self.failures: list[str] = []
        self.ops: set[str] = set()
        self.samples: set[tuple[str, int]] = set()
        self.combos = 0
        self.grads = 0
        self.creations = 0

    def fail(self, what: str, detail: str) -> None:
        line = f"{what}: {detail}"
        self.failures.append(line)
        print(f"rank {RANK}: FAIL {line}", flush=True)


def check_outputs(res, what, outs, expected, sample, placement) -> None:
    """Logical values equal the local results; each piece has its layout's shape."""
    if len(outs) != len(expected):
        res.fail(what, f"{len(outs)} outputs, the local op gives {len(expected)}")
        return
    for k, (o, e) in enumerate(zip(outs, expected)):
        if not o.is_global or o.placement != placement:
            res.fail(what, f"output {k} is not global on {placement}")
            continue
        rtol, atol = H.tolerance(sample, e.dtype.name)
        bad = mismatch(H.host(o), H.host(e), rtol, atol)
        if bad:
            res.fail(what, f"output {k} (sbp {sbp_name(o.sbp[0])}): {bad}")
        want = layout.local_shape(tuple(o.shape), placement, o.sbp, RANK)
        got = np.shape(_local_alias(o)._host())
        if tuple(got) != tuple(want):
            res.fail(what, f"output {k} (sbp {sbp_name(o.sbp[0])}): rank {RANK}'s piece has "
                           f"shape {list(got)}, layout.local_shape says {list(want)}")


def cotangents(outs, seed):
    """The upstream gradients test_registry uses: standard normal for floating outputs."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(o.shape)) if o.dtype.is_floating_point else None
            for o in outs]


# -- one op -------------------------------------------------------------------------------------
def local_oracle(opdef, sample, want_grad, seed_cot):
    """The single-device outputs, cotangents and input gradients (None: not checked)."""
    inputs = H.to_flow(opdef, sample, requires_grad=want_grad)
    if opdef.random:
        flow.manual_seed(SEED)
    outs = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
    flat = list(inputs[0]) if opdef.variadic else list(inputs)
    if not want_grad:
        return [o.detach() for o in outs], None, None, flat
    # Only outputs that require grad locally get an upstream gradient (None elsewhere).
    cots = [c if o.requires_grad else None for o, c in zip(outs, cotangents(outs, seed_cot))]
    roots = [(o, c) for o, c in zip(outs, cots) if c is not None]
    if not roots:
        return [o.detach() for o in outs], None, None, flat
    flow.autograd.backward([o for o, _ in roots],
                           [flow.tensor(c, dtype=o.dtype) for o, c in roots])
    grads = [None if t.grad is None else H.host(t.grad) for t in flat]
    return [o.detach() for o in outs], cots, grads, flat


def run_sample(res, name, opdef, index, sample, placement, cases=None) -> None:
    """Run the sample's input-SBP combinations numbered in `cases` (a range; None: all)."""
    arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
    want_grad = (sample.grad and opdef.grad is not None
                 and any(a.dtype.kind == "f" for a in arrays))
    try:
        expected, cots, grads, local_in = local_oracle(opdef, sample, want_grad, index)
    except Exception as e:  # the local op is test_registry's business, but say so
        res.fail(f"{name}[{index}] local", f"{type(e).__name__}: {e}")
        return
    res.samples.add((name, index))
    if not arrays:
        run_creation(res, name, opdef, index, sample, placement, expected)
        return
    dtypes = [t.dtype for t in local_in]
    choices = [sbp_choices(a) for a in arrays]
    numbered = enumerate(itertools.product(*choices))
    if cases is not None:
        numbered = itertools.islice(numbered, cases.start, cases.stop, cases.step)
    for n, combo in numbered:
        what = f"{name}[{index}] {sample!r} in=({', '.join(map(sbp_name, combo))})"
        res.combos += 1
        rng = np.random.default_rng(zlib.crc32(what.encode()))
        try:
            grad_leaf = [want_grad and d.is_floating_point for d in dtypes]
            flat = [make_global(a, d, s, placement, rng, g)
                    for a, d, s, g in zip(arrays, dtypes, combo, grad_leaf)]
            inputs = (tuple(flat),) if opdef.variadic else tuple(flat)
            if opdef.random:
                flow.manual_seed(SEED)
            outs = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
            check_outputs(res, what, outs, expected, sample, placement)
            if cots is not None:
                check_grads(res, what, n, flat, outs, cots, grads, sample, placement)
        except Exception as e:
            res.fail(what, f"raised {type(e).__name__}: {e}\n"
                           + "".join(traceback.format_exc(limit=-4)))


def check_grads(res, what, n, flat, outs, cots, grads, sample, placement) -> None:
    roots, heads = [], []
    for k, (o, c) in enumerate(zip(outs, cots)):
        if c is None:
            continue
        if not o.requires_grad:
            res.fail(what, f"output {k} does not require grad, the local op's does")
            return
        # Vary the upstream gradient's SBP over B, P, S(i) with the case number.
        options = output_choices(c.ndim)
        sbp = options[(n + k) % len(options)]
        rng = np.random.default_rng(n)
        heads.append(make_global(c, o.dtype, sbp, placement, rng))
        roots.append(o)
    flow.autograd.backward(roots, heads)
    res.grads += 1
    up = ", ".join(f"{sbp_name(h.sbp[0])}" for h in heads)
    for k, (t, want) in enumerate(zip(flat, grads)):
        if not t.dtype.is_floating_point:
            continue
        g = t.grad
        if want is None:
            if g is not None and np.any(H.host(g)):
                res.fail(what, f"input {k} has a nonzero grad, the local op has none")
            continue
        if g is None:
            res.fail(what, f"input {k} got no gradient (upstream sbp {up})")
            continue
        if not g.is_global or g.placement != t.placement or g.sbp != t.sbp:
            res.fail(what, f"input {k}: grad on {getattr(g, 'placement', 'local')} sbp "
                           f"{getattr(g, 'sbp', None)}, the leaf is on {t.placement} sbp "
                           f"{t.sbp}")
        rtol, atol = H.tolerance(sample, t.dtype.name)
        bad = mismatch(H.host(g), want, rtol * 10, atol * 10)
        if bad:
            res.fail(what, f"grad of input {k} (upstream sbp {up}): {bad}")


def run_creation(res, name, opdef, index, sample, placement, expected) -> None:
    ndim = max(len(e.shape) for e in expected)
    for sbp in output_choices(ndim):
        what = f"{name}[{index}] {sample!r} out={sbp_name(sbp)}"
        if any(isinstance(sbp, Split) and sbp.axis >= len(e.shape) for e in expected):
            continue
        res.combos += 1
        res.creations += 1
        try:
            if opdef.random:
                flow.manual_seed(SEED)
            outs = H.as_tuple(apply(opdef, (), dict(sample.attrs),
                                    device=GlobalDevice(placement, (sbp,))))
            for k, o in enumerate(outs):
                if o.is_global and o.sbp != (sbp,):
                    res.fail(what, f"output {k} has sbp {o.sbp}, asked for ({sbp_name(sbp)},)")
            check_outputs(res, what, outs, expected, sample, placement)
        except Exception as e:
            res.fail(what, f"raised {type(e).__name__}: {e}\n"
                           + "".join(traceback.format_exc(limit=-4)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard", type=int, default=0)
    parser.add_argument("--of", type=int, default=1)
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    args = parser.parse_args()
    assert SIZE == 2, f"global_ops_check runs on 2 ranks, got {SIZE}"
    start = time.perf_counter()
    every = args.ops.split(",") if args.ops else registry.list_ops()
    groups = global_ops_shards.shards(every, args.of)
    # The shards partition the cases: each runs in exactly one job, and every op is covered.
    global_ops_shards.check_partition(every, groups)
    placement = flow.placement("cpu", [0, 1])
    res = Results()
    for part in groups[args.shard]:
        res.ops.add(part.name)
        if part.index is None:
            continue  # an op without samples
        sample = H.op_samples(part.name)[part.index]
        run_sample(res, part.name, registry.get(part.name), part.index, sample, placement,
                   part.cases())
    flow.synchronize()
    everyone = MPI.COMM_WORLD.gather(res.failures, root=0)
    seconds = time.perf_counter() - start
    failed = 0
    if RANK == 0:
        lines = []
        for r, fails in enumerate(everyone):
            lines += [f"rank {r}: {f}" for f in fails]
        failed = len(lines)
        for line in lines:
            print("FAILED", line)
        print(f"global ops shard {args.shard}/{args.of}: {len(res.ops)} ops, {len(res.samples)} "
              f"samples, {res.combos} SBP combinations ({res.creations} factory outputs), "
              f"{res.grads} gradients checked, {failed} failures, {seconds:.1f} s "
              f"({time.process_time():.1f} s CPU on rank 0); the shards cover {len(every)} ops",
              flush=True)
    failed = MPI.COMM_WORLD.bcast(failed, root=0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
