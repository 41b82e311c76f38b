"""Train a small CNN on scikit-learn's bundled handwritten digits (8x8, no download).

Run: python -m sbpflow.examples.digits [--epochs N] [--resume] [--out DIR] [--graph]

Prints the held-out test accuracy, saves a checkpoint (safetensors + JSON, no pickle) and a
PNG of the loss and accuracy curves.  `--resume` continues from the checkpoint.

`--graph` trains in static-graph mode: a training `nn.Graph` holds the forward, the loss,
`loss.backward()` and the AdamW step; an eval graph computes the test predictions.  The
graphs' parameters and optimizer states are the eager model's and optimizer's, so the
checkpoint and `--resume` are the same in both modes.  The ExponentialLR stays outside the
graph, stepped once per epoch as in eager mode; the graph reads the current lr at every call.
The last batch of an epoch is smaller, so the training graph compiles a second plan for it.

Data-parallel: `python -m sbpflow.distributed.launch --nproc-per-node 2 -m
sbpflow.examples.digits` trains one replica per rank under DistributedDataParallel, each rank
on its DistributedSampler share of every global batch of `--batch-size`.

`--graph` under the launcher is data parallel with global tensors instead (a graph has no
DDP): the model is broadcast (`model.to_global(placement, B)`), every rank loads the whole
batch of `--batch-size` in the single-rank order and keeps its rows (`S(0)`), and the graph's
plan all-reduces the gradients (the boxing of their partial sums to `B`).  BatchNorm's batch
statistics are over the whole logical batch (a mean over a split axis is a partial sum,
reduced), so it is the single-rank program: the same losses and accuracy up to float
rounding.  The test digits are split by rows the same way for the eval graph.  The checkpoint
holds the logical values (gathered to rank 0, which writes it); `--resume` loads it on rank 0
and broadcasts it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
from sbpflow.nn.parallel import DistributedDataParallel
from sbpflow.utils.data import DataLoader, DistributedSampler, TensorDataset


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 16, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def load_digits(seed: int = 0):
    """The 1797 digits, scaled to [0, 1], split 80/20 with a fixed permutation."""
    from sklearn.datasets import load_digits as sk_load

    data = sk_load()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    y = data.target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, te = perm[:cut], perm[cut:]
    return (x[tr], y[tr]), (x[te], y[te])


class TrainGraph(nn.Graph):
    """One training step as a static graph: forward, loss, backward and the optimizer."""

    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)  # the lr schedule is stepped per epoch outside the graph

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


class EvalGraph(nn.Graph):
    """The predicted classes (the model in eval mode; no optimizer: forward only)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x).argmax(dim=1)


def as_input(array: np.ndarray, placement=None):
    """A batch as a tensor: local, or global split by rows over `placement` (every rank passes
    the same logical array and keeps its own rows, no communication)."""
    if placement is None:
        return flow.tensor(array)
    return flow.tensor(array, placement=placement, sbp=flow.sbp.split(0))


def evaluate(model, x, y, graph=None, placement=None) -> float:
    model.eval()
    if graph is not None:
        pred = graph(as_input(x, placement)).numpy()  # of a global tensor: a collective
    else:
        with flow.no_grad():
            pred = model(flow.tensor(x)).argmax(dim=1).numpy()
    model.train()
    return float((pred == y).mean())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default="out/digits")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graph", action="store_true",
                   help="train and evaluate with nn.Graph (static graphs; under the launcher "
                        "data parallel over global tensors)")
    args = p.parse_args(argv)

    from tqdm import tqdm

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    # A graph on several ranks: data parallel with global tensors (nn.Graph has no DDP).
    placement = flow.placement("cpu", list(range(world))) if args.graph and world > 1 else None
    flow.manual_seed(args.seed)
    (x_tr, y_tr), (x_te, y_te) = load_digits(args.seed)
    model = DigitsCNN()
    if placement is not None:
        model.to_global(placement, flow.sbp.broadcast)  # rank 0's initial weights everywhere
        train_model = model
    else:
        # Several ranks: one replica each (DDP broadcasts rank 0's weights, averages grads).
        train_model = DistributedDataParallel(model) if world > 1 else model
    opt = flow.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = flow.optim.lr_scheduler.ExponentialLR(opt, gamma=0.85)  # stepped per epoch
    history = {"loss": [], "test_acc": []}
    start_epoch = 0
    ckpt = os.path.join(args.out, "checkpoint.safetensors")
    if args.resume:
        # global: rank 0 reads the file, every rank gets broadcast tensors
        state = flow.load(ckpt, global_src_rank=0) if placement is not None else flow.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        history = state["history"]
        start_epoch = state["epoch"]
        print(f"resumed from {ckpt} at epoch {start_epoch}")
    end_epoch = start_epoch + args.epochs

    dataset = TensorDataset(flow.tensor(x_tr), flow.tensor(y_tr))
    if world > 1 and placement is None:
        sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=args.batch_size // world, sampler=sampler)
    else:
        sampler = None
        g = flow.Generator().manual_seed(args.seed + start_epoch)
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=g)
    train_graph = TrainGraph(model, opt) if args.graph else None
    eval_graph = EvalGraph(model) if args.graph else None
    losses = []  # every step's loss in this run
    t0 = time.time()
    for epoch in range(start_epoch, end_epoch):
        if sampler is not None:
            sampler.set_epoch(epoch)
        total, n = 0.0, 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{end_epoch}", leave=False,
                   disable=rank != 0)
        for xb, yb in bar:
            if train_graph is not None and placement is not None:
                loss = train_graph(as_input(xb.numpy(), placement),
                                   as_input(yb.numpy(), placement))
            elif train_graph is not None:
                loss = train_graph(xb, yb)
            else:
                loss = F.cross_entropy(train_model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
            value = loss.item()  # of a global loss: its logical value, a collective
            losses.append(value)
            total += value * len(yb)
            n += len(yb)
            bar.set_postfix(loss=f"{value:.4f}")
        sched.step()
        acc = evaluate(model, x_te, y_te, eval_graph, placement)  # every replica: same weights
        history["loss"].append(total / n)
        history["test_acc"].append(acc)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  train loss {total / n:.4f}  test accuracy {acc:.4f}")
    flow.synchronize()  # the graphs' last updates are in the eager parameters and states
    elapsed = time.time() - t0
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "scheduler": sched.state_dict(), "history": history, "epoch": end_epoch}
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    if placement is not None:  # a collective: every rank's pieces, gathered to rank 0
        flow.save(state, ckpt, global_dst_rank=0)
    if rank != 0:
        return history["test_acc"][-1]
    if placement is None:
        flow.save(state, ckpt)
    png = os.path.join(args.out, "curves.png")
    _plot(history, png)
    acc = history["test_acc"][-1]
    mode = ""
    if args.graph:
        mode = ", nn.Graph over global tensors" if placement is not None else ", nn.Graph"
    print(f"test accuracy {acc:.4f} after {end_epoch} epochs ({elapsed:.1f} s, {world} "
          f"rank{'s' if world > 1 else ''}{mode}); checkpoint {ckpt}; curves {png}")
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"test_accuracy": acc, "epochs": end_epoch, "seconds": elapsed,
                   "graph": args.graph, "losses": losses}, f)
    return acc


def _plot(history, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax1 = plt.subplots(figsize=(6, 4))
    epochs = range(1, len(history["loss"]) + 1)
    ax1.plot(epochs, history["loss"], "o-", color="tab:blue", label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("train loss", color="tab:blue")
    ax2 = ax1.twinx()
    ax2.plot(epochs, history["test_acc"], "s-", color="tab:orange", label="test accuracy")
    ax2.set_ylabel("test accuracy", color="tab:orange")
    ax1.set_title("sbpflow: digits CNN")
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
