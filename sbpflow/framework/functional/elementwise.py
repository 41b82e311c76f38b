"""Elementwise functions and operators.

Python numbers go to the `<op>_scalar` ops as attrs (never wrapped in tensors); a number in
first position sets `reverse=True`.  Operators return NotImplemented for operands they do not
take, so Python raises its own TypeError (and `t == None` is False), as with torch.
"""

from __future__ import annotations

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


# -- operators ------------------------------------------------------------------------------
def _operator(name: str):
    scalar_name = name + "_scalar"

    def method(self, other):
        if isinstance(other, Tensor):
            return call(name, self, other)
        if _is_number(other):
            return call(scalar_name, self, other=other)
        return NotImplemented

    method.__name__ = name
    return method


def _reflected_operator(name: str):
    scalar_name = name + "_scalar"

    def method(self, other):
        if _is_number(other):
            return call(scalar_name, self, other=other, reverse=True)
        if isinstance(other, Tensor):
            return call(name, other, self)
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
