"""Frozen tensor metadata: what meta inference consumes and produces."""

from __future__ import annotations

from typing import NamedTuple

from .dtype import DType


class TensorMeta(NamedTuple):
    shape: tuple[int, ...]
    dtype: DType

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


class SparseMeta(TensorMeta):
    """The meta of a sparse COO tensor (framework/functional/sparse.py): its logical shape
    and dtype, with no dense memory behind it.  It never equals a TensorMeta, so no cached
    dense call matches it, and op meta inference refuses it (OpDef.meta)."""

    __slots__ = ()

    def __eq__(self, other):
        return type(other) is SparseMeta and tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("sparse_coo", tuple.__hash__(self)))

