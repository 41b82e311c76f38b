"""Sparse COO tensors, to the level graph networks use (GCN, GAT): `torch.sparse_coo_tensor`,
`Tensor.to_sparse()`, `to_dense()`, `coalesce()`, `indices()`, `values()`, `is_sparse`, the
product with a dense matrix (`torch.sparse.mm`, `torch.spmm`, `torch.mm`, `@`, both sides),
`torch.sparse.sum`, addition, scalar multiplication, `t()`, `to()`.

A `SparseTensor` is a Tensor with no dense memory: it holds `indices` (int64, (ndim, nnz))
and `values` ((nnz,)), two ordinary tensors, and a meta of type `SparseMeta` (its logical
shape and dtype).  Everything it does is an op on those parts, so autograd reaches the values
(and a dense operand) as for any op.  Any other op given a sparse tensor raises
NotImplementedError naming itself (OpDef.meta refuses a SparseMeta), as torch does for the ops
its sparse backend lacks.  Values are scalars per entry: hybrid tensors (dense dimensions in
the values) are not supported.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..._core import dtype as dt
from ..._core.meta import SparseMeta
from ...vm import Blob, Storage
from ..tensor import Tensor, sparse_coo
from ._base import call

_HINT = "call .to_dense() first"


class SparseTensor(Tensor):
    """A sparse COO tensor: `_indices` (int64, (ndim, nnz)) and `_values` ((nnz,)), entries
    at the same index adding up until `coalesce()`."""

    @staticmethod
    def _of(indices: Tensor, values: Tensor, size, coalesced: bool = False) -> SparseTensor:
        t = object.__new__(SparseTensor)
        Tensor._fresh(t, Blob(None), Storage(), SparseMeta(tuple(size), values.dtype),
                      values._device)
        t.__dict__.update(_sp_indices=indices, _sp_values=values, _sp_coalesced=coalesced)
        return t

    # -- what it is -----------------------------------------------------------------------
    is_sparse = property(lambda self: True, doc="True: a sparse COO tensor")
    layout = property(lambda self: sparse_coo, doc="sbpflow.sparse_coo")

    @property
    def requires_grad(self) -> bool:
        return self._sp_values.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool):
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True):
        raise NotImplementedError(
            "requires_grad_ on a sparse tensor is not supported in sbpflow: a sparse tensor "
            "has no gradient of its own; build it from values that require grad "
            "(sparse_coo_tensor(indices, values)) and read values.grad")

    @property
    def grad_fn(self):
        return self._sp_values.grad_fn

    def is_coalesced(self) -> bool:
        return self._sp_coalesced

    def _nnz(self) -> int:
        return self._sp_values.shape[0]

    def sparse_dim(self) -> int:
        return self.ndim

    def dense_dim(self) -> int:
        return 0

    def _indices(self) -> Tensor:
        return self._sp_indices

    def _values(self) -> Tensor:
        return self._sp_values

    def indices(self) -> Tensor:
        if not self._sp_coalesced:
            raise RuntimeError("Cannot get indices on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return self._sp_indices

    def values(self) -> Tensor:
        if not self._sp_coalesced:
            raise RuntimeError("Cannot get values on an uncoalesced tensor, please call "
                               ".coalesce() first")
        return self._sp_values

    # -- conversions ------------------------------------------------------------------------
    def coalesce(self) -> SparseTensor:
        """One entry per index, in row-major order, their values summed (differentiably)."""
        if self._sp_coalesced:
            return self
        idx = self._sp_indices.numpy()
        if idx.shape[1] == 0:
            return SparseTensor._of(self._sp_indices, self._sp_values, self.shape, True)
        flat = np.ravel_multi_index(tuple(idx), tuple(self.shape))
        unique, inverse = np.unique(flat, return_inverse=True)
        indices = _host_tensor(np.stack(np.unravel_index(unique, tuple(self.shape))),
                               self._sp_indices)
        inverse = _host_tensor(inverse.reshape(-1), self._sp_indices)
        v = self._sp_values
        summed = _zeros((len(unique),), v).index_add(0, inverse, v)
        return SparseTensor._of(indices, summed, self.shape, True)

    def to_dense(self, dtype=None, *, masked_grad=None) -> Tensor:
        v = self._sp_values if dtype is None else self._sp_values.to(dtype)
        zeros = _zeros(tuple(self.shape), v)
        if self._nnz() == 0:
            return zeros
        rows = tuple(self._sp_indices[k] for k in range(self.ndim))
        return zeros.index_put(rows, v, accumulate=True)

    def to_sparse(self, sparse_dim=None, *, layout=None, blocksize=None, dense_dim=None):
        return self

    def to(self, *args, **kwargs) -> SparseTensor:
        values = self._sp_values.to(*args, **kwargs)
        indices = self._sp_indices
        if values._device is not indices._device:
            indices = indices.to(values._device)
        return SparseTensor._of(indices, values, self.shape, self._sp_coalesced)

    def float(self):
        return self.to(dt.float32)

    def double(self):
        return self.to(dt.float64)

    def detach(self) -> SparseTensor:
        return SparseTensor._of(self._sp_indices, self._sp_values.detach(), self.shape,
                                self._sp_coalesced)

    def clone(self, *, memory_format=None) -> SparseTensor:
        return SparseTensor._of(self._sp_indices.clone(), self._sp_values.clone(), self.shape,
                                self._sp_coalesced)

    def t(self) -> SparseTensor:
        if self.ndim != 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 sparse and 0 dense dimensions, "
                               f"but self is {self.ndim} sparse and 0 dense dimensions")
        return self.transpose(0, 1)

    T = property(t)

    def transpose(self, dim0: int, dim1: int) -> SparseTensor:
        order = list(range(self.ndim))
        order[dim0], order[dim1] = order[dim1], order[dim0]
        shape = [self.shape[k] for k in order]
        return SparseTensor._of(self._sp_indices[order], self._sp_values, shape)

    def numpy(self, *, force: bool = False):
        raise TypeError("can't convert Sparse layout tensor to numpy. Use Tensor.to_dense() "
                        "first.")

    def _host(self):
        raise TypeError(f"a sparse tensor has no dense memory: {_HINT}")

    def tolist(self):
        return self.numpy()

    def __repr__(self):
        return (f"tensor(indices={self._sp_indices!r},\n       values={self._sp_values!r},\n"
                f"       size={tuple(self.shape)}, nnz={self._nnz()}, layout=sbpflow.sparse_coo)")

    __str__ = __repr__

    def __getitem__(self, key):
        raise NotImplementedError(f"indexing a sparse tensor is not supported in sbpflow: "
                                  f"{_HINT}")

    # -- arithmetic ----------------------------------------------------------------------------
    def __add__(self, other):
        if isinstance(other, SparseTensor):
            _same_shape("add", self, other)
            return SparseTensor._of(call("cat", [self._sp_indices, other._sp_indices], dim=1),
                                    call("cat", _promoted(self._sp_values, other._sp_values),
                                         dim=0), self.shape)
        raise RuntimeError("add(sparse, dense) is not supported. Use add(dense, sparse) "
                           "instead.")

    add = __add__

    def __radd__(self, other):
        if isinstance(other, Tensor):  # dense + sparse: dense, as torch
            return other + self.to_dense()
        return NotImplemented

    def __mul__(self, other):
        if isinstance(other, numbers.Number) or (isinstance(other, Tensor) and other.ndim == 0
                                                 and not isinstance(other, SparseTensor)):
            return SparseTensor._of(self._sp_indices, self._sp_values * other, self.shape,
                                    self._sp_coalesced)
        raise NotImplementedError("mul of a sparse tensor by anything but a scalar is not "
                                  f"supported in sbpflow: {_HINT}")

    __rmul__ = mul = __mul__

    def __truediv__(self, other):
        return self * (1 / other) if isinstance(other, numbers.Number) else \
            self.__mul__(other.reciprocal())

    div = __truediv__

    def __neg__(self):
        return self * -1

    def __matmul__(self, other):
        return sparse_mm(self, other)

    mm = matmul = __matmul__

    def __rmatmul__(self, other):
        if isinstance(other, Tensor):  # dense @ sparse = (sparse^T @ dense^T)^T
            return sparse_mm(self.t(), other.t()).t()
        return NotImplemented

    def sum(self, dim=None, keepdim=False, dtype=None):
        if keepdim:
            raise NotImplementedError("sum(keepdim=True) of a sparse tensor is not supported "
                                      f"in sbpflow: {_HINT}")
        return sparse_sum(self, dim, dtype=dtype)


def _same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape):
        raise RuntimeError(f"{op}: expected sizes to match, got {list(a.shape)} and "
                           f"{list(b.shape)}")


def _promoted(a: Tensor, b: Tensor):
    want = dt.promote_types(a.dtype, b.dtype)
    return [x if x.dtype is want else x.to(want) for x in (a, b)]


def _sparse(fn: str, name: str, x) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"{fn}(): argument '{name}' must be a sparse tensor, got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else 'a dense tensor'}")
    return x


def _host_tensor(a: np.ndarray, like: Tensor) -> Tensor:
    """An int64 tensor of host indices, where `like` is."""
    from .creation import tensor

    return tensor(np.ascontiguousarray(a, dtype=np.int64), device=like.device)


def _zeros(shape, like: Tensor) -> Tensor:
    from .creation import zeros

    return zeros(shape, dtype=like.dtype, device=like.device)


def _as_tensor(x, dtype=None, device=None) -> Tensor:
    from .creation import tensor

    if isinstance(x, Tensor):
        return x if dtype is None or x.dtype is dtype else x.to(dtype)
    return tensor(np.asarray(x), dtype=dtype, device=device)


# -- construction -------------------------------------------------------------------------------
def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None,
                      pin_memory=False, requires_grad=False, check_invariants=None,
                      is_coalesced=None) -> SparseTensor:
    """torch.sparse_coo_tensor: entries `values[k]` at `indices[:, k]` of a tensor of `size`
    (by default one past the largest index per dimension).  Indices are checked against the
    size (torch does so when it checks invariants; here always: a bad index is never a silent
    wrong result)."""
    if requires_grad:
        raise NotImplementedError(
            "sparse_coo_tensor(requires_grad=True) is not supported in sbpflow: pass values "
            "that require grad instead (their .grad receives the gradient)")
    if pin_memory:
        raise NotImplementedError("sparse_coo_tensor(pin_memory=True) is not supported in "
                                  "sbpflow (CPU memory is not pinned)")
    dtype = None if dtype is None else dt.as_dtype(dtype)
    idx = _as_tensor(indices, device=device)
    if idx.dtype.is_floating_point or idx.dtype is dt.bool_:
        raise RuntimeError(f"indices must be an int64 tensor, got {idx.dtype.name}")
    idx = idx if idx.dtype is dt.int64 else idx.to(dt.int64)
    vals = _as_tensor(values, dtype=dtype, device=device)
    if idx.ndim != 2:
        raise ValueError(f"sparse_coo_tensor(): indices must be sparse_dim x nnz, but got: "
                         f"{list(idx.shape)}")
    if vals.ndim != 1:
        raise NotImplementedError("sparse_coo_tensor(): values with dense dimensions (a hybrid "
                                  "sparse tensor) are not supported in sbpflow; values must be "
                                  f"1-D, got shape {list(vals.shape)}")
    if vals.shape[0] != idx.shape[1]:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({idx.shape[0]}) + "
                           f"dense_dim (0), but got {vals.shape[0]} values for "
                           f"{idx.shape[1]} indices")
    host = idx.numpy()
    if size is None:
        size = tuple(int(v) + 1 for v in host.max(axis=1)) if host.shape[1] else \
            (0,) * host.shape[0]
    size = tuple(int(s) for s in size)
    if len(size) != idx.shape[0]:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({idx.shape[0]}) + "
                           f"dense_dim (0), but got {len(size)}")
    if host.size:
        low, high = host.min(axis=1), host.max(axis=1)
        for d, n in enumerate(size):
            if low[d] < 0:
                raise RuntimeError(f"found negative index {int(low[d])} for dim {d}")
            if high[d] >= n:
                raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is "
                                   f"{n} but found index {int(high[d])}")
    if is_coalesced:
        raise NotImplementedError("sparse_coo_tensor(is_coalesced=True) is not supported in "
                                  "sbpflow: call .coalesce()")
    return SparseTensor._of(idx, vals, size, bool(host.shape[1] <= 1))


def to_sparse(self: Tensor, sparse_dim=None, *, layout=None, blocksize=None,
              dense_dim=None) -> SparseTensor:
    """Tensor.to_sparse(): the nonzero entries, coalesced; the values stay differentiable."""
    if sparse_dim not in (None, self.ndim) or dense_dim not in (None, 0):
        raise NotImplementedError("to_sparse(sparse_dim=, dense_dim=) with dense dimensions "
                                  "is not supported in sbpflow")
    if layout not in (None, sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"to_sparse(layout={layout}) is not supported in sbpflow: "
                                  "only the COO layout")
    if self.ndim == 0:
        raise RuntimeError("to_sparse(): a 0-dim tensor cannot be sparse")
    host = np.asarray(self.detach().numpy())
    where = np.nonzero(host)
    indices = _host_tensor(np.stack(where).reshape(self.ndim, -1), self)
    values = self[tuple(indices[k] for k in range(self.ndim))]
    return SparseTensor._of(indices, values, self.shape, True)


# -- products and sums ----------------------------------------------------------------------------
def sparse_mm(sparse, dense) -> Tensor:
    """torch.sparse.mm(sparse, dense): a dense (m, n) result; gradients for the sparse
    tensor's values and for the dense operand."""
    s = _sparse("mm", "sparse", sparse)
    if isinstance(dense, SparseTensor):
        raise NotImplementedError("the product of two sparse tensors is not supported in "
                                  f"sbpflow: {_HINT}")
    if not isinstance(dense, Tensor):
        raise TypeError(f"mm(): argument 'mat2' must be Tensor, not {type(dense).__name__}")
    if s.ndim != 2:
        raise RuntimeError(f"mm(): the sparse operand must be a matrix, got {s.ndim} dims")
    values, dense = _promoted(s._sp_values, dense) if s.dtype is not dense.dtype else \
        (s._sp_values, dense)
    return call("sparse_coo_mm", s._sp_indices, values, dense, size=tuple(s.shape))


def spmm(input, mat2) -> Tensor:
    """torch.spmm: sparse @ dense."""
    return sparse_mm(input, mat2)


def sparse_sum(input, dim=None, dtype=None):
    """torch.sparse.sum: over every dimension a dense 0-d tensor; over some, a sparse tensor
    of the others (coalesced)."""
    s = _sparse("sum", "input", input)
    values = s._sp_values if dtype is None else s._sp_values.to(dtype)
    if dim is None:
        return values.sum()
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = {d % s.ndim for d in dims}
    keep = [d for d in range(s.ndim) if d not in dims]
    if not keep:
        return values.sum()
    kept = SparseTensor._of(s._sp_indices[keep], values, [s.shape[d] for d in keep])
    return kept.coalesce()


def _dense_to_dense(self: Tensor, dtype=None, *, masked_grad=None) -> Tensor:
    """Tensor.to_dense() of a dense tensor: itself (as torch)."""
    return self if dtype is None else self.to(dtype)


METHODS = {"to_sparse": to_sparse, "to_dense": _dense_to_dense}

__all__ = ["sparse_coo_tensor", "spmm"]
