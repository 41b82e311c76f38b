"""numba loops for batch normalisation in training mode, over x viewed as (N, C, L).

Per channel: the forward reads x twice (the mean, then the centred sum of squares, both
accumulated in float64) and writes y once; the backward reads (g, x) for the two channel sums
and once more to write dx.  The composed NumPy form makes about eight full-size passes
forward and fifteen backward, each with a temporary.  `available()` is False without numba.
"""

from __future__ import annotations

import math

try:
    import numba

    from ._numba_cache import njit as _cached_njit
except Exception:  # pragma: no cover - numba is a dependency, but stay importable without it
    numba = None


def available() -> bool:
    return numba is not None


def bn_forward(x, w, b, eps, y, mean, var):
    """y = (x - mean) / sqrt(var + eps) * w + b with the biased batch statistics per channel
    (written to mean and var)."""
    n, c, L = x.shape
    count = n * L
    for ci in range(c):
        s = 0.0
        for i in range(n):
            for j in range(L):
                s += x[i, ci, j]
        m = s / count
        ss = 0.0
        for i in range(n):
            for j in range(L):
                d = x[i, ci, j] - m
                ss += d * d
        v = ss / count
        mean[ci] = m
        var[ci] = v
        scale = w[ci] / math.sqrt(v + eps)
        shift = b[ci] - m * scale
        for i in range(n):
            for j in range(L):
                y[i, ci, j] = x[i, ci, j] * scale + shift


def bn_backward(g, x, w, mean, var, gm, gv, eps, dx, dw, db):
    """The gradients of bn_forward's three outputs (g for y, gm for mean, gv for var) with
    respect to x, w and b:
        dx = w*rstd * (g - mean(g) - xhat * mean(g*xhat)) + gm/count + gv * 2 (x - m)/count
        dw = sum(g * xhat),  db = sum(g).
    dx is affine in (g, x) per channel, so the last pass is dx = g*k + x*p + q."""
    n, c, L = x.shape
    count = n * L
    for ci in range(c):
        m = mean[ci]
        rstd = 1.0 / math.sqrt(var[ci] + eps)
        sg = 0.0
        for i in range(n):
            for j in range(L):
                sg += g[i, ci, j]
        sgx = 0.0
        for i in range(n):
            for j in range(L):
                sgx += g[i, ci, j] * (x[i, ci, j] - m)
        sgx *= rstd
        db[ci] = sg
        dw[ci] = sgx
        k = w[ci] * rstd
        p = 2.0 * gv[ci] / count - k * rstd * sgx / count
        q = gm[ci] / count - k * sg / count - m * p
        for i in range(n):
            for j in range(L):
                dx[i, ci, j] = g[i, ci, j] * k + x[i, ci, j] * p + q


if numba is not None:
    # reassoc: the channel sums may be reordered, so LLVM vectorises them (8 float64 lanes
    # of partial sums instead of one serial chain: about 3x faster here).
    _jit = _cached_njit(nogil=True, error_model="numpy", fastmath={"reassoc"})
    bn_forward = _jit(bn_forward)
    bn_backward = _jit(bn_backward)
