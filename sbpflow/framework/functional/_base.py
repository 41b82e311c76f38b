"""Shared plumbing for the functional API: calling ops by name, scalar routing, in-place forms.

Each family module (elementwise.py, reduce.py, ...) defines torch-signature functions and a
`METHODS` dict of Tensor methods; `functional/__init__.py` installs them on Tensor.
"""

from __future__ import annotations

from ...ops import registry
from .. import interpreter
from ..tensor import Tensor

_apply = interpreter.apply
_get = registry.get


def call(name: str, *inputs, **attrs):
    """Run op `name` on tensor inputs with attrs."""
    return _apply(_get(name), inputs, attrs)


def inplace_method(name: str, fn):
    """The in-place Tensor method `name` (e.g. "add_") of the out-of-place function fn."""

    def method(self, *args, **kwargs):
        return interpreter.inplace(name, self, fn, args, kwargs)

    method.__name__ = name
    return method


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def is_scalar(x) -> bool:
    return isinstance(x, (bool, int, float)) or (
        hasattr(x, "dtype") and hasattr(x, "item") and getattr(x, "ndim", 1) == 0
        and not isinstance(x, Tensor)
    )


def as_tensor_arg(op: str, arg: str, x, like: Tensor | None = None) -> Tensor:
    """Accept a Tensor; wrap a Python number as a 0-dim tensor; reject anything else."""
    if isinstance(x, Tensor):
        return x
    if is_scalar(x):
        from .creation import scalar_tensor

        if like is not None and like._gl is not None:
            # A number next to a global tensor is the same on every rank: broadcast.
            from ..global_tensor import GlobalDevice

            return scalar_tensor(x, device=GlobalDevice(like._gl.placement))
        return scalar_tensor(x, device=None if like is None else like.device)
    raise TypeError(f"{op}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def shape_args(op: str, args) -> tuple[int, ...]:
    """Accept f(2, 3), f((2, 3)), f([2, 3]) or f(Size)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for a in args:
        if type(a) is not int:
            break
    else:
        return args if type(args) is tuple else tuple(args)  # the common case: plain ints
    for a in args:
        if not isinstance(a, int) or isinstance(a, bool):
            if isinstance(a, Tensor) and a.numel() == 1 and not a.dtype.is_floating_point:
                continue
            raise TypeError(f"{op}(): argument 'size' must be tuple of ints, but found element "
                            f"of type {type(a).__name__}")
    return tuple(int(a) for a in args)
