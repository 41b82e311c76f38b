"""OneFlow's fused functional ops through the public API (flow.nn.functional, flow.gather_nd)
against torch compositions; the op-level checks (grads, finite differences, SBP) are the
registry's and the global-op tests'."""

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn.functional as F


def _pair(a, requires_grad=True):
    return (flow.tensor(a, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def test_quick_gelu_and_square_relu_match_torch():
    a = np.random.default_rng(0).standard_normal((3, 5)) * 3
    for fn, ref in ((F.quick_gelu, lambda t: t * torch.sigmoid(1.702 * t)),
                    (F.square_relu, lambda t: torch.relu(t) ** 2)):
        x, tx = _pair(a)
        y, ty = fn(x), ref(tx)
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-12)
        (y * y).sum().backward()
        (ty * ty).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10)
    with pytest.raises(TypeError, match="quick_gelu"):
        F.quick_gelu(np.ones(3))


def test_sparse_softmax_cross_entropy_labels_first():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 4))
    labels = rng.integers(0, 4, (2, 3))
    x, tx = _pair(a)
    loss = F.sparse_softmax_cross_entropy(flow.tensor(labels, dtype=flow.int32), x)
    want = torch.nn.functional.cross_entropy(tx.reshape(-1, 4), torch.tensor(labels).reshape(-1),
                                             reduction="none").reshape(2, 3)
    assert tuple(loss.shape) == (2, 3) and loss.dtype == flow.float64
    np.testing.assert_allclose(loss.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    w = rng.standard_normal((2, 3))
    (loss * flow.tensor(w)).sum().backward()
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="labels must have the shape of logits"):
        F.sparse_softmax_cross_entropy(flow.tensor([0, 1]), x)
    with pytest.raises(TypeError, match="int32 or int64"):
        F.sparse_softmax_cross_entropy(flow.zeros(2, 3), x)
    with pytest.raises(IndexError, match="label 4 is out of bounds for 4 classes"):
        F.sparse_softmax_cross_entropy(flow.tensor([[0, 4, 1], [0, 0, 0]]), x).numpy()


def test_gather_nd_top_level_and_functional():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 3, 2))
    idx = np.array([[[0, 2], [3, 1]], [[0, 2], [1, 0]]])  # a repeated row: grads add up
    assert flow.gather_nd is F.gather_nd
    x, tx = _pair(a)
    y = flow.gather_nd(x, flow.tensor(idx))
    ti = torch.tensor(idx)
    ty = tx[ti[..., 0], ti[..., 1]]
    assert tuple(y.shape) == (2, 2, 2)
    np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
    g = rng.standard_normal((2, 2, 2))
    (y * flow.tensor(g)).sum().backward()
    (ty * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="1 to params.ndim"):
        flow.gather_nd(x, flow.tensor([[0, 0, 0, 0]]))
    with pytest.raises(TypeError, match="int32 or int64"):
        flow.gather_nd(x, flow.zeros(2, 1))
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 0"):
        flow.gather_nd(x, flow.tensor([[4]])).numpy()


def test_fused_ops_on_a_global_tensor():
    placement = flow.placement("cpu", [0])
    a = np.random.default_rng(3).standard_normal((4, 3))
    x = flow.tensor(a).to_global(placement=placement, sbp=flow.sbp.split(0))
    labels = flow.tensor([2, 0, 1, 1]).to_global(placement=placement, sbp=flow.sbp.split(0))
    loss = F.sparse_softmax_cross_entropy(labels, x)
    assert loss.is_global and loss.sbp == (flow.sbp.split(0),)
    want = torch.nn.functional.cross_entropy(torch.tensor(a), torch.tensor([2, 0, 1, 1]),
                                             reduction="none")
    np.testing.assert_allclose(loss.to_local().numpy(), want.numpy(), rtol=1e-12)
