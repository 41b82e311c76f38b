"""Boxing: turn a global tensor's piece under one (placement, nd-SBP) into its piece under another.

OneFlow's boxing. A transition is routed once per (logical meta, source, destination) and the
route (`BoxingRoute`) is cached; running it is the collectives plus at most a copy or two.

How a route is found:

- Same placement: one grid axis at a time. Each axis whose SBP differs changes once, by the
  1-D rule of `_RULES` (a table from (source kind, target kind) to a named step), inside the
  groups of ranks along that axis (`placement.axis_ranks`). The order of the axes is the
  cheapest valid one; the states in between are the middle states. A 1-D placement is the
  case of a single axis.
- An axis step is valid only where no later grid axis splits the tensor axis it splits or
  gathers: splitting is nested, so a later axis's cut would be taken from a different whole.
  Where no order is valid, or the placements differ, the general path runs: reduce P away
  inside the source placement (a middle state without P), then every destination rank
  receives the slices it needs from source ranks whose pieces intersect it (point to point,
  or a local copy); for a P destination one rank per P group holds the data, the others zeros.

Cost model (OneFlow's; T = logical bytes of the block an axis step works on, n = ranks in a
group): same 0; B->S 1; S(i)->S(j) T(n-1)/n; P->S and S->B T(n-1); P->B 2T(n-1); anything->P
T*n*10, so a signature that wants a P input loses unless the input already is P. The general
path costs the bytes it actually moves. An nd route costs the sum over its steps, each axis step
counted once per group.

Results and scratch buffers come from the device's caching allocator, so a large piece reuses a
buffer the VM handed back instead of faulting in fresh pages on every call.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Callable, NamedTuple

import numpy as np

from .._core.meta import TensorMeta
from ..device import primitives as _primitives
from .layout import balanced_bounds, check_split_axes, local_shape, normalize_sbp, piece
from .placement import Placement
from .sbp import B, Broadcast, P, Sbp, Split

# Point-to-point tags of the general path (redistribution), apart from other traffic.  Eager
# mode runs one route at a time per rank, in program order: one tag.  A compiled graph's
# boxing tasks tag their messages per (register, piece) (`graph_tag`), so a message can only
# match the receive of its own task and job instance, however the tasks overlap.
_TAG = 0xB0
_GRAPH_TAGS = (0x100, 32767)  # [first, last]: 32767 is the least MPI_TAG_UB MPI allows
PIECE_TAGS = 64  # job instances told apart (a register has at most 2 in flight)


def graph_tag(register: int, piece: int) -> int:
    """The tag of the messages a graph's boxing task sends for job instance `piece`, its
    output register being `register` (ids are the Plan's, the same on every rank)."""
    first, last = _GRAPH_TAGS
    return first + (register * PIECE_TAGS + piece % PIECE_TAGS) % (last - first + 1)
_P_PENALTY = 10  # anything -> P costs T * n * this


# -- small helpers ----------------------------------------------------------------------------
def _kind(x: Sbp) -> str:
    return "S" if isinstance(x, Split) else "B" if isinstance(x, Broadcast) else "P"


def _fmt(nd_sbp) -> str:
    return repr(nd_sbp[0]) if len(nd_sbp) == 1 else "(" + ", ".join(map(repr, nd_sbp)) + ")"


def _fmt_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1024
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _np_dtype(dtype) -> np.dtype:
    return dtype.np if hasattr(dtype, "np") else np.dtype(dtype)


def _index(slices) -> tuple:
    # A 0-d array indexed by () gives a scalar, not a view: use `...` for it.
    return tuple(slices) if slices else (Ellipsis,)


class _Slab(NamedTuple):
    start: int  # offsets into the flat buffer that holds the slabs one after another
    stop: int
    shape: tuple
    index: tuple  # the slab inside the full array


def _slabs(shape: tuple, axis: int, parts: int) -> tuple[_Slab, ...]:
    """The balanced slabs of an array of `shape` along `axis`, laid end to end."""
    out, offset = [], 0
    for lo, hi in balanced_bounds(shape[axis], parts):
        slab_shape = shape[:axis] + (hi - lo,) + shape[axis + 1:]
        count = math.prod(slab_shape)
        out.append(_Slab(offset, offset + count, slab_shape,
                         (slice(None),) * axis + (slice(lo, hi),)))
        offset += count
    return tuple(out)


def _leading(shape: tuple, axis: int) -> bool:
    """True when the slabs along `axis` already lie end to end in C order (no packing)."""
    return math.prod(shape[:axis]) == 1


class _Memory:
    """Where pieces and scratch buffers come from: the device's caching allocator, so a large
    piece reuses a freed buffer (the VM hands buffers back when a tensor dies) instead of
    faulting in fresh pages on every boxing."""

    __slots__ = ("empty", "_free_last")

    def __init__(self, device_type: str):
        allocator = getattr(_primitives(device_type), "allocator", None)
        self.empty = allocator.empty if allocator is not None else np.empty
        self._free_last = allocator.free_last if allocator is not None else None

    def zeros(self, shape, dtype) -> np.ndarray:
        out = self.empty(shape, dtype)
        out.fill(0)
        return out

    def copy(self, x: np.ndarray) -> np.ndarray:
        out = self.empty(x.shape, x.dtype)
        np.copyto(out, x)
        return out

    def release(self, holder: list) -> None:
        """Give back the scratch buffers in `holder` (the caller keeps no other reference;
        the allocator checks the reference count and keeps a buffer still in use)."""
        while holder and self._free_last is not None:
            self._free_last(holder)  # pops the array from the list; no reference remains


def _pack(x: np.ndarray, slabs, mem: _Memory) -> np.ndarray:
    buf = mem.empty((slabs[-1].stop,), x.dtype)
    for s in slabs:
        if s.stop > s.start:
            np.copyto(buf[s.start:s.stop].reshape(s.shape), x[s.index])
    return buf


def _unpack(buf: np.ndarray, slabs, out: np.ndarray) -> None:
    for s in slabs:
        if s.stop > s.start:
            out[s.index] = buf[s.start:s.stop].reshape(s.shape)


# -- the 1-D rules: a table from (source kind, target kind) to a step ---------------------
class _Ctx(NamedTuple):
    """What one rank's axis step needs: its group, position, and the block it works on."""

    group: object  # the Communicator of the ranks along the grid axis (None if not needed)
    n: int  # ranks in the group
    c: int  # this rank's position in it
    block: tuple  # shape of the part of the logical tensor the group shares
    src: Sbp
    dst: Sbp
    dtype: np.dtype
    mem: _Memory


def _make_copy(cx: _Ctx):
    # Same SBP, or a group of one rank: every piece already is the target piece.
    return cx.mem.copy


def _make_all_reduce(cx: _Ctx):
    g, shape, dtype, empty = cx.group, cx.block, cx.dtype, cx.mem.empty

    def all_reduce(x):
        return g.all_reduce(x, out=empty(shape, dtype))

    return all_reduce


def _make_reduce_scatter(cx: _Ctx):
    g, dtype, mem = cx.group, cx.dtype, cx.mem
    axis = cx.dst.axis
    slabs = _slabs(cx.block, axis, cx.n)
    counts = [s.stop - s.start for s in slabs]
    out_shape = slabs[cx.c].shape
    direct = _leading(cx.block, axis)

    def reduce_scatter(x):
        out = mem.empty(out_shape, dtype)
        if direct:
            g.reduce_scatter(x.reshape(-1), sizes=counts, out=out.reshape(-1))
        else:
            scratch = [_pack(x, slabs, mem)]  # slab r along axis i, end to end, to rank r
            g.reduce_scatter(scratch[0], sizes=counts, out=out.reshape(-1))
            mem.release(scratch)
        return out

    return reduce_scatter


def _make_all_gather(cx: _Ctx):
    g, dtype, shape, mem = cx.group, cx.dtype, cx.block, cx.mem
    slabs = _slabs(shape, cx.src.axis, cx.n)
    counts = [s.stop - s.start for s in slabs]
    direct = _leading(shape, cx.src.axis)

    def all_gather(x):
        out = mem.empty(shape, dtype)
        if direct:
            g.all_gather(x.reshape(-1), sizes=counts, out=out.reshape(-1))
        else:
            # Rank r's slab arrives as a block; each block goes to its place along axis i.
            scratch = [mem.empty((slabs[-1].stop,), dtype)]
            g.all_gather(x.reshape(-1), sizes=counts, out=scratch[0])
            _unpack(scratch[0], slabs, out)
            mem.release(scratch)
        return out

    return all_gather


def _make_all_to_all(cx: _Ctx):
    g, dtype, n, c, mem = cx.group, cx.dtype, cx.n, cx.c, cx.mem
    i, j = cx.src.axis, cx.dst.axis
    mine = _slabs(cx.block, i, n)[c].shape  # this rank's piece: slab c along i
    send_slabs = _slabs(mine, j, n)  # slab r along j goes to rank r
    out_shape = _slabs(cx.block, j, n)[c].shape
    recv_slabs = _slabs(out_shape, i, n)  # rank r's slab along j arrives as slab r along i
    send_counts = [s.stop - s.start for s in send_slabs]
    recv_counts = [s.stop - s.start for s in recv_slabs]
    send_direct, recv_direct = _leading(mine, j), _leading(out_shape, i)
    total = recv_slabs[-1].stop

    def all_to_all(x):
        out = mem.empty(out_shape, dtype)
        # Scratch buffers, held only by these lists so that they can be given back.
        packed = [] if send_direct else [_pack(x, send_slabs, mem)]
        arrived = [] if recv_direct else [mem.empty((total,), dtype)]
        g.all_to_all(packed[0] if packed else x.reshape(-1), send_counts, recv_counts,
                     out=arrived[0] if arrived else out.reshape(-1))
        if arrived:
            _unpack(arrived[0], recv_slabs, out)
            mem.release(arrived)
        if packed:
            mem.release(packed)
        return out

    return all_to_all


def _make_slice(cx: _Ctx):
    index = _slabs(cx.block, cx.dst.axis, cx.n)[cx.c].index
    copy = cx.mem.copy
    return lambda x: copy(x[index])


def _make_keep_on_first(cx: _Ctx):
    if cx.c == 0:
        return cx.mem.copy
    shape, dtype, zeros = cx.block, cx.dtype, cx.mem.zeros
    return lambda x: zeros(shape, dtype)


def _make_pad_with_zeros(cx: _Ctx):
    shape, dtype, zeros = cx.block, cx.dtype, cx.mem.zeros
    index = _slabs(shape, cx.src.axis, cx.n)[cx.c].index

    def pad_with_zeros(x):
        out = zeros(shape, dtype)
        out[index] = x
        return out

    return pad_with_zeros


class _Rule(NamedTuple):
    name: str
    make: Callable  # _Ctx -> (piece -> new piece), built once per rank
    cost: Callable  # (block bytes T, ranks n) -> cost
    communicates: bool
    local: str  # how `describe` words it: "over" a collective's ranks, "on" a local step's


_COPY = _Rule("copy", _make_copy, lambda t, n: 0.0, False, "on")
_RULES = {
    # P -> B: every rank needs the whole sum.
    ("P", "B"): _Rule("all_reduce", _make_all_reduce, lambda t, n: 2.0 * t * (n - 1), True,
                      "over"),
    # P -> S(i): each rank needs the sum of its own slab only.
    ("P", "S"): _Rule("reduce_scatter", _make_reduce_scatter, lambda t, n: t * (n - 1), True,
                      "over"),
    # S(i) -> B: every rank needs every rank's slab.
    ("S", "B"): _Rule("all_gather", _make_all_gather, lambda t, n: t * (n - 1), True, "over"),
    # S(i) -> S(j): each rank keeps 1/n of its slab and trades the rest, one block per peer.
    ("S", "S"): _Rule("all_to_all", _make_all_to_all, lambda t, n: t * (n - 1) / n, True,
                      "over"),
    # B -> S(i): every rank already holds its slab; cut it out (tiny cost, not free).
    ("B", "S"): _Rule("slice", _make_slice, lambda t, n: 1.0, False, "on"),
    # B -> P: rank 0's copy is the sum once the others hold zeros.
    ("B", "P"): _Rule("keep_on_first", _make_keep_on_first,
                      lambda t, n: t * n * _P_PENALTY, False, "on"),
    # S(i) -> P: the sum of the slabs each padded with zeros is the whole.
    ("S", "P"): _Rule("pad_with_zeros", _make_pad_with_zeros,
                      lambda t, n: t * n * _P_PENALTY, False, "on"),
    # Same -> same: nothing changes; the step is the fresh copy the caller is promised.
    ("B", "B"): _COPY,
    ("P", "P"): _COPY,
}


def _rule(src: Sbp, dst: Sbp, n: int) -> _Rule:
    if src == dst or n == 1:  # one rank per group: its piece is the block under any SBP
        return _COPY
    return _RULES[_kind(src), _kind(dst)]


# -- routes: the abstract steps, shared by cost() and route() -------------------------------
class _AxisMove(NamedTuple):
    """Change grid axis `axis` of `before` to `after[axis]` inside the groups along it."""

    placement: Placement
    before: tuple
    after: tuple
    axis: int
    rule: _Rule
    block_bytes: float  # bytes of the block one group works on
    cost: float


class _Transfer(NamedTuple):
    src: int
    dst: int
    box: tuple  # ((lo, hi), ...) of the logical tensor


class _Redistribute(NamedTuple):
    """The general path's second half: point-to-point slices from src pieces to dst pieces."""

    src: Placement
    src_sbp: tuple  # holds no P
    dst: Placement
    dst_sbp: tuple
    transfers: tuple[_Transfer, ...]  # in one global order, the same on every rank
    moved_bytes: float
    cost: float


def _block_bytes(shape, placement: Placement, state, axis: int, itemsize: int) -> float:
    # The block a group along `axis` shares: the tensor cut by every other split axis.
    parts = math.prod(placement.hierarchy[j] for j, x in enumerate(state)
                      if j != axis and isinstance(x, Split))
    return math.prod(shape) * itemsize / parts


def _axis_move(meta, placement, state, axis, target) -> _AxisMove:
    after = state[:axis] + (target,) + state[axis + 1:]
    n = placement.hierarchy[axis]
    rule = _rule(state[axis], target, n)
    t = _block_bytes(meta.shape, placement, state, axis, _np_dtype(meta.dtype).itemsize)
    groups = placement.size // n
    return _AxisMove(placement, state, after, axis, rule, t, rule.cost(t, n) * groups)


def _axis_step_valid(state, axis: int, target: Sbp) -> bool:
    # Nested splitting: a later grid axis that cuts the tensor axis this step splits or
    # gathers would take its cut from a different whole before and after the step.
    moved = [x.axis for x in (state[axis], target) if isinstance(x, Split)]
    return not any(isinstance(x, Split) and x.axis in moved for x in state[axis + 1:])


def _axis_route(meta, placement, src, dst):
    """The cheapest valid order of one step per differing axis, or None."""
    differing = [k for k in reversed(range(len(src))) if src[k] != dst[k]]
    best = None
    for order in itertools.permutations(differing):  # inner axes first on ties
        state, moves = src, []
        for k in order:
            if not _axis_step_valid(state, k, dst[k]):
                break
            moves.append(_axis_move(meta, placement, state, k, dst[k]))
            state = moves[-1].after
        else:
            total = sum(m.cost for m in moves)
            if best is None or total < best[0]:
                best = (total, tuple(moves))
    return None if best is None else best[1]


def _without_partial(shape, nd_sbp) -> tuple:
    """A middle state with every P reduced away: split a tensor axis no later grid axis splits
    (a reduce-scatter moves half an all-reduce's bytes), or broadcast a 0-d tensor."""
    mid = list(nd_sbp)
    for k in reversed(range(len(mid))):
        if mid[k] == P:
            taken = [x.axis for x in mid[k + 1:] if isinstance(x, Split)]
            free = [a for a in range(len(shape)) if a not in taken]
            # The longest free axis, so the pieces are as even as they can be.
            mid[k] = Split(max(free, key=lambda a: (shape[a], -a))) if free else B
    return tuple(mid)


def _boxes(shape, placement: Placement, nd_sbp):
    return {r: tuple((s.start, s.stop) for s in piece(shape, placement, nd_sbp, r))
            for r in placement.rank_list}


def _holds_data(placement: Placement, nd_sbp, rank: int) -> bool:
    # A P destination: the rank at coordinate 0 of every P axis holds the data, others zeros.
    coords = placement.coords(rank)
    return all(coords[k] == 0 for k, x in enumerate(nd_sbp) if x == P)


def _redistribute(meta, sp, ss, dp, ds) -> _Redistribute:
    shape = meta.shape
    itemsize = _np_dtype(meta.dtype).itemsize
    src_boxes = _boxes(shape, sp, ss)
    # Source ranks holding the same box (B axes) form one class; any of them can send it.
    classes: dict[tuple, list[int]] = {}
    for r in sp.rank_list:
        classes.setdefault(src_boxes[r], []).append(r)
    picks = {box: 0 for box in classes}
    transfers, moved = [], 0.0
    for d in dp.rank_list:
        if not _holds_data(dp, ds, d):
            continue
        want = tuple((s.start, s.stop) for s in piece(shape, dp, ds, d))
        for box, holders in classes.items():
            inter = tuple((max(a, c), min(b, e)) for (a, b), (c, e) in zip(want, box))
            if any(hi <= lo for lo, hi in inter):
                continue
            if d in holders:
                src = d  # it holds the slice already: a local copy
            else:
                src = holders[picks[box] % len(holders)]  # spread the sends over holders
                picks[box] += 1
                moved += math.prod(hi - lo for lo, hi in inter) * itemsize
            transfers.append(_Transfer(src, d, inter))
    cost = moved
    if any(x == P for x in ds):
        cost += math.prod(shape) * itemsize * dp.size * _P_PENALTY
    return _Redistribute(sp, ss, dp, ds, tuple(transfers), moved, cost)


@lru_cache(maxsize=4096)
def _moves_of(meta, sp, ss, dp, ds) -> tuple:
    """The abstract steps of a transition (cached; route() and cost() share them)."""
    if sp == dp:
        if ss == ds:
            return (_axis_move(meta, sp, ss, 0, ss[0]),)  # a copy: S(0) -> S(0)
        moves = _axis_route(meta, sp, ss, ds)
        if moves is not None:
            return moves
    # The general path: reduce P away inside the source placement, then move slices.
    moves, state = [], ss
    mid = _without_partial(meta.shape, ss)
    for k in reversed(range(len(ss))):
        if ss[k] != mid[k]:
            moves.append(_axis_move(meta, sp, state, k, mid[k]))
            state = moves[-1].after
    moves.append(_redistribute(meta, sp, mid, dp, ds))
    return tuple(moves)


def _check(fn: str, meta, src_placement, src_sbp, dst_placement, dst_sbp) -> None:
    shape = getattr(meta, "shape", None)
    if not isinstance(shape, tuple):
        raise TypeError(f"{fn}(): meta must be a TensorMeta (shape, dtype), got {meta!r}")
    for arg, pl, sbp in (("src", src_placement, src_sbp), ("dst", dst_placement, dst_sbp)):
        if not isinstance(pl, Placement):
            raise TypeError(f"{fn}(): {arg}_placement must be a placement, got {pl!r}")
        if (not isinstance(sbp, tuple) or len(sbp) != pl.ndim
                or not all(isinstance(x, Sbp) for x in sbp)):
            raise ValueError(
                f"{fn}(): {arg}_sbp must be a tuple of {pl.ndim} SBP value(s), one per axis "
                f"of the hierarchy {list(pl.hierarchy)}, got {sbp!r}"
            )
        check_split_axes(sbp, len(shape), fn, f"{arg}_sbp")


# -- steps and routes ---------------------------------------------------------------------
class Step:
    """One named step of a route: `name`, a one-line `describe()`, `cost` in bytes."""

    __slots__ = ("name", "cost", "_move", "_text")

    def __init__(self, move, text: str):
        self._move = move
        self.name = move.rule.name if isinstance(move, _AxisMove) else (
            "send_recv" if move.moved_bytes else "local_copy")
        self.cost = move.cost
        self._text = text

    def describe(self) -> str:
        return self._text

    def __repr__(self):
        return f"<boxing.Step {self._text}>"


def _describe(move, identity: bool) -> str:
    if isinstance(move, _AxisMove):
        pl, k, rule = move.placement, move.axis, move.rule
        head = f"{_fmt(move.before)} -> {_fmt(move.after)}"
        if identity:
            return f"{head}: nothing to do"
        size = _fmt_bytes(move.block_bytes)
        if pl.ndim == 1:
            if rule is _COPY:
                return f"{head}: copy on rank {list(pl.rank_list)} (one rank), {size}"
            return f"{head}: {rule.name} {rule.local} ranks {list(pl.rank_list)}, {size}"
        groups = []
        for r in pl.rank_list:
            g = list(pl.axis_ranks(r, k))
            if g not in groups:
                groups.append(g)
        if rule is _COPY:
            return f"{head}: copy along grid axis {k} (one rank per group {groups}), {size}"
        return (f"{head}: {rule.name} along grid axis {k} {rule.local} ranks {groups}, "
                f"{size} per group")
    head = (f"{_fmt(move.src_sbp)} on ranks {move.src.ranks} -> {_fmt(move.dst_sbp)} on ranks "
            f"{move.dst.ranks}")
    sends = sum(t.src != t.dst for t in move.transfers)
    copies = len(move.transfers) - sends
    text = (f"{head}: send_recv of intersecting slices, {sends} message"
            f"{'s' if sends != 1 else ''} ({_fmt_bytes(move.moved_bytes)}) and {copies} local "
            f"cop{'ies' if copies != 1 else 'y'}" if sends else
            f"{head}: local_copy of intersecting slices, {copies} local "
            f"cop{'ies' if copies != 1 else 'y'}, no messages")
    if any(x == P for x in move.dst_sbp):
        text += "; one rank per P group holds the data, the others zeros"
    return text


class BoxingRoute:
    """How to box one (meta, src placement, src nd-SBP) into (dst placement, dst nd-SBP).

    Built once (cached by `route`) and run by every participating rank. Frozen after building
    except for `_prepared`, the per-rank closures made on the first `run`.
    """

    __slots__ = ("meta", "src", "dst", "steps", "cost", "_moves", "_prepared", "_dtype",
                 "_participants")

    def __init__(self, meta, src, dst, moves):
        self.meta = meta
        self.src = src
        self.dst = dst
        self._moves = moves
        identity = src == dst
        self.steps = tuple(Step(m, _describe(m, identity)) for m in moves)
        self.cost = float(sum(m.cost for m in moves))
        self._prepared: dict = {}
        self._dtype = _np_dtype(meta.dtype)
        self._participants = tuple(sorted(set(src[0].rank_list) | set(dst[0].rank_list)))

    def __repr__(self):
        return (f"<boxing.BoxingRoute {_fmt(self.src[1])} on {self.src[0].ranks} -> "
                f"{_fmt(self.dst[1])} on {self.dst[0].ranks}, {len(self.steps)} step(s), "
                f"cost {self.cost:g}>")

    def explain(self) -> str:
        return "\n".join(s.describe() for s in self.steps)

    @property
    def communicates(self) -> bool:
        """Whether any step sends data between ranks (B -> S(i) is a local slice, P -> B an
        all-reduce); a graph gives such routes a task of their own."""
        for m in self._moves:
            if isinstance(m, _AxisMove):
                if m.rule.communicates:
                    return True
            elif any(t.src != t.dst for t in m.transfers):
                return True
        return False

    def participants(self) -> tuple[int, ...]:
        """The sorted ranks of the src and dst placements: those that call `run`."""
        return self._participants

    def run(self, local, world, tag: int = _TAG):
        """This rank's piece under dst (a new C-contiguous array), or None outside dst.

        Every rank of `participants()` calls it, in the same order; `local` is this rank's
        piece under src (None outside src). `world` is `sbpflow.comm.world()`.  `tag`: the
        tag of the point-to-point messages a redistribution sends (collectives have none);
        every participant passes the same one.
        """
        prepared = self._prepared.get(world)
        if prepared is None:
            prepared = self._prepare(world)
        want, fns = prepared
        if want is None:
            if local is not None:
                raise ValueError(
                    f"boxing.BoxingRoute.run(): rank {world.rank} is not in the source placement "
                    f"{self.src[0].ranks}, so local must be None, got an array of shape "
                    f"{getattr(local, 'shape', None)}"
                )
        elif (not isinstance(local, np.ndarray) or local.shape != want
              or local.dtype != self._dtype):
            got = (f"{local.dtype} {local.shape}" if isinstance(local, np.ndarray)
                   else repr(type(local).__name__))
            raise ValueError(
                f"boxing.BoxingRoute.run(): local must be rank {world.rank}'s piece under "
                f"{_fmt(self.src[1])}: a {self._dtype} array of shape {want}, got {got}"
            )
        for fn, tagged in fns:
            local = fn(local, tag) if tagged else fn(local)
        return local

    def _prepare(self, world):
        """This rank's closures, one per step it takes part in (groups made in step order,
        the same order on every member, since making a group is collective)."""
        rank = world.rank
        if rank not in self.participants():
            raise ValueError(
                f"boxing.BoxingRoute.run(): rank {rank} is not a participant "
                f"{list(self.participants())} of {self!r}; only those ranks may call run()"
            )
        src_placement, src_sbp = self.src
        want = (local_shape(self.meta.shape, src_placement, src_sbp, rank)
                if src_placement.has(rank) else None)
        fns = []
        mem = _Memory(self.dst[0].type)
        for move in self._moves:
            axis = isinstance(move, _AxisMove)
            fn = (_prepare_axis(move, self.meta, self._dtype, rank, world, mem) if axis else
                  _prepare_redistribute(move, self.meta, self._dtype, rank, world, mem))
            if fn is not None:
                fns.append((fn, not axis))
        prepared = (want, tuple(fns))
        self._prepared[world] = prepared
        return prepared


def _prepare_axis(move: _AxisMove, meta, dtype, rank, world, mem):
    pl, k = move.placement, move.axis
    if not pl.has(rank):
        return None  # a P-reduction inside the source placement: this rank is dst only
    state_b = move.before[:k] + (B,) + move.before[k + 1:]
    block = local_shape(meta.shape, pl, state_b, rank)
    n = pl.hierarchy[k]
    group = world.group(pl.axis_ranks(rank, k)) if move.rule.communicates else None
    cx = _Ctx(group, n, pl.coords(rank)[k], block, move.before[k], move.after[k], dtype, mem)
    return move.rule.make(cx)


def _prepare_redistribute(move: _Redistribute, meta, dtype, rank, world, mem):
    shape = meta.shape
    in_src, in_dst = move.src.has(rank), move.dst.has(rank)
    src_lo = ([s.start for s in piece(shape, move.src, move.src_sbp, rank)] if in_src else None)
    out_shape = local_shape(shape, move.dst, move.dst_sbp, rank) if in_dst else None
    holder = in_dst and _holds_data(move.dst, move.dst_sbp, rank)
    dst_lo = ([s.start for s in piece(shape, move.dst, move.dst_sbp, rank)] if in_dst else None)

    def local_index(box, lo):
        return _index([slice(a - o, b - o) for (a, b), o in zip(box, lo)])

    copies, ops = [], []  # ops: (is_send, peer, index), in the global transfer order
    for t in move.transfers:
        if t.src == rank and t.dst == rank:
            copies.append((local_index(t.box, src_lo), local_index(t.box, dst_lo)))
        elif t.src == rank:
            ops.append((True, t.dst, local_index(t.box, src_lo)))
        elif t.dst == rank:
            ops.append((False, t.src, local_index(t.box, dst_lo)))
    ops = tuple(ops)
    copies = tuple(copies)
    # A holder's piece is covered by the transfers; the rest of a P destination is zeros.
    alloc = mem.empty if holder else mem.zeros

    def redistribute(x, tag):
        out = alloc(out_shape, dtype) if in_dst else None
        for src_index, dst_index in copies:
            out[dst_index] = x[src_index]
        for is_send, peer, index in ops:
            if is_send:
                world.send(x[index], peer, tag)
            else:
                world.recv(out[index], peer, tag)
        return out

    return redistribute


# -- the public API -----------------------------------------------------------------------
def route(meta, src_placement: Placement, src_sbp: tuple, dst_placement: Placement,
          dst_sbp: tuple) -> BoxingRoute:
    """The route that boxes a tensor of `meta` from (src placement, nd-SBP) to (dst ...).

    Cached: the same arguments give the same BoxingRoute object."""
    try:
        return _route(meta, src_placement, src_sbp, dst_placement, dst_sbp)
    except TypeError:  # unhashable arguments: say which one is wrong
        _check("boxing.route", meta, src_placement, src_sbp, dst_placement, dst_sbp)
        raise


@lru_cache(maxsize=4096)
def _route(meta, src_placement, src_sbp, dst_placement, dst_sbp) -> BoxingRoute:
    _check("boxing.route", meta, src_placement, src_sbp, dst_placement, dst_sbp)
    moves = _moves_of(meta, src_placement, src_sbp, dst_placement, dst_sbp)
    return BoxingRoute(meta, (src_placement, src_sbp), (dst_placement, dst_sbp), moves)


def cost(meta, src_placement: Placement, src_sbp: tuple, dst_placement: Placement,
         dst_sbp: tuple) -> float:
    """The copy cost of a transition (bytes, with anything -> P penalised), without a route."""
    try:
        return _cost(meta, src_placement, src_sbp, dst_placement, dst_sbp)
    except TypeError:  # unhashable arguments: say which one is wrong
        _check("boxing.cost", meta, src_placement, src_sbp, dst_placement, dst_sbp)
        raise


@lru_cache(maxsize=16384)
def _cost(meta, src_placement, src_sbp, dst_placement, dst_sbp) -> float:
    _check("boxing.cost", meta, src_placement, src_sbp, dst_placement, dst_sbp)
    if src_placement == dst_placement and src_placement.ndim == 1:
        if src_sbp == dst_sbp:
            return 0.0
        # The 1-D table alone: no route search, the common case of signature inference.
        n = src_placement.size
        t = math.prod(meta.shape) * _np_dtype(meta.dtype).itemsize
        return float(_rule(src_sbp[0], dst_sbp[0], n).cost(t, n))
    return float(sum(m.cost for m in _moves_of(meta, src_placement, src_sbp, dst_placement,
                                               dst_sbp)))


route.cache_info, route.cache_clear = _route.cache_info, _route.cache_clear
cost.cache_info, cost.cache_clear = _cost.cache_info, _cost.cache_clear


def explain(tensor, placement: Placement, sbp) -> str:
    """`flow.boxing.explain`: the steps that would box `tensor` to (placement, sbp)."""
    src_placement = getattr(tensor, "placement", None)
    if src_placement is None:
        raise TypeError(
            f"boxing.explain(): tensor must be global (have a placement and an sbp), got "
            f"{type(tensor).__name__} without a placement"
        )
    if not isinstance(placement, Placement):
        raise TypeError(f"boxing.explain(): argument 'placement' must be a placement, got "
                        f"{placement!r}")
    meta = TensorMeta(tuple(tensor.shape), tensor.dtype)
    dst_sbp = normalize_sbp(sbp, placement, "boxing.explain")
    check_split_axes(dst_sbp, len(meta.shape), "boxing.explain")
    return route(meta, src_placement, tuple(tensor.sbp), placement, dst_sbp).explain()


class _NcclSettings:
    """`flow.boxing.nccl`: OneFlow's NCCL boxing settings, accepted and checked, and no-ops.

    They tune NCCL on GPUs (fusing collectives, stream counts, all-to-all for S->S, running
    NCCL on the compute stream). sbpflow runs on CPUs, where boxing's collectives are MPI's
    and are issued one by one on the comm stream, so there is nothing for them to change.
    Each checks its argument's type as OneFlow does and records the value, which
    `settings()` returns, so a OneFlow program that sets them runs unchanged.
    """

    _SPECS = {
        # name: (kind, default when called without a value, or None: value required)
        "enable_use_compute_stream": (bool, False),
        "disable_group_boxing_by_dst_parallel": (bool, False),
        "enable_all_to_all": (bool, None),
        "set_stream_num": (int, None),
        "set_fusion_threshold_mbytes": (int, None),
        "set_fusion_max_ops_num": (int, None),
        "allow_fuse_all_reduce": (bool, None),
        "allow_fuse_reduce_scatter": (bool, None),
        "allow_fuse_all_gather": (bool, None),
        "allow_fuse_reduce": (bool, None),
        "allow_fuse_broadcast": (bool, None),
        "allow_fuse_mixed_ops": (bool, None),
        "enable_use_buffer_to_fuse_all_reduce": (bool, None),
        "set_nccl_transfer_cost_param": (float, None),
    }

    def __init__(self):
        self._values: dict = {}

    def __dir__(self):
        return [*self._SPECS, "settings"]

    def __getattr__(self, name):
        spec = type(self)._SPECS.get(name)
        if spec is None:
            raise AttributeError(f"module 'sbpflow.boxing.nccl' has no attribute '{name}'")
        kind, default = spec

        def setting(val=default):
            if val is None:
                raise TypeError(f"boxing.nccl.{name}() missing required argument 'val'")
            ok = (type(val) is bool if kind is bool
                  else isinstance(val, (int, float)) and not isinstance(val, bool)
                  if kind is float else type(val) is int)
            if not ok:
                raise TypeError(f"boxing.nccl.{name}(): argument 'val' must be "
                                f"{kind.__name__}, not {type(val).__name__} ({val!r})")
            if kind is int and val < (0 if "threshold" in name else 1):
                raise ValueError(f"boxing.nccl.{name}(): argument 'val' must be "
                                 f"{'>= 0' if 'threshold' in name else '>= 1'}, got {val}")
            self._values[name] = val  # recorded only: a no-op on CPU (see the class doc)

        setting.__name__ = setting.__qualname__ = name
        setting.__doc__ = f"OneFlow's boxing.nccl.{name}: accepted; a no-op on CPU."
        return setting

    def settings(self) -> dict:
        """The values set so far, by setting name."""
        return dict(self._values)


nccl = _NcclSettings()

__all__ = ["BoxingRoute", "Step", "cost", "explain", "nccl", "route"]
