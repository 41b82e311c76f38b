"""Registers: the slots a task writes its results into and its consumers read.

A register of `register_num` slots is owned by its producer.  A slot is writable while it
sits in the producer's free list; once written it is sent to every consumer, and it becomes
writable again when all of them have returned it.
"""

from __future__ import annotations


class RegisterSlot:
    """One slot: the arrays it holds (aligned with its descriptor's blobs), the job instance
    they belong to, and how many consumers still read it."""

    __slots__ = ("reg", "index", "arrays", "inst", "readers", "persistent")

    def __init__(self, reg: int, index: int, arrays=None, persistent: bool = False):
        self.reg = reg
        self.index = index
        self.arrays = arrays
        self.inst = None
        self.readers = 0
        # Planned buffers (the input copy's) stay; other slots drop their arrays when freed,
        # so nothing outlives its step.
        self.persistent = persistent

    def __repr__(self):
        piece = None if self.inst is None else self.inst.piece
        return f"RegisterSlot(reg={self.reg}, index={self.index}, piece={piece})"


class Register:
    """The runtime side of a RegisterDesc: its slots."""

    __slots__ = ("desc", "slots")

    def __init__(self, desc, buffers=None):
        self.desc = desc
        if buffers is None:
            self.slots = [RegisterSlot(desc.id, i) for i in range(desc.register_num)]
        else:  # one list of preallocated arrays per slot
            self.slots = [RegisterSlot(desc.id, i, b, persistent=True)
                          for i, b in enumerate(buffers)]
