"""Creation ops: no tensor inputs (bernoulli aside); shape, value and dtype come as attrs.

Kernels fill only their piece of the logical output (`ctx.piece(0)`, a slice per axis of
`ctx.logical_out[0]`), so a global tensor's ranks each compute just their shard: arange and
linspace from the piece's logical indices, random ops by drawing the piece's words of the
counter-based stream (the same seed gives the same logical tensor however it is split).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, Signature, Split
from .registry import Attr, OpDef, Sample, op, register

# C type names torch uses in range errors ("from is out of bounds for unsigned char").
_C_NAMES = {
    "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short",
    "int32": "int", "int64": "long", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "float32": "float", "float64": "double",
}
_TORCH_NAMES = {
    "bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
    "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
    "float64": "Double",
}


def _check_shape(name, shape):
    for s in shape:
        if s < 0:
            raise op_error(name, f"Trying to create tensor with negative dimension {s}: "
                           f"{list(shape)}")
    return tuple(shape)


def _not_implemented(name, kernel, dtype):
    return op_error(name, f'"{kernel}" not implemented for \'{_TORCH_NAMES[dtype.name]}\'',
                    NotImplementedError)


def _int_range(dtype: dt.DType) -> tuple[int, int]:
    if dtype is dt.bool_:
        return 0, 1
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


# The C names torch's Scalar conversion gives in "value cannot be converted to type int64_t
# without overflow" (from full and fill_).
_SCALAR_C_NAMES = {
    "bool": "bool", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int",
    "int64": "int64_t", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "float32": "float", "float64": "double",
}


def check_fill_value(name: str, value, dtype: dt.DType) -> None:
    """torch's checked conversion of a fill value to dtype (at::Scalar, then checked_convert):
    NumPy would wrap it, or fail with its own OverflowError inside the kernel."""
    if isinstance(value, (bool, np.bool_)) or (dtype is dt.bool_ and not isinstance(value, int)):
        return
    if isinstance(value, (int, np.integer)):
        v = int(value)
        # a Python int becomes an int64 Scalar, or a uint64 one, or cannot be held at all
        if v < -(2**63):
            raise op_error(name, "can't convert negative int to unsigned", OverflowError)
        if v >= 2**64:
            raise op_error(name, "int too big to convert", OverflowError)
        if dtype is dt.bool_ or dtype is dt.float64 or dtype is dt.float32:
            return  # below 2**64: within float32's range
        if dtype.is_floating_point:
            ok = abs(v) <= _FLOAT_MAX[dtype.name]
        else:
            lo, hi = _int_range(dtype)
            # negatives down to -max wrap into an unsigned type (two's complement), as torch
            ok = v <= hi and (lo <= v if lo < 0 else -hi <= v)
    elif isinstance(value, (float, np.floating)):
        f = float(value)
        if dtype.is_floating_point:
            # inf and nan convert to any floating type; a finite value must fit
            ok = not math.isfinite(f) or dtype is dt.float64 or abs(f) <= _FLOAT_MAX[dtype.name]
        else:
            lo, hi = _int_range(dtype)
            ok = float(lo) <= f <= float(hi)  # compared as doubles; NaN fails
    else:
        return
    if not ok:
        raise op_error(name, f"value cannot be converted to type {_SCALAR_C_NAMES[dtype.name]} "
                       f"without overflow (the value {value!r})")


_FLOAT_MAX = {d.name: float(ml_dtypes.finfo(d.np).max)
              for d in (dt.float16, dt.bfloat16, dt.float32)}


_INTEGRAL = frozenset((dt.uint8, dt.int8, dt.int16, dt.int32, dt.int64))


def _stored_fill(value, dtype: dt.DType):
    """The value a checked fill stores in an integral dtype (the kernel calls this only for
    those, so that float fills pay one set lookup), as torch's C cast would: NumPy refuses a
    negative int for an unsigned type (torch wraps it) and a float of 2**63 for int64 (torch's
    cast gives int64's min)."""
    if type(value) is int:
        return value if value >= 0 or dtype.is_signed else value % (np.iinfo(dtype.np).max + 1)
    if isinstance(value, (float, np.floating)):
        v = int(value)  # checked: finite and in range as a double
        return -(2**63) if v > 2**63 - 1 else v
    if isinstance(value, np.integer) and value < 0 and not dtype.is_signed:
        return int(value) % (np.iinfo(dtype.np).max + 1)
    return value


def _full_meta(shape, fill_value, dtype):
    check_fill_value("full", fill_value, dtype)
    return TensorMeta(_check_shape("full", shape), dtype)


def creation_sbp(shape):
    """A creation op can produce any split or broadcast directly (never partial)."""
    return [Signature((), (B,))] + [
        # () -> S(i): each rank fills its own slice of the logical tensor
        Signature((), (Split(i),)) for i, n in enumerate(shape) if n > 1
    ]


def _iota(ctx, n: int, start: int):
    """int64 [start, start + 1, ..., start + n - 1]: a running sum of ones, shifted."""
    counts = ctx.prims.scan("cumsum", ctx.prims.full((n,), dt.int64, 1), 0)
    return ctx.prims.binary("add", counts, ctx.prims.full((), dt.int64, start - 1))


def _scalar(ctx, dtype, value):
    return ctx.prims.full((), dtype, value)


def _to(ctx, x, dtype: dt.DType):
    """Cast to dtype unless it already is (arrays may only be inspected by .dtype)."""
    return x if x.dtype == dtype.np else ctx.prims.cast(x, dtype)


# -- full -----------------------------------------------------------------------------------
register(OpDef(
    "full",
    inputs=(),
    attrs={"shape": Attr("ints"), "fill_value": Attr("scalar"), "dtype": Attr("dtype")},
    infer_meta=_full_meta,
    kernel=lambda ctx, shape, fill_value, dtype: ctx.prims.full(
        ctx.out_metas[0].shape, dtype,
        _stored_fill(fill_value, dtype) if dtype in _INTEGRAL else fill_value),
    sbp=lambda shape, fill_value, dtype: creation_sbp(shape),
    reference=lambda torch, shape, fill_value, dtype: torch.full(shape, fill_value, dtype=dtype),
    samples=lambda rng: [Sample(shape=(2, 3), fill_value=1.5, dtype=dt.float32),
                         Sample(shape=(3,), fill_value=7, dtype=dt.int64),
                         Sample(shape=(), fill_value=True, dtype=dt.bool_),
                         Sample(shape=(0, 2), fill_value=-2.5, dtype=dt.float64)],
))


# -- arange ---------------------------------------------------------------------------------
def _arange_params(start, end, step, dtype):
    """(length, start, step) of torch.arange in the dtype's accumulate type.

    torch checks the bounds on the given numbers; for integer dtypes the values are
    start + step * i with start and step truncated to integers, and int64 also counts the
    length on the truncated numbers (other dtypes count ceil((end - start) / step)).
    """
    if dtype is dt.bool_:
        raise _not_implemented("arange", "arange_cpu", dtype)
    if step == 0:
        raise op_error("arange", "step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise op_error("arange", f"unsupported range: {start} -> {end}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise op_error("arange", "upper bound and lower bound inconsistent with step sign "
                       f"(start={start}, end={end}, step={step})")
    if dtype.is_floating_point:
        n = math.ceil((float(end) - float(start)) / float(step))
        return max(n, 0), start, step
    xstart, xend, xstep = int(start), int(end), int(step)
    if dtype is dt.int64:
        if xstep == 0:
            raise op_error("arange", f"step must be nonzero (step {step} truncates to 0 for "
                           "int64)", ValueError)
        sign = 1 if xstep > 0 else -1
        num = xend - xstart + xstep - sign
        n = abs(num) // abs(xstep) * (1 if (num >= 0) == (xstep > 0) else -1)  # C division
    else:
        n = math.ceil((float(end) - float(start)) / float(step))
    return max(n, 0), xstart, xstep


def _arange_meta(start, end, step, dtype):
    n, _, _ = _arange_params(start, end, step, dtype)
    return TensorMeta((n,), dtype)


def _arange_kernel(ctx, start, end, step, dtype):
    (piece,) = ctx.piece(0)
    n = ctx.out_metas[0].shape[0]
    _, first, stride = _arange_params(start, end, step, dtype)
    idx = _iota(ctx, n, piece.start)
    if dtype.is_floating_point:
        # torch computes start + step * i in the accumulate type: double, float for half types.
        acc = dt.float64 if dtype.itemsize >= 4 else dt.float32
        idx = ctx.prims.cast(idx, acc)
    else:
        acc = dt.int64
    vals = ctx.prims.binary("mul", _scalar(ctx, acc, stride), idx)
    vals = ctx.prims.binary("add", _scalar(ctx, acc, first), vals)
    return _to(ctx, vals, dtype)


def _arange_reference(torch, start, end, step, dtype):
    return torch.arange(start, end, step, dtype=dtype)


register(OpDef(
    "arange",
    inputs=(),
    attrs={"start": Attr("scalar"), "end": Attr("scalar"), "step": Attr("scalar"),
           "dtype": Attr("dtype")},
    infer_meta=_arange_meta,
    kernel=_arange_kernel,
    sbp=lambda start, end, step, dtype: creation_sbp(_arange_meta(start, end, step, dtype).shape),
    reference=_arange_reference,
    samples=lambda rng: [
        Sample(start=0, end=7, step=1, dtype=dt.int64),
        Sample(start=-3, end=8, step=3, dtype=dt.int64),
        Sample(start=0.5, end=3.7, step=0.3, dtype=dt.float32),
        Sample(start=-1, end=2, step=0.25, dtype=dt.float64),
        Sample(start=5, end=-3.2, step=-1.9, dtype=dt.int64),
        Sample(start=5, end=-3.2, step=-1.9, dtype=dt.int32),
        Sample(start=0, end=1, step=0.1, dtype=dt.float16),
        Sample(start=2, end=2, step=1, dtype=dt.float32),
    ],
))


# -- linspace / logspace --------------------------------------------------------------------
def _check_space(name, start, end, steps, dtype):
    if steps < 0:
        raise op_error(name, f"number of steps must be non-negative, got {steps}")
    if dtype is dt.bool_:
        raise _not_implemented(name, f"{name}_cpu", dtype)
    if not dtype.is_floating_point:
        lo, hi = _int_range(dtype)
        for v in (start, end):
            if not lo <= int(v) <= hi:
                raise op_error(name, f"value {v} cannot be converted to type "
                               f"{_C_NAMES[dtype.name]} without overflow")
    return TensorMeta((steps,), dtype)


def _space_exponents(ctx, start, end, steps, dtype):
    """torch's linspace values for this piece: filled from both ends so the last value is
    exactly `end`.  Computed in the dtype itself for floats (torch's step type) and in double,
    from truncated bounds, for integers."""
    (piece,) = ctx.piece(0)
    n = ctx.out_metas[0].shape[0]
    if dtype.is_floating_point:
        comp, cast = dtype, dtype.np.type
    else:
        comp, cast = dt.float64, lambda v: float(int(v))
    lo, hi = cast(start), cast(end)
    # Pure NumPy on attrs: the step rounds exactly as torch's (end - start) / (steps - 1).
    step = (hi - lo) / cast(steps - 1)
    idx = _iota(ctx, n, piece.start)
    from_lo = ctx.prims.binary("mul", _scalar(ctx, comp, step), ctx.prims.cast(idx, comp))
    from_lo = ctx.prims.binary("add", _scalar(ctx, comp, lo), from_lo)
    back = ctx.prims.binary("sub", _scalar(ctx, dt.int64, steps - 1), idx)
    from_hi = ctx.prims.binary("mul", _scalar(ctx, comp, step), ctx.prims.cast(back, comp))
    from_hi = ctx.prims.binary("sub", _scalar(ctx, comp, hi), from_hi)
    first_half = ctx.prims.binary("lt", idx, _scalar(ctx, dt.int64, steps // 2))
    return ctx.prims.where(first_half, from_lo, from_hi), comp


def _linspace_kernel(ctx, start, end, steps, dtype):
    if steps == 1:  # torch fills `start`; the step formula would divide by zero
        v = start if dtype.is_floating_point else int(start)
        return ctx.prims.full(ctx.out_metas[0].shape, dtype, v)
    vals, _ = _space_exponents(ctx, start, end, steps, dtype)
    return _to(ctx, vals, dtype)


def _space_samples(rng):
    return [
        Sample(start=-1.5, end=2.25, steps=7, dtype=dt.float32),
        Sample(start=3, end=-4, steps=10, dtype=dt.float64),
        Sample(start=0, end=10, steps=4, dtype=dt.int64),
        Sample(start=-0.5, end=10.7, steps=5, dtype=dt.int32),
        Sample(start=0, end=1, steps=1, dtype=dt.float32),
        Sample(start=0, end=1, steps=0, dtype=dt.float32),
        Sample(start=-2, end=2, steps=9, dtype=dt.float16),
    ]


register(OpDef(
    "linspace",
    inputs=(),
    attrs={"start": Attr("scalar"), "end": Attr("scalar"), "steps": Attr("int"),
           "dtype": Attr("dtype")},
    infer_meta=lambda start, end, steps, dtype: _check_space("linspace", start, end, steps,
                                                             dtype),
    kernel=_linspace_kernel,
    sbp=lambda start, end, steps, dtype: creation_sbp((steps,)),
    reference=lambda torch, start, end, steps, dtype: torch.linspace(start, end, steps,
                                                                     dtype=dtype),
    samples=_space_samples,
))


def _logspace_kernel(ctx, start, end, steps, base, dtype):
    shape = ctx.out_metas[0].shape
    if steps == 1:
        exps, comp = ctx.prims.full(shape, dt.float64, start), dt.float64
    else:
        exps, comp = _space_exponents(ctx, start, end, steps, dtype)
    vals = ctx.prims.binary("pow", _scalar(ctx, comp, base), exps)
    return _to(ctx, vals, dtype)


register(OpDef(
    "logspace",
    inputs=(),
    attrs={"start": Attr("scalar"), "end": Attr("scalar"), "steps": Attr("int"),
           "base": Attr("float", 10.0), "dtype": Attr("dtype")},
    infer_meta=lambda start, end, steps, base, dtype: _check_space("logspace", start, end,
                                                                   steps, dtype),
    kernel=_logspace_kernel,
    sbp=lambda start, end, steps, base, dtype: creation_sbp((steps,)),
    reference=lambda torch, start, end, steps, base=10.0, dtype=None: torch.logspace(
        start, end, steps, base, dtype=dtype),
    samples=lambda rng: [
        Sample(start=-2, end=1.5, steps=6, dtype=dt.float32),
        Sample(start=0, end=3, steps=7, base=2.0, dtype=dt.float64),
        Sample(start=1, end=2, steps=1, dtype=dt.float64),
    ],
))


# -- eye ------------------------------------------------------------------------------------
def _eye_meta(n, m, dtype):
    m = n if m is None else m
    if n < 0:
        raise op_error("eye", f"n must be greater or equal to 0, got {n}")
    if m < 0:
        raise op_error("eye", f"m must be greater or equal to 0, got {m}")
    return TensorMeta((n, m), dtype)


def _eye_kernel(ctx, n, m, dtype):
    rows, cols = ctx.piece(0)
    nr, nc = ctx.out_metas[0].shape
    r = ctx.prims.reshape(_iota(ctx, nr, rows.start), (nr, 1))
    c = ctx.prims.reshape(_iota(ctx, nc, cols.start), (1, nc))
    return ctx.prims.cast(ctx.prims.binary("eq", r, c), dtype)


register(OpDef(
    "eye",
    inputs=(),
    attrs={"n": Attr("int"), "m": Attr("int", None), "dtype": Attr("dtype")},
    infer_meta=_eye_meta,
    kernel=_eye_kernel,
    sbp=lambda n, m, dtype: creation_sbp(_eye_meta(n, m, dtype).shape),
    reference=lambda torch, n, m=None, dtype=None: torch.eye(n, n if m is None else m,
                                                             dtype=dtype),
    samples=lambda rng: [Sample(n=4, dtype=dt.float32), Sample(n=3, m=5, dtype=dt.int64),
                         Sample(n=5, m=2, dtype=dt.bool_), Sample(n=0, m=3, dtype=dt.float64)],
))


# -- random ---------------------------------------------------------------------------------
def _draw(ctx, kind, dtype, **params):
    """This kernel's piece of the logical random tensor."""
    return ctx.prims.random(kind, dtype, ctx.seed, ctx.offset, ctx.logical_out[0].shape,
                            ctx.piece(0), **params)


def _float_dtype(name, kernel, dtype):
    if not dtype.is_floating_point:
        raise _not_implemented(name, kernel, dtype)


def _uniform_meta(shape, low, high, dtype):
    _float_dtype("uniform", "check_uniform_bounds", dtype)
    if not low <= high:
        raise op_error("uniform", f"expects to return a [from, to) range, but found "
                       f"from={low} > to={high}")
    if high - low > np.finfo(np.float64).max:
        raise op_error("uniform", f"expects to-from <= std::numeric_limits<double>::max(), "
                       f"but found to={high} and from={low} which result in to-from to exceed "
                       "the limit")
    return TensorMeta(_check_shape("uniform", shape), dtype)


register(OpDef(
    "uniform",
    inputs=(),
    attrs={"shape": Attr("ints"), "low": Attr("float", 0.0), "high": Attr("float", 1.0),
           "dtype": Attr("dtype")},
    infer_meta=_uniform_meta,
    kernel=lambda ctx, shape, low, high, dtype: _draw(ctx, "uniform", dtype, low=low,
                                                      high=high),
    sbp=lambda shape, low, high, dtype: creation_sbp(shape),
    reference=lambda torch, shape, low=0.0, high=1.0, dtype=None: torch.empty(
        shape, dtype=dtype).uniform_(low, high),
    samples=lambda rng: [Sample(shape=(6, 5), dtype=dt.float32),
                         Sample(shape=(3, 4, 2), low=-2.0, high=3.0, dtype=dt.float64),
                         Sample(shape=(), dtype=dt.float16),
                         Sample(shape=(7,), dtype=dt.bfloat16)],
    random=True,
))


def _normal_meta(shape, mean, std, dtype):
    _float_dtype("normal", "normal_kernel_cpu", dtype)
    if not std >= 0.0:
        raise op_error("normal", f"normal expects std >= 0.0, but found std {std}")
    return TensorMeta(_check_shape("normal", shape), dtype)


register(OpDef(
    "normal",
    inputs=(),
    attrs={"shape": Attr("ints"), "mean": Attr("float", 0.0), "std": Attr("float", 1.0),
           "dtype": Attr("dtype")},
    infer_meta=_normal_meta,
    kernel=lambda ctx, shape, mean, std, dtype: _draw(ctx, "normal", dtype, mean=mean, std=std),
    sbp=lambda shape, mean, std, dtype: creation_sbp(shape),
    reference=lambda torch, shape, mean=0.0, std=1.0, dtype=None: torch.normal(
        mean, std, shape, dtype=dtype),
    samples=lambda rng: [Sample(shape=(6, 5), dtype=dt.float32),
                         Sample(shape=(2, 3, 4), mean=1.5, std=0.5, dtype=dt.float64),
                         Sample(shape=(5,), mean=-1.0, std=2.0, dtype=dt.float16),
                         Sample(shape=(0, 3), dtype=dt.float32)],
    random=True,
))


def _randint_meta(shape, low, high, dtype):
    if low >= high:
        raise op_error("randint", f"random_ expects 'from' to be less than 'to', but got "
                       f"from={low} >= to={high}")
    # Floats take any range (beyond 2**digits not every integer is representable; torch warns).
    if not dtype.is_floating_point:
        lo, hi = _int_range(dtype)
        if not lo <= low <= hi:
            raise op_error("randint", f"from is out of bounds for {_C_NAMES[dtype.name]}")
        if not lo <= high - 1 <= hi:
            raise op_error("randint", f"to - 1 is out of bounds for {_C_NAMES[dtype.name]}")
    if high - low > 2**64 - 1:
        raise op_error("randint", f"the range [{low}, {high}) is wider than 2**64 - 1")
    return TensorMeta(_check_shape("randint", shape), dtype)


register(OpDef(
    "randint",
    inputs=(),
    attrs={"shape": Attr("ints"), "low": Attr("int", 0), "high": Attr("int"),
           "dtype": Attr("dtype", dt.int64)},
    infer_meta=_randint_meta,
    kernel=lambda ctx, shape, low, high, dtype: _draw(ctx, "randint", dtype, low=low, high=high),
    sbp=lambda shape, low, high, dtype: creation_sbp(shape),
    reference=lambda torch, shape, low=0, high=None, dtype=None: torch.randint(
        low, high, shape, dtype=dtype or torch.int64),
    samples=lambda rng: [Sample(shape=(6, 5), low=0, high=10),
                         Sample(shape=(4, 3), low=-5, high=3, dtype=dt.int32),
                         Sample(shape=(9,), low=0, high=2, dtype=dt.bool_),
                         Sample(shape=(2, 2), low=0, high=256, dtype=dt.uint8),
                         Sample(shape=(3,), low=-100, high=100, dtype=dt.float32)],
    random=True,
))


def _randperm_meta(n, dtype):
    if n < 0:
        raise op_error("randperm", f"Trying to create tensor with negative dimension {n}: "
                       f"[{n}]")
    if dtype is dt.bool_:
        raise _not_implemented("randperm", "randperm", dtype)
    if not dtype.is_floating_point and n > _int_range(dtype)[1] + 1:
        raise op_error("randperm", f"n={n} is too large for {dtype.name}: value cannot be "
                       f"converted to type {_C_NAMES[dtype.name]} without overflow")
    return TensorMeta((n,), dtype)


def _randperm_kernel(ctx, n, dtype):
    # The order of n random keys: a uniformly random permutation.  Logical, not split: every
    # rank draws the whole permutation (it needs every key).
    count = ctx.logical_out[0].shape[0]
    keys = ctx.prims.random("uniform", dt.float64, ctx.seed, ctx.offset, (count,),
                            (slice(0, count),))
    _, order = ctx.prims.sort(keys, 0)
    return ctx.prims.cast(order, dtype)


register(OpDef(
    "randperm",
    inputs=(),
    attrs={"n": Attr("int"), "dtype": Attr("dtype", dt.int64)},
    infer_meta=_randperm_meta,
    kernel=_randperm_kernel,
    # () -> B only: a piece of a permutation depends on every key, so no rank can draw a slice
    # alone.
    sbp=lambda n, dtype: [Signature((), (B,))],
    reference=lambda torch, n, dtype=None: torch.randperm(n, dtype=dtype or torch.int64),
    samples=lambda rng: [Sample(n=10), Sample(n=1), Sample(n=0),
                         Sample(n=7, dtype=dt.float32), Sample(n=256, dtype=dt.uint8)],
    random=True,
))


def _bernoulli_meta(p):
    _float_dtype("bernoulli", "bernoulli_tensor_cpu_p_", p.dtype)
    return p


def _bernoulli_sbp(p):
    # (S(i)) -> S(i): element e of the output depends only on p[e] and its own words.
    return [Signature((B,), (B,))] + [
        Signature((Split(i),), (Split(i),)) for i, n in enumerate(p.shape) if n > 1
    ]


def _bernoulli_samples(rng):
    return [Sample(rng.uniform(0, 1, (6, 5)), grad=False),
            Sample(rng.uniform(0, 1, (3, 4)).astype(np.float32), grad=False),
            Sample(np.array([0.0, 1.0, 0.0, 1.0]), grad=False),
            Sample(np.asarray(0.5)), Sample(rng.uniform(0, 1, (4, 3)))]


register(OpDef(
    "bernoulli",
    inputs=("input",),
    infer_meta=_bernoulli_meta,
    kernel=lambda ctx, p: _draw(ctx, "bernoulli", ctx.out_metas[0].dtype, p=p),
    # torch: the draw is not differentiable in p; the gradient is zero.
    saves=(),
    grad=lambda ctx, g: (op("mul_scalar", g, other=0.0),),
    sbp=_bernoulli_sbp,
    reference="bernoulli",
    samples=_bernoulli_samples,
    random=True,
))


# -- multinomial ----------------------------------------------------------------------------
def _multinomial_meta(p, num_samples, replacement):
    if p.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not p.dtype.is_floating_point:
        raise RuntimeError("multinomial only supports floating-point dtypes for input, got: "
                           f"{_TORCH_NAMES.get(p.dtype.name, p.dtype.name)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > p.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    return TensorMeta(p.shape[:-1] + (num_samples,), dt.int64)


def _check_distribution(ctx, p):
    """torch's value checks (the values are needed, so they run in the kernel)."""
    prims = ctx.prims
    axes = tuple(range(len(p.shape)))
    lo = float(prims.to_host(prims.reduce("min", p, axes)))
    hi = float(prims.to_host(prims.reduce("max", p, axes)))
    if not (lo >= 0 and math.isfinite(hi)):  # nan fails both comparisons
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    totals = prims.reduce("sum", p, (len(p.shape) - 1,))
    if not float(prims.to_host(prims.reduce("min", totals, tuple(range(len(totals.shape)))))
                 ) > 0:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")


def _substream_seed(seed: int, offset: int) -> int:
    """A seed of its own for draws larger than the op's reservation on the generator (which
    is sized by the output): keyed on (seed, offset), so calls never share words."""
    return (seed * 0x9E3779B97F4A7C15 + offset * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (
        2**64)


# Above this many (row, sample, category) comparisons, counting goes through a sort.
_COMPARE_LIMIT = 1 << 22


def _count_at_most(prims, cdf, target):
    """Per row: how many entries of the ascending cdf (*rows, k) are <= each target
    (*rows, s), as int64 (*rows, s)."""
    k, s = cdf.shape[-1], target.shape[-1]
    rows = tuple(cdf.shape[:-1])
    last = len(rows)
    if math.prod(rows) * k * s <= _COMPARE_LIMIT:  # one broadcast comparison
        below = prims.binary("le", prims.reshape(cdf, rows + (1, k)),
                             prims.reshape(target, rows + (s, 1)))
        return prims.reduce("sum", prims.cast(below, dt.int64), (last + 1,))
    # A merge by a stable sort of [cdf | targets]: ties keep cdf entries first, so the number
    # of cdf entries up to a target's position is its count.  O((k + s) log) per row.
    merged = prims.empty(rows + (k + s,), dt.float64)
    prims.copy(prims.slice(merged, (Ellipsis, slice(0, k))), cdf)
    prims.copy(prims.slice(merged, (Ellipsis, slice(k, k + s))), target)
    _, order = prims.sort(merged, last, descending=False, stable=True)
    is_cdf = prims.cast(prims.binary("lt", order, prims.full((), dt.int64, k)), dt.int64)
    seen = prims.scan("cumsum", is_cdf, last)
    by_element = prims.empty(rows + (k + s,), dt.int64)
    prims.scatter(by_element, last, order, seen)  # back to the merged array's element order
    return prims.contiguous(prims.slice(by_element, (Ellipsis, slice(k, k + s))))


def _multinomial_kernel(ctx, p, num_samples, replacement):
    prims = ctx.prims
    if 0 in p.shape[:-1]:
        return prims.full(ctx.out_metas[0].shape, dt.int64, 0)
    _check_distribution(ctx, p)
    p = p if p.dtype == np.float64 else prims.cast(p, dt.float64)
    k = p.shape[-1]
    last = len(p.shape) - 1
    rows = ctx.logical_out[0].shape[:-1]  # logical rows (a split input holds some of them)
    if replacement:
        # Inverse CDF: sample j is the number of cumulative sums <= u_j * total.  Draws have
        # the output's shape, so a piece of the output draws its own words.
        u = prims.random("uniform", dt.float64, ctx.seed, ctx.offset, ctx.logical_out[0].shape,
                         ctx.piece(0))
        cdf = prims.scan("cumsum", p, last)
        total = prims.slice(cdf, (Ellipsis, slice(k - 1, k)))
        target = prims.binary("mul", u, total)  # (*rows, s)
        idx = _count_at_most(prims, cdf, target)
        # u * total can round up to total: never past the last category of positive mass.
        positive = prims.binary("gt", p, prims.full((), dt.float64, 0.0))
        from_end = prims.reduce("argmax", prims.flip(positive, (last,)), (last,), True)
        last_pos = prims.binary("sub", prims.full((), dt.int64, k - 1), from_end)
        return prims.binary("minimum", idx, last_pos)
    # Without replacement: the num_samples largest keys p_i / E_i with E_i ~ Exp(1) (the
    # exponential race: a weighted draw without replacement; zero mass never wins over a
    # positive one).  Keys cover every category of a row, more words than the output
    # reserves: they come from a substream, indexed by the logical row.
    piece = ctx.piece(0)
    keys_shape = rows + (k,)
    keys_piece = tuple(piece[:-1]) + (slice(0, k),)
    u = prims.random("uniform", dt.float64, _substream_seed(ctx.seed, ctx.offset), 0,
                     keys_shape, keys_piece)
    e = prims.unary("neg", prims.unary("log1p", prims.unary("neg", u)))
    keys = prims.binary("div", p, e)
    _, order = prims.sort(keys, last, descending=True)
    return prims.contiguous(prims.slice(order, (Ellipsis, slice(0, num_samples))))


def _multinomial_sbp(p, num_samples, replacement):
    sigs = [Signature((B,), (B,))]
    if p.ndim == 2 and p.shape[0] > 1:  # (S0)->S0: rows are independent distributions
        sigs.append(Signature((Split(0),), (Split(0),)))
    if replacement and num_samples > 1:  # (B)->S(-1): each sample draws its own word
        sigs.append(Signature((B,), (Split(p.ndim - 1),)))
    return sigs


def _multinomial_samples(rng):
    return [
        Sample(rng.uniform(0, 1, (3, 5)), num_samples=3),
        Sample(rng.uniform(0, 1, (6,)).astype(np.float32), num_samples=6),
        Sample(rng.uniform(0, 1, (4, 3)), num_samples=7, replacement=True),
        Sample(np.array([0.0, 2.0, 0.0, 1.0, 0.0]), num_samples=4, replacement=True),
        Sample(np.array([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0]]), num_samples=1),
    ]


register(OpDef(
    "multinomial",
    inputs=("input",),
    attrs={"num_samples": Attr("int"), "replacement": Attr("bool", False)},
    infer_meta=_multinomial_meta,
    kernel=_multinomial_kernel,
    sbp=_multinomial_sbp,
    reference=lambda torch, p, num_samples, replacement=False: torch.multinomial(
        p, num_samples, replacement),
    samples=_multinomial_samples,
    random=True,
))
