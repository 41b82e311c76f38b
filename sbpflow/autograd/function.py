"""Custom autograd functions: subclass `Function`, write static `forward` and `backward`."""

from __future__ import annotations

from .grad_mode import is_grad_enabled, no_grad
from .node import Node, SavedTensor

_tensor_type = None  # installed by the framework layer


def set_tensor_type(cls) -> None:
    global _tensor_type
    _tensor_type = cls


class FunctionCtx:
    def __init__(self):
        self._saved = ()
        self.needs_input_grad = ()
        self._dirty = ()
        self._non_differentiable = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        self._saved = tuple(None if t is None else SavedTensor(t, "CustomFunction")
                            for t in tensors)

    @property
    def saved_tensors(self):
        return tuple(None if s is None else s.unpack() for s in self._saved)

    def mark_dirty(self, *tensors):
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors):
        self._non_differentiable = tensors

    def set_materialize_grads(self, value: bool):
        self.materialize_grads = value


class FunctionNode(Node):
    __slots__ = ("fn", "ctx", "in_metas", "out_metas", "_name")

    def __init__(self, fn, ctx, next_functions, in_metas, out_metas):
        super().__init__(next_functions)
        self.fn = fn
        self.ctx = ctx
        self.in_metas = in_metas
        self.out_metas = out_metas
        self._name = fn.__name__ + "Backward"

    def name(self):
        return self._name

    @property
    def materialize_grads(self) -> bool:
        return self.ctx.materialize_grads

    def apply(self, grads):
        result = self.fn.backward(self.ctx, *grads)
        if not isinstance(result, tuple):
            result = (result,)
        n_args = self.ctx._num_args
        # torch: one gradient per forward argument; extra trailing entries must be None.
        if len(result) < n_args or any(r is not None for r in result[n_args:]):
            raise RuntimeError(
                f"function {self._name} returned an incorrect number of gradients (expected "
                f"{n_args}, got {len(result)})"
            )
        # backward returns one value per forward argument; keep those of tensor arguments.
        return [result[i] if i < len(result) else None for i in self.ctx._tensor_arg_pos]

    def release(self):
        self.ctx._saved = None


class _FunctionMeta(type):
    pass


class Function(metaclass=_FunctionMeta):
    """torch.autograd.Function: `MyFn.apply(*args)` runs forward and records MyFn.backward."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args):
        T = _tensor_type
        ctx = FunctionCtx()
        tensor_pos = [i for i, a in enumerate(args) if isinstance(a, T)]
        tensors = [args[i] for i in tensor_pos]
        ctx._tensor_arg_pos = tensor_pos
        ctx._num_args = len(args)
        ctx.needs_input_grad = tuple(isinstance(a, T) and a.requires_grad for a in args)
        with no_grad():
            out = cls.forward(ctx, *args)
        record = is_grad_enabled() and any(t.requires_grad for t in tensors)
        if not record:
            return out
        outs = out if isinstance(out, tuple) else (out,)
        from .engine import _edge  # local: engine imports ops at module import

        next_functions = [_edge(t) if t.requires_grad else None for t in tensors]
        node = FunctionNode(cls, ctx, next_functions, [t._meta for t in tensors], [])
        non_diff = {id(t) for t in ctx._non_differentiable}
        wrapped = []
        for i, o in enumerate(outs):
            if isinstance(o, T):
                if any(o is t for t in tensors) and not any(o is d for d in ctx._dirty):
                    o = o.detach()  # returning an input unchanged makes a new alias
                if id(o) not in non_diff and o.dtype.is_floating_point:
                    o._set_grad_fn(node, i)
            wrapped.append(o)
        node.out_metas = [o._meta for o in wrapped if isinstance(o, T)]
        return tuple(wrapped) if isinstance(out, tuple) else wrapped[0]


class once_differentiable:  # noqa: N801 - torch's name
    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, cls):
        return self.fn
