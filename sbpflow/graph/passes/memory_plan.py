"""Memory planning: tensors whose lifetimes do not overlap share memory.

Walking the final op order, each tensor that needs memory of its own gets a lifetime interval
[index of its producer, index of its last reader] (both ends inclusive: a kernel reads its
inputs while it writes its outputs).  Graph outputs, the loss and gradients the caller may read,
and the values that assigns write (the runtime may apply an assign late) live to the end.
Not planned (`mem` stays None): variables (they share the eager tensors'
memory), constants (they hold their own arrays), and outputs of view ops (they alias their
input, whose lifetime is stretched to the view's last use instead; views of views follow the
chain to the root).

Offsets in one memory block are placed best-fit, as OneFlow does, under two orderings
(largest first, longest-lived first); the smaller block wins.  Each placed tensor gets
`mem = (offset, nbytes)` with offsets aligned to `ALIGN` bytes.  `job.stats` reports
`mem_block_bytes` (the block), `peak_bytes` (the most bytes live at once: a lower bound for any
block), `naive_bytes` (every tensor in memory of its own) and `mem_plan_order` (the ordering
that won).  Sizes are per rank: a split axis holds its largest piece.
"""

from __future__ import annotations

import numpy as np

from ...ops import registry
from ...sbp import Split

ALIGN = 64


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _local_nbytes(t) -> int:
    """Bytes of the largest piece of tensor t a rank holds."""
    shape = list(t.shape)
    hierarchy = t.placement.hierarchy if t.placement is not None else ()
    for axis_size, s in zip(hierarchy, t.sbp, strict=False):
        if isinstance(s, Split) and axis_size > 1:
            shape[s.axis] = -(-shape[s.axis] // axis_size)
    n = t.dtype.itemsize
    for d in shape:
        n *= d
    return n


def _is_view(op_type: str) -> bool:
    try:
        return registry.get(op_type).view
    except KeyError:
        return False


def run(job) -> None:
    end = len(job.ops)
    alias: dict[str, str] = {}  # view output -> the tensor whose memory it uses
    start: dict[str, int] = {}
    last: dict[str, int] = {}
    unplanned: set[str] = set()
    for k, op in enumerate(job.ops):
        for i in op.inputs:
            root = alias.get(i, i)
            if root in start:
                last[root] = k
        if op.op_type in ("variable", "constant"):
            unplanned.update(op.outputs)
            continue
        view = _is_view(op.op_type) and op.inputs
        for n, o in enumerate(op.outputs):
            if view and n == 0:
                root = alias.get(op.inputs[0], op.inputs[0])
                alias[o] = root
                if root in start:
                    last[root] = k
                continue
            start[o] = k
            last[o] = k
    forever = {op.inputs[0] for op in job.ops if op.op_type == "output" and op.inputs}
    # The value an assign writes lives to the end too: the runtime may apply an assign after
    # later ops (e.g. after the last reader of the variable's old value).
    forever |= {op.inputs[1] for op in job.ops if op.op_type == "assign" and len(op.inputs) > 1}
    forever |= set(job.loss) | set(job.grads.values())
    for t in forever:
        root = alias.get(t, t)
        if root in start:
            last[root] = end

    names = list(start)
    for t in job.tensors.values():
        t.mem = None
    if not names:
        job.stats.update(mem_block_bytes=0, peak_bytes=0, naive_bytes=0)
        return
    nbytes = np.array([_local_nbytes(job.tensors[n]) for n in names], dtype=np.int64)
    size = (nbytes + ALIGN - 1) // ALIGN * ALIGN
    s = np.array([start[n] for n in names], dtype=np.int64)
    e = np.array([last[n] for n in names], dtype=np.int64)

    # Peak: live bytes over time (a tensor counts from its producer to its last reader).
    delta = np.zeros(end + 2, dtype=np.int64)
    np.add.at(delta, s, size)
    np.add.at(delta, e + 1, -size)
    peak = int(np.cumsum(delta).max())

    orders = {
        "size": np.lexsort((s, -size)),  # largest first, earlier first among equals
        "lifetime": np.lexsort((-size, s, -(e - s))),  # longest-lived first
    }
    best = None
    for label, order in orders.items():
        offsets, block = _best_fit(order, s, e, size)
        if best is None or block < best[1]:
            best = (offsets, block, label)
    offsets, block, label = best
    for k, n in enumerate(names):
        job.tensors[n].mem = (int(offsets[k]), int(nbytes[k]))
    job.stats.update(mem_block_bytes=int(block), peak_bytes=peak,
                     naive_bytes=int(size.sum()), mem_plan_order=label)


def _best_fit(order, s, e, size):
    """Place tensors in `order`: each goes into the smallest gap, among the tensors already
    placed whose lifetimes overlap its own, that fits it; else on top of them."""
    n = len(order)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    block = 0
    for k in order:
        sz = size[k]
        if sz == 0:
            placed[k] = True
            continue
        overlap = placed & (s <= e[k]) & (e >= s[k]) & (size > 0)
        idx = np.nonzero(overlap)[0]
        off = 0
        if len(idx):
            lo = offsets[idx]
            hi = lo + size[idx]
            o = np.argsort(lo, kind="stable")
            lo, hi = lo[o], hi[o]
            reach = np.maximum.accumulate(hi)  # highest end below each start, inclusive
            gap_start = np.concatenate(([0], reach[:-1]))
            gaps = lo - gap_start
            fits = np.nonzero(gaps >= sz)[0]
            if len(fits):
                g = fits[np.argmin(gaps[fits])]
                off = int(gap_start[g])
            else:
                off = int(reach[-1])
        offsets[k] = off
        placed[k] = True
        block = max(block, off + int(sz))
    return offsets, block
