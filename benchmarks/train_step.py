"""Time per training step (forward, backward, optimizer) side by side in one run.

Models: an MLP 784-256-10 (batch 64), the digits CNN (batch 64) and the small GPT of
`sbpflow.examples.gpt` (batch 64); in sbpflow eager, torch eager, and for the MLP also in
hand-written NumPy (the floor for our kernels).

Run: python benchmarks/train_step.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=1.0)
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402
from sbpflow.examples.digits import DigitsCNN  # noqa: E402
from sbpflow.examples.gpt import VOCAB, TinyGPT, make_batch  # noqa: E402

after_import_pin(threads)


def mlp(nn):
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def torch_digits():
    tnn = torch.nn
    m = tnn.Module()
    m.features = tnn.Sequential(
        tnn.Conv2d(1, 16, 3, padding=1), tnn.BatchNorm2d(16), tnn.ReLU(),
        tnn.Conv2d(16, 32, 3, padding=1), tnn.BatchNorm2d(32), tnn.ReLU(), tnn.MaxPool2d(2))
    m.classifier = tnn.Sequential(tnn.Flatten(), tnn.Dropout(0.2), tnn.Linear(32 * 16, 10))
    m.forward = lambda x: m.classifier(m.features(x))
    return m


def torch_gpt(block):
    tnn = torch.nn

    class T(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok = tnn.Embedding(VOCAB, 64)
            self.pos = tnn.Embedding(block, 64)
            layer = tnn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation="gelu",
                                                batch_first=True, norm_first=True)
            self.blocks = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = tnn.LayerNorm(64)
            self.head = tnn.Linear(64, VOCAB)
            self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).triu(1))

        def forward(self, idx):
            t = idx.shape[1]
            h = self.tok(idx) + self.pos(torch.arange(t))
            return self.head(self.norm(self.blocks(h, mask=self.causal[:t, :t])))

    return T()


def step_fn(lib, model, x, y, loss_fn):
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def numpy_mlp_step(x, y_onehot):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((784, 256)) * 0.03).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    w2 = (rng.standard_normal((256, 10)) * 0.06).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    vel = [np.zeros_like(p) for p in (w1, b1, w2, b2)]

    def step():
        h = x @ w1 + b1
        a = np.maximum(h, 0)
        z = a @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        dz = (p - y_onehot) / len(x)
        gw2, gb2 = a.T @ dz, dz.sum(0)
        dh = (dz @ w2.T) * (h > 0)
        gw1, gb1 = x.T @ dh, dh.sum(0)
        for v, g, prm in zip(vel, (gw1, gb1, gw2, gb2), (w1, b1, w2, b2)):
            v *= 0.9
            v += g
            prm -= 0.01 * v

    return step


def _both_modes(fn):
    """(async µs, SYNC µs) per call of fn: the same code under both VM modes."""
    vm = flow.vm
    vm.set_mode("async")
    a = time_us(fn, args.min_time, sync=flow.synchronize)
    vm.set_mode("sync")
    s = time_us(fn, args.min_time)
    vm.set_mode("async")
    return a, s


def main():
    print(f"threads: {threads} (OMP/OpenBLAS/MKL pinned; torch.set_num_threads({threads}))")
    rng = np.random.default_rng(0)
    rows = []

    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    torch.manual_seed(0)
    f = step_fn(flow, mlp(flow.nn), flow.tensor(x), flow.tensor(y),
                flow.nn.functional.cross_entropy)
    t = step_fn(torch, mlp(torch.nn), torch.tensor(x), torch.tensor(y),
                torch.nn.functional.cross_entropy)
    n = numpy_mlp_step(x, np.eye(10, dtype=np.float32)[y])
    rows.append(("MLP 784-256-10", *_both_modes(f), time_us(t, args.min_time),
                 time_us(n, args.min_time)))

    xi = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    f = step_fn(flow, DigitsCNN(), flow.tensor(xi), flow.tensor(y),
                flow.nn.functional.cross_entropy)
    t = step_fn(torch, torch_digits(), torch.tensor(xi), torch.tensor(y),
                torch.nn.functional.cross_entropy)
    rows.append(("digits CNN", *_both_modes(f), time_us(t, args.min_time), None))

    xs, ys = make_batch(rng, 64, 6)

    def ce(lib):
        return lambda logits, tgt: lib.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), tgt.reshape(-1))

    f = step_fn(flow, TinyGPT(block=13), flow.tensor(xs), flow.tensor(ys), ce(flow))
    t = step_fn(torch, torch_gpt(13), torch.tensor(xs), torch.tensor(ys), ce(torch))
    rows.append(("small GPT", *_both_modes(f), time_us(t, args.min_time), None))

    print(f"{'model':<16}{'async ms':>10}{'sync ms':>9}{'torch ms':>10}{'numpy ms':>10}"
          f"{'async/sync':>11}{'async/torch':>12}{'async/numpy':>12}")
    for name, fa, fs, ts, ns in rows:
        ncol = f"{ns / 1e3:>10.2f}" if ns else f"{'-':>10}"
        rcol = f"{fa / ns:>11.1f}x" if ns else f"{'-':>12}"
        print(f"{name:<16}{fa / 1e3:>10.2f}{fs / 1e3:>9.2f}{ts / 1e3:>10.2f}{ncol}"
              f"{fa / fs:>10.2f}x{fa / ts:>11.1f}x{rcol}")


if __name__ == "__main__":
    main()
