"""A script written in torch.distributed's style, run unchanged on sbpflow: every collective
against NumPy on 1, 2 or 4 ranks. Prints "rank R: torch.distributed ok".

Each rank's tensor is a known function of its rank, so the expected values are computed with
NumPy from every rank's input. Run under the launcher (env:// rendezvous) or plain mpiexec.
"""

import os
import sys
import warnings

import numpy as np

import sbpflow as torch
import sbpflow.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
init_method = sys.argv[2] if len(sys.argv) > 2 else None
assert not dist.is_initialized()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dist.init_process_group(backend=backend, init_method=init_method)
if backend == "nccl":
    assert any("over MPI on the CPU" in str(w.message) for w in caught), caught
assert dist.is_initialized() and dist.get_backend() == backend

rank, world = dist.get_rank(), dist.get_world_size()
if world > 1:  # the launcher or sbpflow (under plain mpiexec) set torchrun's variables
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    assert os.environ["MASTER_ADDR"] and int(os.environ["MASTER_PORT"]) > 0
assert dist.group.WORLD is not None and dist.get_process_group_ranks(dist.group.WORLD) == \
    list(range(world))
checks = 0


def values(r, shape=(2, 3), dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * r + 1).astype(dtype)


def same(name, t, want):
    global checks
    got = t.numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"rank {rank}: {name}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"rank {rank}: {name}: shape {got.shape} != {want.shape}"
    assert np.allclose(got, want, rtol=1e-6), f"rank {rank}: {name}: got {got} want {want}"
    checks += 1


everyone = [values(r) for r in range(world)]

# all_reduce with every op, sync and async
for op, fn in [(dist.ReduceOp.SUM, np.sum), (dist.ReduceOp.PRODUCT, np.prod),
               (dist.ReduceOp.MIN, np.min), (dist.ReduceOp.MAX, np.max),
               (dist.ReduceOp.AVG, np.mean)]:
    t = torch.from_numpy(values(rank))
    assert dist.all_reduce(t, op=op) is None
    same(f"all_reduce {op}", t, fn(np.stack(everyone), axis=0).astype(np.float32))
t = torch.from_numpy(values(rank, dtype=np.int64))
work = dist.all_reduce(t, async_op=True)
assert work.wait() and work.is_completed()
same("all_reduce async int64", t, np.sum([values(r, dtype=np.int64) for r in range(world)], 0))

# broadcast from every source
for src in range(world):
    t = torch.from_numpy(values(rank))
    dist.broadcast(t, src=src)
    same(f"broadcast src={src}", t, values(src))

# all_gather, all_gather_into_tensor, reduce_scatter_tensor, reduce_scatter
outs = [torch.zeros(2, 3) for _ in range(world)]
dist.all_gather(outs, torch.from_numpy(values(rank)))
for r in range(world):
    same(f"all_gather[{r}]", outs[r], values(r))
big = torch.zeros(world * 2, 3)
dist.all_gather_into_tensor(big, torch.from_numpy(values(rank)))
same("all_gather_into_tensor", big, np.concatenate(everyone))
inp = torch.from_numpy(np.concatenate([values(rank + j) for j in range(world)]))
out = torch.zeros(2, 3)
dist.reduce_scatter_tensor(out, inp)
same("reduce_scatter_tensor", out, sum(values(r + rank) for r in range(world)))
out = torch.zeros(2, 3)
dist.reduce_scatter(out, [torch.from_numpy(values(rank + j)) for j in range(world)],
                    op=dist.ReduceOp.MAX)
same("reduce_scatter max", out, values(world - 1 + rank))

# reduce, gather, scatter to/from the last rank
dst = world - 1
t = torch.from_numpy(values(rank))
dist.reduce(t, dst=dst)
same("reduce", t, sum(everyone) if rank == dst else values(rank))
gl = [torch.zeros(2, 3) for _ in range(world)] if rank == dst else None
dist.gather(torch.from_numpy(values(rank)), gl, dst=dst)
if rank == dst:
    for r in range(world):
        same(f"gather[{r}]", gl[r], values(r))
t = torch.zeros(2, 3)
dist.scatter(t, [torch.from_numpy(values(10 + r)) for r in range(world)] if rank == dst
             else None, src=dst)
same("scatter", t, values(10 + rank))

# all_to_all and all_to_all_single
outs = [torch.zeros(2, 3) for _ in range(world)]
dist.all_to_all(outs, [torch.from_numpy(values(100 * rank + j)) for j in range(world)])
for r in range(world):
    same(f"all_to_all[{r}]", outs[r], values(100 * r + rank))
inp = torch.from_numpy(np.arange(world * 2, dtype=np.float32) + 100 * rank)
out = torch.zeros(world * 2)
dist.all_to_all_single(out, inp)
same("all_to_all_single", out,
     np.concatenate([np.arange(2 * rank, 2 * rank + 2, dtype=np.float32) + 100 * r
                     for r in range(world)]))

# point to point, blocking and not, in a ring
if world > 1:
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.zeros(2, 3)
    if rank % 2 == 0:
        dist.send(torch.from_numpy(values(rank)), dst=right)
        assert dist.recv(got, src=left) == left
    else:
        assert dist.recv(got, src=left) == left
        dist.send(torch.from_numpy(values(rank)), dst=right)
    same("send/recv", got, values(left))
    got = torch.zeros(2, 3)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.from_numpy(values(rank)), right),
                                   dist.P2POp(dist.irecv, got, left)])
    for req in reqs:
        req.wait()
    same("isend/irecv", got, values(left))

# objects (pickled between the job's own ranks)
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "t": torch.from_numpy(values(rank))})
for r in range(world):
    assert objs[r]["rank"] == r
    same(f"all_gather_object[{r}]", objs[r]["t"], values(r))
lst = [("from", rank), {"k": [rank]}] if rank == dst else [None, None]
dist.broadcast_object_list(lst, src=dst)
assert lst == [("from", dst), {"k": [dst]}], lst
checks += 1

# subgroups: even ranks, and the non-member's view of them
evens = [r for r in range(world) if r % 2 == 0]
g = dist.new_group(evens)
if rank in evens:
    assert dist.get_rank(g) == evens.index(rank) and dist.get_world_size(g) == len(evens)
    assert dist.get_process_group_ranks(g) == evens
    t = torch.from_numpy(values(rank))
    dist.all_reduce(t, group=g)
    same("all_reduce subgroup", t, sum(values(r) for r in evens))
    t = torch.from_numpy(values(rank))
    dist.broadcast(t, src=evens[-1], group=g)  # src: a global rank
    same("broadcast subgroup", t, values(evens[-1]))
    dist.barrier(group=g)
else:
    assert g is dist.GroupMember.NON_GROUP_MEMBER
    assert dist.get_rank(g) == -1 and dist.get_world_size(g) == -1
    t = torch.from_numpy(values(rank))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dist.all_reduce(t, group=g) is None
    assert any("does not belong" in str(w.message) for w in caught)
    same("non-member keeps its tensor", t, values(rank))

# DDP after init_process_group, on a subgroup-free default group
model = torch.nn.Linear(3, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.from_numpy(values(rank, (4, 3)))).sum().backward()
grads = [torch.zeros(2, 3) for _ in range(world)]
dist.all_gather(grads, model.weight.grad)
for r in range(world):
    same(f"ddp grads agree [{r}]", grads[r], model.weight.grad.numpy())

dist.barrier()
dist.destroy_process_group()
assert not dist.is_initialized()
sys.stdout.write(f"rank {rank}: torch.distributed ok ({checks} checks)\n")
