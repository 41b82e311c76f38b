"""The op registry.  Importing this package registers every op."""

from . import conv, creation, elementwise, index, linalg, nn, optim, reduce, shape  # noqa: F401
from .registry import Attr, KernelContext, OpDef, Sample, get, list_ops, op, register

__all__ = ["Attr", "KernelContext", "OpDef", "Sample", "get", "list_ops", "op", "register"]
