"""Reduction functions."""

from __future__ import annotations

from ._base import call


def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001 - torch's name
    return call("sum", input, dim=dim, keepdim=keepdim, dtype=dtype)


METHODS = {"sum": sum}

__all__ = ["sum"]
