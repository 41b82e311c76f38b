"""torch.backends.cudnn: no cuDNN here; the flags are kept as set (they select nothing)."""

from __future__ import annotations

import contextlib
import sys

__all__ = ["allow_tf32", "benchmark", "benchmark_limit", "deterministic", "enabled", "flags",
           "is_acceptable", "is_available", "version"]

enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    return False


def version():
    return None


def is_acceptable(tensor) -> bool:
    return False


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False,
          allow_tf32=True):
    """Set the flags inside the block and restore them after it."""
    mod = sys.modules[__name__]
    names = ("enabled", "benchmark", "benchmark_limit", "deterministic", "allow_tf32")
    old = {n: getattr(mod, n) for n in names}
    new = dict(zip(names, (enabled, benchmark, benchmark_limit, deterministic, allow_tf32)))
    for n, v in new.items():
        if v is not None:
            setattr(mod, n, v)
    try:
        yield
    finally:
        for n, v in old.items():
            setattr(mod, n, v)
