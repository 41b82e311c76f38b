"""Elementwise functions and operators."""

from __future__ import annotations

from ._base import call, inplace_method, is_scalar, is_tensor


def _binary(name: str, scalar_name: str | None = None):
    scalar_name = scalar_name or name + "_scalar"

    def fn(input, other):
        if is_tensor(input):
            if is_tensor(other):
                return call(name, input, other)
            if is_scalar(other):
                return call(scalar_name, input, other=other)
        elif is_scalar(input) and is_tensor(other):
            return call(scalar_name, other, other=input, reverse=True)
        raise TypeError(
            f"{name}(): argument 'other' must be Tensor or Number, not {type(other).__name__}"
        )

    fn.__name__ = name
    return fn


mul = _binary("mul")
_add = _binary("add")


def add(input, other, *, alpha=1):
    if alpha != 1:
        other = mul(other, alpha)
    return _add(input, other)


def sub(input, other, *, alpha=1):
    return add(input, neg(other) if is_tensor(other) else -other, alpha=alpha)


def neg(input):
    return call("neg", input)


def exp(input):
    return call("exp", input)


def _reflected(fn):
    return lambda self, other: fn(other, self)


METHODS = {
    "add": add, "sub": sub, "mul": mul, "neg": neg, "exp": exp,
    "__add__": add, "__radd__": _reflected(add), "__sub__": sub,
    "__rsub__": _reflected(sub), "__mul__": mul, "__rmul__": _reflected(mul),
    "__neg__": neg,
    "__iadd__": inplace_method("add_", add), "__isub__": inplace_method("sub_", sub),
    "__imul__": inplace_method("mul_", mul),
}
METHODS.update({k + "_": inplace_method(k + "_", METHODS[k]) for k in ("add", "sub", "mul",
                                                                        "neg", "exp")})

__all__ = ["add", "exp", "mul", "neg", "sub"]
