"""Placements, piece layout and boxing routes in one process; every transition under MPI.

Routes are metadata: building one needs no other rank, so the single-process tests here build
placements of up to 4 ranks with the world size patched (`world_of`). Running routes across
ranks is checked exhaustively by tests/sbp/boxing_check.py under `mpiexec -n 2` and `-n 4`.
"""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import numpy as np
import pytest

import sbpflow.comm as comm
from sbpflow._core import dtype as D
from sbpflow._core.meta import TensorMeta
from sbpflow.sbp import (
    B,
    P,
    S,
    balanced_bounds,
    boxing,
    local_shape,
    normalize_sbp,
    piece,
    placement,
)
from tests.mpijob import mpiexec_cmd, run_job

SBP_1D = (S(0), S(1), B, P)
MB4 = TensorMeta((1024, 1024), D.float32)  # 4 MB of float32
T = 4 << 20
# The step each 1-D transition takes, written out independently of boxing's table.
STEP_NAME = {("P", "B"): "all_reduce", ("P", "S"): "reduce_scatter", ("S", "B"): "all_gather",
             ("S", "S"): "all_to_all", ("B", "S"): "slice", ("B", "P"): "keep_on_first",
             ("S", "P"): "pad_with_zeros"}


def kind(x):
    return "P" if x == P else "B" if x == B else "S"


@pytest.fixture
def world_of(monkeypatch):
    """Let placements name ranks up to n-1 in this single process (routes need no peers)."""

    def patch(n):
        monkeypatch.setattr(comm, "get_world_size", lambda: n)

    return patch


# -- placements --------------------------------------------------------------------------
def test_placement_repr_equality_hash(world_of):
    world_of(4)
    p = placement("cpu", [0, 1])
    assert repr(p) == 'sbpflow.placement(type="cpu", ranks=[0, 1])'
    assert str(p) == repr(p)
    assert p == placement("cpu", [0, 1]) and hash(p) == hash(placement("cpu", range(2)))
    assert p != placement("cpu", [1, 0])  # the order is the parallel-id order
    assert p != placement("mock", [0, 1])
    assert placement("cpu", [[0, 1], [2, 3]]) != placement("cpu", [0, 1, 2, 3])
    assert len({p, placement("cpu", [0, 1]), placement("cpu", [0, 2])}) == 2
    with pytest.raises(AttributeError):
        p.type = "mock"


def test_placements_pickle_and_copy_by_value(world_of):
    """OneFlow's placements pickle, copy and deepcopy (modules holding one deepcopy them)."""
    import copy
    import pickle

    world_of(4)
    for p in (placement("cpu", [0, 1]), placement("cpu", [[0, 1], [2, 3]])):
        back = pickle.loads(pickle.dumps(p))
        assert back == p and hash(back) == hash(p) and back.hierarchy == p.hierarchy
        assert copy.copy(p) is p and copy.deepcopy({"p": p})["p"] is p
    data = pickle.dumps(placement("cpu", [0, 3]))
    world_of(1)  # a placement naming ranks this job lacks does not unpickle silently
    with pytest.raises(ValueError, match="out of range"):
        pickle.loads(data)


def test_placement_hierarchy_and_groups(world_of):
    world_of(4)
    grid = placement("cpu", [[0, 1], [2, 3]])
    assert grid.hierarchy == (2, 2) and grid.ndim == 2 and grid.size == 4
    assert grid.ranks == [[0, 1], [2, 3]] and grid.rank_list == (0, 1, 2, 3)
    assert grid.coords(2) == (1, 0) and grid.rank_at((0, 1)) == 1
    assert grid.axis_ranks(1, 0) == (1, 3) and grid.axis_ranks(1, 1) == (0, 1)
    assert grid.flatten() == placement("cpu", [0, 1, 2, 3])
    odd = placement("cpu", [3, 0, 2])
    assert odd.index_of(0) == 1 and odd.has(2) and not odd.has(1)


def test_placement_rejects_ranks_outside_the_job():
    # The real world here is one process: only rank 0 exists.
    assert placement("cpu", [0]).ranks == [0]
    with pytest.raises(ValueError, match=r"rank 1 is out of range: the job has 1 rank"):
        placement("cpu", [0, 1])
    with pytest.raises(ValueError, match="distinct"):
        placement("cpu", [0, 0])
    with pytest.raises(TypeError, match="ranks"):
        placement("cpu", 0)


# -- layout ------------------------------------------------------------------------------
def test_balanced_pieces_first_ranks_get_one_more(world_of):
    world_of(4)
    p = placement("cpu", [0, 1, 2, 3])
    rows = [piece((5, 3), p, (S(0),), r)[0] for r in range(4)]
    assert [s.stop - s.start for s in rows] == [2, 1, 1, 1]
    assert [(s.start, s.stop) for s in rows] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert balanced_bounds(5, 4) == ((0, 2), (2, 3), (3, 4), (4, 5))
    # An axis shorter than the rank count leaves the last pieces empty.
    assert [local_shape((3, 2), p, (S(0),), r) for r in range(4)] == [(1, 2)] * 3 + [(0, 2)]
    assert local_shape((3, 2), p, (B,), 2) == (3, 2) == local_shape((3, 2), p, (P,), 2)


def test_nested_2d_pieces(world_of):
    world_of(4)
    grid = placement("cpu", [[0, 1], [2, 3]])

    def box(shape, sbp, r):
        return [(s.start, s.stop) for s in piece(shape, grid, sbp, r)]

    # (S0, S1): quadrants.
    assert box((4, 6), (S(0), S(1)), 2) == [(2, 4), (0, 3)]
    # (S0, S0): grid axis 0 cuts first, then axis 1 cuts each half: 5 rows -> 3+2 -> 2,1,1,1.
    assert [box((5, 2), (S(0), S(0)), r)[0] for r in range(4)] == [(0, 2), (2, 3), (3, 4),
                                                                    (4, 5)]
    # (B, S1): each row of the grid holds the column halves.
    assert box((4, 6), (B, S(1)), 3) == [(0, 4), (3, 6)]
    assert box((4, 6), (P, S(0)), 1) == [(2, 4), (0, 6)]


def test_normalize_sbp_errors(world_of):
    world_of(4)
    grid = placement("cpu", [[0, 1], [2, 3]])
    assert normalize_sbp([S(0), B], grid) == (S(0), B)
    assert normalize_sbp(B, placement("cpu", [0, 1])) == (B,)
    with pytest.raises(ValueError, match=r"has 1 entry \(B,\) but the placement's hierarchy "
                                         r"\[2, 2\] has 2 axes"):
        normalize_sbp(B, grid)
    with pytest.raises(ValueError, match="to_global.*3 entries"):
        normalize_sbp((B, B, B), grid)
    with pytest.raises(TypeError, match="must hold SBP values, got 0"):
        normalize_sbp((B, 0), grid)
    with pytest.raises(TypeError, match="must be an SBP"):
        normalize_sbp("B", grid)
    with pytest.raises(ValueError, match="non-negative int, got -1"):
        S(-1)


# -- routes and explain ---------------------------------------------------------------------
def test_explain_strings(world_of):
    world_of(4)
    two = placement("cpu", [0, 1])
    route = boxing.route(MB4, two, (P,), two, (B,))
    assert route.explain() == "P -> B: all_reduce over ranks [0, 1], 4.0 MB"
    assert boxing.route(MB4, two, (S(0),), two, (S(0),)).explain() == "S(0) -> S(0): nothing to do"
    assert boxing.route(MB4, two, (B,), two, (S(1),)).explain() == (
        "B -> S(1): slice on ranks [0, 1], 4.0 MB")
    grid = placement("cpu", [[0, 1], [2, 3]])
    lines = boxing.route(MB4, grid, (S(0), S(1)), grid, (B, B)).explain().splitlines()
    assert lines == [
        "(S(0), S(1)) -> (S(0), B): all_gather along grid axis 1 over ranks [[0, 1], [2, 3]], "
        "2.0 MB per group",
        "(S(0), B) -> (B, B): all_gather along grid axis 0 over ranks [[0, 2], [1, 3]], "
        "4.0 MB per group"]
    moved = boxing.route(MB4, two, (S(0),), placement("cpu", [2, 3]), (S(0),)).explain()
    assert moved == ("S(0) on ranks [0, 1] -> S(0) on ranks [2, 3]: send_recv of intersecting "
                     "slices, 2 messages (4.0 MB) and 0 local copies")


def test_flow_boxing_explain_takes_a_tensor(world_of):
    world_of(2)
    two = placement("cpu", [0, 1])
    tensor = SimpleNamespace(shape=(1024, 1024), dtype=D.float32, placement=two, sbp=(P,))
    assert boxing.explain(tensor, two, B) == "P -> B: all_reduce over ranks [0, 1], 4.0 MB"
    assert "reduce_scatter" in boxing.explain(tensor, two, [S(1)])
    with pytest.raises(ValueError, match=r"boxing.explain\(\).*has 2 entries"):
        boxing.explain(tensor, two, (B, B))
    with pytest.raises(IndexError, match=r"boxing.explain\(\).*splits axis 2 of a 2-d tensor"):
        boxing.explain(tensor, two, S(2))
    with pytest.raises(TypeError, match=r"boxing.explain\(\): tensor must be global"):
        boxing.explain(np.zeros(3), two, B)


@pytest.mark.parametrize("n", [2, 4])
def test_route_table_covers_every_1d_pair(world_of, n):
    world_of(4)
    p = placement("cpu", list(range(n)))
    for src, dst in itertools.product(SBP_1D, repeat=2):
        route = boxing.route(MB4, p, (src,), p, (dst,))
        assert len(route.steps) == 1, route.explain()
        step = route.steps[0]
        want = "copy" if src == dst else STEP_NAME[kind(src), kind(dst)]
        assert step.name == want, (src, dst, step.name)
        assert step.describe() == route.explain()
        assert route.participants() == tuple(range(n))
        assert route.src == (p, (src,)) and route.dst == (p, (dst,))
        assert route.cost == step.cost == boxing.cost(MB4, p, (src,), p, (dst,))
        assert boxing.route(MB4, p, (src,), p, (dst,)) is route  # cached


def test_cost_model_order_and_values(world_of):
    world_of(4)
    for n in (2, 4):
        p = placement("cpu", list(range(n)))

        def c(src, dst, p=p):
            return boxing.cost(MB4, p, (src,), p, (dst,))

        assert c(P, B) == 2 * T * (n - 1)
        assert c(P, S(0)) == c(S(1), B) == T * (n - 1)
        assert c(S(0), S(1)) == T * (n - 1) / n
        assert c(B, S(1)) == 1
        assert c(B, B) == c(P, P) == c(S(0), S(0)) == 0
        assert c(P, B) > c(S(0), B) > c(S(0), S(1)) > c(B, S(0)) > c(S(0), S(0)) == 0
        # Anything -> P loses to every transition that does not produce P.
        assert min(c(B, P), c(S(0), P)) >= T * n * 10 > c(P, B)
    two, four = placement("cpu", [0, 1]), placement("cpu", [0, 1, 2, 3])
    # Different placements cost the bytes moved: [0, 1] S(0) -> [2, 3] S(0) moves everything.
    assert boxing.cost(MB4, two, (S(0),), placement("cpu", [2, 3]), (S(0),)) == T
    assert boxing.cost(MB4, four, (B,), two, (S(0),)) == 0  # ranks 0 and 1 hold their rows
    # nd: the sum over the axis steps, each counted once per group.
    grid = placement("cpu", [[0, 1], [2, 3]])
    assert boxing.cost(MB4, grid, (S(0), S(1)), grid, (B, B)) == T / 2 * 2 + T * 2
    assert boxing.cost(MB4, grid, (P, P), grid, (B, B)) == 2 * T * 2 + 2 * T * 2


def test_nd_routes_middle_states_and_fallback(world_of):
    world_of(4)
    grid = placement("cpu", [[0, 1], [2, 3]])

    def names(src, dst):
        return [s.name for s in boxing.route(MB4, grid, src, grid, dst).steps]

    assert names((P, P), (B, B)) == ["all_reduce", "all_reduce"]
    assert names((S(0), B), (S(0), S(1))) == ["slice"]
    # (S0, B) -> (B, S0) must gather first: slicing axis 1 first would leave (S0, S0), whose
    # axis 0 can no longer be gathered on its own.
    text = boxing.route(MB4, grid, (S(0), B), grid, (B, S(0))).explain()
    assert text.splitlines()[0].startswith("(S(0), B) -> (B, B): all_gather along grid axis 0")
    assert text.splitlines()[1].startswith("(B, B) -> (B, S(0)): slice along grid axis 1")
    # No axis order is valid: the general path moves the intersecting slices.
    assert names((S(0), S(1)), (S(1), S(0))) == ["send_recv"]
    assert names((S(0), S(0)), (B, S(0))) == ["send_recv"]
    # P reduced inside the source first (a middle state), then moved.
    assert names((P, S(0)), (S(0), S(0))) == ["reduce_scatter", "send_recv"]
    assert names((P, S(0)), (S(1), S(0))) == ["reduce_scatter"]  # axis 0 alone is valid
    # A grid axis of one rank: the step is a copy.
    col = placement("cpu", [[0], [1]])
    assert [s.name for s in boxing.route(MB4, col, (S(0), P), col, (S(0), B)).steps] == ["copy"]


def test_general_path_to_p_keeps_data_on_one_rank(world_of):
    world_of(4)
    route = boxing.route(MB4, placement("cpu", [0, 1]), (P,), placement("cpu", [1, 2, 3]), (P,))
    assert [s.name for s in route.steps] == ["reduce_scatter", "send_recv"]
    assert "one rank per P group holds the data" in route.explain()
    assert route.participants() == (0, 1, 2, 3)


def test_route_argument_errors(world_of):
    world_of(2)
    two = placement("cpu", [0, 1])
    with pytest.raises(ValueError, match=r"boxing.route\(\): src_sbp must be a tuple of 1 SBP"):
        boxing.route(MB4, two, (S(0), B), two, (B,))
    with pytest.raises(IndexError, match=r"boxing.route\(\): argument 'dst_sbp' splits axis 3"):
        boxing.route(MB4, two, (B,), two, (S(3),))
    with pytest.raises(TypeError, match=r"boxing.cost\(\): dst_placement must be a placement"):
        boxing.cost(MB4, two, (B,), [0, 1], (B,))


# -- running in one process -------------------------------------------------------------
def test_run_on_one_rank_is_a_fresh_copy_of_the_value():
    world = comm.world()
    one = placement("cpu", [0])
    meta = TensorMeta((3, 4), D.float64)
    x = np.arange(12.0).reshape(3, 4)
    for src, dst in itertools.product(SBP_1D, repeat=2):
        route = boxing.route(meta, one, (src,), one, (dst,))
        out = route.run(x, world)
        assert np.array_equal(out, x) and not np.shares_memory(out, x)
        assert out.flags.c_contiguous and out.dtype == np.float64
    # A non-contiguous input works too.
    out = boxing.route(meta, one, (S(1),), one, (B,)).run(np.asfortranarray(x), world)
    assert np.array_equal(out, x) and out.flags.c_contiguous


def test_run_checks_its_input():
    world = comm.world()
    one = placement("cpu", [0])
    route = boxing.route(TensorMeta((3, 4), D.float32), one, (P,), one, (B,))
    with pytest.raises(ValueError, match=re.escape(
            "boxing.BoxingRoute.run(): local must be rank 0's piece under P: a float32 array of "
            "shape (3, 4), got float64 (3, 4)")):
        route.run(np.zeros((3, 4)), world)
    with pytest.raises(ValueError, match="got float32 \\(4, 3\\)"):
        route.run(np.zeros((4, 3), np.float32), world)
    with pytest.raises(ValueError, match="got 'NoneType'"):
        route.run(None, world)


# -- every transition across ranks ------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
def test_every_transition_keeps_the_value_under_mpi(n):
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", "tests/sbp/boxing_check.py"), timeout=120)
    assert job.returncode == 0, job.output
    found = {int(r): int(k) for r, k in re.findall(r"rank (\d+): (\d+) cases passed", job.stdout)}
    assert sorted(found) == list(range(n)), job.output
    assert len(set(found.values())) == 1 and min(found.values()) > 1500, job.output
    assert job.strays == 0
