"""numba loops behind a few CPU primitives (im2col/col2im, max pooling, scatter-add, the SGD
momentum step, nll rows; gelu and its grad, layer_norm, softmax and log_softmax rows).

Each loop of the first group does exactly the arithmetic of the NumPy code it replaces
(copies, comparisons, and adds in the same order), so results are bitwise equal; it only
removes NumPy's per-pass and per-short-row overhead.  The transformer loops (at the end) work
in float64 and round once, so they are within float32 rounding of the NumPy formulas, not
bitwise equal (see there).  Compiled with numba's on-disk cache (`_numba_cache.njit`: a
per-user folder, never a point of failure), so a second process loads the machine code
instead of compiling it.

`available()` is False when numba cannot be imported; callers then keep their NumPy code.
"""

from __future__ import annotations

import math

import numpy as np

try:
    import numba

    from ._numba_cache import njit as _cached_njit
except Exception:  # pragma: no cover - numba is a dependency, but stay importable without it
    numba = None


def available() -> bool:
    return numba is not None


if numba is not None:
    _jit = _cached_njit(nogil=True, error_model="numpy")

    @_jit
    def im2col2d(xp, cols, kh, kw, sh, sw, dh, dw):
        """xp (N, C, Hp, Wp) -> cols (C, kh, kw, N, oh, ow): a copy of each window (the
        caller views C as (G, C/G))."""
        nb, c = xp.shape[0], xp.shape[1]
        oh, ow = cols.shape[4], cols.shape[5]
        for ci in range(c):
            for i in range(kh):
                for j in range(kw):
                    for n in range(nb):
                        for y in range(oh):
                            r = y * sh + i * dh
                            c0 = j * dw
                            if sw == 1 and ow == 8:  # a constant trip count: LLVM makes
                                for x in range(8):  # the row one vector move (2x faster)
                                    cols[ci, i, j, n, y, x] = xp[n, ci, r, c0 + x]
                            elif sw == 1:  # a contiguous row: a loop LLVM vectorises
                                for x in range(ow):
                                    cols[ci, i, j, n, y, x] = xp[n, ci, r, c0 + x]
                            else:
                                for x in range(ow):
                                    cols[ci, i, j, n, y, x] = xp[n, ci, r, c0 + x * sw]

    @_jit
    def col2im2d(cols, buf, dst, sh, sw, dh, dw, ph, pw):
        """The adjoint of im2col: cols (C, kh, kw, oh, ow, N) added tap by tap (each element
        sums its taps in (i, j) order) into buf (C, Hp, Wp, N), zeroed, the padded input with
        samples last, so the adds run along samples; then dst (N, C, H, W) = buf's input
        region (zero where buf, cropped, is smaller)."""
        c, kh, kw, oh, ow, nb = cols.shape
        hp, wp = buf.shape[1], buf.shape[2]
        for ci in range(c):
            for i in range(kh):
                for j in range(kw):
                    for y in range(oh):
                        r = y * sh + i * dh
                        for x in range(ow):
                            q = x * sw + j * dw
                            for n in range(nb):
                                buf[ci, r, q, n] += cols[ci, i, j, y, x, n]
        hh, ww = dst.shape[2], dst.shape[3]
        for n in range(nb):
            for ci in range(c):
                for h in range(hh):
                    for w in range(ww):
                        if h + ph < hp and w + pw < wp:
                            dst[n, ci, h, w] = buf[ci, h + ph, w + pw, n]
                        else:
                            dst[n, ci, h, w] = 0

    @_jit
    def max_pool2d(xp, index_map, best, indices, sh, sw, dh, dw):
        """Running maximum over the taps of each window, in torch's scan order.

        xp (B, Hp, Wp) padded with the lowest value, index_map (oh, ow, kh, kw) flat input
        positions; best, indices (B, oh, ow).  A later tap wins when strictly greater or NaN
        (first maximum on ties, NaN propagates with the last NaN's index), as the NumPy
        passes `maximum` and `idx += wins * (tap - idx)` do.
        """
        nb = xp.shape[0]
        oh, ow, kh, kw = index_map.shape
        for b in range(nb):
            for y in range(oh):
                for x in range(ow):
                    best[b, y, x] = xp[b, y * sh, x * sw]
                    indices[b, y, x] = index_map[y, x, 0, 0]
                for i in range(kh):
                    r = y * sh + i * dh
                    for j in range(kw):
                        if i == 0 and j == 0:
                            continue
                        for x in range(ow):  # branch-free, so the loop vectorises
                            u = xp[b, r, x * sw + j * dw]
                            v = best[b, y, x]
                            w = (u > v) | (u != u)
                            indices[b, y, x] = index_map[y, x, i, j] if w else indices[b, y, x]
                            # a NaN maximum stays NaN (np.maximum propagates it)
                            best[b, y, x] = u if (w and v == v) else v

    @_jit
    def scatter_add_rows(dst, index, src):
        """dst (B, M), index and src (B, L): dst[b, index[b, l]] += src[b, l], in order
        (negative indices count from the end).  Returns False, writing nothing, when an
        index is out of range (the caller's NumPy path then raises)."""
        nb, length = index.shape
        m = dst.shape[1]
        for b in range(nb):
            for i in range(length):
                j = index[b, i]
                if j < -m or j >= m:
                    return False
        for b in range(nb):
            for i in range(length):
                j = index[b, i]
                if j < 0:
                    j += m
                dst[b, j] += src[b, i]
        return True

    @_jit
    def sgd_momentum(p, g, buf, m, neg_lr):
        """1-D, in place, one pass: buf = buf * m + g; p = p + neg_lr * buf, each operation
        rounded to the arrays' dtype (m and neg_lr are of that dtype; no FMA contraction), as
        NumPy's passes.  (In place: distinct outputs would make LLVM's alias check fail and
        the loop run unvectorised.)"""
        for i in range(p.shape[0]):
            b = buf[i] * m + g[i]
            buf[i] = b
            p[i] = p[i] + neg_lr * b

    @_jit
    def _class_range(target, ignore_index):
        """(min, max) of the target classes, counting an ignored entry as class 0."""
        lo = 0
        hi = 0
        for i in range(target.shape[0]):
            t = target[i]
            if t == ignore_index:
                t = 0
            lo = min(lo, t)
            hi = max(hi, t)
        return lo, hi

    @_jit
    def nll_rows(x, target, weight, ignore_index, loss, w_t):
        """nll_loss per row of x (N, C): w_t[i] = weight[t] (0 if ignored), loss[i] =
        -(x[i, t] * w_t[i]) (0 if ignored), with t = target[i], or 0 where it is
        ignore_index.  Returns (min, max) of those t; nothing is read where one is outside
        [0, C) (the caller raises)."""
        c = x.shape[1]
        lo, hi = _class_range(target, ignore_index)
        if lo < 0 or hi >= c:
            return lo, hi
        for i in range(target.shape[0]):
            t = target[i]
            if t == ignore_index:
                w_t[i, 0] = 0
                loss[i, 0] = 0
            else:
                w = weight[t]
                w_t[i, 0] = w
                loss[i, 0] = -(x[i, t] * w)
        return lo, hi

    @_jit
    def nll_grad_rows(g, target, weight, ignore_index, dx):
        """nll_loss's input gradient, dx (N, C) zeroed: dx[i, t] = -(w_t * g[i]) with t and
        w_t as in nll_rows (ignored rows write -(0 * g) at class 0, as the scatter does).
        g has one element per row, or one for all (shape (1,)).  Returns (min, max) of t;
        nothing is written where one is outside [0, C)."""
        c = dx.shape[1]
        lo, hi = _class_range(target, ignore_index)
        if lo < 0 or hi >= c:
            return lo, hi
        per_row = g.shape[0] != 1
        for i in range(target.shape[0]):
            t = target[i]
            w = 0.0  # (a float32 product is exact in float64: one rounding, as float32's)
            if t == ignore_index:
                t = 0
            else:
                w = weight[t]
            gi = g[i] if per_row else g[0]
            dx[i, t] = -(w * gi)
        return lo, hi


# -- row and pointwise loops of the transformer ops (gelu, layer_norm, softmax) ------------------
# Unlike the loops above these are not bitwise the NumPy code they replace: each reads its input
# once, works in float64 (row statistics accumulated in float64 partial sums) and rounds once on
# the store, so results are within float32 rounding of torch, not equal to the old passes.
# float32 inputs take exp (and erfc) from branch-free polynomials that LLVM vectorises (numba has
# no vector libm here); float64 inputs call libm's, for full double precision.
_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_GELU_BETA = 0.7978845608028654  # sqrt(2 / pi)
_GELU_KAPPA = 0.044715

if numba is not None:
    _inline = numba.njit(inline="always", error_model="numpy")
    _jit_fma = _cached_njit(nogil=True, error_model="numpy", fastmath={"contract"})
else:  # pragma: no cover
    def _inline(fn):
        return fn

    _jit_fma = _jit = _inline


@_inline
def _exp_le0(y):
    """exp(y) for y <= 0 (slightly positive y is fine too), branch-free so loops over it
    vectorise: (the degree-14 Taylor polynomial of y / 1024) ** 1024 by ten squarings, relative
    error ~1e-14; 0 below -745 and at -inf, NaN stays NaN."""
    s = y * 0.0009765625
    q = 1.1470745597729725e-11
    q = q * s + 1.6059043836821613e-10
    q = q * s + 2.08767569878681e-09
    q = q * s + 2.505210838544172e-08
    q = q * s + 2.755731922398589e-07
    q = q * s + 2.7557319223985893e-06
    q = q * s + 2.48015873015873e-05
    q = q * s + 0.0001984126984126984
    q = q * s + 0.001388888888888889
    q = q * s + 0.008333333333333333
    q = q * s + 0.041666666666666664
    q = q * s + 0.16666666666666666
    q = q * s + 0.5
    q = q * s + 1.0
    q = q * s + 1.0
    for _ in range(10):
        q = q * q
    return 0.0 if y < -745.0 else q


@_inline
def _normal_cdf(v):
    """Phi(v) = erfc(-v / sqrt 2) / 2 in float64 to ~1.2e-7 relative everywhere, tails included
    (Numerical Recipes' Chebyshev fit erfc(z) = t exp(-z z + P(t)), t = 1 / (1 + z / 2), for
    z = |v| / sqrt 2), which is float32's precision; NaN stays NaN, Phi(+-inf) = 1, 0."""
    z = abs(v) * _SQRT1_2
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277
    p = p * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    half_erfc = 0.5 * t * _exp_le0(p - z * z)
    return 1.0 - half_erfc if v >= 0.0 else half_erfc


@_jit_fma
def gelu32(x, out):
    """out = x Phi(x) (exact, erf form) over 1-D float32 arrays, in float64."""
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        out[i] = v * _normal_cdf(v)


@_jit_fma
def gelu_grad32(dy, x, out):
    """out = dy (Phi(x) + x phi(x)) over 1-D float32 arrays, in float64."""
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        pdf = _exp_le0(v * v * -0.5) * _INV_SQRT_2PI
        out[i] = np.float64(dy[i]) * (_normal_cdf(v) + v * pdf)


@_jit
def gelu64(x, out):
    """out = (x / 2) (erf(x / sqrt 2) + 1), torch's formula, with libm's erf."""
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = (v * 0.5) * (math.erf(v * _SQRT1_2) + 1.0)


@_jit
def gelu_grad64(dy, x, out):
    for i in range(x.shape[0]):
        v = x[i]
        cdf = (math.erf(v * _SQRT1_2) + 1.0) * 0.5
        pdf = math.exp(v * v * -0.5) * _INV_SQRT_2PI
        out[i] = dy[i] * (cdf + v * pdf)


@_jit
def gelu_tanh(x, out):
    """The tanh form: out = (x / 2) (1 + tanh(beta (x + kappa x^3))), in float64."""
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        inner = (v + v * v * v * _GELU_KAPPA) * _GELU_BETA
        out[i] = (v * 0.5) * (math.tanh(inner) + 1.0)


@_jit
def gelu_tanh_grad(dy, x, out):
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        v2 = v * v
        t = math.tanh((v + v2 * v * _GELU_KAPPA) * _GELU_BETA)
        d_inner = (v2 * (3.0 * _GELU_KAPPA) + 1.0) * _GELU_BETA
        out[i] = np.float64(dy[i]) * ((t + 1.0) * 0.5 + (v * 0.5) * (1.0 - t * t) * d_inner)


@_inline
def _sum8(a, k, n):
    """sum of a[k:k + n] in eight float64 partial sums (independent adds, not one chain)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    n8 = n - n % 8
    for j in range(k, k + n8, 8):
        a0 += a[j]
        a1 += a[j + 1]
        a2 += a[j + 2]
        a3 += a[j + 3]
        a4 += a[j + 4]
        a5 += a[j + 5]
        a6 += a[j + 6]
        a7 += a[j + 7]
    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    for j in range(k + n8, k + n):
        s += a[j]
    return s


@_jit
def layer_norm_rows(x, w, b, eps, out):
    """x, out (R, N), w, b (N,): out = (x - mean) / sqrt(var + eps) * w + b per row, mean
    and (biased) variance in float64."""
    rows, n = x.shape
    d = np.empty(n)
    d2 = np.empty(n)
    for r in range(rows):
        for j in range(n):
            d[j] = np.float64(x[r, j])
        mean = _sum8(d, 0, n) / n
        for j in range(n):
            d[j] = d[j] - mean
            d2[j] = d[j] * d[j]
        rstd = 1.0 / np.sqrt(_sum8(d2, 0, n) / n + eps)
        for j in range(n):
            out[r, j] = d[j] * rstd * np.float64(w[j]) + np.float64(b[j])


@_inline
def _row_max(x, r, n):
    """The row's maximum, NaN if it holds one; 0 where all are -inf (then x - max gives
    NaN, as the NumPy formula does)."""
    m = -np.inf
    for j in range(n):
        v = np.float64(x[r, j])
        m = v if v > m or v != v else m
    return 0.0 if m == -np.inf else m


@_jit_fma
def softmax_rows32(x, log, out):
    """(log_)softmax over the last axis of x (R, N) float32, in float64.  Rows go in blocks of
    ~4096 elements whose exps are one flat loop, which vectorises however short the rows are
    (attention rows of 13: one exp per row-sized loop would run mostly scalar)."""
    rows, n = x.shape
    blk = max(1, 4096 // n)
    buf = np.empty(blk * n)
    m = np.empty(blk)
    for r0 in range(0, rows, blk):
        r1 = min(rows, r0 + blk)
        k = 0
        for r in range(r0, r1):
            mr = _row_max(x, r, n)
            m[r - r0] = mr
            for j in range(n):
                buf[k + j] = np.float64(x[r, j]) - mr
            k += n
        for i in range(k):
            buf[i] = _exp_le0(buf[i])
        k = 0
        for r in range(r0, r1):
            s = _sum8(buf, k, n)
            if log:
                mr = m[r - r0]
                ls = np.log(s)
                for j in range(n):
                    out[r, j] = np.float64(x[r, j]) - mr - ls
            else:
                inv = 1.0 / s
                for j in range(n):
                    out[r, j] = buf[k + j] * inv
            k += n


@_jit
def softmax_rows64(x, log, out):
    rows, n = x.shape
    e = np.empty(n)
    for r in range(rows):
        m = _row_max(x, r, n)
        for j in range(n):
            e[j] = math.exp(x[r, j] - m)
        s = _sum8(e, 0, n)
        if log:
            ls = math.log(s)
            for j in range(n):
                out[r, j] = x[r, j] - m - ls
        else:
            for j in range(n):
                out[r, j] = e[j] / s


# -- backward rows (for grad ops of layer_norm and (log_)softmax over the last axis) ------------
@_jit
def layer_norm_grad_rows(g, x, w, eps, gx, gw, gb):
    """layer_norm's gradients for x, g, gx (R, N), w, gw, gb (N,), statistics recomputed
    from x: gx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w;
    gw = sum over rows of g xhat, gb = sum of g; all in float64."""
    rows, n = x.shape
    xh = np.empty(n)
    dxh = np.empty(n)
    prod = np.empty(n)
    acc_w = np.zeros(n)
    acc_b = np.zeros(n)
    for r in range(rows):
        for j in range(n):
            xh[j] = np.float64(x[r, j])
        mean = _sum8(xh, 0, n) / n
        for j in range(n):
            xh[j] = xh[j] - mean
            prod[j] = xh[j] * xh[j]
        rstd = 1.0 / np.sqrt(_sum8(prod, 0, n) / n + eps)
        for j in range(n):
            gj = np.float64(g[r, j])
            h = xh[j] * rstd
            xh[j] = h
            d = gj * np.float64(w[j])
            dxh[j] = d
            prod[j] = d * h
            acc_w[j] += gj * h
            acc_b[j] += gj
        m1 = _sum8(dxh, 0, n) / n
        m2 = _sum8(prod, 0, n) / n
        for j in range(n):
            gx[r, j] = rstd * (dxh[j] - m1 - xh[j] * m2)
    for j in range(n):
        gw[j] = acc_w[j]
        gb[j] = acc_b[j]


@_jit_fma
def softmax_grad_rows(y, g, log, gx):
    """The input gradient of softmax (log_softmax when `log`) over the last axis from its
    output y and output gradient g, all (R, N): softmax gx = y (g - sum(g y)), log_softmax
    gx = g - exp(y) sum(g); sums in float64."""
    rows, n = y.shape
    t = np.empty(n)
    for r in range(rows):
        if log:
            for j in range(n):
                t[j] = np.float64(g[r, j])
            s = _sum8(t, 0, n)
            for j in range(n):
                gx[r, j] = t[j] - _exp_le0(np.float64(y[r, j])) * s
        else:
            for j in range(n):
                t[j] = np.float64(g[r, j]) * np.float64(y[r, j])
            s = _sum8(t, 0, n)
            for j in range(n):
                gx[r, j] = t[j] - np.float64(y[r, j]) * s


# -- LSTM steps: the pointwise part of one time step over all rows, in float64 --------------
@_inline
def _sigmoid(v):
    """1 / (1 + exp(-v)) from exp of a non-positive number (no overflow); NaN stays NaN."""
    e = _exp_le0(-abs(v))
    s = 1.0 / (1.0 + e)
    return s if v >= 0.0 else e * s


@_inline
def _tanh(v):
    """tanh from exp of a non-positive number, (1 - e) / (1 + e) with e = exp(-2|v|); below
    |v| = 2^-5 its Taylor series to v^9 instead (1 - e cancels there).  Both are computed and
    one selected, so loops over it stay branch-free and vectorise."""
    a = abs(v)
    v2 = v * v
    small = v * (1.0 + v2 * (-0.3333333333333333 + v2 * (0.13333333333333333 + v2 * (
        -0.05396825396825397 + v2 * 0.021869488536155203))))
    e = _exp_le0(-2.0 * a)
    t = (1.0 - e) / (1.0 + e)
    big = t if v >= 0.0 else -t
    return small if a < 0.03125 else big


@_inline
def _sigmoid_libm(v):
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0.0 else math.exp(v) / (1.0 + math.exp(v))


@_inline
def _act_into(dst, off, a, b, lo, hi, tanh, exact):
    """dst[off + j] = act(a[j] + b[j]) for j in [lo, hi), in float64: sigmoid, or tanh when
    `tanh`; libm's exp/tanh when `exact` (float64 data), else the vectorising forms (float32
    data, rounded once).  The branches sit outside the loops, so each loop vectorises."""
    if exact:
        if tanh:
            for j in range(lo, hi):
                dst[off + j] = math.tanh(np.float64(a[j]) + np.float64(b[j]))
        else:
            for j in range(lo, hi):
                dst[off + j] = _sigmoid_libm(np.float64(a[j]) + np.float64(b[j]))
    elif tanh:
        for j in range(lo, hi):
            dst[off + j] = _tanh(np.float64(a[j]) + np.float64(b[j]))
    else:
        for j in range(lo, hi):
            dst[off + j] = _sigmoid(np.float64(a[j]) + np.float64(b[j]))


@_jit_fma
def lstm_step(proj_t, hw, h_prev, c_prev, r, h_out, c_out, exact):
    """One LSTM step: gates = proj_t + hw (B, 4H) in torch's (i, f, g, o) order; writes
    r (B, 7H) = [h_prev | c_prev | tanh(c) | i f g o (activated)], c_out = f c_prev + i g and
    h_out = o tanh(c), computing in float64 (`exact`: with libm, for float64 data).  Each inner
    loop runs over one contiguous stretch of a row with few arrays, so it vectorises (one loop
    over all seven blocks did not)."""
    rows, hs = c_prev.shape
    zero = np.zeros(hs)
    for b in range(rows):
        pr, hr, rr = proj_t[b], hw[b], r[b]
        _act_into(rr, 3 * hs, pr, hr, 0, 2 * hs, False, exact)  # i, f
        _act_into(rr, 3 * hs, pr, hr, 2 * hs, 3 * hs, True, exact)  # g
        _act_into(rr, 3 * hs, pr, hr, 3 * hs, 4 * hs, False, exact)  # o
        hp, cp, ho, co = h_prev[b], c_prev[b], h_out[b], c_out[b]
        for j in range(hs):
            rr[j] = hp[j]
            rr[hs + j] = cp[j]
        for j in range(hs):
            co[j] = np.float64(rr[4 * hs + j]) * np.float64(cp[j]) + np.float64(
                rr[3 * hs + j]) * np.float64(rr[5 * hs + j])
        _act_into(rr, 2 * hs, co, zero, 0, hs, True, exact)  # tanh(c)
        for j in range(hs):
            ho[j] = rr[6 * hs + j] * rr[2 * hs + j]


@_jit_fma
def lstm_step_grad(g_t, dh, dc, r, d_pre, dc_out):
    """The gradient of one lstm_step from its workspace row r: with gh = g_t + dh and
    dc' = dc + gh o (1 - tanh(c)^2), d_pre (B, 4H) = [dc' g i (1 - i), dc' c_prev f (1 - f),
    dc' i (1 - g^2), gh tanh(c) o (1 - o)] and dc_out = dc' f."""
    rows, hs = dc.shape
    for b in range(rows):
        for j in range(hs):
            gh = np.float64(g_t[b, j]) + np.float64(dh[b, j])
            cp = np.float64(r[b, hs + j])
            tc = np.float64(r[b, 2 * hs + j])
            i = np.float64(r[b, 3 * hs + j])
            f = np.float64(r[b, 4 * hs + j])
            g = np.float64(r[b, 5 * hs + j])
            o = np.float64(r[b, 6 * hs + j])
            d = np.float64(dc[b, j]) + gh * o * (1.0 - tc * tc)
            d_pre[b, j] = d * g * (i * (1.0 - i))
            d_pre[b, hs + j] = d * cp * (f * (1.0 - f))
            d_pre[b, 2 * hs + j] = d * i * (1.0 - g * g)
            d_pre[b, 3 * hs + j] = gh * tc * (o * (1.0 - o))
            dc_out[b, j] = d * f


@_jit_fma
def gru_step(proj_t, gh, h_prev, r, h_out, exact):
    """One GRU step: proj_t (B, 3H) the input projection, gh = h_prev W_hh^T + b_hh (B, 3H),
    torch's (r, z, n) order; writes r (B, 5H) = [h_prev | r z n (activated) | gh_n] and
    h_out = n + z (h_prev - n), in float64 (`exact`: with libm)."""
    rows, hs = h_prev.shape
    pre_n = np.empty(hs)
    zero = np.zeros(hs)
    for b in range(rows):
        pr, gr, rr = proj_t[b], gh[b], r[b]
        _act_into(rr, hs, pr, gr, 0, 2 * hs, False, exact)  # r, z
        hp, ho = h_prev[b], h_out[b]
        for j in range(hs):
            rr[j] = hp[j]
            rr[4 * hs + j] = gr[2 * hs + j]
            pre_n[j] = np.float64(pr[2 * hs + j]) + np.float64(rr[hs + j]) * np.float64(
                gr[2 * hs + j])
        _act_into(rr, 3 * hs, pre_n, zero, 0, hs, True, exact)  # n
        for j in range(hs):
            n = np.float64(rr[3 * hs + j])
            ho[j] = n + np.float64(rr[2 * hs + j]) * (np.float64(hp[j]) - n)


@_jit_fma
def gru_step_grad(g_t, dh, r, d_gi, d_gh, dh_prev):
    """The gradient of one gru_step from its workspace row r: with gh' = g_t + dh, writes
    d_gi = [d_r, d_z, d_n] and d_gh = [d_r, d_z, d_n r] (B, 3H) for the pre-activations, and
    dh_prev = gh' z (the part that does not go through W_hh)."""
    rows, hs = dh.shape
    for b in range(rows):
        for j in range(hs):
            g = np.float64(g_t[b, j]) + np.float64(dh[b, j])
            hp = np.float64(r[b, j])
            rg = np.float64(r[b, hs + j])
            z = np.float64(r[b, 2 * hs + j])
            n = np.float64(r[b, 3 * hs + j])
            ghn = np.float64(r[b, 4 * hs + j])
            dn = g * (1.0 - z) * (1.0 - n * n)
            dz = g * (hp - n) * (z * (1.0 - z))
            dr = dn * ghn * (rg * (1.0 - rg))
            d_gi[b, j] = dr
            d_gi[b, hs + j] = dz
            d_gi[b, 2 * hs + j] = dn
            d_gh[b, j] = dr
            d_gh[b, hs + j] = dz
            d_gh[b, 2 * hs + j] = dn * rg
            dh_prev[b, j] = g * z
