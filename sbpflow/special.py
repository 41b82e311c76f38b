"""torch.special: the functions sbpflow can back by its own ops or a short composition of them.

Every function here is built from sbpflow tensor ops, so it is differentiable and works on
global tensors wherever those ops do.  The rest of torch.special's public names (Bessel and
orthogonal polynomials, the gamma family, ...) raise `NotImplementedError` naming the function;
that error is also an `AttributeError`, so `hasattr(flow.special, "gammaln")` is False as for
any absent attribute.
"""

from __future__ import annotations

import math

from ._core.dtype import get_default_dtype as _default_dtype
from .framework import functional as _F

__all__ = [
    "entr", "erf", "erfc", "erfinv", "exp2", "expit", "expm1", "log1p", "log_softmax",
    "logit", "logsumexp", "ndtr", "ndtri", "round", "sinc", "softmax", "xlog1py", "xlogy",
]

# torch.special's public names that sbpflow cannot back with its current ops.
_UNSUPPORTED = frozenset({
    "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "chebyshev_polynomial_t",
    "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w", "digamma",
    "erfcx", "gammainc", "gammaincc", "gammaln", "hermite_polynomial_h",
    "hermite_polynomial_he", "i0", "i0e", "i1", "i1e", "laguerre_polynomial_l",
    "legendre_polynomial_p", "log_ndtr", "modified_bessel_i0", "modified_bessel_i1",
    "modified_bessel_k0", "modified_bessel_k1", "multigammaln", "polygamma", "psi",
    "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "spherical_bessel_j0", "zeta",
})


class SpecialFunctionNotImplemented(NotImplementedError, AttributeError):
    """A torch.special function sbpflow does not offer (an AttributeError too, so getattr
    with a default and hasattr behave as for any missing attribute)."""


def __getattr__(name: str):
    if name in _UNSUPPORTED:
        raise SpecialFunctionNotImplemented(
            f"torch.special.{name} is not implemented in sbpflow (sbpflow.special.{name}): "
            f"sbpflow has no op to build it from")
    raise AttributeError(f"module 'sbpflow.special' has no attribute '{name}'")


def _check(op: str, input) -> None:
    if not isinstance(input, _F.Tensor):
        raise TypeError(f"special_{op}(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(input).__name__}")


def expit(input):
    """The logistic sigmoid, 1 / (1 + exp(-x))."""
    _check("expit", input)
    return _F.sigmoid(input)


def logit(input, eps=None):
    """log(p / (1 - p)); with `eps`, p is first clamped to [eps, 1 - eps]."""
    _check("logit", input)
    if eps is not None:
        input = _F.clamp(input, eps, 1.0 - eps)
    return _F.log(input / (1.0 - input))


def erf(input):
    _check("erf", input)
    return _F.erf(input)


def erfc(input):
    """1 - erf(x) (functional.elementwise.erfc)."""
    _check("erfc", input)
    return _F.erfc(input)


def erfinv(input):
    _check("erfinv", input)
    return _F.erfinv(input)


def expm1(input):
    _check("expm1", input)
    return _F.expm1(input)


def exp2(input):
    """2 ** x, elementwise (functional.elementwise.exp2)."""
    _check("exp2", input)
    return _F.exp2(input)


def log1p(input):
    _check("log1p", input)
    return _F.log1p(input)


def log_softmax(input, dim, *, dtype=None):
    _check("log_softmax", input)
    return _F.log_softmax(input, dim, dtype=dtype)


def softmax(input, dim, *, dtype=None):
    _check("softmax", input)
    return _F.softmax(input, dim, dtype=dtype)


def logsumexp(input, dim, keepdim=False):
    _check("logsumexp", input)
    return _F.logsumexp(input, dim, keepdim)


def xlogy(input, other):
    """x * log(y), 0 where x == 0 (unless y is NaN)."""
    return _F.xlogy(input, other)


def xlog1py(input, other):
    """x * log1p(y), 0 where x == 0 (unless y is NaN)."""
    x = input if isinstance(input, _F.Tensor) else _F.tensor(input, dtype=other.dtype)
    y = other if isinstance(other, _F.Tensor) else _F.tensor(other, dtype=x.dtype)
    if not x.dtype.is_floating_point:
        x = x.to(y.dtype if y.dtype.is_floating_point else _default_dtype())
    if not y.dtype.is_floating_point:
        y = y.to(x.dtype)
    prod = x * _F.log1p(y)
    zero = _F.zeros_like(prod)
    return _F.where(_F.isnan(y), y + zero, _F.where(x == 0, zero, prod))


def sinc(input):
    _check("sinc", input)
    return _F.sinc(input)


def round(input, *, decimals=0):  # noqa: A001 - torch's name
    _check("round", input)
    return _F.round(input, decimals=decimals)


def entr(input):
    """-x * log(x) for x > 0, 0 at x == 0, -inf for x < 0 (NaN stays NaN)."""
    _check("entr", input)
    x = input if input.dtype.is_floating_point else input.to(_default_dtype())
    safe = _F.where(x > 0, x, _F.ones_like(x))
    val = -x * _F.log(safe)
    val = _F.where(x == 0, _F.zeros_like(x), val)
    return _F.where(x < 0, _F.full_like(x, -math.inf), val)


def ndtr(input):
    """The standard normal CDF, (1 + erf(x / sqrt 2)) / 2."""
    _check("ndtr", input)
    x = input if input.dtype.is_floating_point else input.to(_default_dtype())
    return 0.5 * (1.0 + _F.erf(x * (1.0 / math.sqrt(2.0))))


def ndtri(input):
    """The inverse of the standard normal CDF, sqrt 2 * erfinv(2p - 1)."""
    _check("ndtri", input)
    x = input if input.dtype.is_floating_point else input.to(_default_dtype())
    return math.sqrt(2.0) * _F.erfinv(2.0 * x - 1.0)
