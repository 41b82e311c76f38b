"""The op registry.  Importing this package registers every op."""

from . import (  # noqa: F401
    batch_norm,
    conv,
    creation,
    elementwise,
    embedding,
    fused,
    index,
    linalg,
    nn,
    optim,
    reduce,
    resample,
    rnn,
    shape,
    sparse,
)
from .registry import Attr, KernelContext, OpDef, Sample, get, list_ops, op, register

__all__ = ["Attr", "KernelContext", "OpDef", "Sample", "get", "list_ops", "op", "register"]
