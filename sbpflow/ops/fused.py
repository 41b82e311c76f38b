"""OneFlow's fused functional ops: quick_gelu, square_relu, sparse_softmax_cross_entropy and
gather_nd, each one kernel (OneFlow runs them as fused CUDA kernels).

- `quick_gelu(x) = x * sigmoid(1.702 x)` and `square_relu(x) = relu(x)^2`: pointwise
  activations (registered like the others in `nn.py`).
- `sparse_softmax_cross_entropy(labels, logits)`: TensorFlow's and OneFlow's argument order.
  `logits` is `[d_0, ..., d_{r-1}, C]`, `labels` is `[d_0, ..., d_{r-1}]` (int32/int64, in
  [0, C)); the result is the per-entry loss `-log_softmax(logits)[labels]`, shaped as labels.
  Its gradient, `(softmax(logits) - one_hot(labels)) * g`, is written with ops (double
  backward works).
- `gather_nd(params, indices)`: `indices` is `[..., K]` with K <= params.ndim; the result is
  `params[indices[..., 0], ..., indices[..., K-1]]`, shaped `indices.shape[:-1] +
  params.shape[K:]`. Its gradient scatters back with `index_put(accumulate=True)`.

Bad indices or labels raise IndexError from the kernel (a data check, as torch's CPU kernels).
"""

from __future__ import annotations

import numpy as np

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from ._util import cast_array, require_float
from .index import _zeros
from .nn import _finish, _in_compute, _out_of_range, _rand, _register_activation
from .registry import OpDef, Sample, op, register

_QUICK_GELU_ALPHA = 1.702


# -- quick_gelu, square_relu -----------------------------------------------------------------
def _quick_gelu_fwd(k, x):
    return k.mul(x, k.u("sigmoid", k.mul(x, _QUICK_GELU_ALPHA)))


def _quick_gelu_grad(ctx, g):
    x = ctx.input(0)
    s = op("sigmoid", x * _QUICK_GELU_ALPHA)
    return (g * (s + (x * _QUICK_GELU_ALPHA) * (s * (1 - s))),)


_register_activation(
    "quick_gelu", _quick_gelu_fwd, _quick_gelu_grad,
    reference=lambda torch, x: x * torch.sigmoid(1.702 * x),
)


def _square_relu_fwd(k, x):
    r = k.bin("maximum", x, 0)
    return k.mul(r, r)


def _square_relu_grad(ctx, g):
    return (g * (op("relu", ctx.input(0)) * 2),)


_register_activation(
    "square_relu", _square_relu_fwd, _square_relu_grad, kinks=(0,),
    reference=lambda torch, x: torch.relu(x) ** 2,
)


# -- sparse_softmax_cross_entropy ------------------------------------------------------------
_INDEX_DTYPES = (dt.int32, dt.int64)


def _sparse_ce_meta(labels, logits):
    name = "sparse_softmax_cross_entropy"
    require_float(name, "logits", logits)
    if labels.dtype not in _INDEX_DTYPES:
        raise op_error(name, f"argument 'labels' must be an int32 or int64 tensor, got "
                       f"{labels.dtype.name}", TypeError)
    if logits.ndim == 0 or labels.shape != logits.shape[:-1]:
        raise op_error(name, f"labels must have the shape of logits without its last (class) "
                       f"axis: logits {list(logits.shape)} needs labels "
                       f"{list(logits.shape[:-1]) if logits.ndim else '(none: logits is 0-d)'}"
                       f", got {list(labels.shape)}", ValueError)
    return TensorMeta(labels.shape, logits.dtype)


def _sparse_ce_kernel(ctx, labels, logits):
    lm, xm = ctx.in_metas
    k, (x,) = _in_compute(ctx, (logits,), (xm,))
    p = ctx.prims
    c = xm.shape[-1]
    t = p.reshape(cast_array(ctx, labels, lm.dtype, dt.int64), lm.shape + (1,))
    bad = _out_of_range(ctx, t, c)
    if bad is not None:
        raise IndexError(f"sparse_softmax_cross_entropy(): label {bad} is out of bounds for "
                         f"{c} classes")
    picked = p.gather(p.log_softmax(x, xm.ndim - 1), xm.ndim - 1, t)
    return _finish(ctx, p.reshape(k.u("neg", picked), lm.shape))


def _sparse_ce_grad(ctx, g):
    if not ctx.needs_input_grad[1]:
        return None, None
    labels, logits = ctx.input(0), ctx.input(1)
    xm = ctx.in_metas[1]
    if labels.dtype is not dt.int64:
        labels = op("to_dtype", labels, dtype=dt.int64)
    target = op("to_dtype", op("one_hot", labels, num_classes=xm.shape[-1]), dtype=xm.dtype)
    return None, (op("softmax", logits, dim=-1) - target) * g.unsqueeze(-1)


def _sparse_ce_sbp(labels, logits):
    sigs = [Signature((B, B), (B,))]
    for i, n in enumerate(labels.shape):
        if n > 1:  # entries are independent: labels and logits split together
            sigs.append(Signature((Split(i), Split(i)), (Split(i),)))
    return sigs


def _sparse_ce_reference(torch, labels, logits):
    c = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c), labels.reshape(-1).long(),
                                             reduction="none")
    return loss.reshape(labels.shape)


register(OpDef(
    "sparse_softmax_cross_entropy",
    inputs=("labels", "logits"),
    infer_meta=_sparse_ce_meta,
    kernel=_sparse_ce_kernel,
    grad=_sparse_ce_grad,
    saves=("labels", "logits"),
    sbp=_sparse_ce_sbp,
    reference=_sparse_ce_reference,
    samples=lambda rng: [
        Sample(np.array([0, 2, 1, 2]), _rand(rng, 4, 3)),
        Sample(rng.integers(0, 5, (2, 3)).astype(np.int32), _rand(rng, 2, 3, 5) * 3),
        Sample(np.array(1), _rand(rng, 4)),
        Sample(np.array([3, 0, 1]), _rand(rng, 3, 4, dtype=np.float32) * 20, grad=False),
    ],
))


# -- gather_nd ----------------------------------------------------------------------------------
def _gather_nd_meta(params, indices):
    name = "gather_nd"
    if indices.dtype not in _INDEX_DTYPES:
        raise op_error(name, f"argument 'indices' must be an int32 or int64 tensor, got "
                       f"{indices.dtype.name}", TypeError)
    if indices.ndim == 0 or not 1 <= indices.shape[-1] <= params.ndim:
        raise op_error(name, f"the last axis of indices must hold 1 to params.ndim "
                       f"({params.ndim}) coordinates, got indices of shape "
                       f"{list(indices.shape)}", ValueError)
    k = indices.shape[-1]
    return TensorMeta(indices.shape[:-1] + params.shape[k:], params.dtype)


def _gather_nd_kernel(ctx, params, indices):
    pm, im = ctx.in_metas
    p = ctx.prims
    idx = cast_array(ctx, indices, im.dtype, dt.int64)
    key = []
    for k in range(im.shape[-1]):
        comp = p.slice(idx, (Ellipsis, k))
        bad = _out_of_range(ctx, comp, pm.shape[k])
        if bad is not None:
            raise IndexError(f"gather_nd(): index {bad} is out of bounds for axis {k} of "
                             f"params with size {pm.shape[k]}")
        key.append(comp)
    return p.index(params, tuple(key))


def _gather_nd_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return None, None
    indices = ctx.input(1)
    comps = [indices[..., k] for k in range(ctx.in_metas[1].shape[-1])]
    key = tuple(("tensor", k) for k in range(len(comps)))
    zeros = _zeros(ctx.in_metas[0].shape, g)
    return op("index_put", [zeros, g, *comps], key=key, accumulate=True), None


def _gather_nd_sbp(params, indices):
    k = indices.shape[-1]
    lead = indices.ndim - 1
    sigs = [Signature((B, B), (B,)),
            Signature((P, B), (P,))]  # gathering is linear in params
    for i in range(lead):
        if indices.shape[i] > 1:  # each output row reads its own index row
            sigs.append(Signature((B, Split(i)), (Split(i),)))
    for j in range(k, params.ndim):
        if params.shape[j] > 1:  # an axis not indexed keeps its split
            sigs.append(Signature((Split(j), B), (Split(lead + j - k),)))
    return sigs


def _gather_nd_reference(torch, params, indices):
    indices = indices.long()
    return params[tuple(indices[..., k] for k in range(indices.shape[-1]))]


register(OpDef(
    "gather_nd",
    inputs=("params", "indices"),
    infer_meta=_gather_nd_meta,
    kernel=_gather_nd_kernel,
    grad=_gather_nd_grad,
    saves=("indices for params",),
    sbp=_gather_nd_sbp,
    reference=_gather_nd_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3), np.array([[0, 1], [3, 2], [0, 1]])),  # repeats accumulate
        Sample(_rand(rng, 4, 3, 2), np.array([[1], [3]])),
        Sample(_rand(rng, 3, 4, 2), rng.integers(0, 3, (2, 3, 1)).astype(np.int32)),
        Sample(_rand(rng, 5), np.array([4])),
        Sample(_rand(rng, 3, 4, dtype=np.float32), np.array([[2, 3], [0, 0]]), grad=False),
    ],
))
