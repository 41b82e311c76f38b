"""Under mpiexec -n N (or alone): on each rank, a graph of local tensors with gradient
accumulation (each rank its own program, on its own batches, with dropout and BatchNorm)
trains exactly as the eager recipe on that rank: per micro-batch forward and
(loss / n).backward(), one optimizer step per call."""

import numpy as np

import sbpflow as flow
from sbpflow import comm

F = flow.nn.functional
rank = comm.get_rank()


def model():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(6, 16), flow.nn.BatchNorm1d(16), flow.nn.ReLU(),
                              flow.nn.Dropout(0.2), flow.nn.Linear(16, 4))


class AccGraph(flow.nn.Graph):
    def __init__(self, m, opt, n):
        super().__init__()
        self.m = m
        self.add_optimizer(opt)
        self.config.set_gradient_accumulation_steps(n)

    def build(self, x, y):
        loss = F.cross_entropy(self.m(x), y)
        loss.backward()
        return loss


rng = np.random.default_rng(100 + rank)  # each rank its own batches
data = [(flow.tensor(rng.standard_normal((8, 6)).astype(np.float32)),
         flow.tensor(rng.integers(0, 4, 8))) for _ in range(3)]
for n in (2, 4):
    m1, m2 = model(), model()
    o1 = flow.optim.Adam(m1.parameters(), lr=0.01)
    g = AccGraph(m2, flow.optim.Adam(m2.parameters(), lr=0.01), n)
    flow.manual_seed(7 + rank)
    eager = []
    for x, y in data:
        o1.zero_grad()
        b = x.shape[0] // n
        for k in range(n):
            loss = F.cross_entropy(m1(x[k * b:(k + 1) * b]), y[k * b:(k + 1) * b])
            (loss / n).backward()
            eager.append(loss.item())
        o1.step()
    flow.manual_seed(7 + rank)
    graph = np.concatenate([g(x, y).numpy() for x, y in data])
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=1e-7, err_msg=f"n={n} losses")
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-7,
                                   err_msg=f"n={n} {k}")
print(f"rank {rank}: grad acc ok", flush=True)
