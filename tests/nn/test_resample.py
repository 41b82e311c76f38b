"""interpolate / Upsample, pixel shuffle, unfold / fold against torch 2.13: values, gradients,
module reprs and torch's exception types for bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F
from sbpflow.ops import resample as resample_ops

_RANKS = {"linear": (3,), "bilinear": (4,), "trilinear": (5,), "bicubic": (4,)}
_NO_CORNERS = ("nearest", "nearest-exact", "area")
_CASES = [(mode, ndim, ac)
          for mode in ("nearest", "nearest-exact", "area", "linear", "bilinear", "trilinear",
                       "bicubic")
          for ndim in _RANKS.get(mode, (3, 4, 5))
          for ac in ((None,) if mode in _NO_CORNERS else (False, True))]
# Upsampling and downsampling, integer and non-integer scales, recomputed or not, sizes equal
# to, twice, and unrelated to the input's (torch has shortcuts for some of these).
_SIZES = [dict(scale_factor=2), dict(scale_factor=1.7), dict(scale_factor=0.6),
          dict(scale_factor=2.3), dict(scale_factor=1.0001), dict(scale_factor=3.0),
          dict(scale_factor=0.5, recompute_scale_factor=True),
          dict(scale_factor=1.3, recompute_scale_factor=False),
          dict(size=7), dict(size=3), dict(size=1)]


def _shapes(ndim):
    return [(2, 3) + (5,) * (ndim - 2), (1, 2) + (4, 7, 3)[:ndim - 2]]


def _per_axis(ndim):
    """Different size and scale per spatial axis."""
    n = ndim - 2
    return [dict(size=(6, 3, 9)[:n]), dict(scale_factor=(1.5, 0.7, 2.0)[:n]),
            dict(scale_factor=(1.0001, 1.3, 1.0001)[:n])]


def _close(ours, theirs, tol):
    theirs = theirs.detach().numpy()
    ours = ours.detach().numpy()
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


@pytest.fixture(params=["dense", "sparse"])
def axis_path(request, monkeypatch):
    """Run a test on both kernels: small axes multiply by the dense per-axis map, large ones
    gather per tap (forward) and difference prefix sums (gradient)."""
    if request.param == "sparse":
        monkeypatch.setattr(resample_ops, "_DENSE_MAX", 0)
    return request.param


@pytest.mark.parametrize("mode,ndim,ac", _CASES)
def test_interpolate_matches_torch(mode, ndim, ac, axis_path):
    rng = np.random.default_rng(ndim)
    for kw in _SIZES + _per_axis(ndim):
        for shape in _shapes(ndim):
            x = rng.standard_normal(shape)
            tx = torch.tensor(x, requires_grad=True)
            fx = flow.tensor(x, requires_grad=True)
            ty = TF.interpolate(tx, mode=mode, align_corners=ac, **kw)
            fy = F.interpolate(fx, mode=mode, align_corners=ac, **kw)
            _close(fy, ty, 1e-10)
            c = rng.standard_normal(tuple(ty.shape))
            ty.backward(torch.tensor(c))
            fy.backward(flow.tensor(c))
            _close(fx.grad, tx.grad, 1e-10)


@pytest.mark.parametrize("mode,ndim,ac", _CASES)
def test_interpolate_float32_matches_torch(mode, ndim, ac):
    """float32 maps coordinates in float32, as torch does: the same pixels are chosen."""
    rng = np.random.default_rng(10 + ndim)
    for kw in _SIZES:
        x = rng.standard_normal(_shapes(ndim)[1]).astype(np.float32)
        ty = TF.interpolate(torch.tensor(x), mode=mode, align_corners=ac, **kw)
        fy = F.interpolate(flow.tensor(x), mode=mode, align_corners=ac, **kw)
        assert fy.dtype == flow.float32
        _close(fy, ty, 1e-5)


@pytest.mark.parametrize("mode,shape,size", [
    ("linear", (1, 2, 300), (520,)), ("linear", (1, 2, 520), (300,)),
    ("nearest", (1, 2, 300), (520,)), ("nearest-exact", (1, 2, 520), (301,)),
    ("bicubic", (1, 2, 3, 400), (5, 700)), ("trilinear", (1, 1, 2, 3, 500), (3, 2, 310)),
])
def test_interpolate_large_axes(mode, shape, size):
    """Axes past the dense-map limit: the gather and prefix-sum kernels, left to themselves."""
    assert shape[-1] * size[-1] > resample_ops._DENSE_MAX
    rng = np.random.default_rng(8)
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-4)):
        x = rng.standard_normal(shape).astype(dtype)
        tx, fx = torch.tensor(x, requires_grad=True), flow.tensor(x, requires_grad=True)
        ty, fy = TF.interpolate(tx, size=size, mode=mode), F.interpolate(fx, size=size, mode=mode)
        _close(fy, ty, tol)
        c = rng.standard_normal(tuple(ty.shape)).astype(dtype)
        ty.backward(torch.tensor(c))
        fy.backward(flow.tensor(c))
        _close(fx.grad, tx.grad, tol)


def test_interpolate_large_odd_ratios_pick_torch_pixels():
    """Nearest indices on many sizes, where float rounding decides the pixel."""
    for n_in, n_out in [(7, 100), (100, 7), (33, 65), (64, 128), (13, 40), (40, 13)]:
        x = np.arange(n_in, dtype=np.float32).reshape(1, 1, n_in)
        for mode in ("nearest", "nearest-exact", "linear"):
            ty = TF.interpolate(torch.tensor(x), size=n_out, mode=mode)
            fy = F.interpolate(flow.tensor(x), size=n_out, mode=mode)
            _close(fy, ty, 1e-5)
        x2 = np.arange(n_in * 3, dtype=np.float32).reshape(1, 1, n_in, 3)
        ty = TF.interpolate(torch.tensor(x2), size=(n_out, 6))
        _close(F.interpolate(flow.tensor(x2), size=(n_out, 6)), ty, 0)


def test_interpolate_half_and_uint8():
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float16)
    for mode in ("bilinear", "nearest", "bicubic"):
        ty = TF.interpolate(torch.tensor(x), scale_factor=1.5, mode=mode)
        fy = F.interpolate(flow.tensor(x), scale_factor=1.5, mode=mode)
        assert fy.dtype == flow.float16
        _close(fy, ty, 2e-3)
    u = np.arange(24, dtype=np.uint8).reshape(1, 2, 3, 4)
    ty = TF.interpolate(torch.tensor(u), scale_factor=2.5)
    fy = F.interpolate(flow.tensor(u), scale_factor=2.5)
    assert fy.dtype == flow.uint8
    np.testing.assert_array_equal(fy.numpy(), ty.numpy())


def test_interpolate_second_order_gradient():
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 4))
    outs = []
    for lib, fn in ((torch, TF.interpolate), (flow, F.interpolate)):
        t = lib.tensor(x, requires_grad=True)
        y = fn(t, scale_factor=1.6, mode="bicubic")
        (g,) = lib.autograd.grad((y * y).sum(), t, create_graph=True)
        (gg,) = lib.autograd.grad((g * g).sum(), t)
        outs.append(gg)
    _close(outs[1], outs[0], 1e-9)


def _raises_like_torch(call_t, call_f, x=None, *args, **kwargs):
    """call_f raises the exception type call_t raises (on x, or each array of a list x, as a
    torch / sbpflow tensor)."""
    xs = [] if x is None else x if isinstance(x, list) else [x]
    t_args = tuple(torch.tensor(a) for a in xs) + args
    f_args = tuple(flow.tensor(a) for a in xs) + args
    with pytest.raises(Exception) as expected:
        call_t(*t_args, **kwargs)
    with pytest.raises(expected.type):
        call_f(*f_args, **kwargs)


@pytest.mark.parametrize("kwargs,shape", [
    (dict(scale_factor=2, align_corners=True), (1, 2, 4)),
    (dict(scale_factor=2, mode="area", align_corners=False), (1, 2, 4)),
    (dict(size=4, scale_factor=2), (1, 2, 4)),
    (dict(), (1, 2, 4)),
    (dict(size=(4, 4)), (1, 2, 4)),
    (dict(scale_factor=(2, 2)), (1, 2, 4)),
    (dict(size=(2.0, 3)), (1, 2, 4, 4)),
    (dict(size=4, recompute_scale_factor=True), (1, 2, 4)),
    (dict(scale_factor=2, antialias=True), (1, 2, 4, 4)),
    (dict(scale_factor=2, mode="bilinear", antialias=True), (1, 2, 4)),
    (dict(scale_factor=2, mode="bilinear"), (1, 2, 4)),
    (dict(scale_factor=2, mode="trilinear"), (1, 2, 4, 4)),
    (dict(scale_factor=2, mode="linear"), (1, 2, 4, 4, 4)),
    (dict(scale_factor=2, mode="bicubic"), (1, 2, 4)),
    (dict(scale_factor=2, mode="bicubic"), (1, 2, 4, 4, 4)),
    (dict(scale_factor=2, mode="cubic"), (1, 2, 4, 4)),
    (dict(scale_factor=2), (2, 4)),
    (dict(scale_factor=2), (1, 1, 2, 2, 2, 2)),
    (dict(scale_factor=0.2), (1, 2, 3, 4)),
    (dict(size=(0, 3)), (1, 2, 3, 4)),
    (dict(scale_factor=-1.0, mode="bilinear"), (1, 2, 3, 4)),
    (dict(scale_factor=2), (2, 0, 4)),
    (dict(scale_factor=2, mode="lanczos"), (1, 2, 4, 4)),
    (dict(scale_factor="2"), (1, 2, 4, 4)),
    (dict(scale_factor=(2, None)), (1, 2, 4, 4)),
    (dict(size=4.0), (1, 2, 4, 4)),
])
def test_interpolate_bad_input_raises_torch_type(kwargs, shape):
    _raises_like_torch(TF.interpolate, F.interpolate, np.ones(shape), **kwargs)


def test_interpolate_bad_dtype_and_antialias():
    for dtype in (np.int64, np.bool_):
        x = np.ones((1, 2, 3, 4), dtype=dtype)
        for mode in ("nearest", "bilinear"):
            _raises_like_torch(TF.interpolate, F.interpolate, x, scale_factor=2, mode=mode)
    x = flow.ones(1, 2, 3, 4)
    with pytest.raises(NotImplementedError, match="antialias"):
        F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)
    with pytest.raises(TypeError):
        F.interpolate(np.ones((1, 2, 3)), scale_factor=2)


@pytest.mark.parametrize("fn,kwargs", [
    ("upsample", dict(scale_factor=2, mode="bilinear")),
    ("upsample", dict(size=(3, 5), mode="bicubic", align_corners=True)),
    ("upsample_nearest", dict(scale_factor=3)),
    ("upsample_bilinear", dict(size=(7, 4))),
])
def test_deprecated_upsample_aliases(fn, kwargs):
    x = np.random.default_rng(2).standard_normal((1, 2, 3, 4))
    with pytest.warns(UserWarning, match=f"nn.functional.{fn}` is deprecated"):
        fy = getattr(F, fn)(flow.tensor(x), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ty = getattr(TF, fn)(torch.tensor(x), **kwargs)
    _close(fy, ty, 1e-10)


@pytest.mark.parametrize("make", [
    lambda m: m.Upsample(scale_factor=2),
    lambda m: m.Upsample(size=(5, 7), mode="bilinear"),
    lambda m: m.Upsample(scale_factor=(1.5, 2), mode="bicubic", align_corners=True),
    lambda m: m.Upsample(scale_factor=0.7, mode="area", recompute_scale_factor=True),
    lambda m: m.Upsample(scale_factor=1.5, mode="nearest-exact"),
    lambda m: m.UpsamplingNearest2d(scale_factor=2),
    lambda m: m.UpsamplingNearest2d(size=5),
    lambda m: m.UpsamplingBilinear2d(scale_factor=1.5),
    lambda m: m.UpsamplingBilinear2d(size=(4, 9)),
])
def test_upsample_modules(make):
    ours, theirs = make(nn), make(torch.nn)
    assert repr(ours) == repr(theirs)
    assert ours.scale_factor == theirs.scale_factor
    x = np.random.default_rng(3).standard_normal((2, 3, 4, 5))
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    fy, ty = ours(fx), theirs(tx)
    _close(fy, ty, 1e-10)
    fy.sum().backward()
    ty.sum().backward()
    _close(fx.grad, tx.grad, 1e-10)


# -- pixel shuffle --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,r", [((2, 8, 3, 4), 2), ((18, 2, 3), 3), ((2, 3, 4, 2, 5), 1),
                                     ((2, 1, 8, 2, 2), 2)])
def test_pixel_shuffle_matches_torch_and_round_trips(shape, r):
    x = np.random.default_rng(4).standard_normal(shape)
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    fy, ty = F.pixel_shuffle(fx, r), TF.pixel_shuffle(tx, r)
    _close(fy, ty, 0)
    c = np.random.default_rng(5).standard_normal(tuple(ty.shape))
    fy.backward(flow.tensor(c))
    ty.backward(torch.tensor(c))
    _close(fx.grad, tx.grad, 0)
    back = F.pixel_unshuffle(fy, r)
    _close(back, torch.tensor(x), 0)
    _close(back, TF.pixel_unshuffle(ty, r), 0)
    _close(flow.pixel_shuffle(flow.tensor(x), r), ty, 0)  # also top level, as in torch
    _close(flow.pixel_unshuffle(fy, r), TF.pixel_unshuffle(ty, r), 0)


def test_pixel_shuffle_modules_and_errors():
    for ours, theirs in ((nn.PixelShuffle(3), torch.nn.PixelShuffle(3)),
                         (nn.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2))):
        assert repr(ours) == repr(theirs)
    x = np.arange(2 * 9 * 2 * 2, dtype=np.float64).reshape(2, 9, 2, 2)
    _close(nn.PixelShuffle(3)(flow.tensor(x)), torch.nn.PixelShuffle(3)(torch.tensor(x)), 0)
    x = np.arange(2 * 2 * 4 * 6, dtype=np.int64).reshape(2, 2, 4, 6)
    _close(nn.PixelUnshuffle(2)(flow.tensor(x)), torch.nn.PixelUnshuffle(2)(torch.tensor(x)),
           0)
    for fn, shape, r in [("pixel_shuffle", (2, 3), 2), ("pixel_shuffle", (2, 5, 3, 3), 2),
                         ("pixel_shuffle", (2, 8, 3, 3), 0), ("pixel_shuffle", (2, 8, 3, 3), 2.0),
                         ("pixel_unshuffle", (2, 8, 3, 4), 2), ("pixel_unshuffle", (2, 8, 4, 3), 2),
                         ("pixel_unshuffle", (2,), 2), ("pixel_unshuffle", (2, 3, 4, 4), -1)]:
        x = np.ones(shape)
        _raises_like_torch(getattr(TF, fn), getattr(F, fn), x, r)


# -- unfold / fold --------------------------------------------------------------------------------
_BLOCKS = [
    dict(kernel_size=2),
    dict(kernel_size=(3, 2), dilation=(1, 2), padding=1, stride=(2, 1)),
    dict(kernel_size=3, padding=(2, 0), stride=2),
    dict(kernel_size=(1, 3), dilation=2, stride=(1, 3)),
    dict(kernel_size=[2, 2], dilation=[2, 1], padding=[1, 1], stride=[1, 2]),
]


@pytest.mark.parametrize("kw", _BLOCKS)
@pytest.mark.parametrize("shape", [(2, 3, 6, 7), (3, 5, 6)])
def test_unfold_fold_match_torch(kw, shape):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(shape)
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    fc, tc = F.unfold(fx, **kw), TF.unfold(tx, **kw)
    _close(fc, tc, 1e-12)
    c = rng.standard_normal(tuple(tc.shape))
    fc.backward(flow.tensor(c))
    tc.backward(torch.tensor(c))
    _close(fx.grad, tx.grad, 1e-12)

    cols = rng.standard_normal(tuple(tc.shape))
    fcols, tcols = flow.tensor(cols, requires_grad=True), torch.tensor(cols, requires_grad=True)
    out = shape[-2:]
    fy, ty = F.fold(fcols, out, **kw), TF.fold(tcols, out, **kw)
    _close(fy, ty, 1e-12)
    g = rng.standard_normal(tuple(ty.shape))
    fy.backward(flow.tensor(g))
    ty.backward(torch.tensor(g))
    _close(fcols.grad, tcols.grad, 1e-12)

    # fold(unfold(x)) counts each pixel once per block that covers it
    ones = F.fold(F.unfold(flow.ones(*shape), **kw), out, **kw)
    _close(F.fold(F.unfold(flow.tensor(x), **kw), out, **kw),
           torch.tensor(x) * torch.tensor(ones.numpy()), 1e-12)


def test_fold_unfold_modules():
    for ours, theirs in ((nn.Unfold(2, dilation=2, padding=1, stride=(1, 2)),
                          torch.nn.Unfold(2, dilation=2, padding=1, stride=(1, 2))),
                         (nn.Fold((5, 6), 2, padding=1), torch.nn.Fold((5, 6), 2, padding=1))):
        assert repr(ours) == repr(theirs)
    x = np.random.default_rng(7).standard_normal((2, 3, 5, 6))
    cols = nn.Unfold((2, 3), stride=(1, 2))(flow.tensor(x))
    _close(cols, torch.nn.Unfold((2, 3), stride=(1, 2))(torch.tensor(x)), 1e-12)
    _close(nn.Fold((5, 6), (2, 3), stride=(1, 2))(cols),
           torch.nn.Fold((5, 6), (2, 3), stride=(1, 2))(torch.tensor(cols.numpy())), 1e-12)


@pytest.mark.parametrize("fn,shape,args,kwargs", [
    ("unfold", (2, 3, 4), (2,), {}),  # unbatched: fine
    ("unfold", (2, 3, 4, 5, 6), (2,), {}),
    ("unfold", (2, 3), (2,), {}),
    ("unfold", (2, 3, 4, 5), (6,), {}),
    ("unfold", (2, 3, 4, 5), (0,), {}),
    ("unfold", (2, 3, 4, 5), (2,), dict(stride=0)),
    ("unfold", (2, 3, 4, 5), (2,), dict(padding=-1)),
    ("unfold", (2, 3, 4, 5), (2,), dict(dilation=0)),
    ("unfold", (2, 0, 4, 5), (2,), {}),
    ("fold", (2, 12, 5), ((3, 4), 2), {}),
    ("fold", (2, 11, 6), ((3, 4), 2), {}),
    ("fold", (2, 2, 12, 6), ((3, 4), 2), {}),
    ("fold", (12,), ((3, 4), 2), {}),
    ("fold", (2, 12, 6), ((3, 4), 2), dict(stride=0)),
])
def test_unfold_fold_bad_input(fn, shape, args, kwargs):
    x = np.ones(shape)
    t_call = lambda: getattr(TF, fn)(torch.tensor(x), *args, **kwargs)  # noqa: E731
    f_call = lambda: getattr(F, fn)(flow.tensor(x), *args, **kwargs)  # noqa: E731
    try:
        expected = t_call()
    except Exception:
        _raises_like_torch(t_call, f_call)
    else:
        _close(f_call(), expected, 0)
    if fn == "unfold":
        xi = np.ones((1, 2, 3, 3), dtype=np.int64)
        _raises_like_torch(TF.unfold, F.unfold, xi, 2)


# -- affine_grid / grid_sample --------------------------------------------------------------------
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 1), (2, 2, 3, 4, 2)])
def test_affine_grid_matches_torch(size, align_corners):
    rng = np.random.default_rng(9)
    theta = rng.standard_normal((2, len(size) - 2, len(size) - 1))
    tt, ft = torch.tensor(theta, requires_grad=True), flow.tensor(theta, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unit-size warning, checked below
        tg = TF.affine_grid(tt, size, align_corners=align_corners)
        fg = F.affine_grid(ft, size, align_corners=align_corners)
    _close(fg, tg, 1e-12)
    c = rng.standard_normal(tuple(tg.shape))
    tg.backward(torch.tensor(c))
    fg.backward(flow.tensor(c))
    _close(ft.grad, tt.grad, 1e-12)


def test_affine_grid_warnings_and_errors():
    theta = np.zeros((1, 2, 3))
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        F.affine_grid(flow.tensor(theta), (1, 1, 2, 2))
    with pytest.warns(UserWarning, match="unit-size grids"):
        F.affine_grid(flow.tensor(theta), (1, 1, 1, 2), align_corners=True)
    for th, size in [(np.zeros((1, 3, 3)), (1, 1, 2, 2)), (np.zeros((1, 2, 3)), (1, 1, 2)),
                     (np.zeros((1, 2, 3)), (1, 1, 0, 2)), (np.zeros((1, 2, 3)), (1, 2, 2, 2, 2)),
                     (np.zeros((1, 2, 3), dtype=np.int64), (1, 1, 2, 2))]:
        _raises_like_torch(TF.affine_grid, F.affine_grid, th, size, align_corners=False)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("xs,gs", [((2, 3, 5, 6), (2, 4, 7, 2)),
                                   ((2, 2, 3, 4, 5), (2, 2, 3, 4, 3))])
def test_grid_sample_matches_torch(mode, padding_mode, align_corners, xs, gs):
    rng = np.random.default_rng(10)
    x = rng.standard_normal(xs)
    grid = rng.uniform(-2.5, 2.5, gs)  # inside, outside, and reflected twice
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(grid, requires_grad=True)
    fx, fg = flow.tensor(x, requires_grad=True), flow.tensor(grid, requires_grad=True)
    kw = dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners)
    ty, fy = TF.grid_sample(tx, tg, **kw), F.grid_sample(fx, fg, **kw)
    _close(fy, ty, 1e-12)
    c = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(c))
    fy.backward(flow.tensor(c))
    _close(fx.grad, tx.grad, 1e-12)
    _close(fg.grad, tg.grad, 1e-12)  # zeros for nearest


def test_grid_sample_warnings_and_errors():
    x, g = np.ones((1, 2, 3, 3)), np.zeros((1, 2, 2, 2))
    with pytest.warns(UserWarning, match="align_corners=False since 1.3.0"):
        F.grid_sample(flow.tensor(x), flow.tensor(g))
    for xs, gs, kw in [((1, 2, 3, 3), (1, 2, 2, 2), dict(mode="cubic")),
                       ((1, 2, 3, 3), (1, 2, 2, 2), dict(padding_mode="circular")),
                       ((1, 2, 3, 3), (2, 2, 2, 2), {}), ((1, 2, 3, 3), (1, 2, 2, 3), {}),
                       ((1, 2, 3), (1, 2, 2), {}), ((1, 2, 3, 3), (1, 2, 2, 2, 2), {})]:
        _raises_like_torch(TF.grid_sample, F.grid_sample, [np.ones(xs), np.zeros(gs)],
                           align_corners=False, **kw)
    with pytest.raises(NotImplementedError, match="bicubic"):
        F.grid_sample(flow.tensor(x), flow.tensor(g), mode="bicubic", align_corners=False)


def test_resampling_modules_in_graph_match_eager():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Upsample(scale_factor=1.5, mode="bilinear")
            self.shuffle = nn.PixelShuffle(2)
            self.unfold = nn.Unfold(2, stride=(1, 2))

        def forward(self, x):
            y = self.shuffle(self.up(x))
            return self.unfold(y), F.interpolate(y, size=(3, 4), mode="bicubic")

    net = Net()

    class Graph(nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net

        def build(self, x):
            return self.net(x)

    x = flow.tensor(np.random.default_rng(11).standard_normal((2, 8, 4, 5)))
    for eager, lazy in zip(net(x), Graph()(x), strict=True):
        _close(lazy, torch.tensor(eager.numpy()), 1e-12)
