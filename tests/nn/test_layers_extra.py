"""Conv3d/ConvTranspose, dropout variants, pooling modules, Embedding options, EmbeddingBag
and CTCLoss against torch 2.13: same weights, same input -> same outputs, gradients,
state_dict keys and reprs; random layers by their statistics and mask structure."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F


def _x(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _load_from_torch(ours, theirs):
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        assert tuple(a.shape) == tuple(b.shape), k
    sd = {k: flow.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()}
    result = ours.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys


def _compare(ours, theirs, *inputs, rtol=1e-6, atol=1e-6, call=None, int_inputs=()):
    """Outputs, input and parameter gradients of ours and theirs on the same data."""
    _load_from_torch(ours, theirs)
    assert repr(ours) == repr(theirs)

    def make(lib, x, i):
        grad = i not in int_inputs and x.dtype.kind == "f"
        return lib.tensor(x, requires_grad=grad)

    f_in = [make(flow, x, i) for i, x in enumerate(inputs)]
    t_in = [make(torch, x, i) for i, x in enumerate(inputs)]
    call = call or (lambda m, *a: m(*a))
    f_out, t_out = call(ours, *f_in), call(theirs, *t_in)
    if isinstance(t_out, tuple):
        np.testing.assert_array_equal(f_out[1].numpy(), t_out[1].numpy())
        f_out, t_out = f_out[0], t_out[0]
    np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(), rtol, atol)
    cot = np.random.default_rng(1).standard_normal(tuple(t_out.shape))
    f_out.backward(flow.tensor(cot, dtype=f_out.dtype))
    t_out.backward(torch.tensor(cot, dtype=t_out.dtype))
    for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol * 10, atol * 10,
                                   err_msg=name)
    for a, b in zip(f_in, t_in):
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol * 10, atol * 10)


# -- convolution ---------------------------------------------------------------------------
CONV_CASES = [
    ("Conv3d", lambda m: m.Conv3d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 5, 6, 5)),
    ("Conv3d-dilated", lambda m: m.Conv3d(2, 3, (2, 3, 2), dilation=(2, 1, 1), bias=False),
     (1, 2, 5, 4, 4)),
    ("Conv3d-same-replicate", lambda m: m.Conv3d(2, 2, 3, padding="same",
                                                 padding_mode="replicate"), (1, 2, 4, 5, 3)),
    ("Conv2d-same-reflect", lambda m: m.Conv2d(3, 4, (3, 2), padding="same", dilation=2,
                                               padding_mode="reflect"), (2, 3, 7, 6)),
    ("Conv1d-circular", lambda m: m.Conv1d(2, 3, 3, padding=2, padding_mode="circular"),
     (2, 2, 7)),
    ("Conv2d-unbatched", lambda m: m.Conv2d(2, 3, 3, stride=2), (2, 7, 6)),
    ("ConvTranspose1d", lambda m: m.ConvTranspose1d(3, 2, 4, stride=3, padding=1, dilation=2,
                                                    bias=False), (2, 3, 5)),
    ("ConvTranspose2d", lambda m: m.ConvTranspose2d(4, 6, 3, stride=2, padding=1,
                                                    output_padding=1, groups=2), (2, 4, 5, 4)),
    ("ConvTranspose2d-rect", lambda m: m.ConvTranspose2d(2, 3, (3, 2), stride=(2, 1),
                                                         padding=(1, 0)), (1, 2, 4, 5)),
    ("ConvTranspose2d-unbatched", lambda m: m.ConvTranspose2d(2, 2, 2, stride=2), (2, 3, 3)),
    ("ConvTranspose3d", lambda m: m.ConvTranspose3d(2, 4, (2, 3, 2), stride=(2, 1, 2),
                                                    groups=2, output_padding=(1, 0, 0)),
     (1, 2, 3, 4, 3)),
    # output_padding >= stride is allowed below the dilation
    ("ConvTranspose2d-outpad-dilation", lambda m: m.ConvTranspose2d(
        2, 3, 3, stride=(1, 2), dilation=(2, 1), output_padding=(1, 1), padding=(2, 1)),
     (1, 2, 4, 5)),
    ("ConvTranspose1d-outpad-dilation", lambda m: m.ConvTranspose1d(
        2, 4, 3, stride=2, dilation=3, output_padding=2, padding=1, groups=2), (2, 2, 5)),
]


@pytest.mark.parametrize("name,make,shape", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_modules_match_torch(name, make, shape):
    torch.manual_seed(0)
    _compare(make(nn).double(), make(torch.nn).double(), _x(*shape))


def test_conv_weight_layouts_and_init():
    t = nn.ConvTranspose2d(4, 6, (3, 2), groups=2)
    assert tuple(t.weight.shape) == (4, 3, 3, 2) and tuple(t.bias.shape) == (6,)
    c = nn.Conv3d(4, 6, 3, groups=2)
    assert tuple(c.weight.shape) == (6, 2, 3, 3, 3)
    # kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the transposed
    # weight's fan_in is its dim 1 times the kernel, as torch computes it.
    big = nn.ConvTranspose1d(8, 400, 5)
    bound = 1 / math.sqrt(400 * 5)
    w = big.weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(big.bias.detach().numpy()).max() <= bound


def test_conv_transpose_output_size():
    torch.manual_seed(0)
    theirs = torch.nn.ConvTranspose2d(2, 3, 3, stride=2).double()
    ours = nn.ConvTranspose2d(2, 3, 3, stride=2).double()
    x = _x(1, 2, 4, 4)
    for size in ([10, 9], [1, 3, 9, 10], (9, 9)):
        _compare(ours, theirs, x, call=lambda m, a, size=size: m(a, output_size=size))
    with pytest.raises(ValueError, match="valid sizes range from"):
        ours(flow.tensor(x), output_size=[11, 9])
    with pytest.raises(ValueError, match="output_size must have 2 or 4 elements"):
        ours(flow.tensor(x), output_size=[9])


def test_conv_argument_errors():
    with pytest.raises(ValueError, match='Only "zeros" padding mode'):
        nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv3d(2, 2, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="strided convolutions"):
        nn.Conv2d(2, 2, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="Invalid padding string"):
        nn.Conv1d(2, 2, 3, padding="full")
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.ConvTranspose1d(3, 4, 3, groups=2)
    with pytest.raises(RuntimeError, match="smaller than either stride or dilation"):
        F.conv_transpose1d(flow.ones(1, 2, 4), flow.ones(2, 2, 3), stride=2, dilation=2,
                           output_padding=2)


def test_conv_forward_override_as_in_torch():
    """Subclasses that call `_conv_forward` with a modified weight (weight standardisation)
    run unchanged."""

    def standardised(base):
        class WSConv(base):
            def forward(self, x):
                w = self.weight
                w = w - w.mean(dim=(1, 2, 3), keepdim=True)
                return self._conv_forward(x, w, self.bias)

        return WSConv

    torch.manual_seed(0)
    _compare(standardised(nn.Conv2d)(3, 4, 3, padding=1).double(),
             standardised(torch.nn.Conv2d)(3, 4, 3, padding=1).double(), _x(2, 3, 5, 5))


# -- dropout ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,shape,lead", [
    ("Dropout1d", (40, 30, 5), 2), ("Dropout1d", (60, 5), 1),
    ("Dropout2d", (20, 30, 3, 3), 2), ("Dropout3d", (10, 30, 2, 3, 2), 2),
    ("Dropout3d", (60, 2, 2, 2), 1),
])
def test_feature_dropout_modules_zero_whole_channels(cls, shape, lead):
    flow.manual_seed(3)
    p = 0.3
    m = getattr(nn, cls)(p)
    x = flow.tensor(np.abs(_x(*shape)) + 0.5, requires_grad=True)
    y = m(x)
    rows = math.prod(shape[:lead])
    out = y.detach().numpy().reshape(rows, -1)
    xs = x.detach().numpy().reshape(rows, -1)
    kept = out != 0
    scale = 1 / (1 - p)
    # Every channel is dropped or kept whole, kept ones scaled by exactly 1 / (1 - p).
    assert np.all(kept.all(1) | ~kept.any(1))
    np.testing.assert_array_equal(out[kept], xs[kept] * scale)
    dropped = (~kept[:, 0]).mean()
    assert abs(dropped - p) < 4 * math.sqrt(p * (1 - p) / rows)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy().reshape(rows, -1), kept * scale)
    m.eval()
    assert m(x) is x
    m.train()
    assert getattr(nn, cls)(0.0)(x) is x
    np.testing.assert_array_equal(getattr(nn, cls)(1.0)(x).detach().numpy(), 0)


def test_dropout_rank_rules_follow_torch():
    with pytest.raises(RuntimeError, match="Expected 2D or 3D input"):
        nn.Dropout1d()(flow.ones(2, 3, 4, 5))
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        y = nn.Dropout2d(0.5)(flow.ones(30, 20, 4)).numpy()
    # torch reads it as (N, C, L): one draw per (sample, channel)
    assert np.all((y == y[:, :, :1]).all(-1))
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout2d"):
        nn.Dropout2d(0.5)(flow.ones(30, 20))
    with pytest.warns(UserWarning, match="Received a 3-D input to dropout3d"):
        nn.Dropout3d(0.5)(flow.ones(30, 20, 4))
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.AlphaDropout(1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.Dropout2d(0.5)(flow.ones(2, 3, 4, 4))


def test_dropout_inplace():
    flow.manual_seed(0)
    x = flow.ones(50, 40, 3)
    out = nn.Dropout1d(0.5, inplace=True)(x)
    y = x.numpy()
    assert np.all((y == y[:, :, :1]).all(-1)) and set(np.unique(y)) == {0.0, 2.0}
    np.testing.assert_array_equal(out.numpy(), y)
    x = flow.ones(50, 2, 2, 2)  # unbatched dropout3d: per channel
    F.dropout3d(x, 0.5, inplace=True)
    y = x.numpy().reshape(50, -1)
    assert np.all((y == y[:, :1]).all(-1)) and 0 < (y[:, 0] == 0).sum() < 50


_SELU_ALPHA_PRIME = 1.7580993408473766


def test_alpha_dropout_keeps_selu_statistics_and_exact_affine_map():
    flow.manual_seed(1)
    p = 0.2
    m = nn.AlphaDropout(p)
    x = flow.randn(400000, dtype=flow.float64)
    y = m(x).numpy()
    assert abs(y.mean()) < 0.01 and abs(y.std() - 1) < 0.01
    a = 1 / math.sqrt((_SELU_ALPHA_PRIME ** 2 * p + 1) * (1 - p))
    b = _SELU_ALPHA_PRIME * a * p
    xn = x.numpy()
    dropped_value = -_SELU_ALPHA_PRIME * a + b
    dropped = np.isclose(y, dropped_value, rtol=0, atol=1e-12)
    kept = np.isclose(y, xn * a + b, rtol=1e-13, atol=1e-13)
    assert np.all(dropped | kept)
    assert abs(dropped.mean() - p) < 0.005
    m.eval()
    assert m(x) is x
    assert F.alpha_dropout(x, 0.5) is x  # training defaults to False, as in torch
    np.testing.assert_array_equal(F.alpha_dropout(x, 1.0, True).numpy(), 0)


def test_feature_alpha_dropout_per_channel():
    flow.manual_seed(2)
    p = 0.4
    m = nn.FeatureAlphaDropout(p)
    x = flow.randn(200, 30, 6, dtype=flow.float64)
    y = m(x).numpy()
    a = 1 / math.sqrt((_SELU_ALPHA_PRIME ** 2 * p + 1) * (1 - p))
    b = _SELU_ALPHA_PRIME * a * p
    kept = np.isclose(y, x.numpy() * a + b, rtol=1e-13, atol=1e-13).all(-1)
    dropped = np.isclose(y, -_SELU_ALPHA_PRIME * a + b, rtol=0, atol=1e-12).all(-1)
    assert np.all(kept ^ dropped)
    assert abs(dropped.mean() - p) < 0.04
    assert repr(m) == repr(torch.nn.FeatureAlphaDropout(p))


# -- pooling ---------------------------------------------------------------------------------
POOL_CASES = [
    ("MaxPool1d", lambda m: m.MaxPool1d(3, 2, 1), (2, 3, 9)),
    ("MaxPool1d-indices", lambda m: m.MaxPool1d(2, return_indices=True, ceil_mode=True),
     (2, 3, 9)),
    ("MaxPool3d", lambda m: m.MaxPool3d(2), (2, 2, 4, 5, 4)),
    ("MaxPool3d-indices", lambda m: m.MaxPool3d((3, 2, 2), 2, 1, return_indices=True),
     (2, 2, 4, 5, 4)),
    ("AvgPool1d", lambda m: m.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 9)),
    ("AvgPool3d", lambda m: m.AvgPool3d(2, 1, 1, True, False), (2, 2, 4, 5, 4)),
    ("AvgPool3d-divisor", lambda m: m.AvgPool3d(2, divisor_override=3), (1, 2, 4, 4, 4)),
    ("AdaptiveAvgPool1d", lambda m: m.AdaptiveAvgPool1d(4), (2, 3, 9)),
    ("AdaptiveAvgPool3d", lambda m: m.AdaptiveAvgPool3d((2, None, 3)), (2, 2, 4, 5, 4)),
    ("AdaptiveMaxPool1d", lambda m: m.AdaptiveMaxPool1d(4, return_indices=True), (2, 3, 9)),
    ("AdaptiveMaxPool2d", lambda m: m.AdaptiveMaxPool2d((3, 2)), (2, 3, 7, 5)),
    ("AdaptiveMaxPool2d-up", lambda m: m.AdaptiveMaxPool2d(6, True), (1, 2, 4, 5)),
    ("AdaptiveMaxPool2d-unbatched", lambda m: m.AdaptiveMaxPool2d((None, 2)), (3, 7, 5)),
    ("AdaptiveMaxPool3d", lambda m: m.AdaptiveMaxPool3d((2, None, 3), True),
     (2, 2, 4, 5, 4)),
    ("LPPool1d", lambda m: m.LPPool1d(2, 3, 2), (2, 3, 9)),
    ("LPPool2d", lambda m: m.LPPool2d(3, (2, 3), ceil_mode=True), (2, 3, 6, 7)),
    ("LPPool2d-inf", lambda m: m.LPPool2d(float("inf"), 2), (2, 3, 6, 6)),
    ("LPPool3d", lambda m: m.LPPool3d(1.5, 2), (2, 2, 4, 4, 4)),
]


@pytest.mark.parametrize("name,make,shape", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pooling_modules_match_torch(name, make, shape):
    x = _x(*shape)
    if name.startswith("LPPool"):
        x = np.abs(x) + 0.1  # fractional powers of negative sums are NaN in both
    _compare(make(nn), make(torch.nn), x)


def test_adaptive_max_pool_ties_and_nan_indices_match_torch():
    x = np.round(_x(2, 3, 9, 8) * 1.2)
    x[0, 0, 2, 3] = x[1, 2, 8, 7] = x[1, 2, 6, 6] = np.nan
    for size in ((4, 3), (2, 5), 3):
        ours = F.adaptive_max_pool2d(flow.tensor(x), size, return_indices=True)
        theirs = torch.nn.functional.adaptive_max_pool2d(torch.tensor(x), size,
                                                          return_indices=True)
        np.testing.assert_array_equal(ours[0].numpy(), theirs[0].numpy())
        np.testing.assert_array_equal(ours[1].numpy(), theirs[1].numpy())


def test_adaptive_max_pool_errors():
    with pytest.raises(NotImplementedError, match="not implemented for 'int64'"):
        F.adaptive_max_pool2d(flow.ones(1, 2, 3, 3, dtype=flow.int64), 2)
    with pytest.raises(RuntimeError, match="Expected 3D .unbatched. or 4D"):
        F.adaptive_max_pool2d(flow.ones(2, 3), 2)
    with pytest.raises(TypeError, match="NoneType"):
        F.adaptive_max_pool1d(flow.ones(1, 2, 5), None)


@pytest.mark.parametrize("n,kernel,stride,shape", [
    (1, 2, None, (2, 3, 8)), (2, 2, None, (2, 3, 6, 8)), (2, (2, 3), (2, 3), (2, 2, 5, 9)),
    (3, 2, None, (1, 2, 4, 4, 6)),
])
def test_max_unpool_matches_torch(n, kernel, stride, shape):
    x = _x(*shape)
    pool = getattr(torch.nn, f"MaxPool{n}d")(kernel, stride, return_indices=True)
    y, idx = pool(torch.tensor(x))
    ours = getattr(nn, f"MaxUnpool{n}d")(kernel, stride)
    theirs = getattr(torch.nn, f"MaxUnpool{n}d")(kernel, stride)
    assert repr(ours) == repr(theirs)
    k = (kernel,) * n if isinstance(kernel, int) else kernel
    st = k if stride is None else stride
    size = [(o - 1) * si + ki + 1 for o, si, ki in zip(y.shape[2:], st, k)]
    for kw in ({}, {"output_size": size}):
        yf = flow.tensor(y.numpy(), requires_grad=True)
        yt = y.clone().requires_grad_(True)
        out_f = ours(yf, flow.tensor(idx.numpy()), **kw)
        out_t = theirs(yt, idx, **kw)
        np.testing.assert_array_equal(out_f.detach().numpy(), out_t.detach().numpy())
        cot = _x(*out_t.shape, seed=5)
        out_f.backward(flow.tensor(cot))
        out_t.backward(torch.tensor(cot))
        np.testing.assert_array_equal(yf.grad.numpy(), yt.grad.numpy())
    with pytest.raises(ValueError, match="invalid output_size"):
        ours(flow.tensor(y.numpy()), flow.tensor(idx.numpy()), output_size=[s + 9 for s in size])


# -- embedding -------------------------------------------------------------------------------
EMB_INDICES = [[1, 3, 3, 9], [2, 2, 2, 0]]


@pytest.mark.parametrize("kw", [
    {"padding_idx": 3}, {"padding_idx": -1, "scale_grad_by_freq": True},
    {"max_norm": 1.5}, {"max_norm": 1.5, "norm_type": 1.0},
    {"max_norm": 0.5, "norm_type": float("inf")}, {"scale_grad_by_freq": True},
], ids=str)
def test_embedding_options_match_torch(kw):
    torch.manual_seed(0)
    theirs = torch.nn.Embedding(10, 4, **kw).double()
    ours = nn.Embedding(10, 4, dtype=flow.float64, **kw)
    _compare(ours, theirs, np.array(EMB_INDICES), int_inputs=(0,))
    # max_norm renormalises the looked-up rows of the weight itself, in place.
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               1e-12, 1e-12)
    if "padding_idx" in kw:
        assert not np.any(ours.weight.grad.numpy()[ours.padding_idx])


def test_embedding_sparse_and_shape_errors():
    with pytest.raises(NotImplementedError, match="sparse gradients are not supported"):
        nn.Embedding(4, 2, sparse=True)
    with pytest.raises(NotImplementedError, match="sparse gradients are not supported"):
        F.embedding(flow.tensor([1]), flow.ones(4, 2), sparse=True)
    with pytest.raises(NotImplementedError, match="sparse gradients are not supported"):
        nn.EmbeddingBag(4, 2, sparse=True)
    with pytest.raises(AssertionError, match="Padding_idx must be within num_embeddings"):
        nn.Embedding(4, 2, padding_idx=4)
    with pytest.raises(AssertionError, match="padding_idx must be within num_embeddings"):
        nn.EmbeddingBag(4, 2, padding_idx=-5)
    with pytest.raises(AssertionError, match="Shape of weight"):
        nn.Embedding(4, 2, _weight=flow.ones(3, 2))
    e = nn.Embedding.from_pretrained(flow.ones(5, 3), padding_idx=1, max_norm=2.0)
    assert not e.weight.requires_grad and e.max_norm == 2.0
    assert repr(e) == repr(torch.nn.Embedding.from_pretrained(torch.ones(5, 3), padding_idx=1,
                                                               max_norm=2.0))


BAG_CASES = [
    ({"mode": "sum"}, [1, 2, 4, 5, 4, 3, 2, 9], [0, 2, 2, 5], None),
    ({"mode": "mean"}, [1, 2, 4, 5, 4, 3, 2, 9], [0, 2, 2, 5], None),
    ({"mode": "max"}, [1, 2, 4, 5, 4, 3, 2, 9], [0, 2, 2, 5], None),
    ({"mode": "mean", "padding_idx": 2}, [[1, 2, 4], [2, 2, 2], [5, 3, 9]], None, None),
    ({"mode": "max", "padding_idx": 0, "include_last_offset": True}, [1, 2, 4, 0, 0, 3],
     [0, 3, 4, 6], None),
    ({"mode": "sum", "include_last_offset": True}, [1, 2, 4, 0, 0, 3], [0, 3, 4], None),
    ({"mode": "sum"}, [[1, 2, 4], [2, 3, 9]], None, "psw"),
    ({"mode": "sum", "padding_idx": 4}, [1, 2, 4, 5, 4, 3], [0, 4], "psw"),
    ({"mode": "mean", "max_norm": 1.0}, [1, 2, 4, 5], [0, 2], None),
]


@pytest.mark.parametrize("kw,indices,offsets,psw", BAG_CASES, ids=[str(c[0]) for c in BAG_CASES])
def test_embedding_bag_matches_torch(kw, indices, offsets, psw):
    torch.manual_seed(0)
    theirs = torch.nn.EmbeddingBag(10, 4, **kw).double()
    ours = nn.EmbeddingBag(10, 4, dtype=flow.float64, **kw)
    inputs = [np.array(indices)]
    if offsets is not None:
        inputs.append(np.array(offsets))
    if psw is not None:
        weights = _x(*np.shape(indices), seed=4)

        def call(m, *a, weights=weights):
            lib = torch if isinstance(m, torch.nn.Module) else flow
            w = lib.tensor(weights, requires_grad=True)
            out = m(*a, per_sample_weights=w)
            call.weights.append(w)
            return out

        call.weights = []
    else:
        call = None
    _compare(ours, theirs, *inputs, call=call, int_inputs=(0, 1))
    if psw is not None:
        (gw_ours, gw_theirs) = (call.weights[0].grad, call.weights[1].grad)
        np.testing.assert_allclose(gw_ours.numpy(), gw_theirs.numpy(), 1e-12, 1e-12)
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               1e-12, 1e-12)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq(mode):
    """Gradients scaled by each row's frequency in the batch, checked against torch's
    Embedding(scale_grad_by_freq) summed per bag (torch's own EmbeddingBag CPU kernel applies
    a neighbouring row's count for some index orders, e.g. [1, 2, 3, 3, 3, 5])."""
    w = _x(10, 3)
    idx = [1, 2, 3, 3, 3, 5, 1]
    offsets = [0, 3, 5]
    tw = torch.tensor(w, requires_grad=True)
    rows = torch.nn.functional.embedding(torch.tensor(idx), tw, scale_grad_by_freq=True)
    bags = [rows[0:3], rows[3:5], rows[5:7]]
    ref = torch.stack([b.sum(0) if mode == "sum" else b.mean(0) for b in bags])
    cot = _x(3, 3, seed=2)
    ref.backward(torch.tensor(cot))
    fw = flow.tensor(w, requires_grad=True)
    out = F.embedding_bag(flow.tensor(idx), fw, flow.tensor(offsets), mode=mode,
                          scale_grad_by_freq=True)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), 1e-12, 1e-12)
    out.backward(flow.tensor(cot))
    np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), 1e-12, 1e-12)


def test_embedding_bag_errors_and_from_pretrained():
    w = flow.ones(5, 2)
    with pytest.raises(ValueError, match="offsets has to be None"):
        F.embedding_bag(flow.tensor([[1, 2]]), w, flow.tensor([0]))
    with pytest.raises(ValueError, match="offsets has to be a 1D Tensor but got None"):
        F.embedding_bag(flow.tensor([1, 2]), w)
    with pytest.raises(ValueError, match="mode has to be one of"):
        F.embedding_bag(flow.tensor([[1, 2]]), w, mode="min")
    with pytest.raises(NotImplementedError, match="only supported for mode='sum'"):
        F.embedding_bag(flow.tensor([[1, 2]]), w, mode="max",
                        per_sample_weights=flow.ones(1, 2))
    with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0"):
        F.embedding_bag(flow.tensor([1, 2]), w, flow.tensor([1])).numpy()
    with pytest.raises(IndexError, match="index out of range"):
        F.embedding_bag(flow.tensor([1, 7]), w, flow.tensor([0])).numpy()
    e = nn.EmbeddingBag.from_pretrained(flow.tensor(_x(6, 3)), mode="max", padding_idx=2)
    t = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(_x(6, 3)), mode="max",
                                              padding_idx=2)
    assert repr(e) == repr(t) and not e.weight.requires_grad
    np.testing.assert_array_equal(e(flow.tensor([[1, 2, 5]])).numpy(),
                                  t(torch.tensor([[1, 2, 5]])).numpy())


# -- CTC ---------------------------------------------------------------------------------------
def _ctc_data(t=12, n=4, c=6, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((t, n, c))
    target_lengths = [3, 5, 0, 2][:n]
    input_lengths = [12, 10, 7, 4][:n]
    padded = rng.integers(1, c, (n, 5))
    concat = np.concatenate([padded[i, :target_lengths[i]] for i in range(n)])
    return x, padded, concat, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("layout", ["padded-tensors", "concat-tuples"])
def test_ctc_loss_matches_torch(reduction, zero_infinity, layout):
    x, padded, concat, il, tl = _ctc_data()
    il[3] = 2  # sample 3 cannot emit its 2 labels in 2 steps with a repeat: infinite loss
    padded[3, :2] = 4
    concat = np.concatenate([padded[i, :tl[i]] for i in range(4)])
    outs = []
    for lib, mod in ((flow, nn), (torch, torch.nn)):
        xt = lib.tensor(x, requires_grad=True)
        lp = xt.log_softmax(-1)
        if layout == "padded-tensors":
            args = (lib.tensor(padded), lib.tensor(il), lib.tensor(tl))
        else:
            args = (lib.tensor(concat), tuple(il), tuple(tl))
        loss = mod.CTCLoss(reduction=reduction, zero_infinity=zero_infinity)(lp, *args)
        cot = _x(*loss.shape, seed=3)
        loss.backward(lib.tensor(cot))
        outs.append((loss.detach().numpy(), xt.grad.numpy()))
    (lf, gf), (lt, gt) = outs
    np.testing.assert_allclose(lf, lt, 1e-10, 1e-10)
    np.testing.assert_allclose(gf, gt, 1e-10, 1e-10)
    assert np.isinf(lt).any() != zero_infinity or reduction != "none"


def test_ctc_loss_blank_float32_and_unbatched():
    x, padded, _, il, tl = _ctc_data(t=9, n=3, c=5, seed=2)
    padded = np.where(padded == 4, 0, padded)  # labels avoid the blank index 4
    lf = flow.tensor(x.astype(np.float32)).log_softmax(-1)
    lt = torch.tensor(x.astype(np.float32)).log_softmax(-1)
    il = [9, 8, 6]
    ours = F.ctc_loss(lf, flow.tensor(padded), flow.tensor(il), flow.tensor(tl[:3]), blank=4)
    theirs = torch.nn.functional.ctc_loss(lt, torch.tensor(padded), torch.tensor(il),
                                          torch.tensor(tl[:3]), blank=4)
    assert ours.dtype == flow.float32
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), 1e-5, 1e-5)
    ours = F.ctc_loss(lf[:, 0], flow.tensor(padded[0, :3]), flow.tensor(9), flow.tensor(3))
    theirs = torch.nn.functional.ctc_loss(lt[:, 0], torch.tensor(padded[0, :3]),
                                          torch.tensor(9), torch.tensor(3))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), 1e-5, 1e-5)


def test_ctc_loss_errors():
    x, padded, concat, il, tl = _ctc_data()
    lp = flow.tensor(x).log_softmax(-1)
    with pytest.raises(RuntimeError, match="input_lengths to have value at most 12"):
        F.ctc_loss(lp, flow.tensor(padded), (13, 1, 1, 1), tuple(tl))
    with pytest.raises(RuntimeError, match="size at least 6 at dimension 1"):
        F.ctc_loss(lp, flow.tensor(padded), tuple(il), (6, 1, 1, 1))
    with pytest.raises(RuntimeError, match="Expected tensor to have size 10 at dimension 0"):
        F.ctc_loss(lp, flow.tensor(concat[:-1]), tuple(il), tuple(tl))
    with pytest.raises(RuntimeError, match="input_lengths must be of size batch_size"):
        F.ctc_loss(lp, flow.tensor(padded), (12,), tuple(tl))
    with pytest.raises(RuntimeError, match="blank must be in label range"):
        F.ctc_loss(lp, flow.tensor(padded), tuple(il), tuple(tl), blank=6)
    assert repr(nn.CTCLoss(blank=2)) == repr(torch.nn.CTCLoss(blank=2))
    # Tensor lengths with padded targets are checked by the kernel (no host read on call).
    with pytest.raises(RuntimeError, match="input_lengths to have value at most 12"):
        F.ctc_loss(lp, flow.tensor(padded), flow.tensor([13, 1, 1, 1]),
                   flow.tensor(tl)).numpy()
    with pytest.raises(RuntimeError, match="size at least 6 at dimension 1"):
        F.ctc_loss(lp, flow.tensor(padded), flow.tensor(il), flow.tensor([6, 1, 1, 1])).numpy()


def test_ctc_loss_in_graph_with_tensor_lengths():
    x, padded, _, il, tl = _ctc_data()
    lp = flow.tensor(x).log_softmax(-1)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.loss = nn.CTCLoss(reduction="sum")

        def build(self, lp, targets, il, tl):
            return self.loss(lp, targets, il, tl)

    g = G()
    for lengths in (il, [5, 12, 9, 2]):
        ours = g(lp, flow.tensor(padded), flow.tensor(lengths), flow.tensor(tl)).numpy()
        theirs = torch.nn.functional.ctc_loss(torch.tensor(x).log_softmax(-1),
                                              torch.tensor(padded), torch.tensor(lengths),
                                              torch.tensor(tl), reduction="sum")
        np.testing.assert_allclose(ours, theirs.numpy(), 1e-10, 1e-10)
