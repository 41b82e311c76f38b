"""The eager global fast path on 2 ranks, against the single-device result.

Run under MPI by tests/framework/test_global_fast_path.py, with the consistency check off
(SBPFLOW_CHECK_GLOBAL=0: with it on, every call is compared across ranks first):
`mpiexec -n 2 python -m mpi4py -m pytest -q -p no:cacheprovider
tests/framework/global_fast_path_check.py`. Every rank runs every test in the same order
(SPMD); a failure on one rank aborts the job (tests/conftest.py).

Each program of global_programs.py runs twice on global tensors over both ranks, with each
of its SBP assignments: the first run makes the cached calls, the second runs on them and
must make none and equal the first bit for bit, in strides and SBPs too; both must equal the
program on local tensors exactly (small integers: exact in any order; only the sign of a zero
may differ, since a P tensor's pieces add +0 to -0).
"""

from __future__ import annotations

import numpy as np
import pytest

import sbpflow as flow
from sbpflow import comm
from sbpflow.framework import global_tensor
from sbpflow.vm import OpCall, get_vm
from tests.framework import global_programs as G

RANK, WORLD = comm.get_rank(), comm.get_world_size()
assert WORLD == 2, f"global_fast_path_check runs on 2 ranks, got {WORLD}"
assert not global_tensor.consistency_check_enabled(), "run with SBPFLOW_CHECK_GLOBAL=0"
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
ALL = flow.placement.all("cpu")
FIRST = flow.placement("cpu", [0])  # rank 1 is outside it


def _counting(monkeypatch, obj, attr):
    calls = []
    original = getattr(obj, attr)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, attr, counted)
    return calls


def _same(got, want, what, strides=True):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        where = f"{what}, output {k}"
        assert g[1:3] == w[1:3], where
        assert g[0].dtype == w[0].dtype and g[0].shape == w[0].shape, where
        if strides:  # two global runs: bit for bit
            assert g[0].tobytes() == w[0].tobytes(), f"{where}: {g[0]} != {w[0]}"
            assert g[3:] == w[3:], where
        else:  # equal values; the sign of a zero may differ (a P piece adds +0 to -0)
            np.testing.assert_array_equal(g[0], w[0], err_msg=where)


CASES = [pytest.param(name, sbps, id=f"{name}-{'-'.join(map(repr, sbps))}")
         for name, (shapes, dtypes, _, _) in G.PROGRAMS.items()
         for sbps in G.sbp_choices(shapes, dtypes)]


@pytest.mark.parametrize(("name", "sbps"), CASES)
def test_cached_calls_equal_single_device_bitwise(name, sbps, monkeypatch):
    local = G.run(name)
    first = G.run(name, ALL, sbps)
    made = _counting(monkeypatch, global_tensor._GlobalCall, "__init__")
    again = G.run(name, ALL, sbps)
    assert not made, f"{name}: the second run made {len(made)} new calls"
    _same(again, first, f"{name} {sbps}: cached against first run")
    _same(again, local, f"{name} {sbps} against single device", strides=False)


def test_cached_calls_run_inline_on_every_rank(monkeypatch):
    a = G.logical((4, 6), 0)
    x = flow.tensor(a, placement=ALL, sbp=S(0))
    y = flow.tensor(a, placement=ALL, sbp=S(1))
    x + x, x * 2.5, (x @ y.T).sum()  # noqa: B018 - cached calls
    flow.synchronize()
    made = _counting(monkeypatch, global_tensor._GlobalCall, "__init__")
    instructions = _counting(monkeypatch, OpCall, "__init__")
    stream = get_vm().streams["cpu"]
    issued = stream.issued
    z, u = x + x, x * 2.5
    assert not made and not instructions
    assert stream.issued - issued == 2
    assert z.to_local().shape == (2, 6) and z.sbp == (S(0),)
    np.testing.assert_array_equal(z.numpy(), a + a)
    np.testing.assert_array_equal(u.numpy(), a * 2.5)


def test_ranks_outside_the_placement_run_no_kernel(monkeypatch):
    a = G.logical((4, 6), 0)
    x = flow.tensor(a, placement=FIRST, sbp=B)
    for _ in range(2):  # the second round on cached calls
        flow.synchronize()
        instructions = _counting(monkeypatch, OpCall, "__init__")
        stream = get_vm().streams["cpu"]
        issued = stream.issued
        y = (x * 2.0 + x).T
        assert not instructions
        # Rank 1 holds empty pieces and runs nothing; rank 0 runs both ops (the view too:
        # a sequence number each).
        assert stream.issued - issued == (3 if RANK == 0 else 0)
        assert y.placement == FIRST and y.shape == (6, 4) and y.stride() == (1, 6)
        assert y.to_local().numel() == (24 if RANK == 0 else 0)
        monkeypatch.undo()
        np.testing.assert_array_equal(y.to_global(ALL, B).numpy(), (a * 3).T)


def test_every_cached_call_enters_the_divergence_check():
    x = flow.tensor(G.logical((4, 6), 0), placement=ALL, sbp=S(0))
    x + x, x.relu()  # noqa: B018 - cached calls
    seq = comm.world()._global_seq
    before = seq.count
    for _ in range(5):
        x + x, x.relu()  # noqa: B018
    assert seq.count - before == 10


def test_random_draws_match_single_device_on_cached_calls():
    for sbp in (S(0), S(1), B):
        for _ in range(2):
            flow.manual_seed(99)
            got = [flow.rand(5, 3, placement=ALL, sbp=sbp).numpy() for _ in range(3)]
            flow.manual_seed(99)
            want = [flow.rand(5, 3).numpy() for _ in range(3)]
            for g, w in zip(got, want):
                assert g.tobytes() == w.tobytes(), sbp
