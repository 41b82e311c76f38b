"""Autograd: grad mode, the backward engine, and custom functions."""

from __future__ import annotations

from ..ops.registry import op
from .engine import run_backward
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .variable import Variable


def _as_list(x):
    if x is None:
        return None
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _root_grads(roots, grads, create_graph):
    grads = _as_list(grads) or [None] * len(roots)
    if len(grads) != len(roots):
        raise RuntimeError(
            f"grad_tensors: got {len(grads)} tensors but {len(roots)} outputs were given"
        )
    out = []
    for t, g in zip(roots, grads):
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            g = op("full", shape=tuple(t.shape), fill_value=1.0, dtype=t.dtype,
                   _device=t._where())
        elif tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(
                f"Mismatch in shape: grad_output[0] has a shape of {list(g.shape)} and "
                f"output[0] has a shape of {list(t.shape)}."
            )
        out.append(g)
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = _as_list(tensors)
    if len(roots) == 1 and getattr(roots[0], "is_lazy", False):  # inside nn.Graph.build()
        g = _as_list(grad_tensors)
        return roots[0].backward(g[0] if g else None, retain_graph, create_graph, inputs)
    if retain_graph is None:
        retain_graph = create_graph
    grads = _root_grads(roots, grad_tensors, create_graph)
    if inputs is not None:
        inputs = _as_list(inputs)
        got = run_backward(roots, grads, retain_graph, create_graph, inputs, allow_unused=True)
        from .engine import _accumulate

        for t, g in zip(inputs, got):
            _accumulate(t, g, create_graph)
        return
    run_backward(roots, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    roots = _as_list(outputs)
    ins = _as_list(inputs)
    if retain_graph is None:
        retain_graph = create_graph
    grads = _root_grads(roots, grad_outputs, create_graph)
    got = run_backward(roots, grads, retain_graph, create_graph, ins, allow_unused)
    if not create_graph:
        got = [None if g is None else g.detach() for g in got]
    return tuple(got)


def variable(*args, **kwargs):
    # torch's name: this function shadows the `variable` submodule, as in torch.autograd
    raise RuntimeError("torch.autograd.variable(...) is deprecated, use torch.tensor(...) instead")


__all__ = [
    "Function", "FunctionCtx", "Variable", "backward", "enable_grad", "grad", "inference_mode",
    "is_grad_enabled", "no_grad", "once_differentiable", "set_grad_enabled", "variable",
]
