"""AccumulateGrad takes a gradient's memory for leaf.grad when nobody else can see it (no copy),
as torch does, and copies it whenever anything else holds it or shares its memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.autograd import engine


@pytest.fixture
def clones(monkeypatch):
    """Counts the copies _accumulate makes (Tensor.clone calls during backward)."""
    calls = []
    original = flow.Tensor.clone

    def counted(self, *args, **kwargs):
        calls.append(self.shape)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(flow.Tensor, "clone", counted)
    return calls


def _mlp(lib, seed=0):
    rng = np.random.default_rng(seed)
    w1, b1 = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal(8).astype(
        np.float32)
    w2 = rng.standard_normal((8, 3)).astype(np.float32)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    ps = [lib.tensor(a, requires_grad=True) for a in (w1, b1, w2)]
    h = (lib.tensor(x) @ ps[0] + ps[1]).relu()
    return ps, (h @ ps[2]).square().mean()


def test_fresh_gradients_are_taken_without_a_copy_and_accumulate_like_torch(clones):
    ps, loss = _mlp(flow)
    lin = flow.nn.Linear(5, 2)
    lin(flow.ones(3, 5)).sum().backward()  # nn.Linear's weight and bias: fresh gradients
    tps, tloss = _mlp(torch)
    loss.backward(retain_graph=True)
    tloss.backward(retain_graph=True)
    assert clones == []  # every leaf took its gradient's memory
    loss.backward()  # the second backward adds in place into the taken memory
    tloss.backward()
    for p, tp in zip(ps, tps, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_gradient_the_user_holds_is_copied(clones):
    g = flow.ones(4, 3)
    y = flow.zeros(4, 3, requires_grad=True)
    y.backward(g)
    assert len(clones) == 1
    g.add_(5)  # the user's tensor changes: y.grad must not
    np.testing.assert_array_equal(y.grad.numpy(), np.ones((4, 3), np.float32))
    y.backward(flow.ones(4, 3))
    np.testing.assert_array_equal(g.numpy(), np.full((4, 3), 6, np.float32))
    np.testing.assert_array_equal(y.grad.numpy(), np.full((4, 3), 2, np.float32))


def test_a_gradient_a_hook_kept_is_copied(clones):
    kept = []
    x = flow.ones(3, requires_grad=True)
    x.register_hook(lambda g: kept.append(g))
    (x * 3).sum().backward()
    assert len(clones) == 1
    kept[0].mul_(0)
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 3, np.float32))


def test_a_gradient_that_is_a_view_is_copied(clones):
    x = flow.ones(2, 3, requires_grad=True)
    y = x.t()  # the gradient of x is a transposed view of y's
    (y * flow.arange(6.0).reshape(3, 2)).sum().backward()
    assert len(clones) == 1
    assert x.grad.is_contiguous()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(6.0).reshape(3, 2).T)


def test_the_reference_count_baseline_is_what_the_engine_holds(monkeypatch):
    """_ENGINE_REFS is CPython's count of the engine's own references: probe it on a fresh
    gradient, so a change to the engine that adds one fails here, not silently."""
    seen = []
    original = engine._only_reference

    def probe(g):
        ok = original(g)
        seen.append(ok)
        return ok

    monkeypatch.setattr(engine, "_only_reference", probe)
    x = flow.ones(5, requires_grad=True)
    (x * 2).sum().backward()
    # the probe adds a frame holding g: the original then sees one reference more than the
    # engine alone and must refuse; without the probe (the tests above) it takes the memory.
    assert seen == [False]
