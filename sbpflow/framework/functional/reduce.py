"""Reduction functions with torch's signatures, and their Tensor methods.

The module defines functions named `sum`, `max`, `min`, `any` and `all` (torch's names); code
here that needs the Python builtins reaches them through `builtins`.
"""

from __future__ import annotations

import builtins
import math

from ..._core import dtype as dt
from ...ops.registry import get as _get_op
from ...ops.registry import op as _op
from ..interpreter import apply as _apply
from ._base import call, inplace_method, is_tensor

_SUM, _MEAN = _get_op("sum"), _get_op("mean")


class _ValuesIndices(tuple):
    """torch.return_types.<name>: a (values, indices) pair that also has named fields."""

    __slots__ = ()
    _name = "values_indices"

    def __new__(cls, values, indices):
        return tuple.__new__(cls, (values, indices))

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        return self[1]

    def __repr__(self):
        return f"sbpflow.return_types.{self._name}(\nvalues={self[0]!r},\nindices={self[1]!r})"


def _return_type(name: str) -> type:
    return type(name, (_ValuesIndices,), {"__slots__": (), "_name": name,
                                          "__module__": "sbpflow.return_types"})


_max_result = _return_type("max")
_min_result = _return_type("min")
_median_result = _return_type("median")


def _numpy_named(name, dim, keepdim, axis, keepdims):
    """dim and keepdim, given under torch's names or NumPy's (`axis`, `keepdims`)."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{name}() got both 'dim' and its NumPy alias 'axis'")
        dim = axis
    if keepdims is not None:
        if keepdim is not False:
            raise TypeError(f"{name}() got both 'keepdim' and its NumPy alias 'keepdims'")
        keepdim = keepdims
    return dim, keepdim


# sum and mean take NumPy's names themselves (as torch's parser does), with no wrapper frame:
# they are the hottest reductions of the eager path (see functional/__init__.py).
def sum(input, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):  # noqa: A001
    if (dim is None and keepdim is False and dtype is None and axis is None
            and keepdims is None):
        return _apply(_SUM, (input,), {})  # the common call: its cache key is the shortest
    dim, keepdim = _numpy_named("sum", dim, keepdim, axis, keepdims)
    return _apply(_SUM, (input,), {"dim": dim, "keepdim": keepdim, "dtype": dtype})


def mean(input, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
    if (dim is None and keepdim is False and dtype is None and axis is None
            and keepdims is None):
        return _apply(_MEAN, (input,), {})
    dim, keepdim = _numpy_named("mean", dim, keepdim, axis, keepdims)
    return _apply(_MEAN, (input,), {"dim": dim, "keepdim": keepdim, "dtype": dtype})


def prod(input, dim=None, keepdim=False, *, dtype=None):
    if dim is None and keepdim:
        raise TypeError("prod(): keepdim needs an explicit dim; got (Tensor, keepdim=bool)")
    return call("prod", input, dim=dim, keepdim=keepdim, dtype=dtype)


def _extreme(name: str, pairwise: str, result_type):
    def fn(input, dim=None, keepdim=False, *, other=None):
        if other is not None or is_tensor(dim):
            # max(a, b) with a tensor b is the elementwise maximum.
            rhs = dim if is_tensor(dim) else other
            if keepdim:
                raise TypeError(f"{name}(): keepdim is not an argument of {name}(input, other)")
            return call(pairwise, input, rhs)
        if dim is None:
            if keepdim:
                raise TypeError(f"{name}(): keepdim needs an explicit dim; got (Tensor, "
                                "keepdim=bool)")
            return call(name, input)
        values, indices = call(f"{name}_dim", input, dim=dim, keepdim=keepdim)
        return result_type(values, indices)

    fn.__name__ = name
    fn.__qualname__ = name
    return fn


max = _extreme("max", "maximum", _max_result)  # noqa: A001 - torch's name
min = _extreme("min", "minimum", _min_result)  # noqa: A001 - torch's name


def amax(input, dim=(), keepdim=False):
    return call("amax", input, dim=dim, keepdim=keepdim)


def amin(input, dim=(), keepdim=False):
    return call("amin", input, dim=dim, keepdim=keepdim)


def argmax(input, dim=None, keepdim=False):
    return call("argmax", input, dim=dim, keepdim=keepdim)


def argmin(input, dim=None, keepdim=False):
    return call("argmin", input, dim=dim, keepdim=keepdim)


def _var_attrs(name, dim, unbiased, keepdim, correction):
    """torch's overloads: f(input, dim, unbiased, keepdim), f(input, unbiased),
    f(input, dim, *, correction, keepdim)."""
    if isinstance(dim, builtins.bool):  # f(input, unbiased)
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): cannot specify both 'unbiased' and 'correction'")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return {"dim": dim, "correction": correction, "keepdim": keepdim}


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return call("var", input, **_var_attrs("var", dim, unbiased, keepdim, correction))


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return call("std", input, **_var_attrs("std", dim, unbiased, keepdim, correction))


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    attrs = _var_attrs("var_mean", dim, unbiased, keepdim, correction)
    return (call("var", input, **attrs),
            call("mean", input, dim=attrs["dim"], keepdim=keepdim))


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    attrs = _var_attrs("std_mean", dim, unbiased, keepdim, correction)
    return (call("std", input, **attrs),
            call("mean", input, dim=attrs["dim"], keepdim=keepdim))


def vector_norm(input, ord=2, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.vector_norm (for the linalg namespace)."""
    return call("linalg_vector_norm", input, ord=ord, dim=dim, keepdim=keepdim, dtype=dtype)


def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    if out is not None:
        raise TypeError("norm(): the 'out' argument is not supported")
    if isinstance(p, str):
        if p == "fro" and (dim is None or isinstance(dim, int) or len(dim) <= 2):
            # The Frobenius norm is the 2-norm of the elements over the given dims.
            return vector_norm(input, 2, dim, keepdim, dtype=dtype)
        if p == "nuc":  # the sum of singular values, over the last two axes or `dim`
            from .linalg import linalg_matrix_norm

            return linalg_matrix_norm(input, "nuc", (-2, -1) if dim is None else dim, keepdim,
                                      dtype=dtype)
        raise RuntimeError(f"norm(): p={p!r} with dim={dim!r} is not a supported norm; "
                           "expected 'fro' with at most 2 dims, or a number")
    return vector_norm(input, 2 if p is None else p, dim, keepdim, dtype=dtype)


def clip_coef(grads, max_norm: float, norm_type: float):
    """(total norm, scale) of torch's clip_grad_norm_: the `norm_type` norm of the gradients'
    norms, and min(1, max_norm / (total + 1e-6)).  Written with ops, so eager clipping and
    nn.Graph's optimizer pass (on traced gradients) share it."""
    from .shape import stack

    norm_type = float(norm_type)
    if norm_type == math.inf:
        norms = [g.abs().max() for g in grads]
        total = norms[0] if len(norms) == 1 else stack(norms).max()
    else:
        norms = [norm(g, norm_type) for g in grads]
        total = norm(stack(norms), norm_type)
    return total, ((total + 1e-6).reciprocal() * max_norm).clamp(max=1.0)


def logsumexp(input, dim, keepdim=False):
    return call("logsumexp", input, dim=dim, keepdim=keepdim)


def cumsum(input, dim, *, dtype=None):
    return call("cumsum", input, dim=dim, dtype=dtype)


def cumprod(input, dim, *, dtype=None):
    return call("cumprod", input, dim=dim, dtype=dtype)


def any(input, dim=None, keepdim=False):  # noqa: A001 - torch's name
    return call("any", input, dim=dim, keepdim=keepdim)


def all(input, dim=None, keepdim=False):  # noqa: A001 - torch's name
    return call("all", input, dim=dim, keepdim=keepdim)


def count_nonzero(input, dim=None):
    return call("count_nonzero", input, dim=dim)


def median(input, dim=None, keepdim=False):
    if dim is None:
        if keepdim:
            raise TypeError("median(): keepdim needs an explicit dim")
        return call("median", input)
    values, indices = call("median_dim", input, dim=dim, keepdim=keepdim)
    return _median_result(values, indices)


METHODS = {
    "sum": sum, "mean": mean, "prod": prod, "max": max, "min": min, "amax": amax,
    "amin": amin, "argmax": argmax, "argmin": argmin, "var": var, "std": std, "norm": norm,
    "logsumexp": logsumexp, "cumsum": cumsum, "cumprod": cumprod, "any": any, "all": all,
    "count_nonzero": count_nonzero, "median": median,
    "cumsum_": inplace_method("cumsum_", cumsum),
    "cumprod_": inplace_method("cumprod_", cumprod),
}

__all__ = [
    "all", "amax", "amin", "any", "argmax", "argmin", "count_nonzero", "cumprod", "cumsum",
    "logsumexp", "max", "mean", "median", "min", "norm", "prod", "std", "std_mean", "sum",
    "var", "var_mean",
]


_sort_result = _return_type("sort")
_topk_result = _return_type("topk")


def sort(input, dim=-1, descending=False, stable=False):
    return _sort_result(*call("sort", input, dim=dim, descending=descending, stable=stable))


def argsort(input, dim=-1, descending=False, stable=False):
    return call("sort", input, dim=dim, descending=descending, stable=stable)[1]


def topk(input, k, dim=-1, largest=True, sorted=True):
    return _topk_result(*call("topk", input, k=k, dim=dim, largest=largest, sorted=sorted))


METHODS.update({"sort": sort, "argsort": argsort, "topk": topk})
__all__ += ["argsort", "sort", "topk"]


# -- more reductions, scans, counting and statistics ------------------------------------------
# Compositions of registered ops: gradients, SBP and devices come from those ops.  Functions
# whose output size depends on the values (bincount, unique) read them on the host, as
# nonzero does.
_aminmax_result = type("aminmax", (tuple,), {
    "__slots__": (), "__module__": "sbpflow.return_types",
    "__new__": lambda cls, lo, hi: tuple.__new__(cls, (lo, hi)),
    "min": property(lambda self: self[0]), "max": property(lambda self: self[1]),
    "__repr__": lambda self: f"sbpflow.return_types.aminmax(\nmin={self[0]!r},\n"
                             f"max={self[1]!r})",
})
_kthvalue_result = _return_type("kthvalue")
_mode_result = _return_type("mode")
_nanmedian_result = _return_type("nanmedian")
_cummax_result = _return_type("cummax")
_cummin_result = _return_type("cummin")

_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
         "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
         "bool": "Bool"}


def _tname(t) -> str:
    return _TYPE[t.dtype.name]


def _dim(name, dim, ndim) -> int:
    from ..._core.errors import normalize_dim

    return normalize_dim(name, dim, builtins.max(ndim, 1))


def _no_grad():
    from ...autograd import no_grad

    return no_grad()


def aminmax(input, *, dim=None, keepdim=False):
    # torch's own messages (not amin's) for what has no identity
    if dim is None:
        if input.numel() == 0:
            raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as "
                               "the operation has no identity.")
    elif input.ndim and input.shape[_dim("aminmax", dim, input.ndim)] == 0:
        raise IndexError(f"aminmax(): Expected reduction dim {_dim('aminmax', dim, input.ndim)}"
                         " to have non-zero size.")
    d = () if dim is None else dim
    return _aminmax_result(amin(input, d, keepdim), amax(input, d, keepdim))


def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """The sum with NaN counted as zero."""
    x = input
    if x.dtype.is_floating_point:
        x = x.masked_fill(x.isnan(), 0)
    return sum(x, dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """The mean of the non-NaN elements."""
    if not input.dtype.is_floating_point:
        raise RuntimeError("nanmean(): expected input to have floating point or complex dtype "
                           f"but got {_tname(input)}")
    count = sum(input.isnan().logical_not(), dim, keepdim)
    total = nansum(input, dim, keepdim, dtype=dtype)
    return total / count.to(total.dtype)


def nanmedian(input, dim=None, keepdim=False):
    """The lower median of the non-NaN elements (NaN where a slice is all NaN)."""
    if dim is None:
        if keepdim:
            raise TypeError("nanmedian(): keepdim needs an explicit dim")
        flat = input.reshape(-1)
        if flat.numel() == 0:  # torch: NaN (cast to the dtype), with a gradient as median's
            return call("median", input)
        return nanmedian(flat, 0)[0].reshape(())
    if input.ndim == 0:
        _dim("nanmedian", dim, 0)
        values, indices = call("median_dim", input, dim=dim, keepdim=keepdim)
        return _nanmedian_result(values, indices)
    d = _dim("nanmedian", dim, input.ndim)
    if input.shape[d] == 0:
        raise IndexError(f"nanmedian(): Expected reduction dim {d} to have non-zero size.")
    values, indices = sort(input, d, stable=True)  # NaN sorts last
    if input.dtype.is_floating_point:
        count = sum(input.isnan().logical_not(), d, keepdim=True)
        pos = ((count - 1) // 2).clamp(min=0)
    else:
        pos = _op("full", shape=(), fill_value=(input.shape[d] - 1) // 2, dtype=_long(),
                   _device=input._where()).expand(
            *[1 if i == d else n for i, n in enumerate(input.shape)])
    v, i = _gather(values, d, pos), _gather(indices, d, pos)
    if not keepdim:
        v, i = v.squeeze(d), i.squeeze(d)
    return _nanmedian_result(v, i)


def _gather(t, dim, index):
    """The gather op for indices in range by construction: no host check of their values
    (which nn.Graph tracing could not read)."""
    return call("gather", t, index, dim=dim)


def _long():
    return dt.int64


def kthvalue(input, k, dim=-1, keepdim=False):
    """The k-th smallest element along dim and its index."""
    d = _dim("kthvalue", dim, input.ndim)
    n = input.shape[d] if input.ndim else 1
    if n == 0:  # before k's range, as torch
        raise IndexError(f"kthvalue(): Expected reduction dim {d} to have non-zero size.")
    if not 1 <= k <= n:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    if input.ndim == 0:
        return _kthvalue_result(input.clone(), _op("full", shape=(), fill_value=0,
                                                     dtype=_long(), _device=input._where()))
    values, indices = sort(input, d, stable=True)
    v, i = values.narrow(d, k - 1, 1), indices.narrow(d, k - 1, 1)
    if not keepdim:
        v, i = v.squeeze(d), i.squeeze(d)
    return _kthvalue_result(v, i)


def mode(input, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest among equally frequent ones) and the
    index of its last occurrence, as torch's CPU kernel: the slice is sorted and each run of
    equal values measured by where it starts and ends (running max/min of run edges)."""
    d = _dim("mode", dim, input.ndim)
    if input.ndim == 0:
        return _mode_result(input.clone(), _op("full", shape=(), fill_value=0,
                                                dtype=_long(), _device=input._where()))
    n = input.shape[d]
    if n == 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    from .creation import arange
    from .shape import cat

    with _no_grad():
        x = input.detach().movedim(d, -1)
        s = sort(x, -1, stable=True)[0]
        iota = arange(n, device=input._where()).expand(*x.shape)
        differs = s.narrow(-1, 1, n - 1) != s.narrow(-1, 0, n - 1)
        edge = _op("full", shape=(*x.shape[:-1], 1), fill_value=True, dtype=differs.dtype,
                   _device=input._where())
        starts = cat([edge, differs], -1)  # the first slot of each run
        ends = cat([differs, edge], -1)  # the last slot of each run
        first = cummax(iota.masked_fill(starts.logical_not(), 0), -1)[0]
        last = cummin(iota.masked_fill(ends.logical_not(), n).flip(-1), -1)[0].flip(-1)
        count = last - first
        top = argmax(count, -1, keepdim=True)  # the first (smallest) of the most frequent
        value = _gather(s, -1, top)
        index = amax(iota.masked_fill(x != value, -1), -1, keepdim=True).movedim(-1, d)
    values = _gather(input, d, index)
    if not keepdim:
        values, index = values.squeeze(d), index.squeeze(d)
    return _mode_result(values, index)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(name, input, q, dim, keepdim, interpolation, ignore_nan):
    from .creation import tensor as make_tensor

    if not input.dtype.is_floating_point or input.dtype.itemsize < 4:
        raise RuntimeError(f"{name}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise RuntimeError(f"{name}() interpolation must be one of linear, lower, higher, "
                           f"midpoint or nearest, but got {interpolation}")
    if is_tensor(q):
        if q.dtype is not input.dtype:
            raise RuntimeError(f"{name}() q tensor must be same dtype as the input tensor")
        if q.ndim > 1:
            raise RuntimeError(f"{name}() q must be a scalar or 1D tensor")
        qs = q
        scalar_q = q.ndim == 0
        # q's values are checked on the host, as torch does
        if qs.numel() and not bool(((qs >= 0) & (qs <= 1)).all().item()):
            raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
    else:
        if not 0 <= q <= 1:
            raise RuntimeError(f"{name}() q must be in the range [0, 1] but got {q}")
        qs = make_tensor(float(q), dtype=input.dtype, device=input._where())
        scalar_q = True
    if input.numel() == 0:
        raise RuntimeError(f"{name}() input tensor must be non-empty")
    if dim is None:
        x, d = input.reshape(-1), 0
        out_keep = [1] * input.ndim
    else:
        d = _dim(name, dim, input.ndim)
        x = input if input.ndim else input.reshape(1)
        out_keep = [1 if i == d else n for i, n in enumerate(input.shape)]
    s = sort(x, d)[0].movedim(d, -1)  # NaN last
    n = s.shape[-1]
    nan = s.isnan()
    if ignore_nan:
        count = sum(nan.logical_not(), -1, keepdim=True).to(s.dtype)
    else:
        count = _op("full", shape=(), fill_value=float(n), dtype=s.dtype,
                     _device=s._where())
    qv = qs.reshape(-1).to(s.dtype)
    rank = ((count - 1).clamp(min=0) * qv).expand(*s.shape[:-1], qv.shape[0])  # (..., Q)
    if interpolation == "lower":
        rank = rank.floor()
    elif interpolation == "higher":
        rank = rank.ceil()
    elif interpolation == "nearest":
        rank = rank.round()
    lo = rank.floor().to(_long()).clamp(0, n - 1)
    hi = rank.ceil().to(_long()).clamp(0, n - 1)
    below, above = _gather(s, -1, lo), _gather(s, -1, hi)
    if interpolation == "midpoint":
        weight = (hi > lo).to(s.dtype) * 0.5
    else:
        weight = rank - lo.to(s.dtype)
    r = below.lerp(above, weight)
    if ignore_nan:
        r = r.masked_fill(count == 0, float("nan"))
    else:
        r = r.masked_fill(any(nan, -1, keepdim=True), float("nan"))
    # (..., Q) -> (Q, ...), the reduced axis dropped or kept as 1.
    r = r.movedim(-1, 0)
    if keepdim:
        r = r.reshape(r.shape[0], *out_keep)
    elif dim is None:
        r = r.reshape(r.shape[0])
    return r.squeeze(0) if scalar_q else r


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear"):
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


def cummax(input, dim):
    """The running maximum along dim and the index of its latest occurrence."""
    return _cummax_result(*call("cummax", input, dim=dim))


def cummin(input, dim):
    """The running minimum along dim and the index of its latest occurrence."""
    return _cummin_result(*call("cummin", input, dim=dim))


def logcumsumexp(input, dim):
    """log(cumsum(exp(input))) along dim, without overflow."""
    return call("logcumsumexp", input, dim=dim)


def histc(input, bins=100, min=0, max=0):  # noqa: A002 - torch's argument names
    """Counts in `bins` equal bins over [min, max] (the data's range when both are 0);
    values outside are ignored, max falls in the last bin."""
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{_tname(input)}'")
    if bins <= 0:
        raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for "
                           "dimension 0")
    lo, hi = float(min), float(max)
    if lo > hi:
        raise RuntimeError("torch.histc: max must be larger than min")
    x = input.detach().reshape(-1)
    if lo == hi and x.numel():
        lo, hi = float(x.min().item()), float(x.max().item())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histc: range of [{lo}, {hi}] is not finite")
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if x.numel() == 0:
        return _op("full", shape=(bins,), fill_value=0, dtype=input.dtype,
                   _device=input._where())
    inside = (x >= lo) & (x <= hi)
    pos = ((x - lo) * (bins / (hi - lo))).floor().clamp(0, bins - 1)
    pos = pos.masked_fill(inside.logical_not(), 0).to(_long())
    zeros = _op("full", shape=(bins,), fill_value=0, dtype=input.dtype,
                 _device=input._where())
    return zeros.scatter_add(0, pos, inside.to(input.dtype))


_histogram_result = type("histogram", (tuple,), {
    "__slots__": (), "__module__": "sbpflow.return_types",
    "__new__": lambda cls, hist, bin_edges: tuple.__new__(cls, (hist, bin_edges)),
    "hist": property(lambda self: self[0]), "bin_edges": property(lambda self: self[1]),
    "__repr__": lambda self: f"sbpflow.return_types.histogram(\nhist={self[0]!r},\n"
                             f"bin_edges={self[1]!r})",
})


_CTYPE = {"float32": "float", "float64": "double", "float16": "c10::Half",
          "bfloat16": "c10::BFloat16", "int64": "long int", "int32": "int", "int16": "short int",
          "int8": "signed char", "uint8": "unsigned char", "bool": "bool"}


def _cname(t) -> str:
    """t's dtype as torch's C++ messages name it."""
    return _CTYPE[t.dtype.name]


def histogram(input, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    """(hist, bin_edges): the count (or summed weight) of input's values in each bin, where
    `bins` is a count of equal bins over `range` (the data's range when None) or a 1-D tensor
    of edges. A value on an inner edge counts in the bin to its right; the last edge is in the
    last bin; values outside the edges are ignored. `density` divides by total * bin width."""
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{_tname(input)}'")
    if weight is not None:
        if tuple(weight.shape) != tuple(input.shape):
            raise RuntimeError(
                "torch.histogramdd: if weight tensor is provided it should have the same shape "
                "as the input tensor excluding its innermost dimension, but got input with shape "
                f"{[input.numel(), 1]} and weight with shape {list(weight.shape)}")
        if weight.dtype != input.dtype:
            raise RuntimeError(
                "torch.histogramdd: if weight tensor is provided, input tensor and weight tensor "
                f"should have the same dtype, but got input({_cname(input)}), and "
                f"weight({_cname(weight)})")
    x = input.detach().reshape(-1)
    if is_tensor(bins):
        if bins.ndim != 1:
            raise RuntimeError("torch.histogramdd: bins tensor should have one dimension, but got "
                               f"{bins.ndim} dimensions in the bins tensor for dimension 0")
        if bins.dtype != input.dtype:
            raise RuntimeError(
                "torch.histogramdd: input tensor and bins tensors should have the same dtype, "
                f"but got input with dtype {_cname(input)} and bins for dimension 0 with "
                f"dtype {_cname(bins)}")
        edges = bins.detach()
    else:
        from .creation import linspace

        if bins <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for "
                               "dimension 0")
        if range is not None:
            lo, hi = float(range[0]), float(range[1])
        elif x.numel():
            lo, hi = float(x.min().item()), float(x.max().item())
        else:
            lo, hi = 0.0, 1.0
        if lo > hi:
            raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min "
                               f"{lo:g} max {hi:g} for dimension 0")
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise RuntimeError(f"torch.histogramdd: dimension 0's range [{lo:g}, {hi:g}] is not "
                               "finite")
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges = linspace(lo, hi, bins + 1, dtype=input.dtype, device=input.device)
    nbins = edges.numel() - 1
    if nbins < 1:
        raise RuntimeError("torch.histogram(): bins must be > 0, but got 0 for dimension 0")
    inside = (x >= edges[0]) & (x <= edges[-1])
    pos = (searchsorted(edges, x, right=True) - 1).clamp(0, nbins - 1)
    pos = pos.masked_fill(inside.logical_not(), 0)
    mass = inside.to(input.dtype)
    if weight is not None:
        mass = mass * weight.detach().reshape(-1)
    zeros = _op("full", shape=(nbins,), fill_value=0, dtype=input.dtype, _device=input._where())
    hist = zeros.scatter_add(0, pos, mass)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return _histogram_result(hist, edges)


def bincount(input, weights=None, minlength=0):
    """Counts (or summed weights) of each non-negative integer; the length is
    max(input) + 1 or minlength, read on the host."""
    import numpy as np

    if input.dtype.is_floating_point:
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{_tname(input)}'")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if input.ndim != 1 or input.dtype.name == "bool":
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    host = np.asarray(input._host())
    if host.size and host.min() < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != input.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    n = builtins.max(int(host.max()) + 1 if host.size else 0, minlength)
    if weights is None:
        d, src = _long(), None
    else:
        d = weights.dtype if weights.dtype.is_floating_point else dt.float64
        src = weights.to(d)
    zeros = _op("full", shape=(n,), fill_value=0, dtype=d, _device=input._where())
    if src is None:
        src = _op("full", shape=tuple(input.shape), fill_value=1, dtype=d,
                   _device=input._where())
    return zeros.scatter_add(0, input.to(_long()), src)


def _host_unique(name, input, consecutive, return_inverse, return_counts, dim):
    import numpy as np

    from .creation import tensor as make_tensor

    host = np.asarray(input._host())
    where = input._where()
    if dim is None:
        flat = host.reshape(-1)
        if consecutive:
            keep = np.ones(flat.shape[0], bool)
            keep[1:] = flat[1:] != flat[:-1]
            values = flat[keep]
            inverse = np.cumsum(keep) - 1
            counts = np.diff(np.append(np.nonzero(keep)[0], flat.shape[0]))
        else:
            values, inverse, counts = np.unique(flat, return_inverse=True,
                                                return_counts=True, equal_nan=False)
        inverse = inverse.reshape(host.shape)
    else:
        d = _dim(name, dim, input.ndim)
        if host.ndim == 0:
            raise IndexError(f"{name}(): dim {dim} is out of range for a 0-d tensor")
        moved = np.moveaxis(host, d, 0)
        rows = moved.reshape(moved.shape[0], -1)
        if consecutive:
            keep = np.ones(rows.shape[0], bool)
            keep[1:] = (rows[1:] != rows[:-1]).any(axis=1)
            picked = rows[keep]
            inverse = np.cumsum(keep) - 1
            counts = np.diff(np.append(np.nonzero(keep)[0], rows.shape[0]))
        else:
            picked, inverse, counts = np.unique(rows, axis=0, return_inverse=True,
                                                return_counts=True)
            inverse = inverse.reshape(-1)
        values = np.moveaxis(picked.reshape((picked.shape[0],) + moved.shape[1:]), 0, d)
    out = [make_tensor(np.ascontiguousarray(values), dtype=input.dtype, device=where)]
    if return_inverse:
        out.append(make_tensor(np.asarray(inverse, np.int64), device=where))
    if return_counts:
        out.append(make_tensor(np.asarray(counts, np.int64), device=where))
    return out[0] if len(out) == 1 else tuple(out)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct values (sorted; read on the host), with the inverse map and counts."""
    return _host_unique("unique", input, False, return_inverse, return_counts, dim)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """Each run of equal consecutive values (or slices along dim) collapsed to one."""
    return _host_unique("unique_consecutive", input, True, return_inverse, return_counts, dim)


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False, side=None,
                 sorter=None, out=None):
    """The insertion index of each value into the sorted innermost rows (a binary search:
    the count of boundaries below it, at or below it with right=True)."""
    from ._base import as_tensor_arg

    if out is not None:
        raise TypeError("searchsorted(): the 'out' argument is not supported")
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError("torch.searchsorted(): side can only be 'left' or 'right' but "
                               f"got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to "
                               "opposites, got side of left while right was True")
        right = side == "right"
    seq = sorted_sequence
    scalar = not is_tensor(input)
    if scalar:
        if seq.ndim != 1:
            raise RuntimeError("torch.searchsorted(): input value can be a scalar only when "
                               "boundaries tensor dimension is 1, but we got boundaries "
                               f"tensor dim({seq.ndim})")
        input = as_tensor_arg("searchsorted", "input", input, seq)
    if seq.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive "
                           "dimension, but got 0 dimension")
    if seq.ndim > 1 and tuple(seq.shape[:-1]) != tuple(input.shape[:-1]):
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or "
                           "the first N-1 dimensions of boundaries tensor and input value "
                           "tensor must match, but we got boundaries tensor "
                           f"{list(seq.shape)} and input value tensor {list(input.shape)}")
    if sorter is not None:
        if tuple(sorter.shape) != tuple(seq.shape):
            raise RuntimeError("torch.searchsorted(): boundary and sorter must have the same "
                               f"size, but got boundary tensor {list(seq.shape)}and got "
                               f"sorter tensor {list(sorter.shape)}")
        seq = seq.gather(-1, sorter)
    return call("searchsorted", seq.detach(), input.detach(), right=right,
                out_int32=out_int32)


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    if boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim"
                           f"({boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right, out=out)


def cov(input, *, correction=1, fweights=None, aweights=None):
    """The covariance of the rows (variables) over the columns (observations)."""
    if input.ndim > 2:
        raise RuntimeError("cov(): expected input to have two or fewer dimensions but got an "
                           f"input with {input.ndim} dimensions")
    x = input.reshape(1, -1) if input.ndim < 2 else input
    if not x.dtype.is_floating_point:
        x = x.to(dt.get_default_dtype())
    n = x.shape[1]
    w = None
    for name, wt in (("fweights", fweights), ("aweights", aweights)):
        if wt is None:
            continue
        if wt.ndim > 1:
            raise RuntimeError(f"cov(): expected {name} to have one or fewer dimensions but "
                               f"got {name} with {wt.ndim} dimensions")
        if wt.numel() != n:
            raise RuntimeError(f"cov(): expected {name} to have the same numel as there are "
                               f"observations in the input but got {wt.numel()} != {n}")
        if name == "fweights" and wt.dtype.is_floating_point:
            raise RuntimeError("cov(): expected fweights to have integral dtype but got "
                               f"fweights with {_tname(wt)} dtype")
        if name == "aweights" and not wt.dtype.is_floating_point:
            raise RuntimeError("cov(): expected aweights to have floating point dtype but got "
                               f"aweights with {_tname(wt)} dtype")
        wt = wt.to(x.dtype)
        w = wt if w is None else w * wt
    if w is None:
        w_sum = float(n)
        avg = mean(x, 1, keepdim=True)
        factor = w_sum - correction
    else:
        w_sum = sum(w)
        avg = sum(x * w, 1, keepdim=True) / w_sum
        if aweights is None:
            factor = w_sum - correction
        else:
            factor = w_sum - correction * sum(w * aweights.to(x.dtype)) / w_sum
    xc = x - avg
    xw = xc if w is None else xc * w
    from .linalg import mm

    # A non-positive normaliser is clamped to 0 (inf and NaN results), as torch.
    if isinstance(factor, float) and factor <= 0:
        import warnings

        warnings.warn("cov(): degrees of freedom is <= 0. Correction should be strictly less "
                      "than the number of observations.", UserWarning, stacklevel=2)
    factor = builtins.max(factor, 0.0) if isinstance(factor, float) else factor.clamp(min=0)
    c = mm(xw, xc.t()) / factor
    return c.reshape(()) if input.ndim < 2 else c


def corrcoef(input):
    """Pearson correlation coefficients of the rows, clipped to [-1, 1]."""
    c = cov(input)
    if c.ndim == 0:
        return c / c
    d = c.diagonal()
    s = d.sqrt()
    c = c / s.unsqueeze(1) / s.unsqueeze(0)
    return c.clamp(-1, 1)


def renorm(input, p, dim, maxnorm):
    """Each slice along dim rescaled to p-norm maxnorm where its norm exceeds it."""
    if p <= 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    d = _dim("renorm", dim, input.ndim)
    if input.ndim <= 1:
        raise RuntimeError("renorm: input needs at least 2 dimensions, got "
                           f"{input.ndim} dimensions")
    others = tuple(i for i in range(input.ndim) if i != d)
    norms = vector_norm(input, p, others, keepdim=True)
    factor = (maxnorm / (norms + 1e-7)).where(norms > maxnorm, 1.0)
    return input * factor.to(input.dtype)


def _trapezoid_parts(name, y, x, dx, dim):
    """(sum terms along dim, axis): (y[1:] + y[:-1]) / 2 * spacing."""
    d = _dim(name, dim, y.ndim)
    n = y.shape[d] if y.ndim else 0
    if n == 0:
        return None, d
    pairs = y.narrow(d, 1, n - 1) + y.narrow(d, 0, n - 1)
    if x is None or not is_tensor(x):
        step = dx if x is None else x
        return pairs * (0.5 * (1 if step is None else step)), d
    if x.ndim == 1:
        if x.shape[0] != n:
            raise RuntimeError(f"{name}: There must be one `x` value for each sample point")
        spacing = x[1:] - x[:-1]
        spacing = spacing.reshape(*[n - 1 if i == d else 1 for i in range(y.ndim)])
    else:
        spacing = x.narrow(d, 1, n - 1) - x.narrow(d, 0, n - 1)
    return pairs * spacing * 0.5, d


def trapezoid(y, x=None, *, dx=None, dim=-1):
    terms, d = _trapezoid_parts("trapezoid", y, x, dx, dim)
    if terms is None:  # no interval: zero
        return sum(y, d) * 0
    return sum(terms, d)


def trapz(y, x=None, *, dx=None, dim=-1):
    return trapezoid(y, x, dx=dx, dim=dim)


def cumulative_trapezoid(y, x=None, *, dx=None, dim=-1):
    terms, d = _trapezoid_parts("cumulative_trapezoid", y, x, dx, dim)
    if terms is None:
        return y.narrow(d, 0, 0) * 1.0
    return cumsum(terms, d)


METHODS.update({
    "aminmax": aminmax, "nansum": nansum, "nanmean": nanmean, "nanmedian": nanmedian,
    "kthvalue": kthvalue, "mode": mode, "quantile": quantile, "nanquantile": nanquantile,
    "cummax": cummax, "cummin": cummin, "logcumsumexp": logcumsumexp, "histc": histc,
    "histogram": histogram, "bincount": bincount, "unique": unique,
    "unique_consecutive": unique_consecutive,
    "cov": cov, "corrcoef": corrcoef, "renorm": renorm,
    "renorm_": inplace_method("renorm_", renorm),
})
__all__ += [
    "aminmax", "bincount", "bucketize", "corrcoef", "cov", "cummax", "cummin",
    "cumulative_trapezoid", "histc", "histogram", "kthvalue", "logcumsumexp", "mode", "nanmean",
    "nanmedian", "nanquantile", "nansum", "quantile", "renorm", "searchsorted", "trapezoid",
    "trapz", "unique", "unique_consecutive",
]
