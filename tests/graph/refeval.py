"""A test-only reference evaluator of Jobs: runs the ops one by one with their OpDef kernels on
NumPy arrays.  The package runs Jobs only through the compiler and actor runtime; these tests
use this to check traced Jobs and pass output by their numbers, independently of it."""

from __future__ import annotations

import numpy as np

import sbpflow as flow
from sbpflow.device import Device
from sbpflow.graph.ir import KERNEL_RESOLVERS
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext

_PRIMS = Device("cpu").prims


def run_job(job, inputs, feeds=None, seed=0):
    """Evaluate `job` on host arrays.  Returns (outputs, writes): the output arrays in order
    and {variable: new value} from the assign ops (applied by the caller)."""
    feeds = feeds or {}
    env: dict[str, np.ndarray] = {}
    outs: dict[int, np.ndarray] = {}
    writes: dict[str, np.ndarray] = {}
    offset = 0
    for op in job.ops:
        t = op.op_type
        if t == "input":
            env[op.outputs[0]] = np.asarray(inputs[op.attrs["index"]])
        elif t == "variable":
            env[op.outputs[0]] = job.variables[op.attrs["var"]].tensor.detach().numpy().copy()
        elif t == "feed":
            env[op.outputs[0]] = np.asarray(feeds[op.attrs["key"]], dtype=np.float64)
        elif t == "constant":
            env[op.outputs[0]] = op.attrs["value"]
        elif t == "assign":
            var = job.tensors[op.inputs[0]]
            name = job.producer(var.name).attrs["var"]
            writes[name] = env[op.inputs[1]]
        elif t == "output":
            outs[op.attrs["index"]] = env[op.inputs[0]]
        else:
            in_metas = tuple(job.tensors[i].meta for i in op.inputs)
            out_metas = tuple(job.tensors[o].meta for o in op.outputs)
            arrays = [env[i] for i in op.inputs]
            if t in KERNEL_RESOLVERS:
                kernel, variadic = KERNEL_RESOLVERS[t](op, job), False
            else:
                opdef = registry.get(t)
                kernel, variadic = opdef.kernel, opdef.variadic
            ctx = KernelContext(_PRIMS, t, in_metas, out_metas)
            if getattr(registry._REGISTRY.get(t), "random", False):
                ctx.seed, ctx.offset = seed, offset
                offset += 1 << 20
            res = kernel(ctx, arrays, **op.attrs) if variadic else kernel(ctx, *arrays,
                                                                          **op.attrs)
            if len(op.outputs) == 1:
                res = (res,)
            for o, a in zip(op.outputs, res):
                env[o] = np.array(a, copy=True)
    return [outs[i] for i in sorted(outs)], writes


class RefRunner:
    """Stands in for the runtime in nn.Graph tests: run(inputs, feeds) -> list[Tensor], and
    the assigns written into the variables' eager tensors at the end of the step."""

    def __init__(self, job):
        self.job = job
        self.calls = 0

    def run(self, inputs, feeds):
        self.calls += 1
        arrays = [t.detach().numpy() for t in inputs]
        outs, writes = run_job(self.job, arrays, feeds, seed=self.calls)
        with flow.no_grad():
            for name, value in writes.items():
                var = self.job.variables[name].tensor
                var.copy_(flow.tensor(value, dtype=var.dtype))
        return [flow.tensor(a) for a in outs]
