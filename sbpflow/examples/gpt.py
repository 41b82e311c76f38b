"""A small character-level GPT that learns to sort digit sequences, a task it makes itself.

Run: python -m sbpflow.examples.gpt [--steps N] [--graph] [--global | --dp N --tp M]

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

`--dp N --tp M` (global tensors; N * M must be the number of ranks, either one alone takes the
rest) lay the ranks out as N data-parallel groups of M tensor-parallel ranks. Tensor parallel
is Megatron's: in every block the attention's packed q/k/v projection and the MLP's first
linear are column-parallel (weight and bias `S(0)`, split over their output features), the
attention's output projection and the MLP's second linear row-parallel (weight `S(1)`, bias
`B`); embeddings, layer norms and the head stay `B`. The batch is `S(0)` along the data axis
and `B` along the tensor axis. With both, the placement is the 2-D grid `[[0, 1], [2, 3]]`
(rows: data parallel, columns: tensor parallel) and each tensor has one SBP per axis: the
batch `(S(0), B)`, a column-parallel weight `(B, S(0))`. `--global` alone is `--dp <ranks>`.
That is where the parameters live; each op's signature is then chosen as for any global op
(the cost model), which reshards where the layout does not fit: the packed q/k/v weight's
`chunk(3)` cuts across its split, so it is moved to `S(1)` first. The logical program does
not change, so neither do the losses.

Static graph: add `--graph`. A training `nn.Graph` holds the forward, the loss,
`loss.backward()` and the AdamW step; gradient clipping is the param group's
`clip_grad_max_norm` (OneFlow's form of `clip_grad_norm_`, applied by the graph's optimizer
pass) and the cosine schedule is the graph's `lr_sch`, stepped after every call.  The losses
equal eager mode's up to float rounding.  Generation for the held-out score stays eager: its
input grows by one token per step, which would compile one plan per length.  On one rank the
graph takes local tensors; under the launcher it takes the global model and batches of
`--dp`/`--tp` (data parallel over every rank when neither is given): the same graph, traced
once on each rank, with the boxing (the gradients' all-reduce, tensor parallel's partial sums)
in its plan.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Layout:
    """Where a global run's tensors live: the placement, and for each role one SBP per axis of
    the placement (the data axis, the tensor axis, or both)."""

    placement: flow.placement
    data: tuple  # the batch: split by rows along the data axis
    replicated: tuple  # every rank holds it whole
    column: tuple  # column-parallel weight and bias: split by output features on the tensor axis
    row: tuple  # row-parallel weight: split by input features on the tensor axis


def make_layout(dp: int, tp: int) -> Layout:
    """dp data-parallel groups of tp tensor-parallel ranks; an axis of one rank is left out,
    so `--dp 2` and `--tp 2` on 2 ranks are 1-D placements and both together a 2-D grid."""
    S, B = flow.sbp.split, flow.sbp.broadcast
    axes = [axis for axis, n in (("dp", dp), ("tp", tp)) if n > 1] or ["dp"]
    ranks = list(range(dp * tp))
    if len(axes) == 2:  # rows: data-parallel groups; columns: the ranks of one group
        ranks = np.arange(dp * tp).reshape(dp, tp).tolist()

    def per_axis(on_dp, on_tp):
        return tuple(on_dp if axis == "dp" else on_tp for axis in axes)

    return Layout(flow.placement("cpu", ranks), data=per_axis(S(0), B),
                  replicated=per_axis(B, B), column=per_axis(B, S(0)), row=per_axis(B, S(1)))


def place_model(model: TinyGPT, layout: Layout) -> TinyGPT:
    """Make the model global: everything broadcast (rank 0's initial weights everywhere), then
    Megatron's tensor parallel in each block where the layout has a tensor axis."""
    model.to_global(layout.placement, layout.replicated)
    if layout.column == layout.replicated:  # no tensor axis
        return model

    def split(module, name, sbp):
        setattr(module, name, nn.Parameter(getattr(module, name).to_global(layout.placement,
                                                                           sbp)))

    for block in model.blocks.layers:
        attn = block.self_attn
        # column-parallel: each rank its share of the output features (x @ w.T comes out split
        # on the last axis); row-parallel: the matching share of the input features (the
        # product is a partial sum, reduced where the residual stream needs it whole)
        split(attn, "in_proj_weight", layout.column)
        split(attn, "in_proj_bias", layout.column)
        split(attn.out_proj, "weight", layout.row)
        split(block.linear1, "weight", layout.column)
        split(block.linear1, "bias", layout.column)
        split(block.linear2, "weight", layout.row)
    return model


def as_input(array: np.ndarray, layout: Layout | None = None):
    """A batch as a tensor: local, or global with the layout's data SBP (every rank passes the
    same logical array and keeps its own rows, no communication)."""
    if layout is None:
        return flow.tensor(array)
    return flow.tensor(array, placement=layout.placement, sbp=layout.data)


def sort_accuracy(model, rng, length: int, n: int = 256, layout: Layout | None = None) -> float:
    """Greedy generation of the sorted half; fraction of sequences exactly right.
    With a layout (a global model) the held-out sequences are split along its data axis."""
    x, _ = make_batch(rng, n, length)
    prompt = x[:, : length + 1]
    model.eval()
    with flow.no_grad():
        seq = as_input(prompt, layout)
        for _ in range(length):
            logits = model(seq)[:, -1]
            nxt = logits.argmax(dim=-1, keepdim=True)
            seq = flow.cat([seq, nxt], dim=1)
    model.train()
    got = seq.numpy()[:, length + 1:]  # of a global tensor: a collective
    want = np.sort(prompt[:, :length], axis=1)
    return float((got == want).all(axis=1).mean())


def parallel_sizes(args, world: int) -> tuple[int, int] | None:
    """(dp, tp) of a global run, or None for local tensors.  --dp/--tp and --global ask for
    global tensors; so does --graph on several ranks (a graph has no DDP: it is data parallel
    over every rank unless --dp/--tp say otherwise)."""
    dp, tp = args.dp, args.tp
    if dp is None and tp is None:
        if not (args.use_global or (args.graph and world > 1)):
            return None
        return world, 1
    for flag, n in (("--dp", dp), ("--tp", tp)):
        if n is not None and n < 1:
            raise ValueError(f"{flag} {n}: expected a number of ranks, at least 1")
    if dp is None or tp is None:
        given = dp if dp is not None else tp
        if world % given:
            raise ValueError(f"{'--dp' if dp is not None else '--tp'} {given}: the job has "
                             f"{world} rank(s), not a multiple of {given}")
        dp, tp = (given, world // given) if dp is not None else (world // given, given)
    if dp * tp != world:
        raise ValueError(f"--dp {dp} x --tp {tp} is {dp * tp} ranks, but the job has {world}: "
                         f"dp * tp must be the number of ranks")
    return dp, tp


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
                        "(--batch-size in all) split by rows over the ranks (--dp <ranks>)")
    p.add_argument("--dp", type=int, default=None,
                   help="global tensors, N ranks along the data-parallel axis (the batch split "
                        "by rows); default: the ranks --tp leaves")
    p.add_argument("--tp", type=int, default=None,
                   help="global tensors, N ranks along the tensor-parallel axis (Megatron's "
                        "column- and row-parallel linears); default: the ranks --dp leaves")
    p.add_argument("--graph", action="store_true",
                   help="train with nn.Graph (a static graph; on several ranks over global "
                        "tensors, data parallel unless --dp/--tp say otherwise)")
    p.add_argument("--log-every", type=int, default=100)
    args = p.parse_args(argv)

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    sizes = parallel_sizes(args, world)
    layout = make_layout(*sizes) if sizes is not None else None
    flow.manual_seed(args.seed)
    # Global: every rank draws the whole logical batch from the stream the single-device run
    # uses; otherwise each rank its own examples.
    rng = np.random.default_rng([args.seed, 0 if layout is not None else rank])
    model = TinyGPT(block=2 * args.length + 1)
    if layout is not None:
        train_model = place_model(model, layout)
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
            loss = graph(as_input(x, layout), as_input(y, layout))  # also steps the schedule
        else:
            logits = train_model(as_input(x, layout))
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), as_input(y, layout).reshape(-1))
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        if step % args.log_every == 0 or step == 1:
            value = loss.item()  # of a global loss: its logical value, a collective
            if rank == 0:
                print(f"step {step:4d}  loss {value:.6f}  ({time.time() - t0:.1f} s)")
    train_s = time.time() - t0
    acc = sort_accuracy(model, np.random.default_rng(args.seed + 1), args.length,
                        layout=layout)
    if rank == 0:
        mode = ""
        if sizes is not None:
            dp, tp = sizes
            mode = f", global tensors (dp {dp} x tp {tp})"
        if args.graph:
            mode += ", nn.Graph"
        print(f"sorted exactly: {acc:.3f} of 256 held-out sequences "
              f"({time.time() - t0:.1f} s, {args.steps} steps, {world} "
              f"rank{'s' if world > 1 else ''}{mode}; training {train_s:.1f} s)")
    return acc


if __name__ == "__main__":
    main()
