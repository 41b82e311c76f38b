"""The closed primitive set, and its CPU (NumPy) implementation.

Kernels touch arrays only through these methods; a device is a `Primitives` subclass.  Arrays
are opaque to kernels: they may read `.shape`, `.dtype` and `.ndim` and nothing else.  The
`mock` device enforces that.

The set, by family:
  memory      empty, full, copy (broadcasting write into dst), contiguous, cast,
              from_host, to_host
  elementwise unary, binary (broadcasting), where
  reduce      reduce (sum/prod/max/min/any/all/argmax/argmin), scan (cumsum/cumprod)
  linalg      matmul (batched, broadcasting)
  layout      permute, reshape (a view; fails if impossible), slice (basic-index view),
              broadcast_to (a stride-0 view), windows / windows_add (sliding windows and
              their adjoint, for convolution and pooling), flip
  index       gather, scatter (in place), index (advanced indexing), index_put (in place),
              sort
  nn          softmax, log_softmax, pad, unfold / fold (im2col / col2im), window_max (max
              pooling), nll_rows / nll_grad_rows, sgd_momentum, gelu / gelu_grad,
              layer_norm_rows, softmax_rows, batch_norm_train / batch_norm_grad, lstm_step /
              lstm_step_grad, gru_step / gru_step_grad; all but
              unfold may return None where the device has no fused loop, and the kernel
              composes the others
  random      random (counter-based, see random.py)
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .._core.dtype import DType
from . import _jit, _jit_bn
from . import random as _rng
from .allocator import LARGE, CachingAllocator
from .special import erf as _erf

# inf and nan are values here, as in torch: NumPy's floating-point warnings (log(0), 0/0,
# overflow) are not errors of the user's program, and torch prints none.  They are attributed
# to the line that called NumPy, which is a primitive, a cached call's direct ufunc in the
# interpreter, or a graph's compiled step: any sbpflow module.  (sbpflow itself warns with
# other categories.)
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"sbpflow\.")


def _arr(r):
    """NumPy returns scalars for 0-d results; primitives always return arrays."""
    return r if type(r) is np.ndarray else np.asarray(r)


def _data(a) -> int:
    """The address of a's first element."""
    return a.__array_interface__["data"][0]


def _sigmoid(x):
    # Stable for large |x|: exp of a non-positive number only.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def _round_half_even(x):
    return np.round(x)


_UNARY = {
    "neg": np.negative,
    "abs": np.abs,
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "log2": np.log2,
    "log10": np.log10,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "reciprocal": np.reciprocal,
    "square": np.square,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "sigmoid": _sigmoid,
    "erf": lambda x: _erf(x).astype(x.dtype, copy=False),
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round_half_even,
    "trunc": np.trunc,
    "sign": np.sign,
    "logical_not": np.logical_not,
    "bitwise_not": np.invert,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "isfinite": np.isfinite,
    "signbit": np.signbit,
}

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "floor_divide": np.floor_divide,
    "remainder": np.remainder,
    "fmod": np.fmod,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "atan2": np.arctan2,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
}

# Integer division by zero raises, as in torch (NumPy would return 0 with a warning).
_INT_DIVIDING = frozenset(("floor_divide", "remainder", "fmod"))


def _check_int_divisor(b) -> None:
    kind = getattr(b, "dtype", np.dtype(type(b))).kind
    if kind in "iub" and not np.all(b):
        raise RuntimeError("ZeroDivisionError")


# The ufuncs' own reduce, not np.sum & co.: those Python wrappers would be the frame NumPy's
# floating-point warnings are attributed to, outside sbpflow (see the filter above).
_REDUCE = {
    "sum": np.add.reduce,
    "prod": np.multiply.reduce,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
    "any": np.logical_or.reduce,
    "all": np.logical_and.reduce,
}

# dtypes the numba loops of `_jit` take
_JIT_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# softmax rows at least this long stay with NumPy's passes (measured: equal at 64, 2.5x
# faster at 1024)
_SOFTMAX_LOOP_MAX = 64

_SCAN = {"cumsum": np.cumsum, "cumprod": np.cumprod}


class Primitives:
    """CPU primitives over NumPy arrays.  Subclasses (mock, later CuPy) keep the signatures."""

    name = "cpu"

    def __init__(self):
        self.allocator = CachingAllocator()

    # -- memory -------------------------------------------------------------------------
    def empty(self, shape, dtype: DType):
        return self.allocator.empty(shape, dtype.np)

    def full(self, shape, dtype: DType, value):
        out = self.allocator.empty(shape, dtype.np)
        out.fill(value)
        return out

    def release(self, arrays: list) -> None:
        """The storages owning these arrays are dead (the VM's release instruction): recycle
        their buffers.  Empties the list, so the caller keeps no reference."""
        while arrays:
            self.allocator.free_last(arrays)

    def copy(self, dst, src):
        """Write `src` (broadcast, cast) into `dst` in place; return dst."""
        np.copyto(dst, src, casting="unsafe")
        return dst

    def contiguous(self, x):
        """A fresh C-contiguous copy."""
        if x.nbytes < LARGE:
            return np.array(x, copy=True, order="C")
        out = self.allocator.empty(x.shape, x.dtype)
        np.copyto(out, x)
        return out

    def ensure_contiguous(self, x):
        """x itself when already C-contiguous, else a C-contiguous copy."""
        return x if x.flags.c_contiguous else np.ascontiguousarray(x)

    def cast(self, x, dtype: DType):
        """A fresh array of `dtype` (always a copy, so outputs never alias inputs)."""
        return np.asarray(x).astype(dtype.np, copy=True)

    def from_host(self, ndarray, dtype: DType):
        return np.array(ndarray, dtype=dtype.np, copy=True, order="C")

    def to_host(self, x):
        """A NumPy view of the device array (CPU: the array itself)."""
        return x

    # -- elementwise --------------------------------------------------------------------
    def unary(self, op: str, x, out=None):
        """`out`: an array of the result's shape and dtype to write into (it may be x's
        memory); returned."""
        if op == "erf":  # its work buffers come from (and go back to) the cache
            r = _erf(x, self.allocator).astype(x.dtype, copy=False)
            return _arr(r) if out is None else self.copy(out, r)
        f = _UNARY[op]
        if out is None:
            return _arr(f(x))
        if isinstance(f, np.ufunc):
            f(x, out=out)
        else:
            np.copyto(out, f(x))
        return out

    def binary(self, op: str, a, b, out=None):
        """`out`: an array of the result's shape and dtype to write into (it may be an input's
        memory: an elementwise op reads each element before writing it); returned."""
        f = _BINARY[op]
        if op in _INT_DIVIDING:
            _check_int_divisor(b)
        if out is not None:
            f(a, b, out=out)
            return out
        if getattr(a, "nbytes", 0) >= LARGE or getattr(b, "nbytes", 0) >= LARGE:
            # Large results go into a cached buffer instead of freshly faulted-in memory.
            a, b = np.asarray(a), np.asarray(b)
            out_dtype = f.resolve_dtypes((a.dtype, b.dtype, None))[2]
            out = self.allocator.empty(np.broadcast_shapes(a.shape, b.shape), out_dtype)
            return f(a, b, out=out)
        return _arr(f(a, b))

    def where(self, cond, a, b):
        return _arr(np.where(cond, a, b))

    # -- direct forms (the interpreter's cached calls) ------------------------------------
    def direct_elementwise(self, op: str):
        """The array function that `unary(op, x)` / `binary(op, a, b)` apply to same-dtype
        arrays whose result is non-empty of rank >= 1 and smaller than the caching
        allocator's LARGE: fn(*arrays) returns exactly their result, without their dispatch.
        None where the op needs more than one function call (integer division's zero check,
        erf's buffers, non-ufunc compositions)."""
        f = _BINARY.get(op) or _UNARY.get(op)
        if type(f) is not np.ufunc or op in _INT_DIVIDING:
            return None
        return f

    def direct_reduce(self, op: str, axes: tuple[int, ...], keepdims: bool):
        """fn(x) computing `reduce(op, x, axes, keepdims)` for an x of rank >= 1, or None."""
        if op != "sum":
            return None
        reduce = np.add.reduce

        def fn(x):
            return _arr(reduce(x, axis=axes, keepdims=keepdims))

        return fn

    # -- reductions ---------------------------------------------------------------------
    def reduce(self, op: str, x, axes: tuple[int, ...], keepdims: bool = False):
        if op in ("argmax", "argmin"):
            (axis,) = axes
            f = np.argmax if op == "argmax" else np.argmin
            return _arr(f(x, axis=axis, keepdims=keepdims))
        return _arr(_REDUCE[op](x, axis=axes, keepdims=keepdims))

    def scan(self, op: str, x, axis: int, dtype: DType | None = None):
        return _SCAN[op](x, axis=axis, dtype=None if dtype is None else dtype.np)

    # -- linalg -------------------------------------------------------------------------
    def matmul(self, a, b):
        if a.ndim > 2 and b.ndim == 2 and a.dtype == b.dtype:
            # A stack of matrices times one matrix: all rows in one GEMM (NumPy would make
            # one BLAS call per matrix: 3x slower on a transformer's activations), as torch's
            # linear does, when a's leading axes merge without a copy.
            rows = a.view()
            try:
                rows.shape = (-1, a.shape[-1])
            except AttributeError:
                pass
            else:
                y = Primitives.matmul(self, rows, b)  # (not a subclass's wrapper)
                y.shape = a.shape[:-1] + (b.shape[1],)
                return y
        if a.ndim >= 2 and b.ndim >= 2 and a.dtype == b.dtype:
            shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
            n = a.dtype.itemsize
            for s in shape:
                n *= s
            if n >= LARGE:
                return np.matmul(a, b, out=self.allocator.empty(shape, a.dtype))
        return _arr(np.matmul(a, b))

    def coo_matmul(self, rows, cols, values, n_rows: int, dense):
        """A sparse COO matrix (entries values[k] at (rows[k], cols[k]), duplicates summed;
        n_rows rows, dense.shape[0] columns) times a dense matrix: a SciPy CSR product."""
        import scipy.sparse as sp

        a = sp.csr_matrix((values, (rows, cols)), shape=(n_rows, dense.shape[0]))
        return _arr(np.asarray(a @ dense, dtype=np.result_type(values, dense)))

    # -- layout (views share memory with their input) -------------------------------------
    def permute(self, x, perm):
        return np.transpose(x, perm)

    def reshape(self, x, shape):
        """x with a new shape: a view when the strides allow one, else a contiguous copy
        (torch's reshape).  Kernels read their inputs through it, whatever their layout."""
        v = x.view()
        try:
            v.shape = shape
        except AttributeError:  # e.g. the rows of a transpose or a slice with a step
            return np.ascontiguousarray(x).reshape(shape)
        return v

    def view_shape(self, x, shape):
        """A view of x with a new shape (torch's view); raises ValueError when the strides
        do not allow one.  View ops use it; kernels that only read use `reshape`."""
        v = x.view()
        try:
            v.shape = shape
        except AttributeError:
            raise ValueError(f"no view of shape {tuple(shape)} of strides "
                             f"{x.strides}") from None
        return v

    def bitcast(self, x, dtype: DType):
        """A view of x's bytes as `dtype`; the last axis rescales when the element size
        differs (it must then be contiguous, else ValueError)."""
        return x.view(dtype.np)

    def slice(self, x, key):
        """Basic indexing (ints, slices with positive steps, None, Ellipsis): a view."""
        # An all-int key would give a NumPy scalar copy; a trailing Ellipsis keeps a 0-d view.
        if not any(k is Ellipsis for k in key):
            key = tuple(key) + (Ellipsis,)
        return x[key]

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, shape)

    def flip(self, x, axes):
        return np.flip(x, axes)

    def windows(self, x, window, stride, dilation):
        """Sliding windows over the trailing len(window) axes: a view shaped
        (*lead, *out_spatial, *window)."""
        k = len(window)
        lead = x.shape[:-k]
        spatial = x.shape[-k:]
        out = tuple(
            (n - d * (w - 1) - 1) // s + 1 for n, w, s, d in zip(spatial, window, stride, dilation)
        )
        st = x.strides
        strides = (
            st[:-k]
            + tuple(st[-k + i] * stride[i] for i in range(k))
            + tuple(st[-k + i] * dilation[i] for i in range(k))
        )
        return np.lib.stride_tricks.as_strided(
            x, lead + out + tuple(window), strides, writeable=False
        )

    def unfold(self, x, window, stride, dilation, groups: int = 1):
        """im2col: every window of x (N, C, *spatial) copied out, as a contiguous
        (G, C/G, *window, N, *out) array (rows (channel, tap), columns (sample, position))."""
        k = len(window)
        nb, c = x.shape[:2]
        if (k == 2 and x.flags.c_contiguous and x.dtype in _JIT_FLOATS and _jit.available()
                and c % groups == 0):
            out = tuple((n - d * (w - 1) - 1) // s + 1
                        for n, w, s, d in zip(x.shape[2:], window, stride, dilation))
            cols = self.allocator.empty((c,) + tuple(window) + (nb,) + out, x.dtype)
            _jit.im2col2d(x, cols, window[0], window[1], stride[0], stride[1], dilation[0],
                          dilation[1])
            return cols.reshape((groups, c // groups) + cols.shape[1:])
        view = Primitives.windows(self, x, window, stride, dilation)  # (not a subclass's)
        out = view.shape[2:2 + k]
        view = view.reshape((nb, groups, c // groups) + out + tuple(window))
        perm = (1, 2) + tuple(range(3 + k, 3 + 2 * k)) + (0,) + tuple(range(3, 3 + k))
        return Primitives.contiguous(self, np.transpose(view, perm))

    def fold(self, cols, spatial, window, stride, dilation, pads):
        """col2im, the adjoint of `unfold`: cols (C, *window, *out, N) added into a zeroed
        (N, C, *spatial), window taps in the padding (`pads` (lo, hi) per axis) dropped; None
        where there is no fused loop (the kernel then adds tap by tap)."""
        if (len(window) != 2 or cols.dtype not in _JIT_FLOATS or not _jit.available()
                or any(lo < 0 for lo, _ in pads)):
            return None
        cols = np.ascontiguousarray(cols)
        padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads))
        buf = self.allocator.empty((cols.shape[0],) + padded + (cols.shape[-1],), cols.dtype)
        buf.fill(0)
        dst = self.allocator.empty((cols.shape[-1], cols.shape[0]) + tuple(spatial), cols.dtype)
        _jit.col2im2d(cols, buf, dst, stride[0], stride[1], dilation[0], dilation[1],
                      pads[0][0], pads[1][0])
        held = [buf]
        del buf
        self.allocator.free_last(held)
        return dst

    def sgd_momentum(self, p, g, buf, momentum: float, lr: float, p_out=None, buf_out=None):
        """SGD's momentum step in one pass (no dampening, nesterov, weight decay):
        buf' = buf * m + g, p' = p + (-lr) * buf', with m and -lr in p's dtype, written into
        p_out/buf_out (which may be p/buf) or fresh arrays; (p', buf'), or None where there is
        no fused loop (the kernel then composes it from elementwise primitives)."""
        arrays = (p, g, buf) + tuple(a for a in (p_out, buf_out) if a is not None)
        if (p.dtype not in _JIT_FLOATS or not _jit.available()
                or any(a.dtype != p.dtype or a.shape != p.shape or not a.flags.c_contiguous
                       for a in arrays)):
            return None
        # The loop runs in place: copy into distinct outputs first.
        if p_out is None:
            p_out = Primitives.contiguous(self, p)  # (not a subclass's)
        elif p_out is not p and _data(p_out) != _data(p):
            np.copyto(p_out, p)
        if buf_out is None:
            buf_out = Primitives.contiguous(self, buf)
        elif buf_out is not buf and _data(buf_out) != _data(buf):
            np.copyto(buf_out, buf)
        t = p.dtype.type
        _jit.sgd_momentum(p_out.reshape(-1), g.reshape(-1), buf_out.reshape(-1), t(momentum),
                          t(-lr))
        return p_out, buf_out

    def nll_rows(self, x, target, weight, ignore_index: int):
        """nll_loss per row of x (N, C), target (N,) int64, weight (C,):
        (loss (N, 1), picked weight (N, 1), min target, max target); outside [0, C) the
        arrays are unset (the kernel raises).  None where there is no fused loop."""
        if (x.ndim != 2 or x.dtype not in _JIT_FLOATS or weight.dtype != x.dtype
                or target.dtype != np.int64 or target.shape != x.shape[:1] or x.shape[0] == 0
                or weight.shape != x.shape[1:] or not _jit.available()):
            return None
        loss = np.empty((x.shape[0], 1), x.dtype)
        w_t = np.empty((x.shape[0], 1), x.dtype)
        lo, hi = _jit.nll_rows(np.ascontiguousarray(x), target, weight, ignore_index, loss, w_t)
        return loss, w_t, lo, hi

    def nll_grad_rows(self, g, target, weight, ignore_index: int):
        """nll_loss's input gradient (N, C) for target (N,) int64, weight (C,), g () or (N,):
        (dx, min target, max target), or None where there is no fused loop."""
        if (g.dtype not in _JIT_FLOATS or weight.dtype != g.dtype or target.ndim != 1
                or target.dtype != np.int64 or target.shape[0] == 0 or weight.ndim != 1
                or g.size not in (1, target.shape[0]) or g.ndim > 1 or not _jit.available()):
            return None
        dx = self.allocator.empty((target.shape[0], weight.shape[0]), g.dtype)
        dx.fill(0)
        lo, hi = _jit.nll_grad_rows(np.ascontiguousarray(g).reshape(-1), target, weight,
                                    ignore_index, dx)
        return dx, lo, hi

    def window_max(self, x, index_map, window, stride, dilation):
        """Max pooling's running maximum over x's padded windows, in torch's scan order, as
        (values, flat input indices) shaped (N, C, *out); None where there is no fused loop
        (the kernel then composes it from elementwise primitives)."""
        if len(window) != 2 or x.ndim != 4 or x.dtype not in _JIT_FLOATS or not _jit.available():
            return None
        x = np.ascontiguousarray(x)
        shape = x.shape[:2] + index_map.shape[:2]
        best = self.allocator.empty(shape, x.dtype)
        indices = self.allocator.empty(shape, np.int64)
        lead = x.shape[0] * x.shape[1]
        _jit.max_pool2d(x.reshape((lead,) + x.shape[2:]), np.ascontiguousarray(index_map),
                        best.reshape((lead,) + shape[2:]),
                        indices.reshape((lead,) + shape[2:]),
                        stride[0], stride[1], dilation[0], dilation[1])
        return best, indices

    def windows_add(self, dst, cols, window, stride, dilation):
        """Adjoint of `windows`: add cols (*lead, *out, *window) into dst (*lead, *spatial)."""
        k = len(window)
        out = cols.shape[-2 * k : -k]
        for w_idx in np.ndindex(*window):
            key = (Ellipsis,) + tuple(
                slice(w_idx[i] * dilation[i], w_idx[i] * dilation[i] + stride[i] * out[i],
                      stride[i])
                for i in range(k)
            )
            dst[key] += cols[(Ellipsis,) + tuple(slice(None) for _ in range(k)) + w_idx]
        return dst

    # -- indexing -------------------------------------------------------------------------
    def gather(self, x, axis: int, index):
        return np.take_along_axis(x, index, axis)

    def scatter(self, dst, axis: int, index, src, reduce: str | None = None):
        """In place: dst[..., index[i], ...] = (or +=, *=) src[i] along `axis`."""
        if index.size == 0:
            return dst  # nothing to scatter (and an empty index has no row shape to reshape to)
        idx = list(np.indices(index.shape, sparse=True))
        idx[axis] = index
        idx = tuple(idx)
        if np.ndim(src):
            src = src[tuple(slice(0, n) for n in index.shape)]
        if reduce is None:
            dst[idx] = src
        elif reduce == "add":
            if not (axis == dst.ndim - 1 and np.ndim(src) and src.shape == index.shape
                    and index.shape[:-1] == dst.shape[:-1] and dst.flags.c_contiguous
                    and dst.dtype in _JIT_FLOATS and src.dtype == dst.dtype
                    and index.dtype == np.int64 and _jit.available()
                    and _jit.scatter_add_rows(dst.reshape(-1, dst.shape[-1]),
                                              index.reshape(-1, index.shape[-1]),
                                              src.reshape(-1, src.shape[-1]))):
                np.add.at(dst, idx, src)
        elif reduce == "multiply":
            np.multiply.at(dst, idx, src)
        elif reduce == "amax":
            np.maximum.at(dst, idx, src)
        elif reduce == "amin":
            np.minimum.at(dst, idx, src)
        else:
            raise ValueError(f"scatter: unknown reduce {reduce!r}")
        return dst

    def index(self, x, key):
        """Advanced indexing (a copy)."""
        return x[key]

    def index_put(self, dst, key, value, accumulate: bool = False):
        if accumulate:
            np.add.at(dst, key, value)
        else:
            dst[key] = value
        return dst

    def sort(self, x, axis: int, descending: bool = False, stable: bool = True):
        """(values, indices) along axis, stable, with torch's order: NaN above +inf.

        Ascending, NumPy already puts NaN last.  Descending sorts a decreasing key: `-x` for
        floats (then NaN, which `-x` leaves last, moves to the front) and `~x` for integers
        and bools (no overflow at the type's minimum, unlike `-x`).
        """
        if not descending:
            idx = np.argsort(x, axis=axis, kind="stable")
            return np.take_along_axis(x, idx, axis), idx
        floating = x.dtype.kind in "fcV"  # V: ml_dtypes' bfloat16
        idx = np.argsort(-x if floating else ~x, axis=axis, kind="stable")
        values = np.take_along_axis(x, idx, axis)
        if floating:
            nan = np.isnan(values)
            if nan.any():
                front = np.argsort(~nan, axis=axis, kind="stable")
                idx = np.take_along_axis(idx, front, axis)
                values = np.take_along_axis(values, front, axis)
        return values, idx

    def median(self, x, axis: int):
        """(values, indices) of the lower median along axis, keeping the axis (size 1).

        torch's rule: a slice holding NaN has median NaN, at the index of its first NaN.  The
        stable ascending sort puts NaNs last in their original order, so the first NaN sits at
        position n - (number of NaNs).
        """
        n = x.shape[axis]
        idx = np.argsort(x, axis=axis, kind="stable")
        pos = np.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], (n - 1) // 2, np.intp)
        if x.dtype.kind in "fcV":
            nans = np.isnan(x).sum(axis=axis, keepdims=True)
            pos = np.where(nans > 0, n - nans, pos)
        picked = np.take_along_axis(idx, pos, axis)
        return np.take_along_axis(x, picked, axis), picked

    # -- nn -------------------------------------------------------------------------------
    def softmax(self, x, axis: int):
        m = np.max(x, axis=axis, keepdims=True)
        e = np.exp(x - m)
        e /= np.sum(e, axis=axis, keepdims=True)
        return e

    def log_softmax(self, x, axis: int):
        m = np.max(x, axis=axis, keepdims=True)
        s = x - m
        s -= np.log(np.sum(np.exp(s), axis=axis, keepdims=True))
        return s

    def pad(self, x, pad_width, mode: str = "constant", value=0):
        """pad_width: ((before, after), ...) per axis, non-negative."""
        if mode == "constant":
            # One fill and one copy of the interior (np.pad's generic path is ~2x slower).
            shape = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, pad_width))
            out = self.allocator.empty(shape, x.dtype)
            out.fill(value)
            out[tuple(slice(lo, lo + n) for n, (lo, _) in zip(x.shape, pad_width))] = x
            return out
        return np.pad(x, pad_width, mode={"reflect": "reflect", "replicate": "edge",
                                          "circular": "wrap"}[mode])

    # One-pass loops of the transformer ops: float32/64 only, computed in float64 and rounded
    # once (within float32 rounding of the composed NumPy kernels, not bitwise); None where
    # there is no loop (another dtype, no numba), and the kernel composes the op instead.
    def gelu(self, x, approximate: str = "none"):
        """GELU of x, exact (erf) or "tanh" form, as a fresh array, or None."""
        if x.dtype not in _JIT_FLOATS or not _jit.available():
            return None
        out = self.allocator.empty(x.shape, x.dtype)
        x = np.ascontiguousarray(x)  # (1-D for a 0-d x)
        if approximate == "tanh":
            f = _jit.gelu_tanh
        else:
            f = _jit.gelu32 if x.dtype == np.float32 else _jit.gelu64
        f(x.reshape(-1), out.reshape(-1))
        return out

    def gelu_grad(self, dy, x, approximate: str = "none"):
        """GELU's input gradient dy * gelu'(x) (dy, x of one shape and dtype), or None."""
        if (x.dtype not in _JIT_FLOATS or dy.dtype != x.dtype or dy.shape != x.shape
                or not _jit.available()):
            return None
        out = self.allocator.empty(x.shape, x.dtype)
        x = np.ascontiguousarray(x)  # (1-D for a 0-d x)
        dy = np.ascontiguousarray(dy)
        if approximate == "tanh":
            f = _jit.gelu_tanh_grad
        else:
            f = _jit.gelu_grad32 if x.dtype == np.float32 else _jit.gelu_grad64
        f(dy.reshape(-1), x.reshape(-1), out.reshape(-1))
        return out

    def layer_norm_rows(self, x, weight, bias, eps: float):
        """layer_norm of x over its trailing weight.ndim axes (weight, bias of those axes'
        shape and x's dtype), or None."""
        k = weight.ndim
        if (x.dtype not in _JIT_FLOATS or weight.dtype != x.dtype or bias.dtype != x.dtype
                or k < 1 or x.ndim < k or x.shape[x.ndim - k:] != weight.shape
                or bias.shape != weight.shape or weight.size == 0 or not _jit.available()):
            return None
        n = weight.size
        x = np.ascontiguousarray(x)
        out = self.allocator.empty(x.shape, x.dtype)
        if x.size:
            _jit.layer_norm_rows(x.reshape(-1, n), np.ascontiguousarray(weight).reshape(-1),
                                 np.ascontiguousarray(bias).reshape(-1), float(eps),
                                 out.reshape(-1, n))
        return out

    def softmax_rows(self, x, log: bool = False):
        """softmax (log_softmax when `log`) over x's last axis, or None: also for rows of 64
        and more, where NumPy's vectorised exp over whole rows is as fast or faster (the loop
        wins on short rows, attention's and small vocabularies': 4x at 13)."""
        if (x.dtype not in _JIT_FLOATS or x.ndim < 1 or x.shape[-1] >= _SOFTMAX_LOOP_MAX
                or not _jit.available()):
            return None
        x = np.ascontiguousarray(x)
        out = self.allocator.empty(x.shape, x.dtype)
        n = x.shape[-1]
        if x.size:
            f = _jit.softmax_rows32 if x.dtype == np.float32 else _jit.softmax_rows64
            f(x.reshape(-1, n), bool(log), out.reshape(-1, n))
        return out

    def batch_norm_train(self, x, weight, bias, eps: float):
        """Batch normalisation with batch statistics over every axis but 1 of x (N, C, ...):
        (y, mean, var) with the biased variance, all of x's dtype; None where the device has
        no fused loop (the kernel composes the other primitives)."""
        if (x.dtype not in _JIT_FLOATS or x.ndim < 2 or weight.dtype != x.dtype
                or bias.dtype != x.dtype or not _jit_bn.available()):
            return None
        n, c = x.shape[0], x.shape[1]
        x3 = np.ascontiguousarray(x).reshape(n, c, -1)
        y = self.allocator.empty(x.shape, x.dtype)
        mean, var = np.empty(c, x.dtype), np.empty(c, x.dtype)
        if x3.size:
            _jit_bn.bn_forward(x3, np.ascontiguousarray(weight), np.ascontiguousarray(bias),
                               float(eps), y.reshape(n, c, -1), mean, var)
        return y, mean, var

    def batch_norm_grad(self, g, x, weight, mean, var, grad_mean, grad_var, eps: float):
        """(dx, dweight, dbias) of batch_norm_train's outputs' gradients, or None."""
        if (x.dtype not in _JIT_FLOATS or x.ndim < 2 or not _jit_bn.available()
                or any(a.dtype != x.dtype for a in (g, weight, mean, var, grad_mean, grad_var))):
            return None
        n, c = x.shape[0], x.shape[1]
        dx = self.allocator.empty(x.shape, x.dtype)
        dw, db = np.empty(c, x.dtype), np.empty(c, x.dtype)
        if x.size:
            _jit_bn.bn_backward(np.ascontiguousarray(g).reshape(n, c, -1),
                                np.ascontiguousarray(x).reshape(n, c, -1),
                                *(np.ascontiguousarray(a) for a in (weight, mean, var,
                                                                     grad_mean, grad_var)),
                                float(eps), dx.reshape(n, c, -1), dw, db)
        else:
            dw.fill(0)
            db.fill(0)
        return dx, dw, db

    def layer_norm_grad_rows(self, g, x, weight, eps: float):
        """layer_norm's gradients (for x, weight, bias) over x's trailing weight.ndim axes,
        from the output gradient g and the input x (statistics recomputed), as (gx, gw, gb);
        or None."""
        k = weight.ndim
        if (x.dtype not in _JIT_FLOATS or g.dtype != x.dtype or weight.dtype != x.dtype
                or g.shape != x.shape or k < 1 or x.ndim < k
                or x.shape[x.ndim - k:] != weight.shape or weight.size == 0
                or not _jit.available()):
            return None
        n = weight.size
        x = np.ascontiguousarray(x)
        g = np.ascontiguousarray(g)
        gx = self.allocator.empty(x.shape, x.dtype)
        gw = np.empty(weight.shape, x.dtype)
        gb = np.empty(weight.shape, x.dtype)
        _jit.layer_norm_grad_rows(g.reshape(-1, n), x.reshape(-1, n),
                                  np.ascontiguousarray(weight).reshape(-1), float(eps),
                                  gx.reshape(-1, n), gw.reshape(-1), gb.reshape(-1))
        return gx, gw, gb

    def softmax_grad_rows(self, y, g, log: bool = False):
        """The input gradient of softmax (log_softmax when `log`) over the last axis from its
        output y and output gradient g (one shape and dtype), or None."""
        if (y.dtype not in _JIT_FLOATS or g.dtype != y.dtype or g.shape != y.shape
                or y.ndim < 1 or not _jit.available()):
            return None
        y = np.ascontiguousarray(y)
        g = np.ascontiguousarray(g)
        gx = self.allocator.empty(y.shape, y.dtype)
        n = y.shape[-1]
        if y.size:
            _jit.softmax_grad_rows(y.reshape(-1, n), g.reshape(-1, n), bool(log),
                                   gx.reshape(-1, n))
        return gx

    # -- random ---------------------------------------------------------------------------
    def lstm_step(self, proj_t, hw, h_prev, c_prev, reserve_t, h_out):
        """The pointwise part of one LSTM time step over (B, .) rows: gates = proj_t + hw
        (B, 4H, torch's i, f, g, o order); writes reserve_t (B, 7H) = [h_prev | c_prev |
        tanh(c) | i f g o activated] and h_out = o tanh(c) (B, H), both C-contiguous; returns
        the new cell c (B, H), or None where the device has no fused loop."""
        arrays = (proj_t, hw, h_prev, c_prev, reserve_t, h_out)
        if (proj_t.dtype not in _JIT_FLOATS or any(a.dtype != proj_t.dtype for a in arrays)
                or not (reserve_t.flags.c_contiguous and h_out.flags.c_contiguous)
                or not _jit.available()):
            return None
        c = np.empty(c_prev.shape, c_prev.dtype)
        _jit.lstm_step(*(np.ascontiguousarray(a) for a in arrays[:4]), reserve_t, h_out, c,
                       c.dtype == np.float64)
        return c

    def lstm_step_grad(self, g_t, dh, dc, reserve_t, d_pre):
        """The gradient of one `lstm_step` from its reserve row: with gh = g_t + dh (B, H)
        and the cell's incoming gradient dc, writes the gates' gradient into d_pre (B, 4H,
        C-contiguous) and returns the previous cell's gradient (B, H); or None."""
        arrays = (g_t, dh, dc, reserve_t, d_pre)
        if (g_t.dtype not in _JIT_FLOATS or any(a.dtype != g_t.dtype for a in arrays)
                or not d_pre.flags.c_contiguous or not _jit.available()):
            return None
        dc_prev = np.empty(dc.shape, dc.dtype)
        _jit.lstm_step_grad(*(np.ascontiguousarray(a) for a in arrays[:4]), d_pre, dc_prev)
        return dc_prev

    def gru_step(self, proj_t, gh, h_prev, reserve_t, h_out):
        """The pointwise part of one GRU time step: proj_t (B, 3H) the input projection, gh
        (B, 3H) the hidden projection with its bias, torch's (r, z, n) order; writes
        reserve_t (B, 5H) = [h_prev | r z n | gh_n] and h_out (B, H), both C-contiguous;
        returns True, or None where the device has no fused loop."""
        arrays = (proj_t, gh, h_prev, reserve_t, h_out)
        if (proj_t.dtype not in _JIT_FLOATS or any(a.dtype != proj_t.dtype for a in arrays)
                or not (reserve_t.flags.c_contiguous and h_out.flags.c_contiguous)
                or not _jit.available()):
            return None
        _jit.gru_step(*(np.ascontiguousarray(a) for a in arrays[:3]), reserve_t, h_out,
                      proj_t.dtype == np.float64)
        return True

    def gru_step_grad(self, g_t, dh, reserve_t, d_gi, d_gh):
        """The gradient of one `gru_step` from its reserve row and gh' = g_t + dh: writes the
        pre-activation gradients d_gi and d_gh (B, 3H, C-contiguous) and returns gh' z, the
        previous state's gradient apart from the path through W_hh; or None."""
        arrays = (g_t, dh, reserve_t, d_gi, d_gh)
        if (g_t.dtype not in _JIT_FLOATS or any(a.dtype != g_t.dtype for a in arrays)
                or not (d_gi.flags.c_contiguous and d_gh.flags.c_contiguous)
                or not _jit.available()):
            return None
        dh_prev = np.empty(dh.shape, dh.dtype)
        _jit.gru_step_grad(*(np.ascontiguousarray(a) for a in arrays[:3]), d_gi, d_gh, dh_prev)
        return dh_prev

    def random(self, kind: str, dtype: DType, seed: int, offset: int, logical_shape,
               piece, **params):
        """A piece of a logical random tensor.

        kind: "uniform" (low, high), "normal" (mean, std), "randint" (low, high),
        "bernoulli" (p).  `piece` is one slice per axis of the logical shape.
        """
        if kind == "normal":
            w = _rng.words_for_piece(seed, offset, logical_shape, piece, 2)
            u1 = _rng.uniform_from_words(w[..., 0])
            u2 = _rng.uniform_from_words(w[..., 1])
            z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
            out = params.get("mean", 0.0) + params.get("std", 1.0) * z
        else:
            w = _rng.words_for_piece(seed, offset, logical_shape, piece, 1)[..., 0]
            if kind == "uniform":
                lo, hi = params.get("low", 0.0), params.get("high", 1.0)
                out = lo + (hi - lo) * _rng.uniform_from_words(w, dtype)
            elif kind == "randint":
                lo, hi = params["low"], params["high"]
                out = lo + (w % np.uint64(hi - lo)).astype(np.int64)
            elif kind == "bernoulli":
                # uniform u = k / 2**53 (k = the word's top 53 bits) < p, compared as integers:
                # u < p <=> k < p * 2**53 (exact) <=> k < ceil(p * 2**53).  The same mask with
                # no float conversion.
                p = params["p"]
                if np.ndim(p):  # a probability per element
                    out = _rng.uniform_from_words(w) < p
                elif not p > 0:
                    out = np.zeros(w.shape, bool)
                elif p >= 1:
                    out = np.ones(w.shape, bool)
                else:
                    out = (w >> np.uint64(11)) < np.uint64(math.ceil(float(p) * 2.0 ** 53))
            else:
                raise ValueError(f"random: unknown kind {kind!r}")
        return np.asarray(out).astype(dtype.np, copy=False)

    @staticmethod
    def words_used(kind: str, numel: int) -> int:
        """How far a draw of `numel` elements advances the generator's offset."""
        k = 2 if kind == "normal" else 1
        return ((numel * k + 3) // 4) * 4
