"""The torch functions and Tensor methods of the elementwise, comparison, reduction, scan and
product families filled in for issue 11 (isclose ... cdist), checked against torch as the
oracle: values and dtypes, gradients, in-place forms, and torch's exception types."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sbpflow as flow

RNG = np.random.default_rng(11)


def _r(*shape):
    return RNG.standard_normal(shape)


def _distinct(*shape):
    n = math.prod(shape)
    return RNG.permutation(n).reshape(shape) * 0.37 - n * 0.15


X = _r(3, 4)
XN = X.copy()
XN[0, 1] = XN[1, 2] = XN[1, 3] = np.nan  # NaNs, but no row of NaN only
D = _distinct(3, 5)
INTS = RNG.integers(0, 3, (4, 7))
SPECIAL = np.array([np.inf, -np.inf, np.nan, 1.0, -0.0, 0.0, -2.5])
GRID = RNG.integers(-3, 4, (27, 3)).astype(np.float64)
RUNS = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, 5.0, np.nan, 1.0],
                 [2.0, 1.0, 1.0, 0.0, 3.0, -1.0, -1.0, 7.0]])


def _lib(m, x):
    if isinstance(x, np.ndarray):
        return m.tensor(x)
    if isinstance(x, list):
        return [_lib(m, v) for v in x]
    return x


def _outputs(r):
    if isinstance(r, (tuple, list)):
        return list(r)
    return [r]


def _check_same(f_out, t_out, tol):
    """Same values (to tol; float32 and half results to their precision) and dtypes."""
    if isinstance(t_out, bool):
        assert f_out is t_out or f_out == t_out
        assert isinstance(f_out, bool)
        return
    fs, ts = _outputs(f_out), _outputs(t_out)
    assert len(fs) == len(ts)
    for f, t in zip(fs, ts, strict=True):
        assert tuple(f.shape) == tuple(t.shape), (f.shape, t.shape)
        assert f.dtype.name == str(t.dtype).removeprefix("torch."), (f.dtype, t.dtype)
        if f.dtype.is_floating_point and f.dtype.itemsize < 8:
            tol = max(tol, 1e-6 if f.dtype.itemsize == 4 else 1e-3)
        np.testing.assert_allclose(f.detach().numpy().astype(np.float64),
                                   t.detach().numpy().astype(np.float64), rtol=tol, atol=tol)


_MODES = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_call(name, dim, mode):
    return lambda m, a, q: getattr(m, name)(a, q, dim=dim, interpolation=mode)


# (id, call(m, *tensors), inputs, check gradients)
CASES = [
    ("isclose", lambda m, a, b: m.isclose(a, b), [X, X + 1e-9 * (RNG.random((3, 4)) > 0.5)],
     False),
    ("isclose_tol", lambda m, a, b: m.isclose(a, b, rtol=0.1, atol=0.05), [X, X * 1.07], False),
    ("isclose_nan", lambda m, a, b: m.isclose(a, b, equal_nan=True), [SPECIAL, SPECIAL], False),
    ("isclose_int", lambda m, a, b: m.isclose(a, b, atol=1), [INTS, INTS + (INTS > 1) * 2],
     False),
    # torch measures integers in the default float dtype: 2**40 + 1 rounds to 2**40
    ("isclose_big_int", lambda m, a, b: m.isclose(a, b, rtol=0, atol=0.5),
     [np.array([2**40 + 1, 5]), np.array([2**40, 5])], False),
    ("allclose", lambda m, a, b: m.allclose(a, b), [X, X + 1e-9], False),
    ("allclose_no", lambda m, a, b: m.allclose(a, b), [X, X + 1e-3], False),
    ("method_allclose", lambda m, a, b: a.allclose(b, equal_nan=True), [SPECIAL, SPECIAL],
     False),
    ("equal", lambda m, a, b: m.equal(a, b), [X, X.copy()], False),
    ("equal_shape", lambda m, a, b: m.equal(a, b), [X, X[:2]], False),
    ("equal_nan", lambda m, a, b: a.equal(b), [SPECIAL, SPECIAL], False),
    ("isin", lambda m, a, b: m.isin(a, b), [INTS, np.array([0, 2])], False),
    ("isin_invert", lambda m, a, b: m.isin(a, b, invert=True), [X, X[1]], False),
    ("isin_many", lambda m, a, b: m.isin(a, b), [RNG.integers(0, 30, (5, 6)),
                                                 RNG.integers(0, 30, 11)], False),
    ("isin_empty", lambda m, a, b: m.isin(a, b), [INTS, np.array([], dtype=np.int64)], False),
    ("isin_nan", lambda m, a, b: m.isin(a, b), [np.array([1.0, np.nan, 2.5]),
                                                np.array([np.nan, 2.5, 3.0])], False),
    ("isin_mixed", lambda m, a, b: m.isin(a, b), [INTS.astype(np.int32), np.array([1.0, 2.5])],
     False),
    ("isin_0d", lambda m, a, b: m.isin(a, b), [np.array(3), np.array([[3, 4]])], False),
    ("isin_scalar", lambda m, a: m.isin(a, 2), [INTS], False),
    ("isin_scalar_first", lambda m, a: m.isin(2, a), [INTS], False),
    ("isposinf", lambda m, a: m.isposinf(a), [SPECIAL], False),
    ("isneginf", lambda m, a: a.isneginf(), [SPECIAL], False),
    ("isposinf_int", lambda m, a: m.isposinf(a), [INTS], False),
    ("isreal", lambda m, a: m.isreal(a), [SPECIAL], False),
    ("signbit", lambda m, a: m.signbit(a), [SPECIAL], False),
    ("signbit_int", lambda m, a: a.signbit(), [INTS - 1], False),
    ("copysign", lambda m, a, b: m.copysign(a, b), [X, _r(3, 4)], True),
    ("copysign_zero_sign", lambda m, a, b: m.copysign(a, b), [X[0], SPECIAL[3:7]], False),
    ("copysign_scalar", lambda m, a: a.copysign(-2.0), [X], True),
    ("copysign_int", lambda m, a, b: m.copysign(a, b), [INTS, INTS - 1], False),
    ("hypot", lambda m, a, b: m.hypot(a, b), [X, _r(4)], True),
    ("hypot_ties", lambda m, a, b: m.hypot(a, b), [X, -X], True),
    ("hypot_extremes", lambda m, a, b: m.hypot(a, b),
     [np.array([1e200, 1e-200, 0.0, np.inf, np.nan, 3.0, -np.inf]),
      np.array([1e200, 1e-200, 0.0, np.nan, 2.0, 0.0, 1.0])], False),
    ("hypot_f32", lambda m, a, b: m.hypot(a, b), [np.array([3e30, 3.0], dtype=np.float32),
                                                  np.array([4e30, 4.0], dtype=np.float32)],
     False),
    ("logaddexp", lambda m, a, b: m.logaddexp(a, b), [X * 5, _r(3, 4) * 5], True),
    ("logaddexp_inf", lambda m, a, b: m.logaddexp(a, b),
     [np.array([np.inf, -np.inf, 1.0, -np.inf]), np.array([np.inf, -np.inf, -np.inf, 2.0])],
     False),
    ("logaddexp2", lambda m, a, b: a.logaddexp2(b), [X * 5, _r(3, 4) * 5], True),
    ("heaviside", lambda m, a, b: m.heaviside(a, b), [np.array([-1.0, 0.0, 2.0, 0.0]),
                                                      np.array([0.5])], False),
    ("xlogy", lambda m, a, b: m.xlogy(a, b),
     [np.array([0.0, 1.0, 2.0, 0.0, 3.0]), np.array([0.0, 2.0, np.nan, np.nan, 0.5])], False),
    ("xlogy_grad", lambda m, a, b: m.xlogy(a, b), [np.array([0.0, 1.0, -2.0]),
                                                   np.array([0.7, 2.0, 0.5])], True),
    ("xlogy_scalar", lambda m, a: m.xlogy(2, a), [np.array([1, 2, 3])], False),
    ("xlogy_scalar_other", lambda m, a: m.xlogy(a, 3.0), [X], True),
    ("xlogy_scalar_zero", lambda m, a: m.xlogy(a, 0), [np.array([0.0, 1.5, -2.0])], False),
    ("xlogy_scalar_nan", lambda m, a: m.xlogy(a, math.nan), [np.array([0, 1])], False),
    ("xlogy_int_scalar", lambda m, a: m.xlogy(a, 2.0), [np.array([0, 1, 3])], False),
    ("sinc", lambda m, a: m.sinc(a), [np.array([0.0, 0.5, -1.5, 2.25])], True),
    ("sinc_int", lambda m, a: a.sinc(), [np.array([0, 1, 2])], False),
    ("deg2rad", lambda m, a: m.deg2rad(a), [X * 90], True),
    ("deg2rad_int", lambda m, a: m.deg2rad(a), [np.array([180, -90])], False),
    ("rad2deg", lambda m, a: a.rad2deg(), [X], True),
    ("frexp", lambda m, a: m.frexp(a),
     [np.array([0.0, np.inf, np.nan, -3.0, 5e-324, 1024.0, 0.1, 7.999999999999999])], False),
    ("frexp_grad", lambda m, a: m.frexp(a), [X * 40], True),
    ("frexp_f32", lambda m, a: a.frexp(),
     [np.array([0.0, -np.inf, 1e-40, -3.0, 6e-8, 1024.0, 0.1], dtype=np.float32)], False),
    ("ldexp", lambda m, a, b: m.ldexp(a, b), [X, np.array([3, -2, 0, 1])], False),
    # torch's gradient is 0 for a negative integer exponent (2 ** -2 in integers): not checked
    ("ldexp_grad", lambda m, a, b: m.ldexp(a, b), [X, np.array([3, 2, 0, 1])], True),
    ("ldexp_float", lambda m, a, b: m.ldexp(a, b), [X, np.array([3.0, -2.0, 0.5, 1.0])], True),
    ("nextafter", lambda m, a, b: m.nextafter(a, b),
     [np.array([0.0, 1.0, -1.0, 2.0, np.nan, 0.0]), np.array([-1.0, 2.0, 0.0, 2.0, 1.0, 3.0])],
     False),
    ("nextafter_f32", lambda m, a, b: a.nextafter(b),
     [np.array([0.0, 1.0, -1.0, 1e-45], dtype=np.float32),
      np.array([1.0, 0.0, -2.0, 0.0], dtype=np.float32)], False),
    ("gcd", lambda m, a, b: m.gcd(a, b), [np.array([0, -4, 6, 832040, 7]),
                                          np.array([0, 6, -9, 514229, 0])], False),
    ("lcm", lambda m, a, b: m.lcm(a, b), [np.array([0, -4, 6, 5, 7]), np.array([0, 6, -9, 0, 3])],
     False),
    ("lcm_mixed", lambda m, a, b: a.lcm(b), [np.array([[4], [6]]),
                                             np.array([6, 10], dtype=np.int32)], False),
    # reductions
    ("aminmax", lambda m, a: m.aminmax(a), [X], False),
    ("aminmax_dim", lambda m, a: a.aminmax(dim=1, keepdim=True), [D], True),
    ("nansum", lambda m, a: m.nansum(a), [XN], True),
    ("nansum_dim", lambda m, a: a.nansum(1, keepdim=True), [XN], True),
    ("nansum_int", lambda m, a: m.nansum(a, 0), [INTS], False),
    ("nanmean", lambda m, a: m.nanmean(a, 1), [XN], True),
    ("nanmean_all", lambda m, a: a.nanmean(), [XN], True),
    ("nanmedian", lambda m, a: m.nanmedian(a), [XN], True),
    ("nanmedian_dim", lambda m, a: m.nanmedian(a, 1), [XN], True),
    ("nanmedian_keep", lambda m, a: a.nanmedian(0, True), [D], True),
    ("nanmedian_int", lambda m, a: m.nanmedian(a, 1), [RNG.permutation(12).reshape(3, 4)],
     False),
    ("kthvalue", lambda m, a: m.kthvalue(a, 2), [D], True),
    ("kthvalue_dim", lambda m, a: a.kthvalue(3, 0, True), [D], True),
    ("mode", lambda m, a: m.mode(a), [INTS], False),
    ("mode_dim", lambda m, a: a.mode(0), [INTS], False),
    ("mode_float", lambda m, a: m.mode(a, 1, True), [INTS * 0.5], True),
    ("quantile", lambda m, a: m.quantile(a, 0.3), [X], True),
    ("quantile_q", lambda m, a, q: m.quantile(a, q, dim=1, keepdim=True),
     [X, np.array([0.2, 0.7])], True),
    ("quantile_keep_all", lambda m, a: a.quantile(0.5, keepdim=True), [X], True),
    ("quantile_nan", lambda m, a: m.quantile(a, 0.5, dim=1), [XN], False),
    ("nanquantile", lambda m, a: m.nanquantile(a, 0.4), [XN], True),
    ("nanquantile_q", lambda m, a, q: a.nanquantile(q, 1), [XN, np.array([0.0, 0.5, 1.0])],
     True),
    *[(f"quantile_{mode}", _quantile_call("quantile", 0, mode),
       [D, np.array([0.0, 0.25, 0.5, 0.9, 1.0])], True) for mode in _MODES],
    *[(f"nanquantile_{mode}", _quantile_call("nanquantile", 1, mode),
       [XN, np.array([0.1, 0.5, 0.75])], False) for mode in _MODES],
    # scans
    ("cummax", lambda m, a: m.cummax(a, 1), [RUNS], False),
    ("cummin", lambda m, a: a.cummin(1), [RUNS], False),
    ("cummax_int", lambda m, a: m.cummax(a, 1), [INTS], False),
    ("cummin_int", lambda m, a: m.cummin(a, 0), [INTS], False),
    ("cummax_grad", lambda m, a: m.cummax(a, 1), [D], True),
    ("cummin_grad", lambda m, a: m.cummin(a, 0), [D], True),
    ("logcumsumexp", lambda m, a: m.logcumsumexp(a, 0),
     [np.array([-1000.0, 0.0, -np.inf, 3.0, 1000.0])], False),
    ("logcumsumexp_grad", lambda m, a: a.logcumsumexp(1), [_r(3, 7) * 3], True),
    # counting
    ("histc", lambda m, a: m.histc(a, bins=5), [X], False),
    ("histc_range", lambda m, a: a.histc(4, -1, 1), [X], False),
    ("histc_f32", lambda m, a: m.histc(a, 7), [X.astype(np.float32)], False),
    ("histogram", lambda m, a: m.histogram(a, 5), [X], False),
    ("histogram_range_weight_density", lambda m, a, w: a.histogram(
        4, range=(-1.0, 0.5), weight=w, density=True), [X, np.abs(X)], False),
    ("histogram_edges", lambda m, a, e: m.histogram(a, e),
     [X, np.array([-2.0, -0.5, 0.0, 0.3, 2.0])], False),
    ("histogram_f32", lambda m, a: m.histogram(a, bins=7, density=True),
     [X.astype(np.float32)], False),
    ("histogram_constant", lambda m, a: m.histogram(a, 2), [np.full((2, 3), 2.0)], False),
    ("bincount", lambda m, a: m.bincount(a), [np.array([1, 1, 3, 0, 5])], False),
    ("bincount_weights", lambda m, a, w: a.bincount(w, minlength=8),
     [np.array([1, 1, 3]), np.array([0.5, 1.0, 2.0], dtype=np.float32)], False),
    ("bincount_empty", lambda m, a: m.bincount(a, minlength=3), [np.array([], dtype=np.int64)],
     False),
    ("unique", lambda m, a: m.unique(a, return_inverse=True, return_counts=True),
     [np.array([3, 1, 2, 3, 1])], False),
    ("unique_plain", lambda m, a: a.unique(), [INTS], False),
    ("unique_dim", lambda m, a: m.unique(a, dim=0, return_inverse=True, return_counts=True),
     [np.array([[1, 2], [1, 2], [0, 1]])], False),
    ("unique_consecutive", lambda m, a: m.unique_consecutive(
        a, return_inverse=True, return_counts=True), [np.array([1, 1, 2, 2, 3, 1, 1])], False),
    ("unique_consecutive_dim", lambda m, a: a.unique_consecutive(return_counts=True, dim=1),
     [np.array([[1, 1, 2], [1, 1, 2]])], False),
    ("searchsorted", lambda m, s, v: m.searchsorted(s, v),
     [np.array([1, 3, 5, 7]), np.array([[3, 6, 9], [0, 7, 9]])], False),
    ("searchsorted_right", lambda m, s, v: m.searchsorted(s, v, right=True),
     [np.array([1, 3, 5, 7]), np.array([[3, 6, 9], [0, 7, 9]])], False),
    ("searchsorted_nd", lambda m, s, v: m.searchsorted(s, v, side="right"),
     [np.array([[1, 3, 5, 7], [2, 4, 6, 8]]), np.array([[3, 6, 9], [0, 7, 9]])], False),
    ("searchsorted_scalar", lambda m, s: m.searchsorted(s, 5), [np.array([1.0, 3, 5, 7])],
     False),
    ("searchsorted_nan", lambda m, s, v: m.searchsorted(s, v),
     [np.array([1.0, 3, 5, 7]), np.array([np.nan, 2.0])], False),
    ("searchsorted_nan_boundary", lambda m, s, v: m.searchsorted(s, v, right=True),
     [np.array([1.0, 2.0, np.nan]), np.array([1.5, 3.0, np.nan, -np.inf])], False),
    ("searchsorted_long", lambda m, s, v: m.searchsorted(s, v),
     [np.sort(RNG.integers(0, 50, 300)), RNG.integers(-5, 55, (4, 9))], False),
    ("searchsorted_sorter", lambda m, s, v, o: m.searchsorted(s, v, sorter=o, out_int32=True),
     [np.array([7, 1, 5, 3]), np.array([4, 8]), np.array([1, 3, 2, 0])], False),
    ("bucketize", lambda m, v, b: m.bucketize(v, b), [np.array([3, 6, 9]),
                                                     np.array([1, 3, 5, 7])], False),
    ("bucketize_right", lambda m, v, b: m.bucketize(v, b, right=True),
     [np.array([[3.0, 6.0], [9.0, 0.0]]), np.array([1.0, 3.0, 5.0, 7.0])], False),
    # statistics
    ("cov", lambda m, a: m.cov(a), [X], True),
    ("cov_1d", lambda m, a: a.cov(), [X[0]], True),
    ("cov_correction", lambda m, a: m.cov(a, correction=0), [X], True),
    ("cov_int", lambda m, a: m.cov(a), [np.array([[1, 2, 4], [0, 1, 1]])], False),
    ("cov_weights", lambda m, a, f, w: m.cov(a, fweights=f, aweights=w),
     [X, np.array([1, 2, 0, 3]), np.array([0.5, 1.0, 2.0, 1.0])], True),
    ("corrcoef", lambda m, a: m.corrcoef(a), [X], True),
    ("corrcoef_1d", lambda m, a: a.corrcoef(), [X[0]], False),
    ("renorm", lambda m, a: m.renorm(a, 2, 0, 1.0), [X], True),
    ("renorm_p1", lambda m, a: a.renorm(1, 1, 0.5), [X], True),
    ("trapezoid", lambda m, a: m.trapezoid(a), [X], True),
    ("trapezoid_dx", lambda m, a: m.trapezoid(a, dx=0.5, dim=0), [X], True),
    ("trapezoid_x", lambda m, a, x: m.trapezoid(a, x), [X, np.array([0.0, 1.0, 3.0, 4.0])],
     True),
    ("trapezoid_xnd", lambda m, a, x: m.trapezoid(a, x, dim=0), [X, _r(3, 4)], True),
    ("trapz", lambda m, a, x: m.trapz(a, x), [X, np.array([0.0, 1.0, 3.0, 4.0])], True),
    ("cumulative_trapezoid", lambda m, a: m.cumulative_trapezoid(a), [X], True),
    ("cumulative_trapezoid_x", lambda m, a, x: m.cumulative_trapezoid(a, x),
     [X, np.array([0.0, 1.0, 3.0, 4.0])], True),
    ("cumulative_trapezoid_dx", lambda m, a: m.cumulative_trapezoid(a, dx=2.0, dim=0), [X],
     True),
    # products
    # edges: 0-d and empty inputs, other dtypes
    ("nanmedian_0d", lambda m, a: m.nanmedian(a, 0), [np.array(2.0)], True),
    ("nanmedian_empty", lambda m, a: m.nanmedian(a), [np.zeros(0)], False),
    ("kthvalue_0d", lambda m, a: m.kthvalue(a, 1), [np.array(2.0)], True),
    ("mode_0d", lambda m, a: m.mode(a), [np.array(2.0)], False),
    ("cummax_0d", lambda m, a: m.cummax(a, 0), [np.array(2.0)], True),
    ("cummax_empty", lambda m, a: m.cummax(a, 0), [np.zeros(0)], False),
    ("logcumsumexp_0d", lambda m, a: m.logcumsumexp(a, 0), [np.array(2.0)], True),
    ("logcumsumexp_empty", lambda m, a: m.logcumsumexp(a, 0), [np.zeros((0,))], False),
    ("quantile_0d", lambda m, a: m.quantile(a, 0.5, dim=0, keepdim=True), [np.array(2.0)],
     True),
    ("trapezoid_1", lambda m, a: m.trapezoid(a), [np.array([2.0])], False),
    ("trapezoid_0", lambda m, a: m.trapezoid(a), [np.zeros(0)], False),
    ("cumulative_trapezoid_1", lambda m, a: m.cumulative_trapezoid(a), [np.array([2.0])],
     False),
    ("histc_empty", lambda m, a: m.histc(a, 3), [np.zeros(0)], False),
    ("histogram_empty", lambda m, a: m.histogram(a, 3), [np.zeros(0)], False),
    ("unique_empty", lambda m, a: m.unique(a, return_counts=True), [np.zeros(0)], False),
    ("unique_2d_inverse", lambda m, a: m.unique(a, return_inverse=True),
     [np.array([[3, 1], [1, 2]])], False),
    ("aminmax_0d", lambda m, a: m.aminmax(a), [np.array(2.0)], False),
    ("nansum_bool", lambda m, a: m.nansum(a), [np.array([True, False, True])], False),
    ("renorm_last_dim", lambda m, a: m.renorm(a, 2, -1, 1.0), [X * 3], True),
    ("signbit_f16", lambda m, a: m.signbit(a), [np.array([-1.0, 0.0], dtype=np.float16)],
     False),
    ("copysign_bool", lambda m, a: m.copysign(a, -1.0), [np.array([True, False])], False),
    ("sinc_f32", lambda m, a: m.sinc(a), [np.array([0.0, 0.25], dtype=np.float32)], False),
    ("logaddexp_f32", lambda m, a: m.logaddexp(a, a), [np.array([1.0, -50.0],
                                                                dtype=np.float32)], False),
    ("frexp_f16", lambda m, a: m.frexp(a), [np.array([0.1, 3.0, 6e-8], dtype=np.float16)],
     False),
    ("nextafter_f16", lambda m, a: m.nextafter(a, a + 1), [np.array([0.1, 3.0],
                                                                   dtype=np.float16)], False),
    ("bucketize_scalar", lambda m, a: m.bucketize(3, a), [np.array([1, 3, 5])], False),
    ("cdist_empty", lambda m, a: m.cdist(a, a), [np.zeros((0, 3))], False),
    ("addbmm", lambda m, i, a, b: m.addbmm(i, a, b), [_r(2, 2), _r(3, 2, 4), _r(3, 4, 2)], True),
    ("addbmm_scaled", lambda m, i, a, b: i.addbmm(a, b, beta=0.5, alpha=2),
     [_r(2, 2), _r(3, 2, 4), _r(3, 4, 2)], True),
    ("addr", lambda m, i, a, b: m.addr(i, a, b, alpha=3), [_r(2, 3), _r(2), _r(3)], True),
    ("addr_beta0", lambda m, i, a, b: i.addr(a, b, beta=0), [np.full((2, 3), np.nan), _r(2),
                                                              _r(3)], False),
    ("inner", lambda m, a, b: m.inner(a, b), [_r(2, 3), _r(4, 3)], True),
    ("inner_1d", lambda m, a, b: a.inner(b), [_r(3), _r(3)], True),
    ("inner_scalar", lambda m, a, b: m.inner(a, b), [_r(2, 3), np.array(2.0)], True),
    ("vdot", lambda m, a, b: m.vdot(a, b), [_r(3), _r(3)], True),
    ("cdist", lambda m, a, b: m.cdist(a, b), [_r(2, 4, 3), _r(2, 5, 3)], True),
    ("cdist_p1", lambda m, a, b: m.cdist(a, b, p=1), [_r(4, 3), _r(5, 3)], True),
    ("cdist_inf", lambda m, a, b: m.cdist(a, b, p=math.inf), [_r(4, 3), _r(5, 3)], True),
    ("cdist_p0", lambda m, a, b: m.cdist(a, b, p=0), [_r(4, 3), _r(5, 3)], False),
    ("cdist_p3", lambda m, a, b: m.cdist(a, b, p=3), [_r(4, 3), _r(5, 3)], True),
    # more than 25 rows: torch's (and our) matrix-product form for p=2
    ("cdist_mm", lambda m, a, b: m.cdist(a, b), [_r(30, 5), _r(20, 5)], True),
    ("cdist_mm_forced", lambda m, a, b: m.cdist(a, b, compute_mode="use_mm_for_euclid_dist"),
     [_r(2, 6, 4), _r(2, 7, 4)], True),
    ("cdist_mm_never", lambda m, a, b: m.cdist(
        a, b, compute_mode="donot_use_mm_for_euclid_dist"), [_r(30, 5), _r(20, 5)], True),
    # equal rows (small integers: exact sums) have distance 0 and a zero gradient
    ("cdist_mm_zero", lambda m, a, b: m.cdist(a, b), [GRID, np.concatenate([GRID[:5],
                                                                            GRID[5:] + 1])],
     True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_grad(case):
    _, fn, inputs, grad = case
    f_in = [_lib(flow, x) for x in inputs]
    t_in = [_lib(torch, x) for x in inputs]
    if grad:
        for a, b in zip(f_in, t_in, strict=True):
            if isinstance(a, flow.Tensor) and a.dtype.is_floating_point:
                a.requires_grad_(True)
                b.requires_grad_(True)
    f_out, t_out = fn(flow, *f_in), fn(torch, *t_in)
    _check_same(f_out, t_out, 1e-9)
    if not grad:
        return
    # A random weighting of every floating output, so each gradient path is exercised.
    f_loss, t_loss = 0, 0
    for f, t in zip(_outputs(f_out), _outputs(t_out), strict=True):
        if not t.dtype.is_floating_point:
            continue
        w = _r(*t.shape)
        f_loss = f_loss + (f * flow.tensor(w, dtype=f.dtype)).sum()
        t_loss = t_loss + (t * torch.tensor(w, dtype=t.dtype)).sum()
    f_loss.backward()
    t_loss.backward()
    for a, b in zip(f_in, t_in, strict=True):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            # No path to an input: one library may hold None, the other explicit zeros.
            if a.grad is None:
                assert b.grad is None or not b.grad.any(), case[0]
            elif b.grad is None:
                assert not a.grad.any(), case[0]
            else:
                _check_same(a.grad, b.grad, 1e-8)


INPLACE = [
    ("copysign_", lambda m, a, b: a.copysign_(b), [X, _r(3, 4)]),
    ("hypot_", lambda m, a, b: a.hypot_(b), [X, _r(3, 4)]),
    ("xlogy_", lambda m, a, b: a.xlogy_(b), [X, np.abs(_r(3, 4))]),
    ("sinc_", lambda m, a: a.sinc_(), [X]),
    ("deg2rad_", lambda m, a: a.deg2rad_(), [X]),
    ("rad2deg_", lambda m, a: m.rad2deg_(a), [X]),
    ("ldexp_", lambda m, a, b: a.ldexp_(b), [X, np.array([3, -2, 0, 1])]),
    ("nextafter_", lambda m, a, b: a.nextafter_(b), [X, _r(3, 4)]),
    ("heaviside_", lambda m, a, b: a.heaviside_(b), [np.array([-1.0, 0.0, 2.0]),
                                                    np.array([0.5])]),
    ("gcd_", lambda m, a, b: m.gcd_(a, b), [np.array([4, 6, 9]), np.array([6, 4, 3])]),
    ("lcm_", lambda m, a, b: a.lcm_(b), [np.array([4, 6, 9]), np.array([6, 4, 3])]),
    ("renorm_", lambda m, a: a.renorm_(2, 0, 1.0), [X]),
    ("addr_", lambda m, i, a, b: i.addr_(a, b), [_r(2, 3), _r(2), _r(3)]),
    ("addbmm_", lambda m, i, a, b: i.addbmm_(a, b), [_r(2, 2), _r(3, 2, 4), _r(3, 4, 2)]),
    ("clamp_", lambda m, a: m.clamp_(a, -0.5, 0.5), [X]),
    ("clip_", lambda m, a: m.clip_(a, max=0.1), [X]),
    ("clamp_min_", lambda m, a: m.clamp_min_(a, 0.1), [X]),
    ("exp_", lambda m, a: m.exp_(a), [X]),
    ("sigmoid_", lambda m, a: m.sigmoid_(a), [X]),
    ("xlogy_top", lambda m, a, b: m.xlogy_(a, b), [X, np.abs(_r(3, 4))]),
]


@pytest.mark.parametrize("case", INPLACE, ids=[c[0] for c in INPLACE])
def test_inplace(case):
    _, fn, inputs = case
    f_in = [_lib(flow, x.copy()) for x in inputs]
    t_in = [_lib(torch, x.copy()) for x in inputs]
    f_out, t_out = fn(flow, *f_in), fn(torch, *t_in)
    assert f_out is f_in[0]
    _check_same(f_in[0], t_in[0], 1e-9)
    _check_same(f_out, t_out, 1e-9)


def test_inplace_keeps_gradient():
    a = flow.tensor(X, requires_grad=True)
    b = a * 1.0
    b.xlogy_(flow.tensor(np.abs(X) + 0.5))
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), np.log(np.abs(X) + 0.5))


ERRORS = [
    ("isclose_dtype", lambda m: m.isclose(m.ones(2), m.ones(2, dtype=m.float64))),
    ("isclose_rtol", lambda m: m.isclose(m.ones(2), m.ones(2), rtol=-1)),
    ("isclose_atol", lambda m: m.isclose(m.ones(2), m.ones(2), atol=-1)),
    ("isin_numbers", lambda m: m.isin(1, 2)),
    ("hypot_int", lambda m: m.hypot(m.tensor([3]), m.tensor([4]))),
    ("hypot_number", lambda m: m.hypot(m.ones(2), 2.0)),
    ("logaddexp_int", lambda m: m.logaddexp(m.tensor([1]), m.tensor([2]))),
    ("heaviside_dtypes", lambda m: m.heaviside(m.ones(2), m.tensor([1]))),
    ("heaviside_number", lambda m: m.heaviside(m.ones(2), 1.0)),
    ("frexp_int", lambda m: m.frexp(m.tensor([1]))),
    ("ldexp_number", lambda m: m.ldexp(m.ones(2), 2)),
    ("nextafter_int", lambda m: m.nextafter(m.tensor([1]), m.tensor([2]))),
    ("gcd_float", lambda m: m.gcd(m.ones(2), m.ones(2))),
    ("gcd_shapes", lambda m: m.gcd(m.tensor([1, 2]), m.tensor([1, 2, 3]))),
    ("nanmean_int", lambda m: m.nanmean(m.tensor([1, 2]))),
    ("kthvalue_k", lambda m: m.kthvalue(m.ones(2, 3), 4, 1)),
    ("kthvalue_dim", lambda m: m.kthvalue(m.ones(2, 3), 1, 2)),
    ("mode_empty", lambda m: m.mode(m.ones(0))),
    ("quantile_int", lambda m: m.quantile(m.tensor([1, 2]), 0.5)),
    ("quantile_q", lambda m: m.quantile(m.ones(2), 1.5)),
    ("quantile_q_tensor", lambda m: m.quantile(m.ones(2), m.tensor([0.5, 2.0]))),
    ("quantile_q_nan", lambda m: m.quantile(m.ones(2), math.nan)),
    ("quantile_q_dtype", lambda m: m.quantile(m.ones(2), m.tensor([0.5], dtype=m.float64))),
    ("quantile_mode", lambda m: m.quantile(m.ones(2), 0.5, interpolation="foo")),
    ("quantile_empty", lambda m: m.quantile(m.ones(0), 0.5)),
    ("logcumsumexp_int", lambda m: m.logcumsumexp(m.tensor([1, 2]), 0)),
    ("cummax_dim", lambda m: m.cummax(m.ones(2, 3), 2)),
    ("histc_int", lambda m: m.histc(m.tensor([1, 2]), bins=4)),
    ("histc_bins", lambda m: m.histc(m.ones(3), bins=0)),
    ("histc_range", lambda m: m.histc(m.ones(3), min=3, max=1)),
    ("histogram_int", lambda m: m.histogram(m.tensor([1, 2]), 4)),
    ("histogram_bins", lambda m: m.histogram(m.ones(3), 0)),
    ("histogram_range", lambda m: m.histogram(m.ones(3), 2, range=(3.0, 1.0))),
    ("histogram_range_inf", lambda m: m.histogram(m.ones(3), 2, range=(0.0, math.inf))),
    ("histogram_data_inf", lambda m: m.histogram(m.tensor([1.0, math.inf]), 2)),
    ("histogram_weight_shape", lambda m: m.histogram(m.ones(3), 2, weight=m.ones(2))),
    ("histogram_weight_dtype", lambda m: m.histogram(m.ones(3), 2,
                                                     weight=m.ones(3, dtype=m.float64))),
    ("histogram_edges_2d", lambda m: m.histogram(m.ones(3), m.ones(1, 3))),
    ("histogram_edges_dtype", lambda m: m.histogram(m.ones(3), m.tensor([0, 1, 2]))),
    ("histogram_one_edge", lambda m: m.histogram(m.ones(3), m.ones(1))),
    ("bincount_float", lambda m: m.bincount(m.ones(2))),
    ("bincount_negative", lambda m: m.bincount(m.tensor([-1, 2]))),
    ("bincount_2d", lambda m: m.bincount(m.tensor([[1]]))),
    ("bincount_minlength", lambda m: m.bincount(m.tensor([1]), minlength=-1)),
    ("searchsorted_shapes", lambda m: m.searchsorted(m.tensor([[1, 3], [2, 4]]),
                                                     m.tensor([2]))),
    ("searchsorted_side", lambda m: m.searchsorted(m.tensor([1, 3]), m.tensor([2]),
                                                   side="left", right=True)),
    ("searchsorted_scalar_nd", lambda m: m.searchsorted(m.tensor([[1, 3]]), 2)),
    ("bucketize_2d", lambda m: m.bucketize(m.tensor([2]), m.tensor([[1, 3]]))),
    ("cov_3d", lambda m: m.cov(m.ones(2, 2, 2))),
    ("cov_fweights_float", lambda m: m.cov(m.ones(2, 3), fweights=m.ones(3))),
    ("cov_aweights_numel", lambda m: m.cov(m.ones(2, 3), aweights=m.ones(4))),
    ("renorm_p", lambda m: m.renorm(m.ones(2, 2), 0, 0, 1)),
    ("renorm_maxnorm", lambda m: m.renorm(m.ones(2, 2), 2, 0, -1)),
    ("inner_shapes", lambda m: m.inner(m.ones(2, 3), m.ones(2, 4))),
    ("vdot_dtypes", lambda m: m.vdot(m.ones(2), m.ones(2, dtype=m.float64))),
    ("vdot_2d", lambda m: m.vdot(m.ones(2, 1), m.ones(2))),
    ("addr_2d", lambda m: m.addr(m.ones(2, 2), m.ones(2, 1), m.ones(2))),
    ("addbmm_2d", lambda m: m.addbmm(m.ones(2, 2), m.ones(2, 4), m.ones(3, 4, 2))),
    ("cdist_columns", lambda m: m.cdist(m.ones(2, 3), m.ones(2, 4))),
    ("cdist_int", lambda m: m.cdist(m.ones(2, 3, dtype=m.long), m.ones(2, 3, dtype=m.long))),
    ("cdist_p", lambda m: m.cdist(m.ones(2, 3), m.ones(2, 3), p=-1)),
    ("cdist_mode", lambda m: m.cdist(m.ones(2, 3), m.ones(2, 3), compute_mode=None)),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_errors_match_torch(case):
    _, fn = case
    with pytest.raises(Exception) as t_err:
        fn(torch)
    with pytest.raises(Exception) as f_err:
        fn(flow)
    assert isinstance(f_err.value, type(t_err.value)), (f_err.value, t_err.value)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's 0 / 0, re-raised by warns
def test_cov_warns_without_degrees_of_freedom():
    with pytest.warns(UserWarning, match="degrees of freedom"):
        r = flow.cov(flow.tensor([[1.0], [2.0]]))
    assert np.isnan(r.numpy()).all()


def test_nanmedian_all_nan_is_nan():
    x = np.full((2, 4), np.nan)
    x[1, 0] = 1.0
    v = flow.nanmedian(flow.tensor(x), 1).values.numpy()
    assert np.isnan(v[0]) and v[1] == 1.0
    assert np.isnan(flow.nanmedian(flow.tensor(np.full(3, np.nan))).item())


def test_heaviside_and_nextafter_have_no_gradient():
    a = flow.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    assert not flow.heaviside(a, flow.tensor([0.5])).requires_grad
    assert not flow.nextafter(a, flow.tensor([1.0])).requires_grad


def test_histc_ignores_out_of_range_and_counts_max():
    x = flow.tensor([-2.0, 0.0, 0.5, 1.0, 3.0, float("nan")])
    np.testing.assert_array_equal(flow.histc(x, bins=2, min=0, max=1).numpy(), [1.0, 2.0])


def test_unique_keeps_the_device():
    x = flow.tensor([3, 1, 3])
    u = flow.unique(x)
    assert u.device == x.device


@pytest.mark.parametrize("rate", [0.0, 0.7, 4.0, 60.0])
def test_poisson_frequencies_follow_the_pmf(rate):
    flow.manual_seed(5)
    n = 20000
    draws = flow.poisson(flow.full((n,), rate, dtype=flow.float64)).numpy()
    assert draws.dtype == np.float64 and np.array_equal(draws, np.round(draws))
    ks = np.arange(int(rate + 6 * math.sqrt(rate) + 6))
    pmf = torch.distributions.Poisson(torch.tensor(rate)).log_prob(
        torch.tensor(ks, dtype=torch.float64)).exp().numpy() if rate else (ks == 0) * 1.0
    freq = np.array([(draws == k).mean() for k in ks])
    # Every frequency within 5 binomial standard deviations (and 1e-3) of the pmf.
    assert np.all(np.abs(freq - pmf) <= 5 * np.sqrt(pmf * (1 - pmf) / n) + 1e-3)


def test_poisson_generator_repeats_and_shapes():
    g = flow.Generator()
    g.manual_seed(3)
    rates = flow.tensor([[0.5, 2.0], [7.0, 0.0]], dtype=flow.float32)
    a = flow.poisson(rates, g)
    g.manual_seed(3)
    b = flow.poisson(rates, generator=g)
    assert a.shape == rates.shape and a.dtype is flow.float32
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert a.numpy()[1, 1] == 0


@pytest.mark.parametrize("call", [
    lambda m: m.poisson(m.tensor([1, 2])),
    lambda m: m.poisson(m.tensor([-1.0, 2.0])),
    lambda m: m.poisson(m.tensor([math.nan, 2.0])),
])
def test_poisson_errors(call):
    with pytest.raises(Exception) as t_err:
        call(torch)
    with pytest.raises(type(t_err.value)):
        call(flow)


def test_mode_long_slices():
    """Values as torch's; the index is the last occurrence of the mode (torch's for slices of
    up to 16, where its sort is stable; beyond, torch's own pick is unspecified)."""
    a = RNG.integers(0, 10, (3, 40))
    t, f = torch.mode(torch.tensor(a), 1), flow.mode(flow.tensor(a), 1)
    np.testing.assert_array_equal(f.values.numpy(), t.values.numpy())
    idx = f.indices.numpy()
    np.testing.assert_array_equal(a[np.arange(3), idx], f.values.numpy())
    for row, i in zip(a, idx, strict=True):
        assert i == np.nonzero(row == row[i])[0].max()


GRAPH = {
    "quantile": lambda m, x: m.quantile(x, 0.3, dim=1),
    "nanquantile": lambda m, x: m.nanquantile(x, [0.2, 0.9][0], dim=0),
    "mode": lambda m, x: m.mode(x.round())[0],
    "isin": lambda m, x: m.isin(x, x[0]),
    "nanmedian": lambda m, x: m.nanmedian(x, 1)[0],
    "kthvalue": lambda m, x: m.kthvalue(x, 2)[1],
    "cummax": lambda m, x: m.cummax(x, 1)[0],
    "logcumsumexp": lambda m, x: m.logcumsumexp(x, 1),
    "searchsorted": lambda m, x: m.searchsorted(m.sort(x.reshape(-1))[0], x),
    "cdist": lambda m, x: m.cdist(x, x * 2),
    "cov": lambda m, x: m.cov(x),
    "logaddexp": lambda m, x: m.logaddexp(x, x * 2),
    "xlogy": lambda m, x: m.xlogy(x, x.abs()),
    "frexp": lambda m, x: m.frexp(x)[0],
    "gcd": lambda m, x: m.gcd(x.long(), x.long() + 3),
    "nextafter": lambda m, x: m.nextafter(x, x + 1),
}


@pytest.mark.parametrize("name", list(GRAPH))
def test_nn_graph_traces_the_same_values(name):
    """The compositions trace in nn.Graph (no host reads of traced values) and give eager's
    values, which match torch's."""
    fn = GRAPH[name]
    x = _r(4, 6) * 3

    class G(flow.nn.Graph):
        def build(self, t):
            return fn(flow, t)

    traced = G()(flow.tensor(x))
    _check_same(traced, fn(torch, torch.tensor(x)), 1e-9)


def test_global_tensors_match_local():
    """The functions on global tensors split S(0), S(1) or broadcast on 2 ranks equal the
    local run, values and gradients (tests/ops/api_fill_T1_global_check.py)."""
    import re
    from pathlib import Path

    from tests.mpijob import mpiexec_cmd, run_job

    check = str(Path(__file__).resolve().parent / "api_fill_T1_global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", check), timeout=240)
    assert job.returncode == 0, job.output[-6000:]
    assert job.strays == 0, job.output[-6000:]
    passed = re.findall(r"rank (\d+): api fill T1 global check passed \((\d+) cases\)",
                        job.stdout)
    assert sorted(int(r) for r, _ in passed) == [0, 1], job.output[-6000:]
    assert all(int(c) >= 90 for _, c in passed), job.output[-6000:]
