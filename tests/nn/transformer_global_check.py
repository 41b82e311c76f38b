"""Attention and Transformer modules on global tensors equal the local modules (run under
`mpiexec -n N`; test_transformer.py launches it).

Each case builds a module on local tensors (the oracle) and a deep copy of it made global on a
placement of all ranks, parameters broadcast, inputs and masks split along the batch (S(0)
for batch-major, S(1) for sequence-first inputs, with a batch that does not divide evenly).
Outputs, input gradients and parameter gradients must agree, and every parameter's gradient
must come back broadcast like the parameter (the data-parallel all-reduce).

Each rank prints `rank R: transformer global check passed (N cases)`.
"""

from __future__ import annotations

import copy

import numpy as np

import sbpflow as flow
import sbpflow.nn as nn

B, S = flow.sbp.broadcast, flow.sbp.split
L, SRC, E, H = 4, 5, 8, 2
TOL = 1e-9


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _padding(n, s, seed):
    kpm = np.random.default_rng(seed).random((n, s)) < 0.3
    kpm[:, 0] = False
    return kpm


def _causal(n):
    return np.triu(np.ones((n, n), dtype=bool), 1)


def cases(n):
    """(name, module factory, inputs: list of (array, split axis or None), kwargs alike)."""
    seq = lambda *s, seed=0: (_x(*s, seed=seed), 1)  # noqa: E731 (sequence-first: batch axis 1)
    bat = lambda *s, seed=0: (_x(*s, seed=seed), 0)  # noqa: E731
    f64 = flow.float64
    return [
        ("MultiheadAttention, add_bias_kv, kdim/vdim, padding",
         lambda: nn.MultiheadAttention(E, H, add_bias_kv=True, kdim=3, vdim=6, dtype=f64),
         [seq(L, n, E), seq(SRC, n, 3, seed=1), seq(SRC, n, 6, seed=2)],
         {"key_padding_mask": (_padding(n, SRC, 3), 0), "average_attn_weights": False}),
        ("MultiheadAttention, batch_first, add_zero_attn, causal mask",
         lambda: nn.MultiheadAttention(E, H, add_zero_attn=True, batch_first=True, dtype=f64),
         [bat(n, L, E)] * 3,
         {"attn_mask": (_causal(L), None), "need_weights": False}),
        ("TransformerEncoderLayer, batch_first, norm_first, padding",
         lambda: nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True,
                                            norm_first=True, dtype=f64),
         [bat(n, L, E)],
         {"src_key_padding_mask": (_padding(n, L, 4), 0)}),
        ("TransformerDecoderLayer, masks",
         lambda: nn.TransformerDecoderLayer(E, H, 16, dropout=0.0, dtype=f64),
         [seq(L, n, E), seq(SRC, n, E, seed=1)],
         {"tgt_mask": (_causal(L), None), "memory_key_padding_mask": (_padding(n, SRC, 5), 0)}),
    ]


def run(module, inputs, kwargs, placement):
    def wrap(value):
        if not (isinstance(value, tuple) and isinstance(value[0], np.ndarray)):
            return value
        a, axis = value
        grad = a.dtype.kind == "f" and a.ndim == 3
        if placement is None:
            return flow.tensor(a, requires_grad=grad)
        sbp = B if axis is None else S(axis)
        return flow.tensor(a, placement=placement, sbp=sbp, requires_grad=grad)

    args = [wrap(v) for v in inputs]
    kw = {k: wrap(v) for k, v in kwargs.items()}
    out = module(*args, **kw)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    loss = 0
    for i, o in enumerate(outs):
        cot = _x(*o.shape, seed=10 + i)
        c = (flow.tensor(cot) if placement is None
             else flow.tensor(cot, placement=placement, sbp=B))
        loss = loss + (o * c).sum()
    loss.backward()
    got = {"out%d" % i: o.detach().numpy() for i, o in enumerate(outs)}
    got.update({f"grad of input {i}": a.grad.numpy() for i, a in enumerate(args)
                if a.grad is not None})
    for name, p in module.named_parameters():
        if placement is not None and (p.grad.sbp != p.sbp or p.grad.placement != p.placement):
            raise AssertionError(f"{name} is {p.sbp} but its gradient came back {p.grad.sbp}")
        got[f"grad of {name}"] = p.grad.numpy()
    return got


def main() -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    line = flow.placement("cpu", list(range(world)))
    n = 2 * world + 1  # uneven pieces
    todo = cases(n)
    for name, make, inputs, kwargs in todo:
        flow.manual_seed(0)
        local = make()
        local.eval()
        glob = copy.deepcopy(local).to_global(placement=line, sbp=B)
        want = run(local, inputs, kwargs, None)
        got = run(glob, inputs, kwargs, line)
        assert list(got) == list(want), (name, list(got), list(want))
        for key, w in want.items():
            np.testing.assert_allclose(got[key], w, TOL, TOL, err_msg=f"{name}: {key}")
    check_nested_inference(line, n)
    print(f"rank {rank}: transformer global check passed ({len(todo) + 1} cases)", flush=True)


def check_nested_inference(line, n) -> None:
    """Encoder inference with a left-aligned padding mask (torch's nested-tensor path: padded
    positions come out as zeros), batch split over the ranks."""
    flow.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True,
                                       dtype=flow.float64)
    local = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    glob = copy.deepcopy(local).to_global(placement=line, sbp=B)
    x = _x(n, L, E)
    lengths = np.arange(n) % L + 1
    kpm = np.arange(L)[None, :] >= lengths[:, None]
    with flow.no_grad():
        want = local(flow.tensor(x), src_key_padding_mask=flow.tensor(kpm)).numpy()
        got = glob(flow.tensor(x, placement=line, sbp=S(0)),
                   src_key_padding_mask=flow.tensor(kpm, placement=line, sbp=S(0))).numpy()
    assert (want[kpm] == 0).all() and (want[~kpm] != 0).any()
    np.testing.assert_allclose(got, want, TOL, TOL, err_msg="nested inference")


if __name__ == "__main__":
    main()
