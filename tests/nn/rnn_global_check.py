"""Recurrent layers on global tensors equal the single-device run (run under `mpiexec -n N`).

Each configuration runs a module twice in this process from the same weights on the same
data: once on local tensors (the oracle), once with the parameters broadcast and the batch
split S(0) over all ranks (data parallel), padded or packed.  Outputs, final hidden states,
the input's gradient and every parameter's gradient must agree, and each gradient must come
back with its tensor's own SBP (a broadcast parameter's gradient all-reduced to B, the
input's S(0)).

Each rank prints `rank R: rnn global check passed (N configurations)`.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from sbpflow.sbp import B, S


class Config(NamedTuple):
    name: str
    module: str
    kwargs: dict
    batch: int = 5
    with_hx: bool = False
    dtype: object = flow.float64
    tol: float = 1e-10
    lengths: tuple | None = None  # run as a PackedSequence of these lengths


CONFIGS = [
    Config("LSTM, batch_first, S(0) batch", "LSTM", {"batch_first": True}),
    Config("LSTM, 2 layers, bidirectional, proj_size, given (h0, c0)", "LSTM",
           {"batch_first": True, "num_layers": 2, "bidirectional": True, "proj_size": 2},
           with_hx=True),
    Config("LSTM, float32, a batch shorter than the rank count", "LSTM",
           {"batch_first": True}, batch=1, dtype=flow.float32, tol=1e-5),
    Config("GRU, 2 layers, given h0", "GRU", {"batch_first": True, "num_layers": 2},
           with_hx=True),
    Config("RNN relu", "RNN", {"batch_first": True, "nonlinearity": "relu"}),
    Config("LSTM, bidirectional, packed sequences (unsorted lengths)", "LSTM",
           {"batch_first": True, "bidirectional": True}, with_hx=True, lengths=(2, 4, 1, 3, 4)),
]
IN, HID, STEPS = 3, 4, 4


def _leaves(cfg: Config, placement):
    """The input (and hidden state) leaves: local, or global with the batch split."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((cfg.batch, STEPS, IN)).astype(cfg.dtype.np)
    arrays = [(x, S(0))]
    if cfg.with_hx:
        d = 2 if cfg.kwargs.get("bidirectional") else 1
        lead = (cfg.kwargs.get("num_layers", 1) * d, cfg.batch)
        arrays.append((rng.standard_normal(lead + (cfg.kwargs.get("proj_size") or HID,))
                       .astype(cfg.dtype.np), S(1)))
        if cfg.module == "LSTM":
            arrays.append((rng.standard_normal(lead + (HID,)).astype(cfg.dtype.np), S(1)))
    if placement is None:
        return [flow.tensor(a, requires_grad=True) for a, _ in arrays]
    return [flow.tensor(a, placement=placement, sbp=sbp, requires_grad=True)
            for a, sbp in arrays]


def run(cfg: Config, placement):
    flow.manual_seed(0)
    model = getattr(nn, cfg.module)(IN, HID, dtype=cfg.dtype, **cfg.kwargs)
    if placement is not None:
        for name, p in list(model.named_parameters()):
            g = p.detach().to_global(placement, B)
            setattr(model, name, nn.Parameter(g))
    leaves = _leaves(cfg, placement)
    hx = None
    if cfg.with_hx:
        hx = tuple(leaves[1:]) if cfg.module == "LSTM" else leaves[1]
    if cfg.lengths is None:
        out, h = model(leaves[0], hx)
    else:
        packed = pack_padded_sequence(leaves[0], list(cfg.lengths), batch_first=True,
                                      enforce_sorted=False)
        out, h = model(packed, hx)
        out, lengths = pad_packed_sequence(out, batch_first=True)
        assert lengths.tolist() == list(cfg.lengths)
    outs = [out, *(h if isinstance(h, tuple) else (h,))]
    split = placement is not None and flow.env.get_world_size() > 1
    if split and cfg.batch > 1 and cfg.lengths is None:
        # Data parallel all the way: the output stays split on the batch (axis 0 with
        # batch_first), the final states on their batch axis 1; nothing gathered to B.
        # (A batch of one row has no split to keep.)
        for k, (o, want) in enumerate(zip(outs, [S(0)] + [S(1)] * (len(outs) - 1))):
            if o.sbp != (want,):
                raise AssertionError(f"{cfg.name}: output {k} is {o.sbp}, expected {want}")
    rng = np.random.default_rng(1)
    cots = [rng.standard_normal(tuple(o.shape)).astype(cfg.dtype.np) for o in outs]
    if placement is None:
        cot_t = [flow.tensor(c) for c in cots]
    else:
        cot_t = [flow.tensor(c, placement=placement, sbp=o.sbp) for c, o in zip(cots, outs)]
    flow.autograd.backward(outs, cot_t)
    result = {f"output {k}": o.detach().numpy() for k, o in enumerate(outs)}
    for k, leaf in enumerate(leaves):
        result[f"grad of leaf {k}"] = leaf.grad.numpy()
        if placement is not None and leaf.grad.sbp != leaf.sbp:
            raise AssertionError(f"{cfg.name}: leaf {k} is {leaf.sbp} but its gradient came "
                                 f"back {leaf.grad.sbp}")
    for name, p in model.named_parameters():
        result[f"grad of {name}"] = p.grad.numpy()
        if placement is not None and p.grad.sbp != p.sbp:
            raise AssertionError(f"{cfg.name}: {name} is {p.sbp} but its gradient came back "
                                 f"{p.grad.sbp}")
    return result


def check(cfg: Config, placement) -> None:
    want = run(cfg, None)
    got = run(cfg, placement)
    assert list(got) == list(want)
    for key, w in want.items():
        np.testing.assert_allclose(got[key], w, rtol=cfg.tol, atol=cfg.tol,
                                   err_msg=f"{cfg.name}: {key}")


def main() -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    placement = flow.placement("cpu", list(range(world)))
    only = sys.argv[1] if len(sys.argv) > 1 else None
    for cfg in CONFIGS:
        if only is None or only in cfg.name:
            check(cfg, placement)
    print(f"rank {rank}: rnn global check passed ({len(CONFIGS)} configurations)", flush=True)


if __name__ == "__main__":
    main()
