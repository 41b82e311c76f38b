"""Reductions, the softmax family and order statistics on empty tensors, against torch:
the same values (an empty result, NaN, -inf, 0), the same gradient, or the same exception
type with torch's words."""

import math
import re
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow

SHAPES = [(0,), (0, 3), (3, 0), (2, 0, 3)]

OPS = [
    ("softmax", lambda m, x, d: m.softmax(x, dim=d)),
    ("log_softmax", lambda m, x, d: m.log_softmax(x, dim=d)),
    ("F.softmax", lambda m, x, d: m.nn.functional.softmax(x, dim=d)),
    ("F.log_softmax", lambda m, x, d: m.nn.functional.log_softmax(x, dim=d)),
    ("F.softmin", lambda m, x, d: m.nn.functional.softmin(x, dim=d)),
    ("nn.Softmax", lambda m, x, d: m.nn.Softmax(dim=d)(x)),
    ("Tensor.softmax", lambda m, x, d: x.softmax(d)),
    ("logsumexp", lambda m, x, d: m.logsumexp(x, dim=d)),
    ("logsumexp keepdim", lambda m, x, d: m.logsumexp(x, dim=d, keepdim=True)),
    ("median", lambda m, x, d: m.median(x)),
    ("Tensor.median", lambda m, x, d: x.median()),
    ("nanmedian", lambda m, x, d: m.nanmedian(x)),
    ("median dim", lambda m, x, d: m.median(x, dim=d)),
    ("nanmedian dim", lambda m, x, d: m.nanmedian(x, dim=d)),
    ("quantile", lambda m, x, d: m.quantile(x, 0.5)),
    ("quantile dim", lambda m, x, d: m.quantile(x, 0.5, dim=d)),
    ("var", lambda m, x, d: m.var(x)),
    ("var dim", lambda m, x, d: m.var(x, dim=d)),
    ("std dim", lambda m, x, d: m.std(x, dim=d)),
    ("std_mean", lambda m, x, d: m.std_mean(x, dim=d)),
    ("amax", lambda m, x, d: m.amax(x)),
    ("amin", lambda m, x, d: m.amin(x)),
    ("amax dim", lambda m, x, d: m.amax(x, dim=d)),
    ("amin dim", lambda m, x, d: m.amin(x, dim=d)),
    ("max", lambda m, x, d: m.max(x)),
    ("max dim", lambda m, x, d: m.max(x, dim=d)),
    ("argmax dim", lambda m, x, d: m.argmax(x, dim=d)),
    ("aminmax", lambda m, x, d: m.aminmax(x)),
    ("aminmax dim", lambda m, x, d: m.aminmax(x, dim=d)),
    ("kthvalue", lambda m, x, d: m.kthvalue(x, 1, dim=d)),
    ("mode", lambda m, x, d: m.mode(x, dim=d)),
    ("sum", lambda m, x, d: m.sum(x, dim=d)),
    ("mean", lambda m, x, d: m.mean(x)),
    ("prod", lambda m, x, d: m.prod(x, dim=d)),
    ("nanmean", lambda m, x, d: m.nanmean(x)),
    ("vector_norm", lambda m, x, d: m.linalg.vector_norm(x, dim=d)),
    ("vector_norm inf", lambda m, x, d: m.linalg.vector_norm(x, ord=math.inf, dim=d)),
    ("vector_norm -inf", lambda m, x, d: m.linalg.vector_norm(x, ord=-math.inf)),
    ("cumsum", lambda m, x, d: m.cumsum(x, dim=d)),
    ("logcumsumexp", lambda m, x, d: m.logcumsumexp(x, dim=d)),
    ("cummax", lambda m, x, d: m.cummax(x, dim=d)),
    ("sort", lambda m, x, d: m.sort(x, dim=d)),
]

CASES = [(name, fn, shape, d) for name, fn in OPS for shape in SHAPES
         for d in ((0, -1) if len(shape) > 1 else (0,))]


def _words(msg: str) -> set:
    """torch's message without its leading function name, as words (torch's own typos, like
    "0because", split apart)."""
    msg = re.sub(r"^[\w.]+(\(\))?:?\s", "", msg)
    return set(re.findall(r"[A-Za-z_]+|-?\d+", msg))


def _run(m, fn, shape, d, backward):
    x = m.zeros(*shape, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about var's degrees of freedom
        try:
            out = fn(m, x, d)
        except Exception as e:  # noqa: BLE001 - the exception is the result compared
            return e, None
        outs = out if isinstance(out, tuple) else (out,)
        grad = None
        floats = [o.sum() for o in outs if o.dtype.is_floating_point]
        if backward and floats:
            sum(floats).backward()
            grad = x.grad
    return outs, grad


def _same(f, t):
    assert tuple(f.shape) == tuple(t.shape)
    assert str(f.dtype).split(".")[-1] == str(t.dtype).split(".")[-1]
    np.testing.assert_allclose(np.array(f.tolist(), dtype=np.float64),
                               np.array(t.tolist(), dtype=np.float64), rtol=1e-6)


@pytest.mark.parametrize("name,fn,shape,d", CASES,
                         ids=[f"{c[0]}-{c[2]}-dim{c[3]}" for c in CASES])
def test_empty_input_matches_torch(name, fn, shape, d):
    t_out, t_grad = _run(torch, fn, shape, d, backward=True)
    if isinstance(t_out, Exception):
        f_out, _ = _run(flow, fn, shape, d, backward=False)
        assert isinstance(f_out, Exception), f"torch raised {t_out!r}; sbpflow returned"
        assert type(f_out) is type(t_out), (t_out, f_out)
        missing = _words(str(t_out)) - _words(str(f_out))
        assert not missing, (str(t_out), str(f_out))
        return
    f_out, f_grad = _run(flow, fn, shape, d, backward=True)
    assert not isinstance(f_out, Exception), f"torch returned; sbpflow raised {f_out!r}"
    assert len(f_out) == len(t_out)
    for f, t in zip(f_out, t_out):
        _same(f, t)
    assert (f_grad is None) == (t_grad is None)
    if t_grad is not None:
        _same(f_grad, t_grad)


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "uint8", "bool", "float16",
                                   "float64"])
def test_median_of_empty_is_nan_cast_as_torch(dtype):
    """torch: NaN, converted as C converts it for integer dtypes."""
    t = torch.median(torch.zeros(0, dtype=getattr(torch, dtype))).tolist()
    f = flow.median(flow.zeros(0, dtype=getattr(flow, dtype))).tolist()
    g = flow.nanmedian(flow.zeros(2, 0, dtype=getattr(flow, dtype))).tolist()
    assert (f, g) == (t, t) or (math.isnan(t) and math.isnan(f) and math.isnan(g))
