"""Elementwise fusion: a fused kernel against the unfused chain, side by side in one run.

Chains (a Job of elementwise ops, fused by the `fuse_elementwise` pass):
  arith5   x * 0.5 + bias -> relu -> * y -> 2 - .          (5 ops, bias broadcast)
  tanh5    x * 0.5 + bias -> tanh -> * y -> 2 - .          (a transcendental in the middle)
  bwd3     g * (y > 0) * lr                                 (a relu backward and a scaled step)
For each: the unfused chain run as the runtime would (each op's OpDef kernel, one after the
other), the same chain hand-written in NumPy, the fused kernel (numba), and the fused kernel's
NumPy fallback (`out=` buffers).  Ratios are unfused-kernels time / fused time.

Run: python benchmarks/fusion.py [--threads N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=smoke(0.3, 0.005))
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402

from sbpflow._core import dtype as dt  # noqa: E402
from sbpflow._core.meta import TensorMeta  # noqa: E402
from sbpflow.device import Device  # noqa: E402
from sbpflow.graph import ir  # noqa: E402
from sbpflow.graph.passes import fuse_elementwise  # noqa: E402
from sbpflow.ops import registry  # noqa: E402
from sbpflow.ops.registry import KernelContext  # noqa: E402
from sbpflow.sbp import B  # noqa: E402
from sbpflow.sbp.placement import Placement  # noqa: E402

after_import_pin(threads)
PRIMS = Device("cpu").prims
PLACEMENT = Placement("cpu", [0])


class Chain:
    """A Job built op by op, and its unfused runner (OpDef kernels in a straight line)."""

    def __init__(self):
        self.job = ir.Job("bench")
        self.n_in = 0

    def _t(self, meta):
        return self.job.add_tensor(meta, PLACEMENT, (B,)).name

    def input(self, shape, dtype):
        t = self._t(TensorMeta(tuple(shape), dtype))
        self.job.add_op("input", (), (t,), {"index": self.n_in})
        self.n_in += 1
        return t

    def op(self, op_type, *ins, **attrs):
        opdef = registry.get(op_type)
        attrs = opdef.bind_attrs(attrs)
        (m,) = opdef.meta(tuple(self.job.tensors[i].meta for i in ins), attrs)
        t = self._t(m)
        self.job.add_op(op_type, ins, (t,), attrs)
        return t

    def output(self, t):
        self.job.add_op("output", (t,), (), {"index": 0})

    def runner(self):
        """fn(*inputs) running every non-structural op with precomputed contexts."""
        steps, inputs, out = [], [], None
        for op in self.job.ops:
            if op.op_type == "input":
                inputs.append(op.outputs[0])
            elif op.op_type == "output":
                out = op.inputs[0]
            else:
                if op.op_type in ir.KERNEL_RESOLVERS:
                    kernel = ir.KERNEL_RESOLVERS[op.op_type](op, self.job)
                else:
                    kernel = registry.get(op.op_type).kernel
                ctx = KernelContext(PRIMS, op.op_type,
                                    tuple(self.job.tensors[i].meta for i in op.inputs),
                                    tuple(self.job.tensors[o].meta for o in op.outputs))
                steps.append((kernel, ctx, op.inputs, op.outputs[0], op.attrs))

        def run(*arrays):
            env = dict(zip(inputs, arrays, strict=True))
            for kernel, ctx, ins, o, attrs in steps:
                env[o] = kernel(ctx, *[env[i] for i in ins], **attrs)
            return env[out]

        return run


def arith5(shape, dtype, mid=None):
    c = Chain()
    x, bias, y = c.input(shape, dtype), c.input(shape[-1:], dtype), c.input(shape, dtype)
    v = c.op("add", c.op("mul_scalar", x, other=0.5), bias)
    v = c.op(mid or "relu", v)
    c.output(c.op("sub_scalar", c.op("mul", v, y), other=2.0, reverse=True))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype.np) for s in (shape, shape[-1:], shape)]
    f = np.dtype(dtype.np).type

    def by_hand(x, b, y):
        v = np.add(np.multiply(x, f(0.5)), b)
        v = np.tanh(v) if mid == "tanh" else np.maximum(v, f(0))
        return np.subtract(f(2.0), np.multiply(v, y))

    return c, arrays, by_hand


def bwd3(shape, dtype):
    c = Chain()
    y, g, lr = c.input(shape, dtype), c.input(shape, dtype), c.input((1,) + shape[1:], dtype)
    c.output(c.op("mul", c.op("mul", g, c.op("gt_scalar", y, other=0)), lr))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype.np) for s in (shape, shape, (1,) + shape[1:])]

    def by_hand(y, g, lr):
        return np.multiply(np.multiply(g, np.greater(y, 0)), lr)

    return c, arrays, by_hand


def main():
    print(f"threads={threads}")
    print(f"{'chain':<8} {'shape':<11} {'dtype':<8} {'unfused':>9} {'numpy':>9} {'fused':>9} "
          f"{'fallback':>9} {'ratio':>6}  (us per call; ratio = unfused / fused)")
    cases = []
    for shape in ((8, 8), (64, 256), (512, 1024)):
        cases.append(("arith5", shape, dt.float32, lambda s, d: arith5(s, d)))
    cases.append(("arith5", (64, 256), dt.float64, lambda s, d: arith5(s, d)))
    cases.append(("tanh5", (64, 256), dt.float32, lambda s, d: arith5(s, d, "tanh")))
    cases.append(("bwd3", (64, 256), dt.float32, bwd3))
    for name, shape, dtype, make in cases:
        chain, arrays, by_hand = make(shape, dtype)
        unfused = chain.runner()
        want = unfused(*arrays)
        times = {"unfused": time_us(lambda: unfused(*arrays), args.min_time),  # noqa: B023
                 "numpy": time_us(lambda: by_hand(*arrays), args.min_time)}  # noqa: B023
        for label, min_numel in (("fused", 0), ("fallback", 1 << 40)):
            fchain, _, _ = make(shape, dtype)
            fchain.job.config["fuse_jit_min_numel"] = min_numel
            fuse_elementwise.run(fchain.job)
            assert [op.op_type for op in fchain.job.ops].count("fused_elementwise") == 1
            fused = fchain.runner()
            got = fused(*arrays)
            np.testing.assert_array_equal(got, want)
            times[label] = time_us(lambda: fused(*arrays), args.min_time)  # noqa: B023
        print(f"{name:<8} {str(shape):<11} {dtype.name:<8} {times['unfused']:9.1f} "
              f"{times['numpy']:9.1f} {times['fused']:9.1f} {times['fallback']:9.1f} "
              f"{times['unfused'] / times['fused']:6.1f}")


if __name__ == "__main__":
    main()
