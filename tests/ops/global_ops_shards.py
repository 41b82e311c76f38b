"""How tests/ops/global_ops_check.py's cases are cut into `mpiexec -n 2` jobs, and how long
each job may take.

A case is one op sample with one combination of input SBPs; the cases of a sample are
numbered in `itertools.product` order over `sbp_choices` of its inputs. A *part* is the
cases range(start, stop, step) of one sample. A sample with at least `SPREAD` cases per
shard is spread over every shard (shard k runs every count-th case from k on): the heavy
samples hold most of the work and their cost per case varies threefold from op to op
(batch_norm_grad's one sample has 6,075 cases), so spreading each of them evenly balances
the shards whatever an op costs. The other samples go whole onto the lightest shard,
heaviest first. The number of shards grows with the registry's estimated work, so a job's
work, and with it its timeout, stays bounded however many ops are added.

The estimate is in seconds of a quiet run on the 2-core reference machine (the measured
cost of a forward case and of a case that is also back-propagated), so a job's quiet wall
time is about `quiet_seconds` when it has the cores to itself. Its launch timeout
(`timeout_s`) is `HEADROOM` times that (see there). Both sides import this module (it
initialises no MPI): every rank and the test compute the same deterministic split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sbpflow.ops import registry
from sbpflow.sbp import B, P, S
from tests.ops import harness as H

# Per-rank seconds of a quiet run, measured over every op on 2 ranks of the 2-core reference
# machine (240 s of work in all, 4 to 6 s of start-up per job).
CASE_S = 0.0047  # one input-SBP combination, forward only
GRAD_CASE_S = 0.0056  # one combination whose gradient is checked too
SAMPLE_S = 0.003  # a part's local oracle run (and a factory's few output SBPs)
FACTORY_CASES = 5  # B, P and S(i): a factory's output SBPs, about
STARTUP_S = 6.0  # mpiexec starts 2 ranks; each imports sbpflow, torch and the registry

SHARD_S = 25.0  # the estimated work of one job, at most
SPREAD = 4  # a sample with at least this many cases per shard is spread over every shard
# Timeout / estimated quiet time alone: 4x over a quiet run, times 2 for `pytest -n 2` (the
# other worker's job takes half the cores), times 1.75 for the estimate's spread (a job's
# quiet wall time runs up to 1.35x it, as the ranks wait on each other) and for the CPU time
# itself growing on a busy machine (up to 2x at load 6 on 2 cores). 14 x (6 + 25) s = 434 s
# stays within pytest's own 600 s per test.
HEADROOM = 14


def sbp_choices(arr: np.ndarray):
    """The 1-D SBPs a tensor input can have: B, P (a sum is meaningless for bool), S(i)."""
    return [B] + ([] if arr.dtype == np.bool_ else [P]) + [S(i) for i in range(arr.ndim)]


def case_count(opdef, sample) -> int:
    """How many input-SBP combinations global_ops_check runs for a sample (0: a factory)."""
    arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
    return math.prod(len(sbp_choices(a)) for a in arrays) if arrays else 0


@dataclass(frozen=True, order=True)
class Part:
    """Cases range(start, stop, step) of sample `index` of op `name`. A factory sample has
    no cases (it runs its output SBPs); index None: an op without samples (nothing to run,
    but the op is covered)."""

    name: str
    index: int | None
    start: int
    stop: int
    step: int
    seconds: float

    def cases(self) -> range:
        return range(self.start, self.stop, self.step)


def _samples(names):
    """(name, index, cases, seconds per case) of every sample of the ops, in a fixed order."""
    for name in sorted(set(names)):
        opdef = registry.get(name)
        samples = H.op_samples(name)
        if not samples:
            yield name, None, 0, 0.0
        for index, sample in enumerate(samples):
            arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
            grad = (sample.grad and opdef.grad is not None
                    and any(a.dtype.kind == "f" for a in arrays))
            yield name, index, case_count(opdef, sample), GRAD_CASE_S if grad else CASE_S


def _seconds(name, index, cases, per_case) -> float:
    if index is None:
        return 0.0
    return SAMPLE_S + (len(cases) * per_case if cases else FACTORY_CASES * CASE_S)


def shard_count(names) -> int:
    total = sum(_seconds(name, index, range(n), per) for name, index, n, per in _samples(names))
    return max(1, math.ceil(total / SHARD_S))


def shards(names, count: int) -> list[list[Part]]:
    """`count` groups of parts of balanced work. Deterministic, so every rank and the test
    compute the same split."""
    loads = [0.0] * count
    groups: list[list[Part]] = [[] for _ in range(count)]
    whole = []
    spread = 0
    for name, index, n, per_case in _samples(names):
        if n >= SPREAD * count:
            for k in range(count):
                j = (k + spread) % count  # rotate, so no shard gets every sample's extra case
                part = Part(name, index, k, n, count,
                            _seconds(name, index, range(k, n, count), per_case))
                groups[j].append(part)
                loads[j] += part.seconds
            spread += 1
        else:
            whole.append(Part(name, index, 0, n, 1, _seconds(name, index, range(n), per_case)))
    for part in sorted(whole, key=lambda p: (-p.seconds, p)):
        j = min(range(count), key=lambda i: (loads[i], i))
        loads[j] += part.seconds
        groups[j].append(part)
    return [sorted(g) for g in groups]


def check_partition(names, groups) -> None:
    """Every op is in some shard, and each sample's cases are run exactly once."""
    got: dict[tuple, list[int]] = {}
    for p in sum(groups, []):
        # A part without cases (a factory sample, an op without samples) stands for one run.
        got.setdefault((p.name, p.index), []).extend(p.cases() or [-1])
    want = {(name, index): list(range(n)) or [-1] for name, index, n, _ in _samples(names)}
    assert got.keys() == want.keys(), (
        f"the shards leave out {sorted(want.keys() - got.keys())[:5]}, "
        f"add {sorted(got.keys() - want.keys())[:5]}")
    for key, cases in got.items():
        assert sorted(cases) == want[key], (
            f"{key[0]}[{key[1]}]: the shards run cases {sorted(cases)[:20]} (-1: its one "
            f"run without input SBPs), not each of {want[key][:20]} once")


def quiet_seconds(group) -> float:
    """The estimated wall time of a shard's job with 2 cores to itself."""
    return STARTUP_S + sum(p.seconds for p in group)


def timeout_s(group) -> float:
    return HEADROOM * quiet_seconds(group)


# -- the graph twin's cases (tests/ops/graph_global_ops_check.py) -----------------------------
# Here, not in the check, so that tests/ops/test_graph_global_ops.py computes the shards without
# starting MPI. The check runs whole samples per shard: its cases of a sample share graphs.
GRAPH_FULL_PRODUCT = 128  # a sample with at most this many input-SBP combinations runs them all
GRAPH_GRAD_PRODUCT = 16  # ... and back-propagates them all when at most this many
GRAPH_GRAD_CASES = 8  # else gradient cases per grad sample, at most
GRAPH_BATCH = 48  # cases per batched graph, at most
# Ops that cannot be traced into a graph at all (op name -> why). None: every op runs.
GRAPH_EXCLUDED: dict[str, str] = {}
# Per-rank seconds of a quiet run on the 2-core reference machine: CPU seconds per rank
# fitted over every sample (least squares over the check's --timings), plus a fifth for the
# ranks waiting on each other.
GRAPH_CASE_S = 0.0055  # one forward case: eager, and its share of a batched graph
GRAPH_GRAD_CASE_S = 0.015  # one gradient case: eager backward, its share of a training graph
GRAPH_S = 0.005  # one graph's compile beyond its ops
GRAPH_SAMPLE_S = 0.003  # the local oracle, the inputs


def case_number(row, sizes) -> int:
    """The position of a combination (choice index per input) in itertools.product order."""
    n = 0
    for a, v in zip(row, sizes):
        n = n * v + a
    return n


def case_row(n, sizes) -> tuple[int, ...]:
    """The combination (choice index per input) at position n of itertools.product order."""
    out = []
    for v in reversed(sizes):
        n, a = divmod(n, v)
        out.append(a)
    return tuple(reversed(out))


def pairwise(sizes) -> list[int]:
    """Case numbers of a deterministic pairwise covering set: every (input i's choice a,
    input j's choice b) is in some case. Greedy (AETG-like): each new case starts from the
    first pair not yet covered and fills the other inputs with the choice covering most new
    pairs (the lowest choice on ties)."""
    k = len(sizes)
    if k < 2:
        return list(range(math.prod(sizes)))
    todo = {(i, a, j, b) for i in range(k) for j in range(i + 1, k)
            for a in range(sizes[i]) for b in range(sizes[j])}
    rows = []
    while todo:
        i0, a0, j0, b0 = min(todo)
        row = [None] * k
        row[i0], row[j0] = a0, b0
        for i in range(k):
            if row[i] is not None:
                continue
            fixed = [(j, row[j]) for j in range(k) if row[j] is not None]
            gains = [sum(((i, a, j, b) if i < j else (j, b, i, a)) in todo for j, b in fixed)
                     for a in range(sizes[i])]
            row[i] = max(range(sizes[i]), key=lambda a: (gains[a], -a))
        for i in range(k):
            for j in range(i + 1, k):
                todo.discard((i, row[i], j, row[j]))
        rows.append(tuple(row))
    return sorted({case_number(r, sizes) for r in rows})


def graph_forward_cases(sizes) -> list[int]:
    """Every combination when at most GRAPH_FULL_PRODUCT, else a pairwise covering set."""
    total = math.prod(sizes)
    return list(range(total)) if total <= GRAPH_FULL_PRODUCT else pairwise(sizes)


def graph_grad_cases(sizes) -> list[int]:
    """Every combination when at most GRAPH_GRAD_PRODUCT; else row r < the largest size gives
    input i its ((r + i) mod size)-th SBP (every SBP of every input gets a gradient, against
    varied SBPs of the others), plus the all-B case (0); at most GRAPH_GRAD_CASES (rows taken
    evenly)."""
    if not sizes:
        return []
    total = math.prod(sizes)
    if total <= GRAPH_GRAD_PRODUCT:
        return list(range(total))
    picked = {case_number(tuple((r + i) % v for i, v in enumerate(sizes)), sizes)
              for r in range(max(sizes))}
    picked.add(0)
    out = sorted(picked)
    if len(out) > GRAPH_GRAD_CASES:
        step = len(out) / GRAPH_GRAD_CASES
        out = sorted({out[int(j * step)] for j in range(GRAPH_GRAD_CASES)} | {0})
    return out


def wants_grad(opdef, sample, arrays) -> bool:
    """global_ops_check's rule: a grad sample of an op with a grad rule and a float input."""
    return (sample.grad and opdef.grad is not None
            and any(np.asarray(a).dtype.kind == "f" for a in arrays))


@dataclass(frozen=True)
class GraphSample:
    """Sample `index` of op `name` (None: an op without samples) and the graph twin's case
    counts: forward combinations (0 for a factory, which runs its output SBPs) and gradient
    cases."""

    name: str
    index: int | None
    forward: int
    grads: int
    random: bool


def graph_samples(names):
    """Every sample of the ops (GRAPH_EXCLUDED left out) with the graph twin's case counts,
    in a fixed order."""
    for name in sorted(set(names)):
        if name in GRAPH_EXCLUDED:
            continue
        opdef = registry.get(name)
        samples = H.op_samples(name)
        if not samples:
            yield GraphSample(name, None, 0, 0, False)
        for index, sample in enumerate(samples):
            arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
            if not arrays:
                yield GraphSample(name, index, 0, 0, opdef.random)
                continue
            sizes = [len(sbp_choices(a)) for a in arrays]
            grads = len(graph_grad_cases(sizes)) if wants_grad(opdef, sample, arrays) else 0
            yield GraphSample(name, index, len(graph_forward_cases(sizes)), grads,
                              opdef.random)


def graph_seconds(w: GraphSample) -> float:
    if w.index is None:
        return 0.0
    if w.forward == 0:  # a factory: its output SBPs, one graph each when random
        n = FACTORY_CASES
        return GRAPH_SAMPLE_S + n * GRAPH_CASE_S + (n if w.random else 1) * GRAPH_S
    graphs = w.forward if w.random else math.ceil(w.forward / GRAPH_BATCH)
    graphs += w.grads if w.random else math.ceil(w.grads / GRAPH_BATCH)
    return (GRAPH_SAMPLE_S + w.forward * GRAPH_CASE_S + w.grads * GRAPH_GRAD_CASE_S
            + graphs * GRAPH_S)


def graph_shard_count(names) -> int:
    total = sum(graph_seconds(w) for w in graph_samples(names))
    return max(1, math.ceil(total / SHARD_S))


def graph_shards(names, count: int) -> list[list[GraphSample]]:
    """`count` groups of whole samples of balanced estimated work (heaviest first onto the
    lightest shard). Deterministic, so every rank and the test compute the same split."""
    loads = [0.0] * count
    groups: list[list[GraphSample]] = [[] for _ in range(count)]
    for w in sorted(graph_samples(names), key=lambda w: (-graph_seconds(w), _graph_order(w))):
        j = min(range(count), key=lambda i: (loads[i], i))
        loads[j] += graph_seconds(w)
        groups[j].append(w)
    return [sorted(g, key=_graph_order) for g in groups]


def _graph_order(w: GraphSample):
    return (w.name, -1 if w.index is None else w.index)


def graph_quiet_seconds(group) -> float:
    return STARTUP_S + sum(graph_seconds(w) for w in group)


def graph_timeout_s(group) -> float:
    return HEADROOM * graph_quiet_seconds(group)
