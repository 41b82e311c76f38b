"""DDP on N ranks against single-process training on the full batch (NumPy/float64 oracle
is a separate replica trained in this same process on the whole batch).

Checks: (1) wrap-time broadcast makes differently seeded ranks equal to rank 0;
(2) 5 SGD steps of DDP (each rank its slice of the batch) equal 5 steps of the replica on
the full batch; (3) no_sync accumulation over 2 micro-batches then one synced backward equals
one step on the union; (4) small bucket_cap_mb (many buckets) gives the same result.
Prints "rank R: ddp ok".
"""

import numpy as np

import sbpflow as flow
import sbpflow.distributed  # noqa: F401
import sbpflow.nn.parallel  # noqa: F401
from sbpflow import comm as flow_comm
from sbpflow.nn.parallel import DistributedDataParallel as DDP

rank, size = flow_comm.get_rank(), flow_comm.get_world_size()
nn = flow.nn


def make_model(seed):
    flow.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 3))


def params(m):
    return [p.detach().numpy().astype(np.float64) for p in m.parameters()]


def close(a, b, what, tol=1e-5):
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.allclose(x, y, rtol=tol, atol=tol), (
            f"rank {rank}: {what}: param {i} differs by {np.abs(x - y).max()}")


def data(step, n=8 * size):
    rng = np.random.default_rng(100 + step)
    return (rng.standard_normal((n, 6)).astype(np.float32),
            rng.standard_normal((n, 3)).astype(np.float32))


def mine(a):
    per = a.shape[0] // size
    return a[rank * per:(rank + 1) * per]


def sgd_step(model, x, y, lr=0.1):
    loss = ((model(flow.from_numpy(x)) - flow.from_numpy(y)) ** 2).mean()
    loss.backward()
    return loss


def train(bucket_cap_mb):
    local = make_model(seed=1234 + rank)  # differently seeded on every rank
    ref = make_model(seed=1234)  # what rank 0 starts from
    ddp = DDP(local, bucket_cap_mb=bucket_cap_mb)
    close(params(local), params(ref), "wrap-time broadcast")
    opt = flow.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = flow.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(5):
        x, y = data(step)
        opt.zero_grad()
        sgd_step(ddp, mine(x), mine(y))
        opt.step()
        ref_opt.zero_grad()
        sgd_step(ref, x, y)
        ref_opt.step()
    close(params(local), params(ref), f"5 DDP steps (bucket_cap_mb={bucket_cap_mb})")
    for d in ddp.parameters():
        assert d.grad is not None
    return ddp, ref


ddp, ref = train(25)
train(0.0005)  # ~500 bytes: several buckets, launched in order while backward goes on

# no_sync: two micro-batches accumulated locally, the second synced; equals one step on both
opt = flow.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = flow.optim.SGD(ref.parameters(), lr=0.1)
x1, y1 = data(10)
x2, y2 = data(11)
opt.zero_grad()
with ddp.no_sync():
    sgd_step(ddp, mine(x1), mine(y1))
local_grads = [p.grad.numpy().copy() for p in ddp.module.parameters()]
sgd_step(ddp, mine(x2), mine(y2))
opt.step()
ref_opt.zero_grad()
sgd_step(ref, x1, y1)
sgd_step(ref, x2, y2)
ref_opt.step()
close(params(ddp.module), params(ref), "no_sync accumulation")

# Inside no_sync nothing was reduced: the local grads differ across ranks.
gathered = [flow.zeros(local_grads[0].shape) for _ in range(size)]
flow.comm.all_gather(gathered, flow.from_numpy(local_grads[0].astype(np.float32)))
if size > 1:
    assert not np.allclose(gathered[0].numpy(), gathered[1].numpy()), "no_sync reduced"

# state_dict passes through the wrapped module, with torch's "module." prefix.
assert set(ddp.state_dict()) == {"module." + k for k in ddp.module.state_dict()}
assert ddp.module is not None and isinstance(ddp.module, nn.Sequential)
print(f"rank {rank}: ddp ok", flush=True)
