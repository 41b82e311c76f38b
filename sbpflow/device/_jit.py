"""numba loops behind a few CPU primitives (im2col/col2im, max pooling, scatter-add, the SGD
momentum step).

Each loop does exactly the arithmetic of the NumPy code it replaces (copies, comparisons,
and adds in the same order), so results are bitwise equal; it only removes NumPy's per-pass
and per-short-row overhead.  Compiled with numba's on-disk cache (`cache=True`; this module's
path is stable), so a second process loads the machine code instead of compiling it.

`available()` is False when numba cannot be imported; callers then keep their NumPy code.
"""

from __future__ import annotations

try:
    import numba
except Exception:  # pragma: no cover - numba is a dependency, but stay importable without it
    numba = None


def available() -> bool:
    return numba is not None


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True, error_model="numpy")

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
