"""The layers PyTorch programs need (issue 11): sbpflow vs torch eager vs NumPy, side by side.

Forward + backward of an LSTM, a GRU, ConvTranspose2d, bilinear upsampling and
MultiheadAttention,
with identical weights and inputs.  The NumPy column is a hand-written forward only (the
limit for our kernels on the forward); "-" where none is written.

Run: python benchmarks/layers.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=smoke(0.5, 0.005))
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402

after_import_pin(threads)


def _same_weights(ours, theirs):
    ours.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})


def _forward(module, *inputs):
    def run():
        out = module(*inputs)
        return out[0] if isinstance(out, tuple) else out
    return run


def _train_step(lib, module, *inputs):
    forward = _forward(module, *inputs)
    return lambda: forward().sum().backward()


def _np_lstm(x, w_ih, w_hh, b):
    """One-layer LSTM forward (seq, batch, in) -> outputs, gates i, f, g, o."""
    t_len, batch, _ = x.shape
    hidden = w_hh.shape[1]
    h = np.zeros((batch, hidden), x.dtype)
    c = np.zeros_like(h)
    xw = x @ w_ih.T + b
    out = np.empty((t_len, batch, hidden), x.dtype)
    for t in range(t_len):
        z = xw[t] + h @ w_hh.T
        i, f, g, o = np.split(z, 4, axis=1)
        i, f, o = (1 / (1 + np.exp(-v)) for v in (i, f, o))
        c = f * c + i * np.tanh(g)
        h = o * np.tanh(c)
        out[t] = h
    return out


def _np_gru(x, w_ih, w_hh, b_ih, b_hh):
    """One-layer GRU forward (seq, batch, in) -> outputs, torch's gate order r, z, n."""
    t_len, batch, _ = x.shape
    hidden = w_hh.shape[1]
    h = np.zeros((batch, hidden), x.dtype)
    xw = x @ w_ih.T + b_ih
    out = np.empty((t_len, batch, hidden), x.dtype)
    for t in range(t_len):
        gh = h @ w_hh.T + b_hh
        ir, iz, in_ = np.split(xw[t], 3, axis=1)
        hr, hz, hn = np.split(gh, 3, axis=1)
        r = 1 / (1 + np.exp(-(ir + hr)))
        z = 1 / (1 + np.exp(-(iz + hz)))
        n = np.tanh(in_ + r * hn)
        h = n + z * (h - n)
        out[t] = h
    return out


def _np_bilinear_x2(x):
    """align_corners=False bilinear upsampling by 2 on the last two axes."""
    def axis_weights(n):
        src = np.clip((np.arange(2 * n) + 0.5) / 2 - 0.5, 0, None)
        lo = np.minimum(np.floor(src).astype(int), n - 1)
        hi = np.minimum(lo + 1, n - 1)
        w = (src - lo).astype(x.dtype)
        return lo, hi, w

    lo, hi, w = axis_weights(x.shape[-2])
    rows = x[..., lo, :] * (1 - w)[:, None] + x[..., hi, :] * w[:, None]
    lo, hi, w = axis_weights(x.shape[-1])
    return rows[..., lo] * (1 - w) + rows[..., hi] * w


def cases(forward_only=False):
    step = (lambda lib, m, *xs: _forward(m, *xs)) if forward_only else _train_step
    rng = np.random.default_rng(0)

    t_lstm = torch.nn.LSTM(64, 128)
    f_lstm = flow.nn.LSTM(64, 128)
    _same_weights(f_lstm, t_lstm)
    x = rng.standard_normal((32, 16, 64)).astype(np.float32)
    w = {k: v.detach().numpy() for k, v in t_lstm.state_dict().items()}
    yield ("LSTM 32x16x64->128", step(flow, f_lstm, flow.tensor(x, requires_grad=True)),
           step(torch, t_lstm, torch.tensor(x, requires_grad=True)),
           lambda x=x: _np_lstm(x, w["weight_ih_l0"], w["weight_hh_l0"],
                                w["bias_ih_l0"] + w["bias_hh_l0"]))

    t_gru = torch.nn.GRU(64, 128)
    f_gru = flow.nn.GRU(64, 128)
    _same_weights(f_gru, t_gru)
    wg = {k: v.detach().numpy() for k, v in t_gru.state_dict().items()}
    yield ("GRU 32x16x64->128", step(flow, f_gru, flow.tensor(x, requires_grad=True)),
           step(torch, t_gru, torch.tensor(x, requires_grad=True)),
           lambda x=x: _np_gru(x, wg["weight_ih_l0"], wg["weight_hh_l0"], wg["bias_ih_l0"],
                               wg["bias_hh_l0"]))

    t_ct = torch.nn.ConvTranspose2d(32, 16, 4, 2, 1)
    f_ct = flow.nn.ConvTranspose2d(32, 16, 4, 2, 1)
    _same_weights(f_ct, t_ct)
    x = rng.standard_normal((16, 32, 16, 16)).astype(np.float32)
    yield ("ConvT2d 32->16 k4s2", step(flow, f_ct, flow.tensor(x, requires_grad=True)),
           step(torch, t_ct, torch.tensor(x, requires_grad=True)), None)

    x = rng.standard_normal((16, 32, 32, 32)).astype(np.float32)
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    up_f = flow.nn.Upsample(scale_factor=2, mode="bilinear")
    up_t = torch.nn.Upsample(scale_factor=2, mode="bilinear")
    yield ("bilinear x2 32^2", step(flow, up_f, fx), step(torch, up_t, tx),
           lambda x=x: _np_bilinear_x2(x))

    t_mha = torch.nn.MultiheadAttention(128, 4, batch_first=True)
    f_mha = flow.nn.MultiheadAttention(128, 4, batch_first=True)
    _same_weights(f_mha, t_mha)
    x = rng.standard_normal((16, 32, 128)).astype(np.float32)
    fq, tq = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yield ("MHA 16x32x128 h4", step(flow, f_mha, fq, fq, fq),
           step(torch, t_mha, tq, tq, tq), None)


def main():
    print(f"threads: {threads} (OMP/OpenBLAS/MKL pinned; torch.set_num_threads({threads}))")
    print(f"{'layer':<22}{'fwd+bwd ms':>11}{'torch':>8}{'ratio':>8}"
          f"{'fwd ms':>9}{'torch':>8}{'numpy':>8}{'/torch':>8}{'/numpy':>8}")
    with torch.no_grad(), flow.no_grad():
        forwards = {name: (f, t, n) for name, f, t, n in cases(forward_only=True)}
    for name, f, t, _ in cases():
        fs = time_us(f, args.min_time, sync=flow.synchronize) / 1e3
        ts = time_us(t, args.min_time) / 1e3
        ff, tf, nf = forwards[name]
        with torch.no_grad(), flow.no_grad():
            ffs = time_us(ff, args.min_time, sync=flow.synchronize) / 1e3
            tfs = time_us(tf, args.min_time) / 1e3
        nfs = time_us(nf, args.min_time) / 1e3 if nf is not None else None
        numpy = (f"{nfs:>8.2f}", f"{ffs / nfs:>7.2f}x") if nfs else (f"{'-':>8}", f"{'-':>8}")
        print(f"{name:<22}{fs:>11.2f}{ts:>8.2f}{fs / ts:>7.2f}x"
              f"{ffs:>9.2f}{tfs:>8.2f}{numpy[0]}{ffs / tfs:>7.2f}x{numpy[1]}")


if __name__ == "__main__":
    main()
