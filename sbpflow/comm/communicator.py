"""The `Communicator` interface, and the world of one process.

A communicator is an ordered set of ranks that run collectives together. Collectives take
NumPy arrays (the host buffers of tensors) and move them without pickling. Conventions shared
by every implementation:

- Results are concatenations along axis 0. Sizes along axis 0 may differ between ranks
  ("uneven"): `sizes` lists each rank's count. Where a rank cannot know the others' sizes
  (`all_gather`, `gather`, `scatter`, `all_to_all`'s receive side) and `sizes` is None, they
  are exchanged by one extra small collective, which also checks that row shapes and dtypes
  agree, so a mismatch raises the same error on every rank instead of corrupting memory.
  Callers that know the sizes (placements with a balanced split) pass them and skip it.
- Where one rank's split of an array is implied (`reduce_scatter`, `all_to_all`'s send side),
  the default is `balanced_sizes`: the first ranks get one more, as `torch.tensor_split`
  and OneFlow's balanced splitter.
- Reductions on float16/bfloat16 add in float32 and round once (MPI has no half types);
  reductions on bool: sum and max are "or", prod and min are "and".
- `rank`, `root`, `dest`, `source` and `group` ranks are ranks *of this communicator*.
"""

from __future__ import annotations

import abc
import collections
import enum
import os
import threading

import numpy as np


class ReduceOp(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"

    @classmethod
    def parse(cls, op) -> ReduceOp:
        try:
            found = _REDUCE_OPS.get(op)  # the common spellings, without enum machinery
        except TypeError:  # unhashable
            found = None
        if found is not None:
            return found
        # torch.distributed's ReduceOp members (sbpflow.distributed.ReduceOp) by name
        found = _TORCH_NAMES.get(getattr(op, "name", None)) if isinstance(
            getattr(op, "name", None), str) else None
        if found is not None:
            return found
        try:
            return cls(str(op).lower())
        except ValueError:
            raise ValueError(
                f"reduce op must be one of {[o.value for o in cls]} or a ReduceOp, got {op!r}"
            ) from None


_REDUCE_OPS = {**{o: o for o in ReduceOp}, **{o.value: o for o in ReduceOp}}
_TORCH_NAMES = {"SUM": ReduceOp.SUM, "PRODUCT": ReduceOp.PROD, "MAX": ReduceOp.MAX,
                "MIN": ReduceOp.MIN}


def balanced_sizes(total: int, parts: int) -> tuple[int, ...]:
    """Split `total` rows over `parts` ranks; the first `total % parts` ranks get one more."""
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def _rows(a: np.ndarray) -> np.ndarray:
    # A 0-d array contributes one row, so gathering scalars gives a vector.
    return a.reshape(1) if a.ndim == 0 else a


class Communicator(abc.ABC):
    """An ordered group of ranks. Subclasses implement the collectives."""

    def __init__(self, rank: int, size: int, world_ranks: tuple[int, ...], name: str):
        self.rank = rank
        self.size = size
        self.world_ranks = world_ranks  # the world rank of each member, in this order
        self.name = name
        self._groups: dict[tuple[int, ...], Communicator] = {}

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}: rank {self.rank} of {self.size}>"

    # -- sub-communicators ----------------------------------------------------------------
    def group(self, ranks) -> Communicator:
        """The communicator of `ranks` (ranks of this communicator, in the new order).

        Only the members call it (MPI's group-collective creation); the result is cached,
        so placements over the same ranks share one communicator.
        """
        key = tuple(int(r) for r in ranks)
        cached = self._groups.get(key)
        if cached is not None:
            return cached
        if not key or len(set(key)) != len(key) or not all(0 <= r < self.size for r in key):
            raise ValueError(
                f"group ranks must be distinct ranks in [0, {self.size}) of {self.name}, "
                f"got {list(key)}"
            )
        if self.rank not in key:
            raise ValueError(
                f"rank {self.rank} of {self.name} is not in group {list(key)}: only members "
                "create (and use) a group's communicator"
            )
        if key == tuple(range(self.size)):
            sub = self
        else:
            sub = self._create_group(key)
        self._groups[key] = sub
        return sub

    def hierarchy_axis(self, grid, axis: int) -> Communicator:
        """The communicator along `axis` of a rank grid that holds this rank.

        `grid` is a nested list (a placement's hierarchy) of ranks of this communicator; the
        result holds the ranks that share this rank's coordinates on every other axis. For
        grid [[0, 1], [2, 3]]: axis 0 of rank 1 is [1, 3], axis 1 of rank 1 is [0, 1].
        """
        arr = np.asarray(grid)
        if arr.ndim == 0 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"hierarchy_axis: grid must be a nested list of ranks, got {grid!r}")
        if not -arr.ndim <= axis < arr.ndim:
            raise IndexError(
                f"hierarchy_axis: axis {axis} out of range for a {arr.ndim}-d grid {grid!r}"
            )
        where = np.argwhere(arr == self.rank)
        if len(where) != 1:
            raise ValueError(
                f"hierarchy_axis: rank {self.rank} must appear once in grid {arr.tolist()}"
            )
        index = list(where[0])
        index[axis] = slice(None)
        return self.group(arr[tuple(index)].tolist())

    @abc.abstractmethod
    def _create_group(self, ranks: tuple[int, ...]) -> Communicator:
        ...

    # -- argument checks shared by implementations -----------------------------------------
    def _check_array(self, op: str, arg: str, a, writable: bool = False) -> np.ndarray:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{op}: {arg} must be a NumPy array, got {type(a).__name__}")
        if writable and not a.flags.writeable:
            raise ValueError(f"{op}: {arg} is read-only, the collective writes into it")
        return a

    def _check_rank(self, op: str, arg: str, rank) -> int:
        if not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise ValueError(
                f"{op}: {arg} must be a rank in [0, {self.size}) of {self.name}, got {rank!r}"
            )
        return int(rank)

    def _check_sizes(self, op: str, arg: str, sizes, own: int | None) -> tuple[int, ...]:
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) != self.size or any(s < 0 for s in sizes):
            raise ValueError(
                f"{op}: {arg} must give one non-negative count per rank ({self.size}), "
                f"got {list(sizes)}"
            )
        if own is not None and sizes[self.rank] != own:
            raise ValueError(
                f"{op}: {arg}[{self.rank}] = {sizes[self.rank]} but this rank's array has "
                f"{own} rows"
            )
        return sizes

    def _out(self, op: str, out, shape: tuple, dtype) -> np.ndarray:
        """The receive buffer: `out` checked against the result's shape and dtype, or new."""
        if out is None:
            return np.empty(shape, dtype)
        self._check_array(op, "out", out, writable=True)
        if out.shape != shape or out.dtype != dtype:
            raise ValueError(
                f"{op}: out is {out.dtype} {out.shape}, the result is {np.dtype(dtype)} {shape}"
            )
        return out

    def _split_sizes(self, op: str, arg: str, rows: int, sizes) -> tuple[int, ...]:
        if sizes is None:
            return balanced_sizes(rows, self.size)
        sizes = self._check_sizes(op, arg, sizes, None)
        if sum(sizes) != rows:
            raise ValueError(
                f"{op}: {arg} {list(sizes)} add up to {sum(sizes)}, but the array has {rows} rows"
            )
        return sizes

    # -- collectives ------------------------------------------------------------------------
    @abc.abstractmethod
    def all_reduce(self, buf: np.ndarray, op="sum", out: np.ndarray | None = None) -> np.ndarray:
        """Reduce `buf` over all ranks; in place unless `out` is given. Returns the result."""

    # `out`, where a collective takes it, is a preallocated receive buffer of exactly the
    # result's shape and dtype (the VM passes its output blobs); otherwise one is allocated.
    @abc.abstractmethod
    def all_gather(self, send: np.ndarray, sizes=None, out=None) -> np.ndarray:
        """Every rank's `send`, concatenated along axis 0 in rank order (0-d: one row)."""

    @abc.abstractmethod
    def reduce_scatter(self, send: np.ndarray, op="sum", sizes=None, out=None) -> np.ndarray:
        """Reduce `send` over ranks, then give rank i its block of `sizes[i]` rows."""

    @abc.abstractmethod
    def all_to_all(self, send: np.ndarray, send_sizes=None, recv_sizes=None,
                   out=None) -> np.ndarray:
        """Send block j of `send` (`send_sizes[j]` rows) to rank j; return the received
        blocks concatenated in rank order."""

    @abc.abstractmethod
    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite `buf` on every rank with root's `buf`. Returns `buf`."""

    @abc.abstractmethod
    def reduce(self, buf: np.ndarray, root: int = 0, op="sum") -> np.ndarray:
        """Reduce into root's `buf` in place; other ranks' `buf` are left as they were."""

    @abc.abstractmethod
    def gather(self, send: np.ndarray, root: int = 0, sizes=None) -> np.ndarray | None:
        """On root, every rank's `send` concatenated along axis 0; None elsewhere."""

    @abc.abstractmethod
    def scatter(self, out: np.ndarray, send: np.ndarray | None = None, root: int = 0,
                sizes=None) -> np.ndarray:
        """Fill every rank's `out` with its block of root's `send` (split along axis 0 by
        the `out` row counts, or root's `sizes`). Returns `out`."""

    @abc.abstractmethod
    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        ...

    @abc.abstractmethod
    def recv(self, buf: np.ndarray, source: int, tag: int = 0) -> np.ndarray:
        """Receive into `buf` (its shape and dtype must match what was sent)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        ...


class WorldOfOne(Communicator):
    """The communicator of a single process: every collective is a copy or nothing.

    Needs no MPI at all, so single-process use never imports mpi4py.
    """

    def __init__(self, world_rank: int = 0, name: str = "world"):
        super().__init__(0, 1, (world_rank,), name)
        self._mailbox: dict[int, collections.deque] = collections.defaultdict(collections.deque)

    def _create_group(self, ranks):  # pragma: no cover - group((0,)) is self
        return self

    def all_reduce(self, buf, op="sum", out=None):
        self._check_array("all_reduce", "buf", buf)
        ReduceOp.parse(op)
        if out is None:
            return buf
        self._check_array("all_reduce", "out", out, writable=True)
        np.copyto(out, buf)
        return out

    def _copy_to_out(self, op, send, out):
        result = self._out(op, out, send.shape, send.dtype)
        np.copyto(result, send)
        return result

    def all_gather(self, send, sizes=None, out=None):
        send = _rows(self._check_array("all_gather", "send", send))
        if sizes is not None:
            self._check_sizes("all_gather", "sizes", sizes, send.shape[0])
        return self._copy_to_out("all_gather", send, out)

    def reduce_scatter(self, send, op="sum", sizes=None, out=None):
        send = _rows(self._check_array("reduce_scatter", "send", send))
        ReduceOp.parse(op)
        self._split_sizes("reduce_scatter", "sizes", send.shape[0], sizes)
        return self._copy_to_out("reduce_scatter", send, out)

    def all_to_all(self, send, send_sizes=None, recv_sizes=None, out=None):
        send = _rows(self._check_array("all_to_all", "send", send))
        self._split_sizes("all_to_all", "send_sizes", send.shape[0], send_sizes)
        if recv_sizes is not None:
            self._check_sizes("all_to_all", "recv_sizes", recv_sizes, send.shape[0])
        return self._copy_to_out("all_to_all", send, out)

    def broadcast(self, buf, root=0):
        self._check_array("broadcast", "buf", buf)
        self._check_rank("broadcast", "root", root)
        return buf

    def reduce(self, buf, root=0, op="sum"):
        self._check_array("reduce", "buf", buf)
        self._check_rank("reduce", "root", root)
        ReduceOp.parse(op)
        return buf

    def gather(self, send, root=0, sizes=None):
        send = _rows(self._check_array("gather", "send", send))
        self._check_rank("gather", "root", root)
        if sizes is not None:
            self._check_sizes("gather", "sizes", sizes, send.shape[0])
        return send.copy()

    def scatter(self, out, send=None, root=0, sizes=None):
        self._check_array("scatter", "out", out, writable=True)
        self._check_rank("scatter", "root", root)
        send = self._check_array("scatter", "send", send)
        if send.size != out.size:
            raise ValueError(
                f"scatter: send has {send.size} elements but out has {out.size}"
            )
        np.copyto(out, send.reshape(out.shape))
        return out

    def send(self, buf, dest, tag=0):
        self._check_array("send", "buf", buf)
        self._check_rank("send", "dest", dest)
        self._mailbox[tag].append(buf.copy())  # buffered, as MPI's eager small sends to self

    def recv(self, buf, source, tag=0):
        self._check_array("recv", "buf", buf, writable=True)
        self._check_rank("recv", "source", source)
        if not self._mailbox[tag]:
            raise RuntimeError(
                f"recv: nothing was sent to this rank with tag {tag}; in a world of one a "
                "receive that waits for a message never sent would wait forever"
            )
        msg = self._mailbox[tag].popleft()
        if msg.size != buf.size or msg.dtype != buf.dtype:
            raise ValueError(
                f"recv: the message has {msg.size} {msg.dtype} elements, buf has "
                f"{buf.size} {buf.dtype}"
            )
        np.copyto(buf, msg.reshape(buf.shape))
        return buf

    def barrier(self):
        return None

    def check_global_ops(self, fingerprint, entry, describe) -> None:
        return None  # one process cannot diverge from itself


# -- divergence check ---------------------------------------------------------------------------
# Every collective (and, in the framework, every global op) folds a fingerprint of what it is
# (name, dtype, shape, reduce op or root, call index; a step only where one is pinned, see
# `run_at_step`) into a running hash per sequence: integer hashing of tuples the call has
# anyway. The ranks compare (call count, hash) with one tiny all-gather on the first `first`
# calls and then on one call in `every`, on a private duplicate communicator; where they
# differ, they exchange their last calls and fail naming what each rank ran. Python hashes
# tuples of ints the same way in every process (only str/bytes hashing is salted), so
# fingerprints are ints only.
CHECK_ENV = "SBPFLOW_CHECK_DIVERGENCE"
FULL_CHECK_ENV = "SBPFLOW_CHECK_GLOBAL"
DEFAULT_FIRST = 64
DEFAULT_EVERY = 64
HISTORY = 256  # calls each sequence remembers, to name the first difference (a power of 2)
_SLOT = HISTORY - 1


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw == "":
        return default
    return raw not in ("0", "false", "off", "no")


class DivergenceSettings:
    """What the divergence check does; one instance, `DIVERGENCE`, read on every call."""

    __slots__ = ("on", "full", "first", "every")

    def __init__(self):
        self.on = _env_flag(CHECK_ENV, True)
        self.full = _env_flag(FULL_CHECK_ENV, False)  # debug mode: every call is compared
        self.first = DEFAULT_FIRST
        self.every = DEFAULT_EVERY

    def due(self, count: int) -> bool:
        return self.full or count <= self.first or count % self.every == 0


DIVERGENCE = DivergenceSettings()


def set_divergence_check(on: bool = True, *, first: int | None = None,
                         every: int | None = None) -> None:
    """Turn the cheap divergence check on or off, and set its schedule: every call among the
    first `first` of a sequence is compared across ranks, then one call in `every`."""
    for arg, value in (("first", first), ("every", every)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < (0 if arg == "first" else 1)):
            raise ValueError(f"set_divergence_check: {arg} must be an int >= "
                             f"{0 if arg == 'first' else 1}, got {value!r}")
    DIVERGENCE.on = bool(on)
    if first is not None:
        DIVERGENCE.first = first
    if every is not None:
        DIVERGENCE.every = every


def set_full_check(on: bool) -> None:
    """Debug mode (`SBPFLOW_CHECK_GLOBAL=1`): compare every collective, not a sample."""
    DIVERGENCE.full = bool(on)


def divergence_check_enabled() -> bool:
    return DIVERGENCE.on


# Only what every rank must agree on enters the fingerprint: a collective's op, dtype, shape
# and reduce op or root, in order. Rank-local counters (backward passes, local ops) stay out:
# a rank may train, evaluate or take gradients alone between collectives. The one exception
# is a step a caller pins with `run_at_step` where its ranks must agree on it (DDP: backward
# passes through its model), and the report names it with the call.
STEP_TEXT = "through its DDP model"  # how a pinned step reads in the report
_main_ident = threading.main_thread().ident


class _Pinned(threading.local):
    step = None  # a class default: reading it raises nothing (a missing attribute is slow)


_pinned = _Pinned()


def run_at_step(step: int, fn, *args):
    """Run fn(*args), whose collectives the divergence check compares together with `step`:
    a count that every rank of the communicator must have reached at these collectives
    (DistributedDataParallel's: backward passes through its model, no_sync ones included).
    Pinned per thread, so a collective run later on a worker carries its issuer's count."""
    _pinned.step = step
    try:
        return fn(*args)
    finally:
        _pinned.step = None


class DivergenceError(RuntimeError, ValueError):
    """The ranks ran different collectives or global ops.

    A RuntimeError (torch's type for mismatched collectives) and a ValueError (what this
    package raises when ranks disagree on a collective's arguments). Raised on every rank at
    the same call, before any data moves: a caller that catches it may go on.
    """


class SequenceCheck:
    """The running fingerprint of one sequence of calls that every rank makes alike."""

    __slots__ = ("what", "count", "hash", "ring", "since")

    def __init__(self, what: str):
        self.what = what
        self.count = 0
        self.hash = 0
        self.ring: list = [None] * HISTORY  # call c's entry at c & _SLOT
        self.since = 1  # the first call the ring may still hold

    def note(self, key, entry) -> bool:
        """Fold one call in (`key`: a hashable of ints, the same on every rank for the same
        call); True when this call is to be compared across ranks. The hot path: keep lean."""
        self.count = count = self.count + 1
        self.hash = hash((self.hash, key))
        self.ring[count & _SLOT] = entry
        d = DIVERGENCE
        return d.full or count <= d.first or not count % d.every

    @property
    def history(self) -> list:
        """(call index, entry) of the calls remembered, oldest first."""
        start = max(self.since, self.count - HISTORY + 1)
        return [(c, self.ring[c & _SLOT]) for c in range(start, self.count + 1)]

    def compare(self, allgather, describe, ranks, where: str) -> None:
        """Compare (count, hash) across ranks; on a difference exchange the remembered calls
        and raise DivergenceError naming the first call where the ranks differ.

        `allgather(array)` stacks every rank's same-shaped array; `describe(entry)` is one
        call's text; `ranks` names each member (world ranks).
        """
        table = allgather(np.array([self.count, self.hash], np.int64))
        if (table == table[0]).all():
            return
        message = _DivergenceTexts(self, describe).report(allgather, ranks, where)
        # Every rank saw the same table: restart the sequence from the same state everywhere,
        # so a caller that catches the error is not failed again by this difference.
        self.hash = hash(tuple(int(h) for h in table[:, 1]))
        self.since = self.count + 1
        raise DivergenceError(message)


class _DivergenceTexts:
    ENTRY_BYTES = 400

    def __init__(self, seq: SequenceCheck, describe):
        self.seq, self.describe = seq, describe

    def _mine(self) -> np.ndarray:
        n = HISTORY
        buf = np.zeros((n, 8 + self.ENTRY_BYTES), np.uint8)
        for i, (count, entry) in enumerate(self.seq.history[-n:]):
            buf[i, :8] = np.frombuffer(np.int64(count).tobytes(), np.uint8)
            raw = self.describe(entry).encode()[: self.ENTRY_BYTES]
            buf[i, 8:8 + len(raw)] = np.frombuffer(raw, np.uint8)
        return buf

    def report(self, allgather, ranks, where: str) -> str:
        everyone = allgather(self._mine())
        calls = []  # per rank: {count: text}
        for rows in everyone:
            got = {}
            for row in rows:
                count = int(row[:8].view(np.int64)[0])
                if count:
                    got[count] = row[8:].tobytes().rstrip(b"\0").decode(errors="replace")
            calls.append(got)
        seq = self.seq
        common = set.intersection(*(set(c) for c in calls)) if calls else set()
        first = next((k for k in sorted(common)
                      if len({c[k] for c in calls}) > 1), None)
        head = (f"sbpflow divergence check: the ranks of {where} ran different "
                f"{seq.what} (found when comparing call #{seq.count}).")
        lines = [head]
        if first is None:
            lines.append(f"  The difference is older than the last {HISTORY} calls each rank "
                         "keeps; what each rank ran last:")
            first = max(common) if common else seq.count
        else:
            lines.append(f"  First difference, at call #{first}:")
        for r, c in zip(ranks, calls):
            lines.append(f"  rank {r}: {c.get(first, '(not remembered)')}")
        if any(STEP_TEXT in c.get(first, "") for c in calls):
            lines.append("  A DDP model's all-reduces name the backward pass they reduce: every "
                         "rank must run the same backward passes through the model, no_sync "
                         "ones included.")
        lines.append(f"  Every rank must run the same {seq.what} in the same order. "
                     f"({CHECK_ENV}=0 turns this sampled check off; {FULL_CHECK_ENV}=1 "
                     "compares every call.)")
        return "\n".join(lines)
