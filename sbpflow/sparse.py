"""torch.sparse: the product of a sparse COO matrix with a dense one, and sums of sparse
tensors (see framework/functional/sparse.py for what sparse tensors support).  The rest of
torch.sparse's public functions raise NotImplementedError naming themselves."""

from __future__ import annotations

from .framework.functional.sparse import SparseTensor, sparse_mm, sparse_sum

__all__ = ["mm", "sum", "spmm", "SparseTensor"]


def mm(mat1, mat2, reduce: str = "sum"):
    """sparse @ dense, a dense result; gradients for the values and the dense operand."""
    if reduce != "sum":
        raise NotImplementedError(f"torch.sparse.mm(reduce={reduce!r}) is not supported in "
                                  "sbpflow: only 'sum'")
    return sparse_mm(mat1, mat2)


def sum(input, dim=None, dtype=None):  # noqa: A001 - torch's name
    """Over every dimension a dense 0-d tensor; over some, a sparse tensor of the others."""
    return sparse_sum(input, dim, dtype)


spmm = mm

_ABSENT = ("addmm", "sampled_addmm", "softmax", "log_softmax", "spsolve", "as_sparse_gradcheck",
           "check_sparse_tensor_invariants", "to_sparse_semi_structured")


def __getattr__(name):
    if name in _ABSENT:
        raise NotImplementedError(f"torch.sparse.{name} is not supported in sbpflow (sparse "
                                  "COO tensors support sparse.mm, sparse.sum, to_dense, "
                                  "coalesce, addition and scalar multiplication)")
    raise AttributeError(f"module 'sbpflow.sparse' has no attribute {name!r}")
