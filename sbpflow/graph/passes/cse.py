"""Common-subexpression elimination: ops with the same type, inputs and attrs compute the same
value once.

Never merged: random ops (two draws differ), ops with no outputs (effects), and the structural
ops `input`, `variable`, `feed`, `assign`, `output`; `constant` ops merge when their values
are equal (same dtype, shape and bytes).  Attr values are compared with their types, so 1, 1.0
and True differ (they promote differently) and so do 0.0 and -0.0; NaN equals NaN.

A variable's tensor changes value at its `assign`: two reads of a variable on either side of an
assign are different values.  So the key of an op that (transitively) reads an assigned
variable also carries how many assigns ran before it.

Readers of a merged op are renamed to the kept op's outputs in one sweep (what
`job.replace_uses` does for one name, done for all names at once so the pass stays linear).
"""

from __future__ import annotations

import numpy as np

from ...ops import registry

_NEVER = ("input", "variable", "feed", "assign", "output")


def _freeze(v):
    """A hashable, type-exact form of an attr value."""
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((repr(k), _freeze(x)) for k, x in v.items())))
    if isinstance(v, float):
        return ("float", repr(v))  # repr tells -0.0 from 0.0; nan == nan here
    if isinstance(v, (np.generic,)):
        return (type(v).__name__, repr(v.item()))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))  # unhashable and unknown: never equal to another op's
    return (type(v).__name__, v)


def _mergeable(op) -> bool:
    if not op.outputs or op.op_type in _NEVER:
        return False
    if op.op_type == "constant":
        return True
    try:
        opdef = registry.get(op.op_type)
    except KeyError:
        return True  # a resolver op (e.g. fused_elementwise): deterministic
    return not opdef.random


def run(job) -> None:
    assigned = {op.inputs[0] for op in job.ops if op.op_type == "assign" and op.inputs}
    var_dependent: set[str] = set(assigned)  # tensors whose value depends on assigned vars
    rename: dict[str, str] = {}
    seen: dict = {}
    removed = []
    n_assigns = 0
    for op in job.ops:
        if rename:
            op.inputs = tuple(rename.get(i, i) for i in op.inputs)
        if op.op_type == "assign":
            n_assigns += 1
            continue
        depends = any(i in var_dependent for i in op.inputs)
        if depends:
            var_dependent.update(op.outputs)
        if not _mergeable(op):
            continue
        outs = tuple((job.tensors[o].meta, job.tensors[o].placement, job.tensors[o].sbp)
                     for o in op.outputs)
        key = (op.op_type, op.inputs, _freeze(op.attrs), outs, n_assigns if depends else -1)
        try:
            kept = seen.get(key)
        except TypeError:  # an unhashable placement or sbp: leave the op alone
            continue
        if kept is None:
            seen[key] = op
            continue
        for old, new in zip(op.outputs, kept.outputs, strict=True):
            rename[old] = new
            if old in var_dependent:
                var_dependent.add(new)
        removed.append(op.name)
    if removed:
        job.loss = [rename.get(x, x) for x in job.loss]
        job.grads = {k: rename.get(v, v) for k, v in job.grads.items()}
        job.remove_ops(removed)
    job.stats["cse_merged"] = job.stats.get("cse_merged", 0) + len(removed)
