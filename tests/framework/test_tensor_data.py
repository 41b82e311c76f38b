"""Tensor.data against torch 2.13: reads alias the memory outside autograd, in-place writes
through it are invisible to the version check, and assignment swaps the memory in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow

LIBS = (flow, torch)


def _np(t):
    return t.detach().numpy()


def test_data_read_aliases_without_grad():
    for lib in LIBS:
        p = lib.nn.Parameter(lib.tensor([1.0, 2.0, 3.0]))
        y = p * 2
        for src in (p, y):
            d = src.data
            assert d.requires_grad is False and d.grad_fn is None and d.is_leaf
            assert isinstance(d, lib.Tensor) and not isinstance(d, lib.nn.Parameter)
            assert tuple(d.shape) == tuple(src.shape) and d.dtype == src.dtype
        z = (p * p).sum()
        version = p._version
        p.data[0] = 10.0  # a write through .data shows in p, and is no in-place op on p
        assert p._version == version
        z.backward()
        np.testing.assert_array_equal(p.grad.numpy(), [20.0, 4.0, 6.0])
        np.testing.assert_array_equal(_np(p), [10.0, 2.0, 3.0])


@pytest.mark.parametrize("op", ["add_", "mul_", "copy_", "zero_", "fill_", "sub_", "clamp_"])
def test_data_inplace_updates_without_breaking_backward(op):
    """torch: in-place writes through .data change p but not its version, so a backward
    through a graph that saved p succeeds and uses the new values."""
    args = {"add_": (1.5,), "mul_": (2.0,), "copy_": None, "zero_": (), "fill_": (4.0,),
            "sub_": (0.5,), "clamp_": (None, 1.5)}[op]
    res = {}
    for lib in LIBS:
        p = lib.nn.Parameter(lib.tensor([1.0, -2.0, 3.0]))
        y = (p * p).sum()  # saves p for backward
        version = p._version
        a = (lib.tensor([0.5, 0.25, -1.0]),) if args is None else args
        out = getattr(p.data, op)(*a)
        assert p._version == version
        assert out.requires_grad is False
        y.backward()
        res[lib] = (_np(p).copy(), p.grad.numpy().copy(), y.item())
    for a, b in zip(res[flow], res[torch]):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_data_augmented_assignment_keeps_version():
    res = {}
    for lib in LIBS:
        p = lib.nn.Parameter(lib.tensor([1.0, 2.0]))
        y = (p * p).sum()
        version = p._version
        p.data += 1
        p.data *= 2
        p.data -= 0.5
        p.data /= 2
        assert p._version == version and isinstance(p, lib.nn.Parameter) and p.is_leaf
        y.backward()
        res[lib] = (_np(p).copy(), p.grad.numpy().copy())
    for a, b in zip(res[flow], res[torch]):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_detach_inplace_still_breaks_backward():
    # The contrast .data exists for: detach() shares the version counter.
    for lib in LIBS:
        p = lib.nn.Parameter(lib.tensor([1.0, 2.0]))
        y = (p * p).sum()
        p.detach().add_(1.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()


def test_data_update_like_an_optimizer():
    """The classic manual SGD step: p.data.add_(-lr * p.grad)."""
    rng = np.random.default_rng(0)
    w0, x0 = rng.standard_normal((3, 2)), rng.standard_normal((4, 3))
    res = {}
    for lib in LIBS:
        w = lib.nn.Parameter(lib.tensor(w0.astype(np.float32)))
        x = lib.tensor(x0.astype(np.float32))
        for _ in range(3):
            loss = (x @ w).pow(2).mean()
            loss.backward()
            w.data.add_(w.grad.data, alpha=-0.1)
            w.grad.data.zero_()
        res[lib] = _np(w)
    np.testing.assert_allclose(res[flow], res[torch], rtol=1e-5, atol=1e-6)


def test_data_assignment_replaces_memory_keeps_identity():
    for lib in LIBS:
        lin = lib.nn.Linear(3, 2)
        p = lin.weight
        lin(lib.ones(1, 3)).sum().backward()
        grad = p.grad.numpy().copy()
        new = lib.arange(8, dtype=lib.float64).reshape(2, 4)  # another shape and dtype
        p.data = new
        assert lin.weight is p and isinstance(p, lib.nn.Parameter)
        assert p.requires_grad is True and p.is_leaf
        assert tuple(p.shape) == (2, 4) and p.dtype == lib.float64
        np.testing.assert_array_equal(_np(p), np.arange(8).reshape(2, 4))
        np.testing.assert_array_equal(p.grad.numpy(), grad)  # grad kept
        new[0, 0] = 100.0  # p now shares new's memory
        assert p[0, 0].item() == 100.0
        # p keeps working in autograd with its new data
        p.grad = None
        (p * 3).sum().backward()
        np.testing.assert_array_equal(p.grad.numpy(), np.full((2, 4), 3.0))


def test_data_assignment_errors_match_torch():
    for lib in LIBS:
        p = lib.nn.Parameter(lib.ones(2))
        with pytest.raises(TypeError):
            p.data = [1.0, 2.0]
        p.data = lib.zeros(3)  # a plain float tensor is fine
        assert tuple(p.shape) == (3,)
    x = flow.ones(2, requires_grad=True)
    y = x * 2
    t = torch.ones(2, requires_grad=True) * 2
    t.data = torch.zeros(2)  # torch allows it on a non-leaf
    with pytest.raises(RuntimeError, match="leaf"):
        y.data = flow.zeros(2)


def test_data_of_module_parameters_in_no_grad_init():
    # init code writes p.data directly; the parameter object stays the module's.
    for lib in LIBS:
        m = lib.nn.Linear(2, 2)
        version = m.weight._version
        m.weight.data.fill_(0.5)
        m.bias.data.zero_()
        out = m(lib.ones(1, 2))
        np.testing.assert_array_equal(_np(out), [[1.0, 1.0]])
        assert m.weight._version == version


def test_data_of_global_tensor():
    placement = flow.placement("cpu", ranks=[0])
    g = flow.ones(4).to_global(placement, flow.sbp.broadcast)
    g.requires_grad_(True)
    d = g.data
    assert d.is_global and d.requires_grad is False
    assert d.placement == placement and d.sbp == g.sbp
    d.mul_(3.0)
    np.testing.assert_array_equal(g.to_local().detach().numpy(), [3.0] * 4)
    g.data = flow.zeros(2).to_global(placement, flow.sbp.broadcast)
    assert g.is_global and tuple(g.shape) == (2,) and g.requires_grad
    with pytest.raises(RuntimeError, match="local tensor to the .data of a global tensor"):
        g.data = flow.zeros(2)
