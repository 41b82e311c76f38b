"""Training-mode batch norm as one op with a fused loop (ops/batch_norm.py): the modules
reach it, match torch (outputs, gradients, running statistics), and a double backward
composes differentiable ops instead of the fused gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.device.primitives import Primitives


@pytest.fixture
def fused(monkeypatch):
    calls = []
    for name in ("batch_norm_train", "batch_norm_grad"):
        original = getattr(Primitives, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            calls.append((_name, out is not None))
            return out

        monkeypatch.setattr(Primitives, name, counted)
    return calls


@pytest.mark.parametrize("dims,dtype", [(0, "float32"), (1, "float32"), (2, "float32"),
                                        (2, "float64"), (3, "float32")])
def test_batchnorm_modules_match_torch_through_the_fused_op(fused, dims, dtype):
    rng = np.random.default_rng(dims)
    shape = {0: (6, 4), 1: (6, 4, 7)}.get(dims, (6, 4) + (5,) * dims)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    name = f"BatchNorm{max(dims, 1)}d"
    m, tm = getattr(flow.nn, name)(4), getattr(torch.nn, name)(4)
    if dtype == "float64":
        m, tm = m.double(), tm.double()
    with torch.no_grad():
        tm.weight.copy_(torch.tensor(rng.standard_normal(4)))
        tm.bias.copy_(torch.tensor(rng.standard_normal(4)))
    m.load_state_dict({k: flow.tensor(v.numpy()) for k, v in tm.state_dict().items()})
    for _ in range(2):  # twice: running statistics and num_batches_tracked accumulate
        fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, ty = m(fx), tm(tx)
        (y * flow.tensor(gy)).sum().backward()
        (ty * torch.tensor(gy)).sum().backward()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), **tol)
    np.testing.assert_allclose(m.weight.grad.numpy(), tm.weight.grad.numpy(), **tol)
    np.testing.assert_allclose(m.bias.grad.numpy(), tm.bias.grad.numpy(), **tol)
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(m.state_dict()[k].numpy(), v.numpy(), **tol)
    assert ("batch_norm_train", True) in fused and ("batch_norm_grad", True) in fused


def test_double_backward_through_batch_norm_matches_torch(fused):
    """A gradient penalty: the gradient of x must itself be differentiable."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 4)).astype(np.float64)
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    results = []
    for lib in (flow, torch):
        tx = lib.tensor(x, requires_grad=True)
        tw, tb = lib.tensor(w, requires_grad=True), lib.tensor(b, requires_grad=True)
        y = lib.nn.functional.batch_norm(tx, None, None, tw, tb, training=True)
        (gx,) = lib.autograd.grad((y * y * y).sum(), tx, create_graph=True)
        if lib is flow:  # the differentiable composition built gx, not the fused op
            assert ("batch_norm_grad", True) not in fused
        (gx * gx).sum().backward()
        results.append([t.grad.detach().numpy() for t in (tx, tw, tb)])
    for a, e in zip(*results, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-8, atol=1e-10)


def test_half_inputs_and_affine_false_keep_the_composed_form(fused):
    x = np.random.default_rng(1).standard_normal((4, 3, 2)).astype(np.float32)
    m, tm = flow.nn.BatchNorm1d(3, affine=False), torch.nn.BatchNorm1d(3, affine=False)
    np.testing.assert_allclose(m(flow.tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    assert fused == []
