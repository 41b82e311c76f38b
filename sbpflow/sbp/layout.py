"""Where each rank's piece of a global tensor lies in the logical tensor.

An nd-SBP is a tuple with one SBP per placement grid axis. Splitting is nested, axis by axis
(OneFlow's slice views): grid axis 0 cuts the logical tensor first, then grid axis 1 cuts each
of those pieces. Splits are balanced: the first ranks get one more row, as
`torch.tensor_split` does, so 5 rows on 4 ranks are 2, 1, 1, 1.
"""

from __future__ import annotations

from functools import lru_cache

from .placement import Placement
from .sbp import B, P, Sbp, Split

NdSbp = tuple  # one Sbp per grid axis; a plain tuple, so it is frozen and hashable


def balanced_bounds(total: int, parts: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each of `parts` balanced pieces of `total` rows."""
    q, r = divmod(total, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + q + (i < r)
        out.append((start, stop))
        start = stop
    return tuple(out)


def normalize_sbp(sbp, placement: Placement, op: str = "to_global", arg: str = "sbp") -> NdSbp:
    """An SBP or a list of them, checked against the placement's grid: one per axis."""
    if isinstance(sbp, Sbp):
        sbp = (sbp,)
    elif isinstance(sbp, (list, tuple)):
        sbp = tuple(sbp)
    else:
        raise TypeError(f"{op}(): argument '{arg}' must be an SBP (sbpflow.sbp.split(i), "
                        f"broadcast, partial_sum) or a tuple of them, got {sbp!r}")
    for x in sbp:
        if not isinstance(x, Sbp):
            raise TypeError(f"{op}(): argument '{arg}' must hold SBP values, got {x!r}")
    if len(sbp) != placement.ndim:
        raise ValueError(
            f"{op}(): argument '{arg}' has {len(sbp)} entr{'y' if len(sbp) == 1 else 'ies'} "
            f"{_fmt(sbp)} but the placement's hierarchy {list(placement.hierarchy)} has "
            f"{placement.ndim} ax{'is' if placement.ndim == 1 else 'es'}: give one SBP per axis"
        )
    return sbp


def check_split_axes(nd_sbp: NdSbp, ndim: int, op: str = "to_global", arg: str = "sbp") -> None:
    for x in nd_sbp:
        if isinstance(x, Split) and x.axis >= ndim:
            raise IndexError(
                f"{op}(): argument '{arg}' splits axis {x.axis} of a {ndim}-d tensor "
                f"(expected an axis in [0, {ndim - 1}])" if ndim else
                f"{op}(): argument '{arg}' cannot split a 0-d tensor (got {_fmt(nd_sbp)})"
            )


@lru_cache(maxsize=8192)
def piece(shape: tuple, placement: Placement, nd_sbp: NdSbp, rank: int) -> tuple[slice, ...]:
    """The slice of the logical tensor (one per tensor axis) held by `rank`."""
    bounds = [(0, n) for n in shape]
    coords = placement.coords(rank)
    hierarchy = placement.hierarchy
    for k, x in enumerate(nd_sbp):
        if isinstance(x, Split):
            lo, hi = bounds[x.axis]
            a, b = balanced_bounds(hi - lo, hierarchy[k])[coords[k]]
            bounds[x.axis] = (lo + a, lo + b)
    return tuple(slice(lo, hi) for lo, hi in bounds)


def local_shape(shape: tuple, placement: Placement, nd_sbp: NdSbp, rank: int) -> tuple:
    """The shape of `rank`'s piece; () -> () and empty pieces are allowed."""
    if not placement.has(rank):
        return (0,) if not shape else tuple(0 for _ in shape)
    return tuple(s.stop - s.start for s in piece(shape, placement, nd_sbp, rank))


def dual(nd_sbp: NdSbp) -> NdSbp:
    """The SBP a gradient takes by default: B <-> P, S(i) stays S(i)."""
    return tuple(P if x == B else B if x == P else x for x in nd_sbp)


def is_all(nd_sbp: NdSbp, value: Sbp) -> bool:
    return all(x == value for x in nd_sbp)


def _fmt(nd_sbp) -> str:
    return "(" + ", ".join(map(repr, nd_sbp)) + ("," if len(nd_sbp) == 1 else "") + ")"


fmt_sbp = _fmt
