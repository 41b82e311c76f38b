"""Training with global tensors equals training on one device (run under `mpiexec -n N`).

Every configuration trains the same small MLP (Linear with bias, GELU, Linear) twice in this
process from the same initial weights: once on local tensors (the single-device oracle), once
with global parameters and batches on a placement of all ranks, for a few optimizer steps.
The losses of every step and the final parameters must agree, and each parameter's gradient
must come back with the parameter's own SBP (a broadcast parameter's partial gradient boxed
to broadcast is the data-parallel all-reduce). Configurations:

- data parallel: parameters B, batch S(0) (uneven pieces, and a batch shorter than the rank
  count, so some ranks hold empty pieces);
- tensor parallel (Megatron): first weight column-split, second row-split, batch B;
- on 4 ranks, a 2x2 grid: data parallel along grid axis 0, tensor parallel along axis 1.

Each rank prints `rank R: global training check passed (N configurations)`.
"""

from __future__ import annotations

import sys
from typing import Callable, NamedTuple

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
from sbpflow.sbp import B, S

STEPS = 5
D_IN, D_HIDDEN, D_OUT = 6, 12, 4
# nn.Linear's weight is [out, in]: a column-parallel first layer splits its output features,
# weight axis 0 and bias axis 0; the row-parallel second layer splits its input features,
# weight axis 1, and its bias is added once, after the partial sums are reduced.
DATA_PARALLEL = {"0.weight": B, "0.bias": B, "2.weight": B, "2.bias": B}
TENSOR_PARALLEL = {"0.weight": S(0), "0.bias": S(0), "2.weight": S(1), "2.bias": B}


class Config(NamedTuple):
    name: str
    placement: object
    param_sbp: dict  # parameter name -> nd-SBP
    batch_sbp: tuple
    optimizer: Callable
    loss: str  # "cross_entropy" or "mse"
    dtype: object = flow.float64
    batch: int = 10
    clip: bool = False
    tol: float = 1e-9


def sgd(params):
    return flow.optim.SGD(params, lr=0.2, momentum=0.9, weight_decay=1e-3)


def adam(params):
    return flow.optim.Adam(params, lr=0.05)


def adamw(params):
    return flow.optim.AdamW(params, lr=0.05, weight_decay=0.01)


def make_model(dtype):
    flow.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.GELU(), nn.Linear(D_HIDDEN, D_OUT)).to(
        dtype)


def make_data(cfg: Config):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((cfg.batch, D_IN))
    if cfg.loss == "cross_entropy":
        return x, rng.integers(0, D_OUT, cfg.batch)
    return x, np.sin(x[:, :D_OUT] * 2.0) + 0.1 * rng.standard_normal((cfg.batch, D_OUT))


def globalize(model, cfg: Config) -> None:
    """Replace each parameter by a global one with the same logical value and its SBP."""
    everywhere = (B,) * cfg.placement.ndim
    for name, sbp in cfg.param_sbp.items():
        owner, attr = name.rsplit(".", 1)
        module = model.get_submodule(owner)
        local = getattr(module, attr).detach()
        # B from every rank's identical local copy, then B -> the target SBP (a local slice)
        value = local.to_global(cfg.placement, everywhere).to_global(cfg.placement, sbp)
        setattr(module, attr, nn.Parameter(value))


def loss_of(cfg: Config, out, target):
    if cfg.loss == "cross_entropy":
        return F.cross_entropy(out, target)
    return F.mse_loss(out, target)


def train(cfg: Config, glob: bool):
    model = make_model(cfg.dtype)
    x_np, y_np = make_data(cfg)
    x_np = x_np.astype(cfg.dtype.np)
    if cfg.loss == "mse":
        y_np = y_np.astype(x_np.dtype)
    if glob:
        globalize(model, cfg)
        x = flow.tensor(x_np, placement=cfg.placement, sbp=cfg.batch_sbp)
        y = flow.tensor(y_np, placement=cfg.placement, sbp=cfg.batch_sbp)
    else:
        x, y = flow.tensor(x_np), flow.tensor(y_np)
    opt = cfg.optimizer(model.parameters())
    losses = []
    for _ in range(STEPS):
        loss = loss_of(cfg, model(x), y)
        opt.zero_grad()
        loss.backward()
        if glob:
            for name, prm in model.named_parameters():
                if prm.grad.sbp != prm.sbp or prm.grad.placement != prm.placement:
                    raise AssertionError(
                        f"{cfg.name}: {name} is {prm.sbp} but its gradient came back "
                        f"{prm.grad.sbp} on {prm.grad.placement}")
        if cfg.clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())  # of a global loss: a collective on every rank
    params = {k: v.detach().numpy() for k, v in model.named_parameters()}
    return np.array(losses), params


def check(cfg: Config) -> None:
    want_losses, want_params = train(cfg, glob=False)
    if not want_losses[-1] < 0.9 * want_losses[0]:
        raise AssertionError(f"{cfg.name}: the single-device run does not train "
                             f"({want_losses}): the comparison would prove nothing")
    got_losses, got_params = train(cfg, glob=True)
    np.testing.assert_allclose(got_losses, want_losses, rtol=cfg.tol, atol=cfg.tol,
                               err_msg=f"{cfg.name}: losses")
    for name, want in want_params.items():
        np.testing.assert_allclose(got_params[name], want, rtol=cfg.tol, atol=cfg.tol,
                                   err_msg=f"{cfg.name}: parameter {name}")


def configs(world: int) -> list[Config]:
    line = flow.placement("cpu", list(range(world)))
    dp = {k: (v,) for k, v in DATA_PARALLEL.items()}
    tp = {k: (v,) for k, v in TENSOR_PARALLEL.items()}
    out = [
        Config("data parallel, SGD momentum, cross-entropy", line, dp, (S(0),), sgd,
               "cross_entropy"),
        Config("data parallel, Adam, MSE, clipped", line, dp, (S(0),), adam, "mse", clip=True),
        Config("data parallel, AdamW, cross-entropy, float32", line, dp, (S(0),), adamw,
               "cross_entropy", dtype=flow.float32, tol=1e-5),
        Config("tensor parallel, SGD momentum, MSE", line, tp, (B,), sgd, "mse"),
        Config("tensor parallel, Adam, cross-entropy, clipped", line, tp, (B,), adam,
               "cross_entropy", clip=True),
        Config("tensor parallel, AdamW, MSE, float32", line, tp, (B,), adamw, "mse",
               dtype=flow.float32, tol=1e-5),
    ]
    if world > 1:
        # world - 1 rows: the last rank's piece of the batch is empty
        out.append(Config("data parallel, batch shorter than the rank count", line, dp,
                          (S(0),), sgd, "mse", batch=world - 1))
    if world == 4:
        grid = flow.placement("cpu", [[0, 1], [2, 3]])
        both = {k: (B, v) for k, v in TENSOR_PARALLEL.items()}
        out += [
            Config("2x2 grid: data x tensor parallel, SGD momentum, cross-entropy", grid, both,
                   (S(0), B), sgd, "cross_entropy"),
            Config("2x2 grid: data x tensor parallel, Adam, MSE, clipped", grid, both,
                   (S(0), B), adam, "mse", clip=True),
        ]
    return out


def main() -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    todo = configs(world)
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for cfg in todo:
        if only is None or only in cfg.name:
            check(cfg)
    print(f"rank {rank}: global training check passed ({len(todo)} configurations)",
          flush=True)


if __name__ == "__main__":
    main()
