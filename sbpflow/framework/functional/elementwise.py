"""Elementwise functions and operators.

Python numbers go to the `<op>_scalar` ops as attrs (never wrapped in tensors); a number in
first position sets `reverse=True`.  Operators return NotImplemented for operands they do not
take, so Python raises its own TypeError (and `t == None` is False), as with torch.
"""

from __future__ import annotations

import builtins
import math

from ..._core import dtype as dt
from ...ops.registry import get as get_op
from ..interpreter import apply
from ..tensor import Tensor
from ._base import as_tensor_arg, call, inplace_method, is_scalar

_NUMBER_TYPES = (int, float, bool)


def _is_number(x) -> bool:
    return type(x) in _NUMBER_TYPES or is_scalar(x)


def _type_error(name, arg, x):
    return TypeError(f"{name}(): argument '{arg}' must be Tensor or Number, not "
                     f"{type(x).__name__}")


def _binary(name: str):
    """A function of (Tensor or Number, Tensor or Number) with one tensor at least."""
    scalar_name = name + "_scalar"

    def fn(input, other):
        if isinstance(input, Tensor):
            if isinstance(other, Tensor):
                return call(name, input, other)
            if _is_number(other):
                return call(scalar_name, input, other=other)
            raise _type_error(name, "other", other)
        if isinstance(other, Tensor) and _is_number(input):
            return call(scalar_name, other, other=input, reverse=True)
        raise _type_error(name, "input", input)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _tensors(name: str):
    """A function of two tensors (torch takes no number here)."""

    def fn(input, other):
        return call(name, input, other)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _unary(name: str):
    def fn(input):
        return call(name, input)

    fn.__name__ = fn.__qualname__ = name
    return fn


# -- arithmetic -----------------------------------------------------------------------------
mul = _binary("mul")
_add = _binary("add")
_sub = _binary("sub")
floor_divide = _binary("floor_divide")
remainder = _binary("remainder")
fmod = _binary("fmod")
pow = _binary("pow")  # noqa: A001 - torch's name
maximum = _tensors("maximum")
minimum = _tensors("minimum")
atan2 = _tensors("atan2")


def _scaled(name, input, other, alpha):
    """other * alpha, with torch's checks on the result dtype."""
    if isinstance(alpha, bool):
        if not all(t.dtype.name == "bool" for t in (input, other) if isinstance(t, Tensor)):
            raise RuntimeError(f"{name}(): Boolean alpha only supported for Boolean results.")
        return other if alpha else _sub(other, other)
    if alpha == 1:
        return other
    is_float_alpha = isinstance(alpha, float) or (
        is_scalar(alpha) and not isinstance(alpha, (bool, int))
        and getattr(alpha, "dtype", None) is not None and alpha.dtype.kind == "f")
    if is_float_alpha:
        tensors = [t for t in (input, other) if isinstance(t, Tensor)]
        if all(not t.dtype.is_floating_point for t in tensors) and not any(
                isinstance(v, float) for v in (input, other)):
            raise RuntimeError(f"{name}(): For integral input tensors, argument alpha must not "
                               "be a floating point number.")
    if isinstance(other, Tensor):
        return call("mul_scalar", other, other=alpha)
    if _is_number(other):
        return other * alpha
    raise _type_error(name, "other", other)


def add(input, other, *, alpha=1):
    if alpha != 1 or alpha is True:  # True == 1, but torch rejects a bool alpha here
        other = _scaled("add", input, other, alpha)
    return _add(input, other)


def sub(input, other, *, alpha=1):
    if alpha != 1 or alpha is True:
        other = _scaled("sub", input, other, alpha)
    return _sub(input, other)


def rsub(input, other, *, alpha=1):
    """other - alpha * input."""
    return sub(other, input, alpha=alpha)


def div(input, other, *, rounding_mode=None):
    if isinstance(input, Tensor):
        if isinstance(other, Tensor):
            return call("div", input, other, rounding_mode=rounding_mode)
        if _is_number(other):
            return call("div_scalar", input, other=other, rounding_mode=rounding_mode)
        raise _type_error("div", "other", other)
    if isinstance(other, Tensor) and _is_number(input):
        return call("div_scalar", other, other=input, reverse=True, rounding_mode=rounding_mode)
    raise _type_error("div", "input", input)


def true_divide(input, other):
    return div(input, other)


subtract = sub
multiply = mul
divide = div
arctan2 = atan2

# -- comparisons and logic ------------------------------------------------------------------
eq = _binary("eq")
ne = _binary("ne")
lt = _binary("lt")
le = _binary("le")
gt = _binary("gt")
ge = _binary("ge")
not_equal, less, less_equal, greater, greater_equal = ne, lt, le, gt, ge
logical_and = _tensors("logical_and")
logical_or = _tensors("logical_or")
logical_xor = _tensors("logical_xor")
logical_not = _unary("logical_not")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
bitwise_not = _unary("bitwise_not")
isnan = _unary("isnan")
isinf = _unary("isinf")
isfinite = _unary("isfinite")

# -- unary math -----------------------------------------------------------------------------
neg = _unary("neg")
abs = _unary("abs")  # noqa: A001 - torch's name
exp = _unary("exp")
expm1 = _unary("expm1")
log = _unary("log")
log1p = _unary("log1p")
log2 = _unary("log2")
log10 = _unary("log10")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
reciprocal = _unary("reciprocal")
square = _unary("square")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")
tanh = _unary("tanh")
asinh = _unary("asinh")
acosh = _unary("acosh")
atanh = _unary("atanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
erfinv = _unary("erfinv")
floor = _unary("floor")
ceil = _unary("ceil")
trunc = _unary("trunc")
frac = _unary("frac")
sign = _unary("sign")
negative, absolute, fix = neg, abs, trunc
arcsin, arccos, arctan = asin, acos, atan
arcsinh, arccosh, arctanh = asinh, acosh, atanh


def round(input, *, decimals=0):  # noqa: A001 - torch's name
    return call("round", input, decimals=decimals)


def positive(input):
    """The input itself (torch returns the same tensor), refused for bool as torch."""
    if input.dtype.name == "bool":
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return input


# -- where, clamp, lerp, addcmul, addcdiv, nan_to_num ----------------------------------------
def where(condition, input=None, other=None):
    if input is None and other is None:
        from . import index  # where(condition) is nonzero(condition, as_tuple=True)

        if hasattr(index, "nonzero"):
            return index.nonzero(condition, as_tuple=True)
        raise TypeError("where(): expected input and other")
    if isinstance(input, Tensor):
        if isinstance(other, Tensor):
            return call("where", condition, input, other)
        return call("where_scalar", condition, input, other=other)
    if isinstance(other, Tensor):
        return call("where_scalar", condition, other, other=input, reverse=True)
    return call("where_scalars", condition, input=input, other=other)


def clamp(input, min=None, max=None):  # noqa: A002 - torch's argument names
    lo_tensor, hi_tensor = isinstance(min, Tensor), isinstance(max, Tensor)
    if not (lo_tensor or hi_tensor):
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        return call("clamp", input, min=min, max=max)
    if min is None:
        return call("clamp_max", input, max)
    if max is None:
        return call("clamp_min", input, min)
    # Both bounds, one a tensor: a number becomes a 0-dim tensor, as torch does here.
    return call("clamp_tensor", input, as_tensor_arg("clamp", "min", min, input),
                as_tensor_arg("clamp", "max", max, input))


def clamp_min(input, min):  # noqa: A002
    if isinstance(min, Tensor):
        return call("clamp_min", input, min)
    return call("clamp", input, min=min)


def clamp_max(input, max):  # noqa: A002
    if isinstance(max, Tensor):
        return call("clamp_max", input, max)
    return call("clamp", input, max=max)


clip = clamp


def lerp(input, end, weight):
    if isinstance(weight, Tensor):
        return call("lerp", input, end, weight)
    return call("lerp_scalar", input, end, weight=weight)


def addcmul(input, tensor1, tensor2, *, value=1):
    return call("addcmul", input, tensor1, tensor2, value=value)


def addcdiv(input, tensor1, tensor2, *, value=1):
    return call("addcdiv", input, tensor1, tensor2, value=value)


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    return call("nan_to_num", input, nan=nan, posinf=posinf, neginf=neginf)


# -- closeness, special values, number theory, special functions -------------------------------
_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
         "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
         "bool": "Bool"}


def _tname(t) -> str:
    return _TYPE[t.dtype.name]


def _require_tensor(name, arg, x):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other|, elementwise; equal values (infinities
    included) are close, NaN only with equal_nan."""
    _require_tensor("isclose", "input", input)
    _require_tensor("isclose", "other", other)
    if input.dtype is not other.dtype:
        raise RuntimeError(f"{_tname(input)} did not match {_tname(other)}")
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    close = eq(input, other)
    if equal_nan and input.dtype.is_floating_point:
        close = logical_or(close, logical_and(isnan(input), isnan(other)))
    if (rtol == 0 and atol == 0) or input.dtype.name == "bool":
        return close
    a, b = input, other
    if not a.dtype.is_floating_point:  # torch measures integers in the default float dtype
        a, b = a.to(_default_float()), b.to(_default_float())
    diff = abs(sub(a, b))
    allowed = add(abs(mul(b, rtol)), atol)
    return logical_or(close, logical_and(isfinite(diff), le(diff, allowed)))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False) -> bool:
    return builtins.bool(isclose(input, other, rtol, atol, equal_nan).all().item())


def equal(input, other) -> bool:
    """True when both have the same shape and elements (NaN is never equal)."""
    _require_tensor("equal", "input", input)
    _require_tensor("equal", "other", other)
    if tuple(input.shape) != tuple(other.shape):
        return False
    return builtins.bool(eq(input, other).all().item())


def isposinf(input):
    _require_tensor("isposinf", "input", input)
    return call("eq_scalar", input, other=float("inf"))


def isneginf(input):
    _require_tensor("isneginf", "input", input)
    return call("eq_scalar", input, other=float("-inf"))


def isreal(input):
    """Every real tensor's elements are real (sbpflow has no complex dtypes)."""
    _require_tensor("isreal", "input", input)
    from .creation import ones_like

    return ones_like(input, dtype=dt.bool_)


signbit = _unary("signbit")


def copysign(input, other):
    """|input| with the sign (bit) of other, in a floating result type."""
    _require_tensor("copysign", "input", input)
    if isinstance(other, Tensor):
        negative = call("signbit", other)
    elif _is_number(other):
            negative = math.copysign(1.0, other) < 0
    else:
        raise _type_error("copysign", "other", other)
    d = _result_dtype(input, other)
    magnitude = abs(input.to(d if d.is_floating_point else _default_float()))
    if isinstance(negative, bool):
        return neg(magnitude) if negative else magnitude
    return where(negative, neg(magnitude), magnitude)


def _result_dtype(*operands):
    """torch's result type of tensors and numbers."""
    from ...ops._util import promote

    return promote([t._meta for t in operands if isinstance(t, Tensor)],
                   [x for x in operands if not isinstance(x, Tensor)])


def _default_float():
    return dt.get_default_dtype()


def _float_pair(name, input, other, arg="other"):
    _require_tensor(name, "input", input)
    _require_tensor(name, arg, other)
    d = _result_dtype(input, other)
    if not d.is_floating_point:
        raise NotImplementedError(f"\"{name}_cpu\" not implemented for '{_TYPE[d.name]}'")


def hypot(input, other):
    """sqrt(a**2 + b**2) as big * sqrt(1 + (small / big)**2), which neither overflows nor
    underflows; an infinite side gives inf even beside NaN, as C's hypot."""
    _float_pair("hypot", input, other)
    a, b = abs(input), abs(other)
    big, small = maximum(a, b), minimum(a, b)
    safe = where(eq(big, 0), 1.0, big)
    ratio = div(small, safe)
    r = mul(big, sqrt(add(mul(ratio, ratio), 1.0)))
    return where(logical_or(isinf(a), isinf(b)), math.inf, r)


def logaddexp(input, other):
    """log(exp(a) + exp(b)) = max + log1p(exp(-|a - b|)); equal infinities give themselves."""
    _float_pair("logaddexp", input, other)
    m = maximum(input, other)
    r = add(m, log1p(exp(neg(abs(sub(input, other))))))
    same_inf = logical_and(isinf(input), eq(input, other))
    return where(same_inf, input.to(r.dtype), r)


def logaddexp2(input, other):
    """log2(2**a + 2**b) = max + log2(1 + 2**-|a - b|)."""
    _float_pair("logaddexp2", input, other)
    m = maximum(input, other)
    r = add(m, mul(log1p(pow(2.0, neg(abs(sub(input, other))))), 1.0 / math.log(2.0)))
    same_inf = logical_and(isinf(input), eq(input, other))
    return where(same_inf, input.to(r.dtype), r)


def heaviside(input, values):
    """0 where input < 0, values where input == 0, 1 where input > 0 (no gradient, as in
    torch, which has no derivative for it)."""
    _require_tensor("heaviside", "input", input)
    _require_tensor("heaviside", "values", values)
    if input.dtype is not values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different "
                           "dtypes.")
    x, v = input.detach(), values.detach()
    return where(eq(x, 0), v, gt(x, 0).to(x.dtype))


def xlogy(input, other):
    """input * log(other), 0 where input == 0 (unless other is NaN)."""
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError("xlogy(): expected a Tensor for input or other")
    if not isinstance(input, Tensor):
        if not _is_number(input):
            raise _type_error("xlogy", "self", input)
        input = _wrap(input, other)
    if not isinstance(other, Tensor):
        if not _is_number(other):
            raise _type_error("xlogy", "other", other)
        other = float(other)
        if math.isnan(other):
            return mul(input, math.nan)
        if 0 < other < math.inf:  # log(other) in double precision, as torch's wrapped number
            return mul(input, math.log(other))
        return where(eq(input, 0), 0.0, mul(input, -math.inf if other == 0 else (
            math.inf if other > 0 else math.nan)))
    # Where input == 0 (and other is not NaN) the result is 0 whatever other is: log reads 1
    # there instead of 0, inf or a negative number, so 0 * log(...) is an exact 0 and the
    # gradient for input is log(other) as torch's (0 where other == 0).
    special = logical_and(eq(input, 0), logical_or(isinf(other), logical_not(gt(other, 0))))
    safe = where(logical_and(special, logical_not(isnan(other))), 1, other)
    return mul(input, log(safe))


def _wrap(number, like):
    from ._base import as_tensor_arg

    return as_tensor_arg("xlogy", "other", number, like)


def sinc(input):
    """sin(pi x) / (pi x), 1 at 0 (with a zero gradient there, as torch)."""
    _require_tensor("sinc", "input", input)
    zero = eq(input, 0)
    x = mul(where(zero, 1, input), math.pi)
    return where(zero, 1.0, div(sin(x), x))


def deg2rad(input):
    _require_tensor("deg2rad", "input", input)
    return mul(input, math.pi / 180.0)


def rad2deg(input):
    _require_tensor("rad2deg", "input", input)
    return mul(input, 180.0 / math.pi)


class _Frexp(tuple):
    """torch.return_types.frexp: (mantissa, exponent) with named fields."""

    __slots__ = ()

    def __new__(cls, mantissa, exponent):
        return tuple.__new__(cls, (mantissa, exponent))

    @property
    def mantissa(self):
        return self[0]

    @property
    def exponent(self):
        return self[1]

    def __repr__(self):
        return (f"sbpflow.return_types.frexp(\nmantissa={self[0]!r},\n"
                f"exponent={self[1]!r})")


def frexp(input):
    """(mantissa, exponent) with input = mantissa * 2**exponent, 0.5 <= |mantissa| < 1;
    zero, inf and NaN keep themselves with exponent 0."""
    _require_tensor("frexp", "input", input)
    if not input.dtype.is_floating_point:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    x = input.detach()
    a = abs(x)
    normal = logical_and(isfinite(x), ne(x, 0))
    e = add(floor(log2(where(normal, a, 1.0))), 1.0)
    m = _times_pow2(input, neg(e))  # differentiable in input: d mantissa = d input / 2**e
    # log2 may round across a power of two: bring the mantissa into [0.5, 1).
    big = ge(abs(m), 1.0)
    m, e = where(big, mul(m, 0.5), m), where(big, add(e, 1.0), e)
    small = lt(abs(m), 0.5)
    m, e = where(small, mul(m, 2.0), m), where(small, sub(e, 1.0), e)
    m = where(normal, m, input)
    e = where(normal, e, 0.0).to(dt.int32)
    return _Frexp(m, e)


def _times_pow2(x, k):
    """x * 2**k for an integral-valued float tensor k, in two halves so that neither power
    overflows or underflows on the way (2**1074 does not exist, 2**537 does)."""
    h = floor(mul(k, 0.5))
    return mul(mul(x, pow(2.0, h)), pow(2.0, sub(k, h)))


def ldexp(input, other):
    """input * 2**other."""
    _require_tensor("ldexp", "input", input)
    _require_tensor("ldexp", "other", other)
    return mul(input, pow(2.0, other))


def nextafter(input, other):
    """The next representable value after input toward other (no gradient, as torch)."""
    import numpy as np

    _require_tensor("nextafter", "input", input)
    _require_tensor("nextafter", "other", other)
    x, y = input.detach(), other.detach()
    d = _result_dtype(x, y)
    if not d.is_floating_point:
        raise NotImplementedError(f"\"nextafter_cpu\" not implemented for '{_TYPE[d.name]}'")
    x, y = x.to(d), y.to(d)
    bits = {8: dt.int64, 4: dt.int32, 2: dt.int16}[d.itemsize]
    from ..._core.errors import broadcast_shapes

    shape = broadcast_shapes("nextafter", tuple(x.shape), tuple(y.shape))
    x = x.expand(*shape).contiguous() if tuple(x.shape) != shape else x.contiguous()
    y = y.expand(*shape) if tuple(y.shape) != shape else y
    # Away from zero the bit pattern steps by one: up in magnitude when moving outward.
    outward = eq(gt(y, x), gt(x, 0))
    stepped = add(x.view(bits), where(outward, 1, -1).to(bits)).view(d)
    tiny = float(np.nextafter(np.zeros((), d.np), np.ones((), d.np)))
    from .creation import full_like

    tiny = full_like(x, tiny)
    r = where(eq(x, 0), where(gt(y, 0), tiny, neg(tiny)), stepped)
    r = where(eq(x, y), y, r)
    return where(logical_or(isnan(x), isnan(y)), float("nan"), r)


def gcd(input, other):
    _require_tensor("gcd", "input", input)
    _require_tensor("gcd", "other", other)
    return call("gcd", input, other)


def lcm(input, other):
    """|input / gcd * other| (integer division), 0 where the gcd is 0."""
    g = gcd(input, other)
    zero = eq(g, 0)
    r = abs(mul(floor_divide(input.to(g.dtype), where(zero, 1, g)), other.to(g.dtype)))
    return where(zero, 0, r)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """Whether each element of `elements` occurs in `test_elements` (either may be a
    number)."""
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise TypeError("isin() received an invalid combination of arguments - got "
                        f"({type(elements).__name__}, {type(test_elements).__name__}), but "
                        "expected at least one Tensor")
    if not isinstance(elements, Tensor):
        if not _is_number(elements):
            raise _type_error("isin", "element", elements)
        test = test_elements.reshape(-1)
        found = _any(call("eq_scalar", test, other=elements))
    elif not isinstance(test_elements, Tensor):
        if not _is_number(test_elements):
            raise _type_error("isin", "test_element", test_elements)
        found = call("eq_scalar", elements, other=test_elements)
    elif test_elements.numel() == 0:
        from .creation import zeros_like

        found = zeros_like(elements, dtype=dt.bool_)
    else:
        # Sort the test elements and binary-search each element: O((n + m) log m).
        test = test_elements.detach().reshape(-1).sort()[0]
        pos = call("searchsorted", test, elements.detach()).clamp(max=test.shape[0] - 1)
        picked = call("gather", test, pos.reshape(-1), dim=0).reshape(*elements.shape)
        found = eq(picked, elements.detach())
    return logical_not(found) if invert else found


def _any(t, dim=None):
    from .reduce import any as reduce_any

    return reduce_any(t, dim)


_POISSON_MAX_RATE = 1e4  # the steps grow with the rate: past this, minutes


def poisson(input, generator=None):
    """A Poisson count for each rate, by inverting the CDF: with one uniform draw u per
    element, the count is the number of k with P(X <= k) < u.  The k run from 0 to 12
    standard deviations past the largest rate (read on the host), each step a few
    whole-tensor ops; P(X = k) is formed in log space so that large rates do not underflow.
    No gradient (torch's is zero)."""
    import numpy as np

    from .creation import rand_like

    _require_tensor("poisson", "input", input)
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"\"poisson_cpu\" not implemented for '{_tname(input)}'")
    rate = input.detach().to(dt.float64)
    host = np.asarray(rate._host())
    if host.size and not (host >= 0).all():  # NaN too
        raise RuntimeError("invalid Poisson rate, expected rate to be non-negative")
    top = float(host.max()) if host.size else 0.0
    if top > _POISSON_MAX_RATE:
        raise NotImplementedError(f"poisson(): rates above {_POISSON_MAX_RATE:g} are not "
                                  f"supported (got {top:g})")
    u = rand_like(rate, generator=generator)
    log_rate = log(rate)
    count = mul(rate, 0.0)
    cdf = exp(neg(rate))  # P(0)
    steps = int(math.ceil(top + 12.0 * math.sqrt(top) + 12.0))
    for k in range(1, steps + 1):
        count = add(count, gt(u, cdf).to(dt.float64))
        # log P(k) = -rate + k log(rate) - log(k!); a zero rate has P(k) = 0 for k >= 1.
        log_p = sub(sub(mul(log_rate, float(k)), rate), math.lgamma(k + 1))
        cdf = add(cdf, exp(log_p))
    return count.to(input.dtype)


# -- operators ------------------------------------------------------------------------------
def _operator(name: str):
    """`t <op> other`: straight to the interpreter (the hot path of eager arithmetic)."""
    opdef, scalar_opdef = get_op(name), get_op(name + "_scalar")

    def method(self, other):
        if isinstance(other, Tensor):
            return apply(opdef, (self, other), {})
        if _is_number(other):
            return apply(scalar_opdef, (self,), {"other": other})
        return NotImplemented

    method.__name__ = name
    return method


def _reflected_operator(name: str):
    opdef, scalar_opdef = get_op(name), get_op(name + "_scalar")

    def method(self, other):
        if _is_number(other):
            return apply(scalar_opdef, (self,), {"other": other, "reverse": True})
        if isinstance(other, Tensor):
            return apply(opdef, (other, self), {})
        return NotImplemented

    method.__name__ = name
    return method


def _invert(self):
    if self.dtype.is_floating_point:
        raise TypeError("~ (operator.invert) is only implemented on integer and Boolean-type "
                        "tensors")
    return call("bitwise_not", self)


def _where_method(self, condition, other):
    return where(condition, self, other)


_OPERATORS = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "pow", "and": "bitwise_and", "or": "bitwise_or",
    "xor": "bitwise_xor",
}

_FUNCTIONS = {
    "add": add, "sub": sub, "subtract": sub, "mul": mul, "multiply": mul, "div": div,
    "divide": div, "true_divide": true_divide, "floor_divide": floor_divide,
    "remainder": remainder, "fmod": fmod, "pow": pow, "atan2": atan2, "arctan2": atan2,
    "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge, "not_equal": ne, "less": lt,
    "less_equal": le, "greater": gt, "greater_equal": ge,
    "logical_and": logical_and, "logical_or": logical_or, "logical_xor": logical_xor,
    "logical_not": logical_not, "bitwise_and": bitwise_and, "bitwise_or": bitwise_or,
    "bitwise_xor": bitwise_xor, "bitwise_not": bitwise_not,
    "neg": neg, "negative": neg, "abs": abs, "absolute": abs, "exp": exp, "expm1": expm1,
    "log": log, "log1p": log1p, "log2": log2, "log10": log10, "sqrt": sqrt, "rsqrt": rsqrt,
    "reciprocal": reciprocal, "square": square, "sin": sin, "cos": cos, "tan": tan,
    "asin": asin, "arcsin": asin, "acos": acos, "arccos": acos, "atan": atan, "arctan": atan,
    "sinh": sinh, "cosh": cosh, "tanh": tanh, "asinh": asinh, "arcsinh": asinh,
    "acosh": acosh, "arccosh": acosh, "atanh": atanh, "arctanh": atanh, "sigmoid": sigmoid,
    "erf": erf, "erfinv": erfinv, "floor": floor, "ceil": ceil, "round": round,
    "trunc": trunc, "fix": trunc, "frac": frac, "sign": sign, "clamp": clamp, "clip": clip,
    "clamp_min": clamp_min, "clamp_max": clamp_max, "lerp": lerp, "addcmul": addcmul,
    "addcdiv": addcdiv, "nan_to_num": nan_to_num,
}
# Methods without an in-place form in torch.
_OUT_OF_PLACE_ONLY = {
    "maximum": maximum, "minimum": minimum, "isnan": isnan, "isinf": isinf,
    "isfinite": isfinite, "positive": positive, "where": _where_method,
}

_FUNCTIONS.update({
    "copysign": copysign, "hypot": hypot, "heaviside": heaviside, "xlogy": xlogy,
    "sinc": sinc, "deg2rad": deg2rad, "rad2deg": rad2deg, "ldexp": ldexp,
    "nextafter": nextafter, "gcd": gcd, "lcm": lcm,
})


def exp2(input: Tensor) -> Tensor:
    """2 ** x, elementwise; an integer input gives the default float dtype, as torch."""
    if not input.dtype.is_floating_point:
        input = input.to(dt.get_default_dtype())
    return exp(input * math.log(2.0))


def erfc(input: Tensor) -> Tensor:
    """1 - erf(x).  Composed, so for x > ~4 (float32) it underflows to 0 where torch's
    dedicated kernel keeps the tiny tail value."""
    return 1.0 - erf(input)


_FUNCTIONS.update({"exp2": exp2, "erfc": erfc})
_OUT_OF_PLACE_ONLY.update({
    "isclose": isclose, "allclose": allclose, "equal": equal, "isposinf": isposinf,
    "isneginf": isneginf, "isreal": isreal, "signbit": signbit, "logaddexp": logaddexp,
    "logaddexp2": logaddexp2, "frexp": frexp,
})

METHODS = {**_FUNCTIONS, **_OUT_OF_PLACE_ONLY}
METHODS.update({k + "_": inplace_method(k + "_", fn) for k, fn in _FUNCTIONS.items()})
for _dunder, _name in _OPERATORS.items():
    METHODS[f"__{_dunder}__"] = _operator(_name)
    METHODS[f"__r{_dunder}__"] = _reflected_operator(_name)
    METHODS[f"__i{_dunder}__"] = inplace_method(_name + "_", _FUNCTIONS[_name])
for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    METHODS[f"__{_cmp}__"] = _operator(_cmp)
METHODS.update({"__neg__": neg, "__pos__": positive, "__abs__": abs, "__invert__": _invert})

__all__ = [
    "abs", "absolute", "acos", "acosh", "add", "addcdiv", "addcmul", "arccos", "arccosh",
    "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "asin", "asinh", "atan", "atan2",
    "atanh", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "ceil", "clamp",
    "clamp_max", "clamp_min", "clip", "cos", "cosh", "div", "divide", "eq", "erf", "erfinv",
    "exp", "expm1", "fix", "floor", "floor_divide", "fmod", "frac", "ge", "greater",
    "greater_equal", "gt", "isfinite", "isinf", "isnan", "le", "lerp", "less", "less_equal",
    "log", "log10", "log1p", "log2", "logical_and", "logical_not", "logical_or",
    "logical_xor", "lt", "maximum", "minimum", "mul", "multiply", "nan_to_num", "ne", "neg",
    "negative", "not_equal", "positive", "pow", "reciprocal", "remainder", "round", "rsqrt",
    "rsub", "sigmoid", "sign", "sin", "sinh", "sqrt", "square", "sub", "subtract", "tan",
    "tanh", "true_divide", "trunc", "where",
]

# torch's top-level in-place forms (torch.abs_(x) is x.abs_()).
_TOP_LEVEL_INPLACE = (
    "abs", "acos", "acosh", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh",
    "asin", "asinh", "atan", "atanh", "ceil", "clamp", "clamp_max", "clamp_min", "clip", "cos",
    "cosh", "deg2rad", "erf", "exp", "expm1", "fix", "floor", "frac", "gcd", "lcm", "ldexp",
    "log", "log10", "log1p", "log2", "nan_to_num", "neg", "negative", "rad2deg", "reciprocal",
    "round", "rsqrt", "sigmoid", "sin", "sinc", "sinh", "sqrt", "square", "tan", "tanh",
    "trunc", "xlogy",
)
for _name in _TOP_LEVEL_INPLACE:
    globals()[_name + "_"] = METHODS[_name + "_"]
__all__ += [n + "_" for n in _TOP_LEVEL_INPLACE]
__all__ += [
    "allclose", "copysign", "deg2rad", "equal", "erfc", "exp2", "isin", "frexp", "gcd",
    "heaviside", "hypot",
    "isclose", "isneginf", "isposinf", "isreal", "lcm", "ldexp", "logaddexp", "logaddexp2",
    "nextafter", "poisson", "rad2deg", "signbit", "sinc", "xlogy",
]
