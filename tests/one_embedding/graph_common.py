"""A small click model (one-embedding over 2 tables, a linear head) trained the same way in
eager mode and in nn.Graph; shared by test_graph.py (1 rank) and scripts/graph_check.py
(under mpiexec)."""

from __future__ import annotations

import numpy as np

import sbpflow as flow
import sbpflow.one_embedding as oe

D, TABLES, BATCH = 4, 2, 6
VOCAB = 25  # ids per table (tables use disjoint keys)

# rule -> (the embedding's optimizer, size_factor); the linear head trains with SGD when the
# rule has no dense graph update (Adagrad, Ftrl: in a graph they serve one-embedding tables)
RULES = {
    "sgd": (lambda p: flow.optim.SGD(p, lr=0.3), 1),
    "momentum": (lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), 2),
    "adam": (lambda p: flow.optim.Adam(p, lr=0.05, weight_decay=0.01), 3),
    "adagrad": (lambda p: flow.optim.Adagrad(p, lr=0.2, lr_decay=0.01,
                                             initial_accumulator_value=0.1), 2),
    "ftrl": (lambda p: oe.Ftrl(p, lr=0.2, lambda1=0.01, lambda2=0.01, beta=0.5), 3),
}
SHARED = ("sgd", "momentum", "adam")  # one optimizer over the table and the head


class Model(flow.nn.Module):
    def __init__(self, path: str, rule: str):
        super().__init__()
        store = oe.make_cached_ssd_store_options(1, path, capacity=TABLES * VOCAB,
                                                 size_factor=RULES[rule][1])
        tables = [oe.make_table_options(oe.make_uniform_initializer(-0.5, 0.5)),
                  oe.make_table_options(oe.make_normal_initializer(0.0, 0.3))]
        self.emb = oe.MultiTableEmbedding("ctr", D, flow.float, flow.int64, tables, store)
        self.head = flow.nn.Linear(D, 1)

    def forward(self, ids, y):
        z = self.head(self.emb(ids).sum(1)).squeeze(-1)
        return flow.nn.functional.binary_cross_entropy_with_logits(z, y)


def optimizers(model: Model, rule: str) -> list:
    make = RULES[rule][0]
    if rule in SHARED:
        return [make(model.parameters())]
    return [make(model.emb.parameters()), flow.optim.SGD(model.head.parameters(), lr=0.1)]


class TrainGraph(flow.nn.Graph):
    def __init__(self, model: Model, opts: list):
        super().__init__()
        self.model = model
        for opt in opts:
            self.add_optimizer(opt)

    def build(self, ids, y):
        loss = self.model(ids, y)
        loss.backward()
        return loss


def batches(steps: int, seed: int):
    """(ids (BATCH, TABLES) with table t's keys in column t, labels); repeated ids."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.integers(0, VOCAB, (BATCH, TABLES)) + np.arange(TABLES) * 10**9
        yield ids.astype(np.int64), rng.integers(0, 2, BATCH).astype(np.float32)


def eager_step(model: Model, opts: list, ids, y) -> float:
    loss = model(flow.tensor(ids), flow.tensor(y))
    loss.backward()
    for opt in opts:
        opt.step()
        opt.zero_grad()
    return loss.item()


def all_keys() -> np.ndarray:
    return (np.arange(VOCAB)[:, None] + np.arange(TABLES) * 10**9).reshape(-1).astype(np.int64)


def state(model: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys this rank holds, their full stored rows (embedding and optimizer state), the
    head's weights), keys sorted."""
    store = model.emb.store
    keys = np.sort(store.key_of_slot[: store.num_keys])
    head = np.concatenate([p.detach().numpy().ravel() for p in model.head.parameters()])
    return keys, store.read_rows(keys), head
