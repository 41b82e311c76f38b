"""Sparse COO tensors against torch 2.13: construction, coalescing, conversions, the product
with a dense matrix on either side with gradients for the values and the dense operand,
sums, addition and scalar multiplication; other ops raise NotImplementedError naming
themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow

RNG = np.random.default_rng(0)
EDGES = np.stack([RNG.integers(0, 5, 9), RNG.integers(0, 6, 9)]).astype(np.int32)  # (2, 9)
EDGES[:, 8] = EDGES[:, 0]  # a duplicate entry
VALUES = RNG.standard_normal(9)


def _both(fn):
    return fn(flow), fn(torch)


def _np(x):
    return x.detach().numpy() if isinstance(x, torch.Tensor) else x.detach().numpy()


def _same(a, b, **tol):
    assert tuple(a.shape) == tuple(b.shape)
    assert a.dtype.name == str(b.dtype).replace("torch.", "")
    np.testing.assert_allclose(_np(a), _np(b), **(tol or {"rtol": 1e-12, "atol": 1e-12}))


def _same_sparse(a, b):
    assert a.is_sparse and b.is_sparse and tuple(a.shape) == tuple(b.shape)
    a, b = a.coalesce(), b.coalesce()
    np.testing.assert_array_equal(a.indices().numpy(), b.indices().numpy())
    _same(a.values(), b.values())


def _coo(L, edges=EDGES, values=VALUES, size=(5, 6), **kw):
    return L.sparse_coo_tensor(edges, L.tensor(values), size, **kw)


def test_construction_from_numpy_indices_as_users_pass_them():
    # GCN builds its adjacency from an int32 NumPy array's transpose and casts the values
    edges = np.ascontiguousarray(EDGES.T).T  # non-contiguous
    f, t = _both(lambda L: L.sparse_coo_tensor(edges, L.ones(9), (5, 6), dtype=L.int64))
    assert f.is_sparse and f.layout == flow.sparse_coo and f.dtype is flow.int64
    assert not f.is_coalesced() and f._nnz() == t._nnz() == 9
    _same(f.to_dense(), t.to_dense())
    f, t = _both(lambda L: L.sparse_coo_tensor(EDGES, L.tensor(VALUES)))  # size inferred
    assert tuple(f.shape) == tuple(t.shape)
    _same(f.to_dense(), t.to_dense())


def test_coalesce_sums_duplicates_in_torchs_order():
    f, t = _both(_coo)
    for x in (f, t):
        with pytest.raises(RuntimeError, match="uncoalesced"):
            x.values()
    cf, ct = f.coalesce(), t.coalesce()
    assert cf.is_coalesced() and cf._nnz() == ct._nnz() < 9
    np.testing.assert_array_equal(cf.indices().numpy(), ct.indices().numpy())
    _same(cf.values(), ct.values())


def test_to_sparse_and_back():
    a = RNG.standard_normal((4, 5)) * (RNG.random((4, 5)) < 0.4)
    f, t = _both(lambda L: L.tensor(a).to_sparse())
    assert f.is_coalesced()
    _same_sparse(f, t)
    _same(f.to_dense(), t.to_dense())
    _same(f.t().to_dense(), t.t().to_dense())
    assert f.to(flow.float32).dtype is flow.float32 and f.to(flow.float32).is_sparse


PRODUCTS = {
    "sparse @ dense": lambda L, s, x: s @ x,
    "dense @ sparse": lambda L, s, x: x @ s,
    "mm": lambda L, s, x: L.mm(s, x),
    "spmm": lambda L, s, x: L.spmm(s, x),
    "sparse.mm": lambda L, s, x: L.sparse.mm(s, x),
    "matmul": lambda L, s, x: L.matmul(s, x),
}


@pytest.mark.parametrize("side", list(PRODUCTS))
def test_products_with_gradients_for_values_and_the_dense_operand(side):
    d = RNG.standard_normal((6, 3)) if side != "dense @ sparse" else RNG.standard_normal((4, 5))
    g = RNG.standard_normal((5, 3) if side != "dense @ sparse" else (4, 6))
    grads = []
    for L in (flow, torch):
        v = L.tensor(VALUES, requires_grad=True)
        s = L.sparse_coo_tensor(EDGES, v, (5, 6))
        x = L.tensor(d, requires_grad=True)
        out = PRODUCTS[side](L, s, x)
        assert not out.is_sparse
        out.backward(L.tensor(g))
        grads.append((out, v.grad, x.grad))
    for a, b in zip(*grads):
        _same(a, b, rtol=1e-10, atol=1e-12)


def test_sums_additions_and_scalars():
    f, t = _both(_coo)
    _same(flow.sparse.sum(f), torch.sparse.sum(t))
    _same(f.sum(), t.sum())
    for dim in (0, 1, (0, 1)):
        a, b = flow.sparse.sum(f, dim), torch.sparse.sum(t, dim)
        if b.is_sparse:
            _same_sparse(a, b)
        else:
            _same(a, b)
    _same_sparse(f + f, t + t)
    _same_sparse(f * 2.5, t * 2.5)
    _same_sparse(2.5 * f, 2.5 * t)
    _same_sparse(-f, -t)
    eye_f, eye_t = flow.ones(5, 6, dtype=flow.float64), torch.ones(5, 6, dtype=torch.float64)
    _same(eye_f + f, eye_t + t)  # dense + sparse: dense
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        f + eye_f


def test_bad_input_and_unsupported_ops_raise_naming_them():
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        flow.sparse_coo_tensor(EDGES, flow.tensor(VALUES), (2, 6))
    # (torch checks this only with check_invariants=True: here always, never a wrong result)
    s = _coo(flow)
    with pytest.raises(NotImplementedError, match="exp: sparse COO tensors are not supported"):
        s.exp()
    with pytest.raises(NotImplementedError, match="relu: sparse COO"):
        flow.relu(s)
    with pytest.raises(TypeError, match="can't convert Sparse layout tensor to numpy"):
        s.numpy()
    with pytest.raises(NotImplementedError, match="requires_grad=True"):
        _coo(flow, requires_grad=True)
    with pytest.raises(NotImplementedError, match="hybrid"):
        flow.sparse_coo_tensor(EDGES, flow.ones(9, 2))
    with pytest.raises(NotImplementedError, match="torch.sparse.softmax"):
        flow.sparse.softmax(s, 0)
