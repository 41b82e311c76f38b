"""Reshapes that can be views: a `reshape` op always copies (eager picks it only when strides
forbid a view, and gradients use it on whatever layout they get), but in a compiled Job every
output of a compute op that is not a view is C-contiguous (the runtime makes it so, as the
eager VM does), and a contiguous array takes any shape as a view.  So a reshape of such an
output becomes a `view` op: no copy, and memory planning sees the alias (the view's reads
stretch its input's lifetime).  Inputs, variables, constants, feeds and views keep their
reshape (their layout is not known here).
"""

from __future__ import annotations

from ...ops import registry
from ..ir import KERNEL_RESOLVERS

_UNKNOWN_LAYOUT = ("input", "variable", "constant", "feed")


def _contiguous_producer(op) -> bool:
    if op.op_type in _UNKNOWN_LAYOUT:
        return False
    if op.op_type in KERNEL_RESOLVERS:  # fused kernels write C-contiguous outputs
        return True
    opdef = registry._REGISTRY.get(op.op_type)
    return opdef is not None and not opdef.view


def run(job) -> None:
    producer = {o: op for op in job.ops for o in op.outputs}
    n = 0
    for op in job.ops:
        if op.op_type != "reshape" or not op.inputs:
            continue
        src = producer.get(op.inputs[0])
        if src is not None and _contiguous_producer(src):
            op.op_type = "view"
            n += 1
    job.stats["reshape_views"] = job.stats.get("reshape_views", 0) + n
