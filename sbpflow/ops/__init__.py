"""The op registry.  Importing this package registers every op."""

from . import creation, elementwise, linalg, reduce, shape  # noqa: F401  (registration)
from .registry import Attr, KernelContext, OpDef, Sample, get, list_ops, op, register

__all__ = ["Attr", "KernelContext", "OpDef", "Sample", "get", "list_ops", "op", "register"]
