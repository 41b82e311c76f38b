"""NumPy's argument names `axis` and `keepdims`, which torch's native functions and Tensor
methods take for `dim` and `keepdim` (`P.sum(1, keepdims=True)`), against torch 2.13."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework import functional

A = np.arange(24, dtype=np.float32).reshape(2, 3, 4) % 7

CALLS = [
    "x.sum(axis=1)", "x.sum(1, keepdims=True)", "lib.sum(x, axis=-1, keepdims=True)",
    "x.mean(axis=0, keepdims=True)", "x.std(axis=2)", "x.var(0, keepdims=True)",
    "lib.amax(x, axis=(0, 2))", "x.max(axis=1).values", "x.max(axis=1, keepdims=True).indices",
    "lib.argmax(x, axis=1)", "x.logsumexp(axis=2)", "x.cumsum(axis=1)", "x.prod(axis=0)",
    "lib.cat([x, x], axis=1)", "lib.stack([x, x], axis=0)", "x.unsqueeze(axis=0)",
    "x.squeeze(axis=0)", "x.softmax(axis=1)", "lib.softmax(x, axis=1)",
    "lib.log_softmax(x, axis=-1)", "x.flip(1).sort(axis=1).values", "x.topk(2, axis=1).values",
    "x.chunk(3, axis=1)[1]", "lib.unflatten(x, axis=2, sizes=(2, 2))", "x.size(axis=2)",
    "x.stride(axis=1)",
    # torch's Python-level functions and torch.nn.functional take no alias
    "x.split(1, axis=1)", "lib.nn.functional.softmax(x, axis=1)",
    "x.unflatten(axis=2, sizes=(2, 2))", "x.norm(axis=1)",
    # an alias with its own name is an error
    "x.sum(dim=1, axis=1)",
]


def _outcome(lib, expr):
    x = lib.tensor(A)
    try:
        r = eval(expr, {"lib": lib, "x": x})  # noqa: S307 - the test's own expressions
    except TypeError:
        return "TypeError"
    return r.numpy() if isinstance(r, lib.Tensor) else r


@pytest.mark.parametrize("expr", CALLS)
def test_numpy_names_accepted_where_torch_accepts_them(expr):
    got, want = _outcome(flow, expr), _outcome(torch, expr)
    if isinstance(want, str):
        assert got == want
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_x_sum_keepdims_has_the_grad_of_keepdim():
    xs = [lib.tensor(A, requires_grad=True) for lib in (flow, torch)]
    for x in xs:
        (x.sum(axis=1, keepdims=True) * x[:, :1, :]).sum().backward()
    np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy())


def _is_native(fn) -> bool:
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # a builtin without a Python signature: torch's argument parser
    return False


def _takes_numpy_names(fn, params) -> bool:
    """Wrapped with the aliases, or taking them itself (sum and mean, the hot reductions)."""
    return hasattr(fn, "_numpy_names") or "axis" in params


def test_aliases_go_exactly_to_torchs_native_functions():
    """Every function or method given the aliases is native in torch (whose parser takes them),
    and every function or method with a `dim` left without them is Python-level in torch."""
    checked = 0
    for owner, theirs, names in ((flow, torch, functional.__all__),
                                 (flow.Tensor, torch.Tensor, dir(flow.Tensor))):
        for name in names:
            ours = getattr(owner, name)
            if name.startswith("_") or not callable(ours) or not hasattr(theirs, name):
                continue
            try:
                params = inspect.signature(ours).parameters
            except (TypeError, ValueError):
                continue
            if "dim" not in params and "keepdim" not in params:
                continue
            checked += 1
            assert _takes_numpy_names(ours, params) == _is_native(getattr(theirs, name)), name
    assert checked > 60


def test_functions_taking_numpy_names_still_pickle_by_name():
    for fn in (flow.sum, flow.cat, flow.softmax, flow.Tensor.sum, flow.Tensor.size,
               flow.Tensor.max):
        assert _takes_numpy_names(fn, inspect.signature(fn).parameters)
        assert pickle.loads(pickle.dumps(fn)) is fn
