"""A DLRM-style click-through model on a synthetic Criteo-shaped stream, with its 26 sparse
features in one one-embedding table (OneFlow's `one_embedding.MultiTableEmbedding`).

Run: python -m sbpflow.examples.dlrm [--steps N] [--vocab V] [--cache-mb M] [--graph]

No public CTR data set is reachable offline, so the stream is made here with a planted
ground truth: 13 dense features ~ N(0, 1) and 26 categorical ones whose ids are Zipf
distributed (a few ids are frequent, most are rare, as in Criteo), with up to `--vocab` ids
per feature (26 * vocab keys in all: 10^8 with --vocab 3846154). A click is drawn from a
known logistic model: logit = dense . a + sum over features of a per-id effect + b. The
planted model's own AUC on held-out samples is the ceiling the trained model is measured
against.

The model: a bottom MLP over the dense features, the one-embedding lookup of the 26 ids, the
dot interaction (pairwise dot products of the 27 vectors) and a top MLP. Dense parameters
train with Adam; the embedding trains with Adagrad applied inside its store, which keeps the
rows in a file under `--path` behind an LRU cache of `--cache-mb` (make the table bigger than
the cache to exercise the disk tier).

Several ranks: `python -m sbpflow.distributed.launch --nproc-per-node 2 -m
sbpflow.examples.dlrm`. Each rank reads its own stream; the dense part is data-parallel (its
gradients averaged by one all-reduce after backward) and the embedding is sharded by key
over the ranks (its rows' gradients summed on their owners).

`--graph` trains with an `nn.Graph` instead (one rank): its Job holds the embedding's lookup,
gradient shuffle and in-store Adagrad update as ops, beside the dense forward, backward and
Adam update.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
import sbpflow.one_embedding as oe
from sbpflow import comm
from sbpflow.one_embedding._hash import initial_values

NUM_DENSE, NUM_SPARSE = 13, 26
PLANTED_SEED = 20260101


class PlantedStream:
    """Batches of (dense, ids, labels, true logits) from a known logistic model."""

    def __init__(self, vocab: int, zipf_a: float = 1.3, effect_std: float = 0.6,
                 seed: int = 0):
        self.vocab, self.zipf_a, self.effect_std = vocab, zipf_a, effect_std
        rng = np.random.default_rng(PLANTED_SEED)
        self.dense_w = rng.normal(0.0, 0.5, NUM_DENSE).astype(np.float32)
        self.bias = -0.5
        self.rng = np.random.default_rng(seed)

    def effects(self, keys: np.ndarray) -> np.ndarray:
        init = {"type": "normal", "mean": 0.0, "std": self.effect_std}
        return initial_values(init, PLANTED_SEED, keys.reshape(-1), 0, 1).reshape(keys.shape)

    def batch(self, n: int):
        dense = self.rng.standard_normal((n, NUM_DENSE)).astype(np.float32)
        ranks = self.rng.zipf(self.zipf_a, (n, NUM_SPARSE)) - 1
        ids = ranks % self.vocab  # fold the far tail back into the vocabulary
        keys = ids + np.arange(NUM_SPARSE, dtype=np.int64) * self.vocab  # disjoint tables
        logit = dense @ self.dense_w + self.effects(keys).sum(1) + self.bias
        labels = (self.rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return dense, keys.astype(np.int64), labels, logit


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half)."""
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class DLRM(nn.Module):
    def __init__(self, embedding: oe.MultiTableEmbedding, dim: int):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(NUM_DENSE, 64), nn.ReLU(), nn.Linear(64, dim),
                                    nn.ReLU())
        self.embedding = embedding
        n = NUM_SPARSE + 1
        rows, cols = np.triu_indices(n, k=1)
        self.register_buffer("pairs", flow.tensor(rows * n + cols), persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + len(rows), 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, dense, ids):
        x = self.bottom(dense)  # (B, D)
        e = self.embedding(ids)  # (B, 26, D): column j of ids is table j
        z = flow.cat([x.unsqueeze(1), e], dim=1)  # (B, 27, D)
        inter = flow.bmm(z, z.transpose(1, 2)).flatten(1)  # (B, 27 * 27)
        pairs = inter.index_select(1, self.pairs)  # the dot products above the diagonal
        return self.top(flow.cat([x, pairs], dim=1)).squeeze(1)


def _average_grads(params) -> None:
    """Data parallelism for the dense part: average the gradients over ranks, in one
    all-reduce after backward (the embedding's own all-to-alls ran inside backward)."""
    flat = np.concatenate([p.grad.numpy().reshape(-1) for p in params])
    comm.world().all_reduce(flat)
    flat /= comm.get_world_size()
    start = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flow.tensor(flat[start:start + n].reshape(tuple(p.shape))))
        start += n


class TrainGraph(nn.Graph):
    """One training step as a graph: forward, loss.backward(), both optimizers' updates."""

    def __init__(self, model: DLRM, *optimizers):
        super().__init__()
        self.model = model
        for opt in optimizers:
            self.add_optimizer(opt)

    def build(self, dense, ids, labels):
        loss = F.binary_cross_entropy_with_logits(self.model(dense, ids), labels)
        loss.backward()
        return loss


def main(steps: int = 300, batch_size: int = 512, vocab: int = 20000, dim: int = 16,
         cache_mb: float = 4.0, path: str | None = None, lr: float = 3e-3,
         embedding_lr: float = 0.05, eval_size: int = 20000, log_every: int = 50,
         graph: bool = False) -> dict:
    rank, world = comm.get_rank(), comm.get_world_size()
    if graph and world > 1:
        raise SystemExit("dlrm --graph runs on one rank: the dense part's data-parallel "
                         "all-reduce is an eager step here")
    flow.manual_seed(0)
    path = path or os.path.join(tempfile.gettempdir(), f"sbpflow-dlrm-{os.getuid()}")
    tables = [oe.make_table_options(oe.make_uniform_initializer(-0.05, 0.05))
              for _ in range(NUM_SPARSE)]
    store = oe.make_cached_ssd_store_options(cache_mb, path, capacity=NUM_SPARSE * vocab,
                                             size_factor=2)  # Adagrad's sum beside each row
    embedding = oe.MultiTableEmbedding("dlrm_sparse", dim, flow.float, flow.int64, tables,
                                       store)
    model = DLRM(embedding, dim)
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("embedding")]
    opt = flow.optim.Adam(dense_params, lr=lr)
    emb_opt = flow.optim.Adagrad(embedding.parameters(), lr=embedding_lr)
    stream = PlantedStream(vocab, seed=1 + rank)
    train = TrainGraph(model, opt, emb_opt) if graph else None
    start = time.perf_counter()
    for step in range(steps):
        dense, ids, labels, _ = stream.batch(batch_size)
        if train is not None:
            loss = train(flow.tensor(dense), flow.tensor(ids), flow.tensor(labels))
        else:
            logits = model(flow.tensor(dense), flow.tensor(ids))
            loss = F.binary_cross_entropy_with_logits(logits, flow.tensor(labels))
            opt.zero_grad()
            emb_opt.zero_grad()
            loss.backward()
            if world > 1:
                _average_grads(dense_params)
            opt.step()
            emb_opt.step()
        if rank == 0 and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {loss.item():.4f}  keys on rank 0 "
                  f"{embedding.store.num_keys}", flush=True)
    seconds = time.perf_counter() - start
    held_out = PlantedStream(vocab, seed=10**6 + rank)
    dense, ids, labels, true_logit = held_out.batch(eval_size)
    with flow.no_grad():
        scores = np.concatenate([
            model(flow.tensor(dense[i:i + 4096]), flow.tensor(ids[i:i + 4096])).numpy()
            for i in range(0, eval_size, 4096)])
    s = embedding.store
    result = {"auc": auc(labels, scores), "planted_auc": auc(labels, true_logit),
              "samples_per_s": steps * batch_size * world / seconds, "keys": s.num_keys,
              "cache_rows": s.cache_lines, "evictions": s.evictions,
              "writebacks": s.writebacks,
              "job_ops": [op.op_type for op in train._job().ops] if train is not None else []}
    if rank == 0:
        print(f"held-out AUC {result['auc']:.4f}  (planted model's AUC, the ceiling: "
              f"{result['planted_auc']:.4f})")
        print(f"{result['samples_per_s']:.0f} samples/s on {world} rank(s); rank 0 holds "
              f"{s.num_keys} keys, its cache {s.cache_lines} rows; {s.evictions} evictions, "
              f"{s.writebacks} write-backs to {path}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=20000, help="ids per sparse feature")
    ap.add_argument("--embedding-dim", type=int, default=16)
    ap.add_argument("--cache-mb", type=float, default=4.0)
    ap.add_argument("--path", default=None, help="where the table's files go")
    ap.add_argument("--graph", action="store_true", help="train with nn.Graph (one rank)")
    args = ap.parse_args()
    main(args.steps, args.batch_size, args.vocab, args.embedding_dim, args.cache_mb, args.path,
         graph=args.graph)
