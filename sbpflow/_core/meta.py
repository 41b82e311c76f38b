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
