"""A small character-level GPT that learns to sort digit sequences, a task it makes itself.

Run: python -m sbpflow.examples.gpt [--steps N] [--graph]

Each example is `d1 d2 ... dL | s1 s2 ... sL`: L random digits, a separator, then the same
digits sorted.  The model is trained with next-token prediction on the sorted half only, then
generates answers greedily for held-out sequences; we report the fraction sorted exactly.

Data-parallel: `python -m sbpflow.distributed.launch --nproc-per-node 2 -m
sbpflow.examples.gpt` runs one replica per rank under DistributedDataParallel; each rank draws
its own `--batch-size` examples per step (its own random stream).

Global tensors: add `--global` (with or without the launcher). The program is the
single-device one: the parameters are broadcast (`model.to_global(placement, B)`), each step's
batch of `--batch-size` examples is the logical tensor split by rows (`S(0)`: every rank draws
the same batch, as the single-device run does, and keeps its own rows), and there is no DDP
wrapper: the gradient of a broadcast parameter comes out partial-sum on each rank, and autograd
boxes it back to broadcast, which is the all-reduce. Any number of ranks computes the same
losses as `python -m sbpflow.examples.gpt` on one device, up to float rounding.

Static graph: add `--graph` (one rank, local tensors). A training `nn.Graph` holds the forward,
the loss, `loss.backward()` and the AdamW step; gradient clipping is the param group's
`clip_grad_max_norm` (OneFlow's form of `clip_grad_norm_`, applied by the graph's optimizer
pass) and the cosine schedule is the graph's `lr_sch`, stepped after every call.  The losses
equal eager mode's up to float rounding.  Generation for the held-out score stays eager: its
input grows by one token per step, which would compile one plan per length.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
from sbpflow.nn.parallel import DistributedDataParallel

SEP = 10
VOCAB = 11


def make_batch(rng: np.random.Generator, batch: int, length: int):
    digits = rng.integers(0, 10, size=(batch, length))
    seq = np.concatenate([digits, np.full((batch, 1), SEP), np.sort(digits, axis=1)], axis=1)
    x, y = seq[:, :-1], seq[:, 1:].copy()
    y[:, : length - 1] = -100  # no loss on predicting the unsorted input
    return x.astype(np.int64), y.astype(np.int64)


class TinyGPT(nn.Module):
    def __init__(self, block: int, d_model: int = 64, n_head: int = 4, n_layer: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(block, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=dropout,
                                           activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        causal = flow.ones(block, block, dtype=flow.bool).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        if idx.is_global:  # positions every rank needs whole: broadcast on idx's placement
            pos = flow.arange(t, placement=idx.placement,
                              sbp=[flow.sbp.broadcast] * len(idx.sbp))
        else:
            pos = flow.arange(t)
        h = self.tok(idx) + self.pos(pos)
        h = self.blocks(h, mask=self.causal[:t, :t])
        return self.head(self.norm(h))


def as_input(array: np.ndarray, placement=None):
    """A batch as a tensor: local, or global split by rows over `placement` (every rank passes
    the same logical array and keeps its own rows, no communication)."""
    if placement is None:
        return flow.tensor(array)
    return flow.tensor(array, placement=placement, sbp=flow.sbp.split(0))


def sort_accuracy(model, rng, length: int, n: int = 256, placement=None) -> float:
    """Greedy generation of the sorted half; fraction of sequences exactly right.
    With a placement (a global model) the held-out sequences are split over its ranks."""
    x, _ = make_batch(rng, n, length)
    prompt = x[:, : length + 1]
    model.eval()
    with flow.no_grad():
        seq = as_input(prompt, placement)
        for _ in range(length):
            logits = model(seq)[:, -1]
            nxt = logits.argmax(dim=-1, keepdim=True)
            seq = flow.cat([seq, nxt], dim=1)
    model.train()
    got = seq.numpy()[:, length + 1:]
    want = np.sort(prompt[:, :length], axis=1)
    return float((got == want).all(axis=1).mean())


class TrainGraph(nn.Graph):
    """One training step: forward, loss, backward, clipping, the AdamW update, the lr step."""

    def __init__(self, model, opt, sched):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=sched)

    def build(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        return loss


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--length", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--global", dest="use_global", action="store_true",
                   help="data-parallel with global tensors: parameters broadcast, the batch "
                        "(--batch-size in all) split by rows over the ranks")
    p.add_argument("--graph", action="store_true",
                   help="train with nn.Graph (a static graph; one rank, local tensors only)")
    p.add_argument("--log-every", type=int, default=100)
    args = p.parse_args(argv)

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    if args.graph and (args.use_global or world > 1):
        raise NotImplementedError(
            "gpt --graph runs on one rank with local tensors only: nn.Graph does not support "
            "several ranks or global tensors yet; drop --graph, or run it without the "
            "launcher and without --global")
    flow.manual_seed(args.seed)
    placement = flow.placement("cpu", list(range(world))) if args.use_global else None
    # Global: every rank draws the whole logical batch from the stream the single-device run
    # uses; otherwise each rank its own examples.
    rng = np.random.default_rng([args.seed, 0 if args.use_global else rank])
    model = TinyGPT(block=2 * args.length + 1)
    if args.use_global:
        model.to_global(placement, flow.sbp.broadcast)  # rank 0's initial weights everywhere
        train_model = model
    else:
        train_model = DistributedDataParallel(model) if world > 1 else model
    if args.graph:
        # The graph clips by the param group's clip_grad_max_norm (eager ignores the key).
        params = [{"params": list(model.parameters()), "clip_grad_max_norm": 1.0,
                   "clip_grad_norm_type": 2.0}]
    else:
        params = model.parameters()
    opt = flow.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    sched = flow.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    graph = TrainGraph(model, opt, sched) if args.graph else None
    t0 = time.time()
    for step in range(1, args.steps + 1):
        x, y = make_batch(rng, args.batch_size, args.length)
        if graph is not None:
            loss = graph(flow.tensor(x), flow.tensor(y))  # also steps the schedule
        else:
            logits = train_model(as_input(x, placement))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB),
                                   as_input(y, placement).reshape(-1))
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        if step % args.log_every == 0 or step == 1:
            value = loss.item()  # of a global loss: a collective, every rank takes part
            if rank == 0:
                print(f"step {step:4d}  loss {value:.6f}  ({time.time() - t0:.1f} s)")
    train_s = time.time() - t0
    acc = sort_accuracy(model, np.random.default_rng(args.seed + 1), args.length,
                        placement=placement)
    if rank == 0:
        mode = ", global tensors" if args.use_global else ", nn.Graph" if args.graph else ""
        print(f"sorted exactly: {acc:.3f} of 256 held-out sequences "
              f"({time.time() - t0:.1f} s, {args.steps} steps, {world} "
              f"rank{'s' if world > 1 else ''}{mode}; training {train_s:.1f} s)")
    return acc


if __name__ == "__main__":
    main()
