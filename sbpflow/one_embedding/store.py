"""One rank's key-value store of embedding rows: a hashed key index, values in fixed-size
blocks of a file, an LRU cache in RAM with write-back, in-store optimizer updates, and atomic
snapshots.

Layout of a row (`storage_dim` float32 values): the embedding (`embedding_dim`), then the
optimizer's state, `embedding_dim` each (momentum; Adam's m and v; Adagrad's sum; Ftrl's
accumulator and z). Every state starts at zero for a new key: accumulators that torch starts
at `initial_accumulator_value` are stored as the difference from it.

Where rows live. A key's slot (from `KeyIndex`) is its row in `persistent_path/rank-N/values`:
the file is a sequence of `physical_block_size`-byte blocks, each holding
`block_size // (4 * storage_dim)` whole rows (a row bigger than a block spans whole blocks),
so a row never straddles a block boundary. A row is either in the RAM cache (a line of
`_cache`) or in the file; a new key is initialised straight into the cache, dirty, and reaches
the file when its line is evicted or at a snapshot (write-back). The cache holds at most
`cache_budget_mb` of lines and evicts least-recently-used lines.

Every batch operation is vectorised: the index is a numba loop over the batch, the cache
and the file are addressed with NumPy fancy indexing; nothing runs in Python per key. A batch
with more distinct keys than the cache has lines is served in cache-sized pieces.

Snapshots (`save_snapshot(name)`) go to `rank-N/snapshots/<name>`: one file with a header,
the keys in slot order, the rows, and a CRC32 of all of it. It is written to a temporary
name, fsync'ed and renamed over the old one, so a crash mid-write leaves the previous
snapshot of that name intact; a truncated or corrupt file fails its length or checksum check
with an error that says so. A load checks the whole file and everything it must agree with
(dims, dtype, the caller's expectations) before it replaces anything, so a refused load
leaves the live table as it was. A save removes the temporary files of earlier saves of that
name whose process died mid-write (kill -9), as `flow.save` does.

One store per directory. An open store holds an exclusive `flock` on `path/lock` (which
names its pid) until it is closed or collected, or its process dies: a second store on the
same directory, in this process or another, would empty the value file under the first one's
map. The value file's blocks are reserved (`posix_fallocate`) whenever it grows, which is
when new keys arrive, so a full disk fails that lookup with ENOSPC (naming the store, the
table unchanged) instead of killing the process with SIGBUS at a later write through the map.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import time
import weakref
import zlib

import numpy as np

from ..framework import serialization as _ser
from ._hash import KeyIndex, initial_values

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: stores are not locked
    fcntl = None

_MAGIC = b"SBPFLOW-ONE-EMBEDDING-SNAPSHOT-1\n"
_CHUNK_ROWS = 1 << 16
_RELEASE_BYTES = 256 << 20  # mapped value-file pages kept resident before a release
_IO_ROWS = 1 << 14  # rows per file read or write between release checks (<= 64 MB of pages)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_file_bytes() -> int | None:
    """Resident file-backed (shared) bytes of this process, or None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None


class SnapshotError(RuntimeError):
    """A snapshot is missing, truncated or corrupt, or does not fit this store."""


_LOCK_NAME = "lock"
_LOCK_FDS: set[int] = set()  # the lock descriptors of this process's open stores


def _forget_locks_in_child() -> None:
    """A forked child (a DataLoader worker) closes its copies of the lock descriptors: a
    flock lasts while any descriptor of it is open, so a child outliving its parent's store
    would keep the directory locked, and in the parent's name."""
    for fd in _LOCK_FDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def _lock_holder(fd: int) -> str:
    """Who holds the lock on `fd`'s file, from the pid it wrote there."""
    for _ in range(20):  # the holder writes its pid just after taking the lock
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit() and _ser._process_start(int(text)) is not None:
            break
        time.sleep(0.005)
    if not text.isdigit():
        return "another process (its pid is not written yet)"
    if int(text) == os.getpid():
        return f"this process (pid {text}, another store)"
    return f"process {text}"


def _lock_store(path: str) -> int | None:
    """Take the store directory's exclusive lock; returns the lock file's descriptor. The
    lock belongs to this open file description, so a second open() in this process is
    refused too, and the kernel drops it when the descriptor is closed or the process
    dies."""
    if fcntl is None:  # pragma: no cover
        return None
    lock = os.path.join(path, _LOCK_NAME)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise RuntimeError(
            f"one_embedding: the store directory {path!r} is in use by {holder}, which holds "
            f"its lock {lock!r}. A directory is opened by one store at a time: close or "
            "delete the embedding that has it open, or give this one another "
            "persistent_path") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _LOCK_FDS.add(fd)
    return fd


def _unlock(fd: int | None) -> None:
    if fd in _LOCK_FDS:  # not after a fork: the child closed it, the number may be reused
        _LOCK_FDS.discard(fd)
        os.close(fd)  # drops the flock


def _named(e: OSError, what: str) -> OSError:
    """`e` again (same errno, so the same OSError subclass) with `what` in its message."""
    if e.errno is None:
        return e
    return OSError(e.errno, f"{what}: {e.strerror}", e.filename)


# Snapshot temporaries of the format before flow.save's (`.<name>.tmp-<pid>`).
_OLD_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)\Z")


def _remove_old_temps(directory: str, name: str) -> None:
    """Remove `.<name>.tmp-<pid>` files whose process is gone (no start time was recorded
    in that format, so a reused pid keeps its file: never a live save's file removed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for n in names:
        m = _OLD_TEMP.match(n)
        if m and m["name"] == name and _ser._process_start(int(m["pid"])) is None:
            try:
                os.unlink(os.path.join(directory, n))
            except OSError:
                pass


class _Checked:
    """A snapshot that passed every check (`EmbeddingStore.check_snapshot`): the open file
    (it cannot change under us: the store's lock covers its directory and the inode is held),
    its header and the new key index, ready for `EmbeddingStore.replace`."""

    def __init__(self, path, f, header, offset, keys, index):
        self.path, self.f, self.header, self.offset = path, f, header, offset
        self.keys, self.index = keys, index

    def close(self) -> None:
        self.f.close()


def _grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    if len(a) >= n:
        return a
    cap = max(n, 2 * len(a), 16)
    out = np.full((cap,) + a.shape[1:], fill, a.dtype)
    out[: len(a)] = a
    return out


class EmbeddingStore:
    """One rank's shard of a one-embedding table (see the module docstring)."""

    def __init__(self, path: str, embedding_dim: int, storage_dim: int, cache_lines: int,
                 column_initializers: list[list[tuple[int, int, dict]]], seed: int,
                 physical_block_size: int = 4096, capacity_hint: int = 0):
        if storage_dim < embedding_dim:
            raise ValueError(f"one_embedding: storage_dim ({storage_dim}) must be at least "
                             f"embedding_dim ({embedding_dim})")
        if cache_lines < 1:
            raise ValueError("one_embedding: the cache budget holds no row "
                             f"(a row is {4 * storage_dim} bytes)")
        self.path = path
        self.embedding_dim = embedding_dim
        self.storage_dim = storage_dim
        self.cache_lines = int(cache_lines)
        self.columns = column_initializers  # per table: [(start, stop, initializer)]
        self.seed = int(seed)
        self.step = 0  # optimizer steps applied (bias correction, learning-rate decay)
        # block layout of the value file
        self.block_floats = max(1, physical_block_size // 4)
        self.rows_per_block = max(1, self.block_floats // storage_dim)
        self.block_span = -(-storage_dim // self.block_floats)  # blocks per group of rows
        # counters (tests and benchmarks read them)
        self.hits = self.misses = self.evictions = self.writebacks = 0
        self.releases = 0  # times the value file's mapped pages were handed back
        self.capacity_hint = int(capacity_hint)
        os.makedirs(os.path.join(path, "snapshots"), exist_ok=True)
        self._values_path = os.path.join(path, "values")
        self._mm = None
        self._rows2d = None  # the file as (rows, storage_dim) when rows fill whole blocks
        # Locked before the value file is touched: emptying it under another store's map
        # would kill that process (SIGBUS) and lose its table.
        fd = _lock_store(path)
        self._release = weakref.finalize(self, _unlock, fd)
        try:
            with open(self._values_path, "wb"):
                pass  # a new store starts empty; state comes back only from a snapshot
            self.file_rows = 0  # rows the value file has room for
            # Sized for the capacity hint up front: growing by doubling would copy (and for
            # a moment hold twice) arrays of 10^8 entries. key_of_slot's pages are touched
            # only as keys arrive.
            self._reset(KeyIndex(capacity_hint), np.empty(int(capacity_hint), np.int64))
        except BaseException:
            self._release()
            raise

    # -- state ----------------------------------------------------------------------------
    def _reset(self, index: KeyIndex, key_of_slot: np.ndarray) -> None:
        """Take `index` and its keys as the table, every row in the file, the cache empty."""
        self.index = index
        self.key_of_slot = key_of_slot
        # -1: the row is in the file; int32, as cache lines number far below 2^31
        self.line_of_slot = np.full(len(key_of_slot), -1, np.int32)
        self._mapped_base = None  # resident file-page bytes after the last release
        n = min(self.cache_lines, 1024)
        self._cache = np.zeros((n, self.storage_dim), np.float32)
        self._line_slot = np.full(n, -1, np.int64)
        self._line_tick = np.zeros(n, np.int64)
        self._line_dirty = np.zeros(n, bool)
        self._lines_used = 0
        self._free = np.empty(0, np.int64)  # lines evicted ahead of need (_take_lines)
        self._free_n = 0
        self._tick = 0

    @property
    def num_keys(self) -> int:
        return self.index.size

    def ram_bytes(self) -> int:
        """Bytes of RAM held: index, slot maps and the cache."""
        return (self.index.nbytes + self.key_of_slot.nbytes + self.line_of_slot.nbytes
                + self._cache.nbytes + self._line_slot.nbytes + self._line_tick.nbytes
                + self._line_dirty.nbytes)

    # -- the value file -------------------------------------------------------------------
    def _offsets(self, slots: np.ndarray) -> np.ndarray:
        """(n, storage_dim) float offsets of rows in the value file."""
        group = slots // self.rows_per_block
        start = (group * (self.block_span * self.block_floats)
                 + (slots % self.rows_per_block) * self.storage_dim)
        return start[:, None] + np.arange(self.storage_dim)

    def _ensure_file(self, rows: int) -> None:
        if rows <= self.file_rows:
            return
        if rows <= self.capacity_hint:  # toward the expected size by doubling, not past it
            grow = min(2 * self.file_rows, self.capacity_hint)
        else:  # past it, or no hint: every block is reserved, so at most 1/4 more than held
            grow = self.file_rows + self.file_rows // 4
        new_rows = max(rows, grow, 1024)
        groups = -(-new_rows // self.rows_per_block)
        nbytes = groups * self.block_span * self.block_floats * 4
        with open(self._values_path, "r+b") as f:
            old = os.fstat(f.fileno()).st_size  # file_rows' blocks, all reserved
            try:
                if hasattr(os, "posix_fallocate"):
                    # Reserved, not sparse: a write through the map into a hole the disk
                    # has no block for is a SIGBUS; this is an OSError here and now.
                    os.posix_fallocate(f.fileno(), old, nbytes - old)
                else:  # pragma: no cover - not POSIX
                    f.truncate(nbytes)
            except OSError as e:
                f.truncate(old)  # what a failed reservation extended; the old map stays
                raise _named(e, f"one_embedding: store {self.path!r} cannot grow its value "
                                f"file to {nbytes} bytes ({groups * self.rows_per_block} "
                                "rows)") from e
        # The old map's dirty pages are the file's page cache (a shared map): no flush
        self._mm = self._rows2d = None
        self._mm = np.memmap(self._values_path, np.float32, "r+", shape=(nbytes // 4,))
        self.file_rows = groups * self.rows_per_block
        if self.rows_per_block * self.storage_dim == self.block_floats:
            # Rows fill whole blocks: the file is a plain (rows, storage_dim) array, read and
            # written by row index instead of per-float offsets (an index array 8 times
            # the size of the data).
            self._rows2d = self._mm.reshape(self.file_rows, self.storage_dim)

    def _close_file(self) -> None:
        if self._mm is not None:
            self._mm.flush()
            self._mm = None
            self._rows2d = None

    def _touched(self) -> None:
        """Hand the map's resident pages back when they pass _RELEASE_BYTES. Pages of a
        shared file map count in the process's RSS, and a fault maps its neighbours too
        (fault-around), so random row reads map far more than they read; after
        MADV_DONTNEED the kernel keeps the pages (dirty ones too) in its page cache, written
        back as usual, and a later access maps them again. So the store's RAM stays its
        cache, not the file. (The resident file pages are read from /proc/self/statm, a few
        microseconds a batch.)"""
        mm = getattr(self._mm, "_mmap", None)
        if mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        shared = _resident_file_bytes()
        if shared is None:
            return
        if self._mapped_base is None:
            self._mapped_base = shared
        elif shared - self._mapped_base > _RELEASE_BYTES:
            mm.madvise(mmap.MADV_DONTNEED)
            self.releases += 1
            self._mapped_base = _resident_file_bytes()

    def _read_file(self, slots: np.ndarray) -> np.ndarray:
        if len(slots) <= _IO_ROWS:
            rows = self._rows2d[slots] if self._rows2d is not None else self._mm[
                self._offsets(slots)]
            self._touched()
            return rows
        return np.concatenate([self._read_file(slots[i:i + _IO_ROWS])
                               for i in range(0, len(slots), _IO_ROWS)])

    def _write_file(self, slots: np.ndarray, rows: np.ndarray) -> None:
        if len(slots):
            self._ensure_file(int(slots.max()) + 1)
            # In pieces: each random row written maps a page, so a big write-back would
            # map gigabytes before the next release
            for i in range(0, len(slots), _IO_ROWS):
                part = slots[i:i + _IO_ROWS]
                if self._rows2d is not None:
                    self._rows2d[part] = rows[i:i + _IO_ROWS]
                else:
                    self._mm[self._offsets(part)] = rows[i:i + _IO_ROWS]
                self._touched()

    # -- the cache ------------------------------------------------------------------------
    def _grow_cache(self, need: int) -> None:
        n = len(self._line_slot)
        if need <= n:
            return
        n = min(self.cache_lines, max(need, 2 * n))
        self._cache = _grown(self._cache, n, 0.0)[:n]
        self._line_slot = _grown(self._line_slot, n, -1)[:n]
        self._line_tick = _grown(self._line_tick, n, 0)[:n]
        self._line_dirty = _grown(self._line_dirty, n, False)[:n]

    def _evict(self, lines: np.ndarray) -> None:
        """Write dirty `lines` back to the file and free them."""
        slots = self._line_slot[lines]
        dirty = self._line_dirty[lines]
        self._write_file(slots[dirty], self._cache[lines[dirty]])
        self.writebacks += int(dirty.sum())
        self.evictions += len(lines)
        self.line_of_slot[slots] = -1
        self._line_slot[lines] = -1
        self._line_dirty[lines] = False

    def _take_lines(self, n: int, busy: np.ndarray) -> np.ndarray:
        """n free cache lines, evicting the least recently used ones not in `busy`.

        Finding the LRU lines scans every line's tick, so a full cache evicts ahead: at
        least 1/64 of its lines per scan, the ones not needed now kept on a free list (their
        rows written back and gone from the cache). A cache of 10^7 lines then scans once
        per ~10^5 misses, not once per batch."""
        assert n <= self.cache_lines, "batches are cut to the cache's size (_chunks)"
        out = []
        k = min(n, self._free_n)
        if k:
            out.append(self._free[self._free_n - k:self._free_n].copy())
            self._free_n -= k
        used = self._lines_used
        fresh = min(n - k, self.cache_lines - used)
        if fresh:
            self._grow_cache(used + fresh)
            out.append(np.arange(used, used + fresh, dtype=np.int64))
            self._lines_used += fresh
        rest = n - k - fresh
        if rest:
            never = np.iinfo(np.int64).max
            ticks = self._line_tick[:used].copy()  # victims come from lines in use before
            ticks[busy] = never  # lines of this batch stay (free lines hold `never` too)
            ahead = min(max(rest, self.cache_lines // 64), used - len(busy) - self._free_n)
            victims = np.argpartition(ticks, ahead - 1)[:ahead].astype(np.int64)
            self._evict(victims)
            out.append(victims[:rest])
            spare = victims[rest:]
            if len(spare):
                self._line_tick[spare] = never
                self._free = _grown(self._free, self._free_n + len(spare), -1)
                self._free[self._free_n:self._free_n + len(spare)] = spare
                self._free_n += len(spare)
        return np.concatenate(out) if len(out) != 1 else out[0]

    def lines(self, keys: np.ndarray, table_ids: np.ndarray | None) -> np.ndarray:
        """Cache lines holding the rows of distinct `keys`, inserting new keys (initialised
        by their table's initializer) and reading evicted rows back from the file."""
        if table_ids is None:
            slots = self.index.find(keys)
            if (slots < 0).any():
                raise KeyError(f"one_embedding: keys {keys[slots < 0][:5].tolist()} were "
                               "never looked up on this rank")
            new = np.zeros(len(keys), bool)
        else:
            self._reserve(len(keys))
            slots, new = self.index.insert(keys)
        n_slots = self.index.size
        if new.any():
            self.key_of_slot = _grown(self.key_of_slot, n_slots, -1)
            self.key_of_slot[slots[new]] = keys[new]
            self.line_of_slot = _grown(self.line_of_slot, n_slots, -1)
        self._tick += 1
        lines = self.line_of_slot[slots]
        hit = lines >= 0
        self.hits += int(hit.sum())
        self.misses += int((~hit).sum())
        self._line_tick[lines[hit]] = self._tick
        miss = np.flatnonzero(~hit)
        if len(miss):
            got = self._take_lines(len(miss), lines[hit])
            lines[miss] = got
            mslots = slots[miss]
            self._line_slot[got] = mslots
            self._line_tick[got] = self._tick
            self.line_of_slot[mslots] = got
            fresh = new[miss]
            old = ~fresh
            if old.any():
                self._cache[got[old]] = self._read_file(mslots[old])
                self._line_dirty[got[old]] = False
            if fresh.any():
                self._cache[got[fresh]] = self._initial_rows(keys[miss][fresh],
                                                             table_ids[miss][fresh])
                self._line_dirty[got[fresh]] = True
        return lines

    def _reserve(self, n: int) -> None:
        """Room in the value file for n more keys, before any is inserted: a full disk then
        fails the lookup with nothing changed, not a later write-back through the map."""
        if self.index.size + n > self.file_rows:
            self._ensure_file(self.index.size + n)

    def _initial_rows(self, keys: np.ndarray, table_ids: np.ndarray) -> np.ndarray:
        rows = np.zeros((len(keys), self.storage_dim), np.float32)
        for t, columns in enumerate(self.columns):  # a loop over tables, not keys
            sel = np.flatnonzero(table_ids == t)
            if len(sel) == 0:
                continue
            for c, (start, stop, init) in enumerate(columns):
                rows[sel, start:stop] = initial_values(init, self.seed, keys[sel], c,
                                                       stop - start)
        return rows

    # -- the public batch operations ------------------------------------------------------
    def _chunks(self, n: int):
        """A batch bigger than the cache is served in cache-sized pieces."""
        for start in range(0, n, self.cache_lines):
            yield slice(start, min(n, start + self.cache_lines))

    def lookup(self, keys: np.ndarray, table_ids: np.ndarray) -> np.ndarray:
        """Embeddings (n, embedding_dim) of distinct `keys`, new keys initialised."""
        out = np.empty((len(keys), self.embedding_dim), np.float32)
        self._reserve(len(keys))  # for the whole batch: cut in pieces, it fails whole
        for c in self._chunks(len(keys)):
            lines = self.lines(keys[c], table_ids[c])  # first: it may grow the cache
            out[c] = self._cache[lines, : self.embedding_dim]
        return out

    def read_rows(self, keys: np.ndarray) -> np.ndarray:
        """Full stored rows (embedding and optimizer state) of existing distinct keys."""
        out = np.empty((len(keys), self.storage_dim), np.float32)
        for c in self._chunks(len(keys)):
            lines = self.lines(keys[c], None)
            out[c] = self._cache[lines]
        return out

    def apply_update(self, keys: np.ndarray, grads: np.ndarray, rule) -> None:
        """Count one optimizer step, and apply `rule(rows, grads, step)` in place to the
        rows of distinct existing `keys` (rows: (n, storage_dim), written back as dirty)."""
        self.step += 1
        grads = grads.astype(np.float32, copy=False)
        for c in self._chunks(len(keys)):
            lines = self.lines(keys[c], None)
            rows = self._cache[lines]
            rule(rows, grads[c], self.step)
            self._cache[lines] = rows
            self._line_dirty[lines] = True

    def flush(self) -> None:
        """Write every dirty cached row back to the file (they stay cached, clean)."""
        lines = np.flatnonzero(self._line_dirty[: self._lines_used])
        for start in range(0, len(lines), 16 * _CHUNK_ROWS):  # a copy of a piece at a time
            part = lines[start:start + 16 * _CHUNK_ROWS]
            self._write_file(self._line_slot[part], self._cache[part])
        self.writebacks += len(lines)
        self._line_dirty[lines] = False
        if self._mm is not None:
            self._mm.flush()

    # -- snapshots ------------------------------------------------------------------------
    def _snapshot_path(self, name: str) -> str:
        if not name or os.sep in name or name.startswith("."):
            raise ValueError(f"one_embedding: bad snapshot name {name!r} (a plain file name)")
        return os.path.join(self.path, "snapshots", name)

    def _header(self, extra: dict) -> dict:
        return {"embedding_dim": self.embedding_dim, "storage_dim": self.storage_dim,
                "dtype": "float32", "num_keys": self.num_keys, "step": self.step,
                "seed": self.seed, **extra}

    def save_snapshot(self, name: str, extra: dict | None = None) -> None:
        path = self._snapshot_path(name)
        self.flush()
        header = json.dumps(self._header(extra or {})).encode()
        n = self.num_keys

        def write(f) -> None:
            crc = 0

            def put(data: bytes) -> None:
                nonlocal crc
                crc = zlib.crc32(data, crc)
                f.write(data)

            put(_MAGIC)
            put(np.uint64(len(header)).tobytes())
            put(header)
            put(self.key_of_slot[:n].tobytes())
            for start in range(0, n, _CHUNK_ROWS):
                slots = np.arange(start, min(n, start + _CHUNK_ROWS), dtype=np.int64)
                self._write_snapshot_chunk(put, self._read_file(slots))
            f.write(np.uint32(crc).tobytes())

        _remove_old_temps(os.path.dirname(path), name)
        try:
            # flow.save's writer: a temporary file named by pid and process start time
            # (the next save removes it if its process died mid-write), fsync, rename over
            # the old snapshot (readers see the old file or the new one), fsync the folder.
            _ser._atomic_write(path, write)
        except OSError as e:
            raise _named(e, f"one_embedding: store {self.path!r} could not save snapshot "
                            f"{name!r}") from e

    def _write_snapshot_chunk(self, put, rows: np.ndarray) -> None:
        put(np.ascontiguousarray(rows, np.float32).tobytes())

    def check_snapshot(self, name: str) -> _Checked:
        """Check snapshot `name` whole against this store, changing no row: magic, header,
        dtype, length, CRC32, dims, distinct keys (SnapshotError saying which failed), and
        room for its rows in the value file (OSError: ENOSPC). Returns what `replace` needs
        (close it when not replacing)."""
        path = self._snapshot_path(name)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            raise SnapshotError(f"one_embedding: no snapshot named {name!r} in "
                                f"{os.path.dirname(path)}") from None
        try:
            return self._check(path, f)
        except BaseException:
            f.close()
            raise

    def _check(self, path: str, f) -> _Checked:
        def corrupt(why: str) -> SnapshotError:
            return SnapshotError(f"one_embedding: snapshot {path!r} is corrupt ({why})")

        size = os.fstat(f.fileno()).st_size
        if size < len(_MAGIC) + 12 or f.read(len(_MAGIC)) != _MAGIC:
            raise corrupt("not a one-embedding snapshot: bad magic or too short")
        hlen = int(np.frombuffer(f.read(8), np.uint64)[0])
        if hlen > size:
            raise corrupt("truncated header")
        try:
            header = json.loads(f.read(hlen))
            n, dim = int(header["num_keys"]), int(header["storage_dim"])
            edim = int(header["embedding_dim"])
            header["step"], header["seed"] = int(header["step"]), int(header["seed"])
            dtype = header.get("dtype", "float32")  # snapshots before the field: float32
        except (ValueError, KeyError, TypeError, AttributeError):
            raise corrupt("unreadable header") from None
        if n < 0 or dim < 1:
            raise corrupt(f"num_keys {n}, storage_dim {dim}")
        if dtype != "float32":
            raise SnapshotError(f"one_embedding: snapshot {path!r} holds rows of dtype "
                                f"{dtype!r}; this embedding stores float32")
        offset = len(_MAGIC) + 8 + hlen
        body = offset + 8 * n + 4 * n * dim
        if size != body + 4:
            raise corrupt(f"{size} bytes, expected {body + 4}: truncated or extended")
        f.seek(0)
        crc, left = 0, body
        while left:
            data = f.read(min(left, 1 << 24))
            crc = zlib.crc32(data, crc)
            left -= len(data)
        if int(np.frombuffer(f.read(4), np.uint32)[0]) != crc:
            raise corrupt("checksum mismatch")
        if dim != self.storage_dim or edim != self.embedding_dim:
            raise SnapshotError(
                f"one_embedding: snapshot {path!r} holds rows of embedding_dim {edim} and "
                f"storage_dim {dim}; this embedding has {self.embedding_dim} and "
                f"{self.storage_dim}")
        f.seek(offset)
        keys = np.frombuffer(f.read(8 * n), np.int64).copy()
        index = KeyIndex(n)  # built beside the live one, which stays until replace
        slots, _ = index.insert(keys)
        if not np.array_equal(slots, np.arange(n)):
            raise corrupt("repeated keys")
        # Room for its rows too (growing the value file changes no row): a full disk is
        # one more reason to refuse, found before anything is replaced, on every rank
        self._ensure_file(n)
        return _Checked(path, f, header, offset + 8 * n, keys, index)

    def replace(self, checked: _Checked) -> dict:
        """Make a checked snapshot this store's state; returns its header."""
        n, dim = len(checked.keys), self.storage_dim
        self._ensure_file(n)  # reserved by the check already
        self._reset(checked.index, checked.keys)  # the cache's rows are the old table's
        try:
            checked.f.seek(checked.offset)
            for start in range(0, n, _CHUNK_ROWS):
                m = min(n, start + _CHUNK_ROWS) - start
                rows = np.frombuffer(checked.f.read(4 * m * dim), np.float32).reshape(m, dim)
                self._write_file(np.arange(start, start + m, dtype=np.int64), rows)
        except BaseException:
            # The old rows are overwritten already: an empty table, not a half-loaded one
            self._reset(KeyIndex(0), np.empty(0, np.int64))
            self.step = 0
            raise
        self.step = checked.header["step"]
        self.seed = checked.header["seed"]
        return checked.header

    def load_snapshot(self, name: str) -> dict:
        """Replace this store's state by snapshot `name`; returns its header. The whole file
        is checked (check_snapshot) before anything is replaced."""
        checked = self.check_snapshot(name)
        try:
            return self.replace(checked)
        finally:
            checked.close()

    def close(self) -> None:
        """Unmap the value file and unlock: the directory may be opened by another store
        (the value file is scratch: the next store empties it; state lives in snapshots)."""
        self._close_file()
        self._release()
