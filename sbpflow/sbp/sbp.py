"""Split / Broadcast / Partial-sum: frozen, hashable values that print as OneFlow does."""

from __future__ import annotations

from typing import NamedTuple


class Sbp:
    """The type of every SBP value (OneFlow's `flow.sbp.sbp`)."""

    __slots__ = ()

    def __call__(self):
        """OneFlow lets an SBP value be called: `flow.sbp.broadcast()` is `broadcast`."""
        return self


class Split(Sbp):
    """S(axis): the logical tensor is cut along `axis`; the first ranks get one more row."""

    __slots__ = ("axis", "_hash")
    _interned: dict = {}

    def __new__(cls, axis: int):
        # One object per axis: SBP tuples in cache keys then compare by identity first.
        hit = cls._interned.get(axis) if type(axis) is int else None
        if hit is not None:
            return hit
        if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
            raise ValueError(f"split(): axis must be a non-negative int, got {axis!r}")
        self = object.__new__(cls)
        object.__setattr__(self, "axis", int(axis))
        object.__setattr__(self, "_hash", hash(("S", int(axis))))
        cls._interned[int(axis)] = self
        return self

    def __setattr__(self, name, value):
        raise AttributeError("SBP values are immutable")

    def __eq__(self, other):
        return other is self or (isinstance(other, Split) and other.axis == self.axis)

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        return (Split, (self.axis,))

    def __repr__(self):
        return f"S({self.axis})"


class Broadcast(Sbp):
    """B: every rank holds the whole logical tensor."""

    __slots__ = ()

    def __repr__(self):
        return "B"

    def __eq__(self, other):
        return isinstance(other, Broadcast)

    def __hash__(self):
        return hash("B")


class PartialSum(Sbp):
    """P: the logical tensor is the sum of the ranks' tensors."""

    __slots__ = ()

    def __repr__(self):
        return "P"

    def __eq__(self, other):
        return isinstance(other, PartialSum)

    def __hash__(self):
        return hash("P")


B = broadcast = Broadcast()
P = partial_sum = PartialSum()


def S(axis: int) -> Split:
    return Split(axis)


split = S


class Signature(NamedTuple):
    """One SBP per input and one per output of an op.

    `even` lists tensors (inputs first, then outputs, by position) whose split must cut the
    axis evenly: a reshape that merges the split axis with the next keeps the split only when
    every rank's piece is a whole number of rows of both shapes.  Inference applies it with
    the number of ranks cutting that axis (`sbp.infer`).
    """

    inputs: tuple[Sbp, ...]
    outputs: tuple[Sbp, ...]
    even: tuple[int, ...] = ()

    def __repr__(self):
        ins = ", ".join(map(repr, self.inputs))
        outs = ", ".join(map(repr, self.outputs))
        cond = f" if {', '.join(map(str, self.even))} even" if self.even else ""
        return f"({ins}) -> ({outs}){cond}"
