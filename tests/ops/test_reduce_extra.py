"""Reductions beyond the registry-driven tests: the functional API and its torch overloads,
torch's errors, second derivatives with zeros, and the logical count of a split mean."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow._core.meta import TensorMeta
from sbpflow.framework.functional.reduce import vector_norm
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext


def _pair(x):
    return flow.tensor(x), torch.tensor(x)


def _close(a, b, tol=1e-10):
    a = a.detach().numpy() if isinstance(a, flow.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


X = np.random.default_rng(0).standard_normal((3, 4, 5))


# -- functional overloads -------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda m, x: m.sum(x), lambda m, x: m.sum(x, (0, 2)), lambda m, x: x.sum(-1, keepdim=True),
    lambda m, x: m.mean(x, 1), lambda m, x: x.mean((0, 1), True),
    lambda m, x: m.prod(x, 2), lambda m, x: x.prod(),
    lambda m, x: m.amax(x, (1, 2)), lambda m, x: x.amin(0, keepdim=True),
    lambda m, x: m.argmax(x), lambda m, x: x.argmin(1, True),
    lambda m, x: m.var(x), lambda m, x: m.var(x, 1, False), lambda m, x: m.var(x, False),
    lambda m, x: x.std(dim=(0, 2), correction=2, keepdim=True),
    lambda m, x: m.std(x, 0, True, True),
    lambda m, x: m.logsumexp(x, 1), lambda m, x: x.logsumexp((0, 2), keepdim=True),
    lambda m, x: m.cumsum(x, 1), lambda m, x: x.cumprod(-1),
    lambda m, x: m.norm(x), lambda m, x: m.norm(x, 1, 2), lambda m, x: m.norm(x, "fro", (0, 1)),
    lambda m, x: x.norm(float("inf"), 0, True), lambda m, x: m.norm(x, 0.5),
    lambda m, x: m.count_nonzero(m.gt(x, 0.5), (0, 1)), lambda m, x: m.any(m.gt(x, 1.5), 2),
    lambda m, x: m.all(m.gt(x, -1.5), (0, 1), keepdim=True), lambda m, x: m.any(x),
    lambda m, x: m.median(x), lambda m, x: m.var_mean(x, 1)[1], lambda m, x: m.std_mean(x)[0],
])
def test_functional_matches_torch(call):
    a, t = _pair(X)
    _close(call(flow, a), call(torch, t))


@pytest.mark.parametrize("name", ["max", "min", "median"])
def test_values_indices_result(name):
    a, t = _pair(X)
    got, exp = getattr(a, name)(1), getattr(t, name)(1)
    values, indices = got  # unpacks like a tuple
    assert values is got.values and indices is got.indices
    _close(got.values, exp.values)
    np.testing.assert_array_equal(got.indices.numpy(), exp.indices.numpy())
    assert indices.dtype == flow.int64
    kept = getattr(flow, name)(a, dim=-1, keepdim=True)
    assert tuple(kept.values.shape) == (3, 4, 1) == tuple(kept.indices.shape)


def test_max_min_of_two_tensors_is_elementwise():
    a, t = _pair(X)
    b, u = _pair(X[::-1].copy())
    _close(flow.max(a, b), torch.max(t, u))
    _close(a.min(b), t.min(u))
    _close(flow.max(a, other=b), torch.maximum(t, u))


def test_integer_and_bool_accumulate_like_torch():
    ints = np.array([[3, -2, 7], [1, 0, 5]], dtype=np.int32)
    a, t = _pair(ints)
    for f in (lambda m, x: m.sum(x), lambda m, x: m.prod(x, 1), lambda m, x: m.cumsum(x, 1),
              lambda m, x: m.cumprod(x, 0), lambda m, x: m.sum(x > 0, 0),
              lambda m, x: m.cumsum(x > 0, 1), lambda m, x: m.max(x), lambda m, x: m.amax(x, 1),
              lambda m, x: m.mean(x, 1, dtype=m.float64)):
        got, exp = f(flow, a), f(torch, t)
        assert got.dtype.name == str(exp.dtype).removeprefix("torch."), (got.dtype, exp.dtype)
        np.testing.assert_array_equal(got.numpy(), exp.numpy())


def test_uint8_any_all_keep_uint8():
    u = np.array([[0, 3], [1, 0]], dtype=np.uint8)
    a, t = _pair(u)
    for f in (lambda m, x: m.any(x, 1), lambda m, x: m.all(x), lambda m, x: x.any()):
        got, exp = f(flow, a), f(torch, t)
        assert got.dtype == flow.uint8 and exp.dtype == torch.uint8
        np.testing.assert_array_equal(got.numpy(), exp.numpy())


def test_half_precision_accumulates_in_float32():
    h = np.full(4096, 0.1, dtype=np.float16)
    a, t = _pair(h)
    # A float16 running sum stalls at 256 (0.1 is below half an ulp there); torch
    # accumulates in float32.
    assert flow.sum(a).item() == torch.sum(t).item()
    _close(flow.mean(a), torch.mean(t), tol=1e-3)
    _close(flow.cumsum(a, 0), torch.cumsum(t, 0), tol=1e-3)


def test_in_place_scans():
    a, t = _pair(X.copy())
    a.cumsum_(1)
    t.cumsum_(1)
    _close(a, t)
    ints = flow.tensor([[1, 2], [3, 4]], dtype=flow.int32)
    ints.cumprod_(0)
    assert ints.dtype == flow.int32 and ints.tolist() == [[1, 2], [3, 8]]


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("call,exc", [
    (lambda m: m.mean(m.tensor([1, 2])), RuntimeError),
    (lambda m: m.mean(m.tensor([1.0, 2.0]), dtype=m.int64), RuntimeError),
    (lambda m: m.var(m.tensor([1, 2])), RuntimeError),
    (lambda m: m.std(m.tensor([1, 2]), 0), RuntimeError),
    (lambda m: m.norm(m.tensor([1, 2])), RuntimeError),
    (lambda m: m.norm(m.zeros(0), float("-inf")), RuntimeError),
    (lambda m: m.argmax(m.zeros(0)), IndexError),
    (lambda m: m.argmax(m.tensor([True, False])), RuntimeError),
    (lambda m: m.max(m.zeros(0)), RuntimeError),
    (lambda m: m.max(m.zeros(2, 0), 1), IndexError),
    (lambda m: m.amin(m.zeros(0, 3), 0), IndexError),
    (lambda m: m.sum(m.zeros(2, 3), 2), IndexError),
    (lambda m: m.cumsum(m.zeros(2, 3), -3), IndexError),
    (lambda m: m.amax(m.zeros(2, 3), (1, -1)), RuntimeError),
    (lambda m: m.prod(m.zeros(2, 3), (0, 1)), TypeError),
    (lambda m: m.max(m.zeros(2, 3), keepdim=True), TypeError),
])
def test_errors_match_torch(call, exc):
    with pytest.raises(exc):
        call(torch)
    with pytest.raises(exc):
        call(flow)


def test_vector_norm_matches_torch_linalg():
    a, t = _pair(X)
    for ord_, dim in ((2, None), (1, (0, 2)), (-math.inf, 1), (0, 2), (-1.5, 0)):
        _close(vector_norm(a, ord_, dim), torch.linalg.vector_norm(t, ord_, dim))
    _close(vector_norm(a.float(), dim=1, keepdim=True, dtype=flow.float64),
           torch.linalg.vector_norm(t.float(), dim=1, keepdim=True, dtype=torch.float64),
           tol=1e-6)
    with pytest.raises(RuntimeError):
        torch.linalg.vector_norm(torch.zeros(0), math.inf)
    with pytest.raises(RuntimeError):
        vector_norm(flow.zeros(0), math.inf)


def test_empty_reductions_follow_torch():
    for f in (lambda m, x: m.sum(x, 0), lambda m, x: m.prod(x, 0), lambda m, x: m.mean(x, 0),
              lambda m, x: m.logsumexp(x, 0), lambda m, x: m.amax(x, 1),
              lambda m, x: m.norm(x, 2, 0), lambda m, x: m.any(x, 0)):
        a, t = _pair(np.zeros((0, 3)))
        got, exp = f(flow, a), f(torch, t)
        assert tuple(got.shape) == tuple(exp.shape)
        np.testing.assert_array_equal(got.numpy(), exp.numpy())


# -- gradients ------------------------------------------------------------------------------
def test_max_dim_grad_goes_to_first_occurrence_and_indices_have_none():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, -1.0]])
    a = flow.tensor(x, requires_grad=True)
    values, indices = a.max(1)
    assert values.requires_grad and not indices.requires_grad
    values.sum().backward()
    assert a.grad.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_amax_and_full_max_split_ties_equally():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    a = flow.tensor(x, requires_grad=True)
    a.amax(1).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    b = flow.tensor(x, requires_grad=True)
    b.max().backward()
    np.testing.assert_allclose(b.grad.numpy(), [[0, 0.5, 0.5], [0, 0, 0]])


# Rows with 0, 1, 2 and 3 zeros.
_ZEROS = np.array([[1.5, 0.4, -2.0, 0.5, 1.1], [0.0, 2.0, 0.6, 3.0, 0.7],
                   [0.7, -1.2, 0.0, 0.0, 1.3], [0.0, 0.0, 2.0, 0.0, 3.0]])


@pytest.mark.parametrize("name,x,f", [
    ("prod over a dim, 0-3 zeros per row", _ZEROS, lambda m, x: m.prod(x, 1)),
    ("prod of everything, two zeros", _ZEROS[:3, :3], lambda m, x: m.prod(x)),
    ("prod of everything, one zero", _ZEROS[1], lambda m, x: m.prod(x)),
    ("cumprod with zeros", _ZEROS, lambda m, x: m.cumprod(x, 1)),
    ("cumprod with zeros along dim 0", _ZEROS, lambda m, x: m.cumprod(x, 0)),
    ("var", _ZEROS, lambda m, x: m.var(x, 1)),
    ("std", _ZEROS, lambda m, x: m.std(x, 0)),
    ("logsumexp", _ZEROS, lambda m, x: m.logsumexp(x, 1)),
    ("norm 3", _ZEROS + 5, lambda m, x: m.norm(x, 3, 1)),
    # (A zero row has an undefined second derivative: torch gives nan there, sbpflow 0.)
    ("norm 2 with zero entries", _ZEROS[:, 1:3], lambda m, x: m.norm(x, 2, 1)),
])
def test_second_derivatives_match_torch(name, x, f):
    """Double backward, where zeros make naive prod/cumprod gradients wrong."""
    x = np.ascontiguousarray(x)
    rng = np.random.default_rng(1)
    a = flow.tensor(x, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    out_f, out_t = f(flow, a), f(torch, t)
    v = rng.standard_normal(tuple(out_t.shape))
    w = rng.standard_normal(x.shape)
    (g_f,) = flow.autograd.grad(out_f, a, flow.tensor(v), create_graph=True)
    (g_t,) = torch.autograd.grad(out_t, t, torch.tensor(v), create_graph=True)
    _close(g_f, g_t)
    (gg_f,) = flow.autograd.grad(g_f, a, flow.tensor(w))
    (gg_t,) = torch.autograd.grad(g_t, t, torch.tensor(w))
    _close(gg_f, gg_t)


def test_norm_grad_is_zero_for_a_zero_slice():
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]])
    for p in (2.0, 3.0, 1.5):
        a = flow.tensor(x, requires_grad=True)
        t = torch.tensor(x, requires_grad=True)
        flow.norm(a, p, 1).sum().backward()
        torch.norm(t, p, 1).sum().backward()
        _close(a.grad, t.grad)


# -- the logical count of a split mean ------------------------------------------------------
@pytest.mark.parametrize("parts", [2, 3])
def test_mean_over_a_split_axis_divides_by_the_logical_count(parts):
    """Each piece of S(1) computes sum(piece) / N_logical, so the pieces add up (S -> P)."""
    opdef = registry.get("mean")
    x = np.random.default_rng(2).standard_normal((3, 7))
    attrs = opdef.bind_attrs({"dim": 1})
    logical_in = (TensorMeta(x.shape, flow.float64),)
    (logical_out,) = opdef.meta(logical_in, attrs)
    total = np.zeros(3)
    for piece in np.array_split(x, parts, axis=1):
        ctx = KernelContext(flow.device("cpu").prims, "mean",
                            (TensorMeta(piece.shape, flow.float64),), (logical_out,),
                            logical_in, (logical_out,))
        total = total + opdef.kernel(ctx, piece.copy(), **attrs)
    np.testing.assert_allclose(total, x.mean(axis=1), rtol=1e-12)


def test_sbp_rules_of_reductions():
    """Linear reductions map S(reduced) -> P; max-like ones do not; keepdim renumbers."""
    from sbpflow.sbp import P, S, Signature

    m = TensorMeta((4, 6, 5), flow.float32)

    def sigs(name, **attrs):
        opdef = registry.get(name)
        return set(opdef.signatures((m,), opdef.bind_attrs(attrs)))

    assert Signature((S(1),), (P,)) in sigs("sum", dim=1)
    assert Signature((S(1),), (P,)) in sigs("mean", dim=1)
    assert Signature((P,), (P,)) in sigs("mean", dim=1)
    assert Signature((S(2),), (S(1),)) in sigs("sum", dim=1)
    assert Signature((S(2),), (S(2),)) in sigs("sum", dim=1, keepdim=True)
    for name in ("amax", "var", "prod", "logsumexp", "linalg_vector_norm"):
        dim = 1 if name == "prod" else (1,)
        found = sigs(name, dim=dim)
        assert Signature((S(1),), (P,)) not in found and Signature((P,), (P,)) not in found
        assert Signature((S(0),), (S(0),)) in found
    assert Signature((S(1),), (P, P)) not in sigs("max_dim", dim=1)
    assert Signature((S(0),), (S(0), S(0))) in sigs("max_dim", dim=1)
