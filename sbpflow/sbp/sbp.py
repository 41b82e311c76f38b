"""Split / Broadcast / Partial-sum: frozen, hashable values that print as OneFlow does."""

from __future__ import annotations

from typing import NamedTuple


class Sbp:
    """The type of every SBP value (OneFlow's `flow.sbp.sbp`).

    Every value is an interned singleton: `Broadcast() is B`, `PartialSum() is P` and
    `Split(i) is S(i)`, also after pickling and copying. Equality is identity (object's own
    `==` and hash, in C), so SBP tuples in cache keys and signature checks compare cheaply.
    """

    __slots__ = ()

    def __call__(self):
        """OneFlow lets an SBP value be called: `flow.sbp.broadcast()` is `broadcast`."""
        return self

    def __setattr__(self, name, value):
        raise AttributeError("SBP values are immutable")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class Split(Sbp):
    """S(axis): the logical tensor is cut along `axis`; the first ranks get one more row."""

    __slots__ = ("axis",)
    _interned: dict = {}

    def __new__(cls, axis: int):
        hit = cls._interned.get(axis) if type(axis) is int else None
        if hit is not None:
            return hit
        if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
            raise ValueError(f"split(): axis must be a non-negative int, got {axis!r}")
        self = object.__new__(cls)
        object.__setattr__(self, "axis", int(axis))
        # setdefault: two threads making the same new axis at once still get one object.
        return cls._interned.setdefault(int(axis), self)

    def __reduce__(self):
        return (Split, (self.axis,))

    def __repr__(self):
        return f"S({self.axis})"


class _Unique(Sbp):
    """An SBP value without parameters: its class has one instance, also after unpickling."""

    __slots__ = ()

    def __new__(cls):
        the = cls.__dict__.get("_the")
        if the is None:  # made once, at import (B and P below)
            the = object.__new__(cls)
            cls._the = the
        return the

    def __reduce__(self):
        return (type(self), ())


class Broadcast(_Unique):
    """B: every rank holds the whole logical tensor."""

    __slots__ = ()

    def __repr__(self):
        return "B"


class PartialSum(_Unique):
    """P: the logical tensor is the sum of the ranks' tensors."""

    __slots__ = ()

    def __repr__(self):
        return "P"


B = broadcast = Broadcast()
P = partial_sum = PartialSum()
for _axis in range(8):  # the common axes exist up front
    Split(_axis)
del _axis


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
