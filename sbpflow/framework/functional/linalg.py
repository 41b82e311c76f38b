"""Matrix products."""

from __future__ import annotations

from ._base import call


def matmul(input, other):
    return call("matmul", input, other)


METHODS = {"matmul": matmul, "__matmul__": matmul,
           "__rmatmul__": lambda self, other: matmul(other, self)}

__all__ = ["matmul"]
