"""sbpflow.special against torch.special 2.13 (values and gradients), and the unsupported
names raising NotImplementedError that names them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.special as special

RNG = np.random.default_rng(0)
REAL = RNG.standard_normal((3, 5)).astype(np.float32) * 2.0
PROB = RNG.uniform(0.02, 0.98, (3, 5)).astype(np.float32)
NONNEG = np.abs(REAL) + np.array([0.0, 0.5, 1.0, 2.0, 3.0], np.float32)
NONNEG[0, 0] = 0.0

# name, input, kwargs, check gradient
UNARY = [
    ("expit", REAL, {}, True), ("logit", PROB, {}, True), ("logit", PROB, {"eps": 0.1}, True),
    ("erf", REAL, {}, True), ("erfc", REAL, {}, True), ("erfinv", PROB * 2 - 1, {}, True),
    ("expm1", REAL, {}, True), ("exp2", REAL, {}, True), ("log1p", NONNEG, {}, True),
    ("log_softmax", REAL, {"dim": 1}, True), ("softmax", REAL, {"dim": 0}, True),
    ("logsumexp", REAL, {"dim": 1}, True), ("logsumexp", REAL, {"dim": 0, "keepdim": True}, True),
    ("sinc", REAL, {}, True), ("round", REAL, {}, False), ("round", REAL, {"decimals": 1}, False),
    ("entr", NONNEG + 0.1, {}, True), ("ndtr", REAL, {}, True), ("ndtri", PROB, {}, True),
]


@pytest.mark.parametrize("name,x,kw,grad", UNARY, ids=[f"{u[0]}-{i}" for i, u in enumerate(UNARY)])
def test_unary_matches_torch(name, x, kw, grad):
    a = flow.tensor(x, requires_grad=grad)
    t = torch.tensor(x, requires_grad=grad)
    out, ref = getattr(special, name)(a, **kw), getattr(torch.special, name)(t, **kw)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=2e-5, atol=2e-6)
    if grad:
        w = RNG.standard_normal(ref.shape).astype(np.float32)
        (out * flow.tensor(w)).sum().backward()
        (ref * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_entr_edges_and_integer_input():
    x = np.array([-1.0, 0.0, 0.25, np.nan], np.float32)
    np.testing.assert_allclose(special.entr(flow.tensor(x)).numpy(),
                               torch.special.entr(torch.tensor(x)).numpy(), equal_nan=True)
    xi = np.array([0, 1, 2, 3], np.int64)
    assert special.exp2(flow.tensor(xi)).dtype == flow.float32
    np.testing.assert_allclose(special.exp2(flow.tensor(xi)).numpy(),
                               torch.special.exp2(torch.tensor(xi)).numpy(), rtol=1e-6)


@pytest.mark.parametrize("name", ["xlogy", "xlog1py"])
def test_binary_matches_torch_with_zero_and_nan(name):
    x = np.array([0.0, 0.0, 1.5, 2.0, 0.0], np.float32)
    y = np.array([0.0, np.nan, 0.5, 3.0, -0.5], np.float32)
    out = getattr(special, name)(flow.tensor(x), flow.tensor(y)).numpy()
    ref = getattr(torch.special, name)(torch.tensor(x), torch.tensor(y)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-6, equal_nan=True)
    a, b = flow.tensor(x[2:4], requires_grad=True), flow.tensor(y[2:4], requires_grad=True)
    ta, tb = torch.tensor(x[2:4], requires_grad=True), torch.tensor(y[2:4], requires_grad=True)
    getattr(special, name)(a, b).sum().backward()
    getattr(torch.special, name)(ta, tb).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5)


def test_every_torch_special_name_is_offered_or_refused_by_name():
    offered = refused = 0
    for name in torch.special.__all__:
        if name in special.__all__:
            assert callable(getattr(special, name))
            offered += 1
            continue
        with pytest.raises(NotImplementedError, match=rf"torch\.special\.{name} is not impl"):
            getattr(special, name)
        assert not hasattr(special, name)  # an AttributeError too: getattr defaults work
        refused += 1
    assert offered == len(special.__all__) and offered + refused == len(torch.special.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        special.nonsense  # noqa: B018


def test_reachable_as_attribute_and_under_mock_torch():
    assert flow.special is special
    with flow.mock_torch.enable():
        import torch as mocked
        import torch.special as ms
        assert ms is special and mocked.special is special


def test_non_tensor_input_names_the_function():
    with pytest.raises(TypeError, match=r"special_expit\(\): argument 'input'"):
        special.expit([1.0])
