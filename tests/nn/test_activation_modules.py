"""Activation modules against torch 2.13: same constructor arguments, same values, input and
parameter gradients, repr, in-place behaviour and errors."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn


def _x(*shape, seed=0, scale=2.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


# (id, constructor taking the nn namespace, input array)
CASES = [
    ("Threshold", lambda m: m.Threshold(0.3, -2.0), _x(3, 4)),
    ("ReLU", lambda m: m.ReLU(), _x(3, 4)),
    ("RReLU-eval", lambda m: m.RReLU(0.1, 0.4).eval(), _x(3, 4)),
    ("Hardtanh", lambda m: m.Hardtanh(-0.5, 1.5), _x(3, 4)),
    ("ReLU6", lambda m: m.ReLU6(), _x(3, 4, scale=5.0)),
    ("Sigmoid", lambda m: m.Sigmoid(), _x(3, 4)),
    ("Hardsigmoid", lambda m: m.Hardsigmoid(), _x(3, 4)),
    ("Tanh", lambda m: m.Tanh(), _x(3, 4)),
    ("SiLU", lambda m: m.SiLU(), _x(3, 4)),
    ("Mish", lambda m: m.Mish(), _x(3, 4)),
    ("Hardswish", lambda m: m.Hardswish(), _x(3, 4)),
    ("ELU", lambda m: m.ELU(0.7), _x(3, 4)),
    ("CELU", lambda m: m.CELU(1.3), _x(3, 4)),
    ("SELU", lambda m: m.SELU(), _x(3, 4)),
    ("GLU", lambda m: m.GLU(), _x(3, 4)),
    ("GLU-dim0", lambda m: m.GLU(dim=0), _x(4, 3)),
    ("GELU", lambda m: m.GELU(), _x(3, 4)),
    ("GELU-tanh", lambda m: m.GELU("tanh"), _x(3, 4)),
    ("Hardshrink", lambda m: m.Hardshrink(0.7), _x(3, 4)),
    ("LeakyReLU", lambda m: m.LeakyReLU(0.2), _x(3, 4)),
    ("LogSigmoid", lambda m: m.LogSigmoid(), _x(3, 4)),
    ("Softplus", lambda m: m.Softplus(2.0, 3.0), _x(3, 4)),
    ("Softshrink", lambda m: m.Softshrink(0.3), _x(3, 4)),
    ("PReLU", lambda m: m.PReLU(), _x(2, 3, 4)),
    ("PReLU-channels", lambda m: m.PReLU(3, init=0.1), _x(2, 3, 4)),
    ("Softsign", lambda m: m.Softsign(), _x(3, 4)),
    ("Tanhshrink", lambda m: m.Tanhshrink(), _x(3, 4)),
    ("Softmin", lambda m: m.Softmin(dim=1), _x(3, 4)),
    ("Softmax", lambda m: m.Softmax(dim=0), _x(3, 4)),
    ("Softmax2d", lambda m: m.Softmax2d(), _x(2, 3, 2, 2)),
    ("Softmax2d-3d", lambda m: m.Softmax2d(), _x(3, 2, 2)),
    ("LogSoftmax", lambda m: m.LogSoftmax(dim=-1), _x(3, 4)),
]


@pytest.mark.parametrize("make,x", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_activation_matches_torch(make, x):
    ours, theirs = make(nn), make(torch.nn)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if isinstance(theirs, torch.nn.PReLU):  # a distinct weight per channel, not just the init
        with torch.no_grad():
            theirs.weight.copy_(torch.linspace(-0.5, 0.5, theirs.weight.numel()))
        np.testing.assert_array_equal(ours.weight.detach().numpy(),
                                      np.full(ours.num_parameters, ours.init, np.float32))
        ours.load_state_dict({"weight": flow.tensor(theirs.weight.detach().numpy())})
    xf, xt = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yf, yt = ours(xf), theirs(xt)
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), 1e-5, 1e-6)
    cot = _x(*yt.shape, seed=1)
    yf.backward(flow.tensor(cot))
    yt.backward(torch.tensor(cot))
    np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), 1e-5, 1e-6)
    for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), 1e-5, 1e-6)


def test_every_torch_activation_module_exists_with_torchs_signature():
    import torch.nn.modules.activation as tact

    import sbpflow.nn.modules.activation as act

    assert sorted(act.__all__) == sorted(tact.__all__)
    for name in tact.__all__:
        ours, theirs = getattr(nn, name), getattr(torch.nn, name)
        assert ours.__module__ == "sbpflow.nn.modules.activation"
        if "__init__" in vars(theirs):
            assert list(inspect.signature(ours).parameters) == list(
                inspect.signature(theirs).parameters), name
            for pname, p in inspect.signature(theirs).parameters.items():
                assert inspect.signature(ours).parameters[pname].default == p.default, (name,
                                                                                        pname)


INPLACE = [
    ("ReLU", lambda m: m.ReLU(inplace=True)),
    ("ReLU6", lambda m: m.ReLU6(inplace=True)),
    ("LeakyReLU", lambda m: m.LeakyReLU(0.1, inplace=True)),
    ("ELU", lambda m: m.ELU(inplace=True)),
    ("CELU", lambda m: m.CELU(0.5, inplace=True)),
    ("SELU", lambda m: m.SELU(inplace=True)),
    ("SiLU", lambda m: m.SiLU(inplace=True)),
    ("Mish", lambda m: m.Mish(inplace=True)),
    ("Hardsigmoid", lambda m: m.Hardsigmoid(inplace=True)),
    ("Hardswish", lambda m: m.Hardswish(inplace=True)),
    ("Hardtanh", lambda m: m.Hardtanh(-2.0, 2.0, inplace=True)),
    ("Threshold", lambda m: m.Threshold(0.1, 20.0, inplace=True)),
    ("RReLU-eval", lambda m: m.RReLU(inplace=True).eval()),
]


@pytest.mark.parametrize("make", [c[1] for c in INPLACE], ids=[c[0] for c in INPLACE])
def test_inplace_writes_the_input_and_keeps_gradients(make):
    x = _x(3, 4)
    ours, theirs = make(nn), make(torch.nn)
    assert repr(ours) == repr(theirs)
    lf, lt = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    hf, ht = lf * 1.5, lt * 1.5  # non-leaf: an in-place op on it is legal
    yf, yt = ours(hf), theirs(ht)
    np.testing.assert_allclose(hf.detach().numpy(), ht.detach().numpy(), 1e-5, 1e-6)
    np.testing.assert_allclose(yf.detach().numpy(), yt.detach().numpy(), 1e-5, 1e-6)
    yf.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(lf.grad.numpy(), lt.grad.numpy(), 1e-5, 1e-6)


def test_rrelu_training_draws_slopes_within_bounds():
    m = nn.RReLU(0.2, 0.3)
    x = -np.abs(_x(2000)) - 0.1
    y = m(flow.tensor(x)).numpy()
    slopes = y / x
    assert slopes.min() >= 0.2 - 1e-6 and slopes.max() <= 0.3 + 1e-6
    assert slopes.std() > 0.01  # random, not a constant slope
    pos = np.abs(_x(10))
    np.testing.assert_array_equal(m(flow.tensor(pos)).numpy(), pos)


@pytest.mark.parametrize("make,x,exc", [
    (lambda m: m.Hardtanh(1.0, 1.0), None, AssertionError),
    (lambda m: m.Hardtanh(2.0, -1.0), None, AssertionError),
    (lambda m: m.Softmax2d(), _x(3, 4), ValueError),
    (lambda m: m.Softmax2d(), _x(1, 2, 3, 4, 5), ValueError),
    (lambda m: m.GLU(), _x(3, 5), RuntimeError),
    (lambda m: m.PReLU(4), _x(2, 3, 4), RuntimeError),
    (lambda m: m.RReLU(0.5, 0.2), _x(3), RuntimeError),
], ids=["hardtanh-equal", "hardtanh-reversed", "softmax2d-2d", "softmax2d-5d", "glu-odd",
        "prelu-channels", "rrelu-bounds"])
def test_errors_match_torch(make, x, exc):
    def run(lib):
        m = make(lib.nn)
        if x is not None:
            m(lib.tensor(x))

    with pytest.raises(exc) as theirs:
        run(torch)
    with pytest.raises(exc) as ours:
        run(flow)
    if exc is not RuntimeError:  # torch's RuntimeErrors come from C++ with its own wording
        assert str(ours.value) == str(theirs.value)


def test_hardtanh_deprecated_keywords_warn_as_torch():
    with pytest.warns(FutureWarning, match="keyword argument `min_value` is deprecated"):
        m = nn.Hardtanh(min_value=-3.0)
    with pytest.warns(FutureWarning, match="keyword argument `max_value` is deprecated"):
        m2 = nn.Hardtanh(max_value=3.0)
    assert (m.min_val, m.max_val, m2.min_val, m2.max_val) == (-3.0, 1.0, -1.0, 3.0)


def test_softmax_without_dim_warns_and_picks_torchs_dim():
    x = _x(2, 3, 4)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        y = nn.Softmax()(flow.tensor(x))
    with pytest.warns(UserWarning):
        yt = torch.nn.Softmax()(torch.tensor(x))
    np.testing.assert_allclose(y.numpy(), yt.numpy(), 1e-6)


def test_prelu_is_a_learnable_parameter_per_channel():
    m = nn.PReLU(3, init=0.2, dtype=flow.float64)
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert m.weight.dtype == flow.float64 and tuple(m.weight.shape) == (3,)
    opt = flow.optim.SGD(m.parameters(), lr=1.0)
    x = flow.tensor(-np.ones((2, 3, 2)))
    m(x).sum().backward()
    opt.step()
    # d/dw sum(w * x) over 4 negative entries of -1 each per channel: -4; w -> 0.2 + 4
    np.testing.assert_allclose(m.weight.detach().numpy(), np.full(3, 4.2))


def test_class_hierarchy_is_torchs():
    """isinstance checks in user code see what they see with torch (ReLU6 is a Hardtanh,
    CELU is not an ELU, every one is a Module)."""
    import torch.nn.modules.activation as tact

    for a in tact.__all__:
        for b in tact.__all__:
            assert issubclass(getattr(nn, a), getattr(nn, b)) == issubclass(
                getattr(torch.nn, a), getattr(torch.nn, b)), (a, b)
        assert issubclass(getattr(nn, a), nn.Module)
