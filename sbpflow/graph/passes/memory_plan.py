"""Memory planning: tensors whose lifetimes do not overlap share memory.

Walking the final op order, each tensor that needs memory of its own gets a lifetime interval
[index of its producer, index of its last reader] (both ends inclusive: a kernel reads its
inputs while it writes its outputs).  Graph outputs, the loss and gradients the caller may read,
and the values that assigns write (the runtime may apply an assign late) live to the end.
Not planned (`mem` stays None): variables (they share the eager tensors'
memory), constants (they hold their own arrays), and outputs of view ops (they alias their
input, whose lifetime is stretched to the view's last use instead; views of views follow the
chain to the root).

Offsets in one memory block are placed by a sweep over time: tensors are taken in order of
their producer (the largest first among one op's outputs); before an op's outputs are placed,
the memory of every tensor whose last reader came earlier goes back to a free list (free ranges
keyed by both ends, so neighbours coalesce in O(1), and a list sorted by size for best fit,
searched with `bisect`); each tensor takes the smallest free range that holds it, else grows
the block from its top.  That is O(n log n) in the number of tensors (bar the list moves of
`bisect.insort`, which are memmoves).  The sweep runs forward and backward in time (lifetimes
overlap the same either way), each also with short-lived tensors at the high end of their
range; it stops at the first plan whose block equals the peak (no plan can be smaller).  If
none does and the Job is small (at most `BEST_FIT_MAX` planned tensors), OneFlow's best fit
over all tensors, largest first, is tried as well (it sees the future, so it fragments less,
but costs O(n^2)).  The smallest block wins.  Each placed tensor gets
`mem = (offset, nbytes)` with offsets aligned to `ALIGN` bytes.  `job.stats` reports
`mem_block_bytes` (the block), `peak_bytes` (the most bytes live at once: a lower bound for any
block), `naive_bytes` (every tensor in memory of its own) and `mem_plan_order` (the placement
that won: `sweep`, `sweep-reversed`, either with `-short-high`, or `size`).  Sizes are per
rank: a split axis holds its largest piece.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from ...ops import registry
from ...sbp import Split

ALIGN = 64
# Best fit over all tensors (quadratic) is tried only up to this many planned tensors, and only
# when no sweep reaches the peak.
BEST_FIT_MAX = 256
# With `short_high`, tensors that live at most this many ops go to the high end of their range.
SHORT_LIFE = 8


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _local_nbytes(t) -> int:
    """Bytes of the largest piece of tensor t a rank holds."""
    shape = t.meta.shape
    if any(isinstance(s, Split) for s in t.sbp):
        shape = list(shape)
        hierarchy = t.placement.hierarchy if t.placement is not None else ()
        for axis_size, s in zip(hierarchy, t.sbp, strict=False):
            if isinstance(s, Split) and axis_size > 1:
                shape[s.axis] = -(-shape[s.axis] // axis_size)
    return t.meta.dtype.itemsize * math.prod(shape)


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

    best = None
    for label, (s_, e_) in (("sweep", (s, e)), ("sweep-reversed", (end - e, end - s))):
        for short_high in (False, True):
            offsets, block = _sweep(s_, e_, size, short_high)
            if best is None or block < best[1]:
                best = (offsets, block, label + ("-short-high" if short_high else ""))
            if best[1] <= peak:
                break
        if best[1] <= peak:
            break
    if best[1] > peak and len(names) <= BEST_FIT_MAX:
        offsets, block = _best_fit(np.lexsort((s, -size)), s, e, size)
        if block < best[1]:
            best = (offsets, block, "size")
    offsets, block, label = best
    for k, n in enumerate(names):
        job.tensors[n].mem = (int(offsets[k]), int(nbytes[k]))
    job.stats.update(mem_block_bytes=int(block), peak_bytes=peak,
                     naive_bytes=int(size.sum()), mem_plan_order=label)


def _sweep(s, e, size, short_high=False):
    """Place tensors in order of start (ends inclusive): free what died before, then best fit
    among the free ranges, else on top.  Returns (offsets, block)."""
    n = len(s)
    offsets = [0] * n
    starts, ends, sizes = s.tolist(), e.tolist(), size.tolist()
    order = np.lexsort((-size, s)).tolist()
    by_end = np.argsort(e, kind="stable").tolist()
    free_end: dict[int, int] = {}  # free range start -> its end
    free_start: dict[int, int] = {}  # free range end -> its start
    by_size: list[tuple[int, int]] = []  # (length, start) of every free range, sorted
    insort, bisect_left = bisect.insort, bisect.bisect_left

    def take(a, b):
        del free_end[a], free_start[b]
        del by_size[bisect_left(by_size, (b - a, a))]

    def give(a, b):
        free_end[a] = b
        free_start[b] = a
        insort(by_size, (b - a, a))

    block = 0
    j = 0
    for k in order:
        t = starts[k]
        while j < n and ends[by_end[j]] < t:  # memory of tensors dead before t goes back
            i = by_end[j]
            j += 1
            if sizes[i]:
                a, b = offsets[i], offsets[i] + sizes[i]
                if b in free_end:
                    nb = free_end[b]
                    take(b, nb)
                    b = nb
                if a in free_start:
                    na = free_start[a]
                    take(na, a)
                    a = na
                give(a, b)
        sz = sizes[k]
        if not sz:
            continue
        g = bisect_left(by_size, (sz, -1))
        if g < len(by_size):  # the smallest free range that fits
            length, a = by_size[g]
            b = a + length
            take(a, b)
            if short_high and ends[k] - t <= SHORT_LIFE:
                off = b - sz
                if length > sz:
                    give(a, off)
            else:
                off = a
                if length > sz:
                    give(a + sz, b)
        elif block in free_start:  # the free range at the top grows
            off = free_start[block]
            take(off, block)
            block = off + sz
        else:
            off = block
            block += sz
        offsets[k] = off
    return np.array(offsets, dtype=np.int64), block


def _best_fit(order, s, e, size):
    """Place tensors in `order`: each goes into the smallest gap, among the tensors already
    placed whose lifetimes overlap its own, that fits it; else on top of them."""
    n = len(order)
    offsets = np.zeros(n, dtype=np.int64)
    block = 0
    order = np.asarray(order)
    so, eo, zo = s[order], e[order], size[order]  # in placing order: placed = a prefix
    off_o = np.zeros(n, dtype=np.int64)
    for p in range(n):
        sz = zo[p]
        if sz == 0:
            continue
        idx = np.nonzero((so[:p] <= eo[p]) & (eo[:p] >= so[p]) & (zo[:p] > 0))[0]
        off = 0
        if len(idx):
            lo = off_o[idx]
            hi = lo + zo[idx]
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
        off_o[p] = off
        block = max(block, off + int(sz))
    offsets[order] = off_o
    return offsets, block
