"""nn.Graph compile time per op, for training graphs of about 100 to 5,000 ops.

Each graph trains a stack of k blocks (Linear 32->32, then tanh) with SGD; k sets the size.
The first call traces build(), runs the passes and compiles the Plan; the time of the first
call minus one later call is the compile time.  It is printed per op of the traced Job (the
forward ops `build()` recorded plus the backward and update ops the passes add), with the split
into tracing, passes and compiling when the graph reports it.

Run: python benchmarks/compile_time.py [--threads N] [--sizes 8,32,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--sizes", default="8,32,128,512,1024")
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402

import sbpflow as flow  # noqa: E402

after_import_pin(threads)


def make_graph(k: int):
    blocks = []
    for _ in range(k):
        blocks += [flow.nn.Linear(32, 32), flow.nn.Tanh()]
    model = flow.nn.Sequential(*blocks)
    opt = flow.optim.SGD(model.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.model(x).square().mean()
            loss.backward()
            return loss

    return G()


def main():
    print(f"threads: {threads}")
    x = flow.tensor(np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32))
    print(f"{'blocks':>7}{'Job ops':>9}{'first call s':>14}{'step ms':>9}{'compile s':>11}"
          f"{'ms/op':>8}")
    for k in (int(v) for v in args.sizes.split(",")):
        g = make_graph(k)
        t0 = time.perf_counter()
        g(x)
        flow.synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        g(x)
        flow.synchronize()
        step = time.perf_counter() - t0
        n_ops = len(g._last.job.ops)  # the compiled Job, after every pass
        compile_s = first - step
        print(f"{k:>7}{n_ops:>9}{first:>14.3f}{step * 1e3:>9.2f}{compile_s:>11.3f}"
              f"{compile_s / n_ops * 1e3:>8.3f}")


if __name__ == "__main__":
    main()
