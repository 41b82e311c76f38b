"""Hashing for one-embedding: the key -> slot index, key ownership, and counter-based
initial values.

The index is open addressing with linear probing over two NumPy arrays (`keys`, `slots`),
compiled with numba (one pass over a batch of keys, no Python per key). Keys are
non-negative int64, so -1 marks an empty bucket. Slots are handed out densely in insertion
order, so a slot is also the row of the key in the value file.

`mix64` is splitmix64's finaliser: it decides a key's owner rank (`mix64(key) % world_size`)
and, with the seed and the column, the key's initial row, so a row does not depend on the
rank count or on the order keys are first seen.
"""

from __future__ import annotations

import numpy as np

try:
    import numba

    from ..device._numba_cache import njit as _cached_njit
except Exception:  # pragma: no cover - numba is a dependency
    numba = None

EMPTY = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic), vectorised."""
    z = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def owner_of(keys: np.ndarray, world_size: int) -> np.ndarray:
    """The rank that owns each key: hash(key) % world_size."""
    if world_size == 1:
        return np.zeros(len(keys), np.int64)
    return (mix64(keys.astype(np.int64).view(np.uint64)) % np.uint64(world_size)).astype(
        np.int64)


def _bits(seed: int, keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """(n, c) uint64 random bits, a pure function of (seed, key, counter)."""
    k = mix64(keys.astype(np.int64).view(np.uint64) ^ mix64(np.array([seed], np.uint64)))
    with np.errstate(over="ignore"):
        z = k[:, None] + (counters.astype(np.uint64)[None, :] + np.uint64(1)) * _GOLDEN
    return mix64(z)


def initial_values(initializer: dict, seed: int, keys: np.ndarray, column: int,
                   width: int) -> np.ndarray:
    """Initial values (n, width) float32 of one column block of each key's row."""
    n = len(keys)
    if n == 0 or width == 0:
        return np.zeros((n, width), np.float32)
    kind = initializer["type"]
    # Counters are unique per (column block, element): block c uses [c << 32, ...).
    base = np.uint64(column) << np.uint64(32)
    if kind == "uniform":
        bits = _bits(seed, keys, base + np.arange(width, dtype=np.uint64))
        u = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)  # [0, 1)
        low, high = float(initializer["low"]), float(initializer["high"])
        return (low + (high - low) * u).astype(np.float32)
    if kind == "normal":
        bits = _bits(seed, keys, base + np.arange(2 * width, dtype=np.uint64))
        u1 = ((bits[:, 0::2] >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2.0**53)
        u2 = (bits[:, 1::2] >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller
        return (float(initializer["mean"]) + float(initializer["std"]) * z).astype(np.float32)
    raise ValueError(f"one_embedding: unknown initializer type {kind!r}")


if numba is not None:
    _jit = _cached_njit(nogil=True)

    @_jit
    def _bucket(key, mask):
        z = np.uint64(key)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        return np.int64(z & np.uint64(mask))

    @_jit
    def _probe(table_keys, k, mask):
        """The bucket holding k, or the empty bucket where linear probing would put it."""
        b = _bucket(k, mask)
        while table_keys[b] != k and table_keys[b] != -1:
            b = (b + 1) & mask
        return b

    @_jit
    def _find(table_keys, table_slots, keys, out):
        mask = table_keys.shape[0] - 1
        for i in range(keys.shape[0]):
            b = _probe(table_keys, keys[i], mask)
            out[i] = table_slots[b] if table_keys[b] != -1 else -1

    @_jit
    def _insert(table_keys, table_slots, keys, out, next_slot):
        """Slots of `keys`, inserting missing ones with slots next_slot, next_slot+1, ...
        Returns the next free slot. The table must have room (load kept <= 1/2)."""
        mask = table_keys.shape[0] - 1
        for i in range(keys.shape[0]):
            b = _probe(table_keys, keys[i], mask)
            if table_keys[b] == -1:
                table_keys[b] = keys[i]
                table_slots[b] = next_slot
                next_slot += 1
            out[i] = table_slots[b]
        return next_slot

    @_jit
    def sum_rows_into(out, inverse, rows):
        """out[inverse[j]] += rows[j], in j order (duplicate ids' gradients, summed)."""
        for j in range(inverse.shape[0]):
            i = inverse[j]
            for c in range(rows.shape[1]):
                out[i, c] += rows[j, c]


    @_jit
    def _dedup(keys, table_keys, table_pos, uniq, first, inverse):
        """Distinct keys in first-seen order, through a scratch open-addressing table."""
        mask = table_keys.shape[0] - 1
        n = 0
        for j in range(keys.shape[0]):
            b = _probe(table_keys, keys[j], mask)
            if table_keys[b] == -1:
                table_keys[b] = keys[j]
                table_pos[b] = n
                uniq[n] = keys[j]
                first[n] = j
                n += 1
            inverse[j] = table_pos[b]
        return n


def dedup(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uniq, first, inverse) of non-negative int64 keys: uniq in first-seen order,
    keys[first] == uniq, uniq[inverse] == keys. One hashed pass (np.unique sorts)."""
    keys = np.ascontiguousarray(keys, np.int64)
    cap = 16
    while cap < 2 * len(keys):
        cap *= 2
    uniq = np.empty(len(keys), np.int64)
    first = np.empty(len(keys), np.int64)
    inverse = np.empty(len(keys), np.int64)
    n = _dedup(keys, np.full(cap, EMPTY, np.int64), np.empty(cap, np.int64), uniq, first,
               inverse)
    return uniq[:n], first[:n], inverse


MAX_SLOTS = 2**31 - 1  # slots are stored as int32: 12 bytes a bucket, not 16


class KeyIndex:
    """key (int64 >= 0) -> slot, open addressing, load factor kept at most 1/2. Slots are
    kept as int32 (a rank's shard holds at most 2^31 - 1 keys) and returned as int64."""

    def __init__(self, capacity_hint: int = 0):
        cap = 1024
        while cap < 2 * capacity_hint:
            cap *= 2
        self._keys = np.full(cap, EMPTY, np.int64)
        self._slots = np.full(cap, EMPTY, np.int32)
        self.size = 0

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._slots.nbytes

    def _grow_for(self, extra: int) -> None:
        need = self.size + extra
        if need > MAX_SLOTS:
            raise RuntimeError(f"one_embedding: a rank's store holds at most {MAX_SLOTS} keys; "
                               f"this batch would make it {need} (use more ranks)")
        cap = len(self._keys)
        if 2 * need <= cap:
            return
        while 2 * need > cap:
            cap *= 2
        old_keys, old_slots = self._keys, self._slots
        used = old_keys != EMPTY
        self._keys = np.full(cap, EMPTY, np.int64)
        self._slots = np.full(cap, EMPTY, np.int32)
        keys, slots = old_keys[used], old_slots[used].astype(np.int64)
        order = np.argsort(slots, kind="stable")
        out = np.empty(len(keys), np.int64)
        _insert(self._keys, self._slots, keys[order], out, 0)
        # Re-inserting in slot order with next_slot 0 hands out the same slots again.
        assert np.array_equal(out, slots[order])

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Slots of `keys` (int64), -1 where absent."""
        out = np.empty(len(keys), np.int64)
        _find(self._keys, self._slots, np.ascontiguousarray(keys, np.int64), out)
        return out

    def insert(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, new) for distinct `keys`: new keys get the next slots in order."""
        keys = np.ascontiguousarray(keys, np.int64)
        self._grow_for(len(keys))
        out = np.empty(len(keys), np.int64)
        before = self.size
        self.size = int(_insert(self._keys, self._slots, keys, out, before))
        return out, out >= before
