"""Ops of sparse COO matrices, on their parts: the product with a dense matrix and its
gradient for the values.

A sparse COO matrix of `size` (m, k) is two dense tensors: `indices` (int64, (2, nnz)) and
`values` ((nnz,)); entries with the same index add up (an uncoalesced tensor is fine here).
The framework's SparseTensor (framework/sparse.py) holds them and calls these ops, so
autograd reaches the values and the dense operand as for any op.

- `sparse_coo_mm(indices, values, dense, size, transpose)`: S @ dense, or S^T @ dense with
  `transpose` (so the gradient for the dense operand is the same op on the other side);
  a CSR product through the `coo_matmul` primitive.
- `sparse_coo_mm_values_grad(indices, grad, dense, transpose)`: d values[k] =
  grad[r] . dense[c] for entry k at (r, c) (swapped under `transpose`).
"""

from __future__ import annotations

import numpy as np

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from .registry import Attr, OpDef, Sample, op, register


def _check_parts(name, indices, values, dense, rows_of_dense):
    if indices.dtype is not dt.int64 or indices.ndim != 2 or indices.shape[0] != 2:
        raise op_error(name, f"indices must be an int64 tensor of shape (2, nnz), got "
                       f"{indices.dtype.name} of shape {list(indices.shape)}")
    if values.ndim != 1 or values.shape[0] != indices.shape[1]:
        raise op_error(name, f"values must have shape ({indices.shape[1]},) (one per index), "
                       f"got {list(values.shape)}")
    if dense.ndim != 2:
        raise op_error(name, f"the dense operand must be a matrix, got a {dense.ndim}-D tensor")
    if dense.shape[0] != rows_of_dense:
        raise op_error(name, f"mat1 and mat2 shapes cannot be multiplied (sparse matrix with "
                       f"{rows_of_dense} columns and {list(dense.shape)})")
    if values.dtype is not dense.dtype:
        raise op_error(name, f"expected the sparse values and the dense operand to have the "
                       f"same dtype, got {values.dtype.name} and {dense.dtype.name}")


def _mm_meta(indices, values, dense, size, transpose=False):
    if len(size) != 2:
        raise op_error("sparse_coo_mm", f"size must be (rows, columns), got {size}")
    m, k = size if not transpose else size[::-1]
    _check_parts("sparse_coo_mm", indices, values, dense, k)
    return TensorMeta((m, dense.shape[1]), dense.dtype)


def _rows_cols(ctx, indices, transpose):
    rows, cols = ctx.prims.slice(indices, (0,)), ctx.prims.slice(indices, (1,))
    return (cols, rows) if transpose else (rows, cols)


def _mm_kernel(ctx, indices, values, dense, size, transpose=False):
    rows, cols = _rows_cols(ctx, indices, transpose)
    return ctx.prims.coo_matmul(rows, cols, values, ctx.out_metas[0].shape[0], dense)


def _mm_grad(ctx, g):
    transpose = ctx.attrs["transpose"]
    gv = gd = None
    if ctx.needs_input_grad[1]:
        gv = op("sparse_coo_mm_values_grad", ctx.input(0), g, ctx.input(2),
                transpose=transpose)
    if ctx.needs_input_grad[2]:
        gd = op("sparse_coo_mm", ctx.input(0), ctx.input(1), g, size=ctx.attrs["size"],
                transpose=not transpose)
    return None, gv, gd


def _mm_reference(torch, indices, values, dense, size, transpose=False):
    s = torch.sparse_coo_tensor(indices, values, size)
    return torch.sparse.mm(s.t() if transpose else s, dense)


def _coo_sample(rng, m, k, nnz, dtype=np.float64):
    """(indices, values) of an m x k matrix with nnz entries, some at the same place."""
    idx = np.stack([rng.integers(0, m, nnz), rng.integers(0, k, nnz)]).astype(np.int64)
    if nnz > 2:
        idx[:, -1] = idx[:, 0]  # a duplicate: entries add up
    return idx, rng.standard_normal(nnz).astype(dtype)


def _mm_samples(rng):
    out = []
    for m, k, n, nnz, transpose in ((4, 4, 3, 7, False), (5, 3, 2, 6, False),
                                    (3, 5, 2, 6, True), (4, 4, 2, 0, False)):
        idx, v = _coo_sample(rng, m, k, nnz)
        dense = rng.standard_normal((m if transpose else k, n))
        out.append(Sample(idx, v, dense, size=(m, k), transpose=transpose))
    idx, v = _coo_sample(rng, 4, 4, 5, np.float32)
    out.append(Sample(idx, v, rng.standard_normal((4, 3)).astype(np.float32), size=(4, 4)))
    return out


register(OpDef(
    "sparse_coo_mm",
    inputs=("indices", "values", "dense"),
    attrs={"size": Attr("ints"), "transpose": Attr("bool", False)},
    infer_meta=_mm_meta,
    kernel=_mm_kernel,
    saves=("indices", "values for dense", "dense for values"),
    grad=_mm_grad,
    reference=_mm_reference,
    samples=_mm_samples,
))


def _values_grad_meta(indices, g, dense, transpose=False):
    if g.ndim != 2 or dense.ndim != 2 or g.shape[1] != dense.shape[1]:
        raise op_error("sparse_coo_mm_values_grad", f"grad {list(g.shape)} and dense "
                       f"{list(dense.shape)} must be matrices with as many columns")
    return TensorMeta((indices.shape[1],), dense.dtype)


def _values_grad_kernel(ctx, indices, g, dense, transpose=False):
    rows, cols = _rows_cols(ctx, indices, transpose)
    p = ctx.prims
    picked_g = p.index(g, (rows,))
    picked_d = p.index(dense, (cols,))
    return p.reduce("sum", p.binary("mul", picked_g, picked_d), (1,), False)


def _values_grad_samples(rng):
    out = []
    for m, k, n, nnz, transpose in ((4, 4, 3, 7, False), (3, 5, 2, 6, True)):
        idx, _ = _coo_sample(rng, m, k, nnz)
        g = rng.standard_normal((k if transpose else m, n))
        dense = rng.standard_normal((m if transpose else k, n))
        out.append(Sample(idx, g, dense, transpose=transpose, grad=False))
    return out


def _values_grad_reference(torch, indices, g, dense, transpose=False):
    rows, cols = (indices[1], indices[0]) if transpose else (indices[0], indices[1])
    return (g[rows] * dense[cols]).sum(-1)


register(OpDef(
    "sparse_coo_mm_values_grad",
    inputs=("indices", "grad", "dense"),
    attrs={"transpose": Attr("bool", False)},
    infer_meta=_values_grad_meta,
    kernel=_values_grad_kernel,
    reference=_values_grad_reference,
    samples=_values_grad_samples,
))
