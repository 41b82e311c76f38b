"""Reductions and scans.

sum, mean, prod, max/min (full, and `max_dim`/`min_dim` with indices), amax/amin,
argmax/argmin, var/std, linalg_vector_norm, logsumexp, cumsum/cumprod, any/all,
count_nonzero, median (full and `median_dim`).

Conventions shared by the family:
- `dim=None` and `dim=()` both reduce every axis (torch's rule for sum, mean, amax, var, norm);
  any/all are the exception: there `dim=()` reduces nothing, as in torch.
- Half-precision inputs accumulate in float32 and round once at the end, as torch's CPU
  kernels do; integer and bool sums, products and scans accumulate in int64.
- Kernels take the reduced extent from the local piece, except mean, whose count is the
  *logical* one: a mean over a split axis then yields correct partial sums (S(i) -> P).
- Only linear reductions (sum, mean, cumsum, count_nonzero over a split axis) have P rules.
  max, prod, var, norm and friends keep B -> B and splits of kept axes only.
"""

from __future__ import annotations

import math

import numpy as np

from .._core import dtype as dt
from .._core.errors import normalize_dim, normalize_dims, op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from .registry import Attr, OpDef, Sample, get, op, register

_TORCH_TYPE = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
    "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
    "bool": "Bool",
}


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _distinct(rng, *shape):
    """Values with no ties (ties make max/median grads and indices ambiguous), spread out."""
    n = math.prod(shape)
    return (rng.permutation(n).reshape(shape) * 0.37 - n * 0.15 + rng.uniform(0, 0.1, shape))


def _ints(rng, *shape, dtype=np.int32, low=-4, high=5):
    return rng.integers(low, high, size=shape).astype(dtype)


# -- shapes and dims ------------------------------------------------------------------------
def _reduce_dims(name: str, dim, ndim: int) -> tuple[int, ...]:
    """None and () reduce every axis; otherwise normalise (wrap, check range and repeats)."""
    if dim is None or (isinstance(dim, tuple) and not dim):
        return tuple(range(ndim))
    return normalize_dims(name, dim, ndim)


def _reduced_shape(shape, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _keep_shape(shape, dims):
    return _reduced_shape(shape, dims, True)


def _int_accumulating(x: dt.DType, dtype) -> dt.DType:
    """torch: integral and bool sums, products and scans accumulate in int64."""
    if dtype is not None:
        return dtype
    return x if x.is_floating_point else dt.int64


def _acc(d: dt.DType) -> dt.DType:
    """The dtype kernels compute in: float32 for half types."""
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


def _require_nonempty(name: str, x: TensorMeta, dims) -> None:
    """max-like reductions have no identity: reducing an empty axis is an error."""
    if x.ndim == 0:
        return
    for d in dims:
        if x.shape[d] == 0:
            raise op_error(name, f"Expected reduction dim {d} to have non-zero size.", IndexError)


def _require_float(name: str, x: TensorMeta, msg: str) -> None:
    if not x.dtype.is_floating_point:
        raise op_error(name, msg.format(_TORCH_TYPE[x.dtype.name]))


# -- kernel helpers -------------------------------------------------------------------------
def _prepare(ctx, x, dims, i=0):
    """NumPy cannot reduce a 0-d array over axis 0: view it as shape (1,)."""
    if ctx.in_metas[i].ndim == 0:
        return ctx.prims.reshape(x, (1,)), (0,)
    return x, dims


def _finish(ctx, r, i=0):
    """Reshape a kernel result (fresh and contiguous) to output i's shape and cast to its dtype."""
    meta = ctx.out_metas[i]
    if tuple(r.shape) != meta.shape:
        r = ctx.prims.reshape(r, meta.shape)
    if r.dtype != meta.dtype.np:
        r = ctx.prims.cast(r, meta.dtype)
    return r


def _cast_to(ctx, x, i, want: dt.DType):
    return x if ctx.in_metas[i].dtype is want else ctx.prims.cast(x, want)


def _scalar(ctx, value, d: dt.DType):
    return ctx.prims.full((), d, value)


def _logical_count(meta: TensorMeta, dims) -> int:
    return math.prod(meta.shape[d] for d in dims) if meta.ndim else 1


# -- grad helpers ---------------------------------------------------------------------------
def _unsqueeze_reduced(g, in_shape, dims, keepdim):
    """A reduced gradient with the reduced axes restored as size 1, ready to broadcast."""
    if keepdim or not in_shape:
        return g
    return op("reshape", g, shape=_keep_shape(in_shape, dims))


def _expand_to(g, shape):
    return g if tuple(g.shape) == tuple(shape) else op("expand", g, size=tuple(shape))


def _cast(t, d: dt.DType):
    return t if t.dtype is d else op("to_dtype", t, dtype=d)


def _zeros_where_not(mask, value):
    """value where mask holds, exact zeros elsewhere (no 0 * inf = nan)."""
    return op("where_scalar", mask, value, other=0)


def _where_not(mask, value, fill):
    """value where mask does not hold, `fill` where it does."""
    return op("where_scalar", mask, value, other=fill, reverse=True)


def _is(t, value):
    return op("eq_scalar", t, other=value)


def _reverse_cumsum(t, d: int):
    """sum over i >= k of t_i along axis d (flipped twice rather than total - cumsum, which
    cancels badly)."""
    return op("flip", op("cumsum", op("flip", t, dims=(d,)), dim=d), dims=(d,))


def _iota(n: int, like):
    """0, 1, ..., n-1 as int64 on `like`'s device."""
    ones = op("full", shape=(n,), fill_value=1, dtype=dt.int64, _device=like._where())
    return op("add_scalar", op("cumsum", ones, dim=0), other=-1)


def _iota_along(n: int, ndim: int, axis: int, like):
    """0..n-1 as int64, shaped to broadcast along `axis` of an ndim-dim tensor."""
    shape = tuple(n if i == axis else 1 for i in range(ndim))
    return op("reshape", _iota(n, like), shape=shape)


def _select_grad(g, indices, x_meta: TensorMeta, dim: int, keepdim: bool):
    """Gradient of a value-selecting reduction: all of g goes to the index the forward picked."""
    if x_meta.ndim == 0:
        return _cast(g, x_meta.dtype)
    d = normalize_dim("grad", dim, x_meta.ndim)
    g = _unsqueeze_reduced(g, x_meta.shape, (d,), keepdim)
    idx = _unsqueeze_reduced(indices, x_meta.shape, (d,), keepdim)
    mask = op("eq", _iota_along(x_meta.shape[d], x_meta.ndim, d, g), idx)
    return _cast(_zeros_where_not(mask, _expand_to(g, x_meta.shape)), x_meta.dtype)


def _spread_grad(g, x, out, dims, keepdim):
    """Gradient of max/amax-like reductions: split equally among the elements equal to the
    result (torch's evenly-distributed rule for ties)."""
    shape = tuple(x.shape)
    g = _unsqueeze_reduced(g, shape, dims, keepdim)
    out = _unsqueeze_reduced(out, shape, dims, keepdim)
    mask = op("eq", x, out)
    count = _cast(op("sum", mask, dim=dims or None, keepdim=True), g.dtype) if shape else None
    share = op("div", g, count) if count is not None else g
    return _zeros_where_not(mask, _expand_to(share, shape))


# -- SBP ------------------------------------------------------------------------------------
def reduce_signatures(x: TensorMeta, dims, keepdim: bool, *, split_to_partial: bool = False,
                      partial: bool = False, n_out: int = 1) -> list[Signature]:
    """Signatures of a reduction of x over `dims`.

    A split of a kept axis survives (renumbered when the reduced axes are dropped).  A split
    of a reduced axis gives P only for sum-like reductions (`split_to_partial`), and P -> P
    holds only for reductions linear in x (`partial`).
    """
    outs = lambda s: (s,) * n_out  # noqa: E731
    sigs = [Signature((B,), outs(B))]  # B -> B: every rank reduces the whole tensor
    if partial:
        sigs.append(Signature((P,), outs(P)))  # P -> P: the reduction is linear
    kept = 0
    for i in range(x.ndim):
        if i in dims:
            if split_to_partial and x.shape[i] > 1:
                sigs.append(Signature((Split(i),), outs(P)))  # S(i) -> P: partial sums
            continue
        if x.shape[i] > 1:
            # S(i) -> S(i'): rows of a kept axis reduce independently
            sigs.append(Signature((Split(i),), outs(Split(i if keepdim else kept))))
        kept += 1
    return sigs


def _partial_passes(src: dt.DType, out: dt.DType) -> bool:
    """Whether a linear reduction maps P -> P for these input and output dtypes.

    Integers: only without widening, since the pieces of a P tensor sum to its value modulo
    the input's width (uint8 pieces wrap) while a widened sum does not wrap.  Floats: float32
    and float64 only; a float -> int cast truncates each piece, and half-precision pieces each
    carry a rounding error that the reduction adds up.
    """
    if src.is_floating_point or out.is_floating_point:
        wide = (dt.float32, dt.float64)
        return src in wide and out in wide
    return src is out


# -- sum ------------------------------------------------------------------------------------
def _sum_meta(x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("sum", dim, x.ndim)
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), _int_accumulating(x.dtype, dtype))


def _sum_kernel(ctx, x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("sum", dim, ctx.in_metas[0].ndim)
    x = _cast_to(ctx, x, 0, _acc(ctx.out_metas[0].dtype))
    x, dims = _prepare(ctx, x, dims)
    return _finish(ctx, ctx.prims.reduce("sum", x, dims, keepdim))


def _sum_direct(ctx, attrs):
    """specialize: one reduction call where x needs no cast and is not 0-d."""
    x, out = ctx.in_metas[0], ctx.out_metas[0]
    if not x.ndim or x.dtype is not out.dtype or _acc(out.dtype) is not out.dtype:
        return None
    return ctx.prims.direct_reduce("sum", _reduce_dims("sum", attrs["dim"], x.ndim),
                                   attrs["keepdim"])


def _broadcast_back_grad(ctx, g):
    """Gradient of sum: the reduced gradient broadcast back over the reduced axes."""
    x = ctx.in_metas[0]
    dims = _reduce_dims("sum", ctx.attrs["dim"], x.ndim)
    g = _unsqueeze_reduced(g, x.shape, dims, ctx.attrs["keepdim"])
    return (_cast(_expand_to(g, x.shape), x.dtype),)


def _sum_sbp(x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("sum", dim, x.ndim)
    out = _int_accumulating(x.dtype, dtype)
    return reduce_signatures(x, dims, keepdim, split_to_partial=True,
                             partial=_partial_passes(x.dtype, out))


_SUM_ATTRS = {"dim": Attr("ints", None), "keepdim": Attr("bool", False),
              "dtype": Attr("dtype", None)}

register(OpDef(
    "sum",
    inputs=("input",),
    attrs=_SUM_ATTRS,
    infer_meta=_sum_meta,
    kernel=_sum_kernel,
    specialize=_sum_direct,
    saves=(),
    grad=_broadcast_back_grad,
    sbp=_sum_sbp,
    reference="sum",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3)),
        Sample(_rand(rng, 2, 3, 4), dim=1),
        Sample(_rand(rng, 2, 3, 4), dim=(0, 2), keepdim=True),
        Sample(_rand(rng, 5, 3), dim=-1),
        Sample(_rand(rng, 3, 4), dim=()),
        Sample(_rand(rng), dim=0),
        Sample(_rand(rng, 4, 1, 3), dim=(-1, 1), keepdim=False),
        Sample(_rand(rng, 3, 4, dtype=np.float32), dim=0, dtype=dt.float64),
        Sample(_rand(rng, 6, 5, dtype=np.float16), dim=1, grad=False),
        Sample(_ints(rng, 4, 3), dim=0, grad=False),
        Sample(_ints(rng, 4, 3, dtype=np.int64), dim=1, grad=False),
        Sample(_ints(rng, 4, 3) > 0, dim=1, keepdim=True, grad=False),
        Sample(_ints(rng, 4, 3, dtype=np.uint8, low=0), grad=False),
    ],
))


# -- mean -----------------------------------------------------------------------------------
def _mean_dtype(x: TensorMeta, dtype) -> dt.DType:
    out = x.dtype if dtype is None else dtype
    if not out.is_floating_point:
        which = "Input" if dtype is None else "Optional"
        raise op_error("mean", f"could not infer output dtype. {which} dtype must be either a "
                       f"floating point or complex dtype. Got: {_TORCH_TYPE[out.name]}")
    return out


def _mean_meta(x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("mean", dim, x.ndim)
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), _mean_dtype(x, dtype))


def _mean_kernel(ctx, x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("mean", dim, ctx.in_metas[0].ndim)
    acc = _acc(ctx.out_metas[0].dtype)
    # The logical count, not the piece's: each piece of a split axis contributes sum/N.
    count = _logical_count(ctx.logical_in[0], dims)
    x = _cast_to(ctx, x, 0, acc)
    x, dims = _prepare(ctx, x, dims)
    total = ctx.prims.reduce("sum", x, dims, keepdim)
    return _finish(ctx, ctx.prims.binary("div", total, _scalar(ctx, count, acc)))


def _mean_grad(ctx, g):
    x = ctx.in_metas[0]
    dims = _reduce_dims("mean", ctx.attrs["dim"], x.ndim)
    g = op("mul_scalar", g, other=1.0 / max(_logical_count(x, dims), 1))
    g = _unsqueeze_reduced(g, x.shape, dims, ctx.attrs["keepdim"])
    return (_cast(_expand_to(g, x.shape), x.dtype),)


def _mean_sbp(x, dim=None, keepdim=False, dtype=None):
    dims = _reduce_dims("mean", dim, x.ndim)
    return reduce_signatures(x, dims, keepdim, split_to_partial=True,
                             partial=_partial_passes(x.dtype, _mean_dtype(x, dtype)))


register(OpDef(
    "mean",
    inputs=("input",),
    attrs=_SUM_ATTRS,
    infer_meta=_mean_meta,
    kernel=_mean_kernel,
    saves=(),
    grad=_mean_grad,
    sbp=_mean_sbp,
    reference="mean",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3)),
        Sample(_rand(rng, 5, 3, 4), dim=0),
        Sample(_rand(rng, 2, 5, 4), dim=(0, -1), keepdim=True),
        Sample(_rand(rng, 3, 5), dim=-1),
        Sample(_rand(rng), dim=()),
        Sample(_rand(rng, 4, 3, dtype=np.float32), dim=1),
        Sample(_rand(rng, 4, 3, dtype=np.float16), grad=False),
        Sample(_ints(rng, 5, 3), dim=0, dtype=dt.float64, grad=False),
    ],
))


# -- prod -----------------------------------------------------------------------------------
def _prod_dims(x: TensorMeta, dim):
    if dim is None:
        return tuple(range(x.ndim))
    d = normalize_dim("prod", dim, x.ndim)
    return (d,) if x.ndim else ()


def _prod_meta(x, dim=None, keepdim=False, dtype=None):
    dims = _prod_dims(x, dim)
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), _int_accumulating(x.dtype, dtype))


def _prod_kernel(ctx, x, dim=None, keepdim=False, dtype=None):
    dims = _prod_dims(ctx.in_metas[0], dim)
    x = _cast_to(ctx, x, 0, _acc(ctx.out_metas[0].dtype))
    x, dims = _prepare(ctx, x, dims)
    return _finish(ctx, ctx.prims.reduce("prod", x, dims, keepdim))


def _prod_grad(ctx, g):
    """d prod / d x_k = the product of the other elements, exact with zeros in the input.

    Per slice, with p the product of its non-zero elements and w the sum of its zero-valued
    elements (worth 0, but carrying their derivatives, so that the second derivative is
    exact too):
      no zero:   p / x_k
      one zero:  p at the zero; p * w / x_k elsewhere
      two zeros: p * (w - x_k) at each zero (the other zero's value); 0 elsewhere
      more:      0
    """
    xm = ctx.in_metas[0]
    x = _cast(ctx.input(0), ctx.out_metas[0].dtype)
    dims = _prod_dims(xm, ctx.attrs["dim"])
    g = _unsqueeze_reduced(g, xm.shape, dims, ctx.attrs["keepdim"])
    if not dims:
        return (_cast(_expand_to(g, xm.shape), xm.dtype),)
    zero = _is(x, 0)
    safe = _where_not(zero, x, 1)
    if ctx.attrs["dim"] is None:
        p = op("reshape", op("prod", safe), shape=(1,) * xm.ndim)
    else:
        p = op("prod", safe, dim=dims[0], keepdim=True)
    n_zeros = op("sum", zero, dim=dims, keepdim=True)
    w = op("sum", _zeros_where_not(zero, x), dim=dims, keepdim=True)
    p_over_x = op("div", p, safe)
    at_nonzero = op("where", _is(n_zeros, 0), p_over_x,
                    _zeros_where_not(_is(n_zeros, 1), op("mul", p_over_x, w)))
    at_zero = op("where", _is(n_zeros, 1), _expand_to(p, xm.shape),
                 _zeros_where_not(_is(n_zeros, 2), op("mul", p, op("sub", w, x))))
    return (_cast(op("mul", op("where", zero, at_zero, at_nonzero), g), xm.dtype),)


def _prod_sbp(x, dim=None, keepdim=False, dtype=None):
    dims = _prod_dims(x, dim)
    return reduce_signatures(x, dims, keepdim)


def _prod_reference(torch, x, dim=None, keepdim=False, dtype=None):
    if dim is None:
        return torch.prod(x, dtype=dtype)
    return torch.prod(x, dim, keepdim, dtype=dtype)


register(OpDef(
    "prod",
    inputs=("input",),
    attrs={"dim": Attr("int", None), "keepdim": Attr("bool", False),
           "dtype": Attr("dtype", None)},
    infer_meta=_prod_meta,
    kernel=_prod_kernel,
    saves=("input",),
    grad=_prod_grad,
    sbp=_prod_sbp,
    reference=_prod_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3)),
        Sample(_rand(rng, 3, 4, 2), dim=1),
        Sample(_rand(rng, 3, 4), dim=-1, keepdim=True),
        Sample(np.array([[1.5, 0.0, -2.0], [0.0, 0.0, 3.0], [0.5, 2.0, -1.0]]), dim=1),
        Sample(np.array([[1.5, 0.0, -2.0], [0.7, 1.3, 3.0]])),
        Sample(np.array([[0.0, 0.0], [0.0, 2.0]])),
        Sample(_rand(rng), dim=0),
        Sample(_rand(rng, 4, 3, dtype=np.float32), dim=0, dtype=dt.float64),
        Sample(_ints(rng, 4, 3), dim=0, grad=False),
        Sample(_ints(rng, 2, 3) > -2, grad=False),
    ],
))


# -- max / min (full reduction) -------------------------------------------------------------
def _full_extreme_meta(name):
    def meta(x):
        if x.numel == 0:
            raise op_error(name, "Expected reduction dim to be specified for input.numel() == 0."
                           " Specify the reduction dim with the 'dim' argument.")
        return TensorMeta((), x.dtype)

    return meta


def _full_extreme_kernel(kind):
    def kernel(ctx, x):
        x, dims = _prepare(ctx, x, tuple(range(ctx.in_metas[0].ndim)))
        return _finish(ctx, ctx.prims.reduce(kind, x, dims, False))

    return kernel


def _full_extreme_grad(ctx, g):
    x = ctx.input(0)
    return (_spread_grad(g, x, ctx.output(0), tuple(range(x.ndim)), False),)


def _extreme_samples(rng):
    return [
        Sample(_distinct(rng, 3, 4)),
        Sample(_distinct(rng, 5)),
        # Ties share the gradient; float32 because finite differences fail at the kink.
        Sample(np.array([[1.0, 3.0, 3.0], [3.0, -1.0, 2.0]], dtype=np.float32)),
        Sample(_distinct(rng, 4, 3).astype(np.float32)),
        Sample(_ints(rng, 3, 4), grad=False),
        Sample(_ints(rng, 3) > 0, grad=False),
    ]


for _kind in ("max", "min"):
    register(OpDef(
        _kind,
        inputs=("input",),
        infer_meta=_full_extreme_meta(_kind),
        kernel=_full_extreme_kernel(_kind),
        grad=_full_extreme_grad,
        saves=("input", "out"),
        sbp=lambda x: [Signature((B,), (B,))],  # B -> B only: a max of pieces is not a sum
        reference=_kind,
        samples=_extreme_samples,
    ))


# -- max / min over one dim: (values, indices) ----------------------------------------------
def _dim_extreme_meta(name):
    def meta(x, dim, keepdim=False):
        d = normalize_dim(name, dim, x.ndim)
        dims = (d,) if x.ndim else ()
        _require_nonempty(name, x, dims)
        shape = _reduced_shape(x.shape, dims, keepdim)
        return TensorMeta(shape, x.dtype), TensorMeta(shape, dt.int64)

    return meta


def _dim_extreme_kernel(kind, arg_kind):
    def kernel(ctx, x, dim, keepdim=False):
        xm = ctx.in_metas[0]
        dims = (normalize_dim(kind, dim, xm.ndim),) if xm.ndim else ()
        x, dims = _prepare(ctx, x, dims)
        values = ctx.prims.reduce(kind, x, dims, keepdim)
        # NumPy's argmax/argmin pick the first occurrence (and the first NaN), like torch.
        indices = ctx.prims.reduce(arg_kind, x, dims, keepdim)
        return _finish(ctx, values, 0), _finish(ctx, indices, 1)

    return kernel


def _dim_extreme_grad(ctx, g_values, g_indices=None):
    xm = ctx.in_metas[0]
    return (_select_grad(g_values, ctx.output(1), xm, ctx.attrs["dim"], ctx.attrs["keepdim"]),)


def _dim_extreme_sbp(x, dim, keepdim=False):
    dims = (normalize_dim("max", dim, x.ndim),) if x.ndim else ()
    return reduce_signatures(x, dims, keepdim, n_out=2)


def _dim_extreme_samples(rng):
    return [
        Sample(_distinct(rng, 3, 4), dim=1),
        Sample(_distinct(rng, 3, 4, 2), dim=0, keepdim=True),
        Sample(_distinct(rng, 2, 5), dim=-1),
        # The first occurrence wins (float32: finite differences fail at ties).
        Sample(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, -1.0]], dtype=np.float32), dim=1),
        Sample(_rand(rng), dim=0),
        Sample(_distinct(rng, 4, 3).astype(np.float32), dim=0),
        Sample(_ints(rng, 3, 4), dim=1, grad=False),
        Sample(_ints(rng, 3, 4) > 0, dim=0, grad=False),
        Sample(np.array([[1.0, np.nan, 2.0], [0.5, 3.0, 1.0]]), dim=1, grad=False),
    ]


for _kind in ("max", "min"):
    register(OpDef(
        f"{_kind}_dim",
        inputs=("input",),
        outputs=("values", "indices"),
        attrs={"dim": Attr("int"), "keepdim": Attr("bool", False)},
        infer_meta=_dim_extreme_meta(_kind),
        kernel=_dim_extreme_kernel(_kind, "arg" + _kind),
        grad=_dim_extreme_grad,
        saves=("indices",),
        sbp=_dim_extreme_sbp,
        reference=(lambda kind: lambda torch, x, dim, keepdim=False: getattr(torch, kind)(
            x, dim, keepdim))(_kind),
        samples=_dim_extreme_samples,
    ))


# -- amax / amin ----------------------------------------------------------------------------
def _amax_meta(name):
    def meta(x, dim=(), keepdim=False):
        dims = _reduce_dims(name, dim, x.ndim)
        if x.numel == 0:
            given = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
            if not given:
                raise op_error(name, "Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
            for d in given:  # torch names the dim as given, -1 say
                if x.shape[d % x.ndim] == 0:
                    raise op_error(name, f"Expected reduction dim {d} to have non-zero size.",
                                   IndexError)
        return TensorMeta(_reduced_shape(x.shape, dims, keepdim), x.dtype)

    return meta


def _amax_kernel(kind):
    def kernel(ctx, x, dim=(), keepdim=False):
        dims = _reduce_dims(kind, dim, ctx.in_metas[0].ndim)
        x, dims = _prepare(ctx, x, dims)
        return _finish(ctx, ctx.prims.reduce(kind, x, dims, keepdim))

    return kernel


def _amax_grad(ctx, g):
    x = ctx.input(0)
    dims = _reduce_dims("amax", ctx.attrs["dim"], x.ndim)
    return (_spread_grad(g, x, ctx.output(0), dims, ctx.attrs["keepdim"]),)


def _amax_sbp(x, dim=(), keepdim=False):
    return reduce_signatures(x, _reduce_dims("amax", dim, x.ndim), keepdim)


def _amax_samples(rng):
    return [
        Sample(_distinct(rng, 3, 4)),
        Sample(_distinct(rng, 3, 4, 2), dim=(0, 2)),
        Sample(_distinct(rng, 2, 5), dim=-1, keepdim=True),
        # Ties share equally (float32: finite differences fail at ties).
        Sample(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype=np.float32), dim=1),
        Sample(np.array([[1.0, 3.0], [3.0, -2.0]], dtype=np.float32)),
        Sample(_rand(rng), dim=()),
        Sample(_distinct(rng, 4, 3).astype(np.float32), dim=0),
        Sample(_ints(rng, 3, 4), dim=1, grad=False),
        Sample(_ints(rng, 3, 4) > 0, dim=0, grad=False),
    ]


for _kind in ("amax", "amin"):
    register(OpDef(
        _kind,
        inputs=("input",),
        attrs={"dim": Attr("ints", ()), "keepdim": Attr("bool", False)},
        infer_meta=_amax_meta(_kind),
        kernel=_amax_kernel(_kind[1:]),
        saves=("input", "out"),
        grad=_amax_grad,
        sbp=_amax_sbp,
        reference=_kind,
        samples=_amax_samples,
    ))


# -- argmax / argmin ------------------------------------------------------------------------
def _arg_meta(name):
    def meta(x, dim=None, keepdim=False):
        if x.dtype is dt.bool_:
            raise op_error(name, "does not support bool input")
        if dim is None:
            if x.numel == 0:
                raise op_error(name, "Expected reduction dim to be specified for "
                               "input.numel() == 0.", IndexError)
            return TensorMeta((1,) * x.ndim if keepdim else (), dt.int64)
        d = normalize_dim(name, dim, x.ndim)
        dims = (d,) if x.ndim else ()
        _require_nonempty(name, x, dims)
        return TensorMeta(_reduced_shape(x.shape, dims, keepdim), dt.int64)

    return meta


def _arg_kernel(kind):
    def kernel(ctx, x, dim=None, keepdim=False):
        xm = ctx.in_metas[0]
        if dim is None or xm.ndim == 0:
            # The index into the flattened tensor (a reshape needs contiguous memory).
            flat = ctx.prims.reshape(ctx.prims.contiguous(x), (xm.numel,))
            return _finish(ctx, ctx.prims.reduce(kind, flat, (0,), False))
        d = normalize_dim(kind, dim, xm.ndim)
        return _finish(ctx, ctx.prims.reduce(kind, x, (d,), keepdim))

    return kernel


def _arg_sbp(x, dim=None, keepdim=False):
    if dim is None:
        return [Signature((B,), (B,))]  # B -> B only: a flat index needs the whole tensor
    dims = (normalize_dim("argmax", dim, x.ndim),) if x.ndim else ()
    return reduce_signatures(x, dims, keepdim)


def _arg_samples(rng):
    return [
        Sample(_distinct(rng, 3, 4), grad=False),
        Sample(_distinct(rng, 3, 4), keepdim=True, grad=False),
        Sample(_distinct(rng, 3, 4, 2), dim=1, grad=False),
        Sample(_distinct(rng, 3, 4), dim=-1, keepdim=True, grad=False),
        Sample(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, -1.0]]), dim=1, grad=False),
        Sample(_rand(rng), dim=0, grad=False),
        Sample(_ints(rng, 3, 5), dim=0, grad=False),
        Sample(_distinct(rng, 4, 3).astype(np.float32), dim=1, grad=False),
    ]


for _kind in ("argmax", "argmin"):
    register(OpDef(
        _kind,
        inputs=("input",),
        attrs={"dim": Attr("int", None), "keepdim": Attr("bool", False)},
        infer_meta=_arg_meta(_kind),
        kernel=_arg_kernel(_kind),
        sbp=_arg_sbp,
        reference=_kind,
        samples=_arg_samples,
    ))


# -- var / std ------------------------------------------------------------------------------
def _var_meta(name):
    def meta(x, dim=None, correction=1.0, keepdim=False):
        _require_float(name, x, "std and var only support floating point and complex dtypes")
        dims = _reduce_dims(name, dim, x.ndim)
        return TensorMeta(_reduced_shape(x.shape, dims, keepdim), x.dtype)

    return meta


def _var_kernel(take_sqrt):
    def kernel(ctx, x, dim=None, correction=1.0, keepdim=False):
        xm = ctx.in_metas[0]
        dims = _reduce_dims("var", dim, xm.ndim)
        acc = _acc(xm.dtype)
        count = _logical_count(xm, dims)
        x = _cast_to(ctx, x, 0, acc)
        x, dims = _prepare(ctx, x, dims)
        p = ctx.prims
        mean = p.binary("div", p.reduce("sum", x, dims, True), _scalar(ctx, count, acc))
        dev = p.binary("sub", x, mean)
        sq = p.reduce("sum", p.binary("mul", dev, dev), dims, keepdim)
        # torch divides by max(N - correction, 0): 0/0 = nan and x/0 = inf, not an error.
        r = p.binary("div", sq, _scalar(ctx, max(count - correction, 0), acc))
        return _finish(ctx, p.unary("sqrt", r) if take_sqrt else r)

    return kernel


def _var_grad_common(ctx, g_scaled):
    """d var / d x = 2 (x - mean) / (N - correction), times the reduced gradient."""
    x = ctx.input(0)
    xm = ctx.in_metas[0]
    dims = _reduce_dims("var", ctx.attrs["dim"], xm.ndim)
    g = _unsqueeze_reduced(g_scaled, xm.shape, dims, ctx.attrs["keepdim"])
    centred = op("sub", x, op("mean", x, dim=dims, keepdim=True))
    denom = max(_logical_count(xm, dims) - ctx.attrs["correction"], 0)
    return (op("mul", op("mul_scalar", centred, other=2.0 / denom if denom else math.inf), g),)


def _var_grad(ctx, g):
    return _var_grad_common(ctx, g)


def _std_grad(ctx, g):
    # std = sqrt(var): d std = d var / (2 std)
    return _var_grad_common(ctx, op("div", g, op("mul_scalar", ctx.output(0), other=2.0)))


def _var_sbp(x, dim=None, correction=1.0, keepdim=False):
    return reduce_signatures(x, _reduce_dims("var", dim, x.ndim), keepdim)


def _var_samples(rng):
    return [
        Sample(_rand(rng, 3, 4)),
        Sample(_rand(rng, 3, 4, 2), dim=1),
        Sample(_rand(rng, 3, 5), dim=(0, 1), keepdim=True),
        Sample(_rand(rng, 4, 3), dim=-1, correction=0),
        Sample(_rand(rng, 6, 2), dim=0, correction=2.5),
        Sample(_rand(rng, 5, 3, dtype=np.float32), dim=0),
        Sample(_rand(rng, 4, 3, dtype=np.float16), dim=1, grad=False),
    ]


for _kind in ("var", "std"):
    register(OpDef(
        _kind,
        inputs=("input",),
        attrs={"dim": Attr("ints", None), "correction": Attr("float", 1.0),
               "keepdim": Attr("bool", False)},
        infer_meta=_var_meta(_kind),
        kernel=_var_kernel(_kind == "std"),
        saves=("input", "out") if _kind == "std" else ("input",),
        grad=_std_grad if _kind == "std" else _var_grad,
        sbp=_var_sbp,
        reference=_kind,
        samples=_var_samples,
    ))


# -- linalg_vector_norm ---------------------------------------------------------------------
def _norm_meta(x, ord=2.0, dim=None, keepdim=False, dtype=None):
    name = "linalg.vector_norm"
    if not x.dtype.is_floating_point:
        raise op_error(name, "Expected a floating point or complex tensor as input. Got "
                       f"{_TORCH_TYPE[x.dtype.name]}")
    if dtype is not None and not dtype.is_floating_point:
        raise op_error(name, f"dtype should be floating point or complex, but got "
                       f"{_TORCH_TYPE[dtype.name]}")
    dims = _reduce_dims(name, dim, x.ndim)
    if ord in (math.inf, -math.inf) and any(x.shape[d] == 0 for d in dims):
        sign = "-" if ord < 0 else ""
        given = () if dim is None else (dim,) if isinstance(dim, int) else tuple(dim)
        if not given:
            raise op_error(name, f"cannot compute the {sign}inf norm on an empty tensor "
                           "because the operation does not have an identity")
        empty = next(d for d in given if x.shape[d % x.ndim] == 0)  # as given, as torch
        raise op_error(name, f"cannot compute the {sign}inf norm on the dimension {empty} "
                       "because this dimension is empty and the operation does not have an "
                       "identity")
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), dtype or x.dtype)


def _norm_kernel(ctx, x, ord=2.0, dim=None, keepdim=False, dtype=None):
    p = ctx.prims
    dims = _reduce_dims("norm", dim, ctx.in_metas[0].ndim)
    acc = _acc(ctx.out_metas[0].dtype)
    x = _cast_to(ctx, x, 0, acc)
    x, dims = _prepare(ctx, x, dims)
    if ord == 2:
        r = p.unary("sqrt", p.reduce("sum", p.binary("mul", x, x), dims, keepdim))
    elif ord == 0:
        nonzero = p.binary("ne", x, _scalar(ctx, 0, acc))
        r = p.reduce("sum", p.cast(nonzero, acc), dims, keepdim)
    else:
        a = p.unary("abs", x)
        if ord == 1:
            r = p.reduce("sum", a, dims, keepdim)
        elif ord == math.inf:
            r = p.reduce("max", a, dims, keepdim)
        elif ord == -math.inf:
            r = p.reduce("min", a, dims, keepdim)
        else:
            powered = p.binary("pow", a, _scalar(ctx, ord, acc))
            r = p.binary("pow", p.reduce("sum", powered, dims, keepdim),
                         _scalar(ctx, 1.0 / ord, acc))
    return _finish(ctx, r)


def _norm_grad(ctx, g):
    """torch's norm_backward, per order; slices whose norm is 0 get a zero gradient."""
    xm = ctx.in_metas[0]
    out_dtype = ctx.out_metas[0].dtype
    ord_, keepdim = float(ctx.attrs["ord"]), ctx.attrs["keepdim"]
    dims = _reduce_dims("norm", ctx.attrs["dim"], xm.ndim)
    if ord_ == 0:
        return (op("full", shape=xm.shape, fill_value=0.0, dtype=xm.dtype, _device=g._where()),)
    x = _cast(ctx.input(0), out_dtype)
    g = _unsqueeze_reduced(g, xm.shape, dims, keepdim)
    if ord_ == 1:
        return (_cast(op("mul", op("sign", x), g), xm.dtype),)
    norm = _unsqueeze_reduced(ctx.output(0), xm.shape, dims, keepdim)
    if ord_ in (math.inf, -math.inf):
        grad = op("mul", op("sign", x), _spread_grad(g, op("abs", x), norm, dims, True))
        return (_cast(grad, xm.dtype),)
    nonzero = op("ne_scalar", norm, other=0)
    # Slices with a zero norm divide by 1 instead (their gradient is zeroed below anyway).
    safe_norm = op("where_scalar", nonzero, norm, other=1)
    if ord_ == 2:
        scale = _zeros_where_not(nonzero, op("div", g, safe_norm))
        return (_cast(op("mul", x, scale), xm.dtype),)
    a = op("abs", x)
    if ord_ < 1:
        # |x|^(p-1) blows up at 0, where the true one-sided gradient is taken as 0.
        scaled = op("mul", op("sign", x), _zeros_where_not(
            op("ne_scalar", x, other=0), a ** (ord_ - 1)))
        grad = op("mul", scaled, op("mul", g, norm ** (1 - ord_)))
        return (_cast(grad, xm.dtype),)
    if ord_ < 2:
        scaled = op("mul", op("sign", x), a ** (ord_ - 1))
    else:
        scaled = op("mul", x, a ** (ord_ - 2))
    scale = _zeros_where_not(nonzero, op("div", g, safe_norm ** (ord_ - 1)))
    return (_cast(op("mul", scaled, scale), xm.dtype),)


def _norm_sbp(x, ord=2.0, dim=None, keepdim=False, dtype=None):
    return reduce_signatures(x, _reduce_dims("norm", dim, x.ndim), keepdim)


register(OpDef(
    "linalg_vector_norm",
    inputs=("input",),
    attrs={"ord": Attr("float", 2.0), "dim": Attr("ints", None), "keepdim": Attr("bool", False),
           "dtype": Attr("dtype", None)},
    infer_meta=_norm_meta,
    kernel=_norm_kernel,
    saves=("input", "out"),
    grad=_norm_grad,
    sbp=_norm_sbp,
    reference="linalg.vector_norm",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4)),
        Sample(_rand(rng, 3, 4, 2), dim=1),
        Sample(_rand(rng, 3, 4), ord=1, dim=-1, keepdim=True),
        Sample(_distinct(rng, 3, 4), ord=math.inf, dim=(0, 1)),
        Sample(_distinct(rng, 3, 4), ord=-math.inf, dim=0),
        Sample(_rand(rng, 3, 4), ord=0, dim=1),
        Sample(_rand(rng, 3, 4), ord=3.0),
        Sample(_rand(rng, 4, 3), ord=1.5, dim=0),
        Sample(_rand(rng, 4, 3), ord=0.5, dim=1),
        Sample(_rand(rng, 2, 3), ord=-2.0, dim=1),
        Sample(np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]]), dim=1),
        Sample(_rand(rng, 3, 4, dtype=np.float32), dim=1, dtype=dt.float64),
        Sample(_rand(rng, 3, 4, dtype=np.float16), grad=False),
        Sample(_rand(rng), dim=0),
    ],
))


# -- logsumexp ------------------------------------------------------------------------------
def _logsumexp_meta(x, dim, keepdim=False):
    dims = _reduce_dims("logsumexp", dim, x.ndim)
    out = x.dtype if x.dtype.is_floating_point else dt.get_default_dtype()
    return TensorMeta(_reduced_shape(x.shape, dims, keepdim), out)


def _logsumexp_kernel(ctx, x, dim, keepdim=False):
    p = ctx.prims
    xm = ctx.in_metas[0]
    dims = _reduce_dims("logsumexp", dim, xm.ndim)
    acc = _acc(ctx.out_metas[0].dtype)
    x = _cast_to(ctx, x, 0, acc)
    x, dims = _prepare(ctx, x, dims)
    if any(x.shape[d] == 0 for d in dims):  # an empty sum of exponentials: log 0
        return _finish(ctx, p.full(ctx.out_metas[0].shape, acc, -math.inf))
    # Shift by the max so exp cannot overflow; a non-finite max (all -inf, or an inf) shifts
    # by 0 instead, which keeps -inf and inf results and avoids inf - inf.
    m = p.reduce("max", x, dims, True)
    m = p.where(p.unary("isfinite", m), m, _scalar(ctx, 0, acc))
    s = p.reduce("sum", p.unary("exp", p.binary("sub", x, m)), dims, True)
    return _finish(ctx, p.binary("add", p.unary("log", s), m))


def _logsumexp_grad(ctx, g):
    xm = ctx.in_metas[0]
    dims = _reduce_dims("logsumexp", ctx.attrs["dim"], xm.ndim)
    g = _unsqueeze_reduced(g, xm.shape, dims, ctx.attrs["keepdim"])
    out = _unsqueeze_reduced(ctx.output(0), xm.shape, dims, ctx.attrs["keepdim"])
    return (_cast(op("mul", g, op("exp", op("sub", ctx.input(0), out))), xm.dtype),)


register(OpDef(
    "logsumexp",
    inputs=("input",),
    attrs={"dim": Attr("ints"), "keepdim": Attr("bool", False)},
    infer_meta=_logsumexp_meta,
    kernel=_logsumexp_kernel,
    saves=("input", "out"),
    grad=_logsumexp_grad,
    sbp=lambda x, dim, keepdim=False: reduce_signatures(
        x, _reduce_dims("logsumexp", dim, x.ndim), keepdim),
    reference="logsumexp",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), dim=1),
        Sample(_rand(rng, 3, 4, 2) * 50, dim=(0, 2)),
        Sample(_rand(rng, 3, 4) + 800, dim=-1, keepdim=True),  # needs the max shift
        Sample(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]), dim=1, grad=False),
        Sample(_rand(rng), dim=0),
        Sample(_rand(rng, 5, 3, dtype=np.float32), dim=0),
        Sample(_rand(rng, 4, 3, dtype=np.float16), dim=1, grad=False),
        Sample(_ints(rng, 3, 4), dim=1, grad=False),
    ],
))


# -- cumsum / cumprod -----------------------------------------------------------------------
def _scan_meta(name):
    def meta(x, dim, dtype=None):
        normalize_dim(name, dim, x.ndim)
        return TensorMeta(x.shape, _int_accumulating(x.dtype, dtype))

    return meta


def _scan_kernel(kind):
    def kernel(ctx, x, dim, dtype=None):
        xm = ctx.in_metas[0]
        x = _cast_to(ctx, x, 0, _acc(ctx.out_metas[0].dtype))
        x, (d,) = _prepare(ctx, x, (normalize_dim(kind, dim, xm.ndim),))
        return _finish(ctx, ctx.prims.scan(kind, x, d))

    return kernel


def _cumsum_grad(ctx, g):
    xm = ctx.in_metas[0]
    if xm.ndim == 0:
        return (_cast(g, xm.dtype),)
    d = normalize_dim("cumsum", ctx.attrs["dim"], xm.ndim)
    return (_cast(_reverse_cumsum(g, d), xm.dtype),)


def _cumprod_vjp(x, g, d, out=None):
    """sum_{i >= k} g_i * prod_{j <= i, j != k} x_j along axis d, exact with zeros.

    Returns (value, first-zero mask, mask of the slots after the first zero).  Before the
    first zero z of a line, sum_{i>=k} g_i out_i / x_k is exact; at z the gradient is
    prod_{j<z} x_j * sum_{i>=z} g_i prod_{z<j<=i} x_j; after z the value is 0.
    """
    out = op("cumprod", x, dim=d) if out is None else out
    zero = _is(x, 0)
    zeros_so_far = op("cumsum", zero, dim=d)
    before_zero = _is(zeros_so_far, 0)
    at_first_zero = op("logical_and", zero, _is(zeros_so_far, 1))
    safe = _where_not(zero, x, 1)
    before = op("div", _reverse_cumsum(op("mul", g, out), d), safe)
    # Products restarted after the first zero (everything up to it replaced by 1).
    after = op("cumprod", _where_not(op("logical_or", before_zero, at_first_zero), x, 1), dim=d)
    prefix = op("cumprod", safe, dim=d)  # at the first zero: prod_{j<z} x_j
    at_zero = op("mul", prefix, _reverse_cumsum(op("mul", g, after), d))
    value = op("where", before_zero, before, _zeros_where_not(at_first_zero, at_zero))
    past_zero = op("logical_not", op("logical_or", before_zero, at_first_zero))
    return value, at_first_zero, past_zero


def _cumprod_grad(ctx, g):
    """The vjp of cumprod, exact to second order with zeros.

    Past the first zero z the gradient is x_z * (the vjp with x_z replaced by 1): worth 0,
    but its derivative with respect to x_z is right, which double backward needs.
    """
    xm = ctx.in_metas[0]
    if xm.ndim == 0:
        return (_cast(g, xm.dtype),)
    d = normalize_dim("cumprod", ctx.attrs["dim"], xm.ndim)
    x = _cast(ctx.input(0), ctx.out_metas[0].dtype)
    value, at_first_zero, past_zero = _cumprod_vjp(x, g, d, ctx.output(0))
    first_zero = op("sum", _zeros_where_not(at_first_zero, x), dim=d, keepdim=True)
    rest, _, _ = _cumprod_vjp(_where_not(at_first_zero, x, 1), g, d)
    grad = op("where", past_zero, op("mul", first_zero, rest), value)
    return (_cast(grad, xm.dtype),)


def _scan_sbp(linear):
    def sbp(x, dim, dtype=None):
        d = normalize_dim("cumsum", dim, x.ndim) if x.ndim else 0
        sigs = [Signature((B,), (B,))]  # B -> B
        if linear and _partial_passes(x.dtype, _int_accumulating(x.dtype, dtype)):
            sigs.append(Signature((P,), (P,)))  # P -> P: a cumulative sum is linear
        for i in range(x.ndim):
            if i != d and x.shape[i] > 1:
                sigs.append(Signature((Split(i),), (Split(i),)))  # S(i) -> S(i): lines apart
        return sigs

    return sbp


def _scan_samples(zeros):
    def samples(rng):
        out = [
            Sample(_rand(rng, 3, 4), dim=1),
            Sample(_rand(rng, 3, 4, 2), dim=0),
            Sample(_rand(rng, 2, 5), dim=-1),
            Sample(_rand(rng), dim=0),
            Sample(_rand(rng, 5, 3, dtype=np.float32), dim=0),
            Sample(_rand(rng, 4, 3, dtype=np.float32), dim=1, dtype=dt.float64),
            Sample(_rand(rng, 4, 3, dtype=np.float16), dim=1, grad=False),
            Sample(_ints(rng, 3, 4), dim=1, grad=False),
            Sample(_ints(rng, 3, 4) > 0, dim=0, grad=False),
        ]
        if zeros:
            out.append(Sample(np.array([[1.5, 0.0, -2.0, 0.5], [0.0, 2.0, 0.0, 3.0],
                                        [0.7, -1.2, 0.9, 0.0]]), dim=1))
        return out

    return samples


for _kind in ("cumsum", "cumprod"):
    register(OpDef(
        _kind,
        inputs=("input",),
        attrs={"dim": Attr("int"), "dtype": Attr("dtype", None)},
        infer_meta=_scan_meta(_kind),
        kernel=_scan_kernel(_kind),
        saves=() if _kind == "cumsum" else ("input", "out"),
        grad=_cumsum_grad if _kind == "cumsum" else _cumprod_grad,
        sbp=_scan_sbp(_kind == "cumsum"),
        reference=_kind,
        samples=_scan_samples(_kind == "cumprod"),
    ))


# -- any / all ------------------------------------------------------------------------------
def _logical_dims(name, dim, ndim):
    """For any/all, () reduces nothing (unlike sum); None reduces everything."""
    if dim is None:
        return tuple(range(ndim))
    return normalize_dims(name, dim, ndim)


def _logical_meta(name):
    def meta(x, dim=None, keepdim=False):
        dims = _logical_dims(name, dim, x.ndim)
        out = dt.uint8 if x.dtype is dt.uint8 else dt.bool_  # torch keeps uint8
        return TensorMeta(_reduced_shape(x.shape, dims, keepdim), out)

    return meta


def _logical_kernel(kind):
    def kernel(ctx, x, dim=None, keepdim=False):
        dims = _logical_dims(kind, dim, ctx.in_metas[0].ndim)
        if not dims:  # nothing reduced: just the truth value of each element
            return _finish(ctx, ctx.prims.cast(x, dt.bool_))
        x, dims = _prepare(ctx, x, dims)
        return _finish(ctx, ctx.prims.reduce(kind, x, dims, keepdim))

    return kernel


def _logical_reference(kind):
    def ref(torch, x, dim=None, keepdim=False):
        if dim is None:
            r = getattr(torch, kind)(x)
            return r.reshape((1,) * x.ndim) if keepdim else r
        return getattr(torch, kind)(x, dim=dim, keepdim=keepdim)

    return ref


def _logical_samples(kind):
    def samples(rng):
        # One odd element out, so that no piece of a split decides the whole result alone.
        lone = np.full((3, 4), kind == "all")
        lone[1, 2] = kind != "all"
        return [Sample(lone, grad=False)] + _logical_more_samples(rng)

    return samples


def _logical_more_samples(rng):
    return [
        Sample(_ints(rng, 3, 4, low=0, high=2) > 0, dim=1, grad=False),
        Sample(_ints(rng, 3, 4, 2, low=0, high=2) > 0, dim=(0, 2), keepdim=True, grad=False),
        Sample(_rand(rng, 3, 4) * (_ints(rng, 3, 4, low=0, high=2)), dim=-1, grad=False),
        Sample(_ints(rng, 4, 3, low=0, high=2), dim=0, grad=False),
        Sample(_ints(rng, 4, 3, dtype=np.uint8, low=0, high=2), dim=1, grad=False),
        Sample(np.ones((2, 3), dtype=np.bool_), dim=(), grad=False),
        Sample(np.asarray(True), grad=False),
    ]


for _kind in ("any", "all"):
    register(OpDef(
        _kind,
        inputs=("input",),
        attrs={"dim": Attr("ints", None), "keepdim": Attr("bool", False)},
        infer_meta=_logical_meta(_kind),
        kernel=_logical_kernel(_kind),
        sbp=lambda x, dim=None, keepdim=False: reduce_signatures(
            x, _logical_dims("any", dim, x.ndim), keepdim),
        reference=_logical_reference(_kind),
        samples=_logical_samples(_kind),
    ))


# -- count_nonzero --------------------------------------------------------------------------
def _count_nonzero_meta(x, dim=None):
    dims = _logical_dims("count_nonzero", dim, x.ndim)
    return TensorMeta(_reduced_shape(x.shape, dims, False), dt.int64)


def _count_nonzero_kernel(ctx, x, dim=None):
    dims = _logical_dims("count_nonzero", dim, ctx.in_metas[0].ndim)
    nonzero = ctx.prims.binary("ne", x, _scalar(ctx, 0, ctx.in_metas[0].dtype))
    nonzero, dims = _prepare(ctx, nonzero, dims)
    return _finish(ctx, ctx.prims.reduce("sum", ctx.prims.cast(nonzero, dt.int64), dims))


register(OpDef(
    "count_nonzero",
    inputs=("input",),
    attrs={"dim": Attr("ints", None)},
    infer_meta=_count_nonzero_meta,
    kernel=_count_nonzero_kernel,
    # S(i) -> P over a counted axis: counts add up.  Counting is not linear in x: no P -> P.
    sbp=lambda x, dim=None: reduce_signatures(
        x, _logical_dims("count_nonzero", dim, x.ndim), False, split_to_partial=True),
    reference="count_nonzero",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4) * _ints(rng, 3, 4, low=0, high=2), grad=False),
        Sample(_ints(rng, 3, 4, 2, low=-1, high=2), dim=1, grad=False),
        Sample(_ints(rng, 3, 4, low=0, high=2) > 0, dim=(0, 1), grad=False),
        Sample(_ints(rng, 5, 3, low=-1, high=2), dim=-1, grad=False),
    ],
))


# -- median ---------------------------------------------------------------------------------
def _median_full_kernel(ctx, x):
    """The lower median of all elements (NaN if any element is NaN, as in torch)."""
    n = ctx.in_metas[0].numel
    if n == 0:
        # torch: NaN, cast to the dtype as C casts it (int64's min for int64, True for bool),
        # which is what NumPy's cast of a float32 NaN gives
        nan = ctx.prims.full((), dt.float32, math.nan)
        return _finish(ctx, nan if ctx.in_metas[0].dtype is dt.float32
                       else ctx.prims.cast(nan, ctx.in_metas[0].dtype))
    flat = ctx.prims.reshape(ctx.prims.contiguous(x), (n,))
    values, _ = ctx.prims.median(flat, 0)
    return _finish(ctx, values)


def _median_dim_kernel(ctx, x, dim, keepdim=False):
    xm = ctx.in_metas[0]
    d = normalize_dim("median", dim, xm.ndim) if xm.ndim else 0
    x, _ = _prepare(ctx, x, ())
    v, i = ctx.prims.median(x, d)
    return _finish(ctx, v, 0), _finish(ctx, i, 1)


def _median_dim_meta(x, dim, keepdim=False):
    d = normalize_dim("median", dim, x.ndim)
    dims = (d,) if x.ndim else ()
    _require_nonempty("median", x, dims)
    shape = _reduced_shape(x.shape, dims, keepdim)
    return TensorMeta(shape, x.dtype), TensorMeta(shape, dt.int64)


def _median_samples(rng, with_dim):
    extra = {"dim": 1} if with_dim else {}
    out = [
        Sample(_distinct(rng, 3, 4), **extra),
        Sample(_distinct(rng, 3, 5), **extra),
        Sample(_distinct(rng, 4, 3).astype(np.float32), **extra),
        Sample(_rand(rng), **({"dim": 0} if with_dim else {})),
        Sample(rng.permutation(12).reshape(3, 4).astype(np.int32), **extra, grad=False),
    ]
    if with_dim:
        out += [Sample(_distinct(rng, 3, 4, 2), dim=0, keepdim=True),
                Sample(_distinct(rng, 2, 6), dim=-1)]
    return out


register(OpDef(
    "median",
    inputs=("input",),
    infer_meta=lambda x: TensorMeta((), x.dtype),  # unlike max: an empty input gives NaN
    kernel=_median_full_kernel,
    grad=_full_extreme_grad,
    saves=("input", "out"),
    sbp=lambda x: [Signature((B,), (B,))],  # B -> B only: the median needs every element
    reference="median",
    samples=lambda rng: _median_samples(rng, False),
))

register(OpDef(
    "median_dim",
    inputs=("input",),
    outputs=("values", "indices"),
    attrs={"dim": Attr("int"), "keepdim": Attr("bool", False)},
    infer_meta=_median_dim_meta,
    kernel=_median_dim_kernel,
    grad=_dim_extreme_grad,
    saves=("indices",),
    sbp=lambda x, dim, keepdim=False: reduce_signatures(
        x, (normalize_dim("median", dim, x.ndim),) if x.ndim else (), keepdim, n_out=2),
    reference=lambda torch, x, dim, keepdim=False: torch.median(x, dim, keepdim),
    samples=lambda rng: _median_samples(rng, True),
))


# -- sort, argsort, topk --------------------------------------------------------------------
def _sort_meta(x, dim=-1, descending=False, stable=False):
    normalize_dim("sort", dim, x.ndim)
    return TensorMeta(x.shape, x.dtype), TensorMeta(x.shape, dt.int64)


def _sort_kernel(ctx, x, dim=-1, descending=False, stable=False):
    d = normalize_dim("sort", dim, ctx.in_metas[0].ndim) if ctx.in_metas[0].ndim else 0
    if ctx.in_metas[0].ndim == 0:
        return ctx.prims.contiguous(x), ctx.prims.full((), dt.int64, 0)
    values, idx = ctx.prims.sort(x, d, descending)
    return values, ctx.prims.cast(idx, dt.int64)


def _scatter_values_grad(ctx, g, _indices_grad=None):
    """Values picked by index along dim: the gradient goes back to those positions."""
    x = ctx.in_metas[0]
    if x.ndim == 0:
        return (g,)
    d = normalize_dim("sort", ctx.attrs["dim"], x.ndim)
    zeros = op("full", shape=x.shape, fill_value=0, dtype=g.dtype, _device=g._where())
    return (op("scatter_add", zeros, ctx.output(1), g, dim=d),)


def _along_dim_sbp(x, dim=-1, **_):
    """sort and topk: (values, indices) computed independently per row along `dim`."""
    d = normalize_dim("sort", dim, x.ndim) if x.ndim else 0
    return [Signature((B,), (B, B))] + [
        Signature((Split(i),), (Split(i), Split(i)))  # (S(i)) -> S(i): rows are independent
        for i in range(x.ndim) if i != d and x.shape[i] > 1
    ]


def _sort_samples(rng):
    # Distinct values so that the order (and the gradient routing) is unique.
    return [
        Sample(rng.permutation(12).reshape(3, 4).astype(np.float64)),
        Sample(rng.permutation(24).reshape(2, 3, 4).astype(np.float64), dim=1, descending=True),
        Sample(rng.permutation(5).astype(np.float32), dim=0),
        Sample(rng.integers(0, 4, (3, 5)), dim=-1, stable=True, grad=False),
    ]


register(OpDef(
    "sort",
    inputs=("input",),
    outputs=("values", "indices"),
    attrs={"dim": Attr("int", -1), "descending": Attr("bool", False),
           "stable": Attr("bool", False)},
    infer_meta=_sort_meta,
    kernel=_sort_kernel,
    grad=_scatter_values_grad,
    saves=("indices",),
    sbp=_along_dim_sbp,
    reference=lambda torch, x, **kw: tuple(torch.sort(x, **{**kw, "stable": True})),
    samples=_sort_samples,
))


def _topk_meta(x, k, dim=-1, largest=True, sorted=True):
    d = normalize_dim("topk", dim, x.ndim) if x.ndim else 0
    n = x.shape[d] if x.ndim else 1
    if k < 0 or k > n:
        raise op_error("topk", f"selected index k out of range: k={k} for a dimension of "
                       f"size {n} (dim {dim}, input shape {list(x.shape)})")
    shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
    return TensorMeta(shape, x.dtype), TensorMeta(shape, dt.int64)


def _topk_kernel(ctx, x, k, dim=-1, largest=True, sorted=True):
    xm = ctx.in_metas[0]
    if xm.ndim == 0:
        return ctx.prims.contiguous(x), ctx.prims.full((), dt.int64, 0)
    d = normalize_dim("topk", dim, xm.ndim)
    values, idx = ctx.prims.sort(x, d, largest)
    key = tuple(slice(0, k) if i == d else slice(None) for i in range(xm.ndim))
    return (ctx.prims.contiguous(ctx.prims.slice(values, key)),
            ctx.prims.cast(ctx.prims.slice(idx, key), dt.int64))


register(OpDef(
    "topk",
    inputs=("input",),
    outputs=("values", "indices"),
    attrs={"k": Attr("int"), "dim": Attr("int", -1), "largest": Attr("bool", True),
           "sorted": Attr("bool", True)},
    infer_meta=_topk_meta,
    kernel=_topk_kernel,
    grad=_scatter_values_grad,
    saves=("indices",),
    sbp=_along_dim_sbp,
    reference="topk",
    samples=lambda rng: [
        Sample(rng.permutation(12).reshape(3, 4).astype(np.float64), k=2),
        Sample(rng.permutation(24).reshape(2, 3, 4).astype(np.float64), k=3, dim=1,
               largest=False),
        Sample(rng.permutation(6).astype(np.float32), k=6, dim=0),
    ],
))


# -- NaN and inf ----------------------------------------------------------------------------
def _nonfinite(rng):
    """Rows with a NaN; with +inf and -inf; with +inf alone (each at its own position)."""
    x = _distinct(rng, 3, 5)
    cols = rng.permutation(5)
    x[0, cols[0]] = np.nan
    x[1, cols[1]], x[1, cols[2]] = np.inf, -np.inf
    x[2, cols[3]] = np.inf
    return x


def _also_nonfinite(name, *attr_sets):
    """Check op `name` against torch on NaN and inf too (values only: no gradient samples)."""
    opdef = get(name)
    base = opdef.samples
    opdef.samples = lambda rng: [
        *base(rng), *(Sample(_nonfinite(rng), grad=False, **attrs) for attrs in attr_sets)]


for _name, _attr_sets in {
    "sum": ({}, {"dim": (1,)}), "mean": ({}, {"dim": (1,)}), "prod": ({}, {"dim": 1}),
    "max": ({},), "min": ({},), "max_dim": ({"dim": 1},), "min_dim": ({"dim": 1},),
    "amax": ({"dim": (1,)},), "amin": ({"dim": (1,)},),
    "argmax": ({}, {"dim": 1}), "argmin": ({}, {"dim": 1}),
    "var": ({"dim": (1,)},), "std": ({"dim": (1,)},), "logsumexp": ({"dim": (1,)},),
    "linalg_vector_norm": ({"dim": (1,)}, {"ord": math.inf, "dim": (1,)}),
    "cumsum": ({"dim": 1},), "cumprod": ({"dim": 1},), "any": ({"dim": (1,)},),
    "all": ({"dim": (1,)},), "count_nonzero": ({"dim": (1,)},),
    "median": ({},), "median_dim": ({"dim": 1},),
    "sort": ({"dim": 1}, {"dim": 1, "descending": True}),
    "topk": ({"k": 2, "dim": 1}, {"k": 2, "dim": 1, "largest": False}),
}.items():
    _also_nonfinite(_name, *_attr_sets)


# -- searchsorted ---------------------------------------------------------------------------
def _promoted(a: TensorMeta, b: TensorMeta) -> dt.DType:
    return dt.result_type([m.dtype for m in (a, b) if m.shape],
                          [m.dtype for m in (a, b) if not m.shape], [])


def _searchsorted_meta(seq, values, right=False, out_int32=False):
    if seq.ndim == 0:
        raise op_error("searchsorted", "boundaries tensor should have positive dimension, but "
                       "got 0 dimension")
    if seq.ndim > 1 and seq.shape[:-1] != values.shape[:-1]:
        raise op_error("searchsorted", "boundaries tensor should be 1 dimension or the first "
                       "N-1 dimensions of boundaries tensor and input value tensor must "
                       f"match, but we got boundaries tensor {list(seq.shape)} and input value "
                       f"tensor {list(values.shape)}")
    return TensorMeta(values.shape, dt.int32 if out_int32 else dt.int64)


def _searchsorted_kernel(ctx, seq, values, right=False, out_int32=False):
    """A binary search per value, all values at once: ceil(log2(n + 1)) halvings of [lo, hi),
    each a gather of the midpoints and a comparison.  lo ends at the count of boundaries
    below the value (at or below it with right=True); a NaN value goes after every
    boundary, and a NaN boundary (sorted last) before every value, as in torch."""
    p = ctx.prims
    ms, mv = ctx.in_metas
    d = _promoted(ms, mv)
    seq, values = _cast_to(ctx, seq, 0, d), _cast_to(ctx, values, 1, d)
    n = ms.shape[-1]
    shape = mv.shape
    if ms.ndim == 1:  # any shape of values against one row: search the flat values
        values = p.reshape(p.contiguous(values), (mv.numel,))
    elif mv.ndim == 0:
        values = p.reshape(values, (1,))
    i64 = dt.int64
    lo = p.full(values.shape, i64, 0)
    hi = p.full(values.shape, i64, n)
    one, two, last = _scalar(ctx, 1, i64), _scalar(ctx, 2, i64), _scalar(ctx, max(n - 1, 0), i64)
    for _ in range(n.bit_length()):
        mid = p.binary("floor_divide", p.binary("add", lo, hi), two)
        probe = p.gather(seq, seq.ndim - 1, p.binary("minimum", mid, last))
        # torch's test, not(probe >= v) (not(probe > v) with right=True), so that any
        # comparison with NaN moves right
        right_of = p.unary("logical_not", p.binary("gt" if right else "ge", probe, values))
        active = p.binary("lt", lo, hi)
        lo = p.where(p.binary("logical_and", active, right_of), p.binary("add", mid, one), lo)
        hi = p.where(p.binary("logical_and", active, p.unary("logical_not", right_of)), mid, hi)
    return _finish(ctx, p.reshape(lo, shape) if tuple(lo.shape) != shape else lo)


def _searchsorted_sbp(seq, values, right=False, out_int32=False):
    sigs = [Signature((B, B), (B,))]  # (B,B)->B
    # No (S(-1),B)->P: the result is a count of the boundaries below only for a truly
    # sorted row, and a row with NaN boundaries is not one.
    for i in range(values.ndim):
        if values.shape[i] <= 1:
            continue
        if seq.ndim == 1:
            sigs.append(Signature((B, Split(i)), (Split(i),)))  # (B,S(i))->S(i): values apart
        elif i < values.ndim - 1:
            # (S(i),S(i))->S(i): a leading axis pairs rows of boundaries with rows of values
            sigs.append(Signature((Split(i), Split(i)), (Split(i),)))
        else:
            sigs.append(Signature((B, Split(i)), (Split(i),)))  # values of a row apart
    return sigs


def _searchsorted_reference(torch, seq, values, right=False, out_int32=False):
    return torch.searchsorted(seq, values, right=right, out_int32=out_int32)


def _searchsorted_samples(rng):
    row = np.sort(rng.standard_normal(9))
    rows = np.sort(rng.standard_normal((3, 6)), axis=1)
    ties = np.array([1, 2, 2, 2, 5, 7, 7])
    return [
        Sample(row, rng.standard_normal((4, 5)) * 1.5, grad=False),
        Sample(row, np.concatenate([row, [np.nan, -np.inf, np.inf]]), right=True, grad=False),
        Sample(rows, rng.standard_normal((3, 4)), grad=False),
        Sample(rows, rng.standard_normal((3, 4)), right=True, out_int32=True, grad=False),
        Sample(ties, np.array([[0, 1, 2], [3, 7, 8]]), grad=False),
        Sample(ties, np.array([[0, 1, 2], [3, 7, 8]]), right=True, grad=False),
        Sample(ties.astype(np.int32), np.array([2.5, 7.0, -1.0], dtype=np.float32), grad=False),
        Sample(np.array([0.5]), np.asarray(0.5), grad=False),
        Sample(np.array([1.0, 2.0, np.nan]), np.array([1.5, 3.0, np.nan]), grad=False),
    ]


register(OpDef(
    "searchsorted",
    inputs=("sorted_sequence", "input"),
    attrs={"right": Attr("bool", False), "out_int32": Attr("bool", False)},
    infer_meta=_searchsorted_meta,
    kernel=_searchsorted_kernel,
    sbp=_searchsorted_sbp,
    reference=_searchsorted_reference,
    samples=_searchsorted_samples,
))


# -- cummax / cummin ------------------------------------------------------------------------
def _cum_extreme_meta(name):
    def meta(x, dim):
        normalize_dim(name, dim, x.ndim)
        return TensorMeta(x.shape, x.dtype), TensorMeta(x.shape, dt.int64)

    return meta


def _cum_extreme_kernel(larger: bool):
    """The running max (min) along dim and the index of its latest occurrence (a NaN, once
    seen, stays, at the latest NaN's index), as torch's CPU loop.  Computed as a log-depth
    scan of (value, index) pairs: at step s each slot takes the pair s slots back unless its
    own wins; the later pair wins ties, so the rule is associative."""

    def kernel(ctx, x, dim):
        p = ctx.prims
        xm = ctx.in_metas[0]
        if xm.ndim == 0:
            return p.contiguous(x), p.full((), dt.int64, 0)
        d = normalize_dim("cummax" if larger else "cummin", dim, xm.ndim)
        n = xm.shape[d]
        v = p.contiguous(x)
        line = tuple(n if i == d else 1 for i in range(xm.ndim))
        idx = p.contiguous(p.broadcast_to(p.reshape(p.scan(
            "cumsum", p.full((n,), dt.int64, 1), 0), line), xm.shape))
        idx = p.binary("sub", idx, _scalar(ctx, 1, dt.int64))

        def cut(t, start, stop):
            return p.slice(t, tuple(slice(start, stop) if i == d else slice(None)
                                    for i in range(xm.ndim)))

        s = 1
        while s < n:
            before_v, before_i = cut(v, 0, n - s), cut(idx, 0, n - s)
            own_v, own_i = cut(v, s, n), cut(idx, s, n)
            earlier = p.binary("gt" if larger else "lt", before_v, own_v)
            if xm.dtype.is_floating_point:  # a NaN beats numbers; of two NaNs the later
                earlier = p.binary("logical_and", p.binary(
                    "logical_or", earlier, p.unary("isnan", before_v)),
                    p.unary("logical_not", p.unary("isnan", own_v)))
            new_v, new_i = p.empty(xm.shape, xm.dtype), p.empty(xm.shape, dt.int64)
            p.copy(cut(new_v, 0, s), cut(v, 0, s))
            p.copy(cut(new_i, 0, s), cut(idx, 0, s))
            p.copy(cut(new_v, s, n), p.where(earlier, before_v, own_v))
            p.copy(cut(new_i, s, n), p.where(earlier, before_i, own_i))
            v, idx = new_v, new_i
            s *= 2
        return v, idx

    return kernel


def _cum_extreme_samples(rng):
    runs = np.array([[1.0, 3.0, 3.0, np.nan, 2.0, 5.0, np.nan, 1.0],
                     [2.0, 1.0, 1.0, 0.0, 3.0, -1.0, -1.0, 7.0]])
    return [
        Sample(_distinct(rng, 3, 5), dim=1),
        Sample(_distinct(rng, 4, 3, 2), dim=0),
        Sample(_distinct(rng, 2, 9).astype(np.float32), dim=-1),
        Sample(_rand(rng), dim=0),
        Sample(runs, dim=1, grad=False),
        Sample(_ints(rng, 4, 7, low=0, high=3), dim=1, grad=False),
        Sample(_ints(rng, 4, 7, low=0, high=2) > 0, dim=0, grad=False),
    ]


for _kind, _larger in (("cummax", True), ("cummin", False)):
    register(OpDef(
        _kind,
        inputs=("input",),
        outputs=("values", "indices"),
        attrs={"dim": Attr("int")},
        infer_meta=_cum_extreme_meta(_kind),
        kernel=_cum_extreme_kernel(_larger),
        grad=_scatter_values_grad,  # each value came from its index: the gradient goes there
        saves=("indices",),
        sbp=_along_dim_sbp,  # lines along dim are independent
        reference=(lambda k: lambda torch, x, dim: tuple(getattr(torch, k)(x, dim)))(_kind),
        samples=_cum_extreme_samples,
    ))


# -- logcumsumexp ---------------------------------------------------------------------------
def _logcumsumexp_meta(x, dim):
    normalize_dim("logcumsumexp", dim, x.ndim)
    if not x.dtype.is_floating_point:
        raise op_error("logcumsumexp", f"\"logcumsumexp_out_cpu\" not implemented for "
                       f"'{_TORCH_TYPE[x.dtype.name]}'", NotImplementedError)
    return x


def _logaddexp_arrays(ctx, a, b, d):
    """log(exp(a) + exp(b)) = max + log1p(exp(-|a - b|)); equal infinities give themselves."""
    p = ctx.prims
    r = p.binary("add", p.binary("maximum", a, b), p.unary("log1p", p.unary(
        "exp", p.unary("neg", p.unary("abs", p.binary("sub", a, b))))))
    same_inf = p.binary("logical_and", p.unary("isinf", a), p.binary("eq", a, b))
    return p.where(same_inf, a, r)


def _logcumsumexp_kernel(ctx, x, dim):
    """A log-depth scan under logaddexp: at step s each slot adds in the one s slots back, so
    every partial sum stays in log space (no overflow, no underflow of small terms)."""
    p = ctx.prims
    xm = ctx.in_metas[0]
    acc = _acc(xm.dtype)
    v = p.contiguous(_cast_to(ctx, x, 0, acc))
    if xm.ndim == 0:
        return _finish(ctx, v)
    d = normalize_dim("logcumsumexp", dim, xm.ndim)
    n = xm.shape[d]

    def cut(t, start, stop):
        return p.slice(t, tuple(slice(start, stop) if i == d else slice(None)
                                for i in range(xm.ndim)))

    s = 1
    while s < n:
        new = p.empty(xm.shape, acc)
        p.copy(cut(new, 0, s), cut(v, 0, s))
        p.copy(cut(new, s, n), _logaddexp_arrays(ctx, cut(v, 0, n - s), cut(v, s, n), acc))
        v, s = new, s * 2
    return _finish(ctx, v)


def _reverse_logcumsumexp(t, d):
    return op("flip", op("logcumsumexp", op("flip", t, dims=(d,)), dim=d), dims=(d,))


def _logcumsumexp_grad(ctx, g):
    """torch's rule: with the positive and negative parts of g in log space (the lowest
    finite value for none), exp(reverse_logcumsumexp(log g+ - out) + x) minus the same for
    g-; stable where exp(x) and exp(-out) alone would overflow."""
    xm = ctx.in_metas[0]
    if xm.ndim == 0:
        return (g,)
    d = normalize_dim("logcumsumexp", ctx.attrs["dim"], xm.ndim)
    x, out = ctx.input(0), ctx.output(0)
    lowest = float(np.finfo(np.float32 if xm.dtype is dt.bfloat16 else xm.dtype.np).min)
    parts = []
    for sign in (1, -1):
        gs = g if sign == 1 else op("neg", g)
        positive = op("gt_scalar", gs, other=0)
        # log(gs) where gs > 0 (log of 1 elsewhere, then replaced by the lowest value)
        logs = op("where_scalar", positive,
                  op("log", op("where_scalar", positive, gs, other=1)), other=lowest)
        parts.append(op("exp", op("add", _reverse_logcumsumexp(op("sub", logs, out), d), x)))
    return (op("sub", parts[0], parts[1]),)


register(OpDef(
    "logcumsumexp",
    inputs=("input",),
    attrs={"dim": Attr("int")},
    infer_meta=_logcumsumexp_meta,
    kernel=_logcumsumexp_kernel,
    grad=_logcumsumexp_grad,
    saves=("input", "out"),
    sbp=_scan_sbp(False),  # lines along dim are independent; not linear: no P
    reference="logcumsumexp",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 5) * 3, dim=1),
        Sample(_rand(rng, 4, 3, 2), dim=0),
        Sample(_rand(rng, 2, 9, dtype=np.float32) * 5, dim=-1),
        Sample(_rand(rng), dim=0),
        Sample(np.array([[-1000.0, 0.0, -np.inf, 3.0, 1000.0],
                         [-np.inf, -np.inf, 2.0, np.inf, 1.0]]), dim=1, grad=False),
        Sample(_rand(rng, 3, 4).astype(np.float16), dim=1, grad=False, rtol=1e-2, atol=1e-2),
    ],
))
