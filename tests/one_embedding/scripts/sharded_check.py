"""Under mpiexec -n N: a sharded MultiTableEmbedding trained on each rank's slice of a global
batch equals one dense torch embedding trained on the whole batch (the single-rank result:
tests/one_embedding/test_embedding.py shows one rank equals the dense embedding)."""

import sys
import tempfile

import numpy as np
import torch

import sbpflow as flow
import sbpflow.one_embedding as oe
from sbpflow import comm
from sbpflow.one_embedding._hash import initial_values, owner_of

rank, world = comm.get_rank(), comm.get_world_size()
V, D = 40, 4
KEYS = (np.arange(V, dtype=np.int64) * 104729 + 11) * 2**33
INIT = oe.make_uniform_initializer(-0.5, 0.5)
CASES = {
    "sgd": (lambda p: flow.optim.SGD(p, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3), 1),
    "momentum": (lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 2),
    "adam": (lambda p: flow.optim.Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05), 3),
    "adagrad": (lambda p: flow.optim.Adagrad(p, lr=0.2), lambda p: torch.optim.Adagrad(p, lr=0.2),
                2),
}
root = tempfile.mkdtemp() if rank == 0 else None
path = comm.world().all_gather(np.frombuffer((root or "").ljust(200).encode(), np.uint8)
                               .reshape(1, -1))[0].tobytes().decode().strip()
flow.manual_seed(123)
for name, (make, make_torch, factor) in CASES.items():
    store = oe.make_cached_ssd_store_options(1, f"{path}/{name}", capacity=V,
                                             size_factor=factor)
    emb = oe.MultiTableEmbedding(name, D, flow.float, flow.int64,
                                 [oe.make_table_options(INIT)], store)
    dense = torch.nn.Embedding(V, D)
    dense.weight.data = torch.tensor(initial_values(INIT, emb.store.seed, KEYS, 0, D))
    opt, topt = make(emb.parameters()), make_torch(dense.parameters())
    rng = np.random.default_rng(7)  # the same global batches on every rank
    for step in range(4):
        ids = rng.permutation(np.concatenate([np.arange(V), rng.integers(0, V, 40 + 8 * step)]))
        ids = ids.reshape(-1, 2)
        c = rng.standard_normal(ids.shape + (D,)).astype(np.float32)
        mine = np.array_split(np.arange(len(ids)), world)[rank]  # this rank's rows
        y = emb(flow.tensor(KEYS[ids[mine]]))
        ty = dense(torch.tensor(ids))
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy()[mine], rtol=1e-5,
                                   atol=1e-6)
        (y * flow.tensor(c[mine])).sum().backward()
        (ty * torch.tensor(c)).sum().backward()
        opt.step()
        topt.step()
        opt.zero_grad()
        topt.zero_grad()
    got = emb(flow.tensor(KEYS)).detach().numpy()
    np.testing.assert_allclose(got, dense.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    held = emb.store.key_of_slot[: emb.store.num_keys]
    assert (owner_of(held, world) == rank).all(), "a rank stores keys it does not own"
    total = comm.world().all_reduce(np.array([len(held)], np.int64))
    assert int(total[0]) == V, total
    emb.save_snapshot("s")
    emb.load_snapshot("s")
    np.testing.assert_array_equal(emb(flow.tensor(KEYS)).detach().numpy(), got)
print(f"rank {rank}: sharded ok", flush=True)
sys.exit(0)
