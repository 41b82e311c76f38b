"""Memory planning: buffers that kernels really write, placed so that tensors whose lifetimes
do not overlap share memory.

What is planned.  Only a tensor whose producing kernel writes it into a buffer it is handed
(`out=`) gets an offset: the runtime's chain passes that kernel a view of the block at the
tensor's offset, and every other kernel allocates its own result, so an offset for its output
would be a fiction.  A producer writes its planned buffer when it has one output and
- its op type has a kernel resolver (`ir.KERNEL_RESOLVERS`) and is declared in
  `ir.OUT_WRITERS` (the fused elementwise kernels, the row kernels): the resolver's kernel is
  only known at link time, so its module declares it; or
- it is a registry op whose kernel has `accepts_out` and is not a view, except when its
  output is a value an assign writes and the kernel may write into its inputs
  (`out_may_alias_inputs`, the optimizer updates): the runtime may write such a value straight
  into its variable, so it is never given a block offset.
Not planned (`mem` stays None): the structural ops' tensors (inputs live in the input
register, variables share the eager tensors' memory, constants and feeds hold their own
arrays), outputs of view ops (they alias their input, whose lifetime is stretched to the
view's last use instead; views of views follow the chain to the root), outputs of kernels
that allocate their own (boxing nodes, multi-output ops, most registry ops), ops that do not
run on this rank (their outputs become empty constants there) and tensors of no bytes.

Sizes are this rank's.  The pass runs on the one logical Job, the same on every rank, but it
plans the memory of this rank (`comm.get_rank()`, or `rank=`): a global tensor takes the bytes
of this rank's piece (`sbp.layout.local_shape`, uneven splits included), a local tensor its
whole bytes.  So offsets and the block may differ between ranks, as each rank's Plan is its
own; the op order, and so every lifetime, is the same on all of them.

Lifetimes.  Walking the final op order, each planned tensor lives over [index of its producer,
index of its last reader] (both ends inclusive: a kernel reads its inputs while it writes its
outputs).  Graph outputs, the loss and gradients the caller may read, and the values that
assigns write (the runtime may apply an assign late) live to the end.

Placement (`place`).  Offsets in one memory block are placed by a sweep over time: tensors are
taken in order of their producer (the largest first among one op's outputs); before an op's
outputs are placed, the memory of every tensor whose last reader came earlier goes back to a
free list (free ranges keyed by both ends, so neighbours coalesce in O(1), and a list sorted
by size for best fit, searched with `bisect`); each tensor takes the smallest free range that
holds it, else grows the block from its top.  That is O(n log n) in the number of tensors
(bar the list moves of `bisect.insort`, which are memmoves).  The sweep runs forward and
backward in time (lifetimes overlap the same either way), each also with short-lived tensors
at the high end of their range; it stops at the first plan whose block equals the peak (no
plan can be smaller).  If none does and the Job is small (at most `BEST_FIT_MAX` planned
tensors), OneFlow's best fit over all tensors, largest first, is tried as well (it sees the
future, so it fragments less, but costs O(n^2)).  The smallest block wins.  Each placed tensor
gets `mem = (offset, nbytes)` with offsets aligned to `ALIGN` bytes.

Stats: `job.stats["memory"]`, one dict, each figure for this rank:
- `block_bytes`: the memory block the runtime allocates (the top of the highest planned
  buffer; the Plan's compute tasks carry the same figure as `mem_bytes`);
- `peak_bytes`: the most planned bytes live at once, a lower bound for any block;
- `naive_bytes`: the planned tensors each in an aligned buffer of its own;
- `unplanned_bytes`: the outputs of compute ops that are not in the block (their kernels
  allocate them, or an update writes them into its variable; views not counted);
- `order`: the placement that won (`sweep`, `sweep-reversed`, either with `-short-high`, or
  `size`; `none` when nothing is planned).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import numpy as np

from ... import comm
from ...ops import registry
from ...sbp import layout
from .. import ir

ALIGN = 64
# Best fit over all tensors (quadratic) is tried only up to this many planned tensors, and only
# when no sweep reaches the peak.
BEST_FIT_MAX = 256
# With `short_high`, tensors that live at most this many ops go to the high end of their range.
SHORT_LIFE = 8


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def local_nbytes(t: ir.LogicalTensor, rank: int) -> int:
    """Bytes of `rank`'s piece of tensor t (a local tensor: all of it), as the compiler lowers
    it (`compiler._piece_of`)."""
    shape = tuple(t.meta.shape)
    if t.is_global:
        shape = layout.local_shape(shape, t.placement, t.sbp, rank)
    return t.meta.dtype.itemsize * math.prod(shape)


def _is_view(op_type: str) -> bool:
    if op_type in ir.KERNEL_RESOLVERS:  # declared by the pass that makes them
        return op_type in ir.VIEW_OPS
    try:
        return registry.get(op_type).view
    except KeyError:
        return False


def writes_block(op: ir.OpNode, assigned: set[str]) -> bool:
    """Whether the runtime hands op's kernel a planned buffer that it writes its output into
    (`assigned`: the values assigns write; see the module docstring)."""
    if len(op.outputs) != 1 or op.op_type in ir.STRUCTURAL or op.op_type in ir.BOXING:
        return False
    if op.op_type in ir.KERNEL_RESOLVERS:  # the kernel is found at link time: declared
        return op.op_type in ir.OUT_WRITERS
    try:
        opdef = registry.get(op.op_type)
    except KeyError:
        return False
    kernel = opdef.kernel
    if opdef.view or not getattr(kernel, "accepts_out", False):
        return False
    # An update that may write its variable directly: the chain's choice, made at link time.
    return not (getattr(kernel, "out_may_alias_inputs", False) and op.outputs[0] in assigned)


def _elsewhere(job: ir.Job, op: ir.OpNode, rank: int) -> bool:
    """Whether op computes only tensors whose placement leaves this rank out (the compiler
    turns them into empty constants there; a boxing node always runs)."""
    if op.op_type in ir.BOXING or not op.outputs:
        return False
    return all(job.tensors[o].is_global and not job.tensors[o].placement.has(rank)
               for o in op.outputs)


def run(job: ir.Job, rank: int | None = None,
        writes: Callable[[ir.OpNode], bool] | None = None) -> None:
    """Plan this rank's memory block (`rank`: default `comm.get_rank()`).  `writes(op)`:
    whether op's outputs go into the block (default: `writes_block`, what the runtime does;
    tests of the placement alone may plan every op)."""
    rank = comm.get_rank() if rank is None else rank
    assigned = {op.inputs[1] for op in job.ops if op.op_type == "assign" and len(op.inputs) > 1}
    if writes is None:
        def writes(op):
            return writes_block(op, assigned)
    end = len(job.ops)
    alias: dict[str, str] = {}  # view output -> the tensor whose memory it uses
    start: dict[str, int] = {}
    last: dict[str, int] = {}
    nbytes_of: dict[str, int] = {}
    unplanned = 0
    for k, op in enumerate(job.ops):
        for i in op.inputs:
            root = alias.get(i, i)
            if root in start:
                last[root] = k
        if op.op_type in ir.STRUCTURAL:
            continue
        if op.inputs and _is_view(op.op_type):
            root = alias.get(op.inputs[0], op.inputs[0])
            for o in op.outputs:
                alias[o] = root
            continue
        if _elsewhere(job, op, rank):
            continue
        planned = writes(op)
        for o in op.outputs:
            n = local_nbytes(job.tensors[o], rank)
            if planned and n:
                start[o] = last[o] = k
                nbytes_of[o] = n
            else:
                unplanned += n
    forever = {op.inputs[0] for op in job.ops if op.op_type == "output" and op.inputs}
    # The value an assign writes lives to the end too: the runtime may apply an assign after
    # later ops (e.g. after the last reader of the variable's old value).
    forever |= assigned
    forever |= set(job.loss) | set(job.grads.values())
    for t in forever:
        root = alias.get(t, t)
        if root in start:
            last[root] = end

    for t in job.tensors.values():
        t.mem = None
    names = list(start)
    nbytes = np.array([nbytes_of[n] for n in names], dtype=np.int64)
    s = np.array([start[n] for n in names], dtype=np.int64)
    e = np.array([last[n] for n in names], dtype=np.int64)
    offsets, stats = place(s, e, nbytes, end)
    for k, n in enumerate(names):
        job.tensors[n].mem = (int(offsets[k]), int(nbytes[k]))
    order = stats.pop("order")
    job.stats["memory"] = {**stats, "unplanned_bytes": int(unplanned), "order": order}


def place(s, e, nbytes, end: int | None = None) -> tuple[np.ndarray, dict]:
    """Offsets for buffers of `nbytes` that live over [s, e] (op indices, both ends
    inclusive; `end`: the last index, default max(e)).  Returns (offsets, stats) with the
    stats `block_bytes`, `peak_bytes`, `naive_bytes` and `order` of the module docstring."""
    s = np.asarray(s, dtype=np.int64)
    e = np.asarray(e, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.int64)
    if not len(s):
        return np.zeros(0, dtype=np.int64), {"block_bytes": 0, "peak_bytes": 0,
                                              "naive_bytes": 0, "order": "none"}
    end = int(e.max()) if end is None else end
    size = (nbytes + ALIGN - 1) // ALIGN * ALIGN

    def live_peak(b):  # the most bytes live at once (from producer to last reader)
        delta = np.zeros(end + 2, dtype=np.int64)
        np.add.at(delta, s, b)
        np.add.at(delta, e + 1, -b)
        return int(np.cumsum(delta).max())

    peak = live_peak(size)  # no aligned placement can be smaller: the sweeps stop there
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
    if best[1] > peak and len(s) <= BEST_FIT_MAX:
        offsets, block = _best_fit(np.lexsort((s, -size)), s, e, size)
        if block < best[1]:
            best = (offsets, block, "size")
    offsets, _, label = best
    # The block the runtime allocates ends at the top of the highest buffer (no padding after
    # it); live buffers are disjoint ranges below that top, so it is at least the live peak.
    return offsets, {"block_bytes": int((offsets + nbytes).max()),
                     "peak_bytes": live_peak(nbytes), "naive_bytes": int(size.sum()),
                     "order": label}


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
