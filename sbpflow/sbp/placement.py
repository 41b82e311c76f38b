"""Placements: a device type plus the ranks that hold a global tensor.

Nested ranks give a hierarchy: `placement("cpu", [[0, 1], [2, 3]])` is a 2x2 grid, and an
nd-SBP then gives one SBP per grid axis. A placement is frozen and hashable, so signature
inference and boxing routes can be cached on it.
"""

from __future__ import annotations

import numpy as np

from .. import comm as _comm
from ..device import Device


class Placement:
    __slots__ = ("type", "device", "_grid", "_flat", "_hash", "_index")

    def __init__(self, type: str = "cpu", ranks=None):  # noqa: A002 - OneFlow's argument name
        if ranks is None:
            raise TypeError("placement(): missing required argument 'ranks'")
        if not isinstance(type, str):
            raise TypeError(f"placement(): argument 'type' must be str, not {_tname(type)}")
        device = Device(type)  # raises for an unknown device type
        if isinstance(ranks, range):
            ranks = list(ranks)
        grid = np.asarray(ranks, dtype=object) if not isinstance(ranks, int) else None
        if grid is None or grid.ndim == 0:
            raise TypeError(
                f"placement(): argument 'ranks' must be a list of ranks (nested for a "
                f"hierarchy), got {ranks!r}"
            )
        flat = grid.reshape(-1).tolist()
        if grid.size == 0 or not all(_is_rank(r) for r in flat):
            raise ValueError(
                f"placement(): argument 'ranks' must be a non-empty (nested) list of "
                f"non-negative ints of equal lengths, got {ranks!r}"
            )
        if len(set(flat)) != len(flat):
            raise ValueError(f"placement(): ranks must be distinct, got {ranks!r}")
        world = _comm.get_world_size()
        if max(flat) >= world:
            raise ValueError(
                f"placement(): rank {max(flat)} is out of range: the job has {world} "
                f"rank{'s' if world != 1 else ''} (0..{world - 1})"
            )
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "device", device)  # where each rank's piece lives
        object.__setattr__(self, "_grid", np.asarray(flat, dtype=np.int64).reshape(grid.shape))
        object.__setattr__(self, "_flat", tuple(int(r) for r in flat))
        object.__setattr__(self, "_hash", hash((type, self._flat, grid.shape)))
        object.__setattr__(self, "_index", {r: i for i, r in enumerate(self._flat)})

    def __setattr__(self, name, value):
        raise AttributeError("placement is immutable")

    @classmethod
    def all(cls, type: str = "cpu") -> Placement:  # noqa: A002
        """Every rank of the job, as a 1-D placement."""
        return cls(type, list(range(_comm.get_world_size())))

    # -- the grid ---------------------------------------------------------------------------
    @property
    def ranks(self) -> list:
        """The ranks, nested as given (a list of lists for a 2-D hierarchy)."""
        return self._grid.tolist()

    @property
    def hierarchy(self) -> tuple[int, ...]:
        return tuple(self._grid.shape)

    @property
    def ndim(self) -> int:
        return self._grid.ndim

    @property
    def size(self) -> int:
        return len(self._flat)

    @property
    def rank_list(self) -> tuple[int, ...]:
        """The ranks in row-major grid order (OneFlow's parallel ids)."""
        return self._flat

    def has(self, rank: int) -> bool:
        return rank in self._index

    def index_of(self, rank: int) -> int:
        """The parallel id of `rank`: its position in row-major grid order."""
        return self._index[rank]

    def coords(self, rank: int) -> tuple[int, ...]:
        """`rank`'s position in the grid."""
        return tuple(int(c) for c in np.unravel_index(self._index[rank], self._grid.shape))

    def rank_at(self, coords) -> int:
        return int(self._grid[tuple(coords)])

    def axis_ranks(self, rank: int, axis: int) -> tuple[int, ...]:
        """The ranks that share `rank`'s coordinates on every grid axis except `axis`."""
        index = list(self.coords(rank))
        index[axis] = slice(None)
        return tuple(int(r) for r in self._grid[tuple(index)])

    def flatten(self) -> Placement:
        """The same ranks as a 1-D placement."""
        return self if self.ndim == 1 else Placement(self.type, list(self._flat))

    # -- value semantics ----------------------------------------------------------------
    def __eq__(self, other):
        return (isinstance(other, Placement) and self.type == other.type
                and self._flat == other._flat and self._grid.shape == other._grid.shape)

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        """Pickles by value (OneFlow's placements do): unpickling checks the ranks against
        the job it lands in."""
        return (Placement, (self.type, self.ranks))

    def __copy__(self):
        return self  # immutable

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f'sbpflow.placement(type="{self.type}", ranks={self.ranks})'

    __str__ = __repr__


def _is_rank(r) -> bool:
    return (isinstance(r, (int, np.integer)) and not isinstance(r, (bool, np.bool_))
            and r >= 0)


def _tname(x) -> str:
    return type(x).__name__


placement = Placement
