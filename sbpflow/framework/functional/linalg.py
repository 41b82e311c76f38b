"""Matrix products (matmul, mm, bmm, mv, dot, outer, einsum, tensordot, addmm, baddbmm) and
torch.linalg: decompositions, solves, determinants, norms, pinv, matrix_rank, cross.

The torch.linalg functions are named `linalg_<name>` here and exported as
`sbpflow.linalg.<name>`; torch's top-level forms (inverse, det, logdet, slogdet, cholesky,
svd with `some`, qr with `some`, pinverse) are in `__all__`.
"""

from __future__ import annotations

import collections
import math
import warnings

import numpy as np

from ...ops.linalg import LinAlgError
from ..tensor import Tensor
from ._base import call, inplace_method
from .sparse import SparseTensor, sparse_mm


def matmul(input, other):
    if type(input) is SparseTensor:
        return sparse_mm(input, other)
    if type(other) is SparseTensor:
        return other.__rmatmul__(input)
    return call("matmul", input, other)


def mm(input, mat2):
    if type(input) is SparseTensor:
        return sparse_mm(input, mat2)
    if type(mat2) is SparseTensor:
        return mat2.__rmatmul__(input)
    return call("mm", input, mat2)


def bmm(input, mat2):
    return call("bmm", input, mat2)


def mv(input, vec):
    if input.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"mv(): vector + matrix @ vector expected, got 1, {input.ndim}, "
                           f"{vec.ndim}")
    return call("matmul", input, vec)


def dot(input, tensor):
    return call("dot", input, tensor)


def outer(input, vec2):
    return call("outer", input, vec2)


ger = outer


def _sublist_subscripts(sublist) -> str:
    """torch's sublist form: ints 0-51 name axes (0-25: A-Z, 26-51: a-z), Ellipsis is '...'."""
    out = []
    for s in sublist:
        if s is Ellipsis:
            out.append("...")
        elif isinstance(s, int) and 0 <= s < 52:
            out.append(chr(ord("A") + s) if s < 26 else chr(ord("a") + s - 26))
        else:
            raise ValueError(f"einsum(): expected subscript to be within the range [0, 52), "
                             f"but got {s!r}")
    return "".join(out)


def einsum(*args):
    """einsum(equation, *operands), einsum(equation, [operands]) or the sublist form
    einsum(op0, sublist0, op1, sublist1, ..., [out_sublist])."""
    if not args or (isinstance(args[0], str) and len(args) < 2):
        raise ValueError("einsum(): must specify the equation string and at least one operand, "
                         "or at least one operand and its subscripts list")
    if isinstance(args[0], str):
        equation, operands = args[0], args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
    else:
        pairs = args[: len(args) // 2 * 2]
        operands = pairs[0::2]
        equation = ",".join(_sublist_subscripts(s) for s in pairs[1::2])
        if len(args) % 2:
            equation += "->" + _sublist_subscripts(args[-1])
    return call("einsum", tuple(operands), equation=equation)


def tensordot(a, b, dims=2, out=None):
    """Contract the last `dims` axes of a with the first of b, or the axes listed in
    dims=([a axes], [b axes]); an einsum over letters."""
    if out is not None:
        raise NotImplementedError("tensordot(): out= is not supported")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot(): tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot(): tensordot expects dims < ndim_a or ndim_b, but got "
                               f"dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("tensordot(): both dimension lists should have same length")
    dims_a = [d % a.ndim if a.ndim else d for d in dims_a]
    dims_b = [d % b.ndim if b.ndim else d for d in dims_b]
    if a.ndim + b.ndim - len(dims_a) > 52:
        raise RuntimeError("tensordot(): too many dimensions")
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    sa = [next(letters) for _ in range(a.ndim)]
    sb = [next(letters) for _ in range(b.ndim)]
    for da, db in zip(dims_a, dims_b, strict=True):
        if a.shape[da] != b.shape[db]:
            raise RuntimeError(f"tensordot(): contracted dimensions need to match, but first has "
                               f"size {a.shape[da]} in dim {da} and second has size "
                               f"{b.shape[db]} in dim {db}")
        sb[db] = sa[da]
    out_s = [s for i, s in enumerate(sa) if i not in dims_a] + [
        s for i, s in enumerate(sb) if i not in dims_b]
    return einsum("".join(sa) + "," + "".join(sb) + "->" + "".join(out_s), a, b)


def _scaled_sum(name, input, product, beta, alpha):
    """beta * input + alpha * product; with beta == 0 input is ignored (nan and inf too), as
    in torch, but must still broadcast to the product."""
    from ..._core.errors import broadcast_shapes
    from .elementwise import add, mul

    shape = broadcast_shapes(name, tuple(input.shape), tuple(product.shape))
    if shape != tuple(product.shape):
        raise RuntimeError(f"{name}(): the input of shape {list(input.shape)} does not "
                           f"broadcast to the product's shape {list(product.shape)}")
    if alpha != 1:
        product = mul(product, alpha)
    if beta == 0:
        return product
    return add(mul(input, beta) if beta != 1 else input, product)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum("addmm", input, mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def addmv(input, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum("addmv", input, mv(mat, vec), beta, alpha)


def addbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * (the sum over the batch of batch1[i] @ batch2[i])."""
    return _scaled_sum("addbmm", input, bmm(batch1, batch2).sum(0), beta, alpha)


def addr(input, vec1, vec2, *, beta=1, alpha=1):
    """beta * input + alpha * outer(vec1, vec2)."""
    for name, v in (("vec1", vec1), ("vec2", vec2)):
        if v.ndim != 1:
            raise RuntimeError(f"addr: Expected 1-D argument {name}, but got {v.ndim}-D")
    return _scaled_sum("addr", input, outer(vec1, vec2), beta, alpha)


def inner(input, other, *, out=None):
    """The sum over the last axes of both (a product where one is 0-d)."""
    _no_out("inner", out)
    if input.ndim == 0 or other.ndim == 0:
        return input * other
    if input.shape[-1] != other.shape[-1]:
        raise RuntimeError("inner() the last dimension must match on both input tensors but "
                           f"got shapes {list(input.shape)} and {list(other.shape)}")
    return tensordot(input, other, ([-1], [-1]))


def vdot(input, other, *, out=None):
    """The dot product of two 1-D tensors (no conjugation: sbpflow has no complex dtypes)."""
    _no_out("vdot", out)
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {input.ndim}D and {other.ndim}D "
                           "tensors")
    if input.dtype is not other.dtype:
        from .reduce import _tname

        raise RuntimeError("dot : expected both vectors to have same dtype, but found "
                           f"{_tname(input)} and {_tname(other)}")
    return dot(input, other)


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """The p-norm distance between each row of x1 and each row of x2, batched over leading
    axes: (..., P, M) and (..., R, M) give (..., P, R)."""
    from .reduce import _tname, vector_norm

    for name, x in (("X1", x1), ("X2", x2)):
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: "
                               f"{_tname(x)}")
        if x.ndim < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: "
                               f"{x.ndim}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError("X1 and X2 must have the same number of columns. X1: "
                           f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    if compute_mode not in ("use_mm_for_euclid_dist_if_necessary",
                            "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"):
        raise ValueError(f"{compute_mode} is not a valid value for compute_mode")
    rows, cols = x1.shape[-2], x2.shape[-2]
    if p == 2 and (compute_mode == "use_mm_for_euclid_dist" or (
            compute_mode == "use_mm_for_euclid_dist_if_necessary" and (rows > 25 or cols > 25))):
        return _euclidean_dist(x1, x2)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., P, R, M)
    return vector_norm(diff, p, -1)


def _euclidean_dist(x1, x2):
    """torch's matrix-product form of the 2-norm distances: |a|**2 + |b|**2 - 2 a.b as one
    matmul of padded rows, clamped at 0; the gradient is 0 where a distance is 0."""
    from .shape import cat

    n1 = (x1 * x1).sum(-1, keepdim=True)
    n2 = (x2 * x2).sum(-1, keepdim=True)
    a = cat([x1 * -2, n1, n1 * 0 + 1], -1)
    b = cat([x2, n2 * 0 + 1, n2], -1)
    squared = matmul(a, b.transpose(-1, -2)).clamp(min=0)
    zero = squared == 0
    return squared.masked_fill(zero, 1).sqrt().masked_fill(zero, 0)


# -- torch.linalg ---------------------------------------------------------------------------
def _return_type(name, fields):
    cls = collections.namedtuple(name, fields)
    cls.__module__ = "sbpflow.return_types"
    return cls


_slogdet_result = _return_type("linalg_slogdet", ["sign", "logabsdet"])
_eigh_result = _return_type("linalg_eigh", ["eigenvalues", "eigenvectors"])
_svd_result = _return_type("linalg_svd", ["U", "S", "Vh"])
_qr_result = _return_type("linalg_qr", ["Q", "R"])
_old_svd_result = _return_type("svd", ["U", "S", "V"])
_old_qr_result = _return_type("qr", ["Q", "R"])
_old_slogdet_result = _return_type("slogdet", ["sign", "logabsdet"])


def _beside(t):
    """Where a helper tensor next to t goes: t's device, or t's placement (broadcast)."""
    if t._gl is None:
        return t.device
    from ..global_tensor import GlobalDevice

    return GlobalDevice(t._gl.placement)


def _no_out(name, out):
    if out is not None:
        raise NotImplementedError(f"{name}(): out= is not supported")


def linalg_inv(A, *, out=None):
    _no_out("linalg.inv", out)
    return call("linalg_inv", A)


def linalg_det(A, *, out=None):
    _no_out("linalg.det", out)
    return call("linalg_det", A)


def linalg_slogdet(A, *, out=None):
    _no_out("linalg.slogdet", out)
    return _slogdet_result(*call("linalg_slogdet", A))


def linalg_solve(A, B, *, left=True, out=None):
    """X with A X = B (left=True) or X A = B (left=False: A^T X^T = B^T)."""
    _no_out("linalg.solve", out)
    if left:
        return call("linalg_solve", A, B)
    if B.ndim < 2:
        raise RuntimeError("linalg.solve: Vector broadcasting of the left hand side is not "
                           "supported for left=False. In this case linalg.solve is equivalent "
                           "to B / A.squeeze(-1)")
    return call("linalg_solve", A.mT, B.mT).mT


def linalg_cholesky(A, *, upper=False, out=None):
    _no_out("linalg.cholesky", out)
    return call("linalg_cholesky", A, upper=upper)


def linalg_eigh(A, UPLO="L", *, out=None):
    _no_out("linalg.eigh", out)
    return _eigh_result(*call("linalg_eigh", A, UPLO=UPLO))


def linalg_eigvalsh(A, UPLO="L", *, out=None):
    _no_out("linalg.eigvalsh", out)
    return call("linalg_eigh", A, UPLO=UPLO)[0]


def linalg_svd(A, full_matrices=True, *, driver=None, out=None):
    _no_out("linalg.svd", out)
    if driver is not None:
        raise RuntimeError("torch.linalg.svd: keyword argument `driver=` is only supported on "
                           "CUDA inputs with cuSOLVER backend.")
    return _svd_result(*call("linalg_svd", A, full_matrices=full_matrices))


def linalg_svdvals(A, *, driver=None, out=None):
    """The singular values, descending; their gradient is U diag(g) V^T (through svd)."""
    _no_out("linalg.svdvals", out)
    if driver is not None:
        raise RuntimeError("torch.linalg.svdvals: keyword argument `driver=` is only supported "
                           "on CUDA inputs with cuSOLVER backend.")
    return call("linalg_svd", A, full_matrices=False)[1]


def linalg_qr(A, mode="reduced", *, out=None):
    _no_out("linalg.qr", out)
    return _qr_result(*call("linalg_qr", A, mode=mode))


_inv_ex_result = _return_type("linalg_inv_ex", ["inverse", "info"])
_cholesky_ex_result = _return_type("linalg_cholesky_ex", ["L", "info"])


def linalg_inv_ex(A, *, check_errors=False, out=None):
    """(inverse, info): info (int32) is 0 per invertible matrix, else the first zero pivot;
    the inverse of a singular matrix is NaN."""
    _no_out("linalg.inv_ex", out)
    return _inv_ex_result(*call("linalg_inv_ex", A, check_errors=check_errors))


def linalg_cholesky_ex(A, *, upper=False, check_errors=False, out=None):
    """(L, info): info (int32) is 0 per positive-definite matrix, else the order of the first
    leading minor that is not positive-definite."""
    _no_out("linalg.cholesky_ex", out)
    return _cholesky_ex_result(*call("linalg_cholesky_ex", A, upper=upper,
                                     check_errors=check_errors))


# -- norms ----------------------------------------------------------------------------------
def _float_input(name, A, dtype):
    if dtype is not None:
        A = A.to(dtype)
    if not A.dtype.is_floating_point:
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got "
                           f"{_C_TYPE.get(A.dtype.name, A.dtype.name)}")
    return A


_C_TYPE = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
           "int64": "Long"}


def _ord_text(ord):
    return str(ord) if not isinstance(ord, float) or not ord.is_integer() else str(int(ord))


def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    from .reduce import vector_norm

    _no_out("linalg.vector_norm", out)
    return vector_norm(x, ord, dim, keepdim, dtype=dtype)


def linalg_matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    """Frobenius, nuclear, spectral (2, -2: largest/smallest singular value), max/min column
    sum (1, -1) and max/min row sum (inf, -inf) norms over the two axes `dim`."""
    name = "linalg.matrix_norm"
    _no_out(name, out)
    if A.ndim < 2:
        raise RuntimeError(f"{name}: The input tensor A must have at least 2 dimensions.")
    A = _float_input(name, A, dtype)
    dim = tuple(dim)
    if len(dim) != 2:
        raise RuntimeError(f"{name}: dim must be a 2-tuple. Got {', '.join(map(str, dim))}")
    d0, d1 = (d % A.ndim if -A.ndim <= d < A.ndim else d for d in dim)
    if not (0 <= d0 < A.ndim and 0 <= d1 < A.ndim):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-A.ndim}, "
                         f"{A.ndim - 1}], but got {dim[0] if not 0 <= d0 < A.ndim else dim[1]})")
    if d0 == d1:
        raise RuntimeError(f"{name}: dims must be different. Got ({dim[0]}, {dim[1]})")
    if ord == "fro":
        return linalg_vector_norm(A, 2, (d0, d1), keepdim)
    if ord in ("nuc", 2, -2):
        # Singular values of the matrices over (d0, d1), moved to the last two axes.
        s = linalg_svdvals(A.movedim((d0, d1), (-2, -1)))
        r = s.sum(-1) if ord == "nuc" else (s.amax(-1) if ord == 2 else s.amin(-1))
        if keepdim:
            for d in sorted((d0, d1)):
                r = r.unsqueeze(d)
        return r
    if ord in (1, -1, math.inf, -math.inf):
        # 1: the largest column sum (sum over rows d0, max over columns d1); inf: rows.
        over, pick = (d0, d1) if ord in (1, -1) else (d1, d0)
        sums = A.abs().sum(over, keepdim=True)
        r = sums.amax(pick, keepdim=True) if ord > 0 else sums.amin(pick, keepdim=True)
        return r if keepdim else r.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    raise RuntimeError(f"{name}: Order {_ord_text(ord)} not supported.")


def linalg_norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):
    """A vector norm over one axis (or all, flattened, without ord), a matrix norm over two."""
    name = "linalg.norm"
    _no_out(name, out)
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 1:
            if isinstance(ord, str):
                raise RuntimeError(f"linalg.vector_norm: Order {ord} not supported.")
            return linalg_vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
        if len(dims) == 2:
            return linalg_matrix_norm(A, "fro" if ord is None else ord, dims, keepdim,
                                      dtype=dtype)
        raise RuntimeError(f"{name}: If dim is specified, it must be of length 1 or 2. Got "
                           f"[{', '.join(map(str, dims))}]")
    if ord is None:
        return linalg_vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return linalg_matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    if A.ndim == 1:
        if isinstance(ord, str):
            raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 "
                               "dimensions.")
        return linalg_vector_norm(A, ord, None, keepdim, dtype=dtype)
    raise RuntimeError(f"{name}: If dim is not specified but ord is, the input must be 1D or "
                       f"2D. Got {A.ndim}D.")


# -- pinv, matrix_rank, cross ---------------------------------------------------------------
def _tolerance(name, A, s, atol, rtol):
    """max(atol, rtol * largest singular value), torch's defaults: rtol = eps * max(m, n)
    when neither is given, 0 when only atol is."""
    from .elementwise import maximum, mul

    eps = float(np.finfo(A.dtype.np).eps)
    if rtol is None:
        rtol = eps * max(A.shape[-2:]) if atol is None or _is_zero(atol) else 0.0
    smax = s.amax(-1, keepdim=True) if s.shape[-1] else s.sum(-1, keepdim=True)
    tol = mul(smax, rtol)
    if isinstance(atol, Tensor):
        tol = maximum(tol, atol.unsqueeze(-1) if atol.ndim else atol)
    elif atol is not None:
        tol = tol.clamp(min=float(atol))
    return tol


def _is_zero(x):
    return not isinstance(x, Tensor) and x == 0


def linalg_pinv(A, *, atol=None, rtol=None, hermitian=False, out=None):
    """The Moore-Penrose pseudo-inverse V diag(1/s) U^T, singular values at or below the
    tolerance treated as zero."""
    from .elementwise import where

    _no_out("linalg.pinv", out)
    if A.ndim < 2 or not A.dtype.is_floating_point:
        raise RuntimeError(f"linalg.pinv({_C_TYPE.get(A.dtype.name, 'Float')}{{{list(A.shape)}}}"
                           "): expected a tensor with 2 or more dimensions of float, double, "
                           "cfloat or cdouble types")
    u, s, vh = linalg_svd(A, full_matrices=False)
    keep = s > _tolerance("linalg.pinv", A, s, atol, rtol)
    # 1/s where kept, 0 elsewhere; the division never sees a zero (no inf * 0 in backward).
    s_inv = where(keep, 1.0 / where(keep, s, s * 0 + 1), s * 0)
    return vh.mT @ (s_inv.unsqueeze(-1) * u.mT)


def linalg_matrix_rank(A, tol=None, hermitian=False, *, atol=None, rtol=None, out=None):
    _no_out("linalg.matrix_rank", out)
    if tol is not None:
        atol, rtol = tol, 0.0
    s = linalg_svdvals(A)
    return (s > _tolerance("linalg.matrix_rank", A, s, atol, rtol)).sum(-1)


def linalg_cross(input, other, *, dim=-1, out=None):
    """The cross product of 3-vectors along `dim` (broadcasting the other axes)."""
    from .shape import stack

    _no_out("linalg.cross", out)
    if input.ndim != other.ndim:
        raise RuntimeError(f"linalg.cross: inputs must have the same number of dimensions. Got "
                           f"{input.ndim} and {other.ndim}")
    if input.shape[dim] != 3 or other.shape[dim] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got "
                           f"{input.shape[dim]} and {other.shape[dim]}")
    a = [input.select(dim, i) for i in range(3)]
    b = [other.select(dim, i) for i in range(3)]
    parts = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    return stack(parts, dim)


# -- compositions: solve_triangular, lstsq, matrix_power, multi_dot, cond, ... ------------
def linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    """X with tri(A) X = B (or X tri(A) = B): only A's upper or lower triangle is read (and
    receives gradient); unitriangular takes its diagonal as ones.  B is always a matrix; a
    zero on the diagonal gives inf/nan (no error), as torch."""
    _no_out("linalg.solve_triangular", out)
    if A.dtype is not B.dtype and A.dtype.is_floating_point and B.dtype.is_floating_point:
        wide = A.dtype if A.dtype.itemsize >= B.dtype.itemsize else B.dtype
        A, B = A.to(wide), B.to(wide)
    if not left:  # X tri = B  <=>  tri^T X^T = B^T, the other triangle of A^T
        return call("linalg_solve_triangular", A.mT, B.mT, upper=not upper,
                    unitriangular=unitriangular).mT
    return call("linalg_solve_triangular", A, B, upper=upper, unitriangular=unitriangular)


def _solve_matrix(A, B):
    """linalg_solve with B read as a matrix even where torch's vector rule would apply."""
    while B.ndim < A.ndim:
        B = B.unsqueeze(0)
    return call("linalg_solve", A, B)


_lstsq_result = _return_type("linalg_lstsq", ["solution", "residuals", "rank",
                                              "singular_values"])
_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def linalg_lstsq(A, B, rcond=None, *, driver=None):
    """The minimum-norm least-squares solution of A X = B through the SVD (singular values
    at or below rcond * the largest count as zero).  The other fields follow the driver as in
    torch: residuals for gels/gelsd/gelss when m > n and A has full rank, rank except for
    gels, singular values for gelsd/gelss; empty otherwise."""
    from .creation import zeros
    from .elementwise import where

    if driver is None:
        driver = "gelsy"
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, "
                           f"gelsy, gelsd, gelss), but got {driver}")
    if A.ndim < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    m, n = A.shape[-2:]
    if not 0 <= A.ndim - B.ndim <= 1:
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to "
                           "other.dim() and (input.dim() - other.dim()) <= 1")
    vector = B.ndim == A.ndim - 1
    b = B.unsqueeze(-1) if vector else B
    if b.shape[-2] != m:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size("
                           f"{-1 if vector else -2})")
    u, s, vh = linalg_svd(A, full_matrices=False)
    if rcond is None:
        rcond = float(np.finfo(A.dtype.np).eps) * max(m, n)
    smax = s.amax(-1, keepdim=True) if s.shape[-1] else s.sum(-1, keepdim=True)
    keep = s > smax * rcond
    s_inv = where(keep, 1.0 / where(keep, s, s * 0 + 1), s * 0)
    x = vh.mT @ (s_inv.unsqueeze(-1) * (u.mT @ b))
    rank = keep.sum(-1)
    empty = zeros(0, dtype=A.dtype, device=_beside(A))
    residuals = empty
    if driver != "gelsy" and m > n and bool((rank == n).all()):
        residuals = ((A @ x - b) ** 2).sum(-2)  # (*, k); (*, 1) for a vector B, as torch
    if driver == "gels":
        rank = zeros(0, dtype=rank.dtype, device=_beside(A))
    return _lstsq_result(x.squeeze(-1) if vector else x, residuals, rank,
                         s if driver in ("gelsd", "gelss") else empty)


def linalg_matrix_power(A, n, *, out=None):
    """A^n by repeated squaring; n < 0 inverts first; n == 0 gives the identity."""
    from .creation import eye

    _no_out("linalg.matrix_power", out)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        if A.ndim < 2:
            raise RuntimeError("linalg.matrix_power: The input tensor A must have at least 2 "
                               "dimensions.")
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, but "
                           f"they are {A.shape[-2]} by {A.shape[-1]} matrices")
    if n == 0:
        return eye(A.shape[-1], dtype=A.dtype, device=_beside(A)).expand(*A.shape).clone()
    if n < 0:
        A, n = linalg_inv(A), -n
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if n:
            base = base @ base
    return result


def linalg_multi_dot(tensors, *, out=None):
    """The chained product; a 1-D first (last) operand is a row (column) vector."""
    _no_out("linalg.multi_dot", out)
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    for i, t in enumerate(tensors):
        where = "first" if i == 0 else "last" if i == len(tensors) - 1 else None
        ok = t.ndim in (1, 2) if where else t.ndim == 2
        if not ok:
            what = (f"the {where} tensor must be 1D or 2D" if where else
                    f"tensor {i} must be 2D")
            raise RuntimeError(f"multi_dot(): {what} but got {t.ndim}D")
    result = tensors[0]
    for t in tensors[1:]:
        result = result @ t
    return result


def linalg_vecdot(x, y, *, dim=-1, out=None):
    _no_out("linalg.vecdot", out)
    return (x * y).sum(dim)


def linalg_diagonal(A, *, offset=0, dim1=-2, dim2=-1):
    return A.diagonal(offset, dim1, dim2)


def linalg_cond(A, p=None):
    """The condition number: s_max / s_min for p None/2 (any shape), the inverse for -2;
    norm(A, p) * norm(A^-1, p) otherwise (square matrices)."""
    if A.ndim < 2:
        raise RuntimeError("linalg.cond: The input tensor A must have at least 2 dimensions.")
    if p is None or p in (2, -2):
        s = linalg_svdvals(A)
        return s.amax(-1) / s.amin(-1) if p != -2 else s.amin(-1) / s.amax(-1)
    if A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.cond(ord={p}): A must be batches of square matrices, but "
                           f"they are {A.shape[-2]} by {A.shape[-1]} matrices")
    return linalg_matrix_norm(A, p) * linalg_matrix_norm(linalg_inv(A), p)


def linalg_vander(x, *, N=None):
    """Columns x^0, x^1, ..., x^(N-1) (N defaults to len(x))."""
    from .shape import stack

    n = x.shape[-1] if N is None else N
    if n <= 1:
        if n < 1:
            raise RuntimeError("N must be greater than 1.")
        return (x * 0 + 1).unsqueeze(-1)
    cols = [x * 0 + 1, x]
    for _ in range(n - 2):
        cols.append(cols[-1] * x)
    return stack(cols, -1)


def linalg_tensorinv(A, ind=2, *, out=None):
    _no_out("linalg.tensorinv", out)
    if ind <= 0:
        raise RuntimeError(f"Expected a strictly positive integer for 'ind', but got {ind}")
    head, tail = tuple(A.shape[:ind]), tuple(A.shape[ind:])
    rows, cols = math.prod(head), math.prod(tail)
    if rows != cols:
        raise RuntimeError(f"Expected self to satisfy the requirement prod(self.shape[ind:]) == "
                           f"prod(self.shape[:ind]), but got {cols} != {rows}")
    return linalg_inv(A.reshape(rows, cols)).reshape(*tail, *head)


def linalg_tensorsolve(A, B, dims=None, *, out=None):
    _no_out("linalg.tensorsolve", out)
    if dims is not None:
        dims = [d % A.ndim for d in dims]
        A = A.permute(*[d for d in range(A.ndim) if d not in dims], *dims)
    rest = tuple(A.shape[B.ndim:])
    rows = math.prod(tuple(A.shape[:B.ndim]))
    x = _solve_matrix(A.reshape(rows, math.prod(rest)), B.reshape(rows, 1))
    return x.reshape(*rest)


# -- LU ---------------------------------------------------------------------------------
_lu_factor_result = _return_type("linalg_lu_factor", ["LU", "pivots"])
_lu_factor_ex_result = _return_type("linalg_lu_factor_ex", ["LU", "pivots", "info"])
_lu_result = _return_type("linalg_lu", ["P", "L", "U"])
_lu_unpack_result = _return_type("lu_unpack", ["P", "L", "U"])


def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False, out=None):
    """(LU, pivots, info) of LU with partial pivoting, as LAPACK's getrf."""
    _no_out("linalg.lu_factor_ex", out)
    return _lu_factor_ex_result(*call("linalg_lu_factor_ex", A, pivot=pivot,
                                      check_errors=check_errors))


def linalg_lu_factor(A, *, pivot=True, out=None):
    """(LU, pivots); raises for a zero pivot (U[j, j] = 0), as torch."""
    _no_out("linalg.lu_factor", out)
    lu, piv, _ = call("linalg_lu_factor_ex", A, pivot=pivot, check_errors=True)
    return _lu_factor_result(lu, piv)


def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True, *, out=None):
    """(P, L, U) with A = P L U from lu_factor's packed form; empty tensors for the parts
    not asked for."""
    from ...ops.linalg import permutation_matrix
    from .creation import eye, zeros

    _no_out("lu_unpack", out)
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    where = _beside(LU_data)
    p = lo = up = zeros(0, dtype=LU_data.dtype, device=where)
    if unpack_data:
        lo = LU_data[..., :, :k].tril(-1) + eye(m, k, dtype=LU_data.dtype, device=where)
        up = LU_data[..., :k, :].triu()
    if unpack_pivots:
        p = permutation_matrix(call("lu_permutation", LU_pivots, m=m), LU_data.dtype)
    return _lu_unpack_result(p, lo, up)


def linalg_lu(A, *, pivot=True, out=None):
    _no_out("linalg.lu", out)
    lu, piv, _ = call("linalg_lu_factor_ex", A, pivot=pivot, check_errors=False)
    return _lu_result(*lu_unpack(lu, piv))


def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False, out=None):
    """X with A X = B (A^T X = B with adjoint; X A = B, X A^T = B with left=False) for
    A = P L U given as lu_factor's (LU, pivots): a permutation and two triangular solves."""
    from ...ops.linalg import permutation_matrix

    _no_out("linalg.lu_solve", out)
    if not left:  # X A = B <=> A^T X^T = B^T (and X A^T = B <=> A X^T = B^T)
        return linalg_lu_solve(LU, pivots, B.mT, left=True, adjoint=not adjoint).mT
    n = LU.shape[-1]
    p = permutation_matrix(call("lu_permutation", pivots, m=n), LU.dtype)
    if not adjoint:  # U^-1 L^-1 P^T B
        y = linalg_solve_triangular(LU, p.mT @ B, upper=False, unitriangular=True)
        return linalg_solve_triangular(LU, y, upper=True)
    # A^T = U^T L^T P^T: X = P L^-T U^-T B
    y = linalg_solve_triangular(LU.triu().mT, B, upper=False)
    return p @ linalg_solve_triangular(LU.tril(-1).mT, y, upper=True, unitriangular=True)


_solve_ex_result = _return_type("linalg_solve_ex", ["result", "info"])


def linalg_solve_ex(A, B, *, left=True, check_errors=False, out=None):
    """(result, info) of solve through LU: info (int32) is the first zero pivot per matrix,
    whose result then holds inf/nan, as torch."""
    _no_out("linalg.solve_ex", out)
    lu_, piv, info = call("linalg_lu_factor_ex", A, pivot=True, check_errors=False)
    if check_errors:
        flat = info.numpy().reshape(-1)
        bad = np.flatnonzero(flat)
        if bad.size:
            where = f"(Batch element {bad[0]}): " if A.ndim > 2 else ""
            raise LinAlgError(f"torch.linalg.solve_ex: {where}The solver failed because the "
                              "input matrix is singular.")
    vector = left and (B.ndim == 1 or (B.ndim == A.ndim - 1
                                       and tuple(B.shape) == tuple(A.shape[:-1])))
    x = linalg_lu_solve(lu_, piv, B.unsqueeze(-1) if vector else B, left=left)
    return _solve_ex_result(x.squeeze(-1) if vector else x, info)


def lu(A, pivot=True, get_infos=False, out=None):
    """The deprecated torch.lu: (LU, pivots) or, with get_infos, (LU, pivots, infos)."""
    _no_out("lu", out)
    _deprecated_once("lu", (
        "torch.lu is deprecated in favor of torch.linalg.lu_factor / torch.linalg.lu_factor_ex "
        "and will be removed in a future PyTorch release.\nLU, pivots = torch.lu(A, "
        "compute_pivots)\nshould be replaced with\nLU, pivots = torch.linalg.lu_factor(A, "
        "compute_pivots)\nand\nLU, pivots, info = torch.lu(A, compute_pivots, "
        "get_infos=True)\nshould be replaced with\nLU, pivots, info = "
        "torch.linalg.lu_factor_ex(A, compute_pivots)"))
    lu_, piv, info = call("linalg_lu_factor_ex", A, pivot=pivot, check_errors=not get_infos)
    return (lu_, piv, info) if get_infos else (lu_, piv)


def lu_solve(b, LU_data, LU_pivots, *, out=None):
    """The deprecated torch.lu_solve (arguments reversed from linalg.lu_solve)."""
    _no_out("lu_solve", out)
    _deprecated_once("lu_solve", (
        "torch.lu_solve is deprecated in favor of torch.linalg.lu_solveand will be removed in a "
        "future PyTorch release.\nNote that torch.linalg.lu_solve has its arguments reversed."
        "\nX = torch.lu_solve(B, LU, pivots)\nshould be replaced with\n"
        "X = torch.linalg.lu_solve(LU, pivots, B)"))
    return linalg_lu_solve(LU_data, LU_pivots, b)


_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0,
           129060195264000.0, 10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0,
           40840800.0, 960960.0, 16380.0, 182.0, 1.0)


def linalg_matrix_exp(A):
    """exp(A) by scaling and squaring with the degree-13 Pade approximant (Higham 2005),
    written with ops so that its gradient is the approximant's.  The number of squarings
    comes from the largest 1-norm in the batch (read on the host, as torch's CPU kernel
    branches on it)."""
    from .creation import eye

    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError("linalg.matrix_exp: The input tensor A must have at least 2 "
                           "dimensions." if A.ndim < 2 else "linalg.matrix_exp: A must be "
                           f"batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")
    n = A.shape[-1]
    if A.numel() == 0:
        return A.clone()
    norm1 = float(A.detach().abs().sum(-2).amax())
    squarings = max(0, math.ceil(math.log2(norm1 / 5.371920351148152))) if (
        math.isfinite(norm1) and norm1 > 0) else 0
    a = A / (2.0 ** squarings) if squarings else A
    b = _PADE13
    ident = eye(n, dtype=A.dtype, device=_beside(A))
    a2 = a @ a
    a4 = a2 @ a2
    a6 = a4 @ a2
    u = a @ (a6 @ (b[13] * a6 + b[11] * a4 + b[9] * a2)
             + b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * ident)
    v = (a6 @ (b[12] * a6 + b[10] * a4 + b[8] * a2)
         + b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * ident)
    r = _solve_matrix(v - u, v + u)
    for _ in range(squarings):
        r = r @ r
    return r


def matrix_exp(input):
    return linalg_matrix_exp(input)


def _not_supported(name, why):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"linalg.{name} is not supported: {why}")

    fn.__name__ = name
    return fn


# -- torch's top-level forms ----------------------------------------------------------------
def inverse(input, *, out=None):
    return linalg_inv(input, out=out)


def det(input):
    return linalg_det(input)


def slogdet(input):
    return _old_slogdet_result(*call("linalg_slogdet", input))


def logdet(input):
    """log det(A): nan for a negative determinant, -inf for zero."""
    from .elementwise import log

    sign, logabs = call("linalg_slogdet", input)
    return logabs + log(sign)


_WARNED: set = set()


def _deprecated_once(name, text):
    """torch's TORCH_WARN_ONCE deprecation notes for the pre-linalg forms."""
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(text, UserWarning, stacklevel=3)


def cholesky(input, upper=False, *, out=None):
    _deprecated_once("cholesky", (
        "torch.cholesky is deprecated in favor of torch.linalg.cholesky and will be removed in "
        "a future PyTorch release.\nL = torch.cholesky(A)\nshould be replaced with\n"
        "L = torch.linalg.cholesky(A)\nand\nU = torch.cholesky(A, upper=True)\nshould be "
        "replaced with\nU = torch.linalg.cholesky(A).mH\nThis transform will produce "
        "equivalent results for all valid (symmetric positive definite) inputs."))
    return linalg_cholesky(input, upper=upper, out=out)


def svd(input, some=True, compute_uv=True, *, out=None):
    """torch.svd: U, S and V (not V^T); some=False gives the full U and V; without
    compute_uv, U and V are zeros of the full shapes."""
    _no_out("svd", out)
    if not compute_uv:
        from .creation import zeros

        m, n = input.shape[-2:]
        s = linalg_svdvals(input)
        batch = tuple(input.shape[:-2])
        return _old_svd_result(zeros(*batch, m, m, dtype=input.dtype, device=_beside(input)), s,
                               zeros(*batch, n, n, dtype=input.dtype, device=_beside(input)))
    u, s, vh = call("linalg_svd", input, full_matrices=not some)
    return _old_svd_result(u, s, vh.mT)


def qr(input, some=True, *, out=None):
    _no_out("qr", out)
    _deprecated_once("qr", (
        "torch.qr is deprecated in favor of torch.linalg.qr and will be removed in a future "
        "PyTorch release.\nThe boolean parameter 'some' has been replaced with a string "
        "parameter 'mode'.\nQ, R = torch.qr(A, some)\nshould be replaced with\n"
        "Q, R = torch.linalg.qr(A, 'reduced' if some else 'complete')"))
    return _old_qr_result(*call("linalg_qr", input, mode="reduced" if some else "complete"))


def pinverse(input, rcond=1e-15):
    return linalg_pinv(input, rtol=rcond)


def matrix_power(input, n):
    return linalg_matrix_power(input, n)


def _cholesky_product(L, upper):
    """A = L L^T (upper: U^T U) from the factor's triangle, with the gradient torch gives:
    that of the full factor (its value is the triangle, its gradient flows to all of L)."""
    tri = L.triu() if upper else L.tril()
    f = L + (tri - L).detach()
    return f.mT @ f if upper else f @ f.mT


def cross(input, other, dim=None, *, out=None):
    """torch.cross: linalg.cross, with dim=None meaning the first axis of size 3."""
    _no_out("cross", out)
    if dim is None:
        _deprecated_once("cross", (
            "Using torch.cross without specifying the dim arg is deprecated.\nPlease either "
            "pass the dim explicitly or simply use torch.linalg.cross.\nThe default value of "
            "dim will change to agree with that of linalg.cross in a future release."))
        sizes = list(input.shape)
        if 3 not in sizes:
            raise RuntimeError("no dimension of size 3 in input")
        dim = sizes.index(3)
    return linalg_cross(input, other, dim=dim)


def chain_matmul(*matrices, out=None):
    """The deprecated torch.chain_matmul: the product of 2-D matrices (one is returned as
    is)."""
    _no_out("chain_matmul", out)
    _deprecated_once("chain_matmul", (
        "torch.chain_matmul is deprecated and will be removed in a future PyTorch release. Use "
        "torch.linalg.multi_dot instead, which accepts a list of two or more tensors rather "
        "than multiple parameters."))
    if len(matrices) == 1:
        if matrices[0].ndim != 2:
            raise RuntimeError(f"chain_matmul(): Tensor dimension is {matrices[0].ndim}, "
                               "expected 2 instead.")
        return matrices[0].clone()
    return linalg_multi_dot(matrices)


def kron(input, other, *, out=None):
    """The Kronecker product: out[i * q + j] = input[i] * other[j] along every axis (the
    operand of fewer dims gets leading unit axes)."""
    _no_out("kron", out)
    n = max(input.ndim, other.ndim)
    a = input.reshape(*([1] * (n - input.ndim)), *input.shape)
    b = other.reshape(*([1] * (n - other.ndim)), *other.shape)
    inter_a = [d for size in a.shape for d in (size, 1)]
    inter_b = [d for size in b.shape for d in (1, size)]
    prod = a.reshape(*inter_a) * b.reshape(*inter_b)
    return prod.reshape(*[x * y for x, y in zip(a.shape, b.shape)])


_triangular_solve_result = _return_type("triangular_solve", ["solution", "cloned_coefficient"])


def triangular_solve(b, A, upper=True, transpose=False, unitriangular=False, *, out=None):
    """The deprecated form of linalg.solve_triangular (arguments reversed; also returns a copy
    of A); transpose solves with tri(A)^T."""
    _no_out("triangular_solve", out)
    _deprecated_once("triangular_solve", (
        "torch.triangular_solve is deprecated in favor of torch.linalg.solve_triangularand will "
        "be removed in a future PyTorch release.\ntorch.linalg.solve_triangular has its "
        "arguments reversed and does not return a copy of one of the inputs.\n"
        "X = torch.triangular_solve(B, A).solution\nshould be replaced with\n"
        "X = torch.linalg.solve_triangular(A, B)."))
    if transpose:
        tri = A.triu() if upper else A.tril()
        x = linalg_solve_triangular(tri.mT, b, upper=not upper, unitriangular=unitriangular)
    else:
        x = linalg_solve_triangular(A, b, upper=upper, unitriangular=unitriangular)
    return _triangular_solve_result(x, A.clone())


def cholesky_solve(B, L, upper=False, *, out=None):
    """X with A X = B for A = L L^T (upper: A = U^T U)."""
    _no_out("cholesky_solve", out)
    if B.ndim < 2:
        raise RuntimeError(f"b should have at least 2 dimensions, but has {B.ndim} dimensions "
                           "instead")
    if L.ndim < 2:
        raise RuntimeError(f"u should have at least 2 dimensions, but has {L.ndim} dimensions "
                           "instead")
    return _solve_matrix(_cholesky_product(L, upper), B)


def cholesky_inverse(L, upper=False, *, out=None):
    """A^-1 for A = L L^T (upper: A = U^T U)."""
    _no_out("cholesky_inverse", out)
    return linalg_inv(_cholesky_product(L, upper))


LINALG = {
    "inv": linalg_inv, "inv_ex": linalg_inv_ex, "det": linalg_det, "slogdet": linalg_slogdet,
    "solve": linalg_solve, "cholesky": linalg_cholesky, "eigh": linalg_eigh,
    "eigvalsh": linalg_eigvalsh, "svd": linalg_svd, "svdvals": linalg_svdvals,
    "qr": linalg_qr, "norm": linalg_norm, "matrix_norm": linalg_matrix_norm,
    "vector_norm": linalg_vector_norm, "pinv": linalg_pinv, "matrix_rank": linalg_matrix_rank,
    "cross": linalg_cross, "LinAlgError": LinAlgError,
    "solve_triangular": linalg_solve_triangular, "lstsq": linalg_lstsq,
    "matrix_power": linalg_matrix_power, "multi_dot": linalg_multi_dot,
    "vecdot": linalg_vecdot, "diagonal": linalg_diagonal, "matmul": matmul, "cond": linalg_cond,
    "vander": linalg_vander, "tensorinv": linalg_tensorinv, "tensorsolve": linalg_tensorsolve,
    "eig": _not_supported("eig", "its results are complex and sbpflow has no complex dtypes"),
    "eigvals": _not_supported("eigvals", "its results are complex and sbpflow has no complex "
                              "dtypes"),
    "matrix_exp": linalg_matrix_exp,
    "lu": linalg_lu, "lu_factor": linalg_lu_factor, "lu_factor_ex": linalg_lu_factor_ex,
    "lu_solve": linalg_lu_solve,
    "ldl_factor": _not_supported("ldl_factor", "not implemented yet"),
    "householder_product": _not_supported("householder_product", "not implemented yet"),
    "cholesky_ex": linalg_cholesky_ex,
    "solve_ex": linalg_solve_ex,
}


METHODS = {
    "inverse": inverse, "det": det, "logdet": logdet, "slogdet": slogdet,
    "cholesky": cholesky, "svd": svd, "qr": qr, "pinverse": pinverse,
    "matrix_power": matrix_power, "matrix_exp": matrix_exp, "cholesky_solve": cholesky_solve,
    "triangular_solve": triangular_solve, "lu": lu, "lu_solve": lu_solve, "cross": cross,
    "kron": kron,
    "cholesky_inverse": cholesky_inverse,
    "matmul": matmul, "__matmul__": matmul,
    "__rmatmul__": lambda self, other: matmul(other, self),
    "mm": mm, "bmm": bmm, "mv": mv, "dot": dot, "outer": outer, "ger": ger,
    "addmm": addmm, "baddbmm": baddbmm, "addmv": addmv,
    "addbmm": addbmm, "addr": addr, "inner": inner, "vdot": vdot,
    "addbmm_": inplace_method("addbmm_", addbmm), "addr_": inplace_method("addr_", addr),
}

__all__ = ["addmm", "addmv", "baddbmm", "bmm", "chain_matmul", "cholesky", "cholesky_inverse",
           "cholesky_solve", "cross", "det", "dot", "einsum", "ger", "inverse", "kron", "logdet",
           "lu", "lu_solve", "lu_unpack", "matmul", "matrix_exp", "matrix_power", "mm", "mv",
           "outer", "pinverse", "qr", "slogdet", "svd", "tensordot", "triangular_solve"]
__all__ += ["addbmm", "addr", "cdist", "inner", "vdot"]
