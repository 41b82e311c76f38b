"""`Variable`, the pre-0.4 wrapper that torch keeps for old programs (`torch.autograd.Variable`).

Tensors carry autograd state themselves, so `Variable(t)` is a new tensor sharing t's memory,
detached from t's graph, that requires grad only when asked; and every tensor is a Variable
to `isinstance`.
"""

from __future__ import annotations

import warnings

from . import function as _function  # the framework layer installs the Tensor type there


class VariableMeta(type):
    def __instancecheck__(cls, obj):
        return _function._tensor_type is not None and isinstance(obj, _function._tensor_type)


class Variable(metaclass=VariableMeta):
    def __new__(cls, data=None, requires_grad=False, volatile=False):
        tensor_type = _function._tensor_type
        if data is None:
            data = tensor_type()
        elif not isinstance(data, tensor_type):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use `with "
                          "torch.no_grad():` instead.", UserWarning, stacklevel=2)
        return data.detach().requires_grad_(requires_grad)


__all__ = ["Variable"]
