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
