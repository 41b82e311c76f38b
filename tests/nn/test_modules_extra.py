"""Loss, normalisation, padding and distance modules against torch 2.13: constructor
signature, repr, state_dict names, forward values and gradients (inputs and parameters),
running statistics."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn

RNG = np.random.default_rng(0)


def _f32(*shape, low=None):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + low if low is not None else a


def _check(name, args, kwargs, inputs, *, train=True, grad_inputs=None, rtol=1e-5,
           atol=1e-6, steps=1):
    """Build nn.<name>(*args, **kwargs) in both libraries, share the weights, run `steps`
    forwards (comparing outputs, gradients and buffers each time)."""
    theirs = getattr(torch.nn, name)(*args, **kwargs)
    ours = getattr(nn, name)(*args, **kwargs)
    assert repr(ours) == repr(theirs)
    sig_t = inspect.signature(type(theirs).__init__)
    sig_o = inspect.signature(type(ours).__init__)
    assert [(p.name, p.kind, p.default) for p in sig_o.parameters.values()] == [
        (p.name, p.kind, p.default) for p in sig_t.parameters.values()], name
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for p in theirs.parameters():  # non-trivial affine parameters
        with torch.no_grad():
            p.copy_(torch.tensor(_f32(*p.shape)))
    ours.load_state_dict({k: flow.tensor(v.numpy().copy())
                          for k, v in theirs.state_dict().items()})
    ours.train(train)
    theirs.train(train)
    grad_inputs = [x.dtype.kind == "f" for x in inputs] if grad_inputs is None else grad_inputs
    for _ in range(steps):
        f_in = [flow.tensor(x, requires_grad=g) for x, g in zip(inputs, grad_inputs)]
        t_in = [torch.tensor(x, requires_grad=g) for x, g in zip(inputs, grad_inputs)]
        f_out, t_out = ours(*f_in), theirs(*t_in)
        np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(),
                                   rtol=rtol, atol=atol)
        if t_out.requires_grad:
            g = _f32(*t_out.shape)
            f_out.backward(flow.tensor(g))
            t_out.backward(torch.tensor(g))
            for fi, ti in zip(f_in, t_in):
                if ti.requires_grad:
                    np.testing.assert_allclose(fi.grad.numpy(), ti.grad.numpy(), rtol=rtol,
                                               atol=atol)
            for (n, fp), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
                np.testing.assert_allclose(fp.grad.numpy(), tp.grad.numpy(), rtol=rtol,
                                           atol=atol, err_msg=n)
        for (n, fb), (_, tb) in zip(ours.named_buffers(), theirs.named_buffers()):
            np.testing.assert_allclose(fb.numpy(), tb.numpy(), rtol=rtol, atol=atol,
                                       err_msg=n)
    return ours, theirs


# -- losses ------------------------------------------------------------------------------------
def _sign(*shape):
    return np.where(RNG.random(shape) < 0.5, -1.0, 1.0).astype(np.float32)


LOSSES = [
    ("KLDivLoss", {}, lambda: [np.log(_f32(3, 4, low=0.1)), _f32(3, 4, low=0.1)]),
    ("KLDivLoss", {"reduction": "batchmean", "log_target": True},
     lambda: [_f32(3, 4), _f32(3, 4)]),
    ("KLDivLoss", {"reduction": "none"}, lambda: [_f32(3, 4), _f32(3, 4, low=0.0)]),
    ("HuberLoss", {"delta": 0.5}, lambda: [_f32(4, 3), _f32(4, 3)]),
    ("HuberLoss", {"reduction": "sum"}, lambda: [_f32(4, 3) * 3, _f32(4, 3)]),
    ("SoftMarginLoss", {}, lambda: [_f32(5), _sign(5)]),
    ("SoftMarginLoss", {"reduction": "none"}, lambda: [_f32(2, 5), _sign(2, 5)]),
    ("MultiLabelSoftMarginLoss", {}, lambda: [_f32(3, 4), (RNG.random((3, 4)) < .5)
                                              .astype(np.float32)]),
    ("MarginRankingLoss", {"margin": 0.3}, lambda: [_f32(6), _f32(6), _sign(6)]),
    ("HingeEmbeddingLoss", {"margin": 0.7}, lambda: [_f32(6), _sign(6)]),
    ("CosineEmbeddingLoss", {"margin": 0.2}, lambda: [_f32(4, 5), _f32(4, 5), _sign(4)]),
    ("PoissonNLLLoss", {}, lambda: [_f32(3, 4), _f32(3, 4, low=0.0)]),
    ("PoissonNLLLoss", {"log_input": False, "full": True},
     lambda: [_f32(3, 4, low=0.5), _f32(3, 4, low=1.5)]),
    ("TripletMarginLoss", {"margin": 0.5, "p": 1.0},
     lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3)]),
    ("TripletMarginLoss", {"swap": True, "reduction": "sum"},
     lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3)]),
    ("TripletMarginWithDistanceLoss", {"margin": 2.0, "swap": True},
     lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3)]),
    ("TripletMarginWithDistanceLoss", {"reduction": "none"},
     lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3)]),
    ("GaussianNLLLoss", {}, lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3, low=0.1)]),
    ("GaussianNLLLoss", {"full": True, "reduction": "sum", "eps": 0.05},
     lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 3, low=0.0) * 0.1]),
    ("GaussianNLLLoss", {"reduction": "none"}, lambda: [_f32(4, 3), _f32(4, 3),
                                                        _f32(4, low=0.1)]),
    ("GaussianNLLLoss", {}, lambda: [_f32(4, 3), _f32(4, 3), _f32(4, 1, low=0.1)]),
]


@pytest.mark.parametrize("name,kwargs,make", LOSSES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(LOSSES)])
def test_loss_modules_match_torch(name, kwargs, make):
    inputs = make()
    n_grad = {"SoftMarginLoss": 1, "MultiLabelSoftMarginLoss": 1, "HingeEmbeddingLoss": 1,
              "MarginRankingLoss": 2, "CosineEmbeddingLoss": 2}.get(name, len(inputs))
    if name == "KLDivLoss" or name == "PoissonNLLLoss":
        n_grad = 2  # torch differentiates the target too
    grads = [i < n_grad for i in range(len(inputs))]
    _check(name, (), kwargs, inputs, grad_inputs=grads, rtol=2e-5, atol=1e-5)


def test_weighted_and_legacy_loss_arguments():
    w = _f32(4, low=0.1)
    x, y = _f32(3, 4), (RNG.random((3, 4)) < .5).astype(np.float32)
    ours = nn.MultiLabelSoftMarginLoss(weight=flow.tensor(w))
    theirs = torch.nn.MultiLabelSoftMarginLoss(weight=torch.tensor(w))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    np.testing.assert_allclose(ours(flow.tensor(x), flow.tensor(y)).item(),
                               theirs(torch.tensor(x), torch.tensor(y)).item(), rtol=1e-5)
    for kw in ({"size_average": False}, {"reduce": False}, {"size_average": True}):
        with pytest.warns(UserWarning) as wt:  # torch's legacy size_average/reduce warn
            legacy = torch.nn.SoftMarginLoss(**kw)
        with pytest.warns(UserWarning) as wo:
            ours = nn.SoftMarginLoss(**kw)
        assert ours.reduction == legacy.reduction
        assert [str(w.message) for w in wo] == [str(w.message) for w in wt]


def test_loss_constructor_errors_match_torch():
    for name, kw in (("TripletMarginLoss", {"margin": 0.0}),
                     ("TripletMarginWithDistanceLoss", {"margin": -1.0})):
        with pytest.raises(ValueError) as et:
            getattr(torch.nn, name)(**kw)
        with pytest.raises(ValueError) as eo:
            getattr(nn, name)(**kw)
        assert str(eo.value) == str(et.value)
    a, b = _f32(2, 3), _f32(3)
    with pytest.raises(RuntimeError) as et:
        torch.nn.TripletMarginWithDistanceLoss()(torch.tensor(a), torch.tensor(b),
                                                 torch.tensor(b))
    with pytest.raises(RuntimeError) as eo:
        nn.TripletMarginWithDistanceLoss()(flow.tensor(a), flow.tensor(b), flow.tensor(b))
    assert str(eo.value) == str(et.value)


def test_gaussian_nll_errors_and_float_var_match_torch():
    x, y = _f32(2, 3), _f32(2, 3)
    for var_o, var_t, kw in (
            (flow.ones(2, 2), torch.ones(2, 2), {}), (-flow.ones(2, 3), -torch.ones(2, 3), {}),
            (flow.ones(2, 3), torch.ones(2, 3), {"reduction": "x"})):
        with pytest.raises(ValueError) as et:
            torch.nn.GaussianNLLLoss(**kw)(torch.tensor(x), torch.tensor(y), var_t)
        with pytest.raises(ValueError) as eo:
            nn.GaussianNLLLoss(**kw)(flow.tensor(x), flow.tensor(y), var_o)
        assert str(eo.value) == str(et.value)
    np.testing.assert_allclose(
        nn.GaussianNLLLoss()(flow.tensor(x), flow.tensor(y), 0.5).item(),
        torch.nn.GaussianNLLLoss()(torch.tensor(x), torch.tensor(y), 0.5).item(), rtol=1e-6)


def test_triplet_with_custom_distance():
    def cos_dist(x, y, lib):
        return 1.0 - lib.nn.functional.cosine_similarity(x, y)

    a, p, n = _f32(5, 3), _f32(5, 3), _f32(5, 3)
    ours = nn.TripletMarginWithDistanceLoss(distance_function=lambda x, y: cos_dist(x, y, flow))
    theirs = torch.nn.TripletMarginWithDistanceLoss(
        distance_function=lambda x, y: cos_dist(x, y, torch))
    fa = flow.tensor(a, requires_grad=True)
    ta = torch.tensor(a, requires_grad=True)
    fo = ours(fa, flow.tensor(p), flow.tensor(n))
    to = theirs(ta, torch.tensor(p), torch.tensor(n))
    np.testing.assert_allclose(fo.item(), to.item(), rtol=1e-5)
    fo.backward()
    to.backward()
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-6)


# -- normalisation -------------------------------------------------------------------------------
NORMS = [
    ("BatchNorm3d", (3,), {}, (2, 3, 2, 3, 2)),
    ("BatchNorm3d", (3,), {"affine": False, "momentum": None}, (2, 3, 2, 2, 2)),
    ("BatchNorm1d", (3,), {"affine": False}, (4, 3)),
    ("InstanceNorm1d", (3,), {}, (2, 3, 5)),
    ("InstanceNorm1d", (3,), {"affine": True}, (3, 5)),
    ("InstanceNorm2d", (3,), {"affine": True, "track_running_stats": True}, (2, 3, 4, 3)),
    ("InstanceNorm2d", (3,), {"affine": True, "bias": False}, (2, 3, 4, 3)),
    ("InstanceNorm3d", (2,), {"track_running_stats": True, "momentum": 0.3},
     (2, 2, 3, 2, 2)),
    ("InstanceNorm1d", (3,), {"track_running_stats": True, "momentum": None}, (2, 3, 4)),
    ("BatchNorm3d", (2,), {"bias": False}, (2, 2, 2, 2, 2)),
    ("LocalResponseNorm", (3,), {"alpha": 0.5, "beta": 0.6, "k": 1.5}, (2, 5, 4)),
    ("LocalResponseNorm", (2,), {}, (2, 4, 3, 3)),
    ("LocalResponseNorm", (4,), {"alpha": 1.0}, (1, 6, 2, 2, 2)),
]


@pytest.mark.parametrize("name,args,kwargs,shape", NORMS,
                         ids=[f"{n}-{i}" for i, (n, *_) in enumerate(NORMS)])
def test_norm_modules_train_then_eval(name, args, kwargs, shape):
    x = _f32(*shape) * 2 + 0.5
    ours, theirs = _check(name, args, kwargs, [x], train=True, steps=2, rtol=1e-4, atol=1e-5)
    ours.eval()
    theirs.eval()
    fo = ours(flow.tensor(x))
    to = theirs(torch.tensor(x))
    np.testing.assert_allclose(fo.detach().numpy(), to.detach().numpy(), rtol=1e-4,
                               atol=1e-5)


def test_instance_norm_errors_and_warnings_match_torch():
    x = _f32(2, 4, 5)
    with pytest.raises(ValueError) as et:
        torch.nn.InstanceNorm1d(3, affine=True)(torch.tensor(x))
    with pytest.raises(ValueError) as eo:
        nn.InstanceNorm1d(3, affine=True)(flow.tensor(x))
    assert str(eo.value) == str(et.value)
    with pytest.warns(UserWarning, match="does not match num_features"):
        nn.InstanceNorm1d(3)(flow.tensor(x))
    with pytest.raises(ValueError) as et:
        torch.nn.InstanceNorm2d(3)(torch.tensor(x[0]))
    with pytest.raises(ValueError) as eo:
        nn.InstanceNorm2d(3)(flow.tensor(x[0]))
    assert str(eo.value) == str(et.value)


# -- padding -------------------------------------------------------------------------------------
PADS = [
    ("ZeroPad1d", (2,), (2, 3, 4)), ("ZeroPad1d", ((1, 3),), (3, 4)),
    ("ZeroPad2d", ((1, 0, 2, 1),), (1, 2, 3, 4)), ("ZeroPad3d", (1,), (1, 2, 2, 3, 2)),
    ("ConstantPad1d", (2, 3.5), (2, 3, 4)), ("ConstantPad2d", ((1, 2, 0, 1), -1.0), (2, 3, 3)),
    ("ConstantPad3d", (1, 0.5), (1, 1, 2, 2, 2)), ("ConstantPad2d", ((-1, 2, 1, -1), 2.0),
                                                   (1, 2, 4, 4)),
    ("ReflectionPad1d", (2,), (2, 3, 4)), ("ReflectionPad1d", ((3, 1),), (3, 5)),
    ("ReflectionPad2d", ((1, 2, 2, 0),), (1, 2, 3, 4)), ("ReflectionPad3d", (1,), (1, 1, 3, 3, 3)),
    ("ReplicationPad1d", ((0, 3),), (2, 2, 3)), ("ReplicationPad2d", (2,), (1, 2, 3, 3)),
    ("ReplicationPad3d", ((1, 0, 0, 2, 1, 1),), (1, 2, 2, 2, 2)),
    ("CircularPad1d", (1,), (2, 3, 4)), ("CircularPad2d", ((1, 2, 2, 1),), (1, 1, 3, 3)),
    ("CircularPad3d", (1,), (1, 1, 2, 2, 2)),
]


@pytest.mark.parametrize("name,args,shape", PADS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(PADS)])
def test_padding_modules_match_torch(name, args, shape):
    ours, theirs = _check(name, args, {}, [_f32(*shape)])
    assert ours.padding == theirs.padding
    assert getattr(ours, "value", None) == getattr(theirs, "value", None)


@pytest.mark.parametrize("name,shape", [("ReflectionPad2d", (3, 4)), ("ReflectionPad1d", (2, 3)),
                                        ("ReplicationPad2d", (5,)), ("CircularPad1d", (5,))])
def test_padding_module_errors_match_torch(name, shape):
    x = _f32(*shape)
    with pytest.raises(Exception) as et:
        getattr(torch.nn, name)(3)(torch.tensor(x))
    with pytest.raises(Exception) as eo:
        getattr(nn, name)(3)(flow.tensor(x))
    assert type(eo.value) is type(et.value)
    if name.startswith("Circular"):
        assert str(eo.value) == str(et.value)


# -- distance ------------------------------------------------------------------------------------
DISTANCES = [
    ("PairwiseDistance", {}, (4, 5)), ("PairwiseDistance", {"p": 1.0, "keepdim": True}, (4, 5)),
    ("PairwiseDistance", {"p": 3.0, "eps": 1e-3}, (5,)),
    ("CosineSimilarity", {}, (4, 5)), ("CosineSimilarity", {"dim": 0, "eps": 1e-6}, (3, 4)),
    ("CosineSimilarity", {"dim": -1}, (2, 3, 4)),
]


@pytest.mark.parametrize("name,kwargs,shape", DISTANCES,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(DISTANCES)])
def test_distance_modules_match_torch(name, kwargs, shape):
    ours, theirs = _check(name, (), kwargs, [_f32(*shape), _f32(*shape)], rtol=1e-5,
                          atol=1e-6)
    assert vars(ours).keys() >= {k for k in vars(theirs) if not k.startswith("_")} - {
        "training"}
