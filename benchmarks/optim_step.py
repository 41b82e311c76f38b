"""Time of one optimizer step, multi-tensor (foreach) against per-parameter, beside torch.

20 parameters (10 x Linear(64, 64)) with fixed gradients; each optimizer runs 20 warm-up steps,
then the median of 7 runs of 50 steps (after `flow.synchronize()`), for sbpflow with
foreach=None (the default: one fused instruction per bucket) and foreach=False (torch's
per-parameter formulas), and torch with its default (foreach) and foreach=False.

Run: python benchmarks/optim_step.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke  # noqa: E402

threads = pin_threads(1)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402

after_import_pin(threads)
WARMUP, RUNS, STEPS = smoke((20, 7, 50), (1, 1, 2))  # steps before timing, timed runs of steps

CASES = [
    ("SGD momentum", "SGD", dict(lr=0.01, momentum=0.9)),
    ("Adam", "Adam", dict(lr=1e-3)),
    ("AdamW", "AdamW", dict(lr=1e-3)),
    ("Adagrad", "Adagrad", dict(lr=0.01)),
    ("RMSprop", "RMSprop", dict(lr=0.01)),
    ("RMSprop centered+momentum", "RMSprop", dict(lr=0.01, centered=True, momentum=0.9)),
    ("Adadelta", "Adadelta", dict(lr=1.0)),
    ("Adamax", "Adamax", dict(lr=2e-3)),
    ("NAdam", "NAdam", dict(lr=2e-3)),
    ("RAdam", "RAdam", dict(lr=1e-3)),
    ("ASGD", "ASGD", dict(lr=0.01)),
    ("Rprop", "Rprop", dict(lr=0.01)),
]


def _params(lib):
    rng = np.random.default_rng(0)
    shapes = [(64, 64), (64,)] * 10
    ps = [lib.tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True)
          for s in shapes]
    for p in ps:
        p.grad = lib.tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.01)
    return ps


def _time(lib, name, kw, foreach, sync):
    opt = getattr(lib.optim, name)(_params(lib), foreach=foreach, **kw)
    for _ in range(WARMUP):
        opt.step()
    sync()
    runs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        for _ in range(STEPS):
            opt.step()
        sync()
        runs.append((time.perf_counter() - t) / STEPS * 1e6)
    return statistics.median(runs)


def main() -> None:
    print(f"threads: {threads}; 20 parameters (10 x Linear(64, 64)); µs per step")
    print(f"{'optimizer':28s} {'foreach':>9s} {'per-param':>10s} {'speed-up':>9s} "
          f"{'torch':>8s} {'torch f=F':>10s} {'foreach/torch':>14s}")
    for label, name, kw in CASES:
        fused = _time(flow, name, kw, None, flow.synchronize)
        single = _time(flow, name, kw, False, flow.synchronize)
        tdef = _time(torch, name, kw, None, lambda: None)
        tsingle = _time(torch, name, kw, False, lambda: None)
        print(f"{label:28s} {fused:9.0f} {single:10.0f} {single / fused:8.1f}x "
              f"{tdef:8.0f} {tsingle:10.0f} {fused / tdef:13.2f}x")


main()
