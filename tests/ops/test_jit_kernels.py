"""The one-pass numba loops behind gelu, gelu_grad, layer_norm, softmax and log_softmax
(device/_jit.py, reached through the primitives gelu, gelu_grad, layer_norm_rows and
softmax_rows).

Each loop is checked against the NumPy formula it replaces, evaluated in float64 (the
oracle; math.erf for the error function), in float32 and float64, over odd sizes and rows
holding NaN and inf; and the ops are shown to reach the loop by counting primitive calls on
the mock device.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import sbpflow as flow
import sbpflow.nn.functional as F
from sbpflow.device import _jit, primitives
from sbpflow.device.primitives import Primitives

pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba is not installed")

P = Primitives()
SHAPES = [(), (1,), (7,), (3, 13), (2, 5, 17), (33, 1)]
ROW_SHAPES = [(1,), (7,), (3, 13), (2, 5, 17), (33, 1), (5, 63), (4, 257)]
# float32 results: the loops round once from float64 (gelu's erfc fit is good to ~1.2e-7
# relative), so a few float32 ulps; float64 ones: libm's exp/erf and float64 sums.
TOL = {np.float32: dict(rtol=4e-7, atol=1e-37), np.float64: dict(rtol=1e-13, atol=1e-300)}
_erf = np.vectorize(math.erf)
_erfc = np.vectorize(math.erfc)
# gelu's forward in the negative tail, where 1 + erf (torch's float64 form, the float64 loop's)
# and 1 + tanh cancel: an absolute error of a few |x| 1e-17
_GELU_ATOL = 1e-15


def _x(shape, dtype, scale=3.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def _special(dtype):
    """Values every pointwise loop must handle: signed zeros, tails, inf and NaN."""
    return np.array([0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 5.0, -5.0, 9.5, -9.5, 30.0, -30.0,
                     np.inf, -np.inf, np.nan], dtype)


# -- gelu -----------------------------------------------------------------------------------
def _gelu_ref(x, approximate):
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            inner = (v + 0.044715 * v ** 3) * math.sqrt(2 / math.pi)
            return (v * 0.5) * (np.tanh(inner) + 1.0)
        # erfc, not 1 + erf: exact in the negative tail too (1 + erf cancels there)
        return (v * 0.5) * _erfc(-v / math.sqrt(2))


def _gelu_grad_ref(dy, x, approximate):
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if approximate == "tanh":
            beta, kappa = math.sqrt(2 / math.pi), 0.044715
            t = np.tanh((v + kappa * v ** 3) * beta)
            d_inner = (3 * kappa * v * v + 1) * beta
            d = (t + 1) * 0.5 + (v * 0.5) * (1 - t * t) * d_inner
        else:
            d = (_erf(v / math.sqrt(2)) + 1) * 0.5 + v * np.exp(-0.5 * v * v) / math.sqrt(
                2 * math.pi)
        return dy.astype(np.float64) * d


def _close(got, want, dtype, *, atol=None):
    tol = dict(TOL[dtype])
    if atol is not None:
        tol["atol"] = atol
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want, equal_nan=True, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_loop_matches_formula(dtype, shape, approximate):
    x = _x(shape, dtype)
    _close(P.gelu(x, approximate), _gelu_ref(x, approximate), dtype, atol=_GELU_ATOL)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_loop_special_values(dtype, approximate):
    x = _special(dtype)
    got = P.gelu(x, approximate)
    _close(got, _gelu_ref(x, approximate), dtype, atol=_GELU_ATOL)
    # -inf * 0 is NaN in the formula; the loop must give the same, not 0
    assert np.isnan(got[-2]) and np.isnan(got[-1]) and got[-3] == np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_loop_tails_relative(dtype, approximate):
    """The negative tail, where gelu(x) = x Phi(x) is tiny: relative accuracy, not just
    absolute (the float32 loop evaluates erfc, not 1 + erf)."""
    if approximate == "tanh":
        x = np.linspace(-8, 8, 1001).astype(dtype)
        _close(P.gelu(x, approximate), _gelu_ref(x, approximate), dtype, atol=_GELU_ATOL)
        return
    x = np.linspace(-12, 12, 2001).astype(dtype)
    v = x.astype(np.float64)
    want = _gelu_ref(x, "none")
    got = P.gelu(x).astype(np.float64)
    rel = np.abs(got - want) / np.abs(want).clip(1e-300)
    limit = 4e-7 if dtype == np.float32 else 1e-6  # float64: torch's own 1 + erf form
    assert rel[(np.abs(want) > 1e-30) & (v > -5)].max() < limit
    if dtype == np.float32:
        assert rel[np.abs(want) > 1e-30].max() < limit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad_loop_matches_formula(dtype, shape, approximate):
    x, dy = _x(shape, dtype), _x(shape, dtype, 1.0, seed=1)
    # gelu' crosses zero near x = -0.75: absolute error there, relative elsewhere
    _close(P.gelu_grad(dy, x, approximate), _gelu_grad_ref(dy, x, approximate), dtype,
           atol=2e-7 if dtype == np.float32 else 1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad_loop_special_values(dtype, approximate):
    x = _special(dtype)
    dy = np.linspace(-2, 2, x.size).astype(dtype)
    _close(P.gelu_grad(dy, x, approximate), _gelu_grad_ref(dy, x, approximate), dtype,
           atol=2e-7 if dtype == np.float32 else 1e-14)


def test_gelu_loops_decline_other_dtypes():
    assert P.gelu(np.ones(3, np.float16)) is None
    assert P.gelu_grad(np.ones(3, np.float32), np.ones(3, np.float64)) is None
    assert P.gelu_grad(np.ones(3, np.float32), np.ones(4, np.float32)) is None


def test_gelu_loop_reads_strided_input():
    x = _x((6, 10), np.float32)[:, ::3]
    _close(P.gelu(x), _gelu_ref(x, "none"), np.float32, atol=_GELU_ATOL)
    _close(P.gelu_grad(x.T, x.T), _gelu_grad_ref(x.T, x.T, "none"), np.float32, atol=2e-7)


# -- layer_norm -----------------------------------------------------------------------------
def _layer_norm_ref(x, w, b, eps, k):
    v = x.astype(np.float64)
    axes = tuple(range(x.ndim - k, x.ndim))
    with np.errstate(all="ignore"):
        mean = v.mean(axis=axes, keepdims=True)
        xc = v - mean
        var = (xc * xc).mean(axis=axes, keepdims=True)
        return xc / np.sqrt(var + eps) * w.astype(np.float64) + b.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k", [((7,), 1), ((3, 13), 1), ((2, 5, 17), 1), ((2, 5, 17), 2),
                                     ((33, 1), 1), ((4, 257), 1), ((0, 5), 1)])
def test_layer_norm_loop_matches_formula(dtype, shape, k):
    x = _x(shape, dtype, 2.0) + dtype(0.5)
    w, b = _x(shape[-k:], dtype, 1.0, 1), _x(shape[-k:], dtype, 1.0, 2)
    got = P.layer_norm_rows(x, w, b, 1e-5)
    # float32: the output rounding plus x's own (xhat * w grows with |w|)
    _close(got, _layer_norm_ref(x, w, b, 1e-5, k), dtype,
           atol=2e-6 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_loop_nan_inf_rows(dtype):
    x = _x((5, 9), dtype)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, :] = -np.inf
    x[4, :] = 7.0  # a constant row: xhat = 0, y = b
    w, b = _x((9,), dtype, 1.0, 1), _x((9,), dtype, 1.0, 2)
    got = P.layer_norm_rows(x, w, b, 1e-5)
    want = _layer_norm_ref(x, w, b, 1e-5, 1)
    assert np.isnan(got[1:4]).all() and np.isnan(want[1:4]).all()
    _close(got, want, dtype, atol=1e-6 if dtype == np.float32 else 1e-13)
    np.testing.assert_array_equal(got[4], b)


def test_layer_norm_loop_declines():
    x = np.ones((2, 3), np.float32)
    assert P.layer_norm_rows(x, np.ones(3, np.float64), np.ones(3, np.float32), 1e-5) is None
    assert P.layer_norm_rows(x, np.ones(2, np.float32), np.ones(2, np.float32), 1e-5) is None
    assert P.layer_norm_rows(x.astype(np.float16), np.ones(3, np.float16),
                             np.ones(3, np.float16), 1e-5) is None


# -- softmax, log_softmax -------------------------------------------------------------------
def _softmax_ref(x, log):
    v = x.astype(np.float64)
    with np.errstate(all="ignore"):
        m = v.max(axis=-1, keepdims=True)
        s = v - m
        ls = s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
        if log:
            return ls
        e = np.exp(s)
        return e / e.sum(axis=-1, keepdims=True)


def _softmax_loop(x, log):
    """The loop itself (the primitive leaves rows of 64 and more to NumPy)."""
    n = x.shape[-1]
    out = np.empty_like(x)
    f = _jit.softmax_rows32 if x.dtype == np.float32 else _jit.softmax_rows64
    f(x.reshape(-1, n), log, out.reshape(-1, n))
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_loop_matches_formula(dtype, shape, log):
    x = _x(shape, dtype, 4.0)
    got = _softmax_loop(x, log)
    _close(got, _softmax_ref(x, log), dtype,
           atol=1e-37 if not log else (4e-7 if dtype == np.float32 else 1e-14))
    if shape[-1] < 64:
        np.testing.assert_array_equal(P.softmax_rows(x, log), got)
    else:
        assert P.softmax_rows(x, log) is None


def test_softmax_loop_blocks_of_rows():
    """Rows go in blocks of ~4096 elements: a row count that leaves a partial last block."""
    x = _x((1000, 9), np.float32, 4.0)
    for log in (False, True):
        _close(_softmax_loop(x, log), _softmax_ref(x, log), np.float32, atol=4e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_loop_nan_inf_rows(dtype, log):
    x = _x((7, 11), dtype)
    x[0, 4] = np.nan  # NaN row
    x[1, :] = -np.inf  # all -inf: NaN (x - max is NaN)
    x[2, 2] = np.inf  # +inf: NaN, as inf - inf
    x[3, ::2] = -np.inf  # some -inf: exact zeros (log: -inf)
    x[4, :] = 1e30 if dtype == np.float32 else 1e300  # huge but equal: uniform
    x[5, 0] = -1e4  # exp underflows to 0
    got = P.softmax_rows(x, log)
    want = _softmax_ref(x, log)
    np.testing.assert_array_equal(got, _softmax_loop(x, log))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[:3]).all()
    if log:
        assert (got[3, ::2] == -np.inf).all()
    else:
        assert (got[3, ::2] == 0).all() and got[5, 0] == 0
    _close(got, want, dtype, atol=4e-6 if log else 1e-37)


def test_softmax_loop_declines_integers():
    assert P.softmax_rows(np.ones((2, 3), np.int64)) is None


# -- the ops reach the loops ----------------------------------------------------------------
def _count(fn, names):
    prims = primitives("mock")
    before = {n: prims.calls[n] for n in names}
    out = fn("mock")
    flow.synchronize()
    got = {n: prims.calls[n] - before[n] for n in names}
    return out, got


def _host(t):
    return np.array(t.detach()._host(), copy=True)


@pytest.mark.parametrize("dtype", [flow.float32, flow.float64])
def test_ops_take_the_loops(dtype):
    a = _x((4, 6, 10), np.float64)
    w, b = _x((10,), np.float64, 1.0, 1), _x((10,), np.float64, 1.0, 2)

    def run(device):
        x = flow.tensor(a, dtype=dtype, device=device, requires_grad=True)
        lw = flow.tensor(w, dtype=dtype, device=device)
        lb = flow.tensor(b, dtype=dtype, device=device)
        h = F.gelu(x) + F.gelu(x, approximate="tanh")
        h = F.layer_norm(h, (10,), lw, lb)
        out = F.softmax(h, dim=-1) + F.log_softmax(h, dim=2)
        out.sum().backward()
        return out, x.grad

    names = ("gelu", "gelu_grad", "layer_norm_rows", "softmax_rows", "softmax_grad_rows")
    (out, grad), calls = _count(run, names)
    # forward: two gelus, a layer_norm and two softmaxes; backward: the two gelus' and the two
    # softmaxes' grads (layer_norm's grad rule still composes ops)
    assert calls == {"gelu": 2, "gelu_grad": 2, "layer_norm_rows": 1, "softmax_rows": 2,
                     "softmax_grad_rows": 2}
    cpu_out, cpu_grad = run("cpu")
    np.testing.assert_array_equal(_host(out), _host(cpu_out))
    np.testing.assert_array_equal(_host(grad), _host(cpu_grad))


def test_softmax_over_an_inner_axis_keeps_the_composed_kernel():
    def run(device):
        return F.softmax(flow.tensor(_x((3, 4, 5), np.float32), device=device), dim=1)

    out, calls = _count(run, ("softmax_rows", "softmax"))
    assert calls == {"softmax_rows": 0, "softmax": 1}
    want = np.moveaxis(_softmax_ref(np.moveaxis(_x((3, 4, 5), np.float32), 1, -1), False),
                       -1, 1)
    # (the composed kernel works in float32: a few roundings)
    np.testing.assert_allclose(_host(out), want, rtol=2e-6)


def test_half_precision_goes_through_the_float32_loop():
    a = _x((5, 8), np.float32)

    def run(device):
        return F.gelu(flow.tensor(a, dtype=flow.float16, device=device))

    out, calls = _count(run, ("gelu",))
    assert calls == {"gelu": 1}
    want = _gelu_ref(a.astype(np.float16), "none").astype(np.float16)
    np.testing.assert_allclose(_host(out).astype(np.float64), want.astype(np.float64),
                               rtol=1e-3, atol=1e-4)


# -- backward rows: softmax_grad / log_softmax_grad ops; layer_norm's not called yet ---------
def _layer_norm_grad_ref(g, x, w, eps, k):
    """The formula of layer_norm's grad rule (ops/nn.py), in float64."""
    g, x, w = (a.astype(np.float64) for a in (g, x, w))
    axes = tuple(range(x.ndim - k, x.ndim))
    batch = tuple(range(x.ndim - k))
    with np.errstate(all="ignore"):
        xc = x - x.mean(axis=axes, keepdims=True)
        rstd = 1 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
        xhat = xc * rstd
        dxhat = g * w
        gx = rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                     - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))
        return gx, (g * xhat).sum(axis=batch), g.sum(axis=batch)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,k", [((7,), 1), ((3, 13), 1), ((2, 5, 17), 1), ((2, 5, 17), 2),
                                     ((33, 1), 1), ((4, 257), 1), ((0, 5), 1)])
def test_layer_norm_grad_loop_matches_formula(dtype, shape, k):
    x = _x(shape, dtype, 2.0) + dtype(0.5)
    g = _x(shape, dtype, 1.0, 3)
    w = _x(shape[-k:], dtype, 1.0, 1)
    got = P.layer_norm_grad_rows(g, x, w, 1e-5)
    want = _layer_norm_grad_ref(g, x, w, 1e-5, k)
    # float32: sums over up to 33 rows (gw, gb) and x's own rounding
    for a, b in zip(got, want, strict=True):
        _close(a, b, dtype, atol=1e-5 if dtype == np.float32 else 1e-12)


def test_layer_norm_grad_loop_matches_torch():
    import torch

    x = _x((6, 11), np.float64, 2.0)
    g = _x((6, 11), np.float64, 1.0, 3)
    w, b = _x((11,), np.float64, 1.0, 1), _x((11,), np.float64, 1.0, 2)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    torch.nn.functional.layer_norm(tx, (11,), tw, tb, 1e-5).backward(torch.tensor(g))
    got = P.layer_norm_grad_rows(g, x, w, 1e-5)
    for a, t in zip(got, (tx, tw, tb), strict=True):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_grad_loop_nan_rows(dtype):
    x = _x((4, 9), dtype)
    g = _x((4, 9), dtype, 1.0, 3)
    x[1, 2] = np.nan
    x[2, 5] = np.inf
    w = _x((9,), dtype, 1.0, 1)
    gx, gw, gb = P.layer_norm_grad_rows(g, x, w, 1e-5)
    want = _layer_norm_grad_ref(g, x, w, 1e-5, 1)
    assert np.isnan(gx[1:3]).all() and np.isnan(gw).all()
    _close(gx, want[0], dtype, atol=1e-5 if dtype == np.float32 else 1e-12)
    _close(gb, want[2], dtype, atol=1e-5 if dtype == np.float32 else 1e-12)


def _softmax_grad_ref(y, g, log):
    """The formulas of the softmax and log_softmax grad rules (ops/nn.py), in float64."""
    y, g = y.astype(np.float64), g.astype(np.float64)
    if log:
        return g - np.exp(y) * g.sum(axis=-1, keepdims=True)
    gy = g * y
    return gy - y * gy.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_grad_loop_matches_formula(dtype, shape, log):
    y = _softmax_loop(_x(shape, dtype, 3.0), log)
    g = _x(shape, dtype, 1.0, 3)
    _close(P.softmax_grad_rows(y, g, log), _softmax_grad_ref(y, g, log), dtype,
           atol=2e-6 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_grad_loop_matches_torch(log):
    import torch

    x = _x((5, 13), np.float64, 3.0)
    g = _x((5, 13), np.float64, 1.0, 3)
    tx = torch.tensor(x, requires_grad=True)
    f = torch.log_softmax if log else torch.softmax
    ty = f(tx, -1)
    ty.backward(torch.tensor(g))
    got = P.softmax_grad_rows(ty.detach().numpy(), g, log)
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_grad_loop_nan_inf_rows(dtype, log):
    x = _x((4, 7), dtype)
    x[1, 3] = np.nan
    x[2, ::2] = -np.inf  # zeros of softmax (log: -inf, exp gives exact zeros)
    y = _softmax_loop(x, log)
    g = _x((4, 7), dtype, 1.0, 3)
    g[3, 1] = np.inf
    got = P.softmax_grad_rows(y, g, log)
    want = _softmax_grad_ref(y, g, log)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    _close(got, want, dtype, atol=2e-6 if dtype == np.float32 else 1e-13)


def test_backward_loops_decline():
    a = np.ones((2, 3), np.float32)
    assert P.layer_norm_grad_rows(a, a, np.ones(3, np.float64), 1e-5) is None
    assert P.layer_norm_grad_rows(a[:1], a, np.ones(3, np.float32), 1e-5) is None
    assert P.softmax_grad_rows(a, a.astype(np.float64)) is None
    assert P.softmax_grad_rows(a.astype(np.float16), a.astype(np.float16)) is None


@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_through_the_grad_op_matches_torch(log):
    import torch

    a = _x((3, 4, 13), np.float64, 3.0)
    gy = _x((3, 4, 13), np.float64, 1.0, 3)
    f = F.log_softmax if log else F.softmax
    x = flow.tensor(a, requires_grad=True)
    f(x, dim=-1).backward(flow.tensor(gy))
    tx = torch.tensor(a, requires_grad=True)
    (torch.log_softmax if log else torch.softmax)(tx, -1).backward(torch.tensor(gy))
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)
    # double backward (the grad op's own grad rule, written with ops)
    x = flow.tensor(a, requires_grad=True)
    (gx,) = flow.autograd.grad(f(x, dim=-1), x, flow.tensor(gy), create_graph=True)
    (gx * gx).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    (tgx,) = torch.autograd.grad((torch.log_softmax if log else torch.softmax)(tx, -1), tx,
                                 torch.tensor(gy), create_graph=True)
    (tgx * tgx).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)
