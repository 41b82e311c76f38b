"""`flow.comm` / `flow.env` on sbpflow tensors against NumPy, on 1, 2 or 4 ranks.

Each rank's tensor is a known function of its rank, so the expected values are computed
with NumPy from every rank's input. Prints "rank R: tensor API ok".
"""

import sys

import ml_dtypes
import numpy as np

import sbpflow as flow
import sbpflow.distributed  # noqa: F401  (publishes the tensor collectives in flow.comm)
from sbpflow import comm as flow_comm

rank, size = flow_comm.get_rank(), flow_comm.get_world_size()
env = flow_comm  # flow.env re-exports these; checked below when the lead wires it in
if hasattr(flow, "env"):
    env = flow.env
assert env.get_rank() == rank and env.get_world_size() == size
assert env.get_local_rank() == rank and env.get_node_size() == 1


def values(r, shape=(2, 3), dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * r).astype(dtype)


def same(name, t, want):
    got = t.numpy() if isinstance(t, flow.Tensor) else np.asarray(t)
    assert got.dtype == np.asarray(want).dtype, f"rank {rank}: {name}: {got.dtype}"
    assert np.array_equal(got.astype(np.float64), np.asarray(want).astype(np.float64)), (
        f"rank {rank}: {name}: got {got} want {want}")


# all_reduce: in place, version counter bumped, every op, half precision, views.
t = flow.from_numpy(values(rank))
version = t._version
assert flow_comm.all_reduce(t) is None
same("all_reduce sum", t, sum(values(r) for r in range(size)))
assert t._version > version, "all_reduce must bump the version counter (an in-place write)"
t = flow.from_numpy(values(rank))
flow_comm.all_reduce(t, op=flow_comm.ReduceOp.MAX)
same("all_reduce max", t, values(size - 1))
t = flow.from_numpy(values(rank, dtype=ml_dtypes.bfloat16))
flow_comm.all_reduce(t)
same("all_reduce bfloat16", t, sum(values(r) for r in range(size)).astype(ml_dtypes.bfloat16))
base = flow.zeros(4, 3)
flow_comm.all_reduce(base[1:3])  # a view: only its rows change
base_view = flow.from_numpy(values(rank, (4, 3)))
flow_comm.all_reduce(base_view[:, 1])
want = values(rank, (4, 3))
want[:, 1] = sum(values(r, (4, 3))[:, 1] for r in range(size))
same("all_reduce on a view writes through to the base", base_view, want)

# all_gather into a list (the entries may differ in size per rank)
lst = [flow.zeros(r + 1, 2, dtype=flow.int64) for r in range(size)]
flow_comm.all_gather(lst, flow.from_numpy(np.full((rank + 1, 2), rank, np.int64)))
for r in range(size):
    same(f"all_gather entry {r}", lst[r], np.full((r + 1, 2), r, np.int64))

# broadcast, reduce
t = flow.from_numpy(values(rank))
flow_comm.broadcast(t, size - 1)
same("broadcast", t, values(size - 1))
t = flow.from_numpy(values(rank))
flow_comm.reduce(t, 0)
same("reduce", t, sum(values(r) for r in range(size)) if rank == 0 else values(rank))

# gather, scatter
t = flow.from_numpy(values(rank))
outs = [flow.zeros(2, 3) for _ in range(size)] if rank == 0 else None
flow_comm.gather(t, outs, dst=0)
if rank == 0:
    for r in range(size):
        same(f"gather entry {r}", outs[r], values(r))
t = flow.zeros(2, 3)
src = size - 1
pieces = [flow.from_numpy(values(100 + r)) for r in range(size)] if rank == src else None
flow_comm.scatter(t, pieces, src=src)
same("scatter", t, values(100 + rank))

# reduce_scatter, all_to_all
ins = [flow.from_numpy(values(rank + 7 * j, (j + 1,))) for j in range(size)]
out = flow.zeros(rank + 1)
flow_comm.reduce_scatter(out, ins)
same("reduce_scatter", out, sum(values(r + 7 * rank, (rank + 1,)) for r in range(size)))
ins = [flow.from_numpy(values(100 * rank + j, (2,))) for j in range(size)]
outs = [flow.zeros(2) for _ in range(size)]
flow_comm.all_to_all(outs, ins)
for j in range(size):
    same(f"all_to_all from {j}", outs[j], values(100 * j + rank, (2,)))

# send / recv: with meta (shape and dtype travel), without meta, into out=
if size > 1:
    if rank == 0:
        flow_comm.send(flow.from_numpy(values(5, (2, 2), np.int64)), 1)
        flow_comm.send(flow.from_numpy(values(6, (3,))), 1, send_meta=False)
        flow_comm.send(flow.from_numpy(values(8, (2,), ml_dtypes.bfloat16)), 1)
    elif rank == 1:
        got = flow_comm.recv(0)
        assert got.dtype is flow.int64 and tuple(got.shape) == (2, 2)
        same("recv with meta", got, values(5, (2, 2), np.int64))
        same("recv without meta", flow_comm.recv(0, shape=(3,), dtype=flow.float32),
             values(6, (3,)))
        dst = flow.zeros(2, dtype=flow.bfloat16)
        assert flow_comm.recv(0, out=dst) is dst
        same("recv into out", dst, values(8, (2,), ml_dtypes.bfloat16))

flow_comm.barrier()

# A tensor that requires grad: the collective is not recorded, as in torch.distributed.
w = flow.ones(3, requires_grad=True)
flow_comm.all_reduce(w)
same("all_reduce on a leaf that requires grad", w.detach(), np.full(3, size, np.float32))
assert w.grad_fn is None and w.requires_grad

sys.stdout.write(f"rank {rank}: tensor API ok\n")  # one write: ranks share stdout
