"""NaN ordering as torch's, and integer division by zero raising as torch does.

The registry's generated tests check every reduction and ordering op on NaN and inf samples
against torch (`_also_nonfinite` in sbpflow/ops/reduce.py); these tests pin the cases named in
the reliability report and the division-by-zero errors, inline and from the VM's worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import sbpflow as flow

NAN = float("nan")


def _same(a, b):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        np.testing.assert_array_equal(np.asarray(x), y.numpy())


@pytest.mark.parametrize("call", [
    lambda T, x: T.topk(x, 2),
    lambda T, x: T.sort(x, descending=True),
    lambda T, x: T.sort(x),
    lambda T, x: T.argsort(x, descending=True),
    lambda T, x: T.median(x),
    lambda T, x: T.median(x, 0),
    lambda T, x: T.max(x),
    lambda T, x: T.argmax(x),
], ids=["topk", "sort_desc", "sort", "argsort_desc", "median", "median_dim", "max", "argmax"])
def test_nan_orders_as_in_torch(call):
    values = [1.0, NAN, 3.0, -2.0]
    _same(call(torch, torch.tensor(values)), call(flow, flow.tensor(values)))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32", "int64", "bool"])
def test_descending_sort_of_integers_has_no_overflow(dtype):
    # `-x` would wrap for uint8 and for int8's -128.
    values = {"uint8": [3, 0, 255, 7, 0], "int8": [3, -128, 127, 0, -128],
              "bool": [True, False, True, False, True]}.get(dtype, [5, -(2 ** 31), 2, 5, 0])
    ref = torch.sort(torch.tensor(values, dtype=getattr(torch, dtype)), descending=True,
                     stable=True)
    got = flow.sort(flow.tensor(values, dtype=getattr(flow, dtype)), descending=True,
                    stable=True)
    _same(ref, got)


_INT_DIVISIONS = {
    "floor_divide": lambda T, a, b: a // b,
    "floor_divide_scalar": lambda T, a, b: a // 0,
    "remainder": lambda T, a, b: a % b,
    "remainder_scalar": lambda T, a, b: a % 0,
    "rremainder_scalar": lambda T, a, b: 7 % b,
    "fmod": lambda T, a, b: T.fmod(a, b),
    "fmod_scalar": lambda T, a, b: T.fmod(a, 0),
    "div_floor": lambda T, a, b: T.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda T, a, b: T.div(a, b, rounding_mode="trunc"),
    "inplace": lambda T, a, b: a.floor_divide_(b),
}


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
@pytest.mark.parametrize("name", list(_INT_DIVISIONS))
def test_integer_division_by_zero_raises_like_torch(name, dtype):
    def args(T):
        return (T.tensor([5, 3], dtype=getattr(T, dtype)),
                T.tensor([0, 1], dtype=getattr(T, dtype)))

    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        _INT_DIVISIONS[name](torch, *args(torch))
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as info:
        _INT_DIVISIONS[name](flow, *args(flow))
    assert not isinstance(info.value, ZeroDivisionError)  # torch raises RuntimeError


def test_integer_division_by_zero_from_the_worker_raises_at_the_next_sync():
    a, b = flow.tensor([5, 3]), flow.tensor([0, 1])
    before = flow.vm.handoffs()
    with flow.vm.inline_max(0):
        q = a // b  # handed to the worker: no error yet
    assert flow.vm.handoffs() > before
    with pytest.raises(RuntimeError, match="floor_divide: ZeroDivisionError"):
        q.numpy()


def test_float_and_nonzero_integer_division_are_unchanged():
    a = torch.tensor([5, -3, 7])
    _same(a // torch.tensor([2, 2, -3]), flow.tensor([5, -3, 7]) // flow.tensor([2, 2, -3]))
    _same(a.double() / 0, flow.tensor([5, -3, 7]).double() / 0)  # inf, as in torch
    _same(a / torch.tensor([0, 1, 2]), flow.tensor([5, -3, 7]) / flow.tensor([0, 1, 2]))


def test_non_finite_results_print_no_numpy_warnings():
    """inf and NaN results are values, as in torch: no NumPy RuntimeWarning reaches the user
    from any path that computes them (a cached call's inline ufunc, the primitives on the VM
    worker, a reduction, an nn.Graph step), even under `-W default`."""
    code = textwrap.dedent("""
        import sbpflow as flow
        nan, inf = float("nan"), float("inf")
        x = flow.tensor([0.0, -1.0, inf, -inf, nan])
        y = [x.log(), x.sqrt(), x - x, x * 0, x / 0, x.exp() * 0, (x * 1e308) * 10]
        big = flow.full((600, 600), -1.0)  # past the inline limit: runs on the worker
        y += [big.log(), big.sqrt(), (big - big.abs()) / 0]
        y += [x.sum(), x.mean(), x.std(), x.var(), x.prod(), x.norm(), x.softmax(0)]

        class G(flow.nn.Graph):
            def build(self, t):
                return (t.log() * t.sqrt()).sum()

        y.append(G()(x))
        flow.synchronize()
        print("ok", len(y))
    """)
    res = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok 18"), res.stdout
    assert "Warning" not in res.stderr, res.stderr
