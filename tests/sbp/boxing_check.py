"""Every boxing transition on 2 or 4 ranks keeps the logical value (NumPy is the oracle).

Run as `mpiexec -n N python -m mpi4py tests/sbp/boxing_check.py` (N = 2 or 4); launched by
tests/sbp/test_boxing.py. All ranks build the same logical array from a seed; each rank cuts
its source piece with NumPy slicing (`layout.piece`); for a P source the pieces are random
integer summands whose sum is exact in every dtype. After `BoxingRoute.run`, a rank's piece
must equal the NumPy slice of the logical array; for a P destination the pieces of each P group are
gathered and must add up to it. Also checked: shape, dtype, C order, no aliasing of the input,
a second run (the prepared path) gives the same, and `explain` names the expected step.
Prints "rank R: N cases passed" at the end; any failure raises, and the job aborts.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
from mpi4py import MPI

from sbpflow import comm
from sbpflow._core import dtype as D
from sbpflow._core.meta import TensorMeta
from sbpflow.sbp import B, P, S, boxing, local_shape, piece, placement

world = comm.world()
rank, size = world.rank, world.size
assert size in (2, 4), f"boxing_check runs on 2 or 4 ranks, got {size}"
raw = MPI.COMM_WORLD

SBP_1D = (S(0), S(1), B, P)
DTYPES = (D.float32, D.float64, D.int64)
# The step each 1-D same-placement transition must use (independent of boxing's table).
EXPECTED_STEP = {("P", "B"): "all_reduce", ("P", "S"): "reduce_scatter",
                 ("S", "B"): "all_gather", ("S", "S"): "all_to_all", ("B", "S"): "slice",
                 ("B", "P"): "keep_on_first", ("S", "P"): "pad_with_zeros"}


def kind(x):
    return "P" if x == P else "B" if x == B else "S"


def pl(ranks):
    return placement("cpu", ranks)


def logical_array(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype is D.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(-9, 10, shape).astype(dtype.np)


def take(a, box):
    """a[box] as an array view (a 0-d array indexed by () would give a scalar)."""
    return a[box] if box else a[...]


def p_group(placement_, nd_sbp, r):
    """The ranks whose pieces add up to r's part of the logical tensor: those that share r's
    coordinates on every non-P grid axis."""
    coords = placement_.coords(r)
    return [m for m in placement_.rank_list
            if all(placement_.coords(m)[k] == coords[k]
                   for k, x in enumerate(nd_sbp) if x != P)]


def source_piece(logical, placement_, nd_sbp, r, seed):
    """Rank r's piece under (placement, nd_sbp); for P, integer summands that add up exactly."""
    box = piece(logical.shape, placement_, nd_sbp, r)
    cut = lambda a: take(a, box)  # noqa: E731
    if P not in nd_sbp:
        return cut(logical).copy()
    group = p_group(placement_, nd_sbp, r)

    def noise(m):
        rng = np.random.default_rng((seed, m, 7))
        return cut(rng.integers(-5, 6, logical.shape).astype(logical.dtype))

    if r != group[0]:
        return np.array(noise(r))
    rest = sum((noise(m) for m in group[1:]), np.zeros_like(cut(logical)))
    return np.array(cut(logical) - rest)  # 0-d arithmetic gives a scalar: make an array


def expected_name(src_pl, src_sbp, dst_pl, dst_sbp):
    if src_pl != dst_pl:
        return None  # checked separately: send_recv / local_copy
    if src_sbp == dst_sbp:
        return "nothing to do"
    if src_pl.ndim == 1 and src_pl.size > 1:
        return EXPECTED_STEP[kind(src_sbp[0]), kind(dst_sbp[0])]
    return None


cases = 0


def check(shape, dtype, src_pl, src_sbp, dst_pl, dst_sbp, seed):
    global cases
    label = (f"{shape} {dtype} {src_sbp} on {src_pl.ranks} -> {dst_sbp} on {dst_pl.ranks}")
    meta = TensorMeta(shape, dtype)
    logical = logical_array(shape, dtype, seed)
    route = boxing.route(meta, src_pl, src_sbp, dst_pl, dst_sbp)
    text = route.explain()
    want_name = expected_name(src_pl, src_sbp, dst_pl, dst_sbp)
    if want_name is not None:
        assert want_name in text, f"{label}: explain {text!r} lacks {want_name!r}"
    if src_pl != dst_pl:
        assert "send_recv" in text or "local_copy" in text, f"{label}: explain {text!r}"
    assert len(text.splitlines()) == len(route.steps), f"{label}: {text!r}"
    assert route.participants() == tuple(sorted(set(src_pl.rank_list) | set(dst_pl.rank_list)))

    out = None
    if rank in route.participants():
        local = (source_piece(logical, src_pl, src_sbp, rank, seed) if src_pl.has(rank)
                 else None)
        before = None if local is None else local.copy()
        out = route.run(local, world)
        if local is not None:
            assert np.array_equal(local, before), f"{label}: run() wrote into its input"
        if dst_pl.has(rank):
            want_shape = local_shape(shape, dst_pl, dst_sbp, rank)
            assert isinstance(out, np.ndarray), f"{label}: rank {rank} got {out!r}"
            assert out.shape == want_shape, f"{label}: shape {out.shape} != {want_shape}"
            assert out.dtype == dtype.np, f"{label}: dtype {out.dtype} != {dtype.np}"
            assert out.flags.c_contiguous, f"{label}: result is not C-contiguous"
            assert local is None or not np.shares_memory(out, local), (
                f"{label}: the result aliases the input")
            if P not in dst_sbp:
                want = take(logical, piece(shape, dst_pl, dst_sbp, rank))
                assert np.array_equal(out, want), f"{label}: rank {rank}\n{out}\n!=\n{want}"
        else:
            assert out is None, f"{label}: rank {rank} is not in dst but got {out!r}"
        # The prepared path: a second run on the same input gives the same piece.
        again = route.run(None if local is None else local.copy(), world)
        assert (again is None and out is None) or np.array_equal(again, out), (
            f"{label}: second run differs")
    if P in dst_sbp:
        # Gather every dst rank's piece; each P group must add up to the logical slice.
        pieces = raw.allgather(out)
        for r in dst_pl.rank_list:
            group = p_group(dst_pl, dst_sbp, r)
            if r != group[0]:
                continue
            total = sum((pieces[m].astype(np.float64) for m in group),
                        np.zeros(pieces[r].shape))
            want = take(logical, piece(shape, dst_pl, dst_sbp, r)).astype(np.float64)
            assert np.array_equal(total, want), f"{label}: P group {group} sums to\n{total}"
    cases += 1


def valid(nd_sbp, ndim):
    return all(not (x != B and x != P and x.axis >= ndim) for x in nd_sbp)


def run_all(pairs_of_placements, sbps_src, sbps_dst, shapes, dtypes, seed0):
    seed = seed0
    for (src_pl, dst_pl), shape in itertools.product(pairs_of_placements, shapes):
        for src_sbp, dst_sbp in itertools.product(sbps_src(src_pl), sbps_dst(dst_pl)):
            if not (valid(src_sbp, len(shape)) and valid(dst_sbp, len(shape))):
                continue
            seed += 1
            dtype = dtypes[seed % len(dtypes)]
            check(shape, dtype, src_pl, src_sbp, dst_pl, dst_sbp, seed)
            if P not in src_sbp and P not in dst_sbp and seed % 2 == 0:
                check(shape, D.bool_, src_pl, src_sbp, dst_pl, dst_sbp, seed)
    return seed


def nd_sbps(placement_):
    return list(itertools.product(SBP_1D, repeat=placement_.ndim))


start = time.perf_counter()
if size == 4:
    all4 = pl([0, 1, 2, 3])
    one_d = [
        (all4, all4),  # same placement
        (pl([3, 0, 2]), pl([3, 0, 2])),  # same, unsorted ranks, rank 1 idle
        (pl([0, 1]), pl([1, 2, 3])),  # overlapping
        (pl([0, 1]), pl([2, 3])),  # disjoint
        (all4, pl([1, 2])),  # subset
        (all4, pl([3])),  # to one rank
        (pl([2]), all4),  # one rank to many
        (pl([1, 2]), pl([3, 2, 1, 0])),  # onto a superset, reversed order
    ]
    seed = 0
    for dtype in DTYPES:  # every pair in every dtype
        seed = run_all(one_d, nd_sbps, nd_sbps, [(5, 7), (3, 2)], (dtype,), seed)
    seed = run_all(one_d[:1] + one_d[2:3], nd_sbps, nd_sbps, [(), (6,), (4, 0)], DTYPES, seed)
    grid = pl([[0, 1], [2, 3]])
    for dtype in DTYPES:
        seed = run_all([(grid, grid)], nd_sbps, nd_sbps, [(16, 16), (5, 7)], (dtype,), seed)
    seed = run_all([(grid, grid)], nd_sbps, nd_sbps, [(3, 2, 2)], DTYPES, seed)
    other = pl([[0, 2], [1, 3]])  # the transposed grid: same ranks, other groups
    seed = run_all([(grid, all4), (all4, grid), (grid, pl([1, 2])), (pl([3, 1]), grid),
                    (grid, other), (pl([[3, 1]]), grid)], nd_sbps, nd_sbps, [(5, 7), (2, 3)],
                   DTYPES, seed)
else:
    both = pl([0, 1])
    one_d = [(both, both), (pl([1, 0]), pl([1, 0])), (pl([0]), both), (both, pl([1])),
             (both, pl([1, 0])), (pl([1]), pl([0]))]
    seed = 0
    for dtype in DTYPES:  # every pair in every dtype
        seed = run_all(one_d, nd_sbps, nd_sbps, [(5, 7), (1, 3)], (dtype,), seed)
    seed = run_all(one_d[:1] + one_d[2:3], nd_sbps, nd_sbps, [(), (4, 0)], DTYPES, seed)
    row, col = pl([[0, 1]]), pl([[0], [1]])  # 1x2 and 2x1 grids: one axis has one rank
    seed = run_all([(row, row), (col, col), (row, col), (col, both)], nd_sbps, nd_sbps,
                   [(4, 6), (3, 1)], DTYPES, seed)

# A rank outside the route's placements may not run it: a clear error, before any message.
only0 = boxing.route(TensorMeta((2,), D.float32), pl([0]), (B,), pl([0]), (S(0),))
if rank != 0:
    try:
        only0.run(None, world)
    except ValueError as e:
        assert f"rank {rank} is not a participant [0]" in str(e), e
    else:
        raise AssertionError("run() on a non-participant did not raise")

raw.Barrier()
print(f"rank {rank}: {cases} cases passed in {time.perf_counter() - start:.1f} s")
sys.stdout.flush()
