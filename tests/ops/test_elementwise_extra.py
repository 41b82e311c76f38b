"""Elementwise behaviour the registry-generated tests do not reach: operators and their
reflected and in-place forms, scalar routing and promotion, torch's errors, gradients at
kinks and masked points, and the vectorised erf against math.erf.  torch 2.13 is the oracle.
"""

from __future__ import annotations

import importlib
import math
import operator
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow

special = importlib.import_module("sbpflow.device.special")


def _pair(values, dtype=None):
    """The same data as an sbpflow and a torch tensor."""
    a = np.asarray(values) if dtype is None else np.asarray(values, dtype=dtype)
    return flow.tensor(a), torch.from_numpy(a.copy())


def _same(got, expected, rtol=1e-6, atol=1e-6):
    assert isinstance(got, flow.Tensor), f"expected a tensor, got {type(got).__name__}"
    assert got.dtype.name == str(expected.dtype).replace("torch.", ""), (
        f"dtype {got.dtype.name} != {expected.dtype}")
    assert tuple(got.shape) == tuple(expected.shape)
    a = got.detach().numpy()
    b = expected.detach().numpy()
    if a.dtype.kind == "f":
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(a, b)


def _outcome(fn, *args):
    try:
        return fn(*args), None
    except Exception as e:  # the kind of error is what is compared
        return None, e


def _same_outcome(flow_fn, torch_fn, flow_args, torch_args, **tol):
    got, err = _outcome(flow_fn, *flow_args)
    expected, terr = _outcome(torch_fn, *torch_args)
    if terr is not None:
        assert err is not None, f"torch raised {type(terr).__name__}: {terr}; sbpflow did not"
        # torch raises NotImplementedError (a RuntimeError) for missing dtype kernels.
        assert isinstance(err, type(terr)) or isinstance(terr, type(err)), (
            f"torch raised {type(terr).__name__}, sbpflow {type(err).__name__}: {err}")
        return
    assert err is None, f"sbpflow raised {type(err).__name__}: {err}"
    if isinstance(expected, torch.Tensor):
        _same(got, expected, **tol)
    else:
        assert got == expected


# -- operators --------------------------------------------------------------------------------
# Operand kinds: (sbpflow value, torch value).  No zeros, so integer // and % stay defined.
def _operands():
    f32 = np.array([[1.5, -2.25, 3.0], [0.5, -4.0, 2.0]], dtype=np.float32)
    i64 = np.array([[3, -4, 5], [7, -1, 2]], dtype=np.int64)
    i32 = np.array([2, -3, 6], dtype=np.int32)
    b = np.array([True, False, True])
    f64_0d = np.asarray(1.75)
    i64_0d = np.asarray(-2)
    out = {}
    for name, arr in (("f32", f32), ("i64", i64), ("i32", i32), ("bool", b),
                      ("f64_0d", f64_0d), ("i64_0d", i64_0d)):
        out[name] = (flow.tensor(arr), torch.from_numpy(arr.copy()))
    for v in (3, -2, 2.5, True):
        out[repr(v)] = (v, v)
    return out


_OPERANDS = _operands()
_BINARY_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "&": operator.and_,
    "|": operator.or_, "^": operator.xor, "==": operator.eq, "!=": operator.ne,
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
_PAIRS = [(a, b) for a in _OPERANDS for b in _OPERANDS
          if isinstance(_OPERANDS[a][0], flow.Tensor) or isinstance(_OPERANDS[b][0], flow.Tensor)]


# Integer // and % by the bool tensor's False raise ZeroDivisionError in torch, which looks
# at the data; sbpflow's kernels cannot (a known gap), so those pairs are left out.
_OPERATOR_CASES = [(s, a, b) for s in _BINARY_OPERATORS for a, b in _PAIRS
                   if not (s in ("//", "%") and b == "bool")]


@pytest.mark.parametrize("symbol,lhs,rhs", _OPERATOR_CASES,
                         ids=[f"{a}{s}{b}" for s, a, b in _OPERATOR_CASES])
def test_binary_operator_matches_torch(symbol, lhs, rhs):
    fn = _BINARY_OPERATORS[symbol]
    (fa, ta), (fb, tb) = _OPERANDS[lhs], _OPERANDS[rhs]
    # rtol covers torch's reciprocal-based 2 / x.
    _same_outcome(fn, fn, (fa, fb), (ta, tb), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("operand", ["f32", "i64", "i32", "bool", "f64_0d", "i64_0d"])
@pytest.mark.parametrize("fn", [operator.neg, operator.pos, operator.abs, operator.invert],
                         ids=["neg", "pos", "abs", "invert"])
def test_unary_operator_matches_torch(fn, operand):
    fa, ta = _OPERANDS[operand]
    _same_outcome(fn, fn, (fa,), (ta,))


def test_positive_returns_the_input():
    x = flow.tensor([1.0, -2.0])
    assert flow.positive(x) is x
    assert (+x) is x


def test_comparison_with_non_numbers():
    x = flow.tensor([1.0, 2.0])
    assert (x == None) is False  # noqa: E711 - the operator is under test
    assert (x != None) is True  # noqa: E711
    with pytest.raises(TypeError):
        _ = x < "a"
    with pytest.raises(TypeError):
        _ = x + "a"
    with pytest.raises(TypeError):
        _ = "a" - x
    assert hash(x) == id(x)  # defining __eq__ keeps tensors hashable by identity
    assert len({x, flow.tensor([1.0, 2.0])}) == 2


_INPLACE = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor,
}


_TARGETS = {"f32": np.array([1.5, -2.25, 3.0], dtype=np.float32),
            "i64": np.array([3, -4, 5]), "bool": np.array([True, False, True])}


@pytest.mark.parametrize("symbol", list(_INPLACE))
@pytest.mark.parametrize("lhs", list(_TARGETS))
@pytest.mark.parametrize("rhs", ["i32", "f64_0d", "3", "2.5", "True"])
def test_inplace_operator_matches_torch(symbol, lhs, rhs):
    fn = _INPLACE[symbol]
    fa, ta = _pair(_TARGETS[lhs])
    fb, tb = _OPERANDS[rhs]
    got, err = _outcome(fn, fa, fb)
    expected, terr = _outcome(fn, ta, tb)
    if terr is not None:
        assert err is not None and isinstance(err, RuntimeError | TypeError), (
            f"torch raised {type(terr).__name__}: {terr}; sbpflow: {err!r}")
        return
    assert err is None, f"sbpflow raised {type(err).__name__}: {err}"
    assert got is fa, "an in-place operator must return the target itself"
    _same(fa, ta, rtol=2e-6)


@pytest.mark.parametrize("method,args,kwargs", [
    ("add_", (2.5,), {"alpha": 2}), ("sub_", ("T",), {"alpha": 0.5}), ("mul_", ("T",), {}),
    ("div_", ("T",), {}), ("div_", (2.0,), {"rounding_mode": "floor"}),
    ("div_", ("T",), {"rounding_mode": "trunc"}), ("pow_", (2,), {}),
    ("remainder_", (1.5,), {}), ("fmod_", ("T",), {}), ("clamp_", (-0.5, 0.5), {}),
    ("clamp_", (), {"min": 0.0}), ("clip_", ("T", None), {}), ("clamp_min_", (0.1,), {}),
    ("clamp_max_", ("T",), {}), ("lerp_", ("T", 0.3), {}), ("addcmul_", ("T", "T"),
                                                             {"value": 2}),
    ("addcdiv_", ("T", "T"), {"value": -1}), ("sigmoid_", (), {}), ("exp_", (), {}),
    ("round_", (), {"decimals": 1}), ("sign_", (), {}), ("frac_", (), {}), ("neg_", (), {}),
    ("abs_", (), {}), ("nan_to_num_", (), {}), ("eq_", ("T",), {}), ("lt_", (0.0,), {}),
    ("atan2_", ("T",), {}), ("logical_and_", ("T",), {}), ("square_", (), {}),
    ("floor_divide_", (0.75,), {}), ("erf_", (), {}), ("reciprocal_", (), {}),
])
def test_inplace_method_matches_torch(method, args, kwargs):
    data = np.array([0.25, -1.5, 2.0, -0.75], dtype=np.float32)
    other = np.array([0.5, 1.25, -2.0, -0.5], dtype=np.float32)
    fx, tx = _pair(data)
    fo, to = _pair(other)
    f_args = [fo if a == "T" else a for a in args]
    t_args = [to if a == "T" else a for a in args]
    version = fx._version
    got = getattr(fx, method)(*f_args, **kwargs)
    getattr(tx, method)(*t_args, **kwargs)
    assert got is fx
    assert fx._version > version
    _same(fx, tx)


def test_inplace_rejects_promoting_the_target():
    fi = flow.tensor([1, 2])
    with pytest.raises(RuntimeError, match="can't be cast"):
        fi += 1.5
    with pytest.raises(RuntimeError, match="can't be cast"):
        fi.sqrt_()
    with pytest.raises(RuntimeError):
        fi.div_(2)


# -- functions: scalar positions, aliases, promotion -------------------------------------------
_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]


def _typed(dtype, shape=(3,)):
    base = np.array([3, 1, 2], dtype=np.float64).reshape(shape) if shape else np.asarray(2.0)
    return _pair(base.astype(dtype))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "floor_divide", "remainder",
                                  "fmod", "pow", "maximum", "minimum", "atan2", "eq", "lt",
                                  "ge", "bitwise_and", "logical_xor"])
@pytest.mark.parametrize("da", _DTYPES)
@pytest.mark.parametrize("db", ["float32", "int64", "int8", "bool", "float64_0d", "int32_0d"])
def test_binary_promotion_matches_torch(name, da, db):
    fa, ta = _typed(da)
    if db.endswith("_0d"):
        fb, tb = _typed(db[:-3], shape=())
    else:
        fb, tb = _typed(db)
    _same_outcome(getattr(flow, name), getattr(torch, name), (fa, fb), (ta, tb), rtol=1e-3,
                  atol=1e-3)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "floor_divide", "remainder",
                                  "fmod", "pow", "eq", "ne", "gt", "le", "bitwise_or",
                                  "bitwise_xor"])
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("scalar", [2, 2.5, True, -3, 1000])
def test_scalar_operand_matches_torch(name, dtype, scalar):
    fx, tx = _typed(dtype)
    _same_outcome(getattr(flow, name), getattr(torch, name), (fx, scalar), (tx, scalar),
                  rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["remainder", "pow", "sub", "mul", "add"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32", "uint8"])
@pytest.mark.parametrize("scalar", [2, 2.5, -1])
def test_scalar_first_matches_torch(name, dtype, scalar):
    fx, tx = _typed(dtype)
    if name in ("add", "mul", "sub"):  # torch.add(Number, Tensor) is not an overload
        _same_outcome(lambda a, b: getattr(flow, name)(a, b), lambda a, b: getattr(
            torch, name)(torch.tensor(a), b), (scalar, fx), (scalar, tx))
        return
    _same_outcome(getattr(flow, name), getattr(torch, name), (scalar, fx), (scalar, tx),
                  rtol=1e-5)


@pytest.mark.parametrize("name", [
    "abs", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal",
    "square", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "sigmoid", "erf", "erfinv", "floor", "ceil", "round", "trunc", "frac",
    "sign", "neg", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite", "nan_to_num",
    "positive", "absolute", "negative", "fix", "arcsin", "arccos", "arctan", "arcsinh",
    "arccosh", "arctanh",
])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "int64", "int8", "uint8",
                                   "bool"])
def test_unary_dtype_rules_match_torch(name, dtype):
    values = {"acosh": [1.0, 2.0, 3.0], "arccosh": [1.0, 2.0, 3.0]}.get(name, [0.0, 1.0, 0.0])
    fx, tx = _pair(np.array(values).astype(dtype))
    _same_outcome(getattr(flow, name), getattr(torch, name), (fx,), (tx,), rtol=1e-3,
                  atol=1e-3)


def test_special_values_match_torch():
    vals = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 2.5, -2.5, 0.5, 1e308, -1e-310])
    fx, tx = _pair(vals)
    for name in ("sign", "round", "floor", "ceil", "trunc", "frac", "abs", "sigmoid", "erf",
                 "tanh", "exp", "expm1", "isnan", "isinf", "isfinite", "nan_to_num",
                 "logical_not", "square"):
        with np.errstate(all="ignore"):
            _same(getattr(flow, name)(fx), getattr(torch, name)(tx), rtol=1e-12, atol=0)
    for dtype in ("float16", "float32"):
        fx16, tx16 = _pair(np.array([np.nan, np.inf, -np.inf, 1.0], dtype=dtype))
        _same(flow.nan_to_num(fx16), torch.nan_to_num(tx16), rtol=0, atol=0)
        _same(flow.nan_to_num(fx16, nan=1.0, posinf=2.0, neginf=-3.0),
              torch.nan_to_num(tx16, nan=1.0, posinf=2.0, neginf=-3.0), rtol=0, atol=0)


@pytest.mark.parametrize("decimals", [-2, -1, 1, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_round_decimals_matches_torch(decimals, dtype):
    rng = np.random.default_rng(decimals + 10)
    fx, tx = _pair((rng.standard_normal(50) * 300).astype(dtype))
    _same(flow.round(fx, decimals=decimals), torch.round(tx, decimals=decimals), rtol=0,
          atol=0)


def test_integer_powers_match_torch():
    base = np.array([2, 1, -1, -1, 0, 3, -2, 5, 7], dtype=np.int64)
    exp = np.array([-1, -2, -3, -2, 2, 0, 3, 30, 40], dtype=np.int64)  # wraps like torch
    for dtype in ("int64", "int32", "int8", "int16"):
        fa, ta = _pair(base.astype(dtype))
        fb, tb = _pair(exp.astype(dtype))
        _same(flow.pow(fa, fb), torch.pow(ta, tb))
        _same(2 ** fb, 2 ** tb)
        _same((-1) ** fb, (-1) ** tb)
        _same(fa ** 3, ta ** 3)


def test_integer_scalars_wrap_like_torch():
    fx, tx = _pair(np.array([1, -24, 100], dtype=np.int8))
    for fn in (lambda x: x + 1000, lambda x: x == 1000, lambda x: x | 257, lambda x: x * 300):
        _same(fn(fx), fn(tx))
    fu, tu = _pair(np.array([1, 0, 255], dtype=np.uint8))
    for fn in (lambda x: x - 2, lambda x: x < -1, lambda x: 3 - x):
        _same(fn(fu), fn(tu))


def test_comparisons_compute_in_the_promoted_dtype():
    fa, ta = _pair(np.array([16777217, 3]))
    fb, tb = _pair(np.array([16777216.0, 3.0], dtype=np.float32))
    _same(fa == fb, ta == tb)  # int64 -> float32 rounds 16777217 to 16777216
    _same(fa == 16777216.0, ta == 16777216.0)
    _same(flow.eq(fa.to(flow.float64), fb), torch.eq(ta.double(), tb))


def test_div_rounding_modes_match_torch():
    a = np.array([7, -7, 7, -7, 0, 5, -9], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, 5, 4], dtype=np.int64)
    for dtype in ("int64", "int32", "int8", "float32", "float64"):
        fa, ta = _pair(a.astype(dtype))
        fb, tb = _pair(b.astype(dtype))
        for mode in (None, "trunc", "floor"):
            _same(flow.div(fa, fb, rounding_mode=mode), torch.div(ta, tb, rounding_mode=mode))
            _same(flow.div(fa, 3, rounding_mode=mode), torch.div(ta, 3, rounding_mode=mode))
            _same(flow.div(-9, fb, rounding_mode=mode),
                  torch.div(torch.tensor(-9, dtype=tb.dtype), tb, rounding_mode=mode))
        _same(flow.floor_divide(fa, fb), torch.floor_divide(ta, tb))
        _same(flow.remainder(fa, fb), torch.remainder(ta, tb))
        _same(flow.fmod(fa, fb), torch.fmod(ta, tb))
        _same(flow.true_divide(fa, fb), torch.true_divide(ta, tb))


def test_add_sub_alpha_and_rsub_match_torch():
    fa, ta = _pair(np.array([1.5, -2.0, 3.0]))
    fb, tb = _pair(np.array([0.5, 4.0, -1.0]))
    fi, ti = _pair(np.array([1, 2, 3]))
    _same(flow.add(fa, fb, alpha=2.5), torch.add(ta, tb, alpha=2.5))
    _same(flow.sub(fa, fb, alpha=-3), torch.sub(ta, tb, alpha=-3))
    _same(flow.sub(fa, 2, alpha=3), torch.sub(ta, 2, alpha=3))
    _same(flow.rsub(fa, fb, alpha=2), torch.rsub(ta, tb, alpha=2))
    _same(flow.rsub(fa, 2.5), torch.rsub(ta, 2.5))
    _same(flow.add(fi, fi, alpha=2), torch.add(ti, ti, alpha=2))
    _same(flow.subtract(fa, fb), torch.subtract(ta, tb))
    with pytest.raises(RuntimeError, match="alpha"):
        flow.add(fi, fi, alpha=0.5)
    with pytest.raises(RuntimeError, match="Boolean alpha"):
        flow.add(fi, fi, alpha=True)


def test_where_forms_match_torch():
    c = np.array([[True, False, True], [False, False, True]])
    fc, tc = _pair(c)
    fx, tx = _pair(np.array([1.5, -2.0, 3.0], dtype=np.float32))
    fi, ti = _pair(np.array([[1], [2]], dtype=np.int32))
    cases = [(fx, fi, tx, ti), (fx, 0.5, tx, 0.5), (2, fx, 2, tx), (fi, 7, ti, 7),
             (1.0, 0.0, 1.0, 0.0), (1, 0, 1, 0), (True, 2, True, 2), (fi, 0.5, ti, 0.5)]
    for fa, fb, ta, tb in cases:
        _same(flow.where(fc, fa, fb), torch.where(tc, ta, tb))
    _same(fx.where(fc, 0.0), tx.where(tc, 0.0))
    fu, tu = _pair(np.array([1, 0, 1], dtype=np.uint8))
    with warnings.catch_warnings():  # torch deprecates uint8 conditions (warns once)
        warnings.simplefilter("ignore")
        expected = torch.where(tu, tx, 0.0)
    _same(flow.where(fu, fx, 0.0), expected)
    with pytest.raises(RuntimeError, match="boolean"):
        flow.where(fx, fx, fx)


def test_clamp_forms_match_torch():
    fx, tx = _pair(np.array([-2.0, -0.5, 0.0, 0.5, 2.0, np.nan]))
    fi, ti = _pair(np.array([-3, 0, 4]))
    flo, tlo = _pair(np.array([-1.0, 0.0, -1.0, 1.0, 0.0, 0.0]))
    for args in [(-1, 1), (0.25, None), (None, 0.25), (1.0, -1.0), (float("nan"), None)]:
        _same(flow.clamp(fx, *args), torch.clamp(tx, *args))
        _same(flow.clip(fx, *args), torch.clip(tx, *args))
    _same(flow.clamp(fi, 0.5, 2), torch.clamp(ti, 0.5, 2))
    _same(flow.clamp(fi, -1, 2), torch.clamp(ti, -1, 2))
    _same(flow.clamp(fx, flo), torch.clamp(tx, tlo))
    _same(flow.clamp(fx, None, flo), torch.clamp(tx, None, tlo))
    # A number beside a tensor bound: torch takes it when the tensor is 0-dim.
    f0, t0 = _pair(np.asarray(-0.25))
    _same(flow.clamp(fx, f0, 1.0), torch.clamp(tx, min=t0, max=1.0))
    _same(flow.clamp(fx, -1.5, f0), torch.clamp(tx, min=-1.5, max=t0))
    _same(flow.clamp_min(fx, 0.1), torch.clamp_min(tx, 0.1))
    _same(flow.clamp_max(fx, flo), torch.clamp_max(tx, tlo))
    _same(flow.clamp_max(fi, 0.5), torch.clamp_max(ti, 0.5))
    with pytest.raises(RuntimeError, match="At least one"):
        flow.clamp(fx)
    fb, tb = _pair(np.array([True, False]))
    _same(flow.clamp(fb, 0, 1), torch.clamp(tb, 0, 1))
    with pytest.raises(RuntimeError):  # NotImplementedError, as torch
        flow.clamp(fb, False, True)


def test_lerp_addcmul_addcdiv_match_torch():
    rng = np.random.default_rng(0)
    fs, ts = _pair(rng.standard_normal((2, 3)).astype(np.float32))
    fe, te = _pair(rng.standard_normal(3).astype(np.float32))
    fw, tw = _pair(rng.uniform(-1, 2, (2, 1)).astype(np.float32))
    for w in (0.0, 0.3, 0.5, 1.0, -2.0):
        _same(flow.lerp(fs, fe, w), torch.lerp(ts, te, w), rtol=0, atol=0)
    _same(flow.lerp(fs, fe, fw), torch.lerp(ts, te, tw), rtol=0, atol=0)
    _same(flow.addcmul(fs, fe, fw, value=0.5), torch.addcmul(ts, te, tw, value=0.5))
    _same(flow.addcdiv(fs, fe, fw, value=-2), torch.addcdiv(ts, te, tw, value=-2))
    fi, ti = _pair(np.array([3, -4]))
    _same(flow.addcmul(fi, fi, fi, value=0.5), torch.addcmul(ti, ti, ti, value=0.5))
    ff, tf = _pair(np.array([0.5, -1.5], dtype=np.float32))
    _same(flow.addcmul(fi, ff, fi), torch.addcmul(ti, tf, ti))
    with pytest.raises(RuntimeError, match="Integer division"):
        flow.addcdiv(fi, fi, fi)
    with pytest.raises(RuntimeError, match="expected dtype"):
        flow.lerp(fs, fe.to(flow.float64), 0.5)
    with pytest.raises(RuntimeError):
        flow.lerp(fi, fi, 0.5)


@pytest.mark.parametrize("call,exc", [
    (lambda x, i, b: b - b, RuntimeError),
    (lambda x, i, b: x - b, RuntimeError),
    (lambda x, i, b: b - 1, RuntimeError),
    (lambda x, i, b: -b, RuntimeError),
    (lambda x, i, b: +b, RuntimeError),
    (lambda x, i, b: x & 1, NotImplementedError),
    (lambda x, i, b: i & 1.5, NotImplementedError),
    (lambda x, i, b: flow.bitwise_not(x), NotImplementedError),
    (lambda x, i, b: ~x, TypeError),
    (lambda x, i, b: i ** -1, RuntimeError),
    (lambda x, i, b: b // b, NotImplementedError),
    (lambda x, i, b: flow.abs(b), NotImplementedError),
    (lambda x, i, b: flow.floor(b), NotImplementedError),
    (lambda x, i, b: flow.frac(i), NotImplementedError),
    (lambda x, i, b: flow.round(i, decimals=1), NotImplementedError),
    (lambda x, i, b: flow.div(x, x, rounding_mode="x"), RuntimeError),
    (lambda x, i, b: flow.maximum(x, 1), TypeError),
    (lambda x, i, b: flow.atan2(x, 1.0), TypeError),
    (lambda x, i, b: flow.logical_and(x, 1), TypeError),
    (lambda x, i, b: x + flow.tensor([1.0, 2.0, 3.0]), RuntimeError),
])
def test_errors_match_torch(call, exc):
    x, i, b = flow.tensor([1.5, -2.0]), flow.tensor([3, -4]), flow.tensor([True, False])
    tx, ti, tb = torch.tensor([1.5, -2.0]), torch.tensor([3, -4]), torch.tensor([True, False])
    with pytest.raises(exc):
        call(x, i, b)
    if call.__code__.co_names.count("flow") == 0:  # operator-only cases run on torch too
        with pytest.raises(exc):
            call(tx, ti, tb)


# -- gradients at kinks and masked points ----------------------------------------------------
def _grads(flow_fn, torch_fn, *arrays, create_graph=False):
    f_in = [flow.tensor(a, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    f_out, t_out = flow_fn(*f_in), torch_fn(*t_in)
    cot = np.linspace(0.5, 1.5, int(np.prod(f_out.shape))).reshape(tuple(f_out.shape))
    fg = flow.autograd.grad([f_out], f_in, [flow.tensor(cot)], allow_unused=True)
    tg = torch.autograd.grad([t_out], t_in, [torch.tensor(cot)], allow_unused=True,
                             materialize_grads=True)
    for k, (a, b) in enumerate(zip(fg, tg, strict=True)):
        assert a is not None, f"input {k} got no gradient"
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-12,
                                   equal_nan=True, err_msg=f"grad of input {k}")


def test_maximum_minimum_split_ties_like_torch():
    a = np.array([1.0, 2.0, 3.0, 0.0, -1.0])
    b = np.array([2.0, 2.0, 1.0, 0.0, 0.0])
    _grads(flow.maximum, torch.maximum, a, b)
    _grads(flow.minimum, torch.minimum, a, b)
    _grads(flow.maximum, torch.maximum, a.reshape(5, 1), b)  # broadcast ties


def test_clamp_gradient_at_bounds_like_torch():
    x = np.array([1.0, 2.0, 3.0, 0.0, -1.0, 1.5])
    _grads(lambda t: flow.clamp(t, 1.0, 2.0), lambda t: torch.clamp(t, 1.0, 2.0), x)
    _grads(lambda t: flow.clamp(t, min=1.0), lambda t: torch.clamp(t, min=1.0), x)
    _grads(lambda t: flow.clamp(t, 2.0, 1.0), lambda t: torch.clamp(t, 2.0, 1.0), x)
    lo, hi = np.ones(6), np.full(6, 2.0)
    _grads(flow.clamp, torch.clamp, x, lo, hi)
    _grads(flow.clamp, torch.clamp, x, lo, lo)  # lo == hi: torch's exact tie rule
    _grads(flow.clamp, torch.clamp, x, hi, lo)  # lo > hi
    _grads(flow.clamp_min, torch.clamp_min, x, lo)
    _grads(flow.clamp_max, torch.clamp_max, x, hi)


def test_pow_gradient_masks_like_torch():
    base = np.array([0.0, 0.0, 0.0, -2.0, 1.5, 2.0, 0.0])
    exp = np.array([-1.0, 0.0, 2.0, 2.0, 0.5, 0.0, 0.5])
    with np.errstate(all="ignore"):
        _grads(flow.pow, torch.pow, base, exp)
        _grads(lambda e: 0.0 ** e, lambda e: 0.0 ** e, np.array([-1.0, 0.0, 1.0, 2.5]))
        _grads(lambda e: 2.5 ** e, lambda e: 2.5 ** e, np.array([-1.0, 0.0, 1.0]))
        _grads(lambda x: x ** 0, lambda x: x ** 0, np.array([0.0, 1.0, -2.0]))
        _grads(lambda x: x ** 0.5, lambda x: x ** 0.5, np.array([0.0, 1.0, 4.0]))
        _grads(lambda x: x ** -2, lambda x: x ** -2, np.array([0.5, 1.0, -4.0]))


@pytest.mark.parametrize("flow_fn,torch_fn,x", [
    (flow.abs, torch.abs, [-1.0, 0.0, 2.0]),
    (flow.sign, torch.sign, [-1.0, 0.0, 2.0]),
    (flow.round, torch.round, [0.5, 1.2, -2.5]),
    (flow.floor, torch.floor, [0.5, 1.2, -2.5]),
    (flow.frac, torch.frac, [0.5, 1.2, -2.5]),
    (flow.sqrt, torch.sqrt, [0.0, 1.0, 4.0]),
    (flow.nan_to_num, torch.nan_to_num, [1.0, np.nan, np.inf, -np.inf]),
    (lambda t: flow.where(t > 0, t, 0.0), lambda t: torch.where(t > 0, t, 0.0), [-1.0, 2.0]),
    (lambda t: flow.where(t > 0, 1.0, t), lambda t: torch.where(t > 0, 1.0, t), [-1.0, 2.0]),
    (lambda t: flow.div(t, 2.0, rounding_mode="floor"),
     lambda t: torch.div(t, 2.0, rounding_mode="floor"), [3.0, -1.0]),
    (lambda t: 2.0 / t, lambda t: 2.0 / t, [0.5, -4.0]),
    (lambda t: 3.0 - t, lambda t: 3.0 - t, [0.5, -4.0]),
    (lambda t: t % 1.5, lambda t: t % 1.5, [2.0, -4.0]),
    (lambda t: flow.fmod(t, -1.5), lambda t: torch.fmod(t, -1.5), [2.0, -4.0]),
])
def test_unary_gradients_match_torch(flow_fn, torch_fn, x):
    with np.errstate(all="ignore"):
        _grads(flow_fn, torch_fn, np.array(x))


@pytest.mark.parametrize("fn", ["where", "atan2", "remainder", "fmod", "div", "lerp",
                                "addcmul", "addcdiv", "sub"])
def test_binary_gradients_with_broadcasting(fn):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 1, 4)) * 3
    b = rng.uniform(0.5, 2, (2, 1)) * rng.choice([-1, 1], (2, 1))
    c = rng.uniform(0.5, 2, (4,))
    if fn == "where":
        cond = a[..., 0:1] > 0
        _grads(lambda x, y: flow.where(flow.tensor(cond), x, y),
               lambda x, y: torch.where(torch.tensor(cond), x, y), a, b)
    elif fn in ("lerp", "addcmul", "addcdiv"):
        _grads(getattr(flow, fn), getattr(torch, fn), a, b, c)
    else:
        _grads(getattr(flow, fn), getattr(torch, fn), a, b)


def test_reverse_remainder_gradient_by_finite_differences():
    # torch has no derivative for remainder(Number, Tensor): compare with differences.
    x = np.array([0.7, -1.3, 2.2, -0.9])
    t = flow.tensor(x, requires_grad=True)
    (g,) = flow.autograd.grad([5.0 % t], [t], [flow.ones(4, dtype=flow.float64)])
    eps = 1e-6
    numeric = (np.remainder(5.0, x + eps) - np.remainder(5.0, x - eps)) / (2 * eps)
    np.testing.assert_allclose(g.numpy(), numeric, rtol=1e-6)


def test_floor_divide_gradient_is_zero():
    t = flow.tensor([1.5, -2.5], requires_grad=True)
    (g,) = flow.autograd.grad([flow.floor_divide(t, 0.7)], [t], [flow.ones(2,
                                                                            dtype=flow.float32)])
    assert g.numpy().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("name", ["pow", "mul", "atan2", "div"])
def test_double_backward_matches_torch(name):
    a = np.array([0.7, 1.3, 2.2, 1.3])
    b = np.array([1.5, 1.3, -0.5, 2.0])
    f_in = [flow.tensor(v, requires_grad=True) for v in (a, b)]
    t_in = [torch.tensor(v, requires_grad=True) for v in (a, b)]
    f_out = getattr(flow, name)(*f_in).sum()
    t_out = getattr(torch, name)(*t_in).sum()
    fg = flow.autograd.grad([f_out], f_in, create_graph=True)
    tg = torch.autograd.grad([t_out], t_in, create_graph=True)
    f2 = flow.autograd.grad([fg[0].sum() + fg[1].sum()], f_in, allow_unused=True)
    t2 = torch.autograd.grad([tg[0].sum() + tg[1].sum()], t_in, allow_unused=True,
                             materialize_grads=True)
    for x, y in zip(f2, t2, strict=True):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "erf", "erfinv", "rsqrt", "acosh"])
def test_unary_double_backward_matches_torch(name):
    x = np.array([1.2, 1.5, 1.9]) if name == "acosh" else np.array([0.1, 0.45, 0.8])
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (fg,) = flow.autograd.grad([getattr(flow, name)(fx).sum()], [fx], create_graph=True)
    (tg,) = torch.autograd.grad([getattr(torch, name)(tx).sum()], [tx], create_graph=True)
    (f2,) = flow.autograd.grad([fg.sum()], [fx])
    (t2,) = torch.autograd.grad([tg.sum()], [tx])
    np.testing.assert_allclose(f2.numpy(), t2.numpy(), rtol=1e-10)


# -- erf and erfinv -------------------------------------------------------------------------
def test_erf_matches_math_erf_on_a_million_points():
    rng = np.random.default_rng(2024)
    x = np.concatenate([
        rng.uniform(-7, 7, 400_000), rng.standard_normal(300_000),
        rng.uniform(-0.6, 0.6, 200_000),
        10.0 ** rng.uniform(-300, 0, 100_000) * rng.choice([-1, 1], 100_000),
    ])
    got = special.erf(x)
    expected = np.array([math.erf(v) for v in x])
    rel = np.abs(got - expected) / np.abs(expected)
    assert rel.max() < 1e-15, f"max relative error {rel.max():.3g}"
    edges = np.array([np.inf, -np.inf, 0.0, -0.0, 6.0, -6.0, 30.0, 1e300, 5.9, np.nan])
    got = special.erf(edges)
    np.testing.assert_array_equal(got[:8], [1.0, -1.0, 0.0, -0.0, 1.0, -1.0, 1.0, 1.0])
    assert np.signbit(got[3])
    assert got[8] == math.erf(5.9) and np.isnan(got[9])


def test_erfinv_matches_torch():
    x = np.concatenate([np.linspace(-0.999, 0.999, 20001), [0.0, 1e-300, -1e-12, 1.0, -1.0,
                                                           1.5, np.nan]])
    fx, tx = _pair(x)
    _same(flow.erfinv(fx), torch.erfinv(tx), rtol=1e-13, atol=0)
    fx32, tx32 = _pair(x.astype(np.float32))
    _same(flow.erfinv(fx32), torch.erfinv(tx32), rtol=2e-6, atol=0)
