"""`flow.utils.global_view`: OneFlow's helpers for turning a local program global.

`to_global(obj, placement, sbp)` and `to_local(obj)` convert every tensor in a nested
structure (dict, list, tuple, a module's parameters and buffers); `global_mode(True,
placement=, sbp=)` is a scope in which factories (`flow.randn`, `zeros`, `tensor`, ...)
without a placement make global tensors, and a global tensor's `.device` is its placement's
device type.
"""

from __future__ import annotations

import warnings

from ..framework import global_tensor as _gt
from ..framework.tensor import Tensor
from ..sbp import Placement, normalize_sbp

__all__ = ["current_global_mode", "global_mode", "to_global", "to_local"]


def _walk(obj, convert, what: str, warn: bool):
    """obj with convert applied to every tensor leaf (containers rebuilt, modules in place)."""
    if isinstance(obj, Tensor):
        return convert(obj)
    if obj is None:
        return None
    if _is_module(obj):
        for m in obj.modules():
            for p in m._parameters.values():
                if p is not None:
                    new = convert(p)
                    if new is not p:
                        requires_grad = p.requires_grad
                        Tensor._alias(p, new)  # the parameter objects stay (optimizers)
                        p.requires_grad = requires_grad
            for key, b in m._buffers.items():
                if b is not None:
                    m._buffers[key] = convert(b)
        return obj
    if isinstance(obj, dict):
        return type(obj)((k, _walk(v, convert, what, warn)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_walk(v, convert, what, warn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(v, convert, what, warn) for v in obj)
    if warn:
        warnings.warn(f"{what}(): a leaf of type {type(obj).__name__} is not a tensor; it is "
                      "returned unchanged", stacklevel=3)
    return obj


def to_global(input, placement=None, sbp=None, warn_on_non_tensor_leaf: bool = True,  # noqa: A002
              **kwargs):
    """Convert the tensor(s) in `input` (a tensor, or nested dict/list/tuple, or a module)
    to global tensors.  A local tensor needs both placement and sbp (it is this rank's piece,
    as in Tensor.to_global); a global one needs at least one of them.  `sbp` may be a
    function of the tensor giving its SBP.  Extra keyword arguments go to
    Tensor.to_global (grad_sbp, check_meta, copy)."""
    def convert(t):
        s = sbp(t) if callable(sbp) and not _is_sbp(sbp) else sbp  # SBPs are callable too
        if t.is_local and (placement is None or s is None):
            raise ValueError("to_global(): a local tensor needs both placement and sbp")
        if t.is_global and placement is None and s is None:
            raise ValueError("to_global(): give a placement or an sbp (or both) for a global "
                             "tensor")
        return t.to_global(placement, s, **kwargs)

    return _walk(input, convert, "to_global", warn_on_non_tensor_leaf)


def _is_module(x) -> bool:
    # nn sits beside utils in the layers: recognise a module by its registries.
    return hasattr(x, "_parameters") and hasattr(x, "_buffers") and hasattr(x, "modules")


def _is_sbp(x) -> bool:
    from ..sbp import Sbp

    return isinstance(x, Sbp)


def to_local(input, copy: bool = False):  # noqa: A002
    """This rank's piece of every global tensor in `input` (tensor, nested dict/list/tuple,
    or module); local tensors are returned as they are."""
    def convert(t):
        return t.to_local(copy=copy) if t.is_global else t

    return _walk(input, convert, "to_local", True)


class global_mode:  # noqa: N801 - OneFlow's name
    """`with global_mode(True, placement=p, sbp=s):` factories without a placement make
    global tensors on p with s, and `.device` of a global tensor is p's device.
    `global_mode(False)` turns it off inside an enclosing scope.  The previous mode comes
    back on exit."""

    def __init__(self, enabled: bool, placement=None, sbp=None):
        enabled = bool(enabled)
        if enabled:
            if placement is None or sbp is None:
                raise ValueError("global_mode(): both placement and sbp are required when "
                                 "the global mode is enabled")
            if not isinstance(placement, Placement):
                raise TypeError("global_mode(): argument 'placement' must be "
                                f"sbpflow.placement, got {type(placement).__name__}")
            sbp = normalize_sbp(sbp, placement, "global_mode")
        self._mode = _gt.GlobalMode(enabled, placement if enabled else None,
                                    sbp if enabled else None)
        self._old = []

    def __enter__(self):
        self._old.append(_gt.set_global_mode(self._mode))
        return self

    def __exit__(self, *exc):
        _gt.set_global_mode(self._old.pop())
        return False


def current_global_mode():
    """The global mode in force: `.is_enabled`, `.placement`, `.sbp` (a tuple of SBPs)."""
    return _gt.current_global_mode()
