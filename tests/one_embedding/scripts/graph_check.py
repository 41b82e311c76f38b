"""Under mpiexec -n N (or alone): on each rank, the click model of graph_common.py trained
by nn.Graph equals the same model trained eagerly on the same rank's batches (the table
sharded over the ranks, ids and gradients exchanged by all-to-all in both). Counts the
all-to-alls a graph step issues: 3 in the lookup (counts, ids, rows), 1 in the gradient
shuffle (rows); none on one rank.  With gradient accumulation (2 micro-batches) as well: equal
to the eager recipe, twice the all-to-alls."""

import sys
import tempfile

import numpy as np

import sbpflow as flow
from sbpflow import comm
from sbpflow.one_embedding._hash import owner_of
from tests.one_embedding import graph_common as C

rank, world = comm.get_rank(), comm.get_world_size()
root = tempfile.mkdtemp() if rank == 0 else None
path = comm.world().all_gather(np.frombuffer((root or "").ljust(200).encode(), np.uint8)
                               .reshape(1, -1))[0].tobytes().decode().strip()
w = comm.world()
calls = {"all_to_all": 0}
_all_to_all = w.all_to_all


def counted(*args, **kwargs):
    calls["all_to_all"] += 1
    return _all_to_all(*args, **kwargs)


w.all_to_all = counted
STEPS = 5
for rule in ("sgd", "momentum", "adam", "adagrad"):
    flow.manual_seed(9)
    eager = C.Model(f"{path}/{rule}-eager", rule)
    flow.manual_seed(9)
    lazy = C.Model(f"{path}/{rule}-graph", rule)
    eopts, gopts = C.optimizers(eager, rule), C.optimizers(lazy, rule)
    graph = C.TrainGraph(lazy, gopts)
    in_graph = 0
    for ids, y in C.batches(STEPS, seed=100 + rank):  # each rank its own batches
        want = C.eager_step(eager, eopts, ids, y)
        before = calls["all_to_all"]
        got = graph(flow.tensor(ids), flow.tensor(y)).item()
        in_graph += calls["all_to_all"] - before
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{rule} loss")
    expected = 4 * STEPS if world > 1 else 0
    assert in_graph == expected, (rule, in_graph, expected)
    kinds = [op.op_type for op in graph._job().ops]
    for k in ("one_embedding_lookup", "one_embedding_gradient_shuffle",
              f"one_embedding_{rule}_update"):
        assert kinds.count(k) == 1, (k, kinds)
    ek, erows, ehead = C.state(eager)
    gk, grows, ghead = C.state(lazy)
    np.testing.assert_array_equal(gk, ek)
    assert (owner_of(gk, world) == rank).all(), "a rank stores keys it does not own"
    np.testing.assert_allclose(grows, erows, rtol=1e-6, atol=1e-7, err_msg=f"{rule} rows")
    np.testing.assert_allclose(ghead, ehead, rtol=1e-6, atol=1e-7, err_msg=f"{rule} head")
    # every rank's lookups reached the owners: the keys held add up over the ranks
    total = w.all_reduce(np.array([len(gk)], np.int64))
    seen = set()
    for r in range(world):
        for ids, _ in C.batches(STEPS, seed=100 + r):
            seen.update(ids.ravel().tolist())
    assert int(total[0]) == len(seen), (total, len(seen))
# Gradient accumulation (2 micro-batches per call): equals the eager recipe, per micro-batch
# a lookup and (loss / 2).backward(), one step; each micro-batch exchanges its own ids.
N = 2
for rule in ("momentum", "adam"):
    flow.manual_seed(9)
    eager = C.Model(f"{path}/{rule}-acc-eager", rule)
    flow.manual_seed(9)
    lazy = C.Model(f"{path}/{rule}-acc-graph", rule)
    eopts, gopts = C.optimizers(eager, rule), C.optimizers(lazy, rule)
    graph = C.TrainGraph(lazy, gopts)
    graph.config.set_gradient_accumulation_steps(N)
    in_graph = 0
    for ids, y in C.batches(STEPS, seed=200 + rank):
        b = len(y) // N
        want = []
        for k in range(N):
            loss = eager(flow.tensor(ids[k * b:(k + 1) * b]), flow.tensor(y[k * b:(k + 1) * b]))
            (loss / N).backward()
            want.append(loss.item())
        for opt in eopts:
            opt.step()
            opt.zero_grad()
        before = calls["all_to_all"]
        got = graph(flow.tensor(ids), flow.tensor(y)).numpy()
        in_graph += calls["all_to_all"] - before
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{rule} accumulated losses")
    assert in_graph == (4 * N * STEPS if world > 1 else 0), (rule, in_graph)
    ek, erows, ehead = C.state(eager)
    gk, grows, ghead = C.state(lazy)
    np.testing.assert_array_equal(gk, ek)
    np.testing.assert_allclose(grows, erows, rtol=1e-6, atol=1e-7, err_msg=f"{rule} acc rows")
    np.testing.assert_allclose(ghead, ehead, rtol=1e-6, atol=1e-7, err_msg=f"{rule} acc head")
print(f"rank {rank}: graph ok", flush=True)
sys.exit(0)
