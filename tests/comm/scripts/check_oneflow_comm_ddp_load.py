"""OneFlow's names on 1, 2 or 4 ranks, against NumPy: `flow.comm.all_gather_into_tensor`,
`flow.comm.reduce_scatter_tensor`, DDP's `bucket_size`/`use_bucket`/`broadcast_buffers`, and
`flow.load(path, global_src_rank)` positionally. argv[1]: a folder every rank can read.
Prints "rank R: oneflow api ok"."""

import os
import sys

import numpy as np

import sbpflow as flow
import sbpflow.distributed  # noqa: F401  (publishes the tensor collectives in flow.comm)
from sbpflow import comm as flow_comm

rank, size = flow_comm.get_rank(), flow_comm.get_world_size()
folder = sys.argv[1]


def values(r, n=6, dtype=np.float32):
    return (np.arange(n) * (r + 1) + 10 * r).astype(dtype)


# all_gather_into_tensor: stacked (size, n) or flat (size * n) output, rank order.
x = flow.from_numpy(values(rank))
for shape in ((size, 6), (size * 6,)):
    out = flow.zeros(*shape, dtype=flow.float32)
    assert flow.comm.all_gather_into_tensor(out, x) is None
    want = np.stack([values(r) for r in range(size)]).reshape(shape)
    assert np.array_equal(out.numpy(), want), (rank, out.numpy(), want)
try:
    flow.comm.all_gather_into_tensor(flow.zeros(size * 6 + 1), x)
    raise AssertionError("a wrong output size must raise")
except ValueError as e:
    assert "all_gather_into_tensor" in str(e)

# reduce_scatter_tensor: input of size * n elements; rank i keeps the sum of block i.
inp = flow.from_numpy(values(rank, size * 2).reshape(size, 2))
out = flow.zeros(2, dtype=flow.float32)
assert flow.comm.reduce_scatter_tensor(out, inp) is None
total = sum(values(r, size * 2) for r in range(size))
assert np.array_equal(out.numpy(), total[2 * rank:2 * rank + 2]), (rank, out.numpy())
out = flow.zeros(2, dtype=flow.float32)
flow.comm.reduce_scatter_tensor(out, inp, op=flow_comm.ReduceOp.MAX)
maxed = np.max([values(r, size * 2) for r in range(size)], axis=0)
assert np.array_equal(out.numpy(), maxed[2 * rank:2 * rank + 2])

# DDP: OneFlow's keyword arguments are honoured.
DDP = flow.nn.parallel.DistributedDataParallel


def model():
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.BatchNorm1d(4), flow.nn.Linear(4, 2))
    with flow.no_grad():
        m[1].running_mean.fill_(float(rank))  # a rank-dependent buffer
    return m


data = flow.from_numpy(np.random.default_rng(rank).standard_normal((5, 3)).astype(np.float32))
ref = model()
ref(data).square().sum().backward()
want = {}
for name, p in ref.named_parameters():
    g = p.grad.numpy()
    t = flow.from_numpy(g.copy())
    flow.comm.all_reduce(t)
    want[name] = t.numpy() / size
for kwargs, buckets in (({"bucket_size": 1}, [1] * 6), ({"bucket_size": 4}, [4, 2]),
                        ({"use_bucket": False}, [1] * 6), ({}, [6])):
    m = model()
    ddp = DDP(m, **kwargs)
    assert [len(b.params) for b in ddp._buckets] == buckets, (kwargs, ddp._buckets)
    # broadcast_buffers=True (the default): rank 0's buffers everywhere.
    assert np.array_equal(m[1].running_mean.numpy(), np.zeros(4, np.float32))
    ddp(data).square().sum().backward()
    for name, p in m.named_parameters():
        assert np.allclose(p.grad.numpy(), want[name], rtol=1e-5, atol=1e-6), (kwargs, name)
m = model()
ddp = DDP(m, broadcast_buffers=False, bucket_size=2)
assert np.array_equal(m[1].running_mean.numpy(), np.full(4, float(rank), np.float32))
for bad, exc in (({"bucket_size": 0}, ValueError), ({"use_bucket": 1}, TypeError),
                 ({"use_bucket": False, "bucket_size": 3}, ValueError),
                 ({"mixed_precision": object()}, NotImplementedError), ({"bogus": 1}, TypeError)):
    try:
        DDP(model(), **bad)
        raise AssertionError(f"DDP({bad}) must raise")
    except exc:
        pass

# flow.load(path, global_src_rank) positionally: only that rank reads; global tensors.
path = os.path.join(folder, "state.pt")
state = {"w": flow.from_numpy(np.arange(6.0).reshape(2, 3)), "step": 3}
src = size - 1
if rank == src:
    flow.save(state, path)
flow.comm.barrier()
for loaded in (flow.load(path, src), flow.load(path, src, "cpu")):
    assert loaded["step"] == 3
    w = loaded["w"]
    assert w.is_global and list(np.ravel(w.placement.ranks)) == list(range(size)), w
    assert np.array_equal(w.to_local().numpy(), np.arange(6.0).reshape(2, 3))
try:
    flow.load(path, src, global_src_rank=src)
    raise AssertionError("two source ranks must raise")
except TypeError:
    pass
if rank == src:  # torch's positional map_location still works (a local load)
    local = flow.load(path, "cpu")
    assert not local["w"].is_global and np.array_equal(local["w"].numpy(),
                                                       np.arange(6.0).reshape(2, 3))
flow.comm.barrier()
print(f"rank {rank}: oneflow api ok", flush=True)
