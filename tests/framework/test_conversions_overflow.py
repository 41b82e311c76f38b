"""Python numbers into tensors: each case runs on torch and on sbpflow, which must agree on
the values and dtype, or raise the same exception type with torch's words (sbpflow adds the
function, the value and its index)."""

import math

import numpy as np
import pytest
import torch

import sbpflow as flow

BIG = 2**64 + 5

# (label, a function of the module: torch or sbpflow)
CASES = [
    # int64 inference: the range is exactly [-2**63, 2**63 - 1]
    ("2**63", lambda m: m.tensor([2**63])),
    ("2**63 scalar", lambda m: m.tensor(2**63)),
    ("2**63-1", lambda m: m.tensor([2**63 - 1])),
    ("-2**63", lambda m: m.tensor([-(2**63)])),
    ("-2**63-1", lambda m: m.tensor([-(2**63) - 1])),
    ("2**64+5", lambda m: m.tensor([BIG])),
    ("1, 2**64+5", lambda m: m.tensor([1, BIG])),
    ("tuple 1, 2**63", lambda m: m.tensor((1, 2**63))),
    ("nested", lambda m: m.tensor([[1, 2], [3, 2**63]])),
    ("nested deep", lambda m: m.tensor([[[1]], [[2**70]]])),
    ("bool and 2**63", lambda m: m.tensor([True, 2**63])),
    ("bool and int", lambda m: m.tensor([True, 2])),
    # a float anywhere makes the list float: big ints round
    ("float and 2**70", lambda m: m.tensor([1.5, 2**70])),
    ("2**63 and float", lambda m: m.tensor([2**63, 1.5])),
    ("float and 2**1100", lambda m: m.tensor([1.5, 2**1100])),
    ("2**70 to float32", lambda m: m.tensor([2**70], dtype=m.float32)),
    ("2**1100 to float32", lambda m: m.tensor([2**1100], dtype=m.float32)),
    ("2**64 to float64", lambda m: m.tensor([2**64], dtype=m.float64)),
    ("1e300 to float32", lambda m: m.tensor([1e300], dtype=m.float32)),
    ("7e4 to float16", lambda m: m.tensor([70000], dtype=m.float16)),
    ("1e39 to bfloat16", lambda m: m.tensor([1e39], dtype=m.bfloat16)),
    # small integer types
    ("300 uint8", lambda m: m.tensor([300], dtype=m.uint8)),
    ("300 uint8 scalar", lambda m: m.tensor(300, dtype=m.uint8)),
    ("255 uint8", lambda m: m.tensor([255], dtype=m.uint8)),
    ("256 uint8", lambda m: m.tensor([256], dtype=m.uint8)),
    ("-1 uint8", lambda m: m.tensor([-1], dtype=m.uint8)),
    ("-255 uint8", lambda m: m.tensor([-255], dtype=m.uint8)),
    ("-256 uint8", lambda m: m.tensor([-256], dtype=m.uint8)),
    ("2**64 uint8", lambda m: m.tensor([2**64], dtype=m.uint8)),
    ("128 int8", lambda m: m.tensor([128], dtype=m.int8)),
    ("-128 int8", lambda m: m.tensor([-128], dtype=m.int8)),
    ("-129 int8", lambda m: m.tensor([-129], dtype=m.int8)),
    ("2**15 int16", lambda m: m.tensor([2**15], dtype=m.int16)),
    ("2**31-1 int32", lambda m: m.tensor([2**31 - 1], dtype=m.int32)),
    ("-2**31-1 int32", lambda m: m.tensor([-(2**31) - 1], dtype=m.int32)),
    ("2**31 int32", lambda m: m.tensor([2**31], dtype=m.int32)),
    # floats into integer types: finite and in range as doubles; negatives never wrap
    ("300.0 uint8", lambda m: m.tensor([300.0], dtype=m.uint8)),
    ("255.9 uint8", lambda m: m.tensor([255.9], dtype=m.uint8)),
    ("-0.5 uint8", lambda m: m.tensor([-0.5], dtype=m.uint8)),
    ("-0.0 uint8", lambda m: m.tensor([-0.0], dtype=m.uint8)),
    ("-3.7 uint8", lambda m: m.tensor([-3.7], dtype=m.uint8)),
    ("int -1 beside float", lambda m: m.tensor([-1, 1.5], dtype=m.uint8)),
    ("300 beside float", lambda m: m.tensor([300, 1.5], dtype=m.uint8)),
    ("2**31 beside float", lambda m: m.tensor([2**31, 0.5], dtype=m.int32)),
    ("2**53+1 exact", lambda m: m.tensor([2**53 + 1, 0.5], dtype=m.int64)),
    ("3.7 int32", lambda m: m.tensor([3.7], dtype=m.int32)),
    ("1e20 int64", lambda m: m.tensor([1e20], dtype=m.int64)),
    ("2.0**63 int64", lambda m: m.tensor([2.0**63], dtype=m.int64)),
    ("-2.0**63 int64", lambda m: m.tensor([-(2.0**63)], dtype=m.int64)),
    ("nan int64", lambda m: m.tensor([math.nan], dtype=m.int64)),
    ("inf int32", lambda m: m.tensor([math.inf], dtype=m.int32)),
    # bool takes anything
    ("2 bool", lambda m: m.tensor([2], dtype=m.bool)),
    ("2**70 bool", lambda m: m.tensor([2**70], dtype=m.bool)),
    ("-1 bool", lambda m: m.tensor([-1], dtype=m.bool)),
    ("True uint8", lambda m: m.tensor([True], dtype=m.uint8)),
    ("empty int8", lambda m: m.tensor([], dtype=m.int8)),
    ("empty nested uint8", lambda m: m.tensor([[]], dtype=m.uint8)),
    # NumPy scalars and arrays inside a list are checked too; a bare array is cast (wraps)
    ("np.int64 in list", lambda m: m.tensor([np.int64(300)], dtype=m.uint8)),
    ("np.float64 in list", lambda m: m.tensor([np.float64(300.0)], dtype=m.uint8)),
    ("np scalar", lambda m: m.tensor(np.int64(300), dtype=m.uint8)),
    ("list of arrays", lambda m: m.tensor([np.array([300])], dtype=m.uint8)),
    ("bare array", lambda m: m.tensor(np.array([300]), dtype=m.uint8)),
    ("0-d array", lambda m: m.tensor(np.array(300), dtype=m.uint8)),
    ("list of tensors", lambda m: m.tensor([m.tensor(300)], dtype=m.uint8)),
    ("complex to float", lambda m: m.tensor([1 + 2j], dtype=m.float32)),
    # the other ways in
    ("as_tensor 2**64+5", lambda m: m.as_tensor([BIG])),
    ("as_tensor 300 uint8", lambda m: m.as_tensor([300], dtype=m.uint8)),
    ("as_tensor bare array", lambda m: m.as_tensor(np.array([300]), dtype=m.uint8)),
    ("new_tensor float", lambda m: m.zeros(2).new_tensor([BIG])),
    ("new_tensor int64", lambda m: m.zeros(2, dtype=m.int64).new_tensor([2**63])),
    ("new_tensor int8", lambda m: m.zeros(2, dtype=m.int8).new_tensor([300])),
    ("new_tensor dtype", lambda m: m.zeros(2).new_tensor([300], dtype=m.uint8)),
]

# full/fill_ convert one Scalar: an int beyond 64 bits cannot be held at all, and a double
# must fit a floating type too. (torch skips the float check for half types when the tensor
# has at most one element, a fast path; the cases use two.)
FILL_CASES = [
    ("full 2**63", lambda m: m.full((2,), 2**63)),
    ("full 2**63-1", lambda m: m.full((2,), 2**63 - 1)),
    ("full -2**63", lambda m: m.full((2,), -(2**63))),
    ("full -2**63-1", lambda m: m.full((2,), -(2**63) - 1)),
    ("full 2**64+5", lambda m: m.full((2,), BIG)),
    ("full 2**64+5 float32", lambda m: m.full((2,), BIG, dtype=m.float32)),
    ("full 2**63 float32", lambda m: m.full((2,), 2**63, dtype=m.float32)),
    ("full 10**5 float16", lambda m: m.full((2,), 100000, dtype=m.float16)),
    ("full 65504 float16", lambda m: m.full((2,), 65504, dtype=m.float16)),
    ("full 65505 float16", lambda m: m.full((2,), 65505, dtype=m.float16)),
    ("full 2**63 bfloat16", lambda m: m.full((2,), 2**63, dtype=m.bfloat16)),
    ("full 1e5 float16", lambda m: m.full((2,), 1e5, dtype=m.float16)),
    ("full 65504.0 float16", lambda m: m.full((2,), 65504.0, dtype=m.float16)),
    ("full 1e39 bfloat16", lambda m: m.full((2,), 1e39, dtype=m.bfloat16)),
    ("full 1e300 float32", lambda m: m.full((2,), 1e300, dtype=m.float32)),
    ("full -1e300 float32", lambda m: m.full((2,), -1e300, dtype=m.float32)),
    ("full 1e300 float64", lambda m: m.full((2,), 1e300, dtype=m.float64)),
    ("full inf float32", lambda m: m.full((2,), math.inf, dtype=m.float32)),
    ("full nan float16", lambda m: m.full((2,), math.nan, dtype=m.float16)),
    ("full 300 uint8", lambda m: m.full((2,), 300, dtype=m.uint8)),
    ("full -1 uint8", lambda m: m.full((2,), -1, dtype=m.uint8)),
    ("full -255 uint8", lambda m: m.full((2,), -255, dtype=m.uint8)),
    ("full -256 uint8", lambda m: m.full((2,), -256, dtype=m.uint8)),
    ("full 128 int8", lambda m: m.full((2,), 128, dtype=m.int8)),
    ("full -129.0 int8", lambda m: m.full((2,), -129.0, dtype=m.int8)),
    ("full 2**15 int16", lambda m: m.full((2,), 2**15, dtype=m.int16)),
    ("full 2**40 int32", lambda m: m.full((2,), 2**40, dtype=m.int32)),
    ("full 3.7 int32", lambda m: m.full((2,), 3.7, dtype=m.int32)),
    ("full -3.7 uint8", lambda m: m.full((2,), -3.7, dtype=m.uint8)),
    ("full 1e20 int64", lambda m: m.full((2,), 1e20, dtype=m.int64)),
    ("full 2.0**63 int64", lambda m: m.full((2,), 2.0**63, dtype=m.int64)),
    ("full nan int64", lambda m: m.full((2,), math.nan, dtype=m.int64)),
    ("full inf int32", lambda m: m.full((2,), math.inf, dtype=m.int32)),
    ("full 2 bool", lambda m: m.full((2,), 2, dtype=m.bool)),
    ("full nan bool", lambda m: m.full((2,), math.nan, dtype=m.bool)),
    ("full 2**70 bool", lambda m: m.full((2,), 2**70, dtype=m.bool)),
    ("full True uint8", lambda m: m.full((2,), True, dtype=m.uint8)),
    ("full empty 300 uint8", lambda m: m.full((0,), 300, dtype=m.uint8)),
    ("fill_ -1 uint8", lambda m: m.zeros(2, dtype=m.uint8).fill_(-1)),
    ("fill_ 256 uint8", lambda m: m.zeros(2, dtype=m.uint8).fill_(256)),
    ("fill_ 2**63 int64", lambda m: m.zeros(2, dtype=m.int64).fill_(2**63)),
    ("full_like 300", lambda m: m.full_like(m.zeros(2, dtype=m.uint8), 300)),
    ("new_full 2**63", lambda m: m.zeros(2, dtype=m.int64).new_full((2,), 2**63)),
]


def _outcome(m, fn):
    try:
        return "ok", fn(m)
    except Exception as e:  # noqa: BLE001 - the exception is the result being compared
        return "raised", e


@pytest.mark.parametrize("label,fn", CASES + FILL_CASES, ids=[c[0] for c in CASES + FILL_CASES])
def test_conversion_matches_torch(label, fn):
    t_kind, t_val = _outcome(torch, fn)
    f_kind, f_val = _outcome(flow, fn)
    if t_kind == "raised":
        assert f_kind == "raised", f"torch raised {t_val!r}; sbpflow returned {f_val!r}"
        assert type(f_val) is type(t_val), (t_val, f_val)
        assert str(t_val) in str(f_val), (t_val, f_val)
        return
    assert f_kind == "ok", f"torch returned {t_val!r}; sbpflow raised {f_val!r}"
    assert str(f_val.dtype).split(".")[-1] == str(t_val.dtype).split(".")[-1]
    np.testing.assert_array_equal(np.array(f_val.tolist()), np.array(t_val.tolist()))


@pytest.mark.parametrize("data,value,index", [
    ([BIG], BIG, "[0]"),
    ([1, 2, BIG], BIG, "[2]"),
    ([[1, 2], [3, -(2**63) - 1]], -(2**63) - 1, "[1, 1]"),
])
def test_overflow_names_the_value(data, value, index):
    """torch's message does not say which value overflowed; ours does, and where."""
    with pytest.raises(ValueError, match="Overflow when unpacking long long") as err:
        flow.tensor(data)
    assert str(value) in str(err.value) and index in str(err.value)
    assert str(err.value).startswith("tensor():")


def test_narrow_type_overflow_names_value_and_type():
    with pytest.raises(RuntimeError) as err:
        flow.tensor([[1, 2], [3, 300]], dtype=flow.uint8)
    msg = str(err.value)
    assert "cannot be converted to type uint8 without overflow" in msg
    assert "300" in msg and "[1, 1]" in msg


def test_fill_overflow_names_the_value():
    with pytest.raises(RuntimeError, match="without overflow") as err:
        flow.full((3,), 70000, dtype=flow.int16)
    assert "70000" in str(err.value) and "int16_t" in str(err.value)
