"""torch.linalg for sbpflow: decompositions, solves, determinants, norms, pinv, rank, cross."""

from .framework.functional.linalg import LINALG as _LINALG

LinAlgError = _LINALG["LinAlgError"]
inv = _LINALG["inv"]
inv_ex = _LINALG["inv_ex"]
det = _LINALG["det"]
slogdet = _LINALG["slogdet"]
solve = _LINALG["solve"]
cholesky = _LINALG["cholesky"]
eigh = _LINALG["eigh"]
eigvalsh = _LINALG["eigvalsh"]
svd = _LINALG["svd"]
svdvals = _LINALG["svdvals"]
qr = _LINALG["qr"]
norm = _LINALG["norm"]
matrix_norm = _LINALG["matrix_norm"]
vector_norm = _LINALG["vector_norm"]
pinv = _LINALG["pinv"]
matrix_rank = _LINALG["matrix_rank"]
cross = _LINALG["cross"]

__all__ = ["LinAlgError", "cholesky", "cross", "det", "eigh", "eigvalsh", "inv", "inv_ex",
           "matrix_norm", "matrix_rank", "norm", "pinv", "qr", "slogdet", "solve", "svd",
           "svdvals", "vector_norm"]
