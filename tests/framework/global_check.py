"""Global tensors on 2 or 4 ranks: OneFlow's semantics, checked against NumPy.

Run under MPI by tests/framework/test_global.py:
`mpiexec -n N python -m mpi4py -m pytest -q -p no:cacheprovider tests/framework/global_check.py`
(N = 2 or 4). Every rank runs every test in the same order (SPMD); a failure on one rank
aborts the whole job (tests/conftest.py), so a test never leaves the others waiting.

The oracle is NumPy on the logical array, which every rank builds from the same seed; where
ranks must pass different data, raw mpi4py (not sbpflow) gathers what the oracle needs. The
rule under test throughout: the logical value of a global tensor never depends on its
placement or SBP.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow import comm

RANK, WORLD = comm.get_rank(), comm.get_world_size()
assert WORLD in (2, 4), f"global_check runs on 2 or 4 ranks, got {WORLD}"
RAW = MPI.COMM_WORLD

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
ALL = flow.placement.all("cpu")
# A 2-D hierarchy on every job size: 2x2 on 4 ranks, 2x1 on 2.
GRID = flow.placement("cpu", [[0, 1], [2, 3]] if WORLD == 4 else [[0], [1]])
# Every 1-D SBP of a 2-d tensor, and nd-SBPs on GRID that cut, repeat and mix the axes.
SBP_1D = [B, S(0), S(1), P]
SBP_GRID = [(B, B), (S(0), S(1)), (S(1), S(0)), (S(0), S(0)), (P, S(1)), (S(1), P), (B, P),
            (P, P)]


def logical(shape, seed, dtype=np.float64) -> np.ndarray:
    """The same array on every rank (small integers: sums are exact in any order)."""
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(dtype)


def close(t, want, what=""):
    got = t.numpy() if isinstance(t, flow.Tensor) else np.asarray(t)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


def make(a, placement, sbp):
    return flow.tensor(a, placement=placement, sbp=sbp)


def ids(values):
    return [flow.sbp.fmt_sbp(v if isinstance(v, tuple) else (v,)) for v in values]


# -- SBP values and placements ---------------------------------------------------------------
def test_sbp_values_print_and_compare():
    assert repr(S(0)) == "S(0)" and repr(S(1)) == "S(1)"
    assert repr(B) == "B" and repr(P) == "P"
    assert flow.sbp.split(0) == flow.sbp.S(0) and flow.sbp.split(0) != S(1)
    assert flow.sbp.broadcast is flow.sbp.B and flow.sbp.partial_sum is flow.sbp.P
    assert len({S(0), S(0), B, P, S(1)}) == 4
    x = make(logical((4, 4), 0), GRID, (S(0), B))
    assert x.sbp == (S(0), B) and isinstance(x.sbp, tuple)
    assert repr(x.sbp) == "(S(0), B)"
    assert make(logical((4,), 0), ALL, S(0)).sbp == (S(0),)


def test_placement_grid_ranks_all_and_hashing():
    if WORLD == 4:
        p = flow.placement("cpu", [[0, 1], [2, 3]])
        assert p.hierarchy == (2, 2) and p.ranks == [[0, 1], [2, 3]]
        assert p == GRID and hash(p) == hash(flow.placement("cpu", [[0, 1], [2, 3]]))
        assert p != flow.placement("cpu", [0, 1, 2, 3])  # same ranks, another hierarchy
    else:
        # Ranks 2 and 3 do not exist in a 2-rank job: a clear error, on every rank.
        with pytest.raises(ValueError, match=r"rank 3 is out of range.*2 ranks"):
            flow.placement("cpu", [[0, 1], [2, 3]])
    everyone = flow.placement.all("cpu")
    assert everyone.ranks == list(range(WORLD)) and everyone.hierarchy == (WORLD,)
    assert everyone == flow.placement("cpu", list(range(WORLD)))
    assert len({everyone, flow.placement("cpu", range(WORLD)), flow.placement("cpu", [0])}) == 2
    assert flow.placement("cpu", [0, 1]) != flow.placement("cpu", [1, 0])
    assert everyone.type == "cpu"


def test_placement_with_a_rank_beyond_the_world_is_an_error():
    with pytest.raises(ValueError, match=rf"placement\(\): rank {WORLD} is out of range: the "
                                         rf"job has {WORLD} ranks \(0\.\.{WORLD - 1}\)"):
        flow.placement("cpu", list(range(WORLD + 1)))


# -- uneven splits --------------------------------------------------------------------------
def test_uneven_split_pieces_are_balanced_first_ranks_longer():
    a = logical((5, 3), 1)
    x = make(a, ALL, S(0))
    want = np.array_split(a, WORLD, axis=0)[RANK]  # NumPy's split: first ranks one longer
    assert tuple(x.to_local().shape) == want.shape
    np.testing.assert_array_equal(x.to_local().numpy(), want)
    sizes = RAW.allgather(x.to_local().shape[0])
    assert sizes == ([3, 2] if WORLD == 2 else [2, 1, 1, 1])
    close(x, a)


def test_split_with_an_empty_piece_keeps_the_logical_value():
    a = logical((3, 2), 2)
    x = make(a, ALL, S(0))
    assert x.to_local().shape[0] == len(np.array_split(a, WORLD)[RANK])
    if WORLD == 4:
        assert RAW.allgather(x.to_local().shape[0]) == [1, 1, 1, 0]
    close(x, a)
    y = x * 2 + 1
    # Ops keep an SBP whose pieces exist already, even empty ones (no boxing per op).
    assert y.sbp == (S(0),) and x.clone().sbp == (S(0),)
    close(y, a * 2 + 1)
    close(x.sum(), a.sum())
    close(x.sum(dim=0), a.sum(0))
    close(x.to_global(ALL, B), a)
    close(x.to_global(ALL, S(1)), a)


def test_scalar_ops_on_partial_sum_keep_the_logical_value():
    a = logical((3, 4), 3)
    x = make(a, ALL, P)
    close(x + 5, a + 5)  # adding a number to every piece of P would add it WORLD times
    close(5 - x, 5 - a)
    close(x * 3, a * 3)
    close(x / 2, a / 2)
    close(x ** 2, a ** 2)
    close(x.relu(), np.maximum(a, 0))
    close(-x, -a)


# -- local -> global -----------------------------------------------------------------------
def test_local_to_global_broadcast_takes_rank_0s_data():
    local = flow.tensor(np.full((2, 3), float(RANK + 7)))  # every rank passes other data
    x = local.to_global(ALL, B)
    assert x.shape == (2, 3) and x.sbp == (B,)
    np.testing.assert_array_equal(x.to_local().numpy(), np.full((2, 3), 7.0))
    close(x, np.full((2, 3), 7.0))


def test_local_to_global_split_concatenates_uneven_pieces():
    # Pieces of 2, 1(, 1, 1) rows: a balanced split of 3 (or 5) rows, the first one longer.
    rows = 2 if RANK == 0 else 1
    local = flow.tensor(logical((rows, 3), 50 + RANK))
    x = local.to_global(ALL, S(0))
    pieces = RAW.allgather(local.numpy())
    assert x.shape == (WORLD + 1, 3)
    close(x, np.concatenate(pieces))
    local = flow.tensor(logical((2, rows), 60 + RANK))
    y = local.to_global(ALL, S(1))
    assert y.shape == (2, WORLD + 1)
    close(y, np.concatenate(RAW.allgather(local.numpy()), axis=1))


def test_local_to_global_partial_sum_adds_the_pieces():
    mine = logical((3, 2), 10 + RANK)
    x = flow.tensor(mine).to_global(ALL, P)
    close(x, sum(RAW.allgather(mine)))
    close(x.to_global(ALL, S(0)), sum(RAW.allgather(mine)))


@pytest.mark.parametrize("sbp", SBP_GRID, ids=ids(SBP_GRID))
def test_local_to_global_on_a_grid(sbp):
    # Every rank holds its piece of one logical array (P: rank 0 of each P axis group holds
    # it, the others zeros), so the result must be that array.
    a = logical((4, 6), 3)
    ref = make(a, GRID, sbp)  # built from the logical value, no communication
    x = ref.to_local().to_global(GRID, sbp)
    assert x.shape == (4, 6) and x.sbp == sbp and x.placement == GRID
    close(x, a)


def test_local_to_global_grid_broadcast_axis_takes_coordinate_0s_data():
    # (S(0), B) on the grid: along the B axis, the rank at coordinate 0 wins.
    local = flow.tensor(np.full((1, 2), float(RANK)))
    x = local.to_global(GRID, (S(0), B))
    rows = [float(GRID.ranks[i][0]) for i in range(GRID.hierarchy[0])]
    close(x, np.repeat(np.array(rows)[:, None], 2, axis=1))


def test_check_meta_dtype_mismatch_names_both_ranks_on_every_rank():
    dtype = np.float32 if RANK == 1 else np.float64
    local = flow.tensor(np.zeros((2, 2), dtype))
    with pytest.raises(RuntimeError, match=r"to_global\(\): check_meta failed: rank 0 has a "
                                           r"float64 tensor .* but rank 1 has a float32"):
        local.to_global(ALL, S(0))
    # The job did not deadlock, and the ranks still agree afterwards.
    close(flow.tensor(np.ones(2)).to_global(ALL, B), np.ones(2))


def test_check_meta_non_split_dim_mismatch_names_the_rank():
    cols = 4 if RANK == 1 else 3
    local = flow.tensor(np.zeros((2, cols)))
    with pytest.raises(RuntimeError, match=r"check_meta failed: rank 1's local tensor has shape "
                                           r"\[2, 4\].*gives rank 1 a piece of shape \[2, 3\]"):
        local.to_global(ALL, S(0))
    with pytest.raises(RuntimeError, match=r"rank 1's local tensor has shape \[2, 4\]"):
        local.to_global(ALL, B)


def test_check_meta_unbalanced_split_is_an_error():
    rows = 1 if RANK == 0 else 2  # the first rank must be the longer one
    with pytest.raises(RuntimeError, match="balanced"):
        flow.tensor(np.zeros((rows, 2))).to_global(ALL, S(0))


def test_check_meta_false_trusts_the_caller():
    local = flow.tensor(np.full((2, 2), float(RANK)))
    x = local.to_global(ALL, S(0), check_meta=False)
    assert x.shape == (2 * WORLD, 2)
    close(x, np.repeat(np.arange(WORLD, dtype=float), 2)[:, None] * np.ones((1, 2)))


# -- global tensor basics ------------------------------------------------------------------
def test_to_local_is_global_placement_sbp():
    a = logical((6, 4), 4)
    x = make(a, ALL, S(1))
    assert x.is_global and not x.is_local
    assert x.placement == ALL and x.sbp == (S(1),)
    loc = x.to_local()
    assert not loc.is_global and loc.is_local
    np.testing.assert_array_equal(loc.numpy(), np.array_split(a, WORLD, axis=1)[RANK])
    with pytest.raises(RuntimeError, match="placement: only global tensors have a placement"):
        loc.placement  # noqa: B018
    with pytest.raises(RuntimeError, match="sbp: only global tensors have an sbp"):
        loc.sbp  # noqa: B018


def test_to_local_shares_memory_with_the_piece():
    x = make(logical((4, 2), 5), ALL, S(0))
    loc = x.to_local()
    loc.add_(100)
    np.testing.assert_array_equal(x.to_local().numpy(), loc.numpy())
    copied = x.to_local(copy=True)
    copied.zero_()
    assert np.all(x.to_local().numpy() >= 95)


@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_host_values_are_logical_on_every_rank(sbp, capsys):
    a = logical((3, 2), 6)
    x = make(a, ALL, sbp)
    np.testing.assert_array_equal(x.numpy(), a)
    assert x.tolist() == a.tolist()
    assert make(np.array([[4.5]]), ALL, sbp).item() == 4.5
    assert x.sum().item() == a.sum()
    print(x)
    out = capsys.readouterr().out
    for v in a.reshape(-1):
        assert f"{v:.0f}." in out
    assert f"sbp=({sbp!r},)" in out and "placement=" in out


def test_print_of_a_grid_tensor_shows_the_logical_value(capsys):
    a = np.arange(8.0).reshape(2, 4)
    print(make(a, GRID, (P, S(1))))
    out = capsys.readouterr().out
    assert "[[0., 1., 2., 3.]," in out and "[4., 5., 6., 7.]]" in out
    assert "sbp=(P, S(1))" in out


# -- factories -------------------------------------------------------------------------------
FACTORIES = {
    "zeros": lambda **kw: flow.zeros(5, 3, **kw),
    "ones": lambda **kw: flow.ones(5, 3, **kw),
    "full": lambda **kw: flow.full((5, 3), 2.5, **kw),
    "arange": lambda **kw: flow.arange(5, **kw),
    "linspace": lambda **kw: flow.linspace(-1, 1, 7, **kw),
    "eye": lambda **kw: flow.eye(5, 3, **kw),
    "rand": lambda **kw: flow.rand(5, 3, **kw),
    "randn": lambda **kw: flow.randn(5, 3, **kw),
    "randint": lambda **kw: flow.randint(-4, 9, (5, 3), **kw),
    "randperm": lambda **kw: flow.randperm(7, **kw),
    "normal": lambda **kw: flow.normal(2.0, 3.0, (5, 3), **kw),
    "tensor": lambda **kw: flow.tensor(logical((5, 3), 7), **kw),
}
ONE_D = {"arange", "linspace", "randperm"}


def _factory_sbps(name):
    """1-D: every SBP of the result's axes; the grid: splits of one axis, both, and P."""
    axes = 1 if name in ONE_D else 2
    one = [B, P] + [S(i) for i in range(axes)]
    grid = [(B, B), (S(0), B), (B, S(0)), (P, S(0)), (S(0), P)]
    if axes == 2:
        grid += [(S(0), S(1)), (S(1), S(1))]
    return [(ALL, (s,)) for s in one] + [(GRID, g) for g in grid]


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factory_logical_value_equals_the_local_factory(name):
    make_fn = FACTORIES[name]
    for placement, sbp in _factory_sbps(name):
        flow.manual_seed(123)
        local = make_fn()
        flow.manual_seed(123)
        x = make_fn(placement=placement, sbp=sbp)
        assert x.is_global and x.placement == placement and x.sbp == sbp, (name, sbp)
        assert x.dtype == local.dtype and x.shape == local.shape, (name, x.dtype, x.shape)
        np.testing.assert_array_equal(x.numpy(), local.numpy(), err_msg=f"{name} {sbp}")
        # The generators stay in step: the next draw matches too (same offset on every rank).
        np.testing.assert_array_equal(flow.rand(2).numpy(), _next_local_draw(make_fn),
                                      err_msg=f"{name} {sbp}: generator out of step")


def _next_local_draw(make_fn):
    state = flow.get_rng_state()
    flow.manual_seed(123)
    make_fn()
    out = flow.rand(2).numpy()
    flow.set_rng_state(state)
    return out


def test_empty_has_the_requested_layout():
    for placement, sbp in _factory_sbps("empty"):
        x = flow.empty(5, 3, placement=placement, sbp=sbp)
        assert x.shape == (5, 3) and x.placement == placement and x.sbp == sbp
        assert x.dtype == flow.float32


LIKES = {
    "zeros_like": lambda x: flow.zeros_like(x),
    "ones_like": lambda x: flow.ones_like(x),
    "full_like": lambda x: flow.full_like(x, -1.5),
    "rand_like": lambda x: flow.rand_like(x),
    "randn_like": lambda x: flow.randn_like(x),
    "randint_like": lambda x: flow.randint_like(x, 0, 10),
}


@pytest.mark.parametrize("name", list(LIKES))
def test_like_factories_keep_placement_and_sbp(name):
    fn = LIKES[name]
    flow.manual_seed(5)
    want = fn(flow.zeros(5, 3)).numpy()
    for placement, sbp in [(ALL, (S(1),)), (ALL, (P,)), (GRID, (S(0), S(1)))]:
        x = flow.zeros(5, 3, placement=placement, sbp=sbp)
        flow.manual_seed(5)
        y = fn(x)
        assert y.placement == placement and y.sbp == sbp and y.dtype == x.dtype, (name, sbp)
        np.testing.assert_array_equal(y.numpy(), want, err_msg=f"{name} {sbp}")
    empty = flow.empty_like(flow.zeros(4, 2, placement=GRID, sbp=(B, S(1))))
    assert empty.placement == GRID and empty.sbp == (B, S(1)) and empty.shape == (4, 2)


# -- modules ----------------------------------------------------------------------------------
def test_module_to_global_keeps_parameters_and_values():
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.BatchNorm1d(3), nn.Linear(3, 2))
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    # Every rank starts from different weights: B takes rank 0's, as Tensor.to_global does.
    if RANK != 0:
        with flow.no_grad():
            for p in params:
                p.add_(1000.0)
    model.to_global(ALL, B)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    state = model.state_dict()
    assert set(state) == set(before)
    for k, v in state.items():
        assert v.is_global and v.placement == ALL and v.sbp == (B,), k
        rank0 = RAW.bcast(before[k], root=0)
        np.testing.assert_array_equal(v.numpy(), rank0, err_msg=k)
    # The global module computes what the single-device one does with rank 0's weights,
    # BatchNorm's batch statistics over the whole logical batch included.
    local = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.BatchNorm1d(3), nn.Linear(3, 2))
    local.load_state_dict({k: flow.tensor(RAW.bcast(v, root=0)) for k, v in before.items()})
    a = logical((6, 4), 8, np.float32)
    out = model(flow.tensor(a, placement=ALL, sbp=S(0)))
    assert out.placement == ALL
    close(out.detach(), local(flow.tensor(a)).detach().numpy())
    close(model.state_dict()["2.running_mean"], local.state_dict()["2.running_mean"].numpy())


# -- autograd -----------------------------------------------------------------------------
def _local_grad(fn, *arrays):
    """The single-device gradients of fn(*tensors).sum()."""
    ts = [flow.tensor(a, requires_grad=True) for a in arrays]
    fn(*ts).sum().backward()
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_leaf_gradient_has_the_leafs_placement_and_sbp(sbp):
    a, b = logical((4, 3), 11), logical((3, 5), 12)
    x = make(a, ALL, sbp).requires_grad_()
    w = make(b, ALL, B).requires_grad_()
    ((x @ w).relu() * 3).sum().backward()
    assert x.grad.is_global and x.grad.placement == ALL and x.grad.sbp == (sbp,)
    assert w.grad.sbp == (B,) and w.grad.placement == ALL
    ga, gb = _local_grad(lambda p, q: (p @ q).relu() * 3, a, b)
    close(x.grad, ga)
    close(w.grad, gb)


def test_to_global_backward_gives_the_dual_sbp_before_accumulation():
    a = logical((4, 3), 13)
    x = make(a, ALL, B).requires_grad_()
    mid = x * 2  # a non-leaf: its hook sees the gradient before the leaf's boxing
    seen = []
    mid.register_hook(lambda g: seen.append((g.sbp, g.numpy())))
    y = mid.to_global(ALL, S(0))
    (y * y).sum().backward()
    # B -> S(0) forward; backward S(0) -> the dual of B, which is P.
    assert seen[0][0] == (P,)
    close(seen[0][1], 2 * (2 * a))
    assert x.grad.sbp == (B,)  # boxed to the leaf's own SBP when accumulated
    close(x.grad, 8 * a)


def test_to_global_backward_sbps_seen_by_autograd_grad():
    a = logical((4, 3), 14)
    for src, dst, dual in [(B, S(1), P), (P, B, B), (S(0), B, S(0)), (S(1), P, S(1))]:
        x = make(a, ALL, src).requires_grad_()
        mid = x * 1  # linear: keeps even P, so mid has the source SBP
        assert mid.sbp == (src,)
        (g,) = flow.autograd.grad((mid.to_global(ALL, dst) * 3).sum(), mid)
        assert g.sbp == (dual,), (src, dst, g.sbp)
        close(g, np.full(a.shape, 3.0), f"{src}->{dst}")


def test_grad_sbp_overrides_the_dual():
    a = logical((4, 3), 15)
    x = make(a, ALL, B).requires_grad_()
    mid = x * 1
    (g,) = flow.autograd.grad(mid.to_global(ALL, S(0), grad_sbp=B).sum(), mid)
    assert g.sbp == (B,)
    close(g, np.ones(a.shape))
    (g,) = flow.autograd.grad(mid.to_global(ALL, S(0), grad_sbp=S(1)).sum(), mid)
    assert g.sbp == (S(1),)
    close(g, np.ones(a.shape))


def test_local_to_global_backward_gives_each_rank_its_piece():
    mine = flow.tensor(np.full((2, 3), float(RANK + 1)), requires_grad=True)
    y = mine.to_global(ALL, S(0))
    weights = make(np.arange(2.0 * WORLD * 3).reshape(2 * WORLD, 3), ALL, S(0))
    (y * weights).sum().backward()
    assert not mine.grad.is_global
    np.testing.assert_array_equal(mine.grad.numpy(), weights.to_local().numpy())


def test_to_local_backward_makes_a_global_gradient_of_the_same_sbp():
    a = logical((4, 3), 16)
    x = make(a, ALL, S(0)).requires_grad_()
    loc = x.to_local()
    (loc * loc).sum().backward()
    assert x.grad.sbp == (S(0),)
    close(x.grad, 2 * a)


def test_gradients_equal_the_single_device_ones_for_a_grid_mlp():
    a, w1, w2 = logical((6, 4), 17), logical((4, 8), 18), logical((8, 2), 19)
    x = make(a, GRID, (S(0), B)).requires_grad_()
    p1 = make(w1, GRID, (B, S(1))).requires_grad_()
    p2 = make(w2, GRID, (B, S(0))).requires_grad_()
    out = ((x @ p1).tanh() @ p2).softmax(dim=1)
    loss = (out * make(logical((6, 2), 20), GRID, (B, B))).sum()
    loss.backward()
    target = logical((6, 2), 20)
    want = _local_grad(lambda p, q, r: ((p @ q).tanh() @ r).softmax(dim=1)
                       * flow.tensor(target), a, w1, w2)
    for t, g in zip((x, p1, p2), want):
        assert t.grad.sbp == t.sbp and t.grad.placement == GRID
        close(t.grad, g)


# -- in-place ----------------------------------------------------------------------------
@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_inplace_ops_keep_placement_and_sbp(sbp):
    a, b = logical((4, 3), 21), logical((4, 3), 22)
    x = make(a, ALL, sbp)
    other = make(b, ALL, S(1))  # another SBP: boxed to x's before the write
    x.add_(other)
    assert x.sbp == (sbp,) and x.placement == ALL
    close(x, a + b)
    x.mul_(make(b, ALL, P))
    close(x, (a + b) * b)
    x.mul_(2)
    close(x, (a + b) * b * 2)
    x.copy_(make(b, ALL, B))
    assert x.sbp == (sbp,)
    close(x, b)
    x.zero_()
    assert x.sbp == (sbp,)
    close(x, np.zeros_like(a))


def test_optimizer_step_on_broadcast_parameters_matches_single_device():
    flow.manual_seed(1)
    local = nn.Linear(4, 3)
    model = nn.Linear(4, 3)
    model.load_state_dict(local.state_dict())
    model.to_global(ALL, B)
    a, t = logical((8, 4), 23, np.float32), logical((8, 3), 24, np.float32)
    for net, x, y in [(local, flow.tensor(a), flow.tensor(t)),
                      (model, make(a, ALL, S(0)), make(t, ALL, S(0)))]:
        opt = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            ((net(x) - y) ** 2).mean().backward()
            opt.step()
    for name, p in model.named_parameters():
        assert p.sbp == (B,) and p.placement == ALL, name
        np.testing.assert_allclose(p.detach().numpy(), dict(local.named_parameters())[name]
                                   .detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


# -- views and indexing ------------------------------------------------------------------------
@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_views_and_indexing_give_the_logical_slices(sbp):
    a = logical((5, 6), 42)
    x = make(a, ALL, sbp)
    close(x.T, a.T)
    close(x.t() + 1, a.T + 1)
    close(x[1:3], a[1:3])
    close(x[:, 2], a[:, 2])
    close(x[3], a[3])
    close(x.reshape(3, 10), a.reshape(3, 10))
    close(x.view(-1), a.reshape(-1))
    close(x.unsqueeze(0), a[None])
    close(flow.cat([x, x], dim=1), np.concatenate([a, a], 1))


@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_contiguous_is_one_decision_on_every_rank(sbp):
    # Control flow may depend only on metadata every rank shares (SPMD): is_contiguous()
    # decides whether contiguous() runs a global clone.
    a = logical((5, 6), 46)
    y = make(a, ALL, sbp).permute(1, 0)
    decisions = RAW.allgather(y.is_contiguous())
    assert decisions == [False] * WORLD, f"is_contiguous() per rank: {decisions}"  # as torch
    z = y.contiguous()
    assert z.is_contiguous() and z.stride() == (5, 1)
    close(z, a.T)


@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_setitem_across_the_split_keeps_the_layout(sbp):
    # Writes that keep every split axis whole: the slice is a view of each piece.
    a = logical((4, 6), 43)
    x = make(a, ALL, sbp)
    want = a.copy()
    if sbp == S(0):
        x[:, 2:4] = 7.0
        want[:, 2:4] = 7.0
    else:
        x[1] = 7.0
        want[1] = 7.0
    assert x.sbp == (sbp,)
    close(x, want)


def test_setitem_along_the_split_axis_writes_the_tensor():
    a = logical((4, 6), 44)
    x, y = make(a, ALL, S(0)), make(a, ALL, S(1))
    x[1] = 100.0
    y[:, 2:4] = make(np.ones((4, 2)), ALL, S(0))
    want_x, want_y = a.copy(), a.copy()
    want_x[1] = 100.0
    want_y[:, 2:4] = 1.0
    close(x, want_x)
    close(y, want_y)
    assert x.sbp == (S(0),) and y.sbp == (S(1),)


def test_inplace_through_a_view_of_a_boxed_copy_raises():
    # x[1] on S(0) is a view of a B copy: reading is right, writing must not be lost quietly.
    a = logical((4, 6), 45)
    x = make(a, ALL, S(0))
    row = x[1]
    close(row, a[1])
    with pytest.raises(RuntimeError, match="the view is of a copy"):
        row.add_(1.0)
    close(x, a)


@pytest.mark.parametrize("sbp", SBP_1D, ids=ids(SBP_1D))
def test_ops_on_a_placement_of_some_ranks(sbp):
    # Ranks outside the placement hold empty pieces but follow the program; numpy() on
    # every rank still gives the logical value.
    a = logical((5, 6), 45)
    sub = flow.placement("cpu", [WORLD - 1] if WORLD == 2 else [1, 3])
    x = make(a, sub, sbp).requires_grad_()
    if not sub.has(RANK):
        assert x.to_local().numel() == 0
    y = (x @ x.T).relu().sum(dim=1)
    assert y.placement == sub
    close(y.detach(), np.maximum(a @ a.T, 0).sum(1))
    (y * y).sum().backward()
    assert x.grad.placement == sub and x.grad.sbp == (sbp,)
    want = _local_grad(lambda t: (t @ t.T).relu().sum(dim=1) ** 2, a)[0]
    close(x.grad, want)


# -- mixed placements -----------------------------------------------------------------------
def test_op_on_two_placements_names_both():
    x = make(logical((2, 2), 25), ALL, B)
    y = make(logical((2, 2), 26), flow.placement("cpu", [0]), B)
    with pytest.raises(RuntimeError, match=r"add.*same placement.*ranks=\[0, 1[^\]]*\]\).*"
                                           r"ranks=\[0\]"):
        x + y
    with pytest.raises(RuntimeError, match="local tensor among global"):
        x + flow.ones(2, 2)


def test_a_0d_tensor_on_another_placement_is_moved():
    a = logical((3, 2), 27)
    x = make(a, ALL, S(0))
    scale = make(np.array(3.0), flow.placement("cpu", [WORLD - 1]), B)
    y = x * scale
    assert y.placement == ALL
    close(y, a * 3)


# -- errors ----------------------------------------------------------------------------------
def test_errors_name_the_function_argument_and_values():
    x = make(logical((2, 4), 28), ALL, B)
    with pytest.raises(ValueError, match=r"split\(\): axis must be a non-negative int, got -1"):
        flow.sbp.split(-1)
    with pytest.raises(IndexError, match=r"to_global\(\): argument 'sbp' splits axis 5 of a "
                                         r"2-d tensor \(expected an axis in \[0, 1\]\)"):
        x.to_global(ALL, S(5))
    with pytest.raises(RuntimeError, match=r"to_local\(\): expected a global tensor, but got "
                                           r"a local tensor"):
        flow.ones(2).to_local()
    with pytest.raises(ValueError, match=r"argument 'sbp' has 1 entry \(S\(0\),\) but the "
                                         r"placement's hierarchy \[\d, \d\] has 2 axes"):
        x.to_global(GRID, S(0))
    with pytest.raises(ValueError, match=r"argument 'sbp' has 3 entries \(S\(0\), B, B\) but "
                                         r"the placement's hierarchy \[\d, \d\] has 2 axes"):
        x.to_global(GRID, (S(0), B, B))
    # (zeros() reports itself as full(), which it calls: reported to the lead)
    with pytest.raises(ValueError, match=r"\(\): argument 'sbp' has 2 entries \(B, B\)"):
        flow.zeros(2, placement=ALL, sbp=(B, B))
    with pytest.raises(ValueError, match=rf"rank {WORLD} is out of range"):
        flow.placement("cpu", [WORLD])


# -- the logical value never depends on the layout ------------------------------------------
def _mlp(x, w1, b1, w2):
    return (x @ w1 + b1).relu() @ w2


LAYOUTS = [
    # input x (8x6), w1 (6x10), b1 (10), w2 (10x4)
    (ALL, ((B,), (B,), (B,), (B,))),
    (ALL, ((S(0),), (B,), (B,), (B,))),  # data parallel
    (ALL, ((B,), (S(1),), (S(0),), (S(0),))),  # column- then row-parallel: a P output
    (ALL, ((S(1),), (S(0),), (B,), (S(1),))),  # a P hidden layer, boxed before relu
    (ALL, ((P,), (B,), (P,), (B,))),
    (GRID, ((S(0), B), (B, S(1)), (B, S(0)), (B, S(0)))),
    (GRID, ((S(0), S(1)), (B, S(0)), (B, B), (S(1), B))),
]


@pytest.mark.parametrize("case", range(len(LAYOUTS)))
def test_mlp_output_is_independent_of_placement_and_sbp(case):
    placement, sbps = LAYOUTS[case]
    arrays = [logical(s, 30 + i) for i, s in enumerate([(8, 6), (6, 10), (10,), (10, 4)])]
    want = _mlp(*[flow.tensor(a) for a in arrays]).numpy()
    out = _mlp(*[make(a, placement, s) for a, s in zip(arrays, sbps)])
    assert out.placement == placement
    close(out, want, f"layout {sbps}")
    for sbp in [(B,) * placement.ndim, (S(0),) * placement.ndim]:
        close(out.to_global(placement, sbp), want)


def test_a_partial_output_is_charged_for_its_reduction():
    """S(0) @ S(0) with a contraction of WORLD: making P needs the cheapest input boxing but
    leaves an 8x8 partial sum to reduce, so the S(0) signature wins (sbp.infer); either way
    the value is the single-device product."""
    a, b = logical((8, WORLD), 40), logical((WORLD, 8), 41)
    y = make(a, ALL, S(0)) @ make(b, ALL, S(0))
    assert y.sbp == (S(0),) and y.placement == ALL
    close(y, a @ b)
    z = make(a, ALL, S(1)) @ make(b, ALL, S(0))  # inputs that match: P, reduced on read
    assert z.sbp == (P,)
    close(z, a @ b)


def test_boxing_round_trips_keep_the_value():
    a = logical((5, 7), 40)
    for src in SBP_GRID:
        x = make(a, GRID, src)
        for dst in SBP_GRID:
            close(x.to_global(GRID, dst), a, f"{src} -> {dst}")
    sub = flow.placement("cpu", [1])  # another placement: send/recv of slices
    for sbp in SBP_1D:
        close(make(a, ALL, sbp).to_global(sub, B), a)
        close(make(a, sub, B).to_global(ALL, sbp), a)


def test_explain_names_the_collective():
    x = make(logical((4, 4), 41), ALL, P)
    assert re.search(r"all_reduce", flow.boxing.explain(x, ALL, B))
    assert re.search(r"reduce_scatter", flow.boxing.explain(x, ALL, S(0)))


def test_checkpoint_of_a_global_module_round_trips(tmp_path_factory):
    # One path for every rank: rank 0 makes the directory and shares its name.
    path = RAW.bcast(str(tmp_path_factory.mktemp("ckpt") / "model.safetensors")
                     if RANK == 0 else None, root=0)
    flow.manual_seed(11)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    want = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    model[0].weight = nn.Parameter(model[0].weight.detach().to_global(ALL, B).to_global(
        ALL, S(0)))
    model[0].bias = nn.Parameter(model[0].bias.detach().to_global(ALL, B).to_global(ALL, S(0)))
    model[2].to_global(ALL, B)
    with pytest.raises(ValueError, match="global_dst_rank"):
        flow.save(model.state_dict(), path)
    flow.save(model.state_dict(), path, global_dst_rank=0)
    RAW.Barrier()
    if RANK == 0:  # the file holds logical values, readable as a local checkpoint
        local = flow.load(path)
        assert set(local) == set(want)
        for k in want:
            np.testing.assert_array_equal(local[k].numpy(), want[k])
    loaded = flow.load(path, global_src_rank=0)
    assert all(t.is_global and t.sbp == (B,) for t in loaded.values())
    flow.manual_seed(12)  # different initial weights, same placements and SBPs
    fresh = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
    fresh[0].weight = nn.Parameter(fresh[0].weight.detach().to_global(ALL, B).to_global(
        ALL, S(0)))
    fresh[0].bias = nn.Parameter(fresh[0].bias.detach().to_global(ALL, B).to_global(ALL, S(0)))
    fresh[2].to_global(ALL, B)
    fresh.load_state_dict(loaded)
    assert fresh[0].weight.sbp == (S(0),) and fresh[2].weight.sbp == (B,)
    for k, v in fresh.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k])


def test_global_load_of_a_missing_file_fails_on_every_rank(tmp_path_factory):
    missing = RAW.bcast(str(tmp_path_factory.mktemp("none") / "absent.safetensors")
                        if RANK == 0 else None, root=0)
    with pytest.raises(OSError, match="rank 0 could not read"):
        flow.load(missing, global_src_rank=0)
    RAW.Barrier()  # every rank got here: none is left waiting for the file's bytes
