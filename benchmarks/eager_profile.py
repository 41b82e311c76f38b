"""Where an eager op's time goes: Python calls per op and profiled µs per layer.

For each case, N calls run under cProfile; the script prints the Python-level calls per op
(exact, independent of machine load) and the profiled time per op split by the layer of the
function that spent it (cProfile's own overhead inflates every figure about 2x, so compare
rows and layers, not these µs with the unprofiled ones of eager_ops.py).

To compare with another version, run the same script against that tree:
    git worktree add ../sbpflow-before <commit>
    PYTHONPATH=../sbpflow-before python benchmarks/eager_profile.py
    python benchmarks/eager_profile.py

Run: python benchmarks/eager_profile.py [--n 20000]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--n", type=int, default=smoke(20000, 20))
args = parser.parse_args()
threads = pin_threads(1)

import sbpflow as flow  # noqa: E402

after_import_pin(threads)

# (layer, path fragment), first match wins; anything else outside sbpflow is "NumPy/builtins".
LAYERS = [
    ("functional", "/sbpflow/framework/functional/"),
    ("interpreter", "/sbpflow/framework/interpreter.py"),
    ("tensor", "/sbpflow/framework/tensor.py"),
    ("autograd", "/sbpflow/autograd/"),
    ("VM", "/sbpflow/vm/"),
    ("op kernels", "/sbpflow/ops/"),
    ("primitives", "/sbpflow/device/"),
    ("nn/optim", "/sbpflow/nn/"),
    ("nn/optim", "/sbpflow/optim/"),
    ("other sbpflow", "/sbpflow/"),
]
COLUMNS = ["functional", "interpreter", "tensor", "autograd", "VM", "op kernels", "primitives",
           "nn/optim", "other sbpflow", "NumPy/builtins"]


def layer_of(filename: str) -> str:
    for name, frag in LAYERS:
        if frag in filename.replace("\\", "/"):
            return name
    return "NumPy/builtins"


def cases():
    a2, b2 = flow.ones(2, 2), flow.ones(2, 2)
    x64 = flow.ones(64, 64)
    flow.manual_seed(0)
    nn = flow.nn
    mlp = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = flow.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9)
    xb, yb = flow.randn(64, 784), flow.randint(0, 10, (64,))

    def step():
        loss = nn.functional.cross_entropy(mlp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    n = args.n
    return [
        ("add 2x2", lambda: a2 + b2, n),
        ("relu 64x64", lambda: x64.relu(), n),
        ("sum 64x64", lambda: x64.sum(), n),
        ("MLP train step", step, max(n // 100, smoke(20, 2))),
    ]


def main() -> None:
    print(f"sbpflow from {Path(flow.__file__).parent.parent}; threads: {threads}")
    head = f"{'case':16s} {'calls/op':>9s} {'prof µs':>8s} " + " ".join(
        f"{c:>{max(len(c), 7)}s}" for c in COLUMNS)
    print(head)
    for name, fn, n in cases():
        for _ in range(min(n, 200)):
            fn()
        flow.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        flow.synchronize()
        prof.disable()
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())  # primitive + recursive calls
        per_layer = dict.fromkeys(COLUMNS, 0.0)
        total = 0.0
        for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():
            per_layer[layer_of(filename)] += tottime
            total += tottime
        us = 1e6 / n
        print(f"{name:16s} {calls / n:9.1f} {total * us:8.2f} " + " ".join(
            f"{per_layer[c] * us:>{max(len(c), 7)}.2f}" for c in COLUMNS))


main()
