"""One pass per row over the last axis: `row_layer_norm`, `row_softmax`, `row_log_softmax`,
`row_sum`; and `row_embedding_grad`, `col_sum` (a sum over leading axes).  (layer_norm's
backward needs no graph kernel: the graph's backward calls the `layer_norm_grad` op, a row
loop of the device layer, as eager does.)

The fusion pass (`fuse_elementwise.swap_row_ops`) turns a `layer_norm` over the last axis, or a
`softmax`/`log_softmax` (or a `sum`) over the last dim without a dtype change, of a float32/64
tensor into these op types (same inputs, outputs and attrs).  Each is a numba loop over rows that
reads a row, computes its statistics and writes it once, instead of the eager kernel's ~8
NumPy passes with temporaries.  Statistics are accumulated in float64, so results are within float
rounding of eager, not bitwise.  float32 exp uses a branch-free polynomial that LLVM
vectorises (the device loops' `_exp_le0`: relative error ~1e-13, far below float32's
rounding; multiply-adds contracted to FMAs); float64 uses libm's.  Compiled with numba's
on-disk cache on first use (~1 s per dtype in the first process; later processes load it).
"""

from __future__ import annotations

import math

import numpy as np

from ...device._jit import _exp_le0
from ...device._jit import layer_norm_rows as layer_norm  # the eager loop, unchanged
from .. import ir

ROW_OPS = {"layer_norm": "row_layer_norm", "softmax": "row_softmax",
           "log_softmax": "row_log_softmax", "sum": "row_sum",
           "embedding_grad": "row_embedding_grad"}

try:
    import numba

    from ...device._numba_cache import njit as _cached_njit
except ImportError:  # the fusion pass swaps nothing without numba
    numba = None


def _jit(**flags):
    def wrap(fn):
        if numba is None:
            return fn
        return _cached_njit(error_model="numpy", nogil=True, **flags)(fn)

    return wrap




@_jit(fastmath={"contract"})
def softmax32(x, log, out):
    rows, n = x.shape
    e = np.empty(n, np.float64)  # a row's exps: the loop making them vectorises
    for r in range(rows):
        m = -np.inf
        for j in range(n):
            v = np.float64(x[r, j])
            m = v if v > m or v != v else m
        if m == -np.inf:  # all -inf: eager's NaNs
            m = 0.0
        for j in range(n):
            e[j] = _exp_le0(np.float64(x[r, j]) - m)
        s = 0.0
        for j in range(n):
            s += e[j]
        if log:
            ls = np.log(s)
            for j in range(n):
                out[r, j] = np.float64(x[r, j]) - m - ls
        else:
            inv = 1.0 / s
            for j in range(n):
                out[r, j] = e[j] * inv

@_jit()
def softmax64(x, log, out):
    rows, n = x.shape
    for r in range(rows):
        m = -np.inf
        for j in range(n):
            v = x[r, j]
            m = v if v > m or v != v else m
        if m == -np.inf:
            m = 0.0
        s = 0.0
        for j in range(n):
            s += math.exp(x[r, j] - m)
        if log:
            ls = math.log(s)
            for j in range(n):
                out[r, j] = x[r, j] - m - ls
        else:
            for j in range(n):
                out[r, j] = math.exp(x[r, j] - m) / s


@_jit()
def row_sum(x, out):
    # eight float64 partial sums per row: independent adds (NumPy's reduction over a short
    # last axis pays per-row overhead; one accumulator would wait on each add's latency)
    rows, n = x.shape
    n8 = n - n % 8
    for r in range(rows):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for j in range(0, n8, 8):
            a0 += np.float64(x[r, j])
            a1 += np.float64(x[r, j + 1])
            a2 += np.float64(x[r, j + 2])
            a3 += np.float64(x[r, j + 3])
            a4 += np.float64(x[r, j + 4])
            a5 += np.float64(x[r, j + 5])
            a6 += np.float64(x[r, j + 6])
            a7 += np.float64(x[r, j + 7])
        s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
        for j in range(n8, n):
            s += np.float64(x[r, j])
        out[r] = s


@_jit()
def embedding_grad(g, idx, out):
    # rows of g added into their table rows in order: the eager kernel's accumulating
    # index_put (np.add.at) does the same adds in the same order
    out[:] = 0
    for i in range(idx.shape[0]):
        r = idx[i]
        for j in range(g.shape[1]):
            out[r, j] += g[i, j]


@_jit()
def col_sum(x, out):
    # a sum over leading axes: rows added in order into float64 column accumulators
    rows, n = x.shape
    acc = np.zeros(n)
    for r in range(rows):
        for j in range(n):
            acc[j] += np.float64(x[r, j])
    for j in range(n):
        out[j] = acc[j]


def _lead_dims(op, ndim):
    """k when `op` (a sum) reduces exactly the leading axes 0..k-1 (k < ndim), else 0."""
    dim = op.attrs.get("dim")
    if dim is None or op.attrs.get("dtype") is not None:
        return 0
    dims = sorted(d % ndim for d in dim) if ndim else []
    k = len(dims)
    return k if 0 < k < ndim and dims == list(range(k)) and len(set(dims)) == k else 0


def target(job, op):
    """The graph kernel op type `op` runs as, or None."""
    if op.op_type == "sum" and len(op.outputs) == 1:
        x = job.tensors[op.inputs[0]].meta
        if (x.dtype.name in ("float32", "float64") and x.numel > 0
                and job.tensors[op.outputs[0]].dtype is x.dtype and _lead_dims(op, x.ndim)):
            return "col_sum"
    return ROW_OPS[op.op_type] if eligible(job, op) else None


def eligible(job, op) -> bool:
    """Whether `op` may run as its row kernel in a graph."""
    if op.op_type not in ROW_OPS or len(op.outputs) != 1:
        return False
    metas = [job.tensors[t].meta for t in op.inputs]
    x = metas[0]
    if op.op_type == "embedding_grad":
        return (x.dtype.name in ("float32", "float64") and metas[1].dtype.name in
                ("int32", "int64") and op.attrs.get("padding_idx") is None
                and not op.attrs.get("scale_grad_by_freq")
                and job.tensors[op.outputs[0]].dtype is x.dtype)
    if x.dtype.name not in ("float32", "float64") or x.ndim < 1 or x.numel == 0:
        return False
    if job.tensors[op.outputs[0]].dtype is not x.dtype:
        return False
    if op.op_type == "sum":
        dim = op.attrs.get("dim")
        return (op.attrs.get("dtype") is None and dim is not None and len(dim) == 1
                and dim[0] in (-1, x.ndim - 1) and x.shape[-1] > 0)
    if op.op_type == "layer_norm":
        ns = tuple(op.attrs.get("normalized_shape") or ())
        return (len(ns) == 1 and len(metas) == 3 and ns[0] == x.shape[-1]
                and all(m.shape == ns and m.dtype is x.dtype for m in metas[1:]))
    if op.attrs.get("dtype") is not None and op.attrs["dtype"] is not x.dtype:
        return False
    return op.attrs.get("dim") in (-1, x.ndim - 1)


class _Fallback(Exception):
    pass


def _out(out, shape, dtype):
    """The planned output when it is a plain C-contiguous buffer (written through a reshaped
    view), else a fresh one."""
    if out is not None and out.flags.c_contiguous and out.shape == tuple(shape):
        return out, False
    return np.empty(shape, dtype), out is not None


def _rows(a, n):
    return np.ascontiguousarray(a).reshape(-1, n)


def resolve(node, job=None):
    kind = node.op_type
    attrs = dict(node.attrs)
    eager = None

    if kind == "row_layer_norm":
        eps = float(attrs["eps"])

        def run(x, w, b, out):
            n = out.shape[-1]
            layer_norm(_rows(x, n), np.ascontiguousarray(w), np.ascontiguousarray(b), eps,
                       out.reshape(-1, n))
    elif kind == "row_embedding_grad":
        from ...ops import registry

        eager = registry.get("embedding_grad").kernel
        n_rows = int(attrs["num_weights"])

        def run(g, idx, out):
            flat = np.ascontiguousarray(idx).reshape(-1)
            if flat.size and (flat.min() < 0 or flat.max() >= n_rows):
                raise _Fallback
            embedding_grad(_rows(g, g.shape[-1]), flat, out)
    elif kind == "col_sum":
        def run(x, out):
            k = _lead_dims(node, x.ndim)
            n = math.prod(x.shape[k:])
            col_sum(np.ascontiguousarray(x).reshape(-1, n), out.reshape(-1))
    elif kind == "row_sum":
        def run(x, out):
            row_sum(_rows(x, x.shape[-1]), out.reshape(-1))
    else:
        log = kind == "row_log_softmax"

        def run(x, out):
            n = out.shape[-1]
            f = softmax32 if x.dtype == np.float32 else softmax64
            f(_rows(x, n), log, out.reshape(-1, n))

    def kernel(ctx, *arrays, out=None, **kw):
        res, copy = _out(out, ctx.out_metas[0].shape, arrays[0].dtype)
        try:
            run(*arrays, res)
        except _Fallback:  # the eager kernel raises its own error
            return eager(ctx, *arrays, **kw)
        if copy:
            np.copyto(out, res)
            return out
        return res

    kernel.accepts_out = True
    return kernel


for _t in (*ROW_OPS.values(), "col_sum"):
    ir.KERNEL_RESOLVERS[_t] = resolve
    ir.OUT_WRITERS.add(_t)  # the kernel writes `out=`
