"""Linear-family modules (torch.nn.modules.linear) against torch 2.13."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias,lead", [(True, (4,)), (False, (2, 3))], ids=["bias", "no-bias"])
def test_bilinear_matches_torch(bias, lead):
    torch.manual_seed(0)
    theirs, ours = torch.nn.Bilinear(3, 5, 4, bias=bias), nn.Bilinear(3, 5, 4, bias=bias)
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname and tuple(p.shape) == tuple(tp.shape)
        bound = 1 / np.sqrt(3)
        assert np.abs(p.detach().numpy()).max() <= bound  # torch's U(-1/sqrt(in1), ...)
    ours.load_state_dict({k: flow.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    a, b = _x(*lead, 3), _x(*lead, 5, seed=1)
    fa, fb = flow.tensor(a, requires_grad=True), flow.tensor(b, requires_grad=True)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    fy, ty = ours(fa, fb), theirs(ta, tb)
    np.testing.assert_allclose(fy.detach().numpy(), ty.detach().numpy(), 1e-5, 1e-5)
    cot = _x(*ty.shape, seed=2)
    fy.backward(flow.tensor(cot))
    ty.backward(torch.tensor(cot))
    for f, t in [(fa, ta), (fb, tb)] + list(zip(ours.parameters(), theirs.parameters())):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), 1e-4, 1e-5)


def test_non_dynamically_quantizable_linear_has_torchs_module_path():
    from sbpflow.nn.modules.linear import NonDynamicallyQuantizableLinear

    m = NonDynamicallyQuantizableLinear(3, 2)
    assert isinstance(m, nn.Linear)
    assert type(m).__module__ == "sbpflow.nn.modules.linear"
    assert repr(m) == repr(torch.nn.modules.linear.NonDynamicallyQuantizableLinear(3, 2))
    assert not hasattr(nn, "NonDynamicallyQuantizableLinear")  # as torch.nn


def test_lazy_linear_says_it_is_not_offered():
    with pytest.raises(NotImplementedError, match="LazyLinear: lazy modules .* not implemented"):
        nn.LazyLinear(4)
    assert issubclass(nn.LazyLinear, nn.Linear)  # as torch's
