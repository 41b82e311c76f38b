"""NN functions beyond the registry-driven tests: the composite functions (losses, attention,
group/batch/instance norm, ...) against torch in values and gradients, in-place forms,
second derivatives, dropout's statistics and per-piece draws, running statistics, and torch's
errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sbpflow as flow
import sbpflow.nn.functional as F
from sbpflow._core.meta import TensorMeta
from sbpflow.device import primitives
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext

RNG = np.random.default_rng(1234)


def _rand(*shape):
    return RNG.standard_normal(shape)


def _host(t):
    if isinstance(t, (torch.Tensor, flow.Tensor)):
        return t.detach().numpy()
    return np.asarray(t)


def _close(a, b, tol=1e-9):
    a, b = _host(a), _host(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def _compare(flow_fn, torch_fn, arrays, grad=None, tol=1e-9, seed=0):
    """Run both on the same float64 arrays; compare outputs and, for the inputs listed in
    `grad` (indices; default: every floating input), gradients of a random cotangent."""
    grad = [i for i, a in enumerate(arrays) if np.asarray(a).dtype.kind == "f"] \
        if grad is None else grad
    fl = [flow.tensor(a, requires_grad=i in grad) for i, a in enumerate(arrays)]
    th = [torch.tensor(a, requires_grad=i in grad) for i, a in enumerate(arrays)]
    out_f, out_t = flow_fn(*fl), torch_fn(*th)
    _close(out_f, out_t, tol)
    if not grad:
        return out_f
    cot = np.random.default_rng(seed).standard_normal(tuple(out_t.shape))
    out_f.backward(flow.tensor(cot))
    out_t.backward(torch.tensor(cot))
    for i in grad:
        assert fl[i].grad is not None, f"input {i} got no gradient"
        _close(fl[i].grad, th[i].grad, tol)
    return out_f


def _second_order(flow_fn, torch_fn, arrays, tol=1e-8):
    """Gradients of <d f/d x . u> with respect to x and the cotangent v, against torch."""
    rng = np.random.default_rng(5)
    fl = [flow.tensor(a, requires_grad=True) for a in arrays]
    th = [torch.tensor(a, requires_grad=True) for a in arrays]
    out_f, out_t = flow_fn(*fl), torch_fn(*th)
    v = rng.standard_normal(tuple(out_t.shape))
    vf, vt = flow.tensor(v, requires_grad=True), torch.tensor(v, requires_grad=True)
    gf = flow.autograd.grad(out_f, fl, vf, create_graph=True)
    gt = torch.autograd.grad(out_t, th, vt, create_graph=True)
    us = [rng.standard_normal(tuple(g.shape)) for g in gt]
    sf = sum((g * flow.tensor(u)).sum() for g, u in zip(gf, us, strict=True))
    st = sum((g * torch.tensor(u)).sum() for g, u in zip(gt, us, strict=True))
    hf = flow.autograd.grad(sf, fl + [vf], allow_unused=True)
    ht = torch.autograd.grad(st, th + [vt], allow_unused=True)
    for a, b, src in zip(hf, ht, fl + [vf], strict=True):
        if a is None or b is None:
            # One side knows the term is zero without computing it (relu's mask).
            other = b if a is None else a
            assert other is None or not np.any(_host(other)), "one-sided second derivative"
            continue
        _close(a, b, tol)
        assert tuple(a.shape) == tuple(src.shape)


X = _rand(4, 5)
Y = _rand(4, 5)
TARGET = np.array([0, 4, 1, -100])
CLASS_WEIGHT = RNG.uniform(0.5, 2.0, 5)


# =========================================================================================
# activations
# =========================================================================================
@pytest.mark.parametrize("name,kwargs", [
    ("relu", {}), ("relu6", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {}),
    ("elu", {"alpha": 0.5}), ("selu", {}), ("celu", {"alpha": 0.75}), ("gelu", {}),
    ("gelu", {"approximate": "tanh"}), ("silu", {}), ("mish", {}), ("softplus", {}),
    ("softplus", {"beta": 2.0, "threshold": 3.0}), ("hardtanh", {"min_val": -0.5}),
    ("hardsigmoid", {}), ("hardswish", {}), ("logsigmoid", {}), ("sigmoid", {}),
    ("tanh", {}), ("softsign", {}), ("tanhshrink", {}),
    ("threshold", {"threshold": 0.3, "value": -2.0}), ("hardshrink", {}),
    ("hardshrink", {"lambd": 1.2}), ("softshrink", {}), ("softshrink", {"lambd": 0.9}),
    ("rrelu", {}), ("rrelu", {"lower": 0.2, "upper": 0.4}),
])
def test_activations_match_torch(name, kwargs):
    x = X * 3
    # torch's hardsigmoid backward multiplies by a float32 1/6, even in float64.
    tol = 1e-7 if name == "hardsigmoid" else 1e-9
    _compare(lambda a: getattr(F, name)(a, **kwargs), lambda a: getattr(TF, name)(a, **kwargs),
             [x], tol=tol)


@pytest.mark.parametrize("name,kwargs", [
    ("relu", {}), ("leaky_relu", {"negative_slope": 0.1}), ("elu", {}), ("selu", {}),
    ("celu", {"alpha": 2.0}), ("hardtanh", {"max_val": 0.5}), ("relu6", {}), ("silu", {}),
    ("mish", {}), ("hardsigmoid", {}), ("hardswish", {}), ("threshold", {"threshold": 0.0,
                                                                          "value": 1.0}),
])
def test_inplace_activations_write_the_input(name, kwargs):
    # Through a non-leaf, so autograd must rewire the in-place result.
    a = flow.tensor(X * 3, requires_grad=True)
    b = torch.tensor(X * 3, requires_grad=True)
    fa, tb = a * 1.0, b * 1.0
    version = fa._version
    out = getattr(F, name)(fa, **kwargs, inplace=True)
    ref = getattr(TF, name)(tb, **kwargs, inplace=True)
    assert out is fa and fa._version > version
    _close(fa, tb)
    cot = _rand(4, 5)
    out.backward(flow.tensor(cot))
    ref.backward(torch.tensor(cot))
    _close(a.grad, b.grad, 1e-7 if name == "hardsigmoid" else 1e-9)  # torch: float32 1/6


@pytest.mark.parametrize("shape,wshape", [((4, 5), (5,)), ((4, 5), (1,)), ((2, 3, 4), (3,)),
                                          ((6,), (1,)), ((3, 2), ())])
def test_prelu(shape, wshape):
    _compare(F.prelu, TF.prelu, [_rand(*shape), RNG.uniform(0.1, 0.5, wshape)])


def test_prelu_channel_mismatch():
    with pytest.raises(RuntimeError, match="Mismatch of parameter numbers"):
        F.prelu(flow.tensor(_rand(2, 4)), flow.tensor(np.ones(3)))


def test_rrelu_training_draws_slopes_in_range():
    flow.manual_seed(4)
    x = flow.tensor(np.linspace(-3, 3, 2001), requires_grad=True)
    out = F.rrelu(x, 0.1, 0.3, training=True)
    out.sum().backward()
    xs, ys, gs = x.detach().numpy(), out.detach().numpy(), x.grad.numpy()
    neg = xs < 0
    slopes = ys[neg] / xs[neg]
    assert np.all((slopes >= 0.1) & (slopes <= 0.3))
    assert 0.18 < slopes.mean() < 0.22 and slopes.std() > 0.04  # spread like U(0.1, 0.3)
    np.testing.assert_allclose(gs[neg], slopes, rtol=1e-12)
    np.testing.assert_array_equal(ys[~neg], xs[~neg])
    np.testing.assert_array_equal(gs[~neg], 1.0)


def test_inplace_function_forms():
    for name in ("relu_", "leaky_relu_", "elu_", "selu_", "celu_", "hardtanh_"):
        t = flow.tensor(X.copy())
        r = torch.tensor(X.copy())
        assert getattr(F, name)(t) is t
        getattr(TF, name)(r)
        _close(t, r)
    t = flow.tensor(X.copy())
    assert t.relu_() is t
    _close(t, np.maximum(X, 0))
    _close(flow.tensor(X).relu(), np.maximum(X, 0))


def test_relu_keeps_integer_dtype_and_rejects_bool():
    out = F.relu(flow.tensor([-3, 0, 5]))
    assert out.dtype is flow.int64 and out.tolist() == [0, 0, 5]
    with pytest.raises(TypeError, match="relu"):
        F.relu(flow.tensor([True, False]))


def test_activation_errors():
    with pytest.raises(RuntimeError, match="approximate"):
        F.gelu(flow.tensor(X), approximate="exact")
    with pytest.raises(TypeError, match="floating point"):
        F.gelu(flow.tensor([1, 2]))
    with pytest.raises(ValueError, match="min_val"):
        F.hardtanh(flow.tensor(X), 1.0, -1.0)


def test_float32_activation_precision():
    x = (X * 3).astype(np.float32)
    for name in ("gelu", "silu", "softplus", "mish", "elu", "logsigmoid"):
        out = getattr(F, name)(flow.tensor(x))
        assert out.dtype is flow.float32
        _close(out, getattr(TF, name)(torch.tensor(x)), 2e-6)


def test_half_precision_softmax_and_gelu():
    x = (X * 3).astype(np.float16)
    for fl, th in ((lambda t: F.softmax(t, -1), lambda t: TF.softmax(t, -1)),
                   (F.gelu, TF.gelu), (F.relu, TF.relu)):
        out = fl(flow.tensor(x))
        assert out.dtype is flow.float16
        _close(out, th(torch.tensor(x)), 2e-3)


@pytest.mark.parametrize("name,kwargs", [
    ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("elu", {"alpha": 0.6}), ("silu", {}),
    ("mish", {}), ("softplus", {"beta": 1.5}), ("logsigmoid", {}), ("relu", {}),
    ("leaky_relu", {}), ("hardswish", {}),
])
def test_activation_second_derivatives(name, kwargs):
    _second_order(lambda a: getattr(F, name)(a, **kwargs),
                  lambda a: getattr(TF, name)(a, **kwargs), [X * 2])


def test_glu():
    _compare(lambda a: F.glu(a, 0), lambda a: TF.glu(a, 0), [X])
    _compare(lambda a: F.glu(a), lambda a: TF.glu(a), [_rand(3, 2, 6)])
    with pytest.raises(RuntimeError, match="even"):
        F.glu(flow.tensor(X))


# =========================================================================================
# softmax family
# =========================================================================================
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family(name, dim):
    x = _rand(3, 4, 5) * 4
    _compare(lambda a: getattr(F, name)(a, dim), lambda a: getattr(TF, name)(a, dim), [x])


def test_softmax_dtype_argument_and_methods():
    x = _rand(3, 4).astype(np.float32)
    out = F.softmax(flow.tensor(x), 1, dtype=flow.float64)
    assert out.dtype is flow.float64
    _close(out, TF.softmax(torch.tensor(x), 1, dtype=torch.float64), 1e-12)
    _close(flow.tensor(x).log_softmax(0), torch.tensor(x).log_softmax(0), 1e-6)
    _close(flow.tensor(x).softmax(-1), torch.tensor(x).softmax(-1), 1e-6)
    ints = np.array([[1, 2], [3, 5]])
    _close(F.softmax(flow.tensor(ints), 1, dtype=flow.float32),
           TF.softmax(torch.tensor(ints), 1, dtype=torch.float32), 1e-7)
    with pytest.raises(TypeError):
        F.softmax(flow.tensor(ints), 1)


def test_softmax_implicit_dim_warns_like_torch():
    for shape, dim in (((3,), 0), ((2, 3), 1), ((2, 3, 4), 0), ((2, 3, 4, 5), 1)):
        x = _rand(*shape)
        with pytest.warns(UserWarning, match="Implicit dimension"):
            out = F.softmax(flow.tensor(x))
        _close(out, TF.softmax(torch.tensor(x), dim))


def test_softmax_extreme_values_and_scalars():
    x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0]])
    _close(F.softmax(flow.tensor(x), 1), TF.softmax(torch.tensor(x), 1))
    _close(F.log_softmax(flow.tensor(x[:1]), 1), TF.log_softmax(torch.tensor(x[:1]), 1))
    _close(F.softmax(flow.tensor(2.5), 0), TF.softmax(torch.tensor(2.5), 0))
    with pytest.raises(IndexError):
        F.softmax(flow.tensor(X), 2)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_second_derivatives(name):
    _second_order(lambda a: getattr(F, name)(a, 1), lambda a: getattr(TF, name)(a, 1), [X])


# =========================================================================================
# normalisation
# =========================================================================================
def test_layer_norm_variants():
    x = _rand(2, 3, 4) * 3 + 1
    w, b = _rand(3, 4), _rand(3, 4)
    _compare(lambda a, c, d: F.layer_norm(a, (3, 4), c, d),
             lambda a, c, d: TF.layer_norm(a, (3, 4), c, d), [x, w, b])
    _compare(lambda a: F.layer_norm(a, 4), lambda a: TF.layer_norm(a, (4,)), [x])
    _compare(lambda a, c: F.layer_norm(a, [4], c, eps=0.1),
             lambda a, c: TF.layer_norm(a, [4], c, eps=0.1), [x, w[0]])
    _second_order(lambda a, c, d: F.layer_norm(a, (4,), c, d),
                  lambda a, c, d: TF.layer_norm(a, (4,), c, d), [x, w[0], b[0]])


def test_layer_norm_errors():
    with pytest.raises(RuntimeError, match=r"expected input with shape \[\*, 4\]"):
        F.layer_norm(flow.tensor(_rand(2, 3)), [4])
    with pytest.raises(RuntimeError, match="same shape as normalized_shape"):
        F.layer_norm(flow.tensor(_rand(2, 3)), [3], flow.tensor(_rand(4)))


def test_group_norm():
    x = _rand(3, 6, 5) * 2 + 1
    w, b = _rand(6), _rand(6)
    for groups in (1, 2, 3, 6):
        _compare(lambda a, c, d, g=groups: F.group_norm(a, g, c, d),
                 lambda a, c, d, g=groups: TF.group_norm(a, g, c, d), [x, w, b])
    _compare(lambda a: F.group_norm(a, 2, eps=0.01), lambda a: TF.group_norm(a, 2, eps=0.01),
             [_rand(2, 4, 3, 3)])
    with pytest.raises(RuntimeError, match="divisible by num_groups"):
        F.group_norm(flow.tensor(x), 4)


def test_instance_norm():
    x = _rand(2, 3, 4, 5)
    w, b = _rand(3), _rand(3)
    _compare(lambda a, c, d: F.instance_norm(a, weight=c, bias=d),
             lambda a, c, d: TF.instance_norm(a, weight=c, bias=d), [x, w, b])


@pytest.mark.parametrize("shape", [(4, 3), (4, 3, 5), (2, 3, 2, 2)])
def test_batch_norm_training_updates_running_stats(shape):
    x = _rand(*shape) * 2 + 0.5
    w, b = _rand(3), _rand(3)
    rm_f, rv_f = flow.tensor(_rand(3)), flow.tensor(RNG.uniform(0.5, 2, 3))
    rm_t, rv_t = torch.tensor(rm_f.numpy().copy()), torch.tensor(rv_f.numpy().copy())
    version = rm_f._version
    _compare(lambda a, c, d: F.batch_norm(a, rm_f, rv_f, c, d, training=True, momentum=0.3),
             lambda a, c, d: TF.batch_norm(a, rm_t, rv_t, c, d, training=True, momentum=0.3),
             [x, w, b])
    _close(rm_f, rm_t, 1e-12)
    _close(rv_f, rv_t, 1e-12)
    assert rm_f._version > version
    assert not rm_f.requires_grad and rm_f.grad_fn is None


def test_batch_norm_eval_and_no_running_stats():
    x = _rand(4, 3, 2)
    rm, rv = _rand(3), RNG.uniform(0.5, 2, 3)
    _compare(lambda a, c: F.batch_norm(a, flow.tensor(rm), flow.tensor(rv), c, eps=0.01),
             lambda a, c: TF.batch_norm(a, torch.tensor(rm), torch.tensor(rv), c, eps=0.01),
             [x, _rand(3)])
    _compare(lambda a: F.batch_norm(a, None, None, training=True),
             lambda a: TF.batch_norm(a, None, None, training=True), [x])
    with pytest.raises(RuntimeError, match="evaluation mode"):
        F.batch_norm(flow.tensor(x), None, None)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(flow.tensor(_rand(1, 3)), None, None, training=True)


def test_batch_norm_float32_running_stats_with_float32_input():
    x = _rand(8, 3).astype(np.float32)
    rm_f, rv_f = flow.zeros(3), flow.ones(3)
    rm_t, rv_t = torch.zeros(3), torch.ones(3)
    F.batch_norm(flow.tensor(x), rm_f, rv_f, training=True)
    TF.batch_norm(torch.tensor(x), rm_t, rv_t, training=True)
    assert rm_f.dtype is flow.float32
    _close(rm_f, rm_t, 1e-6)
    _close(rv_f, rv_t, 1e-6)


# =========================================================================================
# dropout
# =========================================================================================
def test_dropout_identity_cases_return_the_input():
    x = flow.tensor(X)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    out = F.dropout(x, 1.0)
    assert not np.any(out.numpy())
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, -0.1, training=False)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics_and_scale(p):
    flow.manual_seed(7)
    n = 200_000
    x = flow.tensor(RNG.uniform(1, 2, n), requires_grad=True)
    out = F.dropout(x, p)
    y = out.detach().numpy()
    kept = y != 0
    # Binomial(n, 1-p): the kept fraction is within 5 standard deviations of 1 - p.
    assert abs(kept.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(y[kept], x.detach().numpy()[kept] / (1 - p), rtol=1e-15)
    # The backward uses the same mask and scale.
    out.backward(flow.ones(n, dtype=flow.float64))
    np.testing.assert_array_equal(x.grad.numpy(), kept / (1 - p))
    # Neighbouring elements are independent: no correlation between consecutive draws.
    corr = np.corrcoef(kept[:-1], kept[1:])[0, 1]
    assert abs(corr) < 5 / np.sqrt(n)


def test_dropout_is_reproducible_and_advances_the_generator():
    flow.manual_seed(3)
    a = F.dropout(flow.ones(1000), 0.5).numpy()
    b = F.dropout(flow.ones(1000), 0.5).numpy()
    flow.manual_seed(3)
    c = F.dropout(flow.ones(1000), 0.5).numpy()
    np.testing.assert_array_equal(a, c)
    assert np.any(a != b)


def test_dropout_pieces_draw_the_logical_tensor():
    """A piece of a global tensor draws exactly its slice of the logical mask."""
    opdef = registry.get("dropout")
    prims = primitives("cpu")
    x = np.ones((5, 7))
    shape = x.shape
    full_meta = (TensorMeta(shape, flow.float64),)
    outs = full_meta + (TensorMeta(shape, flow.bool),)
    ctx = KernelContext(prims, "dropout", full_meta, outs, seed=11, offset=40)
    whole, mask = opdef.kernel(ctx, x, p=0.3)
    for rows, cols in ((slice(0, 3), slice(0, 7)), (slice(3, 5), slice(2, 6))):
        piece = x[rows, cols]
        pm = (TensorMeta(piece.shape, flow.float64),)
        pouts = pm + (TensorMeta(piece.shape, flow.bool),)
        pctx = KernelContext(prims, "dropout", pm, pouts, logical_in=full_meta,
                             logical_out=outs, out_pieces=[(rows, cols), (rows, cols)],
                             seed=11, offset=40)
        part, part_mask = opdef.kernel(pctx, piece, p=0.3)
        np.testing.assert_array_equal(part, whole[rows, cols])
        np.testing.assert_array_equal(part_mask, mask[rows, cols])


def test_dropout_inplace():
    flow.manual_seed(5)
    x = flow.ones(4000)
    out = F.dropout(x, 0.25, inplace=True)
    assert out is x
    vals = np.unique(x.numpy())
    np.testing.assert_allclose(sorted(vals), [0.0, 1 / 0.75])


@pytest.mark.parametrize("fn,shape,lead", [
    (F.dropout1d, (8, 50, 6), 2), (F.dropout2d, (8, 50, 3, 3), 2),
    (F.dropout3d, (4, 50, 2, 2, 2), 2), (F.dropout3d, (50, 3, 3, 3), 1), (F.dropout1d, (50, 6), 1),
    (F.dropout2d, (50, 3, 3), 2),  # torch reads 3-D input to dropout2d as (N, C, L), warning
])
@pytest.mark.filterwarnings("ignore:dropout2d")
def test_feature_dropout_zeroes_whole_channels(fn, shape, lead):
    """One draw per (sample, channel), or per channel for unbatched input."""
    flow.manual_seed(9)
    x = flow.ones(*shape, requires_grad=True)
    out = fn(x, 0.4)
    y = out.detach().numpy()
    per_channel = y.reshape(int(np.prod(shape[:lead])), -1)
    # Each channel is all zeros or all 1 / (1 - p).
    assert np.all((per_channel == 0).all(1) | np.isclose(per_channel, 1 / 0.6).all(1))
    assert 0.1 < (per_channel[:, 0] == 0).mean() < 0.75
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), y)
    assert fn(x, 0.4, training=False) is x


# =========================================================================================
# linear, bilinear
# =========================================================================================
def test_linear_forms():
    _compare(F.linear, TF.linear, [_rand(2, 3, 4), _rand(5, 4), _rand(5)])
    _compare(F.linear, TF.linear, [_rand(3, 4), _rand(5, 4)])
    _compare(F.linear, TF.linear, [_rand(4), _rand(5, 4), _rand(5)])
    _compare(F.linear, TF.linear, [_rand(3, 4), _rand(4)])
    _second_order(F.linear, TF.linear, [_rand(3, 4), _rand(2, 4), _rand(2)])
    with pytest.raises(RuntimeError, match=r"mat1 and mat2 shapes cannot be multiplied"):
        F.linear(flow.tensor(_rand(2, 3)), flow.tensor(_rand(4, 5)), flow.tensor(_rand(4)))


def test_bilinear():
    _compare(F.bilinear, TF.bilinear, [_rand(3, 4), _rand(3, 5), _rand(2, 4, 5), _rand(2)])
    _compare(F.bilinear, TF.bilinear, [_rand(2, 3, 4), _rand(2, 3, 5), _rand(6, 4, 5)])


# =========================================================================================
# embedding, one_hot
# =========================================================================================
def test_embedding_padding_idx_gets_no_gradient():
    idx = np.array([[1, 2, 1], [0, 1, 3]])
    for pad in (1, -3):
        _compare(lambda w, p=pad: F.embedding(flow.tensor(idx), w, padding_idx=p),
                 lambda w, p=pad: TF.embedding(torch.tensor(idx), w, padding_idx=p),
                 [_rand(4, 3)])


def test_embedding_scale_grad_by_freq():
    idx = np.array([[1, 2, 1], [0, 1, 3]])
    _compare(lambda w: F.embedding(flow.tensor(idx), w, scale_grad_by_freq=True),
             lambda w: TF.embedding(torch.tensor(idx), w, scale_grad_by_freq=True),
             [_rand(4, 3)])
    _compare(lambda w: F.embedding(flow.tensor(idx), w, 2, scale_grad_by_freq=True),
             lambda w: TF.embedding(torch.tensor(idx), w, 2, scale_grad_by_freq=True),
             [_rand(4, 3)])


def test_embedding_max_norm_renormalises_in_place():
    weight = _rand(5, 3) * 2
    idx = np.array([0, 2, 2, 4])
    wf, wt = flow.tensor(weight, requires_grad=True), torch.tensor(weight, requires_grad=True)
    out_f = F.embedding(flow.tensor(idx), wf, max_norm=1.5)
    out_t = TF.embedding(torch.tensor(idx), wt, max_norm=1.5)
    _close(out_f, out_t)
    _close(wf, wt)  # looked-up rows with large norms were scaled in place; others untouched
    out_f = F.embedding(flow.tensor(idx), flow.tensor(weight), max_norm=0.5, norm_type=1.0)
    out_t = TF.embedding(torch.tensor(idx), torch.tensor(weight), max_norm=0.5, norm_type=1.0)
    _close(out_f, out_t)


def test_embedding_second_derivative_and_errors():
    idx = np.array([[1, 2], [2, 0]])
    _second_order(lambda w: F.embedding(flow.tensor(idx), w, padding_idx=0),
                  lambda w: TF.embedding(torch.tensor(idx), w, padding_idx=0), [_rand(3, 2)])
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(flow.tensor([0, 5]), flow.tensor(_rand(3, 2)))
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding(flow.tensor([-1]), flow.tensor(_rand(3, 2)))
    with pytest.raises(ValueError, match="Padding_idx"):
        F.embedding(flow.tensor([0]), flow.tensor(_rand(3, 2)), padding_idx=3)
    with pytest.raises(TypeError, match="Long, Int"):
        F.embedding(flow.tensor([0.0]), flow.tensor(_rand(3, 2)))


def test_embedding_grad_scaling_second_derivative_is_exact():
    """embedding_grad with scale_grad_by_freq is linear in grad_output: its own gradient
    divides by the frequencies too (checked against finite differences: it is linear, so the
    directional derivative is the map itself)."""
    idx = flow.tensor([[1, 2, 1], [0, 1, 1]])
    g = flow.tensor(_rand(2, 3, 2), requires_grad=True)
    out = registry.op("embedding_grad", g, idx, num_weights=3, scale_grad_by_freq=True)
    u = _rand(3, 2)
    (dg,) = flow.autograd.grad((out * flow.tensor(u)).sum(), [g])
    # <embedding_grad(g), u> is linear in g: its gradient is the map's adjoint applied to u.
    expected = np.zeros((2, 3, 2))
    counts = np.bincount(idx.numpy().ravel(), minlength=3)
    for pos in np.ndindex(2, 3):
        row = idx.numpy()[pos]
        expected[pos] = u[row] / counts[row]
    _close(dg, expected, 1e-12)


def test_one_hot():
    t = np.array([[0, 3], [2, 1]])
    for n in (-1, 4, 6):
        out = F.one_hot(flow.tensor(t), n)
        assert out.dtype is flow.int64
        np.testing.assert_array_equal(out.numpy(), TF.one_hot(torch.tensor(t), n).numpy())
    assert F.one_hot(flow.tensor(np.zeros(0, np.int64)), 3).shape == (0, 3)
    with pytest.raises(RuntimeError, match="smaller than num_classes"):
        F.one_hot(flow.tensor([1, 4]), 3)
    with pytest.raises(RuntimeError, match="non-negative"):
        F.one_hot(flow.tensor([1, -1]), 3)
    with pytest.raises(RuntimeError, match="empty tensor"):
        F.one_hot(flow.tensor(np.zeros(0, np.int64)))
    with pytest.raises(TypeError, match="LongTensor"):
        F.one_hot(flow.tensor([1.0]), 3)


def test_one_hot_class_split_piece():
    """A piece of the class axis compares against its own range of classes."""
    opdef = registry.get("one_hot")
    x = np.array([0, 3, 4, 1])
    full = (TensorMeta((4, 6), flow.int64),)
    ctx = KernelContext(primitives("cpu"), "one_hot", (TensorMeta((4,), flow.int64),), full,
                        out_pieces=[(slice(0, 4), slice(3, 6))])
    ctx.out_metas = (TensorMeta((4, 3), flow.int64),)
    part = opdef.kernel(ctx, x, num_classes=6)
    np.testing.assert_array_equal(part, np.eye(6, dtype=np.int64)[x][:, 3:6])


# =========================================================================================
# nll_loss, cross_entropy
# =========================================================================================
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(reduction, weighted):
    w = CLASS_WEIGHT if weighted else None
    logp = TF.log_softmax(torch.tensor(X), 1).numpy()
    _compare(lambda a: F.nll_loss(a, flow.tensor(TARGET), None if w is None else flow.tensor(w),
                                  reduction=reduction),
             lambda a: TF.nll_loss(a, torch.tensor(TARGET),
                                   None if w is None else torch.tensor(w), reduction=reduction),
             [logp])


def test_nll_loss_spatial_and_1d_inputs():
    x = _rand(2, 4, 3, 2)
    t = RNG.integers(0, 4, (2, 3, 2))
    t[0, 1, 1] = 2
    for reduction in ("mean", "sum", "none"):
        _compare(lambda a, r=reduction: F.nll_loss(a, flow.tensor(t), ignore_index=2,
                                                   reduction=r),
                 lambda a, r=reduction: TF.nll_loss(a, torch.tensor(t), ignore_index=2,
                                                    reduction=r), [x])
    _compare(lambda a: F.nll_loss(a, flow.tensor(3), reduction="none"),
             lambda a: TF.nll_loss(a, torch.tensor(3), reduction="none"), [_rand(5)])
    # torch also takes a 1-element target for 1-D input (its backward fails on it: values only)
    _compare(lambda a: F.nll_loss(a, flow.tensor([3])),
             lambda a: TF.nll_loss(a, torch.tensor([3])), [_rand(5)], grad=[])


def test_nll_loss_all_ignored_mean_is_nan_like_torch():
    out = F.nll_loss(flow.tensor(X), flow.tensor([-100] * 4))
    assert np.isnan(out.item()) and np.isnan(TF.nll_loss(torch.tensor(X),
                                                         torch.tensor([-100] * 4)).item())


def test_nll_loss_legacy_reduction_flags():
    with pytest.warns(UserWarning):
        out = F.nll_loss(flow.tensor(X), flow.tensor(TARGET), size_average=False)
    _close(out, TF.nll_loss(torch.tensor(X), torch.tensor(TARGET), reduction="sum"))
    with pytest.warns(UserWarning):
        out = F.nll_loss(flow.tensor(X), flow.tensor(TARGET), reduce=False)
    _close(out, TF.nll_loss(torch.tensor(X), torch.tensor(TARGET), reduction="none"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_cross_entropy_class_indices(reduction, weighted, smoothing):
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    w = CLASS_WEIGHT if weighted else None
    _compare(lambda a: F.cross_entropy(a, flow.tensor(TARGET),
                                       None if w is None else flow.tensor(w), **kw),
             lambda a: TF.cross_entropy(a, torch.tensor(TARGET),
                                        None if w is None else torch.tensor(w), **kw), [X])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_spatial_with_ignore_and_smoothing(reduction):
    x = _rand(2, 3, 4)
    t = np.array([[0, 2, 1, 1], [1, 1, 0, 2]])
    kw = {"reduction": reduction, "label_smoothing": 0.1, "ignore_index": 1}
    _compare(lambda a: F.cross_entropy(a, flow.tensor(t), flow.tensor(CLASS_WEIGHT[:3]), **kw),
             lambda a: TF.cross_entropy(a, torch.tensor(t), torch.tensor(CLASS_WEIGHT[:3]), **kw),
             [x])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_probability_targets(reduction, smoothing):
    probs = RNG.dirichlet(np.ones(5), 4)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    _compare(lambda a, p: F.cross_entropy(a, p, **kw),
             lambda a, p: TF.cross_entropy(a, p, **kw), [X, probs])
    _compare(lambda a, p: F.cross_entropy(a, p, flow.tensor(CLASS_WEIGHT), **kw),
             lambda a, p: TF.cross_entropy(a, p, torch.tensor(CLASS_WEIGHT), **kw),
             [X, probs])
    x3, p3 = _rand(2, 5, 3), RNG.dirichlet(np.ones(5), (2, 3)).transpose(0, 2, 1)
    _compare(lambda a, p: F.cross_entropy(a, p, **kw), lambda a, p: TF.cross_entropy(a, p, **kw),
             [x3, np.ascontiguousarray(p3)])


def test_cross_entropy_1d_input_and_second_derivative():
    _compare(lambda a: F.cross_entropy(a, flow.tensor(2)),
             lambda a: TF.cross_entropy(a, torch.tensor(2)), [_rand(5)])
    t = np.array([0, 4, 1, 3])
    _second_order(lambda a: F.cross_entropy(a, flow.tensor(t), label_smoothing=0.1),
                  lambda a: TF.cross_entropy(a, torch.tensor(t), label_smoothing=0.1), [X])


def test_cross_entropy_float32_matches_torch():
    x = _rand(6, 10).astype(np.float32)
    t = RNG.integers(0, 10, 6)
    out = F.cross_entropy(flow.tensor(x), flow.tensor(t))
    assert out.dtype is flow.float32
    _close(out, TF.cross_entropy(torch.tensor(x), torch.tensor(t)), 1e-6)


def test_loss_errors_match_torch():
    x = flow.tensor(X)
    with pytest.raises(IndexError, match="Target 7 is out of bounds"):
        F.cross_entropy(x, flow.tensor([0, 1, 7, 2]))
    with pytest.raises(IndexError, match="Target -2 is out of bounds"):
        F.nll_loss(x, flow.tensor([0, 1, -2, -100]))
    with pytest.raises(ValueError, match="batch_size"):
        F.nll_loss(x, flow.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="Expected target size"):
        F.nll_loss(flow.tensor(_rand(2, 3, 4)), flow.tensor(np.zeros((2, 3), np.int64)))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.nll_loss(x, flow.tensor(TARGET), reduction="avg")
    with pytest.raises(RuntimeError, match="weight tensor should be defined"):
        F.nll_loss(x, flow.tensor(TARGET), weight=flow.tensor(np.ones(3)))
    with pytest.raises(TypeError, match="Long or Byte"):
        F.nll_loss(x, flow.tensor(TARGET.astype(np.int32)))
    with pytest.raises(RuntimeError, match="label_smoothing"):
        F.cross_entropy(x, flow.tensor(TARGET), label_smoothing=1.5)
    with pytest.raises(ValueError, match="1 or more dimensions"):
        F.cross_entropy(flow.tensor(1.0), flow.tensor(0))


# Index ranges are data-dependent: the kernels check them, so a call never syncs the Python
# thread; a bad index raises at once when the kernel runs inline, else at the next sync.
_INDEX_ERRORS = [
    ("cross_entropy", lambda: F.cross_entropy(flow.tensor(X), flow.tensor([0, 1, 7, 2])),
     IndexError, "nll_loss: Target 7 is out of bounds."),
    ("nll_loss", lambda: F.nll_loss(flow.tensor(X), flow.tensor([0, 1, -2, -100])),
     IndexError, "nll_loss: Target -2 is out of bounds."),
    ("embedding", lambda: F.embedding(flow.tensor([[0, 5]]), flow.tensor(_rand(3, 2))),
     IndexError, "embedding: embedding(): index out of range in self (index 5, table of 3 "
     "rows)"),
    ("embedding_neg", lambda: F.embedding(flow.tensor([-1, 2]), flow.tensor(_rand(3, 2))),
     IndexError, "embedding(): index out of range in self (index -1,"),
    ("one_hot", lambda: F.one_hot(flow.tensor([1, 4]), 3),
     RuntimeError, "one_hot: Class values must be smaller than num_classes."),
    ("one_hot_neg", lambda: F.one_hot(flow.tensor([1, -1]), 3),
     RuntimeError, "one_hot: Class values must be non-negative."),
]


@pytest.mark.parametrize("name,program,cls,text", _INDEX_ERRORS,
                         ids=[c[0] for c in _INDEX_ERRORS])
def test_index_range_errors_inline_and_from_the_worker(name, program, cls, text):
    flow.synchronize()  # an idle stream: the small kernel runs inline and raises right here
    with pytest.raises(cls) as info:
        program()
    assert text in str(info.value)
    with flow.vm.inline_max(0):  # on the worker: the call returns, the error comes later
        out = program()
        line = program.__code__.co_firstlineno
    with pytest.raises(cls) as info:
        out.numpy()
    assert isinstance(info.value, flow.vm.KernelError)
    assert text in str(info.value) and f"test_nn_extra.py:{line}" in str(info.value)
    flow.synchronize()  # reported once; the VM stays usable
    with flow.vm.inline_max(0):
        program()
    with pytest.raises(cls, match="out of|Class values"):
        flow.synchronize()


def test_index_range_checks_skip_ignored_targets_on_the_worker():
    x = _rand(4, 5)
    with flow.vm.inline_max(0):
        for t, kw in (([0, 9, 1, 4], {"ignore_index": 9}), ([-100, 4, -100, 0], {})):
            for fn, tfn in ((F.cross_entropy, TF.cross_entropy), (F.nll_loss, TF.nll_loss)):
                out = fn(flow.tensor(x), flow.tensor(t), **kw)
                _close(out, tfn(torch.tensor(x), torch.tensor(t), **kw))


def test_index_checks_do_not_sync_per_call(monkeypatch):
    """cross_entropy, nll_loss, embedding and one_hot (with num_classes) issue their work and
    return: no host access (item(), numpy()) and no synchronize during the call."""
    from sbpflow.vm import VirtualMachine

    syncs = []
    for method in ("access", "synchronize"):
        orig = getattr(VirtualMachine, method)
        monkeypatch.setattr(VirtualMachine, method,
                            lambda self, *a, _o=orig, _m=method, **k: (syncs.append(_m),
                                                                        _o(self, *a, **k))[1])
    x, t = flow.tensor(_rand(6, 5), requires_grad=True), flow.tensor([0, 4, 1, -100, 2, 3])
    idx, w = flow.tensor([[0, 2], [1, 1]]), flow.tensor(_rand(3, 2), requires_grad=True)
    with flow.vm.inline_max(0):
        ce = F.cross_entropy(x, t)
        nll = F.nll_loss(x, t, reduction="sum")
        emb = F.embedding(idx, w)
        oh = F.one_hot(t.clamp(0, 4), 5)
        ce.backward()
        emb.sum().backward()
    assert syncs == [], syncs
    monkeypatch.undo()
    xn, tn = torch.tensor(_host(x)), torch.tensor(t.numpy())
    _close(ce, TF.cross_entropy(xn, tn))
    _close(nll, TF.nll_loss(xn, tn, reduction="sum"))
    _close(emb, _host(w)[idx.numpy()])
    assert oh.numpy().sum() == 6 and w.grad.numpy().sum() == 8.0


# =========================================================================================
# regression and binary losses
# =========================================================================================
@pytest.mark.parametrize("name,kwargs", [
    ("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
    ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}), ("huber_loss", {"delta": 0.3}),
])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(name, kwargs, reduction):
    _compare(lambda a, b: getattr(F, name)(a, b, reduction=reduction, **kwargs),
             lambda a, b: getattr(TF, name)(a, b, reduction=reduction, **kwargs), [X, Y])


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_weighted_regression_losses(name, reduction):
    w = RNG.uniform(0.1, 2, X.shape)
    _compare(lambda a, b, c: getattr(F, name)(a, b, reduction=reduction, weight=c),
             lambda a, b, c: getattr(TF, name)(a, b, reduction=reduction, weight=c), [X, Y, w])
    with pytest.raises(ValueError, match="same size"):
        getattr(F, name)(flow.tensor(X), flow.tensor(Y), weight=flow.tensor(w[0]))


def test_regression_loss_broadcast_warns():
    with pytest.warns(UserWarning, match="different to the input size"):
        out = F.mse_loss(flow.tensor(X), flow.tensor(Y[0]))
    _close(out, TF.mse_loss(torch.tensor(X), torch.tensor(Y[0])))
    with pytest.raises(RuntimeError, match="negative values for beta"):
        F.smooth_l1_loss(flow.tensor(X), flow.tensor(Y), beta=-1.0)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy(reduction):
    p = RNG.uniform(0.02, 0.98, (4, 5))
    y = RNG.uniform(0, 1, (4, 5))
    _compare(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy(a, b, reduction=reduction), [p, y])
    w = flow.tensor(CLASS_WEIGHT)
    _compare(lambda a, b: F.binary_cross_entropy(a, b, w, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy(a, b, torch.tensor(CLASS_WEIGHT),
                                                  reduction=reduction), [p, y])


def test_binary_cross_entropy_clamps_logs_at_minus_100():
    p = np.array([0.0, 1.0, 1e-60, 1 - 1e-17, 0.5])
    y = np.array([0.3, 0.6, 1.0, 0.0, 0.5])
    _compare(lambda a: F.binary_cross_entropy(a, flow.tensor(y), reduction="none"),
             lambda a: TF.binary_cross_entropy(a, torch.tensor(y), reduction="none"), [p],
             tol=1e-7)
    with pytest.raises(ValueError, match="different to the input size"):
        F.binary_cross_entropy(flow.tensor(p), flow.tensor(y[:, None]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_with_logits(reduction):
    x = X * 8  # includes large logits: the log-sigmoid form must stay finite
    y = RNG.uniform(0, 1, X.shape)
    pw = torch.tensor(RNG.uniform(0.5, 3, 5))
    _compare(lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=reduction),
             lambda a, b: TF.binary_cross_entropy_with_logits(a, b, reduction=reduction), [x, y])
    _compare(lambda a, b: F.binary_cross_entropy_with_logits(
        a, b, flow.tensor(CLASS_WEIGHT), reduction=reduction, pos_weight=flow.tensor(pw.numpy())),
        lambda a, b: TF.binary_cross_entropy_with_logits(
            a, b, torch.tensor(CLASS_WEIGHT), reduction=reduction, pos_weight=pw), [x, y])
    with pytest.raises(ValueError, match="must be the same as input size"):
        F.binary_cross_entropy_with_logits(flow.tensor(x), flow.tensor(y[0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_and_embedding_losses(reduction):
    sign = np.where(RNG.uniform(size=4) > 0.5, 1.0, -1.0)
    kw = {"reduction": reduction}
    _compare(lambda a, b: F.soft_margin_loss(a, b, **kw),
             lambda a, b: TF.soft_margin_loss(a, b, **kw), [X * 10, np.sign(Y)], grad=[0])
    labels = (RNG.uniform(size=X.shape) > 0.5).astype(np.float64)
    _compare(lambda a, c: F.multilabel_soft_margin_loss(a, flow.tensor(labels), c, **kw),
             lambda a, c: TF.multilabel_soft_margin_loss(a, torch.tensor(labels), c, **kw),
             [X, RNG.uniform(0.5, 2, 5)], grad=[0])
    _compare(lambda a, b: F.margin_ranking_loss(a, b, flow.tensor(sign), 0.3, **kw),
             lambda a, b: TF.margin_ranking_loss(a, b, torch.tensor(sign), 0.3, **kw),
             [X[:, 0], Y[:, 0]])
    _compare(lambda a: F.hinge_embedding_loss(a, flow.tensor(np.sign(Y)), 0.5, **kw),
             lambda a: TF.hinge_embedding_loss(a, torch.tensor(np.sign(Y)), 0.5, **kw), [X])
    _compare(lambda a, b: F.cosine_embedding_loss(a, b, flow.tensor(sign), 0.2, **kw),
             lambda a, b: TF.cosine_embedding_loss(a, b, torch.tensor(sign), 0.2, **kw), [X, Y])
    _compare(lambda a, b, c: F.triplet_margin_loss(a, b, c, **kw),
             lambda a, b, c: TF.triplet_margin_loss(a, b, c, **kw), [X, Y, _rand(4, 5)])
    _compare(lambda a, b, c: F.triplet_margin_loss(a, b, c, 0.5, 1.0, swap=True, **kw),
             lambda a, b, c: TF.triplet_margin_loss(a, b, c, 0.5, 1.0, swap=True, **kw),
             [X, Y, _rand(4, 5)])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("log_input,full", [(True, False), (False, False), (True, True),
                                            (False, True)])
def test_poisson_nll_loss(reduction, log_input, full):
    x = X if log_input else RNG.uniform(0.1, 3, X.shape)
    counts = RNG.integers(0, 6, X.shape).astype(np.float64)
    kw = {"log_input": log_input, "full": full, "reduction": reduction}
    _compare(lambda a: F.poisson_nll_loss(a, flow.tensor(counts), **kw),
             lambda a: TF.poisson_nll_loss(a, torch.tensor(counts), **kw), [x])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(reduction, log_target):
    logp = TF.log_softmax(torch.tensor(X), 1).numpy()
    target = TF.log_softmax(torch.tensor(Y), 1).numpy() if log_target else \
        RNG.dirichlet(np.ones(5), 4)
    kw = {"reduction": reduction, "log_target": log_target}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _compare(lambda a, b: F.kl_div(a, b, **kw), lambda a, b: TF.kl_div(a, b, **kw),
                 [logp, target])
    assert any("batchmean" in str(w.message) for w in caught) == (reduction == "mean")
    if not log_target:
        # 0 * log 0 counts as 0.  (torch's gradient for such a target is nan: not compared.)
        target[0, 2] = 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _compare(lambda a, b: F.kl_div(a, b, **kw), lambda a, b: TF.kl_div(a, b, **kw),
                     [logp, target], grad=[0])


# =========================================================================================
# attention
# =========================================================================================
Q, K, V = _rand(2, 3, 4, 8), _rand(2, 3, 6, 8), _rand(2, 3, 6, 5)


@pytest.mark.parametrize("kwargs", [{}, {"scale": 0.3}, {"is_causal": True}])
def test_sdpa(kwargs):
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs),
             lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **kwargs), [Q, K, V])


def test_sdpa_masks_including_fully_masked_rows():
    keep = RNG.uniform(size=(4, 6)) > 0.4
    keep[1] = False  # a row with nothing to attend to: zeros, zero gradients
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, flow.tensor(keep)),
             lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, torch.tensor(keep)),
             [Q, K, V])
    bias = _rand(3, 4, 6)
    _compare(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
             lambda q, k, v, m: TF.scaled_dot_product_attention(q, k, v, m), [Q, K, V, bias])
    bias[..., 2, :] = -np.inf
    _compare(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, flow.tensor(bias)),
             lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, torch.tensor(bias)),
             [Q, K, V])


def test_sdpa_grouped_query_and_unbatched():
    k, v = _rand(2, 1, 6, 8), _rand(2, 1, 6, 5)
    _compare(lambda q, kk, vv: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True),
             lambda q, kk, vv: TF.scaled_dot_product_attention(q, kk, vv, enable_gqa=True),
             [Q, k, v])
    _compare(F.scaled_dot_product_attention, TF.scaled_dot_product_attention,
             [_rand(4, 8), _rand(6, 8), _rand(6, 3)])
    with pytest.raises(RuntimeError, match="is_causal"):
        F.scaled_dot_product_attention(flow.tensor(Q), flow.tensor(K), flow.tensor(V),
                                       flow.tensor(np.ones((4, 6), bool)), is_causal=True)


def test_sdpa_dropout_uses_dropout_on_the_weights():
    q, k, v = flow.tensor(Q), flow.tensor(K), flow.tensor(V)
    flow.manual_seed(21)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    flow.manual_seed(21)
    weights = F.softmax(flow.matmul(q, k.transpose(-2, -1)) * (1 / np.sqrt(8)), -1)
    expected = flow.matmul(F.dropout(weights, 0.4), v)
    _close(out, expected, 1e-12)
    assert not np.allclose(out.numpy(), F.scaled_dot_product_attention(q, k, v).numpy())


# =========================================================================================
# distances
# =========================================================================================
def test_pairwise_distance():
    _compare(F.pairwise_distance, TF.pairwise_distance, [X, Y])
    _compare(lambda a, b: F.pairwise_distance(a, b, 1.0, keepdim=True),
             lambda a, b: TF.pairwise_distance(a, b, 1.0, keepdim=True), [X, Y])
    _compare(lambda a, b: F.pairwise_distance(a, b, 3.0, 1e-3),
             lambda a, b: TF.pairwise_distance(a, b, 3.0, 1e-3), [X, Y[0]])


def test_normalize_and_cosine_similarity():
    _compare(lambda a: F.normalize(a), lambda a: TF.normalize(a), [X])
    _compare(lambda a: F.normalize(a, p=1.0, dim=0), lambda a: TF.normalize(a, p=1.0, dim=0),
             [X])
    _compare(lambda a: F.normalize(a, p=3.0, dim=-1), lambda a: TF.normalize(a, p=3.0, dim=-1),
             [X])
    _compare(F.cosine_similarity, TF.cosine_similarity, [X, Y])
    _compare(lambda a, b: F.cosine_similarity(a, b, dim=0),
             lambda a, b: TF.cosine_similarity(a, b, dim=0), [X, Y])
