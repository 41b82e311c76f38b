"""Small Jobs built by hand with the ir.py API, for the compiler and runtime tests."""

from __future__ import annotations

import numpy as np

import sbpflow as flow
from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.graph import ir
from sbpflow.ops import registry
from sbpflow.sbp import B
from sbpflow.sbp.placement import Placement

PL = Placement("cpu", [0])


class JobBuilder:
    """job = JobBuilder("name"); x = jb.input((4, 3)); h = jb.op("relu", x); jb.output(h)"""

    def __init__(self, name="job"):
        self.job = ir.Job(name)
        self.n_in = 0
        self.n_out = 0
        self.line = 100

    def tensor(self, shape, dtype=dt.float32):
        return self.job.add_tensor(TensorMeta(tuple(shape), dtype), PL, (B,)).name

    def input(self, shape, dtype=dt.float32):
        t = self.tensor(shape, dtype)
        self.job.add_op("input", [], [t], {"index": self.n_in})
        self.n_in += 1
        return t

    def variable(self, name, value: np.ndarray):
        tensor = flow.tensor(value)
        self.job.variables[name] = ir.Variable(name, tensor._meta, True, tensor)
        t = self.tensor(value.shape, tensor.dtype)
        self.job.add_op("variable", [], [t], {"var": name})
        return t, tensor

    def feed(self, key, dtype=dt.float32):
        t = self.tensor((), dtype)
        self.job.add_op("feed", [], [t], {"key": key})
        return t

    def constant(self, value: np.ndarray):
        t = self.tensor(value.shape, dt.as_dtype(value.dtype))
        self.job.add_op("constant", [], [t], {"value": value})
        return t

    def op(self, op_type, *inputs, name=None, **attrs):
        """A registered op: output metas inferred by the OpDef, as tracing does."""
        opdef = registry.get(op_type)
        attrs = opdef.bind_attrs(attrs)
        flat = list(inputs[0]) if opdef.variadic else list(inputs)
        metas = tuple(self.job.tensors[t].meta for t in flat)
        outs = [self.job.add_tensor(m, PL, (B,)).name for m in opdef.meta(metas, attrs)]
        self.line += 1
        self.job.add_op(op_type, flat, outs, attrs, scope="model", loc=("build.py", self.line),
                        name=name)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def assign(self, var_tensor, value):
        self.job.add_op("assign", [var_tensor, value], [])

    def output(self, t):
        self.job.add_op("output", [t], [], {"index": self.n_out})
        self.n_out += 1


def mlp_job(seed=0, lr_feed=True):
    """input -> matmul -> relu -> output, with an SGD-like update of the weight."""
    rng = np.random.default_rng(seed)
    jb = JobBuilder("mlp")
    x = jb.input((4, 3))
    w, W = jb.variable("fc.weight", rng.standard_normal((3, 5)).astype(np.float32))
    h = jb.op("matmul", x, w)
    r = jb.op("relu", h)
    jb.output(r)
    lr = jb.feed("lr")
    g = jb.op("mul", w, lr)
    w2 = jb.op("sub", w, g)
    jb.assign(w, w2)
    return jb, W
