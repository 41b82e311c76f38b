"""Reduction functions with torch's signatures, and their Tensor methods.

The module defines functions named `sum`, `max`, `min`, `any` and `all` (torch's names); code
here that needs the Python builtins reaches them through `builtins`.
"""

from __future__ import annotations

import builtins
import math

from ._base import call, inplace_method, is_tensor


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


def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001 - torch's name
    return call("sum", input, dim=dim, keepdim=keepdim, dtype=dtype)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    return call("mean", input, dim=dim, keepdim=keepdim, dtype=dtype)


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
