"""Tensor.view(dtype) against torch: reinterpreted bytes, shapes, strides, storage offsets,
aliasing both ways, torch's errors, and (like torch) no gradient through it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow

NAMES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
         "uint8", "bool"]


def _source(name, shape, seed=0):
    """The same bytes as a torch and an sbpflow tensor of dtype `name`."""
    rng = np.random.default_rng(seed)
    if name == "bool":
        raw = rng.integers(0, 2, shape).astype(np.bool_)
    else:
        raw = (rng.standard_normal(shape) * 50).astype(np.float32)
    # torch.empty's strides (from_numpy would keep NumPy's zero strides of empty arrays)
    t = torch.empty(shape, dtype=getattr(torch, name)).copy_(torch.from_numpy(np.array(raw)))
    f = flow.tensor(raw, dtype=getattr(flow, name))
    return t, f


def _bytes_torch(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.ndim else \
        t.reshape(1).view(torch.uint8).numpy().tobytes()


def _bytes_flow(x):
    return np.ascontiguousarray(x.numpy()).view(np.uint8).tobytes()


def _check_same(got, want):
    assert str(got.dtype).replace("sbpflow.", "") == str(want.dtype).replace("torch.", "")
    assert tuple(got.shape) == tuple(want.shape)
    assert got.stride() == want.stride()
    assert got.storage_offset() == want.storage_offset()
    assert _bytes_flow(got) == _bytes_torch(want)


# bool targets only from sources whose bytes are 0/1 (other bytes are not valid bools)
PAIRS = [(a, b) for a in NAMES for b in NAMES if b != "bool" or a in ("bool", "uint8", "int8")]


@pytest.mark.parametrize("src,dst", PAIRS)
def test_contiguous_views_match_torch(src, dst):
    if dst in ("bool",) and src != "bool":
        t, f = _source("bool", (4, 8))
        t, f = t.view(getattr(torch, src)), f.view(getattr(flow, src))
    else:
        t, f = _source(src, (4, 8))
    want = t.view(getattr(torch, dst))
    got = f.view(getattr(flow, dst))
    _check_same(got, want)


@pytest.mark.parametrize("dst", ["float64", "float16", "int8", "int32"])
@pytest.mark.parametrize("make", [
    lambda x: x[1:3],                 # an offset a whole number of wider elements in
    lambda x: x[:, 2:6],              # offset 2, rows of 8
    lambda x: x.reshape(2, 2, 8)[1],  # a view of a view
    lambda x: x[::2],                 # strided rows, contiguous last axis
    lambda x: x[0],                   # 1-d
], ids=["rows", "cols", "nested", "strided_rows", "row"])
def test_strided_and_offset_views_match_torch(dst, make):
    t, f = _source("float32", (4, 8), seed=1)
    want = make(t).view(getattr(torch, dst))
    got = make(f).view(getattr(flow, dst))
    _check_same(got, want)


def test_zero_dim_and_empty_views():
    for src, dst, shape in [("float32", "int32", ()), ("float64", "int64", ()),
                            ("float32", "float64", (0, 4)), ("int64", "int16", (0, 2))]:
        t, f = _source(src, shape)
        _check_same(f.view(getattr(flow, dst)), t.view(getattr(torch, dst)))
    # (3, 0) has stride(0) 1 in torch: not divisible by 2, so both refuse it
    t, f = _source("float32", (3, 0))
    with pytest.raises(RuntimeError) as want:
        t.view(torch.float64)
    with pytest.raises(RuntimeError) as got:
        f.view(flow.float64)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("src,dst,make", [
    ("float32", "float64", lambda x: x[:, :3]),        # size(-1) not divisible
    ("float32", "float64", lambda x: x[0, 0]),         # 0-d, different element sizes
    ("float32", "float16", lambda x: x[0, 0]),
    ("float32", "float64", lambda x: x[:, 1:3]),       # storage offset not divisible
    ("float32", "float64", lambda x: x[:, ::2]),       # stride(-1) != 1 (upsizing)
    ("float32", "float16", lambda x: x.t()),           # stride(-1) != 1 (downsizing)
    ("float32", "int8", lambda x: x[:, ::2]),
    ("float32", "float64", lambda x: x.reshape(8, 4)[:, :2].reshape(8, 2)[::1, :2]),
    ("int16", "int64", lambda x: x.reshape(4, 8)[:, :4]),  # stride(0) = 8 divisible: fine
    ("int16", "int64", lambda x: x.reshape(8, 4)[:3, :]),
    ("float32", "float64", lambda x: x.reshape(2, 16)[:, 2:6].reshape(2, 4)),
    ("int8", "int32", lambda x: x.reshape(32)[:30].reshape(6, 5)[:, :4]),  # stride(0) = 5
])
def test_errors_match_torch(src, dst, make):
    t, f = _source(src, (4, 8), seed=2)
    try:
        want = make(t).view(getattr(torch, dst))
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as got:
            make(f).view(getattr(flow, dst))
        assert str(got.value) == str(e)
    else:
        _check_same(make(f).view(getattr(flow, dst)), want)


def test_views_alias_their_base_both_ways():
    t = torch.zeros(2, 4)
    f = flow.zeros(2, 4)
    tv, fv = t.view(torch.int32), f.view(flow.int32)
    tv.add_(1)
    fv.add_(1)
    np.testing.assert_array_equal(f.numpy(), t.numpy())
    t[0].fill_(2.0)
    f[0].fill_(2.0)
    np.testing.assert_array_equal(fv.numpy(), tv.numpy())
    tb, fb = t.view(torch.int16)[:, 1::2], f.view(flow.int16)[:, 1::2]
    tb.zero_()
    fb.zero_()
    np.testing.assert_array_equal(f.numpy(), t.numpy())


def test_no_gradient_flows_like_torch():
    t = torch.randn(3, 4, requires_grad=True)
    f = flow.tensor(t.detach().numpy(), requires_grad=True)
    for name in ("float32", "float16", "float64", "int32"):
        want = t.view(getattr(torch, name))
        got = f.view(getattr(flow, name))
        assert got.requires_grad == want.requires_grad is False
        assert got.grad_fn is None and want.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        f.view(flow.float32).sum().backward()


def test_view_with_a_non_dtype_argument_is_a_type_error():
    f = flow.zeros(2, 4)
    for bad in ("float32", 1.5, None):
        with pytest.raises(TypeError) as want:
            torch.zeros(2, 4).view(bad)
        with pytest.raises(TypeError) as got:
            f.view(bad)
        head = f"view() received an invalid combination of arguments - got " \
               f"({type(bad).__name__}), but expected one of:"
        assert str(got.value).startswith(head) and str(want.value).startswith(head)
