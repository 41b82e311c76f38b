"""Autograd keeps alive only what each grad rule reads (OpDef.saves), as torch's nodes do.

A chain of `h = h + 1` keeps no intermediate storage (torch's AddBackward saves nothing); a
chain of `h.exp()` keeps each output (ExpBackward saves its result).  torch is the oracle:
its saved-tensor hooks count what it packs for the same chain.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry
from sbpflow.ops.registry import OpDef, Sample
from sbpflow.vm import Storage

N = 200

# step(h, w): w is a constant tensor that needs no gradient.
CHAINS = {
    "add": lambda h, w: h + 1.0,
    "mul": lambda h, w: h * 2.0,
    "relu": lambda h, w: h.relu(),
    "exp": lambda h, w: h.exp(),
    "tanh_sub": lambda h, w: h.tanh() - 0.5,
    # mul saves `h` only for w's gradient (saves "input for other"), as torch does.
    "mul_const": lambda h, w: h * w,
    "matmul_const": lambda h, w: (h @ w.reshape(8, 1)).expand(8),
}


def _live_storages() -> int:
    flow.synchronize()
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Storage)


def _torch_saved(step, n) -> int:
    """How many chain-sized tensors torch's graph saves for n steps."""
    saved = []

    def pack(t):
        if t.dim() > 0:  # not the wrapped Python numbers
            saved.append(t)
        return t

    x = torch.full((8,), 0.1, dtype=torch.float64, requires_grad=True)
    w = torch.full((8,), 0.9, dtype=torch.float64)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = x
        for _ in range(n):
            h = step(h, w)
    return len({t.untyped_storage().data_ptr() for t in saved})


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_keeps_what_torch_keeps(name):
    step = CHAINS[name]
    x = flow.full((8,), 0.1, dtype=flow.float64, requires_grad=True)
    w = flow.full((8,), 0.9, dtype=flow.float64)
    base = _live_storages()
    h = x
    for _ in range(N):
        h = step(h, w)
    kept = _live_storages() - base  # includes h's own storage
    expected = _torch_saved(step, N)
    # torch counts h only when a node saves it; we always hold h.
    assert kept <= max(expected, 1) + 2, f"{name}: {kept} storages live, torch saves {expected}"
    if expected == 0:
        assert kept <= 3, f"{name}: a chain of {N} keeps {kept} storages (O(n))"
    h.sum().backward()
    t = torch.full((8,), 0.1, dtype=torch.float64, requires_grad=True)
    tw = torch.full((8,), 0.9, dtype=torch.float64)
    th = t
    for _ in range(N):
        th = step(th, tw)
    th.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-300)


def test_chain_storage_count_does_not_grow_with_length():
    x = flow.ones(16, requires_grad=True)
    counts = []
    for n in (50, 200):
        base = _live_storages()
        h = x
        for _ in range(n):
            h = (h + 1.0) * 0.5 - 0.25
        counts.append(_live_storages() - base)
        del h
    assert counts[0] == counts[1] <= 3, counts


def test_reading_an_undeclared_tensor_is_a_loud_internal_error():
    exp = registry.get("exp")
    wrong = OpDef("exp_wrong_saves", inputs=("input",), infer_meta=exp.infer_meta,
                  kernel=exp.kernel, grad=lambda ctx, g: (g * ctx.input(0),), saves=("out",),
                  reference="exp", samples=lambda rng: [Sample(np.ones(2))])
    x = flow.ones(3, requires_grad=True)
    y = apply(wrong, (x,), {})
    with pytest.raises(AssertionError, match="grad rule of 'exp_wrong_saves' read input 0, "
                                             "which its OpDef does not save"):
        y.sum().backward()


def test_saves_names_are_checked_at_registration():
    exp = registry.get("exp")
    with pytest.raises(ValueError, match="neither an input"):
        OpDef("bad", inputs=("input",), infer_meta=exp.infer_meta, kernel=exp.kernel,
              grad=exp.grad, saves=("other",))
    with pytest.raises(ValueError, match="tuple of names"):
        OpDef("bad", inputs=("input",), infer_meta=exp.infer_meta, kernel=exp.kernel,
              grad=exp.grad, saves="input")


def test_saved_index_helpers_for_memory_planning():
    assert registry.get("add").saved_input_indices(2) == ()
    assert registry.get("relu").saved_output_indices(1) == (0,)
    assert registry.get("dropout").saved_output_indices(2) == (1,)
    assert registry.get("index_put").saved_input_indices(5) == (2, 3, 4)
    assert registry.get("einsum").saved_input_indices(3) == (0, 1, 2)
    assert registry.get("cat").saved_input_indices(3) == ()


def test_version_check_still_fires_for_saved_and_not_for_dropped():
    a = flow.ones(3, requires_grad=True) * 1.0
    b = a.exp()  # saves its output only
    a.add_(1)  # a is not saved by exp: backward is fine (torch agrees)
    b.sum().backward()
    c = flow.ones(3, requires_grad=True) * 1.0
    d = c.exp()
    d.add_(1)  # d is exp's saved output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        d.sum().backward()
