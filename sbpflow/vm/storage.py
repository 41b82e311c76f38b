"""Blobs and storages: what instructions read and write.

A `Blob` is one tensor's array, filled in by the instruction that produces it (or at once, for
data from the host).  A `Storage` is the memory a base tensor and its views share: it carries
the version counter autograd checks and the dependence record the VM orders by — the last
write, and the latest read on each stream since then.  A write waits for both; a read waits
for the last write.  When the last reference to a storage goes, a release instruction frees
its memory after its last use.
"""

from __future__ import annotations


class Blob:
    __slots__ = ("array", "error", "producer", "__weakref__")

    def __init__(self, array=None):
        self.array = array
        self.error = None  # the exception of the instruction that failed to produce it
        self.producer = None  # (stream, seq) of the instruction that fills `array`


class Storage:
    __slots__ = ("version", "last_write", "reads", "root", "prims", "__weakref__")

    def __init__(self, prims=None):
        self.version = 0
        # The device primitives whose allocator may own the memory (see PooledStorage).
        self.prims = prims
        self.last_write = None  # (stream, seq) of the last instruction that wrote here
        self.reads = None  # {stream: seq} of the latest reads since that write
        self.root = None  # the blob whose array owns the memory (for release)


class PooledStorage(Storage):
    """A storage whose buffer may come from the device's caching allocator: when it dies, a
    release instruction hands the buffer back after its last use.  (A buffer too small to be
    recycled gets a plain `Storage`, whose death costs nothing: no finalizer runs.)"""

    __slots__ = ()

    def __del__(self):
        if self.last_write is not None or self.reads:
            _release_hook(self)


def _no_release(storage):
    pass


_release_hook = _no_release


def set_release_hook(fn) -> None:
    global _release_hook
    _release_hook = fn
