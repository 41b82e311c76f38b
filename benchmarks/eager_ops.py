"""Per-op eager overhead on small tensors: sbpflow vs torch vs raw NumPy, side by side.

Run: python benchmarks/eager_ops.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=smoke(0.2, 0.005))
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


def chain(lib, a, b, n=8):
    """The large-kernel pipeline: matmuls and elementwise ops on 512x512."""
    def run():
        x = a
        for _ in range(n):
            x = lib.tanh(x @ b) * 0.5 + x
        return x

    return run


def main():
    print(f"threads: {threads} (OMP/OpenBLAS/MKL pinned; torch.set_num_threads({threads}))")
    print("sbpflow async: kernels on the VM's worker thread; sync: SBPFLOW VM in SYNC mode")
    print(f"{'op':<16}{'async us':>10}{'sync us':>10}{'torch us':>10}{'numpy us':>10}"
          f"{'async/torch':>12}{'sync/torch':>11}{'async/numpy':>12}")
    vm = flow.vm
    rows = list(cases())
    rng = np.random.default_rng(1)
    big_a = rng.standard_normal((512, 512)).astype(np.float32) * 0.05
    big_b = rng.standard_normal((512, 512)).astype(np.float32) * 0.05
    rows.append(("chain 512 x8", chain(flow, flow.tensor(big_a), flow.tensor(big_b)),
                 chain(torch, torch.from_numpy(big_a), torch.from_numpy(big_b)),
                 lambda: _np_chain(big_a, big_b)))
    for name, f, t, n in rows:
        vm.set_mode("async")
        fa = time_us(f, args.min_time, sync=flow.synchronize)
        vm.set_mode("sync")
        fs = time_us(f, args.min_time)
        vm.set_mode("async")
        ts, ns = (time_us(x, args.min_time) for x in (t, n))
        print(f"{name:<16}{fa:>10.2f}{fs:>10.2f}{ts:>10.2f}{ns:>10.2f}"
              f"{fa / ts:>11.1f}x{fs / ts:>10.1f}x{fa / ns:>11.1f}x")


def _np_chain(a, b, n=8):
    x = a
    for _ in range(n):
        x = np.tanh(x @ b) * 0.5 + x
    return x


if __name__ == "__main__":
    main()
