"""Printing tensors the way torch does."""

from __future__ import annotations

import numpy as np


def tensor_repr(t) -> str:
    host = t._host()
    body = np.array2string(np.asarray(host, dtype=np.float64 if t.dtype.is_floating_point
                                      else host.dtype), separator=", ", prefix="tensor(")
    extras = []
    if t.dtype.name not in ("float32", "int64", "bool"):
        extras.append(f"dtype=sbpflow.{t.dtype.name}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
