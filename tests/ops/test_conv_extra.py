"""Convolution and pooling against torch 2.13 over a grid of configurations.

The registry tests check each op's samples; here the user-facing functions (bias, unbatched
input, return_indices, transposed convolution) are compared with torch.nn.functional for
values and gradients in float32 and float64, second-order gradients are compared, and bad
arguments must raise torch's exception type with a message naming the op and the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sbpflow as flow
import sbpflow.nn.functional as F

TOL = {np.float32: (2e-5, 2e-5), np.float64: (1e-10, 1e-10)}


def _arr(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _pair(arrays, requires_grad=True):
    """The same arrays as sbpflow and torch tensors (None passes through)."""
    ours = [None if a is None else flow.tensor(a, requires_grad=requires_grad) for a in arrays]
    theirs = [None if a is None else torch.tensor(a, requires_grad=requires_grad)
              for a in arrays]
    return ours, theirs


def _check(fn_ours, fn_torch, arrays, dtype, seed=0, out_index=None):
    """Forward values, then the gradient of every input for a random cotangent."""
    ours, theirs = _pair(arrays)
    y = fn_ours(*ours)
    ty = fn_torch(*theirs)
    if out_index is not None:
        y, ty = y[out_index], ty[out_index]
    rtol, atol = TOL[dtype]
    assert tuple(y.shape) == tuple(ty.shape)
    assert y.dtype.name == str(ty.dtype).replace("torch.", "")
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol, atol)
    cot = np.random.default_rng(seed).standard_normal(tuple(ty.shape)).astype(dtype)
    y.backward(flow.tensor(cot))
    ty.backward(torch.tensor(cot))
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if b is None:
            continue
        assert a.grad is not None, f"input {k} got no gradient"
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol * 10, atol * 10,
                                   err_msg=f"gradient of input {k}")


# -- convolution ---------------------------------------------------------------------------------
CONV2D_GRID = [
    # (input shape, weight shape, kwargs)
    ((2, 3, 6, 6), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 2), {"stride": 2, "padding": 1}),
    ((2, 4, 7, 7), (6, 2, 3, 3), {"stride": (2, 1), "padding": (1, 0), "groups": 2}),
    ((2, 4, 6, 7), (4, 1, 3, 3), {"padding": 1, "groups": 4, "dilation": (1, 2)}),
    ((2, 2, 7, 7), (3, 2, 3, 3), {"dilation": 2, "padding": 2, "stride": 3}),
    ((2, 3, 5, 6), (2, 3, 2, 3), {"padding": "same"}),
    ((2, 3, 6, 5), (2, 3, 2, 2), {"padding": "same", "dilation": (1, 2)}),
    ((2, 3, 5, 6), (2, 3, 3, 3), {"padding": "valid"}),
    ((2, 3, 5, 5), (2, 3, 1, 1), {"stride": 2}),
    ((1, 2, 5, 5), (2, 2, 5, 5), {}),
    ((2, 6, 5, 6), (6, 2, 2, 3), {"groups": 3, "padding": [1, 1], "stride": [2]}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CONV2D_GRID)
def test_conv2d_matches_torch(xs, ws, kw, bias, dtype):
    rng = np.random.default_rng(1)
    arrays = [_arr(rng, xs, dtype), _arr(rng, ws, dtype),
              _arr(rng, (ws[0],), dtype) if bias else None]
    _check(lambda x, w, b: F.conv2d(x, w, b, **kw), lambda x, w, b: TF.conv2d(x, w, b, **kw),
           arrays, dtype)


CONV1D_GRID = [
    ((2, 3, 7), (4, 3, 3), {}),
    ((2, 4, 9), (6, 2, 3), {"stride": 2, "padding": 2, "groups": 2, "dilation": 2}),
    ((2, 3, 6), (2, 3, 4), {"padding": "same"}),
    ((2, 3, 6), (2, 3, 2), {"padding": "same", "dilation": 3}),
    ((2, 2, 5), (3, 2, 5), {"padding": (1,)}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,ws,kw", CONV1D_GRID)
def test_conv1d_matches_torch(xs, ws, kw, dtype):
    rng = np.random.default_rng(2)
    arrays = [_arr(rng, xs, dtype), _arr(rng, ws, dtype), _arr(rng, (ws[0],), dtype)]
    _check(lambda x, w, b: F.conv1d(x, w, b, **kw), lambda x, w, b: TF.conv1d(x, w, b, **kw),
           arrays, dtype)


@pytest.mark.parametrize("kw", [{}, {"stride": (1, 2, 1), "padding": 1, "groups": 2},
                                {"padding": "same", "dilation": 2}])
def test_conv3d_matches_torch(kw):
    rng = np.random.default_rng(3)
    cin = 4 // kw.get("groups", 1)
    arrays = [_arr(rng, (2, 4, 5, 4, 5), np.float64), _arr(rng, (4, cin, 3, 2, 3), np.float64),
              _arr(rng, (4,), np.float64)]
    _check(lambda x, w, b: F.conv3d(x, w, b, **kw), lambda x, w, b: TF.conv3d(x, w, b, **kw),
           arrays, np.float64)


@pytest.mark.parametrize("fn,xs,ws", [("conv1d", (3, 7), (4, 3, 3)),
                                      ("conv2d", (3, 6, 5), (2, 3, 3, 2))])
def test_conv_unbatched_input(fn, xs, ws):
    rng = np.random.default_rng(4)
    arrays = [_arr(rng, xs, np.float64), _arr(rng, ws, np.float64),
              _arr(rng, (ws[0],), np.float64)]
    _check(lambda x, w, b: getattr(F, fn)(x, w, b, padding=1),
           lambda x, w, b: getattr(TF, fn)(x, w, b, padding=1), arrays, np.float64)


def test_conv2d_noncontiguous_input_and_weight():
    rng = np.random.default_rng(5)
    x = _arr(rng, (2, 6, 7, 3), np.float64)
    w = _arr(rng, (3, 3, 4, 3), np.float64)

    def ours(a, b):
        return F.conv2d(a.permute(0, 3, 1, 2), b.transpose(0, 3), padding=1)

    def theirs(a, b):
        return TF.conv2d(a.permute(0, 3, 1, 2), b.transpose(0, 3), padding=1)

    _check(ours, theirs, [x, w], np.float64)


def test_conv2d_integer_and_half_values():
    rng = np.random.default_rng(6)
    x = rng.integers(-5, 6, (2, 3, 6, 6))
    w = rng.integers(-3, 4, (4, 3, 3, 3))
    got = F.conv2d(flow.tensor(x), flow.tensor(w), stride=2, padding=1)
    want = TF.conv2d(torch.tensor(x), torch.tensor(w), stride=2, padding=1)
    assert got.dtype == flow.int64
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    xh, wh = _arr(rng, (2, 3, 6, 6), np.float16), _arr(rng, (4, 3, 3, 3), np.float16)
    got = F.conv2d(flow.tensor(xh), flow.tensor(wh), padding=1)
    want = TF.conv2d(torch.tensor(xh), torch.tensor(wh), padding=1)
    assert got.dtype == flow.float16
    np.testing.assert_allclose(got.numpy().astype(np.float64), want.numpy().astype(np.float64),
                               rtol=2e-3, atol=2e-3)


TRANSPOSE_GRID = [
    ((2, 3, 4, 4), (3, 2, 3, 3), {}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((2, 4, 3, 4), (4, 3, 2, 3), {"stride": (2, 3), "groups": 2, "dilation": (2, 1),
                                  "output_padding": (1, 2)}),
    ((2, 2, 5, 5), (2, 3, 3, 3), {"padding": 2, "dilation": 2}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,ws,kw", TRANSPOSE_GRID)
def test_conv_transpose2d_matches_torch(xs, ws, kw, dtype):
    rng = np.random.default_rng(7)
    groups = kw.get("groups", 1)
    arrays = [_arr(rng, xs, dtype), _arr(rng, ws, dtype), _arr(rng, (ws[1] * groups,), dtype)]
    _check(lambda x, w, b: F.conv_transpose2d(x, w, b, **kw),
           lambda x, w, b: TF.conv_transpose2d(x, w, b, **kw), arrays, dtype)


def test_conv_transpose1d_matches_torch():
    rng = np.random.default_rng(8)
    arrays = [_arr(rng, (2, 4, 5), np.float64), _arr(rng, (4, 3, 3), np.float64),
              _arr(rng, (3,), np.float64)]
    kw = {"stride": 3, "padding": 1, "output_padding": 2}
    _check(lambda x, w, b: F.conv_transpose1d(x, w, b, **kw),
           lambda x, w, b: TF.conv_transpose1d(x, w, b, **kw), arrays, np.float64)


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1}, {"padding": "same"},
                                {"groups": 2, "dilation": 2}])
def test_conv2d_second_order_gradients(kw):
    """A gradient penalty: d/d(x, w) of |grad_x L|^2 + |grad_w L|^2 for a nonlinear L."""
    rng = np.random.default_rng(9)
    groups = kw.get("groups", 1)
    arrays = [_arr(rng, (2, 4, 6, 6), np.float64), _arr(rng, (4, 4 // groups, 3, 3), np.float64)]
    results = []
    for lib, conv in ((flow, F.conv2d), (torch, TF.conv2d)):
        x, w = (lib.tensor(a, requires_grad=True) for a in arrays)
        y = conv(x, w, **kw)
        weight = lib.tensor(np.linspace(-1, 1, int(np.prod(y.shape))).reshape(tuple(y.shape)))
        loss = (y * y * weight).sum()
        gx, gw = lib.autograd.grad(loss, (x, w), create_graph=True)
        penalty = (gx * gx).sum() + (gw * gw).sum()
        penalty.backward()
        results.append((penalty.detach().numpy(), x.grad.numpy(), w.grad.numpy()))
    for ours, theirs in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)


# -- pooling -------------------------------------------------------------------------------------
MAX_POOL_GRID = [
    ((2, 3, 6, 6), {"kernel_size": 2}),
    ((2, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((2, 2, 7, 6), {"kernel_size": (3, 2), "stride": (2, 1), "dilation": (2, 1),
                    "ceil_mode": True}),
    ((2, 2, 5, 5), {"kernel_size": 2, "padding": 1, "ceil_mode": True}),
    ((2, 2, 6, 7), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ((2, 3, 6, 5), {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1)}),
    ((3, 6, 6), {"kernel_size": 2, "stride": 1}),  # unbatched
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,kw", MAX_POOL_GRID)
def test_max_pool2d_matches_torch(xs, kw, dtype):
    rng = np.random.default_rng(10)
    # Distinct values: the gradient goes to a unique argmax in every window.
    x = (rng.permutation(int(np.prod(xs))).reshape(xs) / 7.0).astype(dtype)
    _check(lambda a: F.max_pool2d(a, **kw), lambda a: TF.max_pool2d(a, **kw), [x], dtype)
    got, idx = F.max_pool2d(flow.tensor(x), return_indices=True, **kw)
    want, tidx = TF.max_pool2d(torch.tensor(x), return_indices=True, **kw)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    assert idx.dtype == flow.int64


def test_max_pool_ties_infinities_and_nans_pick_torchs_index():
    rng = np.random.default_rng(11)
    x = np.round(rng.standard_normal((2, 3, 7, 7)) * 0.7)  # many ties
    x[0, 0, :3, :3] = -np.inf  # a window of -inf next to the padding
    x[1, 2] = 1.0  # a whole plane of ties
    x[1, 0, 2, 2] = x[1, 0, 3, 3] = x[0, 1, 0, 5] = np.nan  # torch keeps the last NaN's index
    for kw in ({"kernel_size": 3, "stride": 2, "padding": 1},
               {"kernel_size": 2, "ceil_mode": True},
               {"kernel_size": 3, "dilation": 2, "padding": 1}):
        got, idx = F.max_pool2d(flow.tensor(x), return_indices=True, **kw)
        want, tidx = TF.max_pool2d(torch.tensor(x), return_indices=True, **kw)
        np.testing.assert_array_equal(got.numpy(), want.numpy())  # NaNs compare equal here
        np.testing.assert_array_equal(idx.numpy(), tidx.numpy(), err_msg=str(kw))


@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "padding": 1,
                                 "ceil_mode": True},
                                {"kernel_size": 2, "dilation": 3}])
def test_max_pool1d_and_3d_match_torch(kw):
    rng = np.random.default_rng(12)
    x1 = (rng.permutation(2 * 3 * 9).reshape(2, 3, 9) / 5.0)
    _check(lambda a: F.max_pool1d(a, **kw), lambda a: TF.max_pool1d(a, **kw), [x1], np.float64)
    x3 = (rng.permutation(2 * 2 * 7 * 7 * 7).reshape(2, 2, 7, 7, 7) / 5.0)
    _check(lambda a: F.max_pool3d(a, **kw), lambda a: TF.max_pool3d(a, **kw), [x3], np.float64)


AVG_POOL_GRID = [
    ((2, 3, 6, 6), {"kernel_size": 2}),
    ((2, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                    "count_include_pad": False}),
    ((2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((2, 2, 5, 7), {"kernel_size": (2, 3), "stride": (1, 2), "padding": (1, 1),
                    "ceil_mode": True, "count_include_pad": False}),
    ((2, 3, 6, 5), {"kernel_size": (3, 2), "stride": 2, "padding": 1, "divisor_override": 3}),
    ((2, 3, 6, 6), {"kernel_size": 4, "stride": 3, "ceil_mode": True}),
    ((3, 5, 5), {"kernel_size": 2, "stride": 1}),  # unbatched
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,kw", AVG_POOL_GRID)
def test_avg_pool2d_matches_torch(xs, kw, dtype):
    rng = np.random.default_rng(13)
    x = _arr(rng, xs, dtype)
    _check(lambda a: F.avg_pool2d(a, **kw), lambda a: TF.avg_pool2d(a, **kw), [x], dtype)


@pytest.mark.parametrize("kw", [{"kernel_size": 3, "stride": 2, "padding": 1,
                                 "ceil_mode": True, "count_include_pad": False},
                                {"kernel_size": 2, "padding": 1}])
def test_avg_pool1d_and_3d_match_torch(kw):
    rng = np.random.default_rng(14)
    _check(lambda a: F.avg_pool1d(a, **kw), lambda a: TF.avg_pool1d(a, **kw),
           [_arr(rng, (2, 3, 8), np.float64)], np.float64)
    _check(lambda a: F.avg_pool3d(a, **kw), lambda a: TF.avg_pool3d(a, **kw),
           [_arr(rng, (2, 2, 5, 6, 5), np.float64)], np.float64)


def test_avg_pool_integer_input_truncates_like_torch():
    x = np.random.default_rng(15).integers(-9, 10, (2, 2, 5, 5))
    for kw in ({"kernel_size": 2}, {"kernel_size": 3, "padding": 1, "stride": 2,
                                    "count_include_pad": False}):
        got = F.avg_pool2d(flow.tensor(x), **kw)
        want = TF.avg_pool2d(torch.tensor(x), **kw)
        assert got.dtype == flow.int64
        np.testing.assert_array_equal(got.numpy(), want.numpy())


ADAPTIVE_GRID = [
    ((2, 3, 7, 5), (3, 2)),
    ((2, 2, 6, 6), 3),
    ((2, 2, 5, 7), (None, 3)),
    ((2, 4, 5, 6), 1),
    ((2, 2, 4, 5), (6, 7)),
    ((2, 2, 9, 4), (4, None)),
    ((3, 7, 7), (2, 5)),  # unbatched
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("xs,size", ADAPTIVE_GRID)
def test_adaptive_avg_pool2d_matches_torch(xs, size, dtype):
    rng = np.random.default_rng(16)
    x = _arr(rng, xs, dtype)
    _check(lambda a: F.adaptive_avg_pool2d(a, size), lambda a: TF.adaptive_avg_pool2d(a, size),
           [x], dtype)


def test_adaptive_avg_pool1d_and_3d_match_torch():
    rng = np.random.default_rng(17)
    _check(lambda a: F.adaptive_avg_pool1d(a, 4), lambda a: TF.adaptive_avg_pool1d(a, 4),
           [_arr(rng, (2, 3, 9), np.float64)], np.float64)
    _check(lambda a: F.adaptive_avg_pool3d(a, (2, None, 3)),
           lambda a: TF.adaptive_avg_pool3d(a, (2, None, 3)),
           [_arr(rng, (2, 2, 5, 4, 7), np.float64)], np.float64)


@pytest.mark.parametrize("name,kw", [
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                    "count_include_pad": False}),
    ("adaptive_avg_pool2d", {"output_size": (3, 2)}),
])
def test_pooling_second_order_gradients(name, kw):
    rng = np.random.default_rng(18)
    x0 = rng.permutation(2 * 2 * 7 * 7).reshape(2, 2, 7, 7) / 9.0
    results = []
    for lib, fn in ((flow, getattr(F, name)), (torch, getattr(TF, name))):
        x = lib.tensor(x0, requires_grad=True)
        y = fn(x * x, **kw)
        weight = lib.tensor(np.linspace(-1, 1, int(np.prod(y.shape))).reshape(tuple(y.shape)))
        (gx,) = lib.autograd.grad((y * y * weight).sum(), (x,), create_graph=True)
        (gx * gx).sum().backward()
        results.append(x.grad.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-9, atol=1e-9)


def test_nn_functional_reexports():
    for name in ("conv1d", "conv2d", "conv3d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
                 "adaptive_avg_pool2d", "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d"):
        assert getattr(flow.nn.functional, name) is getattr(F, name)


# -- errors --------------------------------------------------------------------------------------
def _raises(exc, fn, *fragments):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"


def _t(*shape, dtype=np.float32):
    return flow.tensor(np.zeros(shape, dtype=dtype))


def test_conv_weight_channel_mismatch_names_op_and_shapes():
    _raises(RuntimeError, lambda: F.conv2d(_t(2, 3, 5, 5), _t(4, 2, 3, 3)),
            "conv2d", "[4, 2, 3, 3]", "[2, 3, 5, 5]", "to have 2 channels", "got 3 channels")
    _raises(RuntimeError, lambda: F.conv1d(_t(2, 6, 5), _t(4, 2, 3), groups=2),
            "conv1d", "groups=2", "[4, 2, 3]", "[2, 6, 5]", "to have 4 channels")
    _raises(RuntimeError, lambda: F.conv2d(_t(2, 4, 5, 5), _t(3, 2, 3, 3), groups=2),
            "conv2d", "divisible by 2", "[3, 2, 3, 3]")


def test_conv_argument_errors():
    x, w = _t(2, 3, 5, 5), _t(4, 3, 3, 3)
    _raises(RuntimeError, lambda: F.conv2d(x, w, stride=2, padding="same"),
            "conv2d", "padding='same' is not supported for strided convolutions")
    _raises(RuntimeError, lambda: F.conv2d(x, w, padding="full"),
            "conv2d", "Invalid padding string: 'full'")
    _raises(RuntimeError, lambda: F.conv2d(x, w, padding=-1), "negative padding")
    _raises(RuntimeError, lambda: F.conv2d(x, w, stride=0), "non-positive stride")
    _raises(RuntimeError, lambda: F.conv2d(x, w, groups=0), "non-positive groups")
    _raises(RuntimeError, lambda: F.conv2d(x, w, padding=(1, 2, 3)),
            "conv2d", "a list of 2 values", "padding=[1, 2, 3]")
    _raises(RuntimeError, lambda: F.conv2d(x, _t(4, 3, 7, 7)),
            "conv2d", "padded input size per channel: (5 x 5)", "Kernel size: (7 x 7)")
    _raises(RuntimeError, lambda: F.conv2d(x, _t(4, 3, 3, 3, dtype=np.float64)),
            "conv2d", "float32", "float64", "should be the same")
    _raises(RuntimeError, lambda: F.conv2d(_t(3, 5), w), "conv2d", "3D (unbatched) or 4D",
            "[3, 5]")
    _raises(RuntimeError, lambda: F.conv2d(x, _t(4, 3, 3)), "conv2d", "[4, 3, 3]")
    _raises(RuntimeError, lambda: F.conv2d(x, w, _t(3)),
            "conv2d", "bias", "4 elements", "[3]")
    _raises(TypeError, lambda: F.conv2d(x.numpy(), w), "conv2d", "Tensor")
    _raises(RuntimeError, lambda: F.conv_transpose2d(_t(2, 5, 4, 4), _t(3, 2, 3, 3)),
            "conv_transpose2d", "[3, 2, 3, 3]", "[2, 5, 4, 4]", "to have 3 channels")
    _raises(RuntimeError, lambda: F.conv_transpose2d(_t(2, 3, 4, 4), _t(3, 2, 3, 3),
                                                     stride=2, output_padding=2),
            "conv_transpose2d", "output padding must be smaller")


def test_pool_argument_errors():
    x = _t(2, 3, 5, 5)
    _raises(RuntimeError, lambda: F.max_pool2d(x, 2, padding=2),
            "max_pool2d", "pad should be at most half of effective kernel size")
    _raises(RuntimeError, lambda: F.max_pool2d(x, 3, padding=2, dilation=2),
            "max_pool2d", "pad should be at most half of kernel size")
    _raises(RuntimeError, lambda: F.avg_pool2d(x, 3, padding=2),
            "avg_pool2d", "pad should be at most half of kernel size")
    _raises(RuntimeError, lambda: F.max_pool2d(x, 7), "max_pool2d", "Given input size: (5x5)",
            "Calculated output size: (0x0)", "too small")
    _raises(RuntimeError, lambda: F.max_pool2d(x, (2, 2, 2)),
            "max_pool2d", "kernel_size must either be a single int, or a tuple of two ints")
    _raises(RuntimeError, lambda: F.max_pool2d(x, 2, stride=0), "max_pool2d", "stride")
    _raises(RuntimeError, lambda: F.max_pool2d(x, 2, dilation=0), "max_pool2d", "dilation")
    _raises(RuntimeError, lambda: F.avg_pool2d(x, 2, divisor_override=0),
            "avg_pool2d", "divisor must be not zero")
    _raises(RuntimeError, lambda: F.max_pool2d(_t(5), 2), "max_pool2d", "[5]")
    _raises(RuntimeError, lambda: F.max_pool2d(_t(2, 3, 0, 4), 2),
            "max_pool2d", "non-zero size", "[2, 3, 0, 4]")
    _raises(RuntimeError, lambda: F.max_pool2d(_t(2, 2, dtype=np.bool_), 1), "max_pool2d")
    _raises(RuntimeError, lambda: F.adaptive_avg_pool2d(x, (2, 2, 2)),
            "adaptive_avg_pool2d", "output_size must be 2")
    _raises(RuntimeError, lambda: F.adaptive_avg_pool2d(x, -1),
            "adaptive_avg_pool2d", "greater than or equal to 0")
    _raises(NotImplementedError, lambda: F.adaptive_avg_pool2d(_t(2, 3, 4, 4, dtype=np.int64),
                                                               2),
            "adaptive_avg_pool2d", "int64")
