"""KL divergence: `kl_divergence(p, q)` dispatches on the two distribution types to a rule
registered with `@register_kl(TypeP, TypeQ)`; the most specific registered pair wins."""

from __future__ import annotations

import math
import warnings

from ..framework import functional as F
from ..framework.functional.linalg import linalg_solve_triangular
from .bernoulli import Bernoulli
from .categorical import Categorical
from .distribution import Distribution
from .independent import Independent
from .multivariate_normal import MultivariateNormal, _batch_mahalanobis, _half_log_det
from .normal import Normal
from .one_hot_categorical import OneHotCategorical
from .uniform import Uniform
from .utils import softplus, sum_rightmost

__all__ = ["kl_divergence", "register_kl"]

_KL_REGISTRY: dict = {}
_KL_MEMOIZE: dict = {}


def register_kl(type_p, type_q):
    """Decorator registering `fn(p, q)` as KL(p || q) for p of type_p and q of type_q."""
    if not isinstance(type_p, type) or not issubclass(type_p, Distribution):
        raise TypeError(f"Expected type_p to be a Distribution subclass but got {type_p}")
    if not isinstance(type_q, type) or not issubclass(type_q, Distribution):
        raise TypeError(f"Expected type_q to be a Distribution subclass but got {type_q}")

    def decorator(fun):
        _KL_REGISTRY[type_p, type_q] = fun
        _KL_MEMOIZE.clear()
        return fun

    return decorator


def _dispatch_kl(type_p, type_q):
    matches = [(sp, sq) for sp, sq in _KL_REGISTRY
               if issubclass(type_p, sp) and issubclass(type_q, sq)]
    if not matches:
        return NotImplemented
    # Rank each match by how far up each MRO its classes are; left and right orders must
    # name the same best pair, else the choice is ambiguous (torch warns, then picks left).
    def left(m):
        return (type_p.__mro__.index(m[0]), type_q.__mro__.index(m[1]))

    def right(m):
        return (type_q.__mro__.index(m[1]), type_p.__mro__.index(m[0]))

    best_left, best_right = min(matches, key=left), min(matches, key=right)
    if _KL_REGISTRY[best_left] is not _KL_REGISTRY[best_right]:
        warnings.warn(
            f"Ambiguous kl_divergence({type_p.__name__}, {type_q.__name__}). Please register_kl"
            f"({best_left[0].__name__}, {best_right[1].__name__})", RuntimeWarning, stacklevel=3)
    return _KL_REGISTRY[best_left]


def kl_divergence(p, q):
    """KL(p || q), batched over the distributions' batch shape."""
    try:
        fun = _KL_MEMOIZE[type(p), type(q)]
    except KeyError:
        fun = _dispatch_kl(type(p), type(q))
        _KL_MEMOIZE[type(p), type(q)] = fun
    if fun is NotImplemented:
        raise NotImplementedError(f"No KL(p || q) is implemented for p type "
                                  f"{p.__class__.__name__} and q type {q.__class__.__name__}")
    return fun(p, q)


def _inf_where(cond, value):
    return F.where(cond, F.full_like(value, math.inf), value)


def _zero_where(cond, value):
    return F.where(cond, F.zeros_like(value), value)


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p, q):
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t1 = _zero_where(p.probs == 0, _inf_where(q.probs == 0, t1))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    t2 = _zero_where(p.probs == 1, _inf_where(q.probs == 1, t2))
    return t1 + t2


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = _inf_where((q.probs == 0).expand_as(t), t)
    t = _zero_where((p.probs == 0).expand_as(t), t)
    return t.sum(-1)


@register_kl(OneHotCategorical, OneHotCategorical)
def _kl_onehotcategorical_onehotcategorical(p, q):
    return _kl_categorical_categorical(p._categorical, q._categorical)


@register_kl(Normal, Normal)
def _kl_normal_normal(p, q):
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Uniform, Uniform)
def _kl_uniform_uniform(p, q):
    result = ((q.high - q.low) / (p.high - p.low)).log()
    return _inf_where((q.low > p.low) | (q.high < p.high), result)


@register_kl(Uniform, Normal)
def _kl_uniform_normal(p, q):
    width = p.high - p.low
    t1 = (math.sqrt(math.pi * 2) * q.scale / width).log()
    t2 = width.pow(2) / 12
    t3 = ((p.high + p.low - 2 * q.loc) / 2).pow(2)
    return t1 + 0.5 * (t2 + t3) / q.scale.pow(2)


@register_kl(Normal, Uniform)
def _kl_normal_uniform(p, q):
    # a normal puts mass outside any bounded interval
    return F.full_like(p.loc + q.low, math.inf)


@register_kl(Independent, Independent)
def _kl_independent_independent(p, q):
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError
    result = kl_divergence(p.base_dist, q.base_dist)
    return sum_rightmost(result, p.reinterpreted_batch_ndims)


@register_kl(MultivariateNormal, MultivariateNormal)
def _kl_multivariatenormal_multivariatenormal(p, q):
    if p.event_shape != q.event_shape:
        raise ValueError("KL-divergence between two Multivariate Normals with different event "
                         "shapes cannot be computed")
    Lp, Lq = p._unbroadcasted_scale_tril, q._unbroadcasted_scale_tril
    half_term1 = _half_log_det(Lq) - _half_log_det(Lp)
    k = p.event_shape[0]
    shape = tuple(F.broadcast_shapes(tuple(Lp.shape[:-2]), tuple(Lq.shape[:-2])))
    term2 = linalg_solve_triangular(Lq.expand(shape + (k, k)), Lp.expand(shape + (k, k)),
                                    upper=False).pow(2).sum((-2, -1))
    term3 = _batch_mahalanobis(Lq, q.loc - p.loc)
    return half_term1 + 0.5 * (term2 + term3 - k)
