"""Megatron-style tensor parallelism of an MLP, written with SBP annotations only.

Run: python -m sbpflow.distributed.launch --nproc-per-node 2 -m sbpflow.examples.tensor_parallel
(or plain `python -m sbpflow.examples.tensor_parallel`: one rank, placement [0]).

The model is y = gelu(x @ w1 + b1) @ w2 + b2 with 64 -> 256 -> 64 features, weights in the
`x @ W` layout ([in, out]). Megatron splits the first weight by columns and the second by rows,
so each rank computes its own slice of the hidden layer and no rank ever holds all of it:

    x      B      every rank sees the whole batch
    w1     S(1)   column split: each rank owns a slice of the hidden units
    h, a   S(1)   x @ w1 is (B, S(1)) -> S(1); gelu is elementwise, the split stays
    w2     S(0)   row split: the same slice of hidden units, now as rows
    a @ w2 P      (S(1), S(0)) -> P: each rank sums over its own hidden units only
    y      B      P -> B is the all-reduce, the one collective of the forward pass

There is no hand-written collective: the matmul's SBP signatures and boxing (P -> B) produce
it, and autograd boxes the gradients back (the backward of P -> B is B -> B, free; weight
gradients come out with their weight's split). With nn.Linear's [out, in] weight layout the
column split of the first layer would be S(0) and the row split of the second S(1).

The example trains a few SGD steps on a regression target and checks, in the same process,
that the loss curve and the final weights match the same model on one device (local tensors,
built from the same seed: global random factories draw the same logical values).
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
from sbpflow.sbp import B, S

D_IN, D_HIDDEN, D_OUT = 64, 256, 64


def _init(shape, fan_in: int, placement, sbp):
    """Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), nn.Linear's default; local or global."""
    bound = 1.0 / math.sqrt(fan_in)
    if placement is None:
        u = flow.rand(*shape, dtype=flow.float32)
    else:  # drawn piece by piece, the same logical values as the local draw
        u = flow.rand(*shape, dtype=flow.float32, placement=placement, sbp=sbp)
    return nn.Parameter((u * 2.0 - 1.0) * bound)


class ParallelMLP(nn.Module):
    """The MLP on one device (placement None) or tensor-parallel over `placement`."""

    def __init__(self, seed: int, placement=None):
        super().__init__()
        self.placement = placement
        flow.manual_seed(seed)
        self.w1 = _init((D_IN, D_HIDDEN), D_IN, placement, S(1))  # column split
        self.b1 = _init((D_HIDDEN,), D_IN, placement, S(0))  # goes with w1's columns
        self.w2 = _init((D_HIDDEN, D_OUT), D_HIDDEN, placement, S(0))  # row split
        self.b2 = _init((D_OUT,), D_HIDDEN, placement, B)  # added once, after the sum

    def forward(self, x, trace: list | None = None):
        h = x @ self.w1 + self.b1
        a = F.gelu(h)
        partial = a @ self.w2
        # P -> B: the all-reduce of row-parallel layers; the bias goes on after it, once.
        y = partial.to_global(sbp=B) if self.placement is not None else partial
        out = y + self.b2
        if trace is not None:
            trace += [("x", x), ("w1", self.w1), ("h = x @ w1 + b1", h), ("a = gelu(h)", a),
                      ("w2", self.w2), ("a @ w2", partial), ("y", y), ("y + b2", out)]
        return out


def make_data(seed: int, batch: int):
    """Inputs and a smooth nonlinear regression target of them (a fixed random teacher)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, D_IN)).astype(np.float32)
    teacher = rng.standard_normal((D_IN, D_OUT)).astype(np.float32) / math.sqrt(D_IN)
    return x, np.tanh(x @ teacher).astype(np.float32)


def train(model, x, y, steps: int, lr: float, show=None):
    """SGD on MSE; returns the loss of every step. `show(tensor_list)` sees the first step."""
    opt = flow.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        trace = [] if show is not None and step == 0 else None
        loss = F.mse_loss(model(x, trace), y)
        opt.zero_grad()
        loss.backward()
        if trace is not None:
            show(trace + [("loss", loss)], model)
        opt.step()
        losses.append(loss.item())  # global: a collective, every rank calls it
    return np.array(losses)


def _describe(name: str, t) -> str:
    local = list(t.to_local().shape)  # this rank's piece: metadata, no communication
    sbp = ", ".join(map(repr, t.sbp))
    return f"  {name:<18} {str(list(t.shape)):<10} sbp {sbp:<5} piece {local}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=1e-5)
    args = p.parse_args(argv)

    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    placement = flow.placement("cpu", list(range(world)))
    say = print if rank == 0 else (lambda *a, **k: None)
    x_np, y_np = make_data(args.seed, args.batch_size)

    def show(trace, model):
        say(f"tensor-parallel MLP {D_IN} -> {D_HIDDEN} -> {D_OUT} on {placement}:")
        for name, t in trace:
            say(_describe(name, t))
        for name, prm in model.named_parameters():
            say(_describe(f"{name}.grad", prm.grad))
        partial = next(t for name, t in trace if name == "a @ w2")
        say("boxing of the partial sum to broadcast:")
        say("  " + flow.boxing.explain(partial, placement, B))

    model = ParallelMLP(args.seed, placement)
    x = flow.tensor(x_np, placement=placement, sbp=B)
    y = flow.tensor(y_np, placement=placement, sbp=B)
    got = train(model, x, y, args.steps, args.lr, show)
    got_params = {k: v.detach().numpy() for k, v in model.named_parameters()}

    # The oracle: the same program on local tensors, in this process.
    ref_model = ParallelMLP(args.seed)
    want = train(ref_model, flow.tensor(x_np), flow.tensor(y_np), args.steps, args.lr)
    loss_diff = float(np.abs(got - want).max())
    param_diff = max(float(np.abs(got_params[k] - v.detach().numpy()).max())
                     for k, v in ref_model.named_parameters())

    say(f"{'step':>4}  {'loss (' + str(world) + ' ranks)':>16}  {'loss (1 device)':>16}")
    for i, (a, b) in enumerate(zip(got, want)):
        say(f"{i + 1:4d}  {a:16.8f}  {b:16.8f}")
    ok = loss_diff <= args.tol * max(1.0, float(np.abs(want).max())) and param_diff <= args.tol
    say(f"loss curve vs single device: max |diff| {loss_diff:.2e}; final weights: max |diff| "
        f"{param_diff:.2e} (tolerance {args.tol:g}): {'MATCH' if ok else 'MISMATCH'}")
    if not (want[-1] < want[0]):
        say("the loss did not decrease: the check compares two runs that did not train")
        ok = False
    if not ok:
        sys.exit(1)
    return got, want


if __name__ == "__main__":
    main()
