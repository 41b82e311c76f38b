"""Every array collective of `sbpflow.comm.world()` against NumPy, on 2 or 4 ranks.

Run as `mpiexec -n N python -m mpi4py check_collectives.py`. Each rank's input is a
deterministic function of (rank, case), so every rank computes all ranks' inputs and the
expected result with NumPy alone. Inputs are small integers (stored in every dtype), so
sums and products are exact in every dtype, bfloat16 included, and results compare exactly.
mpi4py's pickle is replaced by one that raises: any pickling of a message fails the run.
Prints "rank R: N checks passed" at the end.
"""

import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

from sbpflow import comm


def _no_pickling(*args, **kwargs):
    raise AssertionError("a message was pickled; collectives must use MPI's buffer API")


MPI.pickle.__init__(_no_pickling, _no_pickling)

world = comm.world()
rank, size = world.rank, world.size
assert (rank, size) == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
checks = 0

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float32, np.float64, np.int64, np.int32, np.int16, np.int8, np.uint8,
          np.float16, BF16, np.bool_]


def data(r, shape, dtype, case, low=-4, high=5):
    """Rank r's input for a case: small integers (or booleans) in the dtype."""
    rng = np.random.default_rng(1000 * case + r)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.dtype(dtype) == np.uint8:
        low = max(low, 0)
    return rng.integers(low, high, shape).astype(dtype)


def check(name, got, want):
    global checks
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"rank {rank}: {name}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"rank {rank}: {name}: shape {got.shape} != {want.shape}"
    same = np.array_equal(got.astype(np.float64), want.astype(np.float64))
    assert same, f"rank {rank}: {name}:\n got {got}\nwant {want}"
    checks += 1


def reduce_all(arrays, op):
    """NumPy's reduction over ranks, in float64 for exactness, cast back."""
    dtype = arrays[0].dtype
    if dtype == np.bool_:
        fn = np.any if op in ("sum", "max") else np.all
        return fn(np.stack(arrays), axis=0)
    stack = np.stack([a.astype(np.float64) for a in arrays])
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
    return fn(stack, axis=0).astype(dtype)


def balanced(total, parts):
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- all_reduce: every dtype and op, in place, with out=, non-contiguous, 0-d -------------
case = 0
for dtype in DTYPES:
    for op in ("sum", "prod", "max", "min"):
        case += 1
        low, high = (1, 3) if op == "prod" else (-4, 5)  # products stay exact and in range
        ins = [data(r, (3, 4), dtype, case, low, high) for r in range(size)]
        want = reduce_all(ins, op)
        buf = ins[rank].copy()
        out = world.all_reduce(buf, op)
        assert out is buf, "all_reduce must work in place"
        check(f"all_reduce {np.dtype(dtype)} {op}", buf, want)
        src = ins[rank].copy()
        res = np.empty_like(src)
        world.all_reduce(src, comm.ReduceOp(op), out=res)
        check(f"all_reduce out= {np.dtype(dtype)} {op}", res, want)
        check(f"all_reduce out= leaves buf {np.dtype(dtype)}", src, ins[rank])

case += 1
ins = [data(r, (4, 6), np.float64, case) for r in range(size)]
big = ins[rank].copy()
view = big.T[::2]  # non-contiguous in-place target
world.all_reduce(view, "sum")
expected = ins[rank].copy()
expected.T[::2] = reduce_all([a.T[::2] for a in ins], "sum")
check("all_reduce non-contiguous view in place", big, expected)

scalar = np.array(float(rank + 1))
world.all_reduce(scalar)
check("all_reduce 0-d", scalar, np.array(float(size * (size + 1) // 2)))

rng_float = [np.random.default_rng(77 + r).standard_normal(1000) for r in range(size)]
got = world.all_reduce(rng_float[rank].copy())
assert np.allclose(got, np.sum(rng_float, axis=0), rtol=1e-12, atol=1e-12)
checks += 1

# -- all_gather: even, uneven (with a rank holding zero rows), sizes given or exchanged ----
for dtype in (np.float32, np.int64, BF16, np.bool_):
    case += 1
    ins = [data(r, (2, 3), dtype, case) for r in range(size)]
    check(f"all_gather even {np.dtype(dtype)}", world.all_gather(ins[rank]),
          np.concatenate(ins))
    rows = [(r * 2 + 1) % 4 for r in range(size)]  # 1, 3, 1, 3 ... uneven
    rows[-1] = 0  # the last rank sends nothing
    ins = [data(r, (rows[r], 2, 2), dtype, case) for r in range(size)]
    want = np.concatenate(ins)
    check(f"all_gather uneven exchanged {np.dtype(dtype)}", world.all_gather(ins[rank]), want)
    check(f"all_gather uneven sizes= {np.dtype(dtype)}",
          world.all_gather(ins[rank], sizes=rows), want)
check("all_gather 0-d", world.all_gather(np.array(rank * 10)), np.arange(size) * 10)

# Ranks that disagree on the row size get the same error on every rank (no corruption).
if size > 1:
    try:
        world.all_gather(np.zeros((1, 2 + (rank == size - 1))))
    except ValueError as exc:
        assert "rows of" in str(exc), str(exc)
        checks += 1
    else:
        raise AssertionError(f"rank {rank}: all_gather with mismatched rows did not raise")

# -- reduce_scatter: balanced default (uneven: 5 rows), explicit sizes, half precision ----
for dtype, op in ((np.float32, "sum"), (np.int64, "max"), (BF16, "sum"), (np.float16, "min"),
                  (np.bool_, "sum")):
    case += 1
    ins = [data(r, (5, 3), dtype, case) for r in range(size)]
    total = reduce_all(ins, op)
    sizes = balanced(5, size)
    start = sum(sizes[:rank])
    check(f"reduce_scatter balanced {np.dtype(dtype)} {op}",
          world.reduce_scatter(ins[rank], op), total[start:start + sizes[rank]])
    sizes = [0] * size
    sizes[0] += 2
    sizes[-1] += 3
    start = sum(sizes[:rank])
    check(f"reduce_scatter sizes= {np.dtype(dtype)} {op}",
          world.reduce_scatter(ins[rank], op, sizes=sizes), total[start:start + sizes[rank]])

# -- all_to_all: uneven blocks, recv sizes exchanged or given, and the balanced default ----
for dtype in (np.float64, np.int32, BF16):
    case += 1

    def send_sizes(r):
        return [(r + j) % 3 for j in range(size)]

    ins = [data(r, (sum(send_sizes(r)), 2), dtype, case) for r in range(size)]

    def block(r, j, ins=ins):  # what rank r sends to rank j
        s = send_sizes(r)
        return ins[r][sum(s[:j]):sum(s[:j + 1])]

    want = np.concatenate([block(j, rank) for j in range(size)])
    check(f"all_to_all uneven exchanged {np.dtype(dtype)}",
          world.all_to_all(ins[rank], send_sizes(rank)), want)
    recv_sizes = [send_sizes(j)[rank] for j in range(size)]
    check(f"all_to_all uneven sizes given {np.dtype(dtype)}",
          world.all_to_all(ins[rank], send_sizes(rank), recv_sizes), want)
    even = [data(r, (2 * size, 3), dtype, case + 500) for r in range(size)]
    want = np.concatenate([even[j][2 * rank:2 * rank + 2] for j in range(size)])
    check(f"all_to_all even default {np.dtype(dtype)}", world.all_to_all(even[rank]), want)

# -- preallocated receive buffers (out=), contiguous or not, half precision ---------------
case += 1
ins = [data(r, (r + 1, 3), np.int32, case) for r in range(size)]
rows = [r + 1 for r in range(size)]
out = np.zeros((sum(rows), 3), np.int32)
assert world.all_gather(ins[rank], sizes=rows, out=out) is out
check("all_gather out=", out, np.concatenate(ins))
wide = np.zeros((sum(rows), 6), np.int32)
world.all_gather(ins[rank], out=wide[:, ::2])  # a non-contiguous receive buffer
check("all_gather non-contiguous out=", wide[:, ::2], np.concatenate(ins))
check("all_gather non-contiguous out= leaves the gaps", wide[:, 1::2],
      np.zeros((sum(rows), 3), np.int32))
for dtype in (np.float64, BF16):
    full = [data(r, (2 * size + 1, 2), dtype, case) for r in range(size)]
    sizes = balanced(2 * size + 1, size)
    start = sum(sizes[:rank])
    out = np.zeros((sizes[rank], 2), dtype)
    assert world.reduce_scatter(full[rank], "sum", out=out) is out
    check(f"reduce_scatter out= {np.dtype(dtype)}", out,
          reduce_all(full, "sum")[start:start + sizes[rank]])
    out = np.zeros((2 * size, 2), dtype)
    even = [data(r, (2 * size, 2), dtype, case + 1) for r in range(size)]
    assert world.all_to_all(even[rank], out=out) is out
    check(f"all_to_all out= {np.dtype(dtype)}", out,
          np.concatenate([even[j][2 * rank:2 * rank + 2] for j in range(size)]))
try:
    world.all_gather(ins[rank], sizes=rows, out=np.zeros((sum(rows) + 1, 3), np.int32))
except ValueError as exc:
    assert f"out is int32 ({sum(rows) + 1}, 3)" in str(exc), str(exc)
    checks += 1
else:
    raise AssertionError("all_gather into a wrongly shaped out= must raise")

# -- broadcast, reduce -----------------------------------------------------------------
for dtype in (np.float32, np.int8, BF16, np.bool_):
    case += 1
    ins = [data(r, (3, 5), dtype, case) for r in range(size)]
    root = size - 1
    buf = ins[rank].copy()
    assert world.broadcast(buf, root) is buf
    check(f"broadcast {np.dtype(dtype)}", buf, ins[root])
    big = ins[rank].copy()
    world.broadcast(big[:, ::2], 0)  # non-contiguous
    expected = ins[rank].copy()
    expected[:, ::2] = ins[0][:, ::2]
    check(f"broadcast non-contiguous {np.dtype(dtype)}", big, expected)
    root = 1 % size
    buf = ins[rank].copy()
    world.reduce(buf, root, "sum")
    check(f"reduce {np.dtype(dtype)}", buf,
          reduce_all(ins, "sum") if rank == root else ins[rank])

# -- gather (uneven), scatter (uneven) ------------------------------------------------------
for dtype in (np.float64, np.uint8, np.float16):
    case += 1
    rows = [r % 3 for r in range(size)]
    ins = [data(r, (rows[r], 4), dtype, case) for r in range(size)]
    for sizes in (None, rows):
        got = world.gather(ins[rank], root=0, sizes=sizes)
        if rank == 0:
            check(f"gather uneven {np.dtype(dtype)} sizes={sizes}", got, np.concatenate(ins))
        else:
            assert got is None
    root = size - 1
    full = data(root, (sum(rows) + 0, 4), dtype, case + 900)
    for sizes in (None, rows):
        out = np.full((rows[rank], 4), 7, dtype)
        world.scatter(out, full if rank == root else None, root, sizes=sizes)
        start = sum(rows[:rank])
        check(f"scatter uneven {np.dtype(dtype)} sizes={sizes}", out,
              full[start:start + rows[rank]])

# -- send / recv: a ring, small and large (rendezvous) messages, bfloat16 -------------------
for shape, dtype in (((3,), np.int64), ((512, 512), np.float32), ((4, 4), BF16)):
    case += 1
    nxt, prev = (rank + 1) % size, (rank - 1) % size
    mine = data(rank, shape, dtype, case)
    buf = np.zeros(shape, dtype)
    if rank % 2 == 0:
        world.send(mine, nxt, tag=case)
        world.recv(buf, prev, tag=case)
    else:
        world.recv(buf, prev, tag=case)
        world.send(mine, nxt, tag=case)
    check(f"send/recv ring {np.dtype(dtype)} {shape}", buf, data(prev, shape, dtype, case))

world.barrier()

# -- sub-communicators: groups, reversed order, cache, 2-D hierarchy axes -----------------
case += 1
ins = [data(r, (2, 3), np.int64, case) for r in range(size)]
assert world.group(range(size)) is world
rev = world.group(list(reversed(range(size))))
assert rev is world.group(tuple(reversed(range(size)))), "groups must be cached"
assert rev.rank == size - 1 - rank and rev.world_ranks == tuple(reversed(range(size)))
buf = ins[rank].copy()
rev.broadcast(buf, 0)  # rank 0 of the reversed group is the last world rank
check("reversed group broadcast", buf, ins[size - 1])
try:
    world.group([r for r in range(size) if r != rank] or [1])
except ValueError as exc:
    assert "is not in group" in str(exc) or "distinct ranks" in str(exc), str(exc)
    checks += 1
else:
    raise AssertionError("a non-member creating a group must raise")

if size == 4:
    pair = [0, 2] if rank in (0, 2) else [3, 1]
    g = world.group(pair)
    assert g is world.group(pair) and g.size == 2 and g.rank == pair.index(rank)
    assert g.world_ranks == tuple(pair)
    buf = ins[rank].copy()
    g.all_reduce(buf)
    check("group all_reduce", buf, ins[pair[0]] + ins[pair[1]])
    got = g.all_gather(ins[rank][: rank % 2 + 1])
    check("group all_gather uneven", got,
          np.concatenate([ins[w][: w % 2 + 1] for w in pair]))
    grid = [[0, 1], [2, 3]]
    col = world.hierarchy_axis(grid, 0)  # same column: ranks {c, c + 2}
    row = world.hierarchy_axis(grid, 1)  # same row: ranks {2 * (r // 2), 2 * (r // 2) + 1}
    assert col is world.hierarchy_axis(grid, 0) and row is world.hierarchy_axis(grid, -1)
    assert col.world_ranks == (rank % 2, rank % 2 + 2), col.world_ranks
    assert row.world_ranks == (rank // 2 * 2, rank // 2 * 2 + 1), row.world_ranks
    buf = ins[rank].copy()
    col.all_reduce(buf)
    check("hierarchy axis 0 all_reduce", buf, ins[rank % 2] + ins[rank % 2 + 2])
    buf = ins[rank].copy()
    row.all_reduce(buf, "max")
    check("hierarchy axis 1 all_reduce", buf,
          np.maximum(ins[rank // 2 * 2], ins[rank // 2 * 2 + 1]))
    # Both axes in turn: the sum over the whole grid, as nd-SBP boxing does it.
    buf = ins[rank].copy()
    row.all_reduce(buf)
    col.all_reduce(buf)
    check("hierarchy both axes == world all_reduce", buf, reduce_all(ins, "sum"))
    sub = row.group([1, 0])  # a group of a group
    assert sub.world_ranks == tuple(reversed(row.world_ranks))
    buf = ins[rank].copy()
    sub.broadcast(buf, 0)
    check("group of a group broadcast", buf, ins[row.world_ranks[1]])

assert comm.get_rank() == rank and comm.get_world_size() == size
assert comm.get_node_size() == 1 and comm.get_local_rank() == rank
assert comm.get_local_world_size() == size
sys.stdout.write(f"rank {rank}: {checks} checks passed\n")  # one write: ranks share stdout
