"""Elementwise ops: unary math, binary arithmetic with broadcasting and type promotion, and
their scalar forms (OneFlow's scalar_add etc.), which avoid materialising a Python number as a
tensor and promote it as torch promotes a wrapped number.

Scalar forms take the number as attr `other`; `reverse=True` puts it first (`2 - x`, `2 / x`,
`2 ** x`).  Kernels compute in the promoted dtype (comparisons too) and cast only when an input
differs from it.
"""

from __future__ import annotations

import math

import numpy as np

from .._core import dtype as dt
from .._core.errors import broadcast_shapes, op_error
from .._core.meta import TensorMeta
from ..sbp import elementwise_signatures
from ._util import binary_meta, cast_array, float_result, promote, unbroadcast
from .registry import Attr, OpDef, Sample, op, register

_TORCH_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half",
               "bfloat16": "BFloat16", "int64": "Long", "int32": "Int", "int16": "Short",
               "int8": "Char", "uint8": "Byte", "bool": "Bool"}


def _not_implemented(name: str, d: dt.DType) -> Exception:
    # torch raises NotImplementedError (a RuntimeError) for a kernel missing for a dtype.
    return op_error(name, f"\"{name}\" not implemented for '{_TORCH_TYPE[d.name]}'",
                    NotImplementedError)


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _uniform(rng, lo, hi, *shape, dtype=np.float64):
    return rng.uniform(lo, hi, shape).astype(dtype)


def _away_from_zero(rng, *shape, dtype=np.float64):
    """Values with 0.5 <= |v| < 2, random sign: safe divisors."""
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _ints(rng, lo, hi, *shape, dtype=np.int64):
    return rng.integers(lo, hi, shape).astype(dtype)


def _scalar_array(ctx, value, d: dt.DType):
    """A 0-d device array holding `value` in dtype d, as torch casts a wrapped number: integers
    wrap modulo 2**bits (int8 + 1000 adds -24), floats truncate toward zero."""
    if d.category == 1:  # integral
        if isinstance(value, float):
            value = int(value) if math.isfinite(value) else 0
        bits = 8 * d.itemsize
        value = int(value) % (1 << bits)
        if d.is_signed and value >= 1 << (bits - 1):
            value -= 1 << bits
    return ctx.prims.full((), d, value)


_C_TYPE = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int",
           "int64": "int64_t", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
           "float32": "float"}


def _check_fits(name: str, value, d: dt.DType) -> None:
    """torch refuses a number outside d's range where it converts one without wrapping
    (pow's exponent, clamp's bounds, where's and addcmul's numbers)."""
    if d is dt.bool_ or d is dt.float64 or isinstance(value, bool):
        return
    if d.category == 1:
        info = np.iinfo(d.np)
        fits = not isinstance(value, int) or info.min <= value <= info.max
    else:
        fits = (isinstance(value, float) and not math.isfinite(value)) or abs(
            value) <= _finfo_max(d)
    if not fits:
        raise op_error(name, f"value cannot be converted to type {_C_TYPE[d.name]} without "
                       "overflow")


def _zeros(meta: TensorMeta, like):
    # On the upstream gradient's device (or placement, for a global op), not the default.
    return op("full", shape=meta.shape, fill_value=0.0, dtype=meta.dtype,
              _device=like._where())


def _masked(mask, g):
    """where(mask, g, 0)."""
    return op("where_scalar", mask, g, other=0)


def _masked_out(mask, g):
    """where(mask, 0, g)."""
    return op("where_scalar", mask, g, other=0, reverse=True)


# -- clone / cast ---------------------------------------------------------------------------
register(OpDef(
    "clone",
    inputs=("input",),
    infer_meta=lambda x: x,
    kernel=lambda ctx, x: ctx.prims.contiguous(x),
    grad=lambda ctx, g: (g,),
    saves=(),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape, partial=[("P",)]),
    reference="clone",
    samples=lambda rng: [Sample(_rand(rng, 2, 3)), Sample(_rand(rng, 4).astype(np.int32))],
))


def _to_dtype_grad(ctx, g):
    return (op("to_dtype", g, dtype=ctx.in_metas[0].dtype),)


def _to_dtype_sbp(x, dtype):
    # (P)->P: a widening float cast, int -> float, and int -> int (modular) are additive.  A
    # narrowing float cast rounds each piece (the sum drifts), float -> int truncates and
    # -> bool saturates: not additive.
    src = x.dtype
    if dtype.is_floating_point:
        additive = not src.is_floating_point or src is dtype or dtype.itemsize > src.itemsize
    else:
        additive = src.category == 1 and dtype.category == 1
    return elementwise_signatures([x.shape], x.shape, partial=[("P",)] if additive else [])


register(OpDef(
    "to_dtype",
    inputs=("input",),
    attrs={"dtype": Attr("dtype")},
    infer_meta=lambda x, dtype: TensorMeta(x.shape, dtype),
    kernel=lambda ctx, x, dtype: ctx.prims.cast(x, dtype),
    grad=_to_dtype_grad,
    saves=(),
    sbp=_to_dtype_sbp,
    reference=lambda torch, x, dtype: x.to(dtype),  # the harness passes a torch dtype
    # Finite differences need a float64 result; narrowing casts are checked forward only.
    samples=lambda rng: [Sample(_rand(rng, 2, 3), dtype=dt.float64),
                         Sample(_rand(rng, 2, 3, dtype=np.float32), dtype=dt.float64),
                         Sample(_rand(rng, 2, 3), dtype=dt.float32, grad=False),
                         Sample(_rand(rng, 3), dtype=dt.float16, grad=False),
                         Sample(_rand(rng, 3) * 10, dtype=dt.int32, grad=False),
                         Sample(_ints(rng, -9, 9, 4), dtype=dt.float32),
                         Sample(_ints(rng, -9, 9, 4), dtype=dt.int8),
                         Sample(_rand(rng, 4), dtype=dt.bool_, grad=False)],
))


# -- dtype rules shared by the tensor and scalar forms ---------------------------------------
def _check_sub(name, a_is_bool: bool, b_is_bool: bool):
    if a_is_bool and b_is_bool:
        raise op_error(name, "Subtraction, the `-` operator, with two bool tensors is not "
                       "supported. Use the `^` or `logical_xor()` operator instead.")
    if a_is_bool or b_is_bool:
        raise op_error(name, "Subtraction, the `-` operator, with a bool tensor is not "
                       "supported. If you are trying to invert a mask, use the `~` or "
                       "`logical_not()` operator instead.")


def _no_bool(name, d: dt.DType):
    if d is dt.bool_:
        raise _not_implemented(name, d)
    return d


def _integral_only(name, d: dt.DType):
    if d.is_floating_point:
        raise _not_implemented(name, d)
    return d


_ROUNDING_MODES = (None, "trunc", "floor")


def _div_dtype(name, d: dt.DType, rounding_mode):
    if rounding_mode not in _ROUNDING_MODES:
        raise op_error(name, "div expected rounding_mode to be one of None, 'trunc', or "
                       f"'floor' but found '{rounding_mode}'")
    if rounding_mode is None:
        return d if d.is_floating_point else dt.get_default_dtype()
    return _no_bool(name, d)


def _float_dtype(d: dt.DType) -> dt.DType:
    return d if d.is_floating_point else dt.get_default_dtype()


# Output dtype of each binary op from the promoted dtype (None: the promoted dtype itself).
_RESULT = {
    "add": None,
    "sub": None,
    "mul": None,
    "floor_divide": lambda d: _no_bool("floor_divide", d),
    "remainder": lambda d: _no_bool("remainder", d),
    "fmod": lambda d: _no_bool("fmod", d),
    "pow": lambda d: _no_bool("pow", d),
    "maximum": None,
    "minimum": None,
    "atan2": _float_dtype,
    "bitwise_and": lambda d: _integral_only("bitwise_and", d),
    "bitwise_or": lambda d: _integral_only("bitwise_or", d),
    "bitwise_xor": lambda d: _integral_only("bitwise_xor", d),
}
_COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
_LOGICAL = ("logical_and", "logical_or", "logical_xor")


def _binary_meta(name):
    rule = _RESULT[name]

    def infer(a, b):
        if name == "sub":
            _check_sub(name, a.dtype is dt.bool_, b.dtype is dt.bool_)
        m = binary_meta(name, a, b)
        return m if rule is None else TensorMeta(m.shape, rule(m.dtype))

    return infer


def _scalar_meta_fn(name):
    rule = _RESULT[name]

    def infer(x, other, reverse=False):
        if name == "sub":
            _check_sub(name, x.dtype is dt.bool_, isinstance(other, bool))
        d = promote((x,), (other,))
        return TensorMeta(x.shape, d if rule is None else rule(d))

    return infer


# -- binary kernels -------------------------------------------------------------------------
def _int_pow_fix(ctx, base, exponent, out, p):
    """torch's integer pow for negative exponents: 1/base**|e| truncated, so 0 except for
    base 1 (1) and base -1 (+-1).  `p` is base ** |exponent|."""
    prims = ctx.prims
    zero = _scalar_array(ctx, 0, out)
    negative = prims.binary("lt", exponent, zero)
    unit = prims.binary("eq", prims.unary("abs", base), _scalar_array(ctx, 1, out))
    return prims.where(prims.binary("logical_and", negative, prims.unary("logical_not", unit)),
                       zero, p)


def _pow_arrays(ctx, base, exponent, out):
    prims = ctx.prims
    if out.category == 1 and out.is_signed:
        # NumPy rejects negative integer exponents; compute base ** |e| and patch as torch.
        p = prims.binary("pow", base, prims.unary("abs", exponent))
        return _int_pow_fix(ctx, base, exponent, out, p)
    return prims.binary("pow", base, exponent)


def _trunc_divide(ctx, a, b, d: dt.DType):
    prims = ctx.prims
    if d.is_floating_point:
        return prims.unary("trunc", prims.binary("div", a, b))
    # Integer floor division rounds down; truncation differs by one where the quotient is
    # negative and inexact.
    q = prims.binary("floor_divide", a, b)
    zero = _scalar_array(ctx, 0, d)
    inexact = prims.binary("ne", prims.binary("remainder", a, b), zero)
    negative = prims.binary("logical_xor", prims.binary("lt", a, zero),
                            prims.binary("lt", b, zero))
    bump = prims.cast(prims.binary("logical_and", inexact, negative), d)
    return prims.binary("add", q, bump)


def _div_arrays(ctx, a, b, d, rounding_mode):
    if rounding_mode is None:
        return ctx.prims.binary("div", a, b)
    if rounding_mode == "floor":
        return ctx.prims.binary("floor_divide", a, b)
    return _trunc_divide(ctx, a, b, d)


def _binary_kernel(name):
    def kernel(ctx, a, b):
        out = ctx.out_metas[0].dtype
        a = cast_array(ctx, a, ctx.in_metas[0].dtype, out)
        b = cast_array(ctx, b, ctx.in_metas[1].dtype, out)
        if name == "pow":
            return _pow_arrays(ctx, a, b, out)
        return ctx.prims.binary(name, a, b)

    return kernel


def _direct_binary(name):
    """specialize: the primitive's own function when no operand needs a cast (not for pow,
    whose kernel handles integer powers itself)."""
    def specialize(ctx, attrs):
        out = ctx.out_metas[0]
        if (not out.shape or ctx.in_metas[0].dtype is not out.dtype
                or ctx.in_metas[1].dtype is not out.dtype):
            return None
        return ctx.prims.direct_elementwise(name)

    return specialize


def _div_kernel(ctx, a, b, rounding_mode=None):
    out = ctx.out_metas[0].dtype
    a = cast_array(ctx, a, ctx.in_metas[0].dtype, out)
    b = cast_array(ctx, b, ctx.in_metas[1].dtype, out)
    return _div_arrays(ctx, a, b, out, rounding_mode)


def _compare_kernel(name):
    def kernel(ctx, a, b):
        ma, mb = ctx.in_metas
        d = promote((ma, mb))
        return ctx.prims.binary(name, cast_array(ctx, a, ma.dtype, d),
                                cast_array(ctx, b, mb.dtype, d))

    return kernel


def _logical_kernel(name):
    def kernel(ctx, a, b):
        return ctx.prims.binary(name, a, b)

    return kernel


# -- binary grads ---------------------------------------------------------------------------
def _add_grad(ctx, g):
    (a, b), need = ctx.in_metas, ctx.needs_input_grad
    return (unbroadcast(g, a) if need[0] else None), (unbroadcast(g, b) if need[1] else None)


def _sub_grad(ctx, g):
    (a, b), need = ctx.in_metas, ctx.needs_input_grad
    return ((unbroadcast(g, a) if need[0] else None),
            (unbroadcast(op("neg", g), b) if need[1] else None))


def _mul_grad(ctx, g):
    ga = unbroadcast(op("mul", g, ctx.input(1)), ctx.in_metas[0]) \
        if ctx.needs_input_grad[0] else None
    gb = unbroadcast(op("mul", g, ctx.input(0)), ctx.in_metas[1]) \
        if ctx.needs_input_grad[1] else None
    return ga, gb


def _div_grad(ctx, g):
    ma, mb = ctx.in_metas
    if ctx.attrs["rounding_mode"] is not None:
        # Piecewise constant: zero almost everywhere, as torch.
        return (_zeros(ma, g) if ctx.needs_input_grad[0] else None,
                _zeros(mb, g) if ctx.needs_input_grad[1] else None)
    b = ctx.input(1)
    ga = unbroadcast(op("div", g, b), ma) if ctx.needs_input_grad[0] else None
    gb = None
    if ctx.needs_input_grad[1]:
        # torch: -grad * ((a / b) / b)
        q = op("div", op("div", ctx.input(0), b), b)
        gb = unbroadcast(op("neg", op("mul", g, q)), mb)
    return ga, gb


def _zero_grads(ctx, g):
    return tuple(_zeros(m, g) if need else None
                 for m, need in zip(ctx.in_metas, ctx.needs_input_grad, strict=True))


def _rounded_quotient_grad(rounding_mode):
    """remainder (floor) and fmod (trunc): a - b * q(a / b); d/da = 1, d/db = -q."""

    def grad(ctx, g):
        ma, mb = ctx.in_metas
        gb = None
        if ctx.needs_input_grad[1]:
            q = op("div", ctx.input(0), ctx.input(1), rounding_mode=rounding_mode)
            gb = unbroadcast(op("neg", op("mul", g, q)), mb)
        return unbroadcast(g, ma), gb

    return grad


def _pow_grad(ctx, g):
    ma, mb = ctx.in_metas
    ga = gb = None
    if ctx.needs_input_grad[0]:
        a, b = ctx.input(0), ctx.input(1)
        d = op("mul", b, op("pow", a, op("sub_scalar", b, other=1)))
        # torch: zero where the exponent is 0, even at a == 0 where d is nan.
        ga = unbroadcast(_masked_out(op("eq_scalar", b, other=0), op("mul", g, d)), ma)
    if ctx.needs_input_grad[1]:
        a, b = ctx.input(0), ctx.input(1)
        d = op("mul", ctx.output(0), op("log", a))
        # torch masks log(0) where the base is 0 and the exponent >= 0 (the limit is 0).
        zero_base = op("logical_and", op("eq_scalar", a, other=0), op("ge_scalar", b, other=0))
        gb = unbroadcast(op("mul", g, _masked_out(zero_base, d)), mb)
    return ga, gb


def _extremum_grad(less):
    """maximum (less="lt") and minimum (less="gt"): ties split the gradient equally."""
    more = "gt" if less == "lt" else "lt"

    def grad(ctx, g):
        a, b = ctx.inputs
        shared = op("where", op("eq", a, b), op("mul_scalar", g, other=0.5), g)
        ga = unbroadcast(_masked_out(op(less, a, b), shared), ctx.in_metas[0]) \
            if ctx.needs_input_grad[0] else None
        gb = unbroadcast(_masked_out(op(more, a, b), shared), ctx.in_metas[1]) \
            if ctx.needs_input_grad[1] else None
        return ga, gb

    return grad


def _atan2_grad(ctx, g):
    a, b = ctx.inputs
    denom = op("add", op("mul", a, a), op("mul", b, b))
    ga = unbroadcast(op("div", op("mul", g, b), denom), ctx.in_metas[0]) \
        if ctx.needs_input_grad[0] else None
    gb = unbroadcast(op("div", op("mul", g, op("neg", a)), denom), ctx.in_metas[1]) \
        if ctx.needs_input_grad[1] else None
    return ga, gb


# -- binary samples -------------------------------------------------------------------------
def _binary_samples(rng):
    return [
        Sample(_rand(rng, 2, 3), _rand(rng, 2, 3)),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1)),
        Sample(_rand(rng, 3), np.asarray(1.5)),
        Sample(np.asarray(-0.5), _rand(rng, 2, 2)),
        Sample(_rand(rng, 5, 3).astype(np.float32), _rand(rng, 3)),
        Sample((_rand(rng, 2, 3) * 5).astype(np.int64), _rand(rng, 3).astype(np.float32)),
        Sample(_ints(rng, -9, 9, 2, 3, dtype=np.int32), _ints(rng, -9, 9, 3, dtype=np.int8),
               grad=False),
    ]


def _divisor_samples(rng, integer_divisors=True, grad=True):
    samples = [
        Sample(_rand(rng, 2, 3) * 3, _away_from_zero(rng, 2, 3), grad=grad),
        Sample(_rand(rng, 4, 1, 3) * 3, _away_from_zero(rng, 2, 1), grad=grad),
        Sample(_rand(rng, 3) * 3, np.asarray(-1.25), grad=grad),
        Sample(_rand(rng, 5, 3).astype(np.float32) * 3, _away_from_zero(rng, 3), grad=grad),
        Sample(_ints(rng, -20, 20, 2, 3), _away_from_zero(rng, 3, dtype=np.float32),
               grad=False),
    ]
    if integer_divisors:
        b = _ints(rng, 1, 6, 3, 4) * rng.choice([-1, 1], (3, 4))
        samples.append(Sample(_ints(rng, -30, 30, 3, 4), b, grad=False))
        samples.append(Sample(_ints(rng, -30, 30, 4, dtype=np.int32),
                              (b[0] * 1).astype(np.int8), grad=False))
    return samples


def _pow_samples(rng):
    return [
        Sample(_uniform(rng, 0.5, 2.0, 2, 3), _rand(rng, 2, 3)),
        Sample(_uniform(rng, 0.5, 2.0, 4, 1, 3), _rand(rng, 2, 1)),
        Sample(_uniform(rng, 0.5, 2.0, 3), np.asarray(2.5)),
        Sample(np.asarray(1.7), _rand(rng, 3)),
        Sample(_rand(rng, 2, 3), np.array([0.0, 1.0, 2.0]), grad=False),
        Sample(_uniform(rng, 0.5, 2.0, 5, 3).astype(np.float32), _rand(rng, 3)),
        Sample(_ints(rng, -4, 5, 3, 4), _ints(rng, 0, 4, 4), grad=False),
        Sample(np.array([2, 1, -1, -1, 0, 3]), np.array([-1, -2, -3, -2, 2, 0]), grad=False),
        Sample(_ints(rng, -4, 5, 2, 3, dtype=np.int32), _uniform(rng, -1, 1, 3, dtype=np.float32),
               grad=False),
    ]


def _extremum_samples(rng):
    a = _rand(rng, 3, 4)
    b = _rand(rng, 3, 4)
    b[0, :2] = a[0, :2]  # ties: torch splits the gradient, as central differences do
    return _binary_samples(rng) + [
        Sample(a, b),
        Sample(np.array([True, False, True]), np.array([False, False, True]), grad=False),
    ]


def _compare_samples(rng):
    a = _ints(rng, -3, 3, 3, 4)
    return [
        Sample(a, _ints(rng, -3, 3, 3, 4)),
        Sample(a.astype(np.float64), _ints(rng, -3, 3, 4).astype(np.float32)),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1)),
        Sample(np.array([16777217, 3]), np.array([16777216.0, 3.0], dtype=np.float32)),
        Sample(np.array([True, False]), np.array([0.0, 0.0])),
        Sample(np.asarray(1.5), _rand(rng, 3)),
        Sample(np.array([np.nan, 1.0, np.inf]), np.array([np.nan, 1.0, np.inf])),
    ]


def _logical_samples(rng):
    a = _rand(rng, 3, 4)
    a[a < 0] = 0
    return [
        Sample(a, _ints(rng, 0, 2, 3, 4)),
        Sample(rng.random((4, 1, 3)) > 0.5, rng.random((2, 1)) > 0.5),
        Sample(np.asarray(0.0), _ints(rng, 0, 2, 3, dtype=np.int32)),
        Sample(np.array([np.nan, 0.0]), np.array([0.0, 0.0], dtype=np.float32)),
    ]


def _bitwise_samples(rng):
    return [
        Sample(_ints(rng, -50, 50, 3, 4), _ints(rng, -50, 50, 3, 4)),
        Sample(_ints(rng, -50, 50, 4, 1, 3, dtype=np.int32), _ints(rng, 0, 50, 2, 1,
                                                                   dtype=np.uint8)),
        Sample(rng.random((3, 2)) > 0.5, rng.random((3, 2)) > 0.5),
        Sample(rng.random(4) > 0.5, _ints(rng, -9, 9, 4, dtype=np.int16)),
    ]


# -- binary registrations -------------------------------------------------------------------
def _register_binary(name, *, grad=None, saves=None, partial=(), samples=_binary_samples,
                     doc=""):
    meta = _binary_meta(name)
    register(OpDef(
        name,
        inputs=("input", "other"),
        infer_meta=meta,
        kernel=_binary_kernel(name),
        specialize=None if name == "pow" else _direct_binary(name),
        grad=grad,
        saves=saves,
        sbp=lambda a, b: elementwise_signatures([a.shape, b.shape], meta(a, b).shape,
                                                partial=partial),
        reference=name,
        samples=samples,
        doc=doc,
    ))


_BOTH = ("input", "other")
_CROSS = ("input for other", "other for input")  # each operand only for the other's grad
_FOR_OTHER = ("input for other", "other for other")
# (P,P)->P: sum of sums; (P,P)->P for sub: linear jointly.
_register_binary("add", grad=_add_grad, saves=(), partial=[("P", "P")])
_register_binary("sub", grad=_sub_grad, saves=(), partial=[("P", "P")])
# (P,B)->P and (B,P)->P: linear in each operand separately, never (P,P).
_register_binary("mul", grad=_mul_grad, saves=_CROSS, partial=[("P", "B"), ("B", "P")])
# floor_divide, remainder, fmod, pow, maximum, minimum, atan2: no P rule, not linear.
# torch has no derivative for floor_divide: its samples check the forward only.
_register_binary("floor_divide", grad=_zero_grads, saves=(),
                 samples=lambda rng: _divisor_samples(rng, grad=False))
_register_binary("remainder", grad=_rounded_quotient_grad("floor"), saves=_FOR_OTHER,
                 samples=_divisor_samples)
_register_binary("fmod", grad=_rounded_quotient_grad("trunc"), saves=_FOR_OTHER,
                 samples=_divisor_samples)
_register_binary("pow", grad=_pow_grad, saves=(*_BOTH, "out for other"),
                 samples=_pow_samples)
_register_binary("maximum", grad=_extremum_grad("lt"), saves=_BOTH, samples=_extremum_samples)
_register_binary("minimum", grad=_extremum_grad("gt"), saves=_BOTH, samples=_extremum_samples)
_register_binary("atan2", grad=_atan2_grad, saves=_BOTH)
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _register_binary(_name, samples=_bitwise_samples)  # no P rule: not linear


def _div_meta(a, b, rounding_mode=None):
    m = binary_meta("div", a, b)
    return TensorMeta(m.shape, _div_dtype("div", m.dtype, rounding_mode))


def _div_sbp(a, b, rounding_mode=None):
    shape = _div_meta(a, b, rounding_mode).shape
    # (P,B)->P: a / b is linear in a (true division only; rounding is not linear).
    partial = [("P", "B")] if rounding_mode is None else []
    return elementwise_signatures([a.shape, b.shape], shape, partial=partial)


def _div_samples(rng):
    samples = _divisor_samples(rng)
    for s in samples[:5]:
        samples.append(Sample(*s.inputs, grad=s.grad, rounding_mode="trunc"))
    samples += [Sample(*samples[5].inputs, grad=False, rounding_mode="floor"),
                Sample(*samples[6].inputs, grad=False, rounding_mode="trunc"),
                Sample(*samples[0].inputs, rounding_mode="floor")]
    return samples


register(OpDef(
    "div",
    inputs=("input", "other"),
    attrs={"rounding_mode": Attr("str", None)},
    infer_meta=_div_meta,
    kernel=_div_kernel,
    grad=_div_grad,
    saves=("input for other", "other"),
    sbp=_div_sbp,
    reference="div",
    samples=_div_samples,
))


def _compare_meta(name):
    def infer(a, b):
        return binary_meta(name, a, b, out_dtype=dt.bool_)

    return infer


for _name in _COMPARISONS:
    register(OpDef(
        _name,
        inputs=("input", "other"),
        infer_meta=_compare_meta(_name),
        kernel=_compare_kernel(_name),
        # Comparisons are not linear: no P rule.
        sbp=lambda a, b: elementwise_signatures([a.shape, b.shape],
                                                broadcast_shapes("compare", a.shape, b.shape)),
        reference=_name,
        samples=_compare_samples,
    ))

for _name in _LOGICAL:
    register(OpDef(
        _name,
        inputs=("input", "other"),
        infer_meta=_compare_meta(_name),
        kernel=_logical_kernel(_name),
        sbp=lambda a, b: elementwise_signatures([a.shape, b.shape],
                                                broadcast_shapes("logical", a.shape, b.shape)),
        reference=_name,
        samples=_logical_samples,
    ))


# -- scalar forms ---------------------------------------------------------------------------
def _scalar_kernel(name):
    def kernel(ctx, x, other, reverse=False):
        out = ctx.out_metas[0].dtype
        if out is dt.bool_ and name == "pow":  # x ** True is x; x ** False is all True
            return ctx.prims.contiguous(x) if other else ctx.prims.full(
                ctx.out_metas[0].shape, dt.bool_, True)
        x = cast_array(ctx, x, ctx.in_metas[0].dtype, out)
        s = _scalar_array(ctx, other, out)
        if reverse:
            x, s = s, x
        if name == "pow":
            return _pow_arrays(ctx, x, s, out)
        return ctx.prims.binary(name, x, s)

    return kernel


def _direct_scalar(name):
    """specialize: x (op) s with the 0-d constant s made once per cached call, when x
    needs no cast."""
    def specialize(ctx, attrs):
        out = ctx.out_metas[0]
        if not out.shape or ctx.in_metas[0].dtype is not out.dtype:
            return None
        f = ctx.prims.direct_elementwise(name)
        if f is None:
            return None
        s = _scalar_array(ctx, attrs["other"], out.dtype)
        if attrs["reverse"]:
            return lambda x: f(s, x)
        return lambda x: f(x, s)

    return specialize


def _scalar_compare_kernel(name):
    def kernel(ctx, x, other, reverse=False):
        m = ctx.in_metas[0]
        d = promote((m,), (other,))
        x = cast_array(ctx, x, m.dtype, d)
        s = _scalar_array(ctx, other, d)
        return ctx.prims.binary(name, s, x) if reverse else ctx.prims.binary(name, x, s)

    return kernel


def _scalar_reference(fn):
    return lambda torch, x, other, reverse=False: fn(other, x) if reverse else fn(x, other)


def _scalar_samples(rng):
    return [Sample(_rand(rng, 2, 3), other=2.5), Sample(_rand(rng, 3), other=-1),
            Sample(_rand(rng, 3).astype(np.float32), other=3.0, reverse=True),
            Sample(np.asarray(0.75), other=-2.0),
            Sample(_rand(rng, 2, 2), other=1.5, reverse=True),
            Sample((_rand(rng, 4) * 4).astype(np.int32), other=2, grad=False),
            Sample((_rand(rng, 4) * 4).astype(np.int64), other=0.5, grad=False),
            Sample(_ints(rng, -5, 5, 4, dtype=np.int8), other=1000, grad=False),
            Sample(_ints(rng, 0, 5, 4, dtype=np.uint8), other=7, reverse=True, grad=False)]


def _scalar_divisor_samples(rng, grad=True, reverse_grad=True):
    return [Sample(_rand(rng, 2, 3) * 3, other=1.5, grad=grad),
            Sample(_rand(rng, 3) * 3, other=-2, grad=grad),
            Sample(_away_from_zero(rng, 3).astype(np.float32), other=3.0, reverse=True,
                   grad=grad and reverse_grad),
            Sample(_away_from_zero(rng, 2, 2), other=-2.5, reverse=True,
                   grad=grad and reverse_grad),
            Sample(np.asarray(2.75), other=0.5, grad=grad),
            Sample(_ints(rng, -20, 20, 6), other=3, grad=False),
            Sample(_ints(rng, -20, 20, 6, dtype=np.int32), other=-4, grad=False),
            Sample(_ints(rng, 1, 5, 6) * rng.choice([-1, 1], 6), other=7, reverse=True,
                   grad=False),
            Sample(_ints(rng, -20, 20, 6), other=2.5, grad=False)]


_SCALAR_ATTRS = {"other": Attr("scalar"), "reverse": Attr("bool", False)}


def _neg_scalar_grad(ctx, g):
    return (op("neg", g) if ctx.attrs["reverse"] else g,)


def _mul_scalar_grad(ctx, g):
    return (op("mul_scalar", g, other=ctx.attrs["other"]),)


def _scalar_rounded_quotient_grad(rounding_mode):
    def grad(ctx, g):
        if not ctx.attrs["reverse"]:
            return (g,)
        # s - x * q(s / x): d/dx = -q(s / x)
        q = op("div_scalar", ctx.input(0), other=ctx.attrs["other"], reverse=True,
               rounding_mode=rounding_mode)
        return (op("neg", op("mul", g, q)),)

    return grad


def _pow_scalar_grad(ctx, g):
    s = ctx.attrs["other"]
    m = ctx.in_metas[0]
    if not ctx.attrs["reverse"]:  # x ** s
        if s == 0:
            return (_zeros(m, g),)
        d = op("mul_scalar", op("pow_scalar", ctx.input(0), other=s - 1), other=s)
        return (op("mul", g, d),)
    # s ** x: d/dx = s ** x * log(s); torch masks s == 0 with x >= 0 (the limit there is 0).
    gy = op("mul", g, ctx.output(0))
    if s == 0:
        return (_masked_out(op("ge_scalar", ctx.input(0), other=0),
                            op("mul_scalar", gy, other=-math.inf)),)
    return (op("mul_scalar", gy, other=math.log(s) if s > 0 else math.nan),)


def _register_scalar(name, *, grad=None, saves=None, partial=(), reference,
                     samples=_scalar_samples):
    meta = _scalar_meta_fn(name)
    register(OpDef(
        name + "_scalar",
        inputs=("input",),
        attrs=_SCALAR_ATTRS,
        infer_meta=meta,
        kernel=_scalar_kernel(name),
        specialize=None if name == "pow" else _direct_scalar(name),
        grad=grad,
        saves=saves,
        sbp=lambda x, other, reverse: elementwise_signatures([x.shape], x.shape,
                                                             partial=partial),
        reference=_scalar_reference(reference),
        samples=samples,
    ))


def _pow_scalar_meta(x, other, reverse=False):
    if not reverse and x.dtype is dt.bool_ and isinstance(other, bool):
        return x  # torch: a bool tensor to a bool power stays bool
    m = _scalar_meta_fn("pow")(x, other, reverse)
    if not reverse:
        if m.dtype.category == 1 and not isinstance(other, bool) and isinstance(
                other, int) and other < 0:
            raise op_error("pow", "Integers to negative integer powers are not allowed.")
        _check_fits("pow", other, m.dtype)
    return m


def _pow_scalar_samples(rng):
    return [Sample(_uniform(rng, 0.5, 2, 2, 3), other=2.5), Sample(_rand(rng, 3), other=2),
            Sample(_rand(rng, 3), other=0), Sample(_uniform(rng, 0.5, 2, 3), other=-1.5),
            Sample(_rand(rng, 3).astype(np.float32), other=3.0, reverse=True),
            Sample(_rand(rng, 2, 2), other=1.5, reverse=True),
            # 0 ** x: torch masks the exponent's gradient for x >= 0 (inf below).
            Sample(np.array([-1.0, 0.0, 1.5]), other=0.0, reverse=True, grad=False),
            Sample(np.asarray(0.75), other=0.5, reverse=True),
            Sample(_ints(rng, -4, 4, 4, dtype=np.int32), other=3, grad=False),
            Sample(_ints(rng, -4, 4, 4), other=0.5, grad=False),
            Sample(_ints(rng, -3, 4, 6), other=2, reverse=True, grad=False),
            Sample(np.array([-2, -1, 0, 1]), other=-1, reverse=True, grad=False),
            Sample(np.array([True, False]), other=2, grad=False)]


_register_scalar("add", grad=lambda ctx, g: (g,), saves=(), reference=lambda a, b: a + b)
_register_scalar("sub", grad=_neg_scalar_grad, saves=(), reference=lambda a, b: a - b)
# (P)->P: x * s is linear in x.
_register_scalar("mul", grad=_mul_scalar_grad, saves=(), partial=[("P",)],
                 reference=lambda a, b: a * b)
# torch has no derivative for floor_divide, nor for remainder(Scalar, Tensor): those samples
# check the forward only (tests/ops/test_elementwise_extra.py checks the rules).
_register_scalar("floor_divide", grad=_zero_grads, saves=(), reference=lambda a, b: a // b,
                 samples=lambda rng: _scalar_divisor_samples(rng, grad=False))
_register_scalar("remainder", grad=_scalar_rounded_quotient_grad("floor"), saves=("input",),
                 reference=lambda a, b: a % b,
                 samples=lambda rng: _scalar_divisor_samples(rng, reverse_grad=False))
_register_scalar("fmod", grad=_scalar_rounded_quotient_grad("trunc"), saves=("input",),
                 reference=lambda a, b: _torch_fmod(a, b), samples=_scalar_divisor_samples)
register(OpDef(
    "pow_scalar",
    inputs=("input",),
    attrs=_SCALAR_ATTRS,
    infer_meta=_pow_scalar_meta,
    kernel=_scalar_kernel("pow"),
    grad=_pow_scalar_grad,
    saves=("input", "out"),
    sbp=lambda x, other, reverse: elementwise_signatures([x.shape], x.shape),
    reference=_scalar_reference(lambda a, b: a ** b),
    samples=_pow_scalar_samples,
))


def _torch_fmod(a, b):
    import torch  # the reference only; fmod has no Scalar-first overload

    if isinstance(a, torch.Tensor):
        return torch.fmod(a, b)
    return torch.fmod(torch.full_like(b, a, dtype=torch.result_type(b, a)), b)


def _bitwise_scalar_samples(rng):
    return [Sample(_ints(rng, -50, 50, 3, 4), other=6), Sample(_ints(rng, -50, 50, 4,
                                                                      dtype=np.int8), other=1000),
            Sample(rng.random(4) > 0.5, other=True), Sample(rng.random(4) > 0.5, other=3),
            Sample(_ints(rng, 0, 50, 4, dtype=np.uint8), other=5, reverse=True)]


for _name, _fn in (("bitwise_and", lambda a, b: a & b), ("bitwise_or", lambda a, b: a | b),
                   ("bitwise_xor", lambda a, b: a ^ b)):
    _register_scalar(_name, reference=_fn, samples=_bitwise_scalar_samples)


def _div_scalar_meta(x, other, reverse=False, rounding_mode=None):
    return TensorMeta(x.shape, _div_dtype("div", promote((x,), (other,)), rounding_mode))


def _div_scalar_kernel(ctx, x, other, reverse=False, rounding_mode=None):
    out = ctx.out_metas[0].dtype
    x = cast_array(ctx, x, ctx.in_metas[0].dtype, out)
    s = _scalar_array(ctx, other, out)
    if reverse:
        x, s = s, x
    return _div_arrays(ctx, x, s, out, rounding_mode)


def _div_scalar_grad(ctx, g):
    a = ctx.attrs
    if a["rounding_mode"] is not None:
        return (_zeros(ctx.in_metas[0], g),)
    if not a["reverse"]:
        return (op("div_scalar", g, other=a["other"]),)
    x = ctx.input(0)  # s / x: d/dx = -s / x**2
    return (op("div", op("mul_scalar", g, other=-a["other"]), op("mul", x, x)),)


def _div_scalar_sbp(x, other, reverse=False, rounding_mode=None):
    # (P)->P: x / s is linear in x; s / x and rounded quotients are not.
    partial = [("P",)] if not reverse and rounding_mode is None else []
    return elementwise_signatures([x.shape], x.shape, partial=partial)


def _div_scalar_reference(torch, x, other, reverse=False, rounding_mode=None):
    if not reverse:
        return torch.div(x, other, rounding_mode=rounding_mode)
    return torch.div(torch.full_like(x, other, dtype=torch.result_type(x, other)), x,
                     rounding_mode=rounding_mode)


def _div_scalar_samples(rng):
    samples = _scalar_divisor_samples(rng)
    return samples + [Sample(*s.inputs, grad=False, rounding_mode=mode, **s.attrs)
                      for s in samples for mode in ("trunc", "floor")]


register(OpDef(
    "div_scalar",
    inputs=("input",),
    attrs={**_SCALAR_ATTRS, "rounding_mode": Attr("str", None)},
    infer_meta=_div_scalar_meta,
    kernel=_div_scalar_kernel,
    grad=_div_scalar_grad,
    saves=("input",),
    sbp=_div_scalar_sbp,
    reference=_div_scalar_reference,
    samples=_div_scalar_samples,
))


def _compare_scalar_samples(rng):
    return [Sample(_ints(rng, -3, 3, 3, 4), other=1), Sample(_rand(rng, 3), other=0.25),
            Sample(_ints(rng, -3, 3, 3, 4, dtype=np.int32), other=1.5),
            Sample(np.array([16777217, 3]), other=16777216.0),
            Sample(np.array([1, -24], dtype=np.int8), other=1000),
            Sample(np.array([True, False]), other=True),
            Sample(np.array([np.nan, 1.0]), other=1.0, reverse=True),
            Sample(_ints(rng, -3, 3, 4), other=0, reverse=True)]


_OPERATOR = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
             "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}

for _name in _COMPARISONS:
    register(OpDef(
        _name + "_scalar",
        inputs=("input",),
        attrs=_SCALAR_ATTRS,
        infer_meta=lambda x, other, reverse=False: TensorMeta(x.shape, dt.bool_),
        kernel=_scalar_compare_kernel(_name),
        sbp=lambda x, other, reverse: elementwise_signatures([x.shape], x.shape),
        reference=_scalar_reference(_OPERATOR[_name]),
        samples=_compare_scalar_samples,
    ))


# -- unary ----------------------------------------------------------------------------------
def _float_unary_kernel(name):
    def kernel(ctx, x):
        return ctx.prims.unary(name, cast_array(ctx, x, ctx.in_metas[0].dtype,
                                                ctx.out_metas[0].dtype))

    return kernel


def _direct_unary(name):
    """specialize: the primitive's function when the input needs no cast."""
    def specialize(ctx, attrs):
        out = ctx.out_metas[0]
        if not out.shape or ctx.in_metas[0].dtype is not out.dtype:
            return None
        return ctx.prims.direct_elementwise(name)

    return specialize


def _float_meta(x):
    return TensorMeta(x.shape, float_result(x))


# Input domains for samples: (low, high) of a uniform draw; None: standard normal.
_REAL, _POSITIVE, _UNIT, _ABOVE_ONE = None, (0.2, 3.0), (-0.9, 0.9), (1.1, 3.0)


def _domain(rng, domain, *shape, dtype=np.float64):
    if domain is None:
        return _rand(rng, *shape, dtype=dtype)
    return _uniform(rng, *domain, *shape, dtype=dtype)


def _float_unary_samples(domain, int_lo=-3, int_hi=4):
    def samples(rng):
        out = [
            Sample(_domain(rng, domain, 2, 3)),
            Sample(_domain(rng, domain, 4, 1, 3)),
            Sample(_domain(rng, domain)),
            Sample(_domain(rng, domain, 5, dtype=np.float32)),
            Sample(_domain(rng, domain, 3, dtype=np.float16), grad=False, rtol=1e-2, atol=1e-3),
        ]
        if int_lo is not None:
            out.append(Sample(_ints(rng, int_lo, int_hi, 4), grad=False))
            out.append(Sample(_ints(rng, int_lo, int_hi, 3, dtype=np.int32), grad=False))
        return out

    return samples


def _u(name):
    return lambda x: op(name, x)


# Gradients of float unary ops, as functions of (ctx, g); x = input, y = output.
_LN2, _LN10 = math.log(2.0), math.log(10.0)


def _gx(f):
    """A grad rule g * f(x)."""
    return _reads(lambda ctx, g: (op("mul", g, f(ctx.input(0))),), "input")


def _gy(f):
    """A grad rule g * f(y) on the saved output."""
    return _reads(lambda ctx, g: (op("mul", g, f(ctx.output(0))),), "out")


def _g_over_x(f):
    """A grad rule g / f(x)."""
    return _reads(lambda ctx, g: (op("div", g, f(ctx.input(0))),), "input")


def _reads(rule, name):
    rule.saves = (name,)  # what the OpDef saves for this rule
    return rule


def _scaled(name, s):
    return lambda t: op("mul_scalar", op(name, t), other=s)


def _square(t):
    return op("mul", t, t)


_FLOAT_UNARY = {
    # name: (grad rule, sample domain, sample ints (lo, hi) or None)
    "exp": (_gy(lambda y: y), _REAL, (-3, 4)),
    "expm1": (_gy(lambda y: op("add_scalar", y, other=1)), _REAL, (-3, 4)),
    "log": (_g_over_x(lambda x: x), _POSITIVE, (1, 5)),
    "log1p": (_g_over_x(lambda x: op("add_scalar", x, other=1)), _POSITIVE, (0, 5)),
    "log2": (_g_over_x(lambda x: op("mul_scalar", x, other=_LN2)), _POSITIVE, (1, 5)),
    "log10": (_g_over_x(lambda x: op("mul_scalar", x, other=_LN10)), _POSITIVE, (1, 5)),
    "sqrt": (_gy(lambda y: op("div_scalar", y, other=0.5, reverse=True)), _POSITIVE, (0, 9)),
    # torch: -0.5 * grad * y**3
    "rsqrt": (_gy(lambda y: op("mul_scalar", op("pow_scalar", y, other=3), other=-0.5)),
              _POSITIVE, (1, 9)),
    "reciprocal": (_gy(lambda y: op("neg", _square(y))), _POSITIVE, (1, 5)),
    "sin": (_gx(_u("cos")), _REAL, (-3, 4)),
    "cos": (_gx(lambda x: op("neg", op("sin", x))), _REAL, (-3, 4)),
    "tan": (_gy(lambda y: op("add_scalar", _square(y), other=1)), (-1.2, 1.2), (-1, 2)),
    "asin": (_gx(lambda x: op("rsqrt", op("sub_scalar", _square(x), other=1, reverse=True))),
             _UNIT, (-1, 2)),
    "acos": (_gx(lambda x: op("neg", op("rsqrt", op("sub_scalar", _square(x), other=1,
                                                      reverse=True)))), _UNIT, (-1, 2)),
    "atan": (_g_over_x(lambda x: op("add_scalar", _square(x), other=1)), _REAL, (-3, 4)),
    "sinh": (_gx(_u("cosh")), _REAL, (-3, 4)),
    "cosh": (_gx(_u("sinh")), _REAL, (-3, 4)),
    "tanh": (_gy(lambda y: op("sub_scalar", _square(y), other=1, reverse=True)), _REAL,
             (-3, 4)),
    "asinh": (_gx(lambda x: op("rsqrt", op("add_scalar", _square(x), other=1))), _REAL,
              (-3, 4)),
    "acosh": (_gx(lambda x: op("rsqrt", op("sub_scalar", _square(x), other=1))), _ABOVE_ONE,
              (1, 5)),
    "atanh": (_g_over_x(lambda x: op("sub_scalar", _square(x), other=1, reverse=True)), _UNIT,
              (0, 1)),
    "sigmoid": (_gy(lambda y: op("mul", y, op("sub_scalar", y, other=1, reverse=True))),
                _REAL, (-3, 4)),
    # d erf / dx = 2 / sqrt(pi) * exp(-x**2)
    "erf": (_gx(lambda x: op("mul_scalar", op("exp", op("neg", _square(x))),
                             other=2.0 / math.sqrt(math.pi))), _REAL, (-3, 4)),
}

for _name, (_grad, _dom, _int_range) in _FLOAT_UNARY.items():
    register(OpDef(
        _name,
        inputs=("input",),
        infer_meta=_float_meta,
        kernel=_float_unary_kernel(_name),
        specialize=_direct_unary(_name),
        grad=_grad,
        saves=_grad.saves,
        sbp=lambda x: elementwise_signatures([x.shape], x.shape),  # not linear: no P rule
        reference=_name,
        samples=_float_unary_samples(_dom, *(_int_range or (None, None))),
    ))


# erfinv: composed from primitives.  A closed-form guess (Winitzki's approximation of the
# inverse, relative error < 2e-3) refined by two Halley steps on erf(y) = x, each of which
# cubes the relative error: ~1e-14 relative for |x| <= 0.999.  Closer to +-1 the accuracy
# falls (1e-9 at 1 - 1e-10) because erf(y) near 1 cannot resolve y there; that needs erfc,
# which is not a primitive.
_WINITZKI_A = 0.147
_TWO_OVER_PI_A = 2.0 / (math.pi * _WINITZKI_A)


def _erfinv_kernel(ctx, x):
    prims = ctx.prims
    out = ctx.out_metas[0].dtype
    x = cast_array(ctx, x, ctx.in_metas[0].dtype, out)
    # Halley's steps need erf to full precision: compute in float64 whatever the dtype.
    work = dt.float64
    xw = cast_array(ctx, x, out, work)

    def c(v):
        return _scalar_array(ctx, v, work)

    def b(name, p, q):
        return prims.binary(name, p, q)

    a = prims.unary("abs", xw)
    outside = b("ge", a, c(1.0))
    xw_in = prims.where(outside, c(0.0), xw)  # |x| >= 1 is patched below
    log_term = prims.unary("log", b("mul", b("sub", c(1.0), xw_in), b("add", c(1.0), xw_in)))
    t = b("add", c(_TWO_OVER_PI_A), b("mul", log_term, c(0.5)))
    inner = b("sub", b("mul", t, t), b("div", log_term, c(_WINITZKI_A)))
    y = b("mul", prims.unary("sign", xw_in),
          prims.unary("sqrt", b("sub", prims.unary("sqrt", inner), t)))
    for _ in range(2):
        f = b("sub", prims.unary("erf", y), xw_in)
        dfdy = b("mul", c(2.0 / math.sqrt(math.pi)), prims.unary("exp", prims.unary(
            "neg", b("mul", y, y))))
        # Halley: y -= 2 f f' / (2 f'^2 - f f'') = f / (f' + y f), since f'' = -2 y f'.
        y = b("sub", y, b("div", f, b("add", dfdy, b("mul", y, f))))
    # |x| == 1 gives +-inf, |x| > 1 nan.
    infinite = prims.where(b("gt", xw, c(0.0)), c(math.inf), c(-math.inf))
    edge = prims.where(b("eq", a, c(1.0)), infinite, c(math.nan))
    y = prims.where(outside, edge, y)
    return cast_array(ctx, y, work, out)


def _erfinv_samples(rng):
    return [
        Sample(_uniform(rng, -0.95, 0.95, 2, 3)),
        Sample(_uniform(rng, -0.999999, 0.999999, 4, 1, 3)),
        Sample(np.asarray(0.3)),
        Sample(np.array([-1.0, 1.0, 0.0, 1e-300, 1.5, -1e-6]), grad=False),
        Sample(_uniform(rng, -0.99, 0.99, 5, dtype=np.float32)),
        Sample(_ints(rng, -1, 2, 4), grad=False),
    ]


register(OpDef(
    "erfinv",
    inputs=("input",),
    infer_meta=_float_meta,
    kernel=_erfinv_kernel,
    # d erfinv / dx = sqrt(pi) / 2 * exp(y**2)
    grad=_gy(lambda y: op("mul_scalar", op("exp", _square(y)), other=math.sqrt(math.pi) / 2)),
    saves=("out",),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape),
    reference="erfinv",
    samples=_erfinv_samples,
))


# Unary ops that keep the dtype.
def _same_meta(name, allow_bool=False, allow_int=True):
    def infer(x):
        if x.dtype is dt.bool_ and not allow_bool:
            raise _not_implemented(name, x.dtype)
        if x.dtype.category == 1 and not allow_int:
            raise _not_implemented(name, x.dtype)
        return x

    return infer


def _neg_meta(x):
    if x.dtype is dt.bool_:
        raise op_error("neg", "Negation, the `-` operator, on a bool tensor is not supported. "
                       "If you are trying to invert a mask, use the `~` or `logical_not()` "
                       "operator instead.")
    return x


def _same_samples(include_ints=True, include_bool=False):
    def samples(rng):
        out = [Sample(_rand(rng, 2, 3) * 3), Sample(_rand(rng, 4, 1, 3) * 3),
               Sample(np.asarray(-1.7)), Sample(_rand(rng, 5, dtype=np.float32) * 3)]
        if include_ints:
            out += [Sample(_ints(rng, -9, 9, 4), grad=False),
                    Sample(_ints(rng, -9, 9, 3, dtype=np.int8), grad=False)]
        if include_bool:
            out.append(Sample(rng.random(4) > 0.5, grad=False))
        return out

    return samples


def _copy_if_integral(prim):
    """Rounding ops return integral inputs unchanged (a fresh copy, as torch)."""

    def kernel(ctx, x):
        if ctx.in_metas[0].dtype.category != 2:
            return ctx.prims.contiguous(x)
        return ctx.prims.unary(prim, x)

    return kernel


def _sign_kernel(ctx, x):
    d = ctx.in_metas[0].dtype
    if d is dt.bool_:
        return ctx.prims.contiguous(x)
    if d.category == 1:
        return ctx.prims.unary("sign", x)
    # torch: (0 < x) - (x < 0), so sign(nan) is 0 (NumPy's is nan).
    zero = _scalar_array(ctx, 0, d)
    pos = ctx.prims.cast(ctx.prims.binary("gt", x, zero), d)
    neg = ctx.prims.cast(ctx.prims.binary("lt", x, zero), d)
    return ctx.prims.binary("sub", pos, neg)


def _frac_kernel(ctx, x):
    return ctx.prims.binary("sub", x, ctx.prims.unary("trunc", x))


def _square_meta(x):
    return TensorMeta(x.shape, dt.int64 if x.dtype is dt.bool_ else x.dtype)


def _square_kernel(ctx, x):
    x = cast_array(ctx, x, ctx.in_metas[0].dtype, ctx.out_metas[0].dtype)
    return ctx.prims.unary("square", x)


def _round_meta(x, decimals=0):
    _same_meta("round")(x)
    if decimals != 0 and not x.dtype.is_floating_point:
        raise _not_implemented("round", x.dtype)
    return x


def _round_kernel(ctx, x, decimals=0):
    d = ctx.in_metas[0].dtype
    if d.category != 2:
        return ctx.prims.contiguous(x)
    if decimals == 0:
        return ctx.prims.unary("round", x)
    # torch: nearbyint(x * 10**d) / 10**d, or nearbyint(x / 10**-d) * 10**-d for d < 0, in
    # the op-math type (float32 for half types).
    work = d if d.itemsize >= 4 else dt.float32
    xw = cast_array(ctx, x, d, work)
    scale = _scalar_array(ctx, 10.0 ** abs(decimals), work)
    first, second = ("mul", "div") if decimals > 0 else ("div", "mul")
    r = ctx.prims.binary(second, ctx.prims.unary("round", ctx.prims.binary(first, xw, scale)),
                         scale)
    return cast_array(ctx, r, work, d)


def _round_samples(rng):
    return _same_samples()(rng) + [
        Sample(np.array([0.5, 1.5, 2.5, -0.5, -2.5]), grad=False),
        Sample(_rand(rng, 2, 3) * 100, decimals=2),
        Sample(_rand(rng, 4) * 1000, decimals=-2),
        Sample(_rand(rng, 4).astype(np.float32) * 100, decimals=1),
    ]


def _abs_grad(ctx, g):
    return (op("mul", g, op("sign", ctx.input(0))),)


def _register_same(name, kernel, meta, grad, samples, partial=(), reference=None, saves=()):
    register(OpDef(
        name,
        inputs=("input",),
        infer_meta=meta,
        kernel=kernel,
        grad=grad,
        saves=saves,
        sbp=lambda x, **attrs: elementwise_signatures([x.shape], x.shape, partial=partial),
        reference=reference or name,
        samples=samples,
    ))


# (P)->P: negation is linear.
_register_same("neg", lambda ctx, x: ctx.prims.unary("neg", x), _neg_meta,
               lambda ctx, g: (op("neg", g),), _same_samples(), partial=[("P",)])
_register_same("abs", lambda ctx, x: ctx.prims.unary("abs", x), _same_meta("abs"), _abs_grad,
               _same_samples(), saves=("input",))
_register_same("sign", _sign_kernel, _same_meta("sign", allow_bool=True), _zero_grads,
               lambda rng: _same_samples(include_bool=True)(rng) + [
                   Sample(np.array([np.nan, 0.0, -0.0, np.inf, -np.inf]), grad=False)])
for _name in ("floor", "ceil", "trunc"):
    _register_same(_name, _copy_if_integral(_name), _same_meta(_name), _zero_grads,
                   _same_samples())
_register_same("frac", _frac_kernel, _same_meta("frac", allow_int=False),
               lambda ctx, g: (g,), _same_samples(include_ints=False))
_register_same("square", _square_kernel, _square_meta,
               _gx(lambda x: op("mul_scalar", x, other=2)),
               _same_samples(include_bool=True), saves=("input",))
register(OpDef(
    "round",
    inputs=("input",),
    attrs={"decimals": Attr("int", 0)},
    infer_meta=_round_meta,
    kernel=_round_kernel,
    grad=_zero_grads,
    saves=(),
    sbp=lambda x, decimals: elementwise_signatures([x.shape], x.shape),
    reference="round",
    samples=_round_samples,
))


# Unary ops with a bool result, and bitwise_not.
def _bool_samples(rng):
    return [Sample(np.array([np.nan, np.inf, -np.inf, 0.0, 1.5, -2.0])),
            Sample(np.array([np.nan, np.inf, 0.0], dtype=np.float32)),
            Sample(np.array([np.nan, -np.inf, 3.0], dtype=np.float16)),
            Sample(_ints(rng, -3, 3, 2, 3)), Sample(rng.random(4) > 0.5),
            Sample(np.asarray(0.0))]


for _name in ("logical_not", "isnan", "isinf", "isfinite"):
    register(OpDef(
        _name,
        inputs=("input",),
        infer_meta=lambda x: TensorMeta(x.shape, dt.bool_),
        kernel=(lambda n: lambda ctx, x: ctx.prims.unary(n, x))(_name),
        sbp=lambda x: elementwise_signatures([x.shape], x.shape),
        reference=_name,
        samples=_bool_samples,
    ))

def _bitwise_not_meta(x):
    _integral_only("bitwise_not", x.dtype)
    return x


register(OpDef(
    "bitwise_not",
    inputs=("input",),
    infer_meta=_bitwise_not_meta,
    kernel=lambda ctx, x: ctx.prims.unary("bitwise_not", x),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape),
    reference="bitwise_not",
    samples=lambda rng: [Sample(_ints(rng, -50, 50, 3, 4)), Sample(rng.random(5) > 0.5),
                         Sample(_ints(rng, 0, 255, 4, dtype=np.uint8)),
                         Sample(np.asarray(7, dtype=np.int32))],
))


# -- where ----------------------------------------------------------------------------------
def _check_condition(c: TensorMeta):
    if c.dtype is not dt.bool_ and c.dtype is not dt.uint8:
        raise op_error("where", "where expected condition to be a boolean tensor, but got a "
                       f"tensor with dtype {_TORCH_TYPE[c.dtype.name]}")


def _condition(ctx, c):
    m = ctx.in_metas[0]
    return c if m.dtype is dt.bool_ else ctx.prims.cast(c, dt.bool_)


def _where_meta(c, a, b):
    _check_condition(c)
    shape = broadcast_shapes("where", c.shape, a.shape, b.shape)
    return TensorMeta(shape, promote((a, b)))


def _where_kernel(ctx, c, a, b):
    out = ctx.out_metas[0].dtype
    a = cast_array(ctx, a, ctx.in_metas[1].dtype, out)
    b = cast_array(ctx, b, ctx.in_metas[2].dtype, out)
    return ctx.prims.where(_condition(ctx, c), a, b)


def _where_grad(ctx, g):
    _, ma, mb = ctx.in_metas
    c = ctx.input(0)
    ga = unbroadcast(_masked(c, g), ma) if ctx.needs_input_grad[1] else None
    gb = unbroadcast(_masked_out(c, g), mb) if ctx.needs_input_grad[2] else None
    return None, ga, gb


def _where_sbp(c, a, b):
    shape = _where_meta(c, a, b).shape
    # (B,P,P)->P: sum_i where(c, a_i, b_i) = where(c, sum a_i, sum b_i).
    return elementwise_signatures([c.shape, a.shape, b.shape], shape, partial=[("B", "P", "P")])


def _where_samples(rng):
    return [
        Sample(rng.random((2, 3)) > 0.5, _rand(rng, 2, 3), _rand(rng, 2, 3)),
        Sample(rng.random((4, 1, 3)) > 0.5, _rand(rng, 2, 1), _rand(rng, 3)),
        Sample(rng.random(3) > 0.5, np.asarray(1.5), _rand(rng, 2, 3)),
        Sample(np.asarray(True), _rand(rng, 3), _rand(rng, 3)),
        Sample(rng.random((2, 3)) > 0.5, _rand(rng, 2, 3).astype(np.float32),
               _ints(rng, -3, 3, 3)),
        Sample(rng.random(4) > 0.5, _ints(rng, -3, 3, 4, dtype=np.int32), _ints(rng, -3, 3, 4)),
    ]


register(OpDef(
    "where",
    inputs=("condition", "input", "other"),
    infer_meta=_where_meta,
    kernel=_where_kernel,
    grad=_where_grad,
    saves=("condition",),
    sbp=_where_sbp,
    reference="where",
    samples=_where_samples,
))


def _where_scalar_meta(c, x, other, reverse=False):
    _check_condition(c)
    d = promote((x,), (other,))
    _check_fits("where", other, d)
    return TensorMeta(broadcast_shapes("where", c.shape, x.shape), d)


def _where_scalar_kernel(ctx, c, x, other, reverse=False):
    out = ctx.out_metas[0].dtype
    x = cast_array(ctx, x, ctx.in_metas[1].dtype, out)
    s = _scalar_array(ctx, other, out)
    c = _condition(ctx, c)
    return ctx.prims.where(c, s, x) if reverse else ctx.prims.where(c, x, s)


def _where_scalar_grad(ctx, g):
    c = ctx.input(0)
    gx = _masked_out(c, g) if ctx.attrs["reverse"] else _masked(c, g)
    return None, unbroadcast(gx, ctx.in_metas[1])


def _where_scalar_sbp(c, x, other, reverse=False):
    shape = _where_scalar_meta(c, x, other, reverse).shape
    # (B,P)->P only when the scalar is 0: where(c, x_i, 0) sums to where(c, x, 0).
    partial = [("B", "P")] if other == 0 else []
    return elementwise_signatures([c.shape, x.shape], shape, partial=partial)


def _where_scalar_reference(torch, c, x, other, reverse=False):
    return torch.where(c, other, x) if reverse else torch.where(c, x, other)


register(OpDef(
    "where_scalar",
    inputs=("condition", "input"),
    attrs=_SCALAR_ATTRS,
    infer_meta=_where_scalar_meta,
    kernel=_where_scalar_kernel,
    grad=_where_scalar_grad,
    saves=("condition",),
    sbp=_where_scalar_sbp,
    reference=_where_scalar_reference,
    samples=lambda rng: [
        Sample(rng.random((2, 3)) > 0.5, _rand(rng, 2, 3), other=0),
        Sample(rng.random((4, 1, 3)) > 0.5, _rand(rng, 2, 1), other=2.5, reverse=True),
        Sample(rng.random(3) > 0.5, _rand(rng, 2, 3).astype(np.float32), other=-1.0),
        Sample(rng.random(3) > 0.5, _ints(rng, -3, 3, 3, dtype=np.int32), other=7, grad=False),
        Sample(rng.random(3) > 0.5, _ints(rng, -3, 3, 3), other=0.5, reverse=True,
               grad=False),
        Sample(np.array([1, 0, 1], dtype=np.uint8), _rand(rng, 3), other=0.0),
    ],
))


def _where_scalars_meta(c, input, other):
    _check_condition(c)
    return TensorMeta(c.shape, promote((), (input, other)))


def _where_scalars_kernel(ctx, c, input, other):
    out = ctx.out_metas[0].dtype
    return ctx.prims.where(_condition(ctx, c), _scalar_array(ctx, input, out),
                           _scalar_array(ctx, other, out))


register(OpDef(
    "where_scalars",
    inputs=("condition",),
    attrs={"input": Attr("scalar"), "other": Attr("scalar")},
    infer_meta=_where_scalars_meta,
    kernel=_where_scalars_kernel,
    sbp=lambda c, input, other: elementwise_signatures([c.shape], c.shape),
    reference=lambda torch, c, input, other: torch.where(c, input, other),
    samples=lambda rng: [Sample(rng.random((2, 3)) > 0.5, input=1.0, other=0.0),
                         Sample(rng.random(4) > 0.5, input=1, other=-2),
                         Sample(rng.random(4) > 0.5, input=1, other=0.5),
                         Sample(np.asarray(False), input=True, other=False)],
))


# -- clamp ----------------------------------------------------------------------------------
def _clamp_meta(x, min=None, max=None):  # noqa: A002 - torch's argument names
    if min is None and max is None:
        raise op_error("clamp", "At least one of 'min' or 'max' must not be None")
    bounds = tuple(v for v in (min, max) if v is not None)
    d = _no_bool("clamp", promote((x,), bounds))
    for v in bounds:
        _check_fits("clamp", v, d)
    return TensorMeta(x.shape, d)


def _clamp_kernel(ctx, x, min=None, max=None):  # noqa: A002
    out = ctx.out_metas[0].dtype
    x = cast_array(ctx, x, ctx.in_metas[0].dtype, out)
    # torch: min(max(x, lo), hi): nan propagates, and lo > hi gives hi everywhere.
    if min is not None:
        x = ctx.prims.binary("maximum", x, _scalar_array(ctx, min, out))
    if max is not None:
        x = ctx.prims.binary("minimum", x, _scalar_array(ctx, max, out))
    return x


def _clamp_grad(ctx, g):
    x = ctx.input(0)
    lo, hi = ctx.attrs["min"], ctx.attrs["max"]
    # The gradient passes where lo <= x <= hi (ties included), as torch.
    mask = None if lo is None else op("ge_scalar", x, other=lo)
    if hi is not None:
        upper = op("le_scalar", x, other=hi)
        mask = upper if mask is None else op("logical_and", mask, upper)
    return (unbroadcast(_masked(mask, g), ctx.in_metas[0]),)


def _clamp_samples(rng):
    x = _rand(rng, 3, 4)
    x[0, 0], x[0, 1] = -0.5, 0.5  # on the bounds: torch passes the gradient there
    return [
        Sample(_rand(rng, 3, 4), min=-0.5, max=0.5),
        Sample(_rand(rng, 4), min=0.0),
        Sample(_rand(rng, 4), max=0.25),
        Sample(_rand(rng, 2, 3), min=1.0, max=-1.0),
        Sample(x, min=-0.5, max=0.5, grad=False),
        Sample(np.asarray(2.0), min=-1, max=1),
        Sample(_rand(rng, 5).astype(np.float32), min=-0.5, max=0.5),
        Sample(_ints(rng, -5, 5, 6), min=-2, max=3, grad=False),
        Sample(_ints(rng, -5, 5, 6, dtype=np.int32), min=0.5, grad=False),
        Sample(np.array([np.nan, 1.0, -3.0]), min=-1.0, max=1.0, grad=False),
        Sample(rng.random(4) > 0.5, min=0, max=1, grad=False),  # bool with ints: int64
    ]


register(OpDef(
    "clamp",
    inputs=("input",),
    attrs={"min": Attr("scalar", None), "max": Attr("scalar", None)},
    infer_meta=_clamp_meta,
    kernel=_clamp_kernel,
    grad=_clamp_grad,
    saves=("input",),
    sbp=lambda x, min, max: elementwise_signatures([x.shape], x.shape),  # not linear
    reference="clamp",
    samples=_clamp_samples,
))


def _clamp_bound_meta(name):
    def infer(x, bound):
        shape = broadcast_shapes(name, x.shape, bound.shape)
        return TensorMeta(shape, _no_bool(name, promote((x, bound))))

    return infer


def _clamp_bound_kernel(prim):
    def kernel(ctx, x, bound):
        out = ctx.out_metas[0].dtype
        return ctx.prims.binary(prim, cast_array(ctx, x, ctx.in_metas[0].dtype, out),
                                cast_array(ctx, bound, ctx.in_metas[1].dtype, out))

    return kernel


def _clamp_bound_grad(keep, past):
    """clamp_min (keep="ge", past="lt") and clamp_max (keep="le", past="gt")."""

    def grad(ctx, g):
        x, bound = ctx.inputs
        gx = unbroadcast(_masked(op(keep, x, bound), g), ctx.in_metas[0]) \
            if ctx.needs_input_grad[0] else None
        gb = unbroadcast(_masked(op(past, x, bound), g), ctx.in_metas[1]) \
            if ctx.needs_input_grad[1] else None
        return gx, gb

    return grad


def _clamp_bound_samples(rng):
    return [
        Sample(_rand(rng, 3, 4), _rand(rng, 3, 4)),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1)),
        Sample(_rand(rng, 3), np.asarray(0.1)),
        Sample(_rand(rng, 5).astype(np.float32), _rand(rng, 5)),
        Sample(_ints(rng, -5, 5, 6), _ints(rng, -5, 5, 6, dtype=np.int32), grad=False),
        Sample(_ints(rng, -5, 5, 2), np.array([0.5, -0.5], dtype=np.float32), grad=False),
    ]


for _name, _prim, _keep, _past in (("clamp_min", "maximum", "ge", "lt"),
                                   ("clamp_max", "minimum", "le", "gt")):
    register(OpDef(
        _name,
        inputs=("input", _name[-3:]),
        infer_meta=_clamp_bound_meta(_name),
        kernel=_clamp_bound_kernel(_prim),
        grad=_clamp_bound_grad(_keep, _past),
        saves=("input", _name[-3:]),
        sbp=(lambda n: lambda x, b: elementwise_signatures(
            [x.shape, b.shape], broadcast_shapes(n, x.shape, b.shape)))(_name),
        reference=_name,
        samples=_clamp_bound_samples,
    ))


def _clamp_tensor_meta(x, lo, hi):
    shape = broadcast_shapes("clamp", x.shape, lo.shape, hi.shape)
    return TensorMeta(shape, _no_bool("clamp", promote((x, lo, hi))))


def _clamp_tensor_kernel(ctx, x, lo, hi):
    out = ctx.out_metas[0].dtype
    mx, ml, mh = ctx.in_metas
    r = ctx.prims.binary("maximum", cast_array(ctx, x, mx.dtype, out),
                         cast_array(ctx, lo, ml.dtype, out))
    return ctx.prims.binary("minimum", r, cast_array(ctx, hi, mh.dtype, out))


def _clamp_tensor_grad(ctx, g):
    x, lo, hi = ctx.inputs
    mx, ml, mh = ctx.in_metas
    need = ctx.needs_input_grad
    # torch's rule: x where lo <= x <= hi; lo where x < lo < hi; hi where x > hi or hi < lo.
    gx = unbroadcast(_masked(op("logical_and", op("ge", x, lo), op("le", x, hi)), g), mx) \
        if need[0] else None
    gl = unbroadcast(_masked(op("logical_and", op("lt", x, lo), op("lt", lo, hi)), g), ml) \
        if need[1] else None
    gh = unbroadcast(_masked(op("logical_or", op("gt", x, hi), op("lt", hi, lo)), g), mh) \
        if need[2] else None
    return gx, gl, gh


register(OpDef(
    "clamp_tensor",
    inputs=("input", "min", "max"),
    infer_meta=_clamp_tensor_meta,
    kernel=_clamp_tensor_kernel,
    grad=_clamp_tensor_grad,
    saves=("input", "min", "max"),
    sbp=lambda x, lo, hi: elementwise_signatures([x.shape, lo.shape, hi.shape],
                                                 _clamp_tensor_meta(x, lo, hi).shape),
    reference=lambda torch, x, lo, hi: torch.clamp(x, lo, hi),
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _rand(rng, 3, 4) - 1, _rand(rng, 3, 4) + 1),
        # x carries the full broadcast shape: torch's own backward fails otherwise.
        Sample(_rand(rng, 4, 2, 3), _rand(rng, 2, 1) - 0.5, np.asarray(0.5)),
        Sample(_rand(rng, 3), _rand(rng, 3) + 1, _rand(rng, 3) - 1),  # min > max
        Sample(_rand(rng, 5).astype(np.float32), _rand(rng, 5) - 1, _rand(rng, 5) + 1),
        Sample(_ints(rng, -5, 5, 6), _ints(rng, -5, 0, 6), np.asarray(2.0), grad=False),
    ],
))


# -- lerp, addcmul, addcdiv, nan_to_num ------------------------------------------------------
def _lerp_check(start, end, weight=None):
    for arg, m in (("end", end), ("weight", weight)):
        if m is not None and m.dtype is not start.dtype:
            raise op_error("lerp", f"expected dtype {start.dtype.name} for `{arg}` but got "
                           f"dtype {m.dtype.name}")
    if not start.dtype.is_floating_point:
        raise _not_implemented("lerp", start.dtype)


def _lerp_meta(start, end, weight):
    _lerp_check(start, end, weight)
    return TensorMeta(broadcast_shapes("lerp", start.shape, end.shape, weight.shape),
                      start.dtype)


def _opmath(d: dt.DType) -> dt.DType:
    """torch computes half types in float32."""
    return d if d.itemsize >= 4 else dt.float32


def _fma_dtype(d: dt.DType) -> dt.DType:
    """Where torch's CPU lerp fuses `coeff * diff + base` into one rounding, computing the
    product and sum in float64 and rounding once to float32 gives the same result (the
    product of two float32 is exact in float64); float64 has no wider type to do that in."""
    return dt.float64 if d is dt.float32 else _opmath(d)


def _lerp_arrays(ctx, start, end, weight, small):
    """torch: base + coeff * (end - start), with (base, coeff) = (start, w) where |w| < 0.5
    and (end, w - 1) elsewhere, so the result is exact at w = 0 and w = 1."""
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    work = _opmath(d)
    start, end = cast_array(ctx, start, d, work), cast_array(ctx, end, d, work)
    diff = prims.binary("sub", end, start)
    if isinstance(small, bool):  # a Python weight
        coeff = _scalar_array(ctx, weight, work)
        if not small:  # w - 1 rounded in the working dtype, as torch
            coeff = prims.binary("sub", coeff, _scalar_array(ctx, 1, work))
        base = start if small else end
    else:
        coeff = prims.where(small, weight, prims.binary("sub", weight,
                                                        _scalar_array(ctx, 1, work)))
        base = prims.where(small, start, end)
    fused = _fma_dtype(d)
    r = prims.binary("add", cast_array(ctx, base, work, fused), prims.binary(
        "mul", cast_array(ctx, coeff, work, fused), cast_array(ctx, diff, work, fused)))
    return cast_array(ctx, r, fused, d)


def _lerp_kernel(ctx, start, end, weight):
    d = ctx.out_metas[0].dtype
    w = cast_array(ctx, weight, d, _opmath(d))
    small = ctx.prims.binary("lt", ctx.prims.unary("abs", w), _scalar_array(ctx, 0.5,
                                                                           _opmath(d)))
    return _lerp_arrays(ctx, start, end, w, small)


def _lerp_grad(ctx, g):
    ms, me, mw = ctx.in_metas
    need = ctx.needs_input_grad
    w = ctx.input(2) if need[0] or need[1] else None
    gs = unbroadcast(op("mul", g, op("sub_scalar", w, other=1, reverse=True)), ms) \
        if need[0] else None
    ge = unbroadcast(op("mul", g, w), me) if need[1] else None
    gw = unbroadcast(op("mul", g, op("sub", ctx.input(1), ctx.input(0))), mw) \
        if need[2] else None
    return gs, ge, gw


register(OpDef(
    "lerp",
    inputs=("input", "end", "weight"),
    infer_meta=_lerp_meta,
    kernel=_lerp_kernel,
    grad=_lerp_grad,
    saves=("input for weight", "end for weight", "weight for input,end"),
    # (P,P,B)->P: (1 - w) * start + w * end is linear in (start, end) jointly.
    sbp=lambda s, e, w: elementwise_signatures([s.shape, e.shape, w.shape],
                                               _lerp_meta(s, e, w).shape,
                                               partial=[("P", "P", "B")]),
    reference="lerp",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3), _rand(rng, 2, 3), _uniform(rng, -0.5, 1.5, 2, 3)),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1), _uniform(rng, 0, 1, 3)),
        Sample(_rand(rng, 3), _rand(rng, 3), np.asarray(0.75)),
        Sample(_rand(rng, 5).astype(np.float32), _rand(rng, 5).astype(np.float32),
               _uniform(rng, 0, 1, 5, dtype=np.float32)),
    ],
))


def _lerp_scalar_meta(start, end, weight):
    _lerp_check(start, end)
    return TensorMeta(broadcast_shapes("lerp", start.shape, end.shape), start.dtype)


def _lerp_scalar_kernel(ctx, start, end, weight):
    return _lerp_arrays(ctx, start, end, weight, -0.5 < weight < 0.5)


def _lerp_scalar_grad(ctx, g):
    w = ctx.attrs["weight"]
    ms, me = ctx.in_metas
    return (unbroadcast(op("mul_scalar", g, other=1 - w), ms),
            unbroadcast(op("mul_scalar", g, other=w), me))


register(OpDef(
    "lerp_scalar",
    inputs=("input", "end"),
    attrs={"weight": Attr("scalar")},
    infer_meta=_lerp_scalar_meta,
    kernel=_lerp_scalar_kernel,
    grad=_lerp_scalar_grad,
    saves=(),
    # (P,P)->P: (1 - w) * start + w * end is linear in (start, end) jointly.
    sbp=lambda s, e, weight: elementwise_signatures(
        [s.shape, e.shape], broadcast_shapes("lerp", s.shape, e.shape), partial=[("P", "P")]),
    reference=lambda torch, s, e, weight: torch.lerp(s, e, weight),
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3), _rand(rng, 2, 3), weight=0.3),
        Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1), weight=0.8),
        Sample(_rand(rng, 3), _rand(rng, 3), weight=1),
        Sample(_rand(rng, 5).astype(np.float32), _rand(rng, 5).astype(np.float32), weight=-1.5),
        Sample(_rand(rng, 3).astype(np.float16), _rand(rng, 3).astype(np.float16), weight=0.25,
               grad=False, rtol=1e-2, atol=1e-3),
    ],
))


def _addc_meta(name):
    def infer(x, t1, t2, value=1):
        if name == "addcdiv" and t1.dtype.category < 2 and t2.dtype.category < 2:
            raise op_error(name, "Integer division with addcdiv is no longer supported, and in "
                           "a future release addcdiv will perform a true division of tensor1 "
                           "and tensor2. The historic addcdiv behavior can be implemented as "
                           "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) "
                           "for integer inputs and as (input + value * tensor1 / tensor2) for "
                           "float inputs. The future addcdiv behavior is just the latter "
                           "implementation: (input + value * tensor1 / tensor2), for all "
                           "dtypes.")
        shape = broadcast_shapes(name, x.shape, t1.shape, t2.shape)
        d = promote((x, t1, t2))
        _check_fits(name, value, d)
        return TensorMeta(shape, d)

    return infer


def _addc_kernel(prim):
    def kernel(ctx, x, t1, t2, value=1):
        prims = ctx.prims
        d = ctx.out_metas[0].dtype
        mx, m1, m2 = ctx.in_metas
        x, t1, t2 = (cast_array(ctx, a, m.dtype, d) for a, m in ((x, mx), (t1, m1), (t2, m2)))
        # torch: x + value * t1 * t2 (addcmul), x + value * (t1 / t2) (addcdiv).
        if prim == "mul":
            r = prims.binary("mul", prims.binary("mul", _scalar_array(ctx, value, d), t1), t2)
        else:
            r = prims.binary("mul", _scalar_array(ctx, value, d), prims.binary("div", t1, t2))
        return prims.binary("add", x, r)

    return kernel


def _addcmul_grad(ctx, g):
    mx, m1, m2 = ctx.in_metas
    v = ctx.attrs["value"]
    need = ctx.needs_input_grad
    gv = op("mul_scalar", g, other=v) if need[1] or need[2] else None
    g1 = unbroadcast(op("mul", gv, ctx.input(2)), m1) if need[1] else None
    g2 = unbroadcast(op("mul", gv, ctx.input(1)), m2) if need[2] else None
    return unbroadcast(g, mx), g1, g2


def _addcdiv_grad(ctx, g):
    mx, m1, m2 = ctx.in_metas
    v = ctx.attrs["value"]
    need = ctx.needs_input_grad
    gv = op("mul_scalar", g, other=v) if need[1] or need[2] else None
    g1 = unbroadcast(op("div", gv, ctx.input(2)), m1) if need[1] else None
    g2 = None
    if need[2]:
        t1, t2 = ctx.input(1), ctx.input(2)
        g2 = unbroadcast(op("neg", op("div", op("mul", gv, t1), op("mul", t2, t2))), m2)
    return unbroadcast(g, mx), g1, g2


def _addc_samples(divide):
    def samples(rng):
        den = _away_from_zero if divide else _rand
        out = [
            Sample(_rand(rng, 2, 3), _rand(rng, 2, 3), den(rng, 2, 3)),
            Sample(_rand(rng, 4, 1, 3), _rand(rng, 2, 1), den(rng, 3), value=-0.5),
            Sample(np.asarray(1.0), _rand(rng, 3), den(rng, 2, 3), value=2),
            Sample(_rand(rng, 5).astype(np.float32), _rand(rng, 5).astype(np.float32),
                   den(rng, 5), value=0.25),
            Sample(_ints(rng, -5, 5, 4), _rand(rng, 4).astype(np.float32), den(rng, 4),
                   grad=False),
        ]
        if not divide:
            out.append(Sample(_ints(rng, -5, 5, 4), _ints(rng, -5, 5, 4),
                              _ints(rng, -5, 5, 4), value=3, grad=False))
        return out

    return samples


for _name, _prim, _grad, _partial in (
    # (P,P,B)->P and (P,B,P)->P: x + v * t1 * t2 is linear in (x, t1) and in (x, t2).
    ("addcmul", "mul", _addcmul_grad, [("P", "P", "B"), ("P", "B", "P")]),
    # (P,P,B)->P: x + v * t1 / t2 is linear in (x, t1).
    ("addcdiv", "div", _addcdiv_grad, [("P", "P", "B")]),
):
    register(OpDef(
        _name,
        inputs=("input", "tensor1", "tensor2"),
        attrs={"value": Attr("scalar", 1)},
        infer_meta=_addc_meta(_name),
        kernel=_addc_kernel(_prim),
        grad=_grad,
        saves=("tensor1 for tensor2",
               "tensor2 for tensor1" if _prim == "mul" else "tensor2"),
        sbp=(lambda meta, partial: lambda x, t1, t2, value: elementwise_signatures(
            [x.shape, t1.shape, t2.shape], meta(x, t1, t2).shape, partial=partial))(
                _addc_meta(_name), _partial),
        reference=_name,
        samples=_addc_samples(_prim == "div"),
    ))


def _finfo_max(d: dt.DType) -> float:
    import ml_dtypes  # bfloat16's finfo lives there; dtype bookkeeping, not array work

    return float(ml_dtypes.finfo(d.np).max)


def _nan_to_num_kernel(ctx, x, nan=0.0, posinf=None, neginf=None):
    d = ctx.in_metas[0].dtype
    prims = ctx.prims
    if not d.is_floating_point:
        return prims.contiguous(x)
    big = _finfo_max(d)
    pos = _scalar_array(ctx, big if posinf is None else posinf, d)
    neg = _scalar_array(ctx, -big if neginf is None else neginf, d)
    r = prims.where(prims.unary("isnan", x), _scalar_array(ctx, nan, d), x)
    r = prims.where(prims.binary("eq", x, _scalar_array(ctx, math.inf, d)), pos, r)
    return prims.where(prims.binary("eq", x, _scalar_array(ctx, -math.inf, d)), neg, r)


register(OpDef(
    "nan_to_num",
    inputs=("input",),
    attrs={"nan": Attr("float", 0.0), "posinf": Attr("float", None),
           "neginf": Attr("float", None)},
    infer_meta=lambda x, nan=0.0, posinf=None, neginf=None: x,
    kernel=_nan_to_num_kernel,
    # torch: grad * isfinite(x)
    grad=lambda ctx, g: (_masked(op("isfinite", ctx.input(0)), g),),
    saves=("input",),
    sbp=lambda x, nan, posinf, neginf: elementwise_signatures([x.shape], x.shape),
    reference="nan_to_num",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3)),
        Sample(np.array([np.nan, np.inf, -np.inf, 1.5]), grad=False),
        Sample(np.array([np.nan, np.inf, -np.inf, 1.5]), nan=1.0, posinf=2.0, neginf=-3.0,
               grad=False),
        Sample(np.array([np.nan, np.inf, -np.inf], dtype=np.float32), posinf=1e3, grad=False),
        Sample(np.array([np.nan, np.inf, -np.inf], dtype=np.float16), grad=False),
        Sample(_ints(rng, -3, 3, 4), grad=False),
    ],
))


# -- signbit, gcd -----------------------------------------------------------------------------
register(OpDef(
    "signbit",
    inputs=("input",),
    infer_meta=lambda x: TensorMeta(x.shape, dt.bool_),
    # NumPy's signbit is False for bools and unsigned integers, True for -0.0, as torch.
    kernel=lambda ctx, x: ctx.prims.unary("signbit", x),
    sbp=lambda x: elementwise_signatures([x.shape], x.shape),  # a sign test: no P rule
    reference="signbit",
    samples=lambda rng: [
        # -0.0 is left to tests/ops/test_api_fill_T1.py: a partial sum cannot hold it.
        Sample(np.array([1e-300, 0.0, -1.5, 2.0, np.inf, -np.inf])),
        Sample(_rand(rng, 2, 3, dtype=np.float32)),
        Sample(_ints(rng, -3, 3, 4, 3)),
        Sample(_ints(rng, 0, 9, 4, dtype=np.uint8)),
        Sample(rng.random(4) > 0.5),
    ],
))


def _gcd_meta(a, b):
    m = binary_meta("gcd", a, b)
    if m.dtype.category != 1:  # floats and bool
        raise _not_implemented("gcd", m.dtype)
    return m


def _gcd_kernel(ctx, a, b):
    """Euclid's algorithm on whole arrays, run for as many steps as the worst case of the
    dtype needs (consecutive Fibonacci numbers: about 1.44 steps per bit), so the step count
    never depends on the values; slots that are done (b == 0) stay as they are."""
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    a = prims.unary("abs", cast_array(ctx, a, ctx.in_metas[0].dtype, d))
    b = prims.unary("abs", cast_array(ctx, b, ctx.in_metas[1].dtype, d))
    shape = ctx.out_metas[0].shape
    a, b = prims.broadcast_to(a, shape), prims.broadcast_to(b, shape)
    zero, one = _scalar_array(ctx, 0, d), _scalar_array(ctx, 1, d)
    for _ in range(int(1.45 * 8 * d.itemsize) + 2):
        live = prims.binary("ne", b, zero)
        r = prims.binary("remainder", a, prims.where(live, b, one))
        a = prims.where(live, b, a)
        b = prims.where(live, r, zero)
    return prims.contiguous(a)


register(OpDef(
    "gcd",
    inputs=("input", "other"),
    infer_meta=_gcd_meta,
    kernel=_gcd_kernel,
    sbp=lambda a, b: elementwise_signatures([a.shape, b.shape], _gcd_meta(a, b).shape),
    reference="gcd",
    samples=lambda rng: [
        Sample(_ints(rng, -60, 60, 3, 4), _ints(rng, -60, 60, 3, 4), grad=False),
        Sample(np.array([0, 0, 7, -12, 832040]), np.array([0, 5, 0, 18, 514229]), grad=False),
        Sample(_ints(rng, 0, 100, 4, 1, dtype=np.int32), _ints(rng, 0, 100, 3, dtype=np.int8),
               grad=False),
        Sample(_ints(rng, 0, 255, 5, dtype=np.uint8), _ints(rng, 0, 255, 5, dtype=np.uint8),
               grad=False),
    ],
))
