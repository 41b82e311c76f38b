"""torch.nn.parameter: Parameter, Buffer; lazy (uninitialized) parameters are not offered."""

from __future__ import annotations

from ..framework.parameter import Parameter
from ..framework.tensor import Tensor

__all__ = ["Buffer", "Parameter", "UninitializedBuffer", "UninitializedParameter",
           "UninitializedTensorMixin", "is_lazy"]


class _BufferMeta(type):
    # torch: a Buffer is a plain tensor marked `_is_buffer`; isinstance checks the mark.
    def __instancecheck__(cls, instance):
        if cls is Buffer:
            return isinstance(instance, Tensor) and getattr(instance, "_is_buffer", False)
        return super().__instancecheck__(instance)


class Buffer(metaclass=_BufferMeta):
    """Mark a tensor as a module buffer: `module.name = nn.Buffer(t, persistent=True)`
    registers it (persistent buffers go into the state dict)."""

    def __new__(cls, data: Tensor | None = None, *, persistent: bool = True):
        if data is None:
            from ..framework.functional.creation import empty

            data = empty(0)
        t = data.detach().requires_grad_(data.requires_grad)
        t.persistent = persistent
        t._is_buffer = True
        return t


def _lazy_not_supported(kind: str):
    raise NotImplementedError(
        f"{kind}: lazy modules (parameters whose shape is inferred at the first forward) are "
        "not implemented in sbpflow; give the layer its input size")


class UninitializedTensorMixin:
    pass


class UninitializedParameter(UninitializedTensorMixin, Parameter):
    def __new__(cls, requires_grad: bool = True, device=None, dtype=None):
        _lazy_not_supported("UninitializedParameter")


class UninitializedBuffer(UninitializedTensorMixin, Tensor):
    def __new__(cls, requires_grad: bool = False, device=None, dtype=None, persistent=True):
        _lazy_not_supported("UninitializedBuffer")


def is_lazy(param) -> bool:
    """Whether param is an uninitialized (lazy) parameter: never, in sbpflow."""
    return isinstance(param, UninitializedTensorMixin)
