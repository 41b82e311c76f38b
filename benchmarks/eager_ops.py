"""Per-op eager overhead on small tensors: sbpflow vs torch vs raw NumPy, side by side.

Run: python benchmarks/eager_ops.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=0.2)
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402

after_import_pin(threads)


def cases():
    rng = np.random.default_rng(0)
    a2 = rng.standard_normal((2, 2)).astype(np.float32)
    b2 = rng.standard_normal((2, 2)).astype(np.float32)
    m64a = rng.standard_normal((64, 64)).astype(np.float32)
    m64b = rng.standard_normal((64, 64)).astype(np.float32)
    v = rng.standard_normal((64, 64)).astype(np.float32)
    fa, fb = flow.tensor(a2), flow.tensor(b2)
    ta, tb = torch.from_numpy(a2), torch.from_numpy(b2)
    fma, fmb = flow.tensor(m64a), flow.tensor(m64b)
    tma, tmb = torch.from_numpy(m64a), torch.from_numpy(m64b)
    fv, tv = flow.tensor(v), torch.from_numpy(v)
    zero = np.float32(0)
    yield ("add 2x2", lambda: fa + fb, lambda: ta + tb, lambda: np.add(a2, b2))
    yield ("matmul 64x64", lambda: fma @ fmb, lambda: tma @ tmb, lambda: np.matmul(m64a, m64b))
    yield ("relu 64x64", lambda: flow.relu(fv), lambda: torch.relu(tv),
           lambda: np.maximum(v, zero))
    yield ("sum 64x64", lambda: fv.sum(), lambda: tv.sum(), lambda: np.sum(v))


def main():
    print(f"threads: {threads} (OMP/OpenBLAS/MKL pinned; torch.set_num_threads({threads}))")
    print(f"{'op':<14}{'sbpflow us':>12}{'torch us':>10}{'numpy us':>10}"
          f"{'vs torch':>10}{'vs numpy':>10}")
    for name, f, t, n in cases():
        fs, ts, ns = (time_us(x, args.min_time) for x in (f, t, n))
        print(f"{name:<14}{fs:>12.2f}{ts:>10.2f}{ns:>10.2f}{fs / ts:>9.1f}x{fs / ns:>9.1f}x")


if __name__ == "__main__":
    main()
