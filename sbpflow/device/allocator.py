"""A size-class caching allocator for CPU buffers.

Large arrays come from mmap'd memory that the OS zeroes and faults in page by page on every
fresh allocation; reusing freed buffers avoids that.  Requests round up to a size class
(powers of two split in four: 1, 1.25, 1.5, 1.75 x 2^k bytes), and a freed buffer goes back
to its class's free list.  Small arrays are left to NumPy's own allocator, which is fast for
them.

A buffer is recycled only when nothing else refers to it: the VM's release instruction hands
it back after the storage's last use, and `free` checks the buffer's reference count, so an
array the user still holds (from `numpy()`) keeps its memory.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

LARGE = 1 << 16  # bytes: smaller requests use NumPy's allocator directly


def size_class(nbytes: int) -> int:
    if nbytes <= LARGE:
        return LARGE
    k = nbytes.bit_length() - 1
    step = 1 << (k - 2)
    return ((nbytes + step - 1) // step) * step


class CachingAllocator:
    def __init__(self, limit_bytes: int = 1 << 30):
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.cached_bytes = 0
        self.limit_bytes = limit_bytes  # cache at most this much idle memory
        self.hits = 0
        self.misses = 0
        self._baseline = None

    def empty(self, shape, np_dtype) -> np.ndarray:
        """An uninitialised C-contiguous array, from the cache when large."""
        np_dtype = np.dtype(np_dtype)
        n = 1
        for s in shape:
            n *= s
        nbytes = n * np_dtype.itemsize
        if nbytes < LARGE:
            return np.empty(shape, np_dtype)
        cls = size_class(nbytes)
        with self._lock:
            bucket = self._free.get(cls)
            raw = bucket.pop() if bucket else None
            if raw is not None:
                self.cached_bytes -= cls
                self.hits += 1
            else:
                self.misses += 1
        if raw is None:
            raw = np.empty(cls, np.uint8)
        return raw[:nbytes].view(np_dtype).reshape(shape)

    def free_last(self, arrays: list) -> bool:
        """Pop the last array of `arrays` and return its buffer to the cache, if it came from
        here and nobody else holds it.  (The array is taken out of the caller's list so that
        no reference but ours remains when the count is checked.)"""
        array = arrays.pop()
        raw = getattr(array, "base", None)
        del array
        if raw is None or raw.dtype != np.uint8 or raw.ndim != 1 or raw.base is not None:
            return False
        cls = raw.shape[0]
        if cls < LARGE or size_class(cls) != cls:
            return False
        # References now: `raw` here and getrefcount's argument (the baseline), plus one per
        # live view of the buffer anywhere else.
        if sys.getrefcount(raw) > self._refs_when_unused():
            return False
        with self._lock:
            if self.cached_bytes + cls > self.limit_bytes:
                return False
            self._free.setdefault(cls, []).append(raw)
            self.cached_bytes += cls
        return True

    def _refs_when_unused(self) -> int:
        if self._baseline is None:
            raw = np.empty(LARGE, np.uint8)
            self._baseline = sys.getrefcount(raw)
        return self._baseline

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self.cached_bytes = 0
