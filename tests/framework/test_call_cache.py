"""The eager interpreter's cached calls and inline path (framework/interpreter.py).

A call whose (op, input metas, attrs, device, default dtype) was seen before reuses its cached call:
no attr binding or meta inference.  A small op on an idle stream runs inline with no
instruction object.  None of that may change a result or an error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework import interpreter
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext
from sbpflow.vm import OpCall, PooledStorage, Storage, get_vm

from ..ops import harness as H

_SPECIALIZED = [n for n in registry.list_ops() if registry.get(n).specialize is not None]


def _variants(sample):
    """The sample's arrays, and a float32 copy of them when they are float64 (the dtype most
    models run in)."""
    yield sample.inputs
    if any(getattr(a, "dtype", None) == np.float64 for a in sample.inputs):
        yield tuple(a.astype(np.float32) if a.dtype == np.float64 else a for a in sample.inputs)


@pytest.mark.parametrize("name", _SPECIALIZED)
def test_specialized_functions_equal_the_kernel_bitwise(name):
    """OpDef.specialize returns a function the cached call runs instead of the kernel: on every
    sample where it applies, it returns the kernel's array bit for bit (values, dtype,
    shape, NaNs)."""
    opdef = registry.get(name)
    prims = flow.device("cpu").prims
    used = 0
    for sample in H.op_samples(name):
        for arrays in _variants(sample):
            in_metas = tuple(registry.meta_of(flow.tensor(a).dtype, np.shape(a)) for a in arrays)
            attrs = opdef.bind_attrs(dict(sample.attrs))
            try:
                out_metas = opdef.meta(in_metas, attrs)
            except Exception:  # noqa: BLE001 - a float32 copy may be invalid for this op
                continue
            ctx = KernelContext(prims, name, in_metas, out_metas)
            direct = opdef.specialize(ctx, attrs)
            if direct is None:
                continue
            ins = [np.asarray(a) for a in arrays]
            expected = opdef.kernel(ctx, *[a.copy() for a in ins], **attrs)
            got = direct(*[a.copy() for a in ins])
            assert type(got) is np.ndarray
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
            used += 1
    # Only an op whose primitive has no direct form (erf, sigmoid: compositions) never gets one.
    base = name.removesuffix("_scalar")
    assert used or prims.direct_elementwise(base) is None, (
        f"{name}: no sample reached its specialised function")


def _counting(monkeypatch, obj, attr):
    calls = []
    original = getattr(obj, attr)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, attr, counted)
    return calls


def test_a_cache_hit_binds_no_attrs_and_infers_no_meta(monkeypatch):
    opdef = registry.get("add_scalar")
    x = flow.ones(3, 5)
    x + 2.5  # noqa: B018 - make the cached call
    binds = _counting(monkeypatch, opdef, "bind_attrs")
    metas = _counting(monkeypatch, opdef, "meta")
    news = _counting(monkeypatch, interpreter, "_new_local_call")
    for _ in range(5):
        y = x + 2.5
    np.testing.assert_array_equal(y.numpy(), np.full((3, 5), 3.5, np.float32))
    assert (len(binds), len(metas), len(news)) == (0, 0, 0)
    x + 1.5  # noqa: B018 - another attr value: a new cached call
    assert len(news) == 1


def test_small_ops_run_inline_without_instruction_objects(monkeypatch):
    vm = get_vm()
    x = flow.ones(4, 4)
    flow.synchronize()
    made = _counting(monkeypatch, OpCall, "__init__")
    stream = vm.streams["cpu"]
    issued, handoffs = stream.issued, vm.handoffs()
    y = ((x * 3 + 1).relu() - x).sum()
    assert y.item() == 48.0
    assert len(made) == 0
    assert stream.issued - issued == 5  # each op still gets its sequence number
    assert vm.handoffs() == handoffs


def test_large_or_forced_ops_still_go_to_the_worker():
    vm = get_vm()
    x = flow.ones(8, 8)
    with flow.vm.inline_max(0):
        before = vm.handoffs()
        y = x * 2 + 1
        assert vm.handoffs() - before == 2
    np.testing.assert_array_equal(y.numpy(), np.full((8, 8), 3, np.float32))


def test_an_input_still_being_produced_takes_the_ordered_path():
    """The producer runs on the worker; the next (cached) op must wait for it, not read a
    missing array."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    x = flow.tensor(a)
    expected = np.tanh(a @ a) * 2
    for _ in range(20):
        with flow.vm.inline_max(0):
            h = flow.matmul(x, x).tanh()
        out = h * 2  # cached, issued while the worker may still run the matmul
        np.testing.assert_array_equal(out.numpy(), expected)


def test_bad_input_raises_the_same_error_with_a_cached_call():
    a, b = flow.ones(2, 3), flow.ones(2, 3)
    a + b  # noqa: B018 - cached call for (2, 3) + (2, 3)
    with pytest.raises(RuntimeError, match="must match the size") as cached:
        a + flow.ones(4)
    interpreter.registry.get("add").local_calls.clear()
    with pytest.raises(RuntimeError, match="must match the size") as fresh:
        a + flow.ones(4)
    assert str(cached.value) == str(fresh.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        interpreter.apply(registry.get("add_scalar"), (a,), {"other": 1, "bogus": 2})


def test_kernel_errors_raise_at_the_call_every_time():
    x = flow.tensor([4, 5, 6])
    for _ in range(3):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            x // flow.tensor([1, 0, 2])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        x // 0


def test_attr_value_types_get_their_own_cached_calls():
    """1, 1.0 and True are equal dict keys but promote differently (torch as the oracle)."""
    for other in (1, 1.0, True, 1, True, 1.0):
        got = flow.tensor([1, 2]) + other
        want = torch.tensor([1, 2]) + other
        assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1]
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_change_of_default_dtype_is_seen_by_cached_calls():
    x = flow.tensor([1, 4])
    assert x.sqrt().dtype == flow.float32
    previous = flow.get_default_dtype()
    flow.set_default_dtype(flow.float64)
    try:
        assert x.sqrt().dtype == flow.float64
        assert (x * 0.5).dtype == flow.float64
    finally:
        flow.set_default_dtype(previous)
    assert x.sqrt().dtype == flow.float32


def test_cached_calls_record_autograd_like_the_general_path():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    for _ in range(2):  # the second round runs on cached calls
        x = flow.tensor(a, requires_grad=True)
        y = ((x * x).relu() + 1).sum()
        y.backward()
        assert y.grad_fn.name() == "SumBackward0"
        tx = torch.tensor(a, requires_grad=True)
        ((tx * tx).relu() + 1).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)


def test_small_outputs_have_no_finalizer_and_large_ones_are_recycled():
    small = flow.ones(4) * 2
    assert type(small._storage) is Storage
    prims = flow.device("cpu").prims
    x = flow.ones(128, 256)  # 128 KB of float32: from the caching allocator
    y = x * 2
    assert type(y._storage) is PooledStorage
    hits = prims.allocator.hits
    for _ in range(10):
        y = x * 2  # the previous y dies: its buffer is released (at the sync) and reused
        flow.synchronize()
    assert prims.allocator.hits - hits >= 9
    np.testing.assert_array_equal(y.numpy(), np.full((128, 256), 2, np.float32))


def test_views_are_cached_with_their_layout():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x, ref = flow.tensor(a), torch.tensor(a)
    for _ in range(2):
        v = x.transpose(0, 2)[1:, :, 1]
        tv = ref.transpose(0, 2)[1:, :, 1]
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        assert v.stride() == tv.stride()
        v.mul_(10)  # writes through the view reach the base
        tv.mul_(10)
    np.testing.assert_array_equal(x.numpy(), ref.numpy())
    assert not np.array_equal(x.numpy(), a)
