"""The shape, index and creation functions and Tensor methods that fill issue 11's gaps
(broadcast_to ... scatter_reduce, unfold, in-place view ops, resize_): each one run through
sbpflow and torch 2.13 on the same data, comparing values, dtypes, shapes, gradients and the
exception types of torch's errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow

RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4))
V = RNG.standard_normal(4)


def _to_np(t):
    return t.detach().numpy() if isinstance(t, (flow.Tensor, torch.Tensor)) else np.asarray(t)


def _same(got, expected, tol=1e-10):
    if isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _same(g, e, tol)
        return
    assert isinstance(got, flow.Tensor), f"expected a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(expected.shape), (tuple(got.shape), tuple(expected.shape))
    assert got.dtype.name == str(expected.dtype).replace("torch.", ""), (got.dtype,
                                                                          expected.dtype)
    a, b = _to_np(got), _to_np(expected)
    if a.dtype.kind == "f":
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(a, b)


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(fn, *arrays, grad=True):
    """fn(module, *tensors) through sbpflow and torch: values, then gradients of a weighted
    sum of the floating outputs with respect to every floating input."""
    fa = [flow.tensor(a) for a in arrays]
    ta = [torch.tensor(a) for a in arrays]
    if grad:
        for f, t in zip(fa, ta, strict=True):
            if t.dtype.is_floating_point:
                f.requires_grad_(True)
                t.requires_grad_(True)
    got, expected = fn(flow, *fa), fn(torch, *ta)
    _same(got, expected)
    if not grad:
        return
    outs = [(g, e) for g, e in zip(_flat(got), _flat(expected), strict=True)
            if e.dtype.is_floating_point and e.requires_grad]
    if not outs:
        return
    rng = np.random.default_rng(0)
    loss_f = loss_t = 0
    for g, e in outs:
        w = rng.standard_normal(tuple(e.shape))
        loss_f = loss_f + (g * flow.tensor(w)).sum()
        loss_t = loss_t + (e * torch.tensor(w)).sum()
    loss_f.backward()
    loss_t.backward()
    for f, t in zip(fa, ta, strict=True):
        if t.requires_grad:
            assert (f.grad is None) == (t.grad is None)
            if t.grad is not None:
                _same(f.grad, t.grad)


def raises_like(fn, *arrays):
    """torch raises for fn: sbpflow raises the same exception type."""
    ta = [torch.tensor(a) for a in arrays]
    with pytest.raises(Exception) as texc:
        fn(torch, *ta)
    fa = [flow.tensor(a) for a in arrays]
    with pytest.raises(type(texc.value)):
        fn(flow, *fa)


# -- broadcasting, meshgrid -------------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x, v: m.broadcast_to(v, (2, 3, 4)),
    lambda m, x, v: x[0].broadcast_to((3, 4)),
    lambda m, x, v: m.broadcast_tensors(x, v, x[:, :1]),
    lambda m, x, v: m.broadcast_tensors(x),
    lambda m, x, v: m.meshgrid(v, x[:, 0], indexing="ij"),
    lambda m, x, v: m.meshgrid(v, x[:, 0], indexing="xy"),
    lambda m, x, v: m.meshgrid([v, x[:, 0], x[0, :2]], indexing="xy"),
    lambda m, x, v: m.meshgrid(v[0], x[:, 0], indexing="ij"),
    lambda m, x, v: m.cartesian_prod(v, x[:, 0]),
    lambda m, x, v: m.cartesian_prod(v[:2], x[:2, 0], x[0, :2]),
    lambda m, x, v: m.cartesian_prod(v),
])
def test_broadcasting(fn):
    check(fn, X, V)


def test_broadcast_shapes():
    for shapes in [((2, 1), (3,)), (5, (2, 1, 5)), ((),), ((0, 1), (3,))]:
        got, expected = flow.broadcast_shapes(*shapes), torch.broadcast_shapes(*shapes)
        assert tuple(got) == tuple(expected) and isinstance(got, flow.Size)
    with pytest.raises(RuntimeError):
        flow.broadcast_shapes((2, 3), (4,))


def test_meshgrid_warns_without_indexing_and_checks_inputs():
    with pytest.warns(UserWarning, match="indexing"):
        flow.meshgrid(flow.tensor(V), flow.tensor(V))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(lambda m, a, b: m.meshgrid(a, b), V, X[:, 0])
    raises_like(lambda m, x: m.meshgrid(x, indexing="ij"), X)
    raises_like(lambda m, v: m.meshgrid(v, indexing="ab"), V)
    raises_like(lambda m, v, i: m.meshgrid(v, i, indexing="ij"), V, np.arange(2))
    raises_like(lambda m, x: m.broadcast_tensors(x, x[:2, :3]), X)
    raises_like(lambda m, x: m.broadcast_to(x, (3, 5)), X)
    raises_like(lambda m, x: m.cartesian_prod(x), X)


# -- atleast, stacking, directional splits ------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x, v: m.atleast_1d(x[0, 0]),
    lambda m, x, v: m.atleast_1d(v, x[0, 0]),
    lambda m, x, v: m.atleast_1d([x]),
    lambda m, x, v: m.atleast_2d(x[0, 0]),
    lambda m, x, v: m.atleast_2d((v, x)),
    lambda m, x, v: m.atleast_3d(x[0, 0], v, x, x[None]),
    lambda m, x, v: m.hstack([x, x[:, :2]]),
    lambda m, x, v: m.hstack((v, x[0], x[0, 0])),
    lambda m, x, v: m.vstack([x, v, x[1:]]),
    lambda m, x, v: m.row_stack([x, v]),
    lambda m, x, v: m.dstack([x, x * 2]),
    lambda m, x, v: m.dstack([v, v]),
    lambda m, x, v: m.column_stack([x, x[:, 0], x[:, :2]]),
    lambda m, x, v: m.column_stack([v, v, v]),
    lambda m, x, v: m.hsplit(x, 2),
    lambda m, x, v: m.hsplit(v, [1, 3]),
    lambda m, x, v: x.vsplit([1]),
    lambda m, x, v: m.dsplit(x.reshape(3, 2, 2), 2),
    lambda m, x, v: m.split_with_sizes(x, [1, 2]),
    lambda m, x, v: x.split_with_sizes([1, 3], dim=1),
    lambda m, x, v: m.unsafe_split(x, 2, 1),
    lambda m, x, v: x.unsafe_chunk(2, 1),
    lambda m, x, v: m.tile(x, (2,)),
    lambda m, x, v: m.tile(v, (2, 1, 2)),
    lambda m, x, v: x.tile(2, 1, 2),
    lambda m, x, v: x.sum_to_size(1, 4),
    lambda m, x, v: x.sum_to_size((4,)),
    lambda m, x, v: x[:, :1].expand(2, 3, 4).sum_to_size(3, 1),
])
def test_stacking(fn):
    check(fn, X, V)


def test_stacking_errors():
    raises_like(lambda m, x: m.hstack([]), X)
    raises_like(lambda m, x: m.vstack(x), X)
    raises_like(lambda m, x: m.hsplit(x, 3), X)
    raises_like(lambda m, x: m.hsplit(x[0, 0], 1), X)
    raises_like(lambda m, x: m.vsplit(x[0], 2), X)
    raises_like(lambda m, x: m.dsplit(x, 2), X)
    raises_like(lambda m, x: x.sum_to_size(2, 4), X)


# -- diagonals, triangles, combinatorics --------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x, v: m.diag(v), lambda m, x, v: m.diag(v, 2), lambda m, x, v: m.diag(v, -1),
    lambda m, x, v: m.diag(x), lambda m, x, v: x.diag(1), lambda m, x, v: m.diag(x, -2),
    lambda m, x, v: m.diag_embed(x), lambda m, x, v: m.diag_embed(x, 1),
    lambda m, x, v: x.diag_embed(-2, 0, 2), lambda m, x, v: m.diag_embed(v, 0, 1, 0),
    lambda m, x, v: m.diagflat(x), lambda m, x, v: x.diagflat(-1),
    lambda m, x, v: m.trace(x), lambda m, x, v: x.t().trace(),
    lambda m, x, v: m.trace((x * 3).long()),
    lambda m, x, v: m.block_diag(x, v, x[0, 0], x[:2, :1]),
    lambda m, x, v: m.block_diag(x, (v * 3).int()),
    lambda m, x, v: m.block_diag(),
    lambda m, x, v: m.combinations(v),
    lambda m, x, v: m.combinations(v, 3),
    lambda m, x, v: m.combinations(v, 1),
    lambda m, x, v: m.combinations(v, 0),
    lambda m, x, v: m.combinations(v, 5),
    lambda m, x, v: m.combinations(v, 2, with_replacement=True),
    lambda m, x, v: m.combinations(v, 3, with_replacement=True),
    lambda m, x, v: m.combinations(v[:0], 2), lambda m, x, v: m.combinations(v[:1], 2, True),
    lambda m, x, v: m.rot90(x), lambda m, x, v: m.rot90(x, 2), lambda m, x, v: x.rot90(3),
    lambda m, x, v: m.rot90(x, -1, [1, 0]), lambda m, x, v: m.rot90(x, 4),
    lambda m, x, v: m.rot90(x.reshape(3, 2, 2), 1, [2, 0]),
])
def test_diagonals(fn):
    check(fn, X, V)


@pytest.mark.parametrize("args", [(3, 5), (4, 3, 1), (4, 4, -2), (0, 3), (3, 3, 9), (5, 2, -7)])
def test_tri_indices(args):
    for name in ("tril_indices", "triu_indices"):
        _same(getattr(flow, name)(*args), getattr(torch, name)(*args))
    _same(flow.tril_indices(3, 4, dtype=flow.int32), torch.tril_indices(3, 4, dtype=torch.int32))


def test_diagonal_errors():
    raises_like(lambda m, x: m.diag(x[None]), X)
    raises_like(lambda m, x: m.diag(x[0, 0]), X)
    raises_like(lambda m, x: m.diag_embed(x, 0, 1, -2), X)
    raises_like(lambda m, x: m.trace(x[0]), X)
    raises_like(lambda m, x: m.block_diag(x[None]), X)
    raises_like(lambda m, x: m.combinations(x), X)
    raises_like(lambda m, x: m.combinations(x[0], -1), X)
    raises_like(lambda m, x: m.rot90(x, 1, [0]), X)
    raises_like(lambda m, x: m.rot90(x, 1, [1, 1]), X)
    raises_like(lambda m, x: m.rot90(x[0]), X)
    with pytest.raises(RuntimeError):
        flow.tril_indices(-1, 3)


# -- diff, narrow_copy, unfold ---------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x, v: m.diff(v), lambda m, x, v: m.diff(x, 2, 0),
    lambda m, x, v: x.diff(dim=1, prepend=x[:, :2], append=x[:, :1]),
    lambda m, x, v: m.diff(x, 3, 0, prepend=x[:1]), lambda m, x, v: m.diff(v, 9),
    lambda m, x, v: m.diff(v, 0), lambda m, x, v: m.diff(x > 0),
    lambda m, x, v: m.diff((x * 4).long(), 2),
    lambda m, x, v: m.narrow_copy(x, 1, 1, 2), lambda m, x, v: x.narrow_copy(0, 1, 2),
    lambda m, x, v: x.unfold(1, 2, 1), lambda m, x, v: x.unfold(0, 2, 2),
    lambda m, x, v: x.unfold(-1, 4, 3), lambda m, x, v: x.unfold(1, 0, 1),
    lambda m, x, v: v.unfold(0, 3, 1), lambda m, x, v: x[0, 0].unfold(0, 1, 1),
    lambda m, x, v: x.reshape(3, 2, 2).unfold(1, 1, 1),
])
def test_diff_unfold(fn):
    check(fn, X, V)


def test_diff_unfold_errors():
    raises_like(lambda m, x: m.diff(x[0, 0]), X)
    raises_like(lambda m, x: m.diff(x, -1), X)
    raises_like(lambda m, x: m.diff(x, prepend=x[0]), X)
    raises_like(lambda m, x: x.unfold(0, 5, 1), X)
    raises_like(lambda m, x: x.unfold(0, 2, 0), X)
    raises_like(lambda m, x: x.unfold(2, 1, 1), X)
    raises_like(lambda m, x: m.narrow_copy(x, 0, 2, 2), X)


# -- index_copy, index_fill, put, take, masked_scatter -------------------------------------------
IDX = np.asarray([2, 0])
MASK = RNG.random((3, 4)) < 0.5


@pytest.mark.parametrize("fn", [
    lambda m, x, s, i, k: m.index_copy(x, 0, i, s[:2]),
    lambda m, x, s, i, k: x.index_copy(1, i, s[:, :2]),
    lambda m, x, s, i, k: x[0, 0].index_copy(0, i[1], s[0, 0]),
    lambda m, x, s, i, k: m.index_fill(x, 1, i, -1.5),
    lambda m, x, s, i, k: x.index_fill(0, i[:1], s[0, 0]),
    lambda m, x, s, i, k: x.index_fill(-1, i - 4, 2),
    lambda m, x, s, i, k: (x * 4).long().index_fill(0, i, 2.7),
    lambda m, x, s, i, k: m.put(x, i, s[0, :2]),
    lambda m, x, s, i, k: x.put(i - 12, s[0, :2], accumulate=True),
    lambda m, x, s, i, k: x.put(m.stack([i, i]), s[:2, :2], True),
    lambda m, x, s, i, k: m.take(x, i * 5), lambda m, x, s, i, k: x.take(i[0] - 12),
    lambda m, x, s, i, k: x.take(m.stack([i, i])),
    lambda m, x, s, i, k: m.masked_scatter(x, k, s),
    lambda m, x, s, i, k: x.masked_scatter(k[0], s),
    lambda m, x, s, i, k: x[0].masked_scatter(k, s),
    lambda m, x, s, i, k: x[0, 0].masked_scatter(k[0, 0], s),
])
def test_index_functions(fn):
    check(fn, X, X[::-1].copy() * 2, IDX, MASK)


def test_index_function_errors():
    args = (X, X * 2, IDX, MASK)
    for fn in [
        lambda m, x, s, i, k: x.index_copy(0, i.int(), s[:2]),
        lambda m, x, s, i, k: x.index_copy(0, i[None], s[:2]),
        lambda m, x, s, i, k: x.index_copy(0, i, s[:2].float()),
        lambda m, x, s, i, k: x.index_copy(0, i, s[:3]),
        lambda m, x, s, i, k: x.index_copy(0, i + 2, s[:2]),
        lambda m, x, s, i, k: x.index_copy(0, i, s[:2, :2]),
        lambda m, x, s, i, k: x.index_fill(0, i.int(), 1.0),
        lambda m, x, s, i, k: x.index_fill(0, i + 2, 1.0),
        lambda m, x, s, i, k: x.index_fill(0, i, s[0]),
        lambda m, x, s, i, k: x.masked_scatter(k.byte(), s),
        lambda m, x, s, i, k: x.masked_scatter(k, s[0, :1]) if k.any() else 1 / 0,
        lambda m, x, s, i, k: x.masked_scatter(k, s.float()),
        lambda m, x, s, i, k: x.put(i, s[0, :3]),
        lambda m, x, s, i, k: x.put(i.int(), s[0, :2]),
        lambda m, x, s, i, k: x.put(i + 11, s[0, :2]),
        lambda m, x, s, i, k: x.put(i, s[0, :2].float()),
        lambda m, x, s, i, k: x.take(i.int()),
        lambda m, x, s, i, k: x.take(i - 15),
    ]:
        raises_like(fn, *args)


def test_inplace_index_methods_write_through():
    for name, args in [("index_copy_", (0, IDX, X[:2] * 3)), ("index_fill_", (1, IDX, 0.25)),
                       ("put_", (IDX, X[0, :2] * 3)), ("masked_scatter_", (MASK, X * 5))]:
        a, t = flow.tensor(X), torch.tensor(X)
        fa = [flow.tensor(v) if isinstance(v, np.ndarray) else v for v in args]
        ta = [torch.tensor(v) if isinstance(v, np.ndarray) else v for v in args]
        assert getattr(a, name)(*fa) is a
        getattr(t, name)(*ta)
        _same(a, t)


# -- *_scatter and fill_diagonal_ ----------------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x, s: m.select_scatter(x, s[0], 0, 1),
    lambda m, x, s: x.select_scatter(s[:, 0], 1, -1),
    lambda m, x, s: m.select_scatter(x, s[0].float(), 0, 0),
    lambda m, x, s: m.slice_scatter(x, s[:2], 0, 1),
    lambda m, x, s: x.slice_scatter(s[:, :2], 1, 0, 4, 2),
    lambda m, x, s: m.slice_scatter(x, s, dim=1),
    lambda m, x, s: m.diagonal_scatter(x, s[0, :3]),
    lambda m, x, s: x.diagonal_scatter(s[0, :3], 1),
    lambda m, x, s: m.diagonal_scatter(x, s[0, :3], -1, 1, 0),
    lambda m, x, s: m.diagonal_scatter(x, s[0, :2], 1, 1, 0),
    lambda m, x, s: m.diagonal_scatter(x.reshape(3, 2, 2), s[:2, :2], 0, 0, 2),
])
def test_scatter_views(fn):
    check(fn, X, X[::-1].copy() * 2)


def test_scatter_view_errors():
    raises_like(lambda m, x: m.select_scatter(x, x[0, :3], 0, 0), X)
    raises_like(lambda m, x: m.slice_scatter(x, x, 0, 0, 2), X)
    raises_like(lambda m, x: m.diagonal_scatter(x, x[0]), X)
    raises_like(lambda m, x: m.select_scatter(x, x[0], 0, 5), X)


@pytest.mark.parametrize("shape,wrap", [((3, 4), False), ((4, 3), False), ((7, 3), True),
                                        ((7, 3), False), ((3, 3, 3), False), ((2, 5), True)])
def test_fill_diagonal(shape, wrap):
    a, t = flow.zeros(shape), torch.zeros(shape)
    assert a.fill_diagonal_(2.5, wrap=wrap) is a
    t.fill_diagonal_(2.5, wrap=wrap)
    _same(a, t)


def test_fill_diagonal_errors_and_grad():
    raises_like(lambda m, x: x.clone().fill_diagonal_(1), V)
    raises_like(lambda m, x: x.clone().reshape(1, 2, 2).fill_diagonal_(1), V)
    raises_like(lambda m, x: x.requires_grad_().fill_diagonal_(1), X)
    check(lambda m, x: (x * 1).fill_diagonal_(0.5), X)


# -- scatter_reduce ------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    index = RNG.integers(0, 3, (4, 4))
    src = RNG.standard_normal((4, 4))
    check(lambda m, x, i, s: m.scatter_reduce(x, 0, i, s, reduce, include_self=include_self),
          X, index, src)
    check(lambda m, x, i, s: x.scatter_reduce(1, i[:3, :2] + 1, s[:3, :2], reduce,
                                              include_self=include_self), X, index, src)
    ints = (X * 5).astype(np.int64)
    check(lambda m, x, i, s: x.scatter_reduce(0, i, s, reduce, include_self=include_self),
          ints, index, (src * 5).astype(np.int64))


def test_scatter_reduce_zeros_and_ties_gradients():
    x = np.asarray([[0.0, 2.0], [3.0, 0.0]])
    src = np.asarray([[0.0, 2.0], [1.5, 0.0], [0.0, 2.0]])
    index = np.asarray([[0, 0], [1, 0], [0, 1]])
    for reduce in ("prod", "amax", "amin"):
        for include_self in (True, False):
            check(lambda m, a, i, s, r=reduce, inc=include_self: a.scatter_reduce(
                0, i, s, r, include_self=inc), x, index, src)


def test_scatter_reduce_inplace_and_errors():
    index = np.asarray([[0, 1, 1, 2]])
    a, t = flow.tensor(X), torch.tensor(X)
    a.scatter_reduce_(0, flow.tensor(index), flow.tensor(X[:1]), "amax")
    t.scatter_reduce_(0, torch.tensor(index), torch.tensor(X[:1]), "amax")
    _same(a, t)
    raises_like(lambda m, x, i: x.scatter_reduce(0, i, x[:1], "foo"), X, index)
    raises_like(lambda m, x, i: x.scatter_reduce(0, i, x[:1].float(), "sum"), X, index)
    raises_like(lambda m, x, i: x.scatter_reduce(0, i + 2, x[:1], "sum"), X, index)
    raises_like(lambda m, x, i: x.scatter_reduce(0, i[0], x[:1], "sum"), X, index)


# -- in-place view ops, resize_, type_as -----------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda x: x.t_(), lambda x: x.transpose_(0, 1), lambda x: x.swapaxes_(1, 0),
    lambda x: x.swapdims_(0, -1), lambda x: x.unsqueeze_(1), lambda x: x.unsqueeze_(-1),
    lambda x: x[:1].squeeze_(), lambda x: x[:, :1].squeeze_(1), lambda x: x.squeeze_(0),
])
def test_inplace_view_ops(fn):
    a, t = flow.tensor(X), torch.tensor(X)
    ra, rt = fn(a), fn(t)
    _same(ra, rt)
    assert tuple(ra.stride()) == tuple(rt.stride())
    # the result still shares the memory of the original tensor
    ra.mul_(2)
    rt.mul_(2)
    _same(a, t)
    # through autograd: an in-place view op on a non-leaf keeps the history
    fa, ta = flow.tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
    ya, yt = fa * 3, ta * 3
    fn(ya)
    fn(yt)
    (ya * ya).sum().backward()
    (yt * yt).sum().backward()
    _same(fa.grad, ta.grad)


def test_inplace_view_op_errors():
    raises_like(lambda m, x: x.requires_grad_().t_(), X)
    raises_like(lambda m, x: x.reshape(2, 2, 3).t_(), X)
    raises_like(lambda m, x: x.transpose_(0, 2), X)


@pytest.mark.parametrize("size", [(2, 3), (12,), (3, 4), (5, 5), (0,), (2, 2, 2)])
def test_resize(size):
    a, t = flow.tensor(X), torch.tensor(X)
    assert a.resize_(*size) is a
    t.resize_(*size)
    assert tuple(a.shape) == tuple(t.shape) and tuple(a.stride()) == tuple(t.stride())
    n = min(a.numel(), 12)
    # torch keeps the old elements first; the rest is uninitialised memory
    np.testing.assert_array_equal(a.numpy().reshape(-1)[:n], t.numpy().reshape(-1)[:n])
    b, u = flow.tensor(X), torch.tensor(X)
    b.resize_as_(flow.zeros(size))
    u.resize_as_(torch.zeros(size))
    assert tuple(b.shape) == tuple(u.shape)


def test_resize_shrink_shares_memory_and_errors():
    a = flow.tensor(X)
    a.resize_(2, 2)
    np.testing.assert_array_equal(a.numpy(), X.reshape(-1)[:4].reshape(2, 2))
    raises_like(lambda m, x: x.requires_grad_().resize_(2, 2), X)
    raises_like(lambda m, x: x.resize_(-1, 2), X)


@pytest.mark.parametrize("other", [np.zeros(2, np.int32), np.zeros(1), np.zeros(1, bool),
                                   np.zeros(1, np.float32)])
def test_type_as(other):
    _same(flow.tensor(X).type_as(flow.tensor(other)), torch.tensor(X).type_as(torch.tensor(other)))
    check(lambda m, x: x.type_as(x[0].float()), X)


# -- index_reduce, unravel_index, nonzero_static, index_put_ ---------------------------------------
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    src = RNG.standard_normal((4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "index_reduce() is in beta"
        check(lambda m, x, i, s: m.index_reduce(x, 0, i, s, reduce, include_self=include_self),
              X, np.asarray([2, 0, 2, 1]), src)
        check(lambda m, x, i, s: x.index_reduce(1, i[:2], s[:3, :2], reduce,
                                                include_self=include_self),
              X, np.asarray([3, 3, 0, 1]), src)
        a, t = flow.tensor(X), torch.tensor(X)
        a.index_reduce_(0, flow.tensor([1, 1]), flow.tensor(src[:2, :4]), reduce)
        t.index_reduce_(0, torch.tensor([1, 1]), torch.tensor(src[:2, :4]), reduce)
        _same(a, t)


def test_index_reduce_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in [lambda m, x, i: x.index_reduce(0, i, x[:2], "sum"),
                   lambda m, x, i: x.index_reduce(0, i.float(), x[:2], "prod"),
                   lambda m, x, i: x.index_reduce(0, i + 3, x[:2], "prod"),
                   lambda m, x, i: x.index_reduce(0, i, x[:3], "prod"),
                   lambda m, x, i: x.index_reduce(0, i, x[:2].float(), "prod"),
                   lambda m, x, i: x.index_reduce(0, i[None], x[:2], "prod"),
                   lambda m, x, i: x.index_reduce(0, i, x[:2, :2], "prod")]:
            raises_like(fn, X, IDX)


@pytest.mark.parametrize("indices,shape", [([4, -1, 12, -13, 0], (3, 4)), ([5, 7], (2, 2, 2)),
                                           (5, (3, 4)), ([3], (7,)), (0, ())])
def test_unravel_index(indices, shape):
    _same(flow.unravel_index(flow.tensor(indices), shape),
          torch.unravel_index(torch.tensor(indices), shape))
    _same(flow.unravel_index(flow.tensor(indices, dtype=flow.int32), flow.Size(shape)),
          torch.unravel_index(torch.tensor(indices, dtype=torch.int32), torch.Size(shape)))


def test_unravel_index_errors():
    with pytest.raises(TypeError):
        flow.unravel_index(flow.tensor([1.0]), (3, 4))
    with pytest.raises(ValueError):
        flow.unravel_index(flow.tensor([1]), (3, -4))


@pytest.mark.parametrize("size,fill", [(4, -1), (1, 7), (0, -1), (9, 3)])
def test_nonzero_static(size, fill):
    x = np.asarray([[0.0, 1.0, 0.5], [2.0, 0.0, 0.0]])
    _same(flow.nonzero_static(flow.tensor(x), size=size, fill_value=fill),
          torch.nonzero_static(torch.tensor(x), size=size, fill_value=fill))
    _same(flow.tensor(3.0).nonzero_static(size=2), torch.tensor(3.0).nonzero_static(size=2))
    with pytest.raises(RuntimeError):
        flow.nonzero_static(flow.tensor(x), size=-1)


def test_index_put_top_level():
    a, t = flow.tensor(X), torch.tensor(X)
    assert flow.index_put_(a, (flow.tensor(IDX),), flow.tensor(1.5, dtype=flow.float64)) is a
    torch.index_put_(t, (torch.tensor(IDX),), torch.tensor(1.5, dtype=torch.float64))
    _same(a, t)


# -- as_strided, *_copy, vander, adjoint ----------------------------------------------------------
@pytest.mark.parametrize("fn", [
    lambda m, x: m.as_strided(x, (2, 2), (1, 2)),
    lambda m, x: x.as_strided((3, 3), (1, 1), 2),
    lambda m, x: x[1].as_strided((2, 2), (1, 1)),
    lambda m, x: x[1:].as_strided((2,), (3,)),
    lambda m, x: m.as_strided(x, (0, 3), (1, 1), 50),
    lambda m, x: m.as_strided(x, (), (), 11),
    lambda m, x: m.as_strided_copy(x, (4, 3), (1, 4)),
    lambda m, x: m.expand_copy(x[0], (2, 4)), lambda m, x: m.permute_copy(x, (1, 0)),
    lambda m, x: m.t_copy(x), lambda m, x: m.transpose_copy(x, 0, 1),
    lambda m, x: m.squeeze_copy(x[:1]), lambda m, x: m.unsqueeze_copy(x, 1),
    lambda m, x: m.view_copy(x, (4, 3)), lambda m, x: m.select_copy(x, 1, 2),
    lambda m, x: m.slice_copy(x, 1, 1, 4, 2), lambda m, x: m.slice_copy(x),
    lambda m, x: m.split_copy(x, 2, 1), lambda m, x: m.split_with_sizes_copy(x, [2, 1]),
    lambda m, x: m.unbind_copy(x, 1), lambda m, x: m.unfold_copy(x, 1, 2, 2),
    lambda m, x: m.alias_copy(x), lambda m, x: m.diagonal_copy(x),
    lambda m, x: m.adjoint(x), lambda m, x: x.reshape(3, 2, 2).adjoint(), lambda m, x: x.H,
    lambda m, x: x.reshape(2, 3, 2).mH, lambda m, x: m.constant_pad_nd(x, (1, 2), 3.0),
    lambda m, x: m.constant_pad_nd(x, (1, 0, -1, 1)),
])
def test_strided_and_copies(fn):
    check(fn, X)


@pytest.mark.parametrize("fn", [
    lambda m, x: m.vander(x[0]), lambda m, x: m.vander(x[0], 2, increasing=True),
    lambda m, x: m.vander(x[0], 0), lambda m, x: m.vander((x[0] * 3).int()),
    lambda m, x: m.vander(x[0] > 0, 3),
])
def test_vander(fn):
    check(fn, X, grad=False)  # torch's vander backward fails (an in-place cumprod)


def test_vander_gradient():
    a, t = flow.tensor(X[0], requires_grad=True), torch.tensor(X[0], requires_grad=True)
    w = RNG.standard_normal((4, 3))
    (flow.vander(a, 3) * flow.tensor(w)).sum().backward()
    powers = torch.arange(2, -1, -1)
    (t[:, None].pow(powers) * torch.tensor(w)).sum().backward()
    _same(a.grad, t.grad)


def test_copies_do_not_share_memory_and_errors():
    a = flow.tensor(X)
    c = flow.transpose_copy(a, 0, 1)
    c.add_(1)
    np.testing.assert_array_equal(a.numpy(), X)
    raises_like(lambda m, x: m.as_strided(x, (2,), (-1,)), X)
    raises_like(lambda m, x: m.as_strided(x, (3, 3), (4, 2), 2), X)
    raises_like(lambda m, x: m.vander(x), X)
    raises_like(lambda m, x: m.vander(x[0], -1), X)
    raises_like(lambda m, x: x.reshape(3, 2, 2).H, X)
    raises_like(lambda m, x: x[0].mH, X)
    raises_like(lambda m, x: m.adjoint(x[0]), X)


# -- small Tensor methods: fill, zero_, new, is_signed, nbytes ... --------------------------------
def test_fill_zero_and_metadata():
    a, t = flow.tensor(X), torch.tensor(X)
    _same(flow.fill(a, 2.5), torch.fill(t, 2.5))
    _same(a, t)  # fill is out of place
    _same(flow.fill(a, flow.tensor(-1.0)), torch.fill(t, torch.tensor(-1.0)))
    raises_like(lambda m, x: m.fill(x, x[0]), X)
    assert flow.fill_(a, 3) is a and flow.zero_(a) is a
    torch.fill_(t, 3)
    torch.zero_(t)
    _same(a, t)
    for arr in (X, X.astype(np.int32), X > 0, X.astype(np.uint8), X.astype(np.float16)):
        f, u = flow.tensor(arr), torch.tensor(arr)
        assert f.is_signed() == u.is_signed() == flow.is_signed(f)
        assert (f.nbytes, f.itemsize, f.ndimension()) == (u.nbytes, u.itemsize, u.ndimension())
    assert flow.is_same_size(flow.tensor(X), flow.zeros(3, 4))
    assert not flow.tensor(X).is_same_size(flow.zeros(4, 3))
    assert flow.tensor([2]).is_nonzero() and not flow.tensor([0.0]).is_nonzero()
    raises_like(lambda m, x: x.is_nonzero(), X)
    raises_like(lambda m, x: x[:0].is_nonzero(), X)


def test_legacy_new():
    a, t = flow.tensor(X, dtype=flow.float32), torch.tensor(X, dtype=torch.float32)
    for args in [(2, 3), ([1, 2],), (), ([[1, 2], [3, 4]],)]:
        got, expected = a.new(*args), t.new(*args)
        assert tuple(got.shape) == tuple(expected.shape) and got.dtype is flow.float32
        if args and isinstance(args[0], list):
            _same(got, expected)
    with pytest.raises(TypeError):
        a.new(flow.tensor([1, 2]))


# -- global tensors ----------------------------------------------------------------------------
def test_global_tensors_match_local():
    """The compositions on global tensors (broadcast, S(0), S(1)) on 2 ranks equal the local
    run, values and gradients (tests/ops/api_fill_T2_global_check.py)."""
    import re
    from pathlib import Path

    from tests.mpijob import mpiexec_cmd, run_job

    script = str(Path(__file__).resolve().parent / "api_fill_T2_global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", script), timeout=180)
    assert job.returncode == 0, job.output[-6000:]
    assert job.strays == 0, job.output[-6000:]
    passed = re.findall(r"rank (\d+): api fill T2 global check passed \((\d+) cases\)",
                        job.stdout)
    assert sorted(int(r) for r, _ in passed) == [0, 1], job.output[-6000:]
    assert all(int(c) >= 80 for _, c in passed), job.output[-6000:]


# -- nn.Graph ----------------------------------------------------------------------------------
def _inplace_chain(x):
    y = x * 1
    y.t_()
    y.unsqueeze_(0)
    return y * 2 + 1


@pytest.mark.parametrize("fn", [
    _inplace_chain, lambda x: (x * 1).squeeze_(0) if x.shape[0] == 1 else (x * 1).swapdims_(0, 1),
    lambda x: flow.select_scatter(x, x[0] * 2, 0, 1),
    lambda x: flow.slice_scatter(x, x[:, :2] * 2, 1, 1, 4, 2),
    lambda x: flow.diagonal_scatter(x, x[0, :3]), lambda x: (x * 1).fill_diagonal_(3.0),
    lambda x: flow.hstack([x, x]), lambda x: flow.diag_embed(x), lambda x: x.unfold(1, 2, 1),
    lambda x: x.scatter_reduce(0, flow.tensor([[0, 1, 1, 2]]), x[:1], "amax"),
    lambda x: flow.meshgrid(x[0], x[:, 0], indexing="xy")[1], lambda x: flow.rot90(x, 3),
    lambda x: x.index_fill(1, flow.tensor([0, 2]), -1.0), lambda x: flow.combinations(x[0]),
])
def test_in_graph_equals_eager(fn):
    class Traced(flow.nn.Graph):
        def build(self, x):
            return fn(x)

    x = flow.tensor(X)
    got, want = Traced()(x), fn(x)
    assert tuple(got.shape) == tuple(want.shape)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)


def test_inplace_view_op_on_a_captured_tensor_in_graph_raises():
    captured = flow.tensor(X)

    class Traced(flow.nn.Graph):
        def build(self, x):
            captured.t_()
            return x

    with pytest.raises(NotImplementedError, match="in-place view op"):
        Traced()(flow.tensor(X))


@pytest.mark.parametrize("size,stride", [((2, 3, 4), (12, 4, 1)), ((2, 3, 4), (1, 8, 2)),
                                         ((2, 3, 4, 5), (60, 1, 15, 3)), ((3, 1), (1, 1)),
                                         ((0, 3), (3, 1)), ((), ())])
def test_empty_strided(size, stride):
    a, t = flow.empty_strided(size, stride), torch.empty_strided(size, stride)
    assert tuple(a.shape) == tuple(t.shape) and a.dtype is flow.float32
    assert all(n <= 1 or a.stride(i) == t.stride(i) for i, n in enumerate(size))
    b = flow.tensor(X, dtype=flow.float64).new_empty_strided(size, stride, requires_grad=True)
    assert b.dtype is flow.float64 and b.requires_grad and tuple(b.shape) == tuple(size)


def test_empty_strided_errors():
    with pytest.raises(RuntimeError):
        flow.empty_strided((2, 3), (1,))
    with pytest.raises(NotImplementedError, match="dense"):
        flow.empty_strided((2, 3), (1, 1))  # overlapping: torch allows it, sbpflow cannot


@pytest.mark.parametrize("fn", [
    lambda m, x, s: m.as_strided_scatter(x, s[:2, :2], (2, 2), (1, 2), 1),
    lambda m, x, s: x[1:].as_strided_scatter(s[0, :2], (2,), (1,)),
    lambda m, x, s: m.as_strided_scatter(x.t(), s[:3, :3], (3, 3), (4, 1)),
    lambda m, x, s: m.as_strided_scatter(x, s[0, :0], (0,), (1,), 40),
])
def test_as_strided_scatter(fn):
    # torch's backward for as_strided_scatter's input is wrong (it passes the gradient of the
    # overwritten region instead of the rest); values here, gradients below
    check(fn, X, X[::-1].copy() * 2, grad=False)


def test_as_strided_scatter_gradient():
    pos = torch.tensor([1, 3, 2, 4])  # as_strided((2, 2), (1, 2), 1) of a flat 3x4 tensor
    check(lambda m, x, s: (m.as_strided_scatter(x, s[:2, :2], (2, 2), (1, 2), 1)
                           if m is flow else x.reshape(-1).index_put(
                               (pos,), s[:2, :2].reshape(-1)).reshape(3, 4)),
          X, X[::-1].copy() * 2)


def test_as_strided_scatter_errors():
    raises_like(lambda m, x: m.as_strided_scatter(x, x[:2, :2], (2, 2), (4, 2), 9), X)
    raises_like(lambda m, x: m.as_strided_scatter(x, x[:2, :3], (2, 2), (4, 2)), X)


def test_deprecated_resize():
    for args in [(3, 4), (12,), (2, 2, 3)]:
        with pytest.warns(UserWarning, match="non-inplace resize is deprecated"):
            got = flow.tensor(X).resize(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = torch.tensor(X).resize(*args)
        _same(got, expected)
    with pytest.warns(UserWarning, match="resize_as"):
        got = flow.tensor(X).resize_as(flow.zeros(6, 2))
    assert tuple(got.shape) == (6, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raises_like(lambda m, x: x.resize(5, 5), X)
        check(lambda m, x: x.t().resize(2, 6), X)
