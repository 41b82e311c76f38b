"""Constant folding: an op whose inputs are all `constant` ops is evaluated once, now, with its
OpDef kernel on the CPU, and becomes `constant` ops holding the results (one per output, each
keeping the output's tensor name, so readers need no rewiring).  Creation ops with no inputs
(`full`, `arange`, ...) fold too.

Not folded: random ops (each call draws anew), structural ops (a `variable` is state that
changes between calls, an `input`/`feed` changes per call), ops that are not registered
OpDefs, ops with no outputs, results larger than `job.config["constant_fold_max_bytes"]`
(default 1 MiB: a folded constant lives as long as the plan and is serialised with the Job),
and ops whose kernel raises here: those keep their op, so the error surfaces when the graph
runs, naming the user's line.

Constants hold logical values; the inputs of a folded op that nothing else reads are left to
dead-code elimination.
"""

from __future__ import annotations

import numpy as np

from ...device import Device
from ...ops import registry
from ...ops.registry import KernelContext
from ..ir import STRUCTURAL, OpNode

_MAX_BYTES = 1 << 20


def _foldable(op, job, constants: dict) -> registry.OpDef | None:
    if op.op_type in STRUCTURAL or not op.outputs:
        return None
    try:
        opdef = registry.get(op.op_type)
    except KeyError:
        return None
    if opdef.random or not all(i in constants for i in op.inputs):
        return None
    limit = job.config.get("constant_fold_max_bytes", _MAX_BYTES)
    nbytes = sum(job.tensors[o].meta.numel * job.tensors[o].dtype.itemsize for o in op.outputs)
    return opdef if nbytes <= limit else None


def _evaluate(opdef, op, job, constants, prims):
    in_metas = tuple(job.tensors[i].meta for i in op.inputs)
    out_metas = tuple(job.tensors[o].meta for o in op.outputs)
    ctx = KernelContext(prims, op.op_type, in_metas, out_metas)
    arrays = [constants[i] for i in op.inputs]
    if opdef.variadic:
        res = opdef.kernel(ctx, arrays, **op.attrs)
    else:
        res = opdef.kernel(ctx, *arrays, **op.attrs)
    if len(op.outputs) == 1:
        res = (res,)
    values = []
    for arr, meta in zip(res, out_metas, strict=True):
        # A fresh, C-contiguous array of exactly the inferred meta (a view op's result would
        # alias its input constant), read-only so no kernel can change a constant.
        v = np.array(prims.to_host(arr), dtype=meta.dtype.np, order="C", copy=True)
        if v.shape != meta.shape:
            raise ValueError(f"{op.op_type} gave shape {v.shape}, inferred {meta.shape}")
        v.flags.writeable = False
        values.append(v)
    return values


def run(job) -> None:
    prims = Device("cpu").prims
    constants: dict[str, np.ndarray] = {}
    new_ops: list[OpNode] = []
    folded = 0
    for op in job.ops:
        if op.op_type == "constant":
            constants[op.outputs[0]] = op.attrs["value"]
            new_ops.append(op)
            continue
        opdef = _foldable(op, job, constants)
        values = None
        if opdef is not None:
            try:
                values = _evaluate(opdef, op, job, constants, prims)
            except Exception:  # noqa: BLE001 - left for the runtime to raise at the user's line
                values = None
        if values is None:
            new_ops.append(op)
            continue
        folded += 1
        for k, (o, v) in enumerate(zip(op.outputs, values, strict=True)):
            name = op.name if len(op.outputs) == 1 else f"{op.name}.{k}"
            node = OpNode(name, "constant", (), (o,), {"value": v}, op.scope, op.loc)
            job.tensors[o].producer = name
            constants[o] = v
            new_ops.append(node)
    job.ops = new_ops
    job.stats["constants_folded"] = job.stats.get("constants_folded", 0) + folded
