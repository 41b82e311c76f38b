"""numba loops for batch normalisation in training mode, over x viewed as (N, C, L).

Per channel: the forward reads x twice (the mean, then the centred sum of squares, both
accumulated in float64) and writes y once; the backward reads (g, x) once for the two channel
sums and once more to write dx.  The composed NumPy form makes about eight full-size passes
forward and fifteen backward, each with a temporary.  `available()` is False without numba.
"""

from __future__ import annotations

import math

try:
    import numba
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
        dw = sum(g * xhat),  db = sum(g)."""
    n, c, L = x.shape
    count = n * L
    for ci in range(c):
        m = mean[ci]
        rstd = 1.0 / math.sqrt(var[ci] + eps)
        sg = 0.0
        sgx = 0.0
        for i in range(n):
            for j in range(L):
                gij = g[i, ci, j]
                sg += gij
                sgx += gij * (x[i, ci, j] - m)
        sgx *= rstd
        db[ci] = sg
        dw[ci] = sgx
        k = w[ci] * rstd
        a = sg / count
        bcoef = sgx / count
        cm = gm[ci] / count
        cv = 2.0 * gv[ci] / count
        for i in range(n):
            for j in range(L):
                d = x[i, ci, j] - m
                dx[i, ci, j] = k * (g[i, ci, j] - a - d * rstd * bcoef) + cm + cv * d


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True, error_model="numpy")
    bn_forward = _jit(bn_forward)
    bn_backward = _jit(bn_backward)
