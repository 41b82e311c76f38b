"""Parameter: a leaf tensor that modules register as a learnable weight."""

from __future__ import annotations

from .tensor import Tensor


class Parameter(Tensor):
    """A tensor sharing the data of `data`, requiring grad by default."""

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True):
        if data is None:
            from .functional.creation import empty

            data = empty(0)
        p = object.__new__(cls)
        Tensor._alias(p, data)
        p.requires_grad = requires_grad
        return p

    def __init__(self, data=None, requires_grad: bool = True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def numpy(self):
        """OneFlow allows numpy() on a Parameter (its value, outside autograd)."""
        return self._host()

    __str__ = __repr__  # print(p) shows the header too, as torch's

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        out = Parameter(self.detach().clone(), self.requires_grad)
        memo[id(self)] = out
        return out

    def __reduce_ex__(self, proto):
        return (Parameter, (self.detach(), self.requires_grad))
