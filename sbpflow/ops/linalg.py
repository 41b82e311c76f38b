"""Matrix products (matmul, mm, bmm, dot, outer, einsum) and decompositions (inv, det,
slogdet, solve, cholesky, eigh, svd, qr, inv_ex, cholesky_ex).

einsum runs as a chain of pairwise contractions, each one batched `matmul` primitive after a
permute and reshape (the fast path NumPy and cuBLAS offer), with diagonals, broadcast size-1
axes and labels summed early handled per operand first.  Its gradient is einsum again: the
output gradient contracted with the other operands.

The decompositions work on batches of matrices (*, m, n) with NumPy's LAPACK; their gradients
are torch's formulas written with ops, so they have gradients of their own.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .._core import dtype as dt
from .._core.errors import broadcast_shapes, op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split, einsum_signatures
from ._util import unbroadcast
from .registry import Attr, OpDef, Sample, op, register


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _ints(rng, *shape, dtype=np.int64):
    return rng.integers(-4, 5, shape).astype(dtype)


def _same_dtype(name, a, b):
    if a.dtype is not b.dtype:
        raise op_error(name, f"expected m1 and m2 to have the same dtype, but got: "
                       f"{a.dtype.name} != {b.dtype.name}")


def _mat_str(shape):
    return "x".join(map(str, shape))


# -- matmul ---------------------------------------------------------------------------------
def _matmul_meta(a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise op_error("matmul", "both arguments to matmul need to be at least 1D, but they are "
                       f"{a.ndim}D and {b.ndim}D")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        if a.ndim == 1 and b.ndim == 1:
            msg = (f"inconsistent tensor size, expected tensor [{ka}] and src [{kb}] to have "
                   f"the same number of elements, but got {ka} and {kb} elements respectively")
        elif b.ndim == 1:
            msg = (f"size mismatch, got input ({a.shape[-2]}), mat ({_mat_str(a.shape)}), "
                   f"vec ({kb})")
        else:
            sa = _mat_str(a.shape if a.ndim > 1 else (1,) + a.shape)
            msg = f"mat1 and mat2 shapes cannot be multiplied ({sa} and {_mat_str(b.shape)})"
        raise op_error("matmul", msg)
    _same_dtype("matmul", a, b)
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    rows = (a.shape[-2],) if a.ndim >= 2 else ()
    cols = (b.shape[-1],) if b.ndim >= 2 else ()
    return TensorMeta(batch + rows + cols, a.dtype)


def _matmul_kernel(ctx, a, b):
    return ctx.prims.matmul(a, b)


def _matmul_grad(ctx, g):
    am, bm = ctx.in_metas
    ga = gb = None
    # As matrices: a 1-D left operand is a row (1, k), a 1-D right operand a column (k, 1); the
    # output gradient gets the matching unit axes back.
    a_mat = (1,) + am.shape if am.ndim == 1 else am.shape
    b_mat = bm.shape + (1,) if bm.ndim == 1 else bm.shape
    g_mat = tuple(g.shape)
    if am.ndim == 1:
        g_mat = g_mat[:-1] + (1,) + g_mat[-1:] if bm.ndim > 1 else (1,) + g_mat
    if bm.ndim == 1:
        g_mat = g_mat + (1,)
    g2 = op("reshape", g, shape=g_mat) if g_mat != tuple(g.shape) else g
    if ctx.needs_input_grad[0]:
        b = ctx.input(1)
        b2 = op("reshape", b, shape=b_mat) if bm.ndim == 1 else b
        # dA = dC @ B^T, summed over the batch axes A was broadcast along.
        ga = unbroadcast(op("matmul", g2, op("transpose", b2, dim0=-1, dim1=-2)),
                         TensorMeta(a_mat, am.dtype))
        if am.ndim == 1:
            ga = op("reshape", ga, shape=am.shape)
    if ctx.needs_input_grad[1]:
        a = ctx.input(0)
        a2 = op("reshape", a, shape=a_mat) if am.ndim == 1 else a
        # dB = A^T @ dC, summed over the batch axes B was broadcast along.
        gb = unbroadcast(op("matmul", op("transpose", a2, dim0=-1, dim1=-2), g2),
                         TensorMeta(b_mat, bm.dtype))
        if bm.ndim == 1:
            gb = op("reshape", gb, shape=bm.shape)
    return ga, gb


def matmul_spec(an: int, bn: int) -> str:
    """The einsum string of matmul for operands of an and bn dims (batch dims broadcast)."""
    nb = max(an, bn) - 2
    batch = "abcdefgh"[: max(nb, 0)]
    if an == 1 and bn == 1:
        return "k,k->"
    if an == 1:
        return f"k,{batch[nb - (bn - 2):]}kn->{batch}n"
    if bn == 1:
        return f"{batch[nb - (an - 2):]}mk,k->{batch}m"
    return f"{batch[nb - (an - 2):]}mk,{batch[nb - (bn - 2):]}kn->{batch}mn"


def _matmul_sbp(a, b):
    # (S0,B)->S0 and (B,S1)->S1 keep rows/cols; (S1,S0)->P sums over k; batch axes split both.
    return einsum_signatures(matmul_spec(a.ndim, b.ndim), [a.shape, b.shape])


register(OpDef(
    "matmul",
    inputs=("input", "other"),
    infer_meta=_matmul_meta,
    kernel=_matmul_kernel,
    saves=("input for other", "other for input"),
    grad=_matmul_grad,
    sbp=_matmul_sbp,
    reference="matmul",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _rand(rng, 4, 5)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 2, 4, 5)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 4, 2)),
        Sample(_rand(rng, 4), _rand(rng, 4, 3)),
        Sample(_rand(rng, 3, 4), _rand(rng, 4)),
        Sample(_rand(rng, 4), _rand(rng, 4)),
        Sample(_rand(rng, 1, 3, 4), _rand(rng, 5, 4, 2)),
        Sample(_rand(rng, 2, 1, 3, 4), _rand(rng, 3, 4, 2)),
        Sample(_rand(rng, 4), _rand(rng, 2, 4, 3)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 4)),
        Sample(_rand(rng, 3, 1), _rand(rng, 1, 2)),
        Sample(_rand(rng, 3, 4, dtype=np.float32), _rand(rng, 4, 2, dtype=np.float32),
               grad=False),
        Sample(_ints(rng, 2, 3), _ints(rng, 3, 4), grad=False),
    ],
))


# -- mm, bmm --------------------------------------------------------------------------------
def _mm_meta(a, b):
    if a.ndim != 2:
        raise op_error("mm", f"self must be a matrix, got a {a.ndim}-D tensor")
    if b.ndim != 2:
        raise op_error("mm", f"mat2 must be a matrix, got a {b.ndim}-D tensor")
    if a.shape[1] != b.shape[0]:
        raise op_error("mm", f"mat1 and mat2 shapes cannot be multiplied ({_mat_str(a.shape)} "
                       f"and {_mat_str(b.shape)})")
    _same_dtype("mm", a, b)
    return TensorMeta((a.shape[0], b.shape[1]), a.dtype)


def _product_grad(name):
    """dA = dC B^T and dB = A^T dC for mm and bmm (no broadcasting to undo)."""
    def grad(ctx, g):
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = op(name, g, op("transpose", ctx.input(1), dim0=-1, dim1=-2))
        if ctx.needs_input_grad[1]:
            gb = op(name, op("transpose", ctx.input(0), dim0=-1, dim1=-2), g)
        return ga, gb

    return grad


register(OpDef(
    "mm",
    inputs=("input", "mat2"),
    infer_meta=_mm_meta,
    kernel=_matmul_kernel,
    saves=("input for mat2", "mat2 for input"),
    grad=_product_grad("mm"),
    # (S0,B)->S0: rows; (B,S1)->S1: columns; (S1,S0)->P: sum over k; (P,B), (B,P)->P: linear.
    sbp=lambda a, b: einsum_signatures("mk,kn->mn", [a.shape, b.shape]),
    reference="mm",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _rand(rng, 4, 5)),
        Sample(_rand(rng, 1, 4), _rand(rng, 4, 1)),
        Sample(_rand(rng, 3, 0), _rand(rng, 0, 2)),
        Sample(_rand(rng, 5, 3, dtype=np.float32), _rand(rng, 3, 2, dtype=np.float32),
               grad=False),
        Sample(_ints(rng, 2, 3), _ints(rng, 3, 3), grad=False),
    ],
))


def _bmm_meta(a, b):
    if a.ndim != 3:
        raise op_error("bmm", f"batch1 must be a 3D tensor, got a {a.ndim}-D tensor")
    if b.ndim != 3:
        raise op_error("bmm", f"batch2 must be a 3D tensor, got a {b.ndim}-D tensor")
    if (b.shape[0], b.shape[1]) != (a.shape[0], a.shape[2]):
        raise op_error("bmm", f"Expected size for first two dimensions of batch2 tensor to be: "
                       f"[{a.shape[0]}, {a.shape[2]}] but got: [{b.shape[0]}, {b.shape[1]}].")
    _same_dtype("bmm", a, b)
    return TensorMeta((a.shape[0], a.shape[1], b.shape[2]), a.dtype)


register(OpDef(
    "bmm",
    inputs=("input", "mat2"),
    infer_meta=_bmm_meta,
    kernel=_matmul_kernel,
    saves=("input for mat2", "mat2 for input"),
    grad=_product_grad("bmm"),
    # (S0,S0)->S0: batches; rows, columns and k as for mm.
    sbp=lambda a, b: einsum_signatures("bmk,bkn->bmn", [a.shape, b.shape]),
    reference="bmm",
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 2, 4, 5)),
        Sample(_rand(rng, 3, 1, 2), _rand(rng, 3, 2, 1)),
        Sample(_rand(rng, 2, 2, 3, dtype=np.float32), _rand(rng, 2, 3, 2, dtype=np.float32),
               grad=False),
        Sample(_ints(rng, 2, 2, 3), _ints(rng, 2, 3, 2), grad=False),
    ],
))


# -- dot, outer -----------------------------------------------------------------------------
def _dot_meta(a, b):
    if a.ndim != 1 or b.ndim != 1:
        raise op_error("dot", f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    if a.shape != b.shape:
        n, m = a.shape[0], b.shape[0]
        raise op_error("dot", f"inconsistent tensor size, expected tensor [{n}] and src [{m}] "
                       f"to have the same number of elements, but got {n} and {m} elements "
                       "respectively")
    if a.dtype is not b.dtype:
        raise op_error("dot", f"expected both vectors to have same dtype, but found "
                       f"{a.dtype.name} and {b.dtype.name}")
    return TensorMeta((), a.dtype)


def _dot_grad(ctx, g):
    ga = op("mul", g, ctx.input(1)) if ctx.needs_input_grad[0] else None
    gb = op("mul", g, ctx.input(0)) if ctx.needs_input_grad[1] else None
    return ga, gb


register(OpDef(
    "dot",
    inputs=("input", "tensor"),
    infer_meta=_dot_meta,
    kernel=_matmul_kernel,
    saves=("input for tensor", "tensor for input"),
    grad=_dot_grad,
    # (S0,S0)->P: each rank sums its slice of the products; (P,B), (B,P)->P: linear.
    sbp=lambda a, b: einsum_signatures("k,k->", [a.shape, b.shape]),
    reference="dot",
    samples=lambda rng: [
        Sample(_rand(rng, 5), _rand(rng, 5)),
        Sample(_rand(rng, 1), _rand(rng, 1)),
        Sample(_rand(rng, 4, dtype=np.float32), _rand(rng, 4, dtype=np.float32), grad=False),
        Sample(_ints(rng, 6), _ints(rng, 6), grad=False),
    ],
))


def _outer_meta(a, b):
    for arg, m in (("vec1", a), ("vec2", b)):
        if m.ndim != 1:
            raise op_error("outer", f"Expected 1-D argument {arg}, but got {m.ndim}-D")
    return TensorMeta((a.shape[0], b.shape[0]), dt.result_type([a.dtype, b.dtype], [], []))


def _outer_kernel(ctx, a, b):
    out = ctx.out_metas[0]
    a = ctx.prims.reshape(a, (out.shape[0], 1))
    b = ctx.prims.reshape(b, (1, out.shape[1]))
    if a.dtype != out.dtype.np:
        a = ctx.prims.cast(a, out.dtype)
    if b.dtype != out.dtype.np:
        b = ctx.prims.cast(b, out.dtype)
    return ctx.prims.binary("mul", a, b)


def _outer_grad(ctx, g):
    am, bm = ctx.in_metas
    out = ctx.out_metas[0].dtype
    ga = gb = None
    if ctx.needs_input_grad[0]:  # d vec1 = dC @ vec2
        b = ctx.input(1)
        b = b if bm.dtype is out else op("to_dtype", b, dtype=out)
        ga = unbroadcast(op("matmul", g, b), am)
    if ctx.needs_input_grad[1]:  # d vec2 = dC^T @ vec1
        a = ctx.input(0)
        a = a if am.dtype is out else op("to_dtype", a, dtype=out)
        gb = unbroadcast(op("matmul", a, g), bm)
    return ga, gb


register(OpDef(
    "outer",
    inputs=("input", "vec2"),
    infer_meta=_outer_meta,
    kernel=_outer_kernel,
    saves=("input for vec2", "vec2 for input"),
    grad=_outer_grad,
    # (S0,B)->S0, (B,S0)->S1: rows and columns; (P,B), (B,P)->P: linear in each (never (P,P)).
    sbp=lambda a, b: einsum_signatures("i,j->ij", [a.shape, b.shape]),
    reference="outer",
    samples=lambda rng: [
        Sample(_rand(rng, 3), _rand(rng, 4)),
        Sample(_rand(rng, 1), _rand(rng, 5)),
        Sample(_rand(rng, 3), _rand(rng, 2, dtype=np.float32)),
        Sample(_ints(rng, 3), _rand(rng, 2, dtype=np.float32), grad=False),
        Sample(_ints(rng, 2, dtype=np.int32), _ints(rng, 3), grad=False),
    ],
))


# -- einsum ---------------------------------------------------------------------------------
# Labels are ints: letters A-Z are 0-25 and a-z 26-51 (torch's order, which sorts the implicit
# output), the axes an ellipsis covers are 52, 53, ... right-aligned across operands.
_ELLIPSIS = 52


def _label(c: str) -> int:
    return ord(c) - ord("A") if c <= "Z" else ord(c) - ord("a") + 26


def _letter(label: int) -> str:
    return chr(ord("A") + label) if label < 26 else chr(ord("a") + label - 26)


def _is_subscript(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z")


class _Spec(NamedTuple):
    terms: tuple[tuple[int, ...], ...]  # labels of each operand's axes
    out: tuple[int, ...]  # labels of the output's axes
    sizes: dict  # label -> size (the broadcast size over all operands)


def _err(msg: str) -> RuntimeError:
    return op_error("einsum", msg)


def _parse_operands(lhs: str, n_ops: int):
    """Letters and ellipsis markers per operand, with torch's errors (indices into lhs)."""
    terms = [[]]
    ellipsis = False
    i = 0
    while i < len(lhs):
        c = lhs[i]
        if c == " ":
            pass
        elif c == ".":
            if ellipsis:
                raise _err(f"found '.' for operand {len(terms) - 1} for which an ellipsis was "
                           "already found")
            if lhs[i:i + 3] != "...":
                raise _err(f"found '.' for operand {len(terms) - 1} that is not part of any "
                           "ellipsis")
            terms[-1].append(None)
            ellipsis = True
            i += 2
        elif c == ",":
            terms.append([])
            ellipsis = False
            if len(terms) > n_ops:
                raise _err("fewer operands were provided than specified in the equation")
        elif _is_subscript(c):
            terms[-1].append(_label(c))
        else:
            raise _err(f"invalid subscript given at index {i} in the equation string, "
                       "subscripts must be in [a-zA-Z]")
        i += 1
    if len(terms) < n_ops:
        raise _err("more operands were provided than specified in the equation")
    return terms


@functools.lru_cache(maxsize=2048)
def _spec(equation: str, shapes: tuple[tuple[int, ...], ...]) -> _Spec:
    """Parse and check an equation against operand shapes (torch's rules and messages)."""
    if not shapes:
        raise _err("must provide at least one operand")
    arrow = equation.find("->")
    lhs = equation if arrow < 0 else equation[:arrow]
    raw = _parse_operands(lhs, len(shapes))

    n_ell = 0
    for k, (term, shape) in enumerate(zip(raw, shapes, strict=True)):
        letters = sum(1 for x in term if x is not None)
        if None in term:
            if letters > len(shape):
                raise _err(f"the number of subscripts in the equation ({letters}) is more than "
                           f"the number of dimensions ({len(shape)}) for operand {k}")
            n_ell = max(n_ell, len(shape) - letters)
        elif letters != len(shape):
            raise _err(f"the number of subscripts in the equation ({letters}) does not match "
                       f"the number of dimensions ({len(shape)}) for operand {k} and no "
                       "ellipsis was given")
    ell = tuple(range(_ELLIPSIS, _ELLIPSIS + n_ell))

    terms = []
    for term, shape in zip(raw, shapes, strict=True):
        if None in term:
            covered = len(shape) - (len(term) - 1)
            at = term.index(None)
            term = term[:at] + list(ell[n_ell - covered:]) + term[at + 1:]
        terms.append(tuple(term))

    sizes: dict[int, int] = {}
    for k, (term, shape) in enumerate(zip(terms, shapes, strict=True)):
        seen: dict[int, int] = {}
        for label, n in zip(term, shape, strict=True):
            if label in seen:
                if seen[label] != n:
                    raise _err(f"subscript {_letter(label)} is repeated for operand {k} but "
                               f"the sizes don't match, {n} != {seen[label]}")
                continue
            seen[label] = n
            prev = sizes.get(label, 1)
            if n != 1 and prev != 1 and n != prev:
                if label >= _ELLIPSIS:
                    raise _err(f"dimension {label - _ELLIPSIS} covered by ellipsis in operand "
                               f"{k} has size {n} which does not broadcast with previously "
                               f"seen ellipsis with size {prev} for the respective dimension")
                raise _err(f"subscript {_letter(label)} has size {n} for operand {k} which "
                           f"does not broadcast with previously seen size {prev}")
            sizes[label] = n if label not in sizes or prev == 1 else prev

    if arrow < 0:
        counts: dict[int, int] = {}
        for term in terms:
            for label in term:
                counts[label] = counts.get(label, 0) + 1
        once = sorted(x for x, c in counts.items() if c == 1 and x < _ELLIPSIS)
        any_ell = any(None in term for term in raw)
        out = (ell if any_ell else ()) + tuple(once)
    else:
        out = _parse_output(equation, arrow, terms, ell)
    return _Spec(tuple(terms), out, sizes)


def _parse_output(equation, arrow, terms, ell):
    used = {x for term in terms for x in term}
    out: list[int] = []
    ellipsis = False
    rhs = equation[arrow + 2:]
    i = 0
    while i < len(rhs):
        c = rhs[i]
        if c == " ":
            pass
        elif c == ".":
            if ellipsis:
                raise _err("found '.' for output but an ellipsis (...) was already found")
            if rhs[i:i + 3] != "...":
                raise _err("found '.' for output that is not part of any ellipsis (...)")
            out.extend(ell)
            ellipsis = True
            i += 2
        elif _is_subscript(c):
            label = _label(c)
            if label not in used:
                raise _err(f"output subscript {c} does not appear in the equation for any "
                           "input operand")
            if label in out:
                raise _err(f"output subscript {c} appears more than once in the output")
            out.append(label)
        else:
            raise _err(f"invalid subscript given at index {arrow + 2 + i} in the equation "
                       "string, subscripts must be in [a-zA-Z]")
        i += 1
    return tuple(out)


def _summed_alone(spec: _Spec) -> bool:
    """A single operand with a label summed away (torch's einsum then sums as torch.sum)."""
    return len(spec.terms) == 1 and any(x not in spec.out for x in spec.terms[0])


def _einsum_meta(*operands, equation):
    spec = _spec(equation, tuple(m.shape for m in operands))
    dtype = operands[0].dtype
    for m in operands[1:]:
        if m.dtype is not dtype:
            raise _err(f"expected all operands to have the same dtype, but found "
                       f"{dtype.name} and {m.dtype.name}")
    if not dtype.is_floating_point and _summed_alone(spec):
        dtype = dt.int64  # torch.sum's integral accumulation
    return TensorMeta(tuple(spec.sizes[x] for x in spec.out), dtype)


class _Operand:
    """An array with one label per axis; `fresh` once it no longer aliases a kernel input."""

    __slots__ = ("x", "labels", "fresh")

    def __init__(self, x, labels, fresh=False):
        self.x, self.labels, self.fresh = x, list(labels), fresh

    def size(self, label):
        return self.x.shape[self.labels.index(label)]


def _diagonal(ctx, t: _Operand, p: int, q: int) -> None:
    """Replace axes p and q (same label and size) by their diagonal, as the last axis."""
    x, n = t.x, t.x.shape[p]
    rest = [a for a in range(x.ndim) if a not in (p, q)]
    y = ctx.prims.contiguous(ctx.prims.permute(x, tuple(rest + [p, q])))
    y = ctx.prims.reshape(y, tuple(x.shape[a] for a in rest) + (n * n,))
    # Element (i, i) of a contiguous n x n block sits at i * (n + 1).
    t.x = ctx.prims.slice(y, (Ellipsis, slice(0, n * n, n + 1)))
    t.labels = [t.labels[a] for a in rest] + [t.labels[p]]
    t.fresh = True


def _sum_out(ctx, t: _Operand, labels) -> None:
    axes = tuple(i for i, x in enumerate(t.labels) if x in labels)
    if axes:
        t.x = ctx.prims.reduce("sum", t.x, axes, False)
        t.labels = [x for x in t.labels if x not in labels]
        t.fresh = True


def _prepare(ctx, t: _Operand, sizes, needed) -> None:
    """Per operand: take diagonals of repeated labels, drop axes of size 1 that broadcast
    against a larger size elsewhere, and sum labels no one else needs."""
    while len(set(t.labels)) < len(t.labels):
        seen = {}
        for q, x in enumerate(t.labels):
            if x in seen:
                _diagonal(ctx, t, seen[x], q)
                break
            seen[x] = q
    drop = [i for i, x in enumerate(t.labels) if t.x.shape[i] == 1 and sizes[x] != 1]
    if drop:
        t.x = ctx.prims.reshape(t.x, [n for i, n in enumerate(t.x.shape) if i not in drop])
        t.labels = [x for i, x in enumerate(t.labels) if i not in drop]
    _sum_out(ctx, t, {x for x in t.labels if x not in needed})


def _contract(ctx, a: _Operand, b: _Operand, keep) -> _Operand:
    """a * b summed over shared labels not in `keep`: one batched matmul."""
    _sum_out(ctx, a, {x for x in a.labels if x not in b.labels and x not in keep})
    _sum_out(ctx, b, {x for x in b.labels if x not in a.labels and x not in keep})
    batch = [x for x in a.labels if x in b.labels and x in keep]
    summed = [x for x in a.labels if x in b.labels and x not in keep]
    a_only = [x for x in a.labels if x not in b.labels]
    b_only = [x for x in b.labels if x not in a.labels]
    batch_shape = [a.size(x) for x in batch]
    a_sizes = [a.size(x) for x in a_only]
    b_sizes = [b.size(x) for x in b_only]
    m, k, n = (int(np.prod(s, dtype=np.int64)) for s in
               (a_sizes, [a.size(x) for x in summed], b_sizes))
    xa = ctx.prims.permute(a.x, tuple(a.labels.index(x) for x in batch + a_only + summed))
    xb = ctx.prims.permute(b.x, tuple(b.labels.index(x) for x in batch + summed + b_only))
    xa = ctx.prims.reshape(xa, batch_shape + [m, k])
    xb = ctx.prims.reshape(xb, batch_shape + [k, n])
    out = ctx.prims.matmul(xa, xb)
    out = ctx.prims.reshape(out, batch_shape + a_sizes + b_sizes)
    return _Operand(out, batch + a_only + b_only, fresh=True)


def _einsum_kernel(ctx, arrays, equation):
    # Local shapes: on a shard, a split label has its local size in every operand holding it.
    spec = _spec(equation, tuple(m.shape for m in ctx.in_metas))
    out_meta = ctx.out_metas[0]
    ops = [_Operand(x, term) for x, term in zip(arrays, spec.terms, strict=True)]
    out = set(spec.out)
    for i, t in enumerate(ops):
        needed = out.union(*(u.labels for j, u in enumerate(ops) if j != i))
        _prepare(ctx, t, spec.sizes, needed)
    acc = ops[0]
    for j in range(1, len(ops)):
        keep = out.union(*(u.labels for u in ops[j + 1:]))
        acc = _contract(ctx, acc, ops[j], keep)
    _sum_out(ctx, acc, {x for x in acc.labels if x not in out})
    x = acc.x
    perm = tuple(acc.labels.index(label) for label in spec.out)
    if perm != tuple(range(len(perm))):
        x = ctx.prims.permute(x, perm)
    if x.dtype != out_meta.dtype.np:
        return ctx.prims.cast(x, out_meta.dtype)
    return x if acc.fresh else ctx.prims.contiguous(x)


def _letters(labels) -> dict[int, str]:
    """Letters for labels in an equation string: letters keep theirs, others (ellipsis axes,
    helper labels) take unused ones."""
    labels = set(labels)
    free = [c for c in range(_ELLIPSIS) if c not in labels]
    extra = sorted(x for x in labels if x >= _ELLIPSIS)
    if len(extra) > len(free):
        raise _err(f"the equation needs more than {_ELLIPSIS} distinct subscripts")
    names = {x: _letter(x) for x in labels if x < _ELLIPSIS}
    names.update({x: _letter(c) for x, c in zip(extra, free, strict=False)})
    return names


def _equation(terms, out) -> str:
    names = _letters([x for term in terms for x in term] + list(out))
    return ",".join("".join(names[x] for x in term) for term in terms) + "->" + "".join(
        names[x] for x in out)


def _einsum_grad(ctx, g):
    metas = ctx.in_metas
    shapes = tuple(m.shape for m in metas)
    spec = _spec(ctx.attrs["equation"], shapes)
    n_ops = len(shapes)
    helper = _ELLIPSIS + 64  # labels for the second axis of a diagonal, beyond any ellipsis
    grads = []
    for i, needed in enumerate(ctx.needs_input_grad):
        if not needed:
            grads.append(None)
            continue
        # d operand_i = einsum of the output gradient with every other operand.
        operands = [g] + [ctx.input(j) for j in range(n_ops) if j != i]
        terms = [spec.out] + [spec.terms[j] for j in range(n_ops) if j != i]
        target: list[int] = []
        for axis, label in enumerate(spec.terms[i]):
            if label in target:
                # A diagonal: the gradient lives on it, zero elsewhere; an identity matrix
                # between the label and a fresh one spreads it there.
                n = shapes[i][axis]
                operands.append(g.new_tensor(np.eye(n, dtype=np.float64)))
                terms.append((label, helper))
                target.append(helper)
                helper += 1
            else:
                target.append(label)
        present = {x for term in terms for x in term}
        keep = [
            axis for axis, label in enumerate(target)
            if label in present and not (shapes[i][axis] == 1 and spec.sizes.get(label, 1) != 1)
        ]
        gi = op("einsum", operands, equation=_equation(terms, [target[a] for a in keep]))
        full = shapes[i]
        if len(keep) < len(target):
            # Axes this operand broadcast from size 1 were summed away: they come back as 1.
            kept = dict(zip(keep, gi.shape, strict=True))
            gi = op("reshape", gi, shape=tuple(kept.get(a, 1) for a in range(len(full))))
        if tuple(gi.shape) != full:
            # Axes only this operand has (summed by the op), or that only broadcast operands
            # share: the gradient is constant along them.
            gi = op("expand", gi, size=full)
        if gi.dtype is not metas[i].dtype:
            gi = op("to_dtype", gi, dtype=metas[i].dtype)
        grads.append(gi)
    return tuple(grads)


def _einsum_sbp(*operands, equation):
    spec = _spec(equation, tuple(m.shape for m in operands))
    n = len(operands)
    linear = [Signature(tuple(P if j == i else B for j in range(n)), (P,)) for i in range(n)]
    if any(len(set(term)) < len(term) for term in spec.terms):
        # Diagonals: keep to what linearity gives.  (B..)->B; (P at one operand, B)->P.
        return [Signature((B,) * n, (B,))] + linear
    # A kept label splits every operand holding it at full size and the output; a summed one
    # makes the output partial; one P operand with the others B gives P (multilinear).
    return einsum_signatures(_equation(spec.terms, spec.out), [m.shape for m in operands])


def _einsum_reference(torch, operands, equation):
    return torch.einsum(equation, *operands)


def _einsum_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample([r(3, 4), r(4, 5)], equation="ij,jk->ik"),
        Sample([r(2, 3, 4), r(2, 4, 5)], equation="bij,bjk->bik"),
        Sample([r(3), r(4)], equation="i,j->ij"),
        Sample([r(3, 4), r(3, 4)], equation="ij,ij->"),
        Sample([r(2, 3, 4)], equation="ijk->kji"),
        Sample([r(3, 4)], equation="ij->j"),
        Sample([r(4, 4)], equation="ii->i"),
        Sample([r(3, 3)], equation="ii"),
        Sample([r(2, 3, 4), r(4, 5)], equation="...ij,...jk"),
        Sample([r(2, 1, 3), r(4, 3)], equation="...j,...j->..."),
        Sample([r(2, 3), r(3, 4), r(4, 2)], equation="ab,bc,cd->ad"),
        Sample([r(3, 5), r(2, 5, 4), r(3, 4)], equation="bn,anm,bm->ba"),
        Sample([r(2, 1), r(3, 5)], equation="ij,jk->ik"),
        Sample([r(2, 3), r(3)], equation="Ab,b->A"),
        Sample([r(4), r()], equation="i,->i"),
        Sample([r(3, 4), r(4, 2)], equation=" ij , jk -> ki "),
        Sample([r(2, 3, 3), r(2, 3)], equation="bii,bi->b"),
        Sample([r(3, 4, dtype=np.float32), r(4, 2, dtype=np.float32)], equation="ij,jk",
               grad=False),
        Sample([_ints(rng, 3, 4), _ints(rng, 4)], equation="ij,j->i", grad=False),
        Sample([_ints(rng, 3, 4, dtype=np.int32)], equation="ij->i", grad=False),
    ]


register(OpDef(
    "einsum",
    inputs=("*operands",),
    attrs={"equation": Attr("str")},
    infer_meta=_einsum_meta,
    kernel=_einsum_kernel,
    saves=("operands",),
    grad=_einsum_grad,
    sbp=_einsum_sbp,
    reference=_einsum_reference,
    samples=_einsum_samples,
))


# -- decompositions -------------------------------------------------------------------------
# inv, det, slogdet, solve, cholesky, eigh, svd and qr over batches of matrices (*, m, n).
# The kernels run NumPy's LAPACK-backed `numpy.linalg` (vectorised over the batch) on host
# views: the primitive set has no decomposition primitive, and on the CPU device `to_host` is
# the array itself.  A device with its own solver (cuSOLVER) would add one.  Batch axes split
# freely (each matrix is independent); nothing splits the matrix axes.
class LinAlgError(RuntimeError):
    """torch.linalg.LinAlgError: a singular or not positive-definite input."""


_C_TYPE = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
           "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
           "float64": "Double"}


def _la_error(name, msg, cls=RuntimeError):
    return cls(f"{name}: {msg}")


def _check_matrix(name, a, square=True, arg="A"):
    """torch's checks for a batch of matrices: at least 2-D, float32/64, square if asked."""
    if a.ndim < 2:
        raise _la_error(name, f"The input tensor {arg} must have at least 2 dimensions.")
    if not a.dtype.is_floating_point:
        raise _la_error(name, "Expected a floating point or complex tensor as input. Got "
                        f"{_C_TYPE.get(a.dtype.name, a.dtype.name)}")
    if a.dtype not in (dt.float32, dt.float64):
        raise _la_error(name, "Low precision dtypes not supported. Got "
                        f"{_C_TYPE.get(a.dtype.name, a.dtype.name)}")
    if square and a.shape[-1] != a.shape[-2]:
        raise _la_error(name, f"{arg} must be batches of square matrices, but they are "
                        f"{a.shape[-2]} by {a.shape[-1]} matrices")


def _batch_sbp(n_out):
    """(B)->B..., and (S(i))->S(i)... for each batch axis i of size > 1."""
    def sbp(a, **attrs):
        sigs = [Signature((B,), (B,) * n_out)]
        for i in range(a.ndim - 2):
            if a.shape[i] > 1:  # (S(i))->S(i): the matrices of a batch are independent
                sigs.append(Signature((Split(i),), (Split(i),) * n_out))
        return sigs

    return sbp


def _host(ctx, x):
    return ctx.prims.to_host(x)


def _device(ctx, x, i=0):
    return ctx.prims.from_host(np.asarray(x), ctx.out_metas[i].dtype)


def _mT(x):
    return op("transpose", x, dim0=-1, dim1=-2)


def _diag_embed(x, n):
    """x (*, n) -> (*, n, n) with x on the diagonal (the adjoint of taking the diagonal)."""
    shape = tuple(x.shape) + (n,)
    return op("diagonal_grad", x, shape=shape, offset=0, dim1=len(shape) - 2,
              dim2=len(shape) - 1)


def _eye_like(x, n):
    """The identity of size n, broadcast over x's batch (x: (*, n)); made from x so that it
    follows x's device, placement and SBP."""
    return _diag_embed(op("add_scalar", op("mul_scalar", x, other=0.0), other=1.0), n)


def _diag_of(x):
    return op("diagonal", x, offset=0, dim1=x.ndim - 2, dim2=x.ndim - 1)


def _batch_prefix(shape, k):
    """torch's "(Batch element k): " for batched inputs."""
    return f"(Batch element {k}): " if len(shape) > 2 else ""


def _lu_info(x):
    """Per matrix: the 1-based index of the first exactly-zero pivot of LU with partial
    pivoting (LAPACK getrf's info), 0 where there is none.  A loop over the columns,
    vectorised over the batch; only run when NumPy reported a singular matrix."""
    u = np.array(x.reshape((-1,) + x.shape[-2:]), copy=True)
    nb, n = u.shape[0], u.shape[-1]
    info = np.zeros(nb, np.int32)
    rows = np.arange(nb)
    for k in range(n):
        p = k + np.argmax(np.abs(u[:, k:, k]), axis=1)
        piv = u[rows, p, k]
        zero = piv == 0
        info[zero & (info == 0)] = k + 1
        row_k = u[rows, k].copy()
        u[rows, k] = u[rows, p]
        u[rows, p] = row_k
        # A zero pivot has a zero column below it: nothing to eliminate (factor 0).
        f = u[:, k + 1:, k] / np.where(zero, 1, piv)[:, None]
        u[:, k + 1:, k:] -= f[:, :, None] * u[:, None, k, k:]
    return info.reshape(x.shape[:-2])


def _cholesky_info(x):
    """Per matrix: the order of the first leading minor that is not positive-definite (LAPACK
    potrf's info, 0 where none) and the factor as potf2 leaves it (columns before the failing
    one factored, the failing pivot updated, the rest of the lower triangle untouched).  A loop
    over the columns, vectorised over the batch; only run when NumPy reported a failure."""
    a = x.reshape((-1,) + x.shape[-2:])
    nb, n = a.shape[0], a.shape[-1]
    lo = np.tril(a).copy()
    info = np.zeros(nb, np.int32)
    for j in range(n):
        live = info == 0
        d = a[:, j, j] - np.sum(lo[:, j, :j] ** 2, axis=1)
        bad = live & ~(d > 0)
        info[bad] = j + 1
        lo[bad, j, j] = d[bad]
        ok = live & (d > 0)
        ljj = np.sqrt(np.where(ok, d, 1))
        below = (a[:, j + 1:, j] - np.einsum("bik,bk->bi", lo[:, j + 1:, :j], lo[:, j, :j])
                 ) / ljj[:, None]
        lo[ok, j, j] = ljj[ok]
        lo[ok, j + 1:, j] = below[ok]
    return info.reshape(x.shape[:-2]), lo.reshape(x.shape)


def _first_failure(info):
    """(batch index, info) of the first failed matrix, or None."""
    flat = info.reshape(-1)
    bad = np.flatnonzero(flat)
    return None if bad.size == 0 else (int(bad[0]), int(flat[bad[0]]))


def _singular_error(name, x, text, info=None):
    """LinAlgError naming the first singular matrix of the batch (error path only)."""
    info = _lu_info(x) if info is None else info
    first = _first_failure(info)
    k, pivot = first if first is not None else (0, 0)
    return _la_error(name, _batch_prefix(x.shape, k) + text(pivot), LinAlgError)


def _not_pd_error(name, shape, info):
    k, order = _first_failure(info)
    return _la_error(name, _batch_prefix(shape, k) + (
        "The factorization could not be completed because the input is not positive-definite "
        f"(the leading minor of order {order} is not positive-definite)."), LinAlgError)


def _square_samples(rng, dtype=np.float64):
    """Well-conditioned square matrices: random plus a multiple of the identity."""
    def m(*shape):
        n = shape[-1]
        return (rng.standard_normal(shape) + n * np.eye(n)).astype(dtype)

    return m


def _spd(rng, *shape, dtype=np.float64):
    """Symmetric positive-definite matrices: X X^T + n I."""
    x = rng.standard_normal(shape)
    n = shape[-1]
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)


# -- inv ------------------------------------------------------------------------------------
def _inv_meta(a):
    _check_matrix("linalg.inv", a)
    return a


def _inv_kernel(ctx, a):
    x = _host(ctx, a)
    try:
        r = np.linalg.inv(x)
    except np.linalg.LinAlgError:
        raise _singular_error("linalg.inv", x, lambda k: (
            f"The diagonal element {k} is zero, the inversion could not be completed because "
            "the input matrix is singular.")) from None
    return _device(ctx, r)


def _inv_grad(ctx, g):
    # d(A^-1) = -A^-1 dA A^-1, so dA = -A^-T g A^-T.
    inv_t = _mT(ctx.output(0))
    return (op("neg", op("matmul", op("matmul", inv_t, g), inv_t)),)


register(OpDef(
    "linalg_inv",
    inputs=("A",),
    infer_meta=_inv_meta,
    kernel=_inv_kernel,
    saves=("out",),
    grad=_inv_grad,
    sbp=_batch_sbp(1),
    reference="linalg.inv",
    samples=lambda rng: [
        Sample(_square_samples(rng)(3, 3)),
        Sample(_square_samples(rng)(2, 3, 4, 4)),
        Sample(_square_samples(rng)(1, 1)),
        Sample(_square_samples(rng, np.float32)(3, 2, 2)),
    ],
))


# -- det, slogdet ---------------------------------------------------------------------------
def _det_meta(a):
    _check_matrix("linalg.det", a)
    return TensorMeta(a.shape[:-2], a.dtype)


def _det_grad(ctx, g):
    # d det(A) = <cof(A), dA>: the cofactor matrix det(A) A^-T, also defined for singular A.
    cof = op("linalg_cofactor", ctx.input(0))
    return (op("mul", op("unsqueeze", op("unsqueeze", g, dim=-1), dim=-1), cof),)


register(OpDef(
    "linalg_det",
    inputs=("A",),
    infer_meta=_det_meta,
    kernel=lambda ctx, a: _device(ctx, np.linalg.det(_host(ctx, a))),
    saves=("A",),
    grad=_det_grad,
    sbp=_batch_sbp(1),
    reference="linalg.det",
    samples=lambda rng: [
        Sample(_square_samples(rng)(3, 3)),
        Sample(_square_samples(rng)(2, 3, 2, 2)),
        Sample(_rand(rng, 4, 4)),
        Sample(_square_samples(rng, np.float32)(2, 3, 3)),
    ],
))


def _cofactor_meta(a):
    _check_matrix("linalg.det", a)
    return a


def _exclusive_products(s):
    """p_i = prod_{j != i} s_j along the last axis, without dividing (s may hold zeros)."""
    ones = np.ones(s.shape[:-1] + (1,), s.dtype)
    before = np.cumprod(np.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)
    after = np.cumprod(np.concatenate([ones, s[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    return before * after


def _cofactor_kernel(ctx, a):
    """cof(A) = det(A) A^-T (the gradient of det); for singular matrices through the SVD:
    det(U) det(V) U diag(prod_{j != i} s_j) V^T, which is continuous there."""
    x = _host(ctx, a)
    flat = x.reshape((-1,) + x.shape[-2:])
    det = np.linalg.det(flat)
    try:
        return _device(ctx, (det[:, None, None] * np.swapaxes(np.linalg.inv(flat), -1, -2)
                             ).reshape(x.shape))
    except np.linalg.LinAlgError:
        pass
    good = _lu_info(flat) == 0
    out = np.empty_like(flat)
    if good.any():
        out[good] = det[good, None, None] * np.swapaxes(np.linalg.inv(flat[good]), -1, -2)
    u, sv, vh = np.linalg.svd(flat[~good])
    sign = np.linalg.det(u) * np.linalg.det(vh)
    out[~good] = sign[:, None, None] * (u * _exclusive_products(sv)[:, None, :]) @ vh
    return _device(ctx, out.reshape(x.shape))


def _cofactor_grad(ctx, g):
    # C = d B with d = det(A), B = A^-T: dC = d <B, dA> B - d B dA^T B, so
    # gA = d (<G, B> B - B G^T B) (A invertible).
    a = ctx.input(0)
    b = _mT(op("linalg_inv", a))
    d = op("unsqueeze", op("unsqueeze", op("linalg_det", a), dim=-1), dim=-1)
    inner = op("sum", op("mul", g, b), dim=(-2, -1), keepdim=True)
    ga = op("sub", op("mul", inner, b), op("matmul", op("matmul", b, _mT(g)), b))
    return (op("mul", d, ga),)


def _cofactor_reference(torch, a):
    """C_ij = (-1)^(i+j) det(A without row i and column j), from torch's det of each minor.

    Independent of the kernel's det(A) A^-T and SVD routes, and exact where A is singular:
    torch's own det gradient there goes through an LU whose rounding (and so whether it
    returns zeros) differs between CPUs."""
    n = a.shape[-1]
    if n == 1:
        return torch.ones_like(a)
    rows = []
    for i in range(n):
        keep_r = [k for k in range(n) if k != i]
        rows.append(torch.stack([
            (-1) ** (i + j) * torch.linalg.det(a[..., keep_r, :][..., [k for k in range(n)
                                                                       if k != j]])
            for j in range(n)], dim=-1))
    return torch.stack(rows, dim=-2)


register(OpDef(
    "linalg_cofactor",
    inputs=("A",),
    infer_meta=_cofactor_meta,
    kernel=_cofactor_kernel,
    saves=("A",),
    grad=_cofactor_grad,
    sbp=_batch_sbp(1),
    reference=_cofactor_reference,
    samples=lambda rng: [
        Sample(_square_samples(rng)(3, 3)),
        Sample(_square_samples(rng)(2, 2, 4, 4)),
        Sample(_square_samples(rng, np.float32)(2, 3, 3)),
        # Singular matrices (rank 1 and rank 2 next to an invertible one): the SVD path.
        Sample(np.stack([np.ones((3, 3)), [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]],
                         _rand(rng, 3, 3)]), grad=False),
    ],
))


def _slogdet_meta(a):
    _check_matrix("linalg.slogdet", a)
    m = TensorMeta(a.shape[:-2], a.dtype)
    return m, m


def _slogdet_kernel(ctx, a):
    sign, logabs = np.linalg.slogdet(_host(ctx, a))
    return _device(ctx, sign, 0), _device(ctx, logabs, 1)


def _slogdet_grad(ctx, g_sign, g_logabs):
    # log|det A| has gradient A^-T; the sign is piecewise constant (no gradient).
    if g_logabs is None:
        return (None,)
    inv_t = _mT(op("linalg_inv", ctx.input(0)))
    return (op("mul", op("unsqueeze", op("unsqueeze", g_logabs, dim=-1), dim=-1), inv_t),)


register(OpDef(
    "linalg_slogdet",
    inputs=("A",),
    outputs=("sign", "logabsdet"),
    infer_meta=_slogdet_meta,
    kernel=_slogdet_kernel,
    saves=("A",),
    grad=_slogdet_grad,
    sbp=_batch_sbp(2),
    reference="linalg.slogdet",
    samples=lambda rng: [
        Sample(_rand(rng, 3, 3)),
        Sample(_square_samples(rng)(2, 2, 3, 3)),
        Sample(_square_samples(rng, np.float32)(2, 4, 4)),
    ],
))


# -- solve ----------------------------------------------------------------------------------
def _solve_vector_case(a_shape, b_shape) -> bool:
    """torch: B is a (batch of) vector(s) when 1-D or when B.shape == A.shape[:-1]."""
    return len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1
                                 and tuple(b_shape) == tuple(a_shape[:-1]))


def _solve_meta(a, b):
    _check_matrix("linalg.solve", a)
    if b.dtype is not a.dtype:
        raise _la_error("linalg.solve", "Expected A and B to have the same dtype, but found A "
                        f"of type {_C_TYPE[a.dtype.name]} and B of type "
                        f"{_C_TYPE.get(b.dtype.name, b.dtype.name)} instead")
    vector = _solve_vector_case(a.shape, b.shape)
    b_mat = b.shape + (1,) if vector else b.shape
    if len(b_mat) < 2 or b_mat[-2] != a.shape[-1]:
        shown = "x".join(map(str, b_mat[-2:])) if len(b_mat) >= 2 else f"{b_mat[0]}x1"
        raise _la_error("linalg.solve", "Incompatible shapes of A and B for the equation AX = B "
                        f"({a.shape[-2]}x{a.shape[-1]} and {shown})")
    batch = broadcast_shapes("linalg.solve", a.shape[:-2], b_mat[:-2])
    return TensorMeta(batch + (b_mat[-2],) if vector else batch + b_mat[-2:], a.dtype)


def _solve_kernel(ctx, a, b):
    am, bm = ctx.in_metas
    x, y = _host(ctx, a), _host(ctx, b)
    vector = _solve_vector_case(am.shape, bm.shape)
    try:
        r = np.linalg.solve(x, y[..., None] if vector else y)
    except np.linalg.LinAlgError:
        raise _singular_error("torch.linalg.solve", x, lambda k: (
            "The solver failed because the input matrix is singular.")) from None
    return _device(ctx, r[..., 0] if vector else r)


def _solve_grad(ctx, g):
    # X = A^-1 B: dB = A^-T g, dA = -dB X^T (outer products for the vector case).
    am, bm = ctx.in_metas
    vector = _solve_vector_case(am.shape, bm.shape)
    a = ctx.input(0)
    gb = op("linalg_solve", _mT(a), g)
    ga = None
    if ctx.needs_input_grad[0]:
        x = ctx.output(0)
        if vector:
            outer = op("mul", op("unsqueeze", gb, dim=-1), op("unsqueeze", x, dim=-2))
        else:
            outer = op("matmul", gb, _mT(x))
        ga = unbroadcast(op("neg", outer), am)
    return ga, (unbroadcast(gb, bm) if ctx.needs_input_grad[1] else None)


def _solve_sbp(a, b):
    out = _solve_meta(a, b)
    vector = _solve_vector_case(a.shape, b.shape)
    nb_out = out.ndim - (1 if vector else 2)
    a_batch = a.shape[:-2]
    b_batch = b.shape[:-1] if vector else b.shape[:-2]
    sigs = [Signature((B, B), (B,)), Signature((B, P), (P,))]  # (B,P)->P: linear in B
    for j in range(nb_out):
        ia, ib = j - (nb_out - len(a_batch)), j - (nb_out - len(b_batch))
        sa = Split(ia) if ia >= 0 and a_batch[ia] == out.shape[j] else B
        sb = Split(ib) if ib >= 0 and b_batch[ib] == out.shape[j] else B
        if out.shape[j] > 1:  # (S,S)->S, (S,B)->S, (B,S)->S over batch axis j
            sigs.append(Signature((sa, sb), (Split(j),)))
    if not vector:  # (B,S(-1))->S(-1): each column of B is its own system
        sigs.append(Signature((B, Split(b.ndim - 1)), (Split(out.ndim - 1),)))
    return sigs


register(OpDef(
    "linalg_solve",
    inputs=("A", "B"),
    infer_meta=_solve_meta,
    kernel=_solve_kernel,
    saves=("A", "out for A"),
    grad=_solve_grad,
    sbp=_solve_sbp,
    reference="linalg.solve",
    samples=lambda rng: [
        Sample(_square_samples(rng)(3, 3), _rand(rng, 3)),
        Sample(_square_samples(rng)(3, 3), _rand(rng, 3, 2)),
        Sample(_square_samples(rng)(2, 3, 3), _rand(rng, 2, 3)),
        Sample(_square_samples(rng)(2, 3, 3), _rand(rng, 3, 4)),
        Sample(_square_samples(rng)(3, 3), _rand(rng, 2, 3, 2)),
        Sample(_square_samples(rng)(2, 1, 2, 2), _rand(rng, 3, 2, 1)),
        Sample(_square_samples(rng, np.float32)(2, 4, 4),
               _rand(rng, 2, 4, 3, dtype=np.float32)),
    ],
))


# -- cholesky -------------------------------------------------------------------------------
def _cholesky_meta(a, upper):
    _check_matrix("linalg.cholesky", a)
    return a


def _cholesky_kernel(ctx, a, upper):
    x = _host(ctx, a)
    if upper:  # torch reads the upper triangle then: the lower one of A^T
        x = np.swapaxes(x, -1, -2)
    try:
        lo = np.linalg.cholesky(x)  # reads the lower triangle
    except np.linalg.LinAlgError:
        raise _not_pd_error("linalg.cholesky", x.shape, _cholesky_info(x)[0]) from None
    return _device(ctx, np.swapaxes(lo, -1, -2) if upper else lo)


def _cholesky_grad(ctx, g):
    # torch's rule: with A = L L^T, phi = tril(L^T gL) with its diagonal halved,
    # gA = L^-T phi L^-1, symmetrised.
    lo = ctx.output(0)
    if ctx.attrs["upper"]:
        lo, g = _mT(lo), _mT(g)
    phi = op("tril", op("matmul", _mT(lo), g), diagonal=0)
    n = ctx.in_metas[0].shape[-1]
    phi = op("sub", phi, op("mul_scalar", _diag_embed(_diag_of(phi), n), other=0.5))
    inv = op("linalg_inv", lo)
    ga = op("matmul", op("matmul", _mT(inv), phi), inv)
    return (op("mul_scalar", op("add", ga, _mT(ga)), other=0.5),)


def _cholesky_reference(torch, a, upper=False):
    return torch.linalg.cholesky(a, upper=upper)


register(OpDef(
    "linalg_cholesky",
    inputs=("A",),
    attrs={"upper": Attr("bool", False)},
    infer_meta=_cholesky_meta,
    kernel=_cholesky_kernel,
    saves=("out",),
    grad=_cholesky_grad,
    sbp=_batch_sbp(1),
    reference=_cholesky_reference,
    # float32: the op reads one triangle, so finite differences of single elements do not see
    # the symmetric gradient torch defines (tests/ops/test_linalg_decomp.py checks float64
    # with symmetric perturbations).
    samples=lambda rng: [
        Sample(_spd(rng, 3, 3, dtype=np.float32)),
        Sample(_spd(rng, 2, 3, 4, 4, dtype=np.float32), upper=True),
        Sample(_spd(rng, 2, 2, 2, dtype=np.float32), rtol=1e-3, atol=1e-4),
        Sample(_spd(rng, 2, 3, 3), grad=False),
    ],
))


# -- eigh -----------------------------------------------------------------------------------
# Eigenvectors and singular vectors are unique only up to sign, and LAPACK builds differ
# (torch's MKL and NumPy's OpenBLAS return different signs for the same matrix).  The kernels
# fix the sign deterministically: each vector's entry of largest magnitude is positive.  The
# registry's references apply the same rule to torch's outputs, so the comparison is exact
# (the rule is locally constant, so gradients are those of torch's formulas).
def _fix_sign_np(vectors, axis):
    """Signs (+-1) making each vector's largest-magnitude entry (along `axis`) positive."""
    if vectors.shape[axis] == 0:  # empty vectors: nothing to fix
        shape = list(vectors.shape)
        shape[axis] = 1
        return np.ones(shape, vectors.dtype)
    idx = np.expand_dims(np.argmax(np.abs(vectors), axis=axis), axis)
    s = np.sign(np.take_along_axis(vectors, idx, axis=axis))
    return np.where(s == 0, 1, s).astype(vectors.dtype)


def _fix_sign_torch(torch, vectors, dim):
    """The same rule on torch tensors (for references): the signs along `dim`."""
    idx = vectors.detach().abs().argmax(dim=dim, keepdim=True)
    s = torch.gather(vectors.detach(), dim, idx).sign()
    return torch.where(s == 0, torch.ones_like(s), s)


def _eigh_meta(a, UPLO):
    _check_matrix("linalg.eigh", a)
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    return TensorMeta(a.shape[:-1], a.dtype), a


def _eigh_kernel(ctx, a, UPLO):
    w, v = np.linalg.eigh(_host(ctx, a), UPLO=UPLO)
    v = v * _fix_sign_np(v, -2)
    return _device(ctx, w, 0), _device(ctx, v, 1)


def _eigh_grad(ctx, gw, gv):
    # torch's rule: gA = V (skew(V^T gV) / E + diag(gw)) V^T with E_ij = w_j - w_i and
    # skew(X) = (X - X^T) / 2 (the diagonal of the quotient is then zero).
    w, v = ctx.output(0), ctx.output(1)
    n = ctx.in_metas[0].shape[-1]
    vtgv = op("matmul", _mT(v), gv)
    skew = op("mul_scalar", op("sub", vtgv, _mT(vtgv)), other=0.5)
    e = op("sub", op("unsqueeze", w, dim=-2), op("unsqueeze", w, dim=-1))
    e = op("add", e, _eye_like(w, n))  # 1 on the diagonal (where skew is 0)
    inner = op("add", op("div", skew, e), _diag_embed(gw, n))
    return (op("matmul", op("matmul", v, inner), _mT(v)),)


def _eigh_reference(torch, a, UPLO="L"):
    w, v = torch.linalg.eigh(a, UPLO=UPLO)
    return w, v * _fix_sign_torch(torch, v, -2)


register(OpDef(
    "linalg_eigh",
    inputs=("A",),
    outputs=("eigenvalues", "eigenvectors"),
    attrs={"UPLO": Attr("str", "L")},
    infer_meta=_eigh_meta,
    kernel=_eigh_kernel,
    saves=("eigenvalues", "eigenvectors"),
    grad=_eigh_grad,
    sbp=_batch_sbp(2),
    reference=_eigh_reference,
    # float32 for gradients: eigh reads one triangle (see linalg_cholesky's samples).
    samples=lambda rng: [
        Sample(_spd(rng, 3, 3, dtype=np.float32), rtol=1e-3, atol=1e-4),
        Sample(_spd(rng, 2, 3, 3, dtype=np.float32), UPLO="U", rtol=1e-3, atol=1e-4),
        Sample(_spd(rng, 2, 2, 4, 4), grad=False),
    ],
))


# -- svd ------------------------------------------------------------------------------------
def _svd_meta(a, full_matrices):
    _check_matrix("linalg.svd", a, square=False)
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    if full_matrices:
        return (TensorMeta(batch + (m, m), a.dtype), TensorMeta(batch + (k,), a.dtype),
                TensorMeta(batch + (n, n), a.dtype))
    return (TensorMeta(batch + (m, k), a.dtype), TensorMeta(batch + (k,), a.dtype),
            TensorMeta(batch + (k, n), a.dtype))


def _svd_kernel(ctx, a, full_matrices):
    x = _host(ctx, a)
    u, s, vh = np.linalg.svd(x, full_matrices=full_matrices)
    k = s.shape[-1]
    sign = _fix_sign_np(u, -2)  # (*, 1, cols of U)
    u = u * sign
    vh = vh.copy()
    vh[..., :k, :] *= np.swapaxes(sign[..., :k], -1, -2)
    return _device(ctx, u, 0), _device(ctx, s, 1), _device(ctx, vh, 2)


def _narrow_last(x, dim, k):
    if x.shape[dim] == k:
        return x
    return op("narrow", x, dim=dim, start=0, length=k)


def _svd_grad(ctx, gu, gs, gvh):
    # torch's rule (real case), with the first k = min(m, n) singular vectors:
    #   gA = U [ (J S + S K) / E + diag(gS) ] V^T + (I - U U^T) gU S^-1 V^T
    #        + U S^-1 gV^T (I - V V^T),
    # J = U^T gU - gU^T U, K = V^T gV - gV^T V, E_ij = s_j^2 - s_i^2 (1 on the diagonal).
    m, n = ctx.in_metas[0].shape[-2:]
    u, s, vh = ctx.output(0), ctx.output(1), ctx.output(2)
    k = min(m, n)
    u, gu = _narrow_last(u, -1, k), _narrow_last(gu, -1, k)
    vh, gvh = _narrow_last(vh, -2, k), _narrow_last(gvh, -2, k)
    v, gv = _mT(vh), _mT(gvh)
    utgu = op("matmul", _mT(u), gu)
    vtgv = op("matmul", vh, gv)
    j = op("sub", utgu, _mT(utgu))
    kk = op("sub", vtgv, _mT(vtgv))
    s_row, s_col = op("unsqueeze", s, dim=-2), op("unsqueeze", s, dim=-1)
    s2 = op("mul", s, s)
    e = op("sub", op("unsqueeze", s2, dim=-2), op("unsqueeze", s2, dim=-1))
    e = op("add", e, _eye_like(s, k))
    inner = op("div", op("add", op("mul", j, s_row), op("mul", s_col, kk)), e)
    inner = op("add", inner, _diag_embed(gs, k))
    ga = op("matmul", op("matmul", u, inner), vh)
    if m > k:  # (I - U U^T) gU S^-1 V^T
        proj = op("sub", gu, op("matmul", u, utgu))
        ga = op("add", ga, op("matmul", op("div", proj, s_row), vh))
    if n > k:  # U S^-1 gV^T (I - V V^T)
        proj = op("sub", gv, op("matmul", v, vtgv))
        ga = op("add", ga, op("matmul", u, op("div", _mT(proj), s_col)))
    return (ga,)


def _svd_reference(torch, a, full_matrices=True):
    u, s, vh = torch.linalg.svd(a, full_matrices=full_matrices)
    k = s.shape[-1]
    sign = _fix_sign_torch(torch, u, -2)
    vh_sign = torch.ones(vh.shape[:-1] + (1,), dtype=vh.dtype)
    vh_sign[..., :k, :] = sign[..., :k].mT
    return u * sign, s, vh * vh_sign


register(OpDef(
    "linalg_svd",
    inputs=("A",),
    outputs=("U", "S", "Vh"),
    attrs={"full_matrices": Attr("bool", True)},
    infer_meta=_svd_meta,
    kernel=_svd_kernel,
    saves=("U", "S", "Vh"),
    grad=_svd_grad,
    sbp=_batch_sbp(3),
    reference=_svd_reference,
    # full_matrices=True on square matrices only: the extra columns of U (or rows of Vh) are
    # any orthonormal basis of a complement, so no two LAPACKs need agree on them.
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3), full_matrices=False),
        Sample(_rand(rng, 3, 5), full_matrices=False),
        Sample(_rand(rng, 2, 3, 3, 3)),
        Sample(_rand(rng, 2, 4, 2), full_matrices=False),
        Sample(_rand(rng, 2, 3, 4, dtype=np.float32), full_matrices=False, rtol=1e-3,
               atol=1e-4),
    ],
))


# -- qr -------------------------------------------------------------------------------------
_QR_MODES = ("reduced", "complete", "r")


def _qr_meta(a, mode):
    if mode not in _QR_MODES:
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of "
                           "'reduced' (default), 'r', or 'complete'")
    _check_matrix("linalg.qr", a, square=False)
    m, n = a.shape[-2:]
    k = m if mode == "complete" else min(m, n)
    batch = a.shape[:-2]
    q = TensorMeta((0,), a.dtype) if mode == "r" else TensorMeta(batch + (m, k), a.dtype)
    return q, TensorMeta(batch + (k, n), a.dtype)


def _qr_kernel(ctx, a, mode):
    x = _host(ctx, a)
    if mode == "r":
        return _device(ctx, np.empty((0,)), 0), _device(ctx, np.linalg.qr(x, mode="r"), 1)
    q, r = np.linalg.qr(x, mode=mode)
    return _device(ctx, q, 0), _device(ctx, r, 1)


def _qr_grad_tall(q, r, gq, gr):
    """A = QR with m >= n (Q m x n, R n x n): gA = (gQ + Q copyltu(M)) R^-T with
    M = R gR^T - gQ^T Q, copyltu(M) = tril(M) + tril(M, -1)^T."""
    mm = op("sub", op("matmul", r, _mT(gr)), op("matmul", _mT(gq), q))
    sym = op("add", op("tril", mm, diagonal=0), _mT(op("tril", mm, diagonal=-1)))
    b = op("add", gq, op("matmul", q, sym))
    # B R^-T = (R^-1 B^T)^T: a solve against the triangular R.
    return _mT(op("linalg_solve", r, _mT(b)))


def _qr_grad(ctx, gq, gr):
    mode = ctx.attrs["mode"]
    m, n = ctx.in_metas[0].shape[-2:]
    if mode == "r":
        raise RuntimeError("The derivative of linalg.qr depends on Q, which is not computed "
                           "when mode='r'. Please use linalg.qr(A, mode='reduced') if you are "
                           "going to differentiate through linalg.qr.")
    if mode == "complete" and m > n:
        raise RuntimeError("The QR decomposition is not differentiable when mode='complete' "
                           "and nrows > ncols.")
    q, r = ctx.output(0), ctx.output(1)
    if m >= n:
        return (_qr_grad_tall(q, r, gq, gr),)
    # m < n: A = [X | Y] with X = Q U (square QR) and Y = Q V, V = Q^T Y.  Then
    # gY = Q gV and X sees gQ + Y gV^T through V.
    a = ctx.input(0)
    u = op("narrow", r, dim=-1, start=0, length=m)
    gu = op("narrow", gr, dim=-1, start=0, length=m)
    gv = op("narrow", gr, dim=-1, start=m, length=n - m)
    y = op("narrow", a, dim=-1, start=m, length=n - m)
    gx = _qr_grad_tall(q, u, op("add", gq, op("matmul", y, _mT(gv))), gu)
    return (op("cat", (gx, op("matmul", q, gv)), dim=-1),)


register(OpDef(
    "linalg_qr",
    inputs=("A",),
    outputs=("Q", "R"),
    attrs={"mode": Attr("str", "reduced")},
    infer_meta=_qr_meta,
    kernel=_qr_kernel,
    saves=("A", "Q", "R"),
    grad=_qr_grad,
    sbp=_batch_sbp(2),
    reference=lambda torch, a, mode="reduced": torch.linalg.qr(a, mode=mode),
    # LAPACK's Householder QR fixes the signs (R's diagonal as geqrf leaves it): torch's MKL
    # and NumPy's OpenBLAS agree, so Q and R are compared as they are.
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3)),
        Sample(_rand(rng, 3, 3)),
        Sample(_rand(rng, 2, 3, 5)),
        Sample(_rand(rng, 2, 2, 4, 2), mode="complete", grad=False),
        Sample(_rand(rng, 2, 3, 3), mode="complete"),
        Sample(_rand(rng, 5, 3), mode="r", grad=False),
        Sample(_rand(rng, 2, 4, 3, dtype=np.float32), rtol=1e-4, atol=1e-5),
    ],
))


# -- inv_ex, cholesky_ex --------------------------------------------------------------------
# The same factorisations returning LAPACK's `info` per matrix (int32) instead of raising:
# 0 for success, else the failing pivot (inv) or leading minor (cholesky).  The fast path is
# the batched NumPy call; only when it fails do the column loops above find each info.
def _inv_ex_meta(a, check_errors):
    _check_matrix("linalg.inv", a)
    return a, TensorMeta(a.shape[:-2], dt.int32)


def _inv_ex_kernel(ctx, a, check_errors):
    x = _host(ctx, a)
    try:
        return _device(ctx, np.linalg.inv(x), 0), _device(ctx, np.zeros(x.shape[:-2]), 1)
    except np.linalg.LinAlgError:
        pass
    info = _lu_info(x)
    if check_errors:
        raise _singular_error("linalg.inv_ex", x, lambda k: (
            f"The diagonal element {k} is zero, the inversion could not be completed because "
            "the input matrix is singular."), info)
    # Invertible matrices get their inverse; singular ones NaN (torch: what LAPACK left).
    flat = x.reshape((-1,) + x.shape[-2:])
    good = info.reshape(-1) == 0
    out = np.full(flat.shape, np.nan, flat.dtype)
    if good.any():
        out[good] = np.linalg.inv(flat[good])
    return _device(ctx, out.reshape(x.shape), 0), _device(ctx, info, 1)


register(OpDef(
    "linalg_inv_ex",
    inputs=("A",),
    outputs=("inverse", "info"),
    attrs={"check_errors": Attr("bool", False)},
    infer_meta=_inv_ex_meta,
    kernel=_inv_ex_kernel,
    saves=("inverse",),
    grad=lambda ctx, g, g_info: _inv_grad(ctx, g),
    sbp=_batch_sbp(2),
    reference=lambda torch, a, check_errors=False: torch.linalg.inv_ex(
        a, check_errors=check_errors),
    samples=lambda rng: [
        Sample(_square_samples(rng)(2, 3, 3)),
        Sample(_square_samples(rng)(4, 4), check_errors=True),
        Sample(_square_samples(rng, np.float32)(3, 2, 2)),
    ],
))


def _cholesky_ex_meta(a, upper, check_errors):
    _check_matrix("linalg.cholesky", a)
    return a, TensorMeta(a.shape[:-2], dt.int32)


def _cholesky_ex_kernel(ctx, a, upper, check_errors):
    x = _host(ctx, a)
    if upper:  # the upper triangle, as linalg_cholesky
        x = np.swapaxes(x, -1, -2)
    try:
        lo, info = np.linalg.cholesky(x), np.zeros(x.shape[:-2], np.int32)
    except np.linalg.LinAlgError:
        info, lo = _cholesky_info(x)
        if check_errors:
            raise _not_pd_error("linalg.cholesky_ex", x.shape, info) from None
        flat, lo_flat = x.reshape((-1,) + x.shape[-2:]), lo.reshape((-1,) + x.shape[-2:])
        good = info.reshape(-1) == 0
        if good.any():  # LAPACK's factor for the matrices that have one
            lo_flat[good] = np.linalg.cholesky(flat[good])
    return _device(ctx, np.swapaxes(lo, -1, -2) if upper else lo, 0), _device(ctx, info, 1)


def _cholesky_ex_grad(ctx, g, g_info):
    return _cholesky_grad(ctx, g)


register(OpDef(
    "linalg_cholesky_ex",
    inputs=("A",),
    outputs=("L", "info"),
    attrs={"upper": Attr("bool", False), "check_errors": Attr("bool", False)},
    infer_meta=_cholesky_ex_meta,
    kernel=_cholesky_ex_kernel,
    saves=("L",),
    grad=_cholesky_ex_grad,
    sbp=_batch_sbp(2),
    reference=lambda torch, a, upper=False, check_errors=False: torch.linalg.cholesky_ex(
        a, upper=upper, check_errors=check_errors),
    # float32 for gradients, as linalg_cholesky's samples.
    samples=lambda rng: [
        Sample(_spd(rng, 2, 3, 3, dtype=np.float32), rtol=1e-3, atol=1e-4),
        Sample(_spd(rng, 4, 4, dtype=np.float32), upper=True, rtol=1e-3, atol=1e-4),
        Sample(_spd(rng, 3, 2, 2), check_errors=True, grad=False),
        # A batch with a failing matrix: info 3, its factor as potf2 leaves it.
        Sample(np.stack([_spd(rng, 3, 3), np.diag([1.0, 2.0, -1.0])]), grad=False),
    ],
))


# -- lu_factor_ex, lu_permutation ------------------------------------------------------------
# LU with partial pivoting (LAPACK getrf: A = P L U, unit-diagonal L and U packed in one
# matrix, 1-based row swaps in `pivots`).  NumPy has no LU, so the kernel is getrf's column
# loop, vectorised over the batch: n steps of batched rank-1 updates.
def _lu_factor_meta(a, pivot, check_errors):
    _check_matrix("linalg.lu_factor", a, square=False)
    if not pivot:
        raise _la_error("linalg.lu_factor", "LU without pivoting is not implemented on the CPU")
    k = min(a.shape[-2:])
    return (a, TensorMeta(a.shape[:-2] + (k,), dt.int32),
            TensorMeta(a.shape[:-2], dt.int32))


def _lu_factor_np(x):
    """(LU, pivots, info) of getrf for a batch (*, m, n)."""
    m, n = x.shape[-2:]
    k = min(m, n)
    u = np.array(x.reshape((-1, m, n)), copy=True)
    nb = u.shape[0]
    piv = np.zeros((nb, k), np.int32)
    info = np.zeros(nb, np.int32)
    rows = np.arange(nb)
    for j in range(k):
        p = j + np.argmax(np.abs(u[:, j:, j]), axis=1)
        piv[:, j] = p + 1
        row_j = u[rows, j].copy()
        u[rows, j] = u[rows, p]
        u[rows, p] = row_j
        d = u[:, j, j]
        zero = d == 0
        info[zero & (info == 0)] = j + 1
        # getrf leaves a zero pivot's column as it is (all zeros below it anyway).
        u[:, j + 1:, j] /= np.where(zero, 1, d)[:, None]
        u[:, j + 1:, j + 1:] -= u[:, j + 1:, j, None] * u[:, None, j, j + 1:]
    batch = x.shape[:-2]
    return u.reshape(x.shape), piv.reshape(batch + (k,)), info.reshape(batch)


def _lu_factor_kernel(ctx, a, pivot, check_errors):
    lu, piv, info = _lu_factor_np(_host(ctx, a))
    if check_errors:
        first = _first_failure(info)
        if first is not None:
            k, j = first
            raise _la_error("torch.linalg.lu_factor", _batch_prefix(lu.shape, k) + (
                f"U[{j},{j}] is zero and using it on lu_solve would result in a division by "
                "zero. If you still want to perform the factorization, consider calling "
                "linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)"))
    return _device(ctx, lu, 0), _device(ctx, piv, 1), _device(ctx, info, 2)


def permutation_matrix(perm, dtype):
    """P with P[perm[i], i] = 1 (so (P^T A)[i] = A[perm[i]]), from int64 perm (*, m).  The
    row indices come from perm itself (a running count), so they follow its placement."""
    ones = op("add_scalar", op("mul_scalar", perm, other=0), other=1)
    rows = op("sub_scalar", op("cumsum", ones, dim=-1, dtype=None), other=1)
    hit = op("eq", op("unsqueeze", rows, dim=-1), op("unsqueeze", perm, dim=-2))
    return op("to_dtype", hit, dtype=dtype)


def _lu_factor_grad(ctx, g, g_piv, g_info):
    # torch's rule (square A = P L U): with gL = tril(g, -1), gU = triu(g),
    # gA = P L^-T (tril(L^T gL, -1) + triu(gU U^T)) U^-T.
    m, n = ctx.in_metas[0].shape[-2:]
    if m != n:
        raise NotImplementedError("linalg.lu_factor: the derivative is implemented for square "
                                  f"matrices only, got {m} by {n}")
    lu, piv = ctx.output(0), ctx.output(1)
    lo = op("add", op("tril", lu, diagonal=-1), _eye_like(_diag_of(lu), n))
    up = op("triu", lu, diagonal=0)
    phi = op("add", op("tril", op("matmul", _mT(lo), op("tril", g, diagonal=-1)), diagonal=-1),
             op("triu", op("matmul", op("triu", g, diagonal=0), _mT(up)), diagonal=0))
    # L^-T phi U^-T = (U^-1 (L^-1 phi^T))^T... with the triangles inverted by solves.
    x = op("linalg_solve", _mT(lo), phi)
    x = _mT(op("linalg_solve", up, _mT(x)))
    perm = op("lu_permutation", piv, m=m)
    return (op("matmul", permutation_matrix(perm, ctx.in_metas[0].dtype), x),)


def _lu_reference(torch, a, pivot=True, check_errors=False):
    return torch.linalg.lu_factor_ex(a, pivot=pivot, check_errors=check_errors)


register(OpDef(
    "linalg_lu_factor_ex",
    inputs=("A",),
    outputs=("LU", "pivots", "info"),
    attrs={"pivot": Attr("bool", True), "check_errors": Attr("bool", False)},
    infer_meta=_lu_factor_meta,
    kernel=_lu_factor_kernel,
    saves=("LU", "pivots"),
    grad=_lu_factor_grad,
    sbp=_batch_sbp(3),
    reference=_lu_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 3, 3)),
        Sample(_rand(rng, 2, 4, 4)),
        Sample(_rand(rng, 2, 4, 3), grad=False),
        Sample(_rand(rng, 3, 5), grad=False),
        Sample(_rand(rng, 3, 3), check_errors=True),
        Sample(_rand(rng, 2, 3, 3, dtype=np.float32), rtol=1e-4, atol=1e-5),
        Sample(np.stack([np.eye(3), np.diag([1.0, 0.0, 2.0])]), grad=False),
    ],
))


def _lu_permutation_meta(pivots, m):
    if pivots.dtype is not dt.int32 or pivots.ndim < 1:
        raise RuntimeError("lu_unpack: LU_pivots is expected to be a contiguous tensor of "
                           "torch.int32 dtype")
    if pivots.shape[-1] > m:
        raise RuntimeError(f"lu_unpack: {pivots.shape[-1]} pivots for matrices of {m} rows")
    return TensorMeta(pivots.shape[:-1] + (m,), dt.int64)


def _lu_permutation_kernel(ctx, pivots, m):
    # The row swaps applied in order to 0..m-1: row i of P^T A is row perm[i] of A.
    piv = np.asarray(_host(ctx, pivots), np.int64) - 1
    flat = piv.reshape((-1, piv.shape[-1]))
    perm = np.broadcast_to(np.arange(m), (flat.shape[0], m)).copy()
    rows = np.arange(flat.shape[0])
    for j in range(flat.shape[1]):
        p = flat[:, j]
        at_j = perm[rows, j].copy()
        perm[rows, j] = perm[rows, p]
        perm[rows, p] = at_j
    return _device(ctx, perm.reshape(piv.shape[:-1] + (m,)))


def _lu_permutation_reference(torch, pivots, m):
    k = pivots.shape[-1]
    lu = torch.zeros(pivots.shape[:-1] + (m, k), dtype=torch.float64)
    p, _, _ = torch.lu_unpack(lu, pivots)
    return p.argmax(-2)


def _pivot_samples(rng):
    def piv(*shape, m):
        k = shape[-1]
        return (np.arange(k) + rng.integers(0, m - np.arange(k), shape) + 1).astype(np.int32)
    return [Sample(piv(4, m=4), m=4), Sample(piv(2, 3, m=5), m=5), Sample(piv(3, 2, m=2), m=2)]


register(OpDef(
    "lu_permutation",
    inputs=("pivots",),
    attrs={"m": Attr("int")},
    infer_meta=_lu_permutation_meta,
    kernel=_lu_permutation_kernel,
    sbp=lambda pivots, m: [Signature((B,), (B,))] + [
        Signature((Split(i),), (Split(i),)) for i in range(pivots.ndim - 1)
        if pivots.shape[i] > 1],  # (S(i))->S(i): each matrix's swaps are its own
    reference=_lu_permutation_reference,
    samples=_pivot_samples,
))


# -- solve_triangular -----------------------------------------------------------------------
def _tri_solve_meta(a, b, upper, unitriangular):
    name = "linalg.solve_triangular"
    _check_matrix(name, a)
    if b.ndim < 2:
        raise _la_error(name, "The input tensor B must have at least 2 dimensions.")
    if b.dtype is not a.dtype:
        raise _la_error(name, "Expected A and B to have the same dtype, but found A of type "
                        f"{_C_TYPE[a.dtype.name]} and B of type "
                        f"{_C_TYPE.get(b.dtype.name, b.dtype.name)} instead")
    if b.shape[-2] != a.shape[-1]:
        raise _la_error(name, "Incompatible shapes of A and B for the equation AX = B "
                        f"({a.shape[-2]}x{a.shape[-1]} and {b.shape[-2]}x{b.shape[-1]})")
    batch = broadcast_shapes(name, a.shape[:-2], b.shape[:-2])
    return TensorMeta(batch + b.shape[-2:], a.dtype)


def _triangle_np(a, upper, unitriangular):
    t = np.triu(a) if upper else np.tril(a)
    if unitriangular:
        n = a.shape[-1]
        t[..., np.arange(n), np.arange(n)] = 1
    return t


def _substitute(t, b, upper):
    """Forward or back substitution, vectorised over the batch and the right-hand sides; a
    zero on the diagonal gives inf/nan, as LAPACK's trsm (no error)."""
    batch = np.broadcast_shapes(t.shape[:-2], b.shape[:-2])
    t = np.broadcast_to(t, batch + t.shape[-2:])
    x = np.array(np.broadcast_to(b, batch + b.shape[-2:]), copy=True)
    n = t.shape[-1]
    order = range(n - 1, -1, -1) if upper else range(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in order:
            if upper:
                acc = np.einsum("...j,...jk->...k", t[..., i, i + 1:], x[..., i + 1:, :])
            else:
                acc = np.einsum("...j,...jk->...k", t[..., i, :i], x[..., :i, :])
            x[..., i, :] = (x[..., i, :] - acc) / t[..., i, i, None]
    return x


def _tri_solve_kernel(ctx, a, b, upper, unitriangular):
    t = _triangle_np(_host(ctx, a), upper, unitriangular)
    y = _host(ctx, b)
    try:
        x = np.linalg.solve(t, y)
    except np.linalg.LinAlgError:  # a zero on the diagonal: inf/nan instead of an error
        x = _substitute(t, y, upper)
    return _device(ctx, x)


def _tri_solve_grad(ctx, g):
    # X = T^-1 B with T A's triangle: dB = T^-T g, dA = -(dB X^T) on the triangle read.
    am, bm = ctx.in_metas
    upper, unit = ctx.attrs["upper"], ctx.attrs["unitriangular"]
    a = ctx.input(0)
    gb = op("linalg_solve_triangular", _mT(a), g, upper=not upper, unitriangular=unit)
    ga = None
    if ctx.needs_input_grad[0]:
        outer = op("neg", op("matmul", gb, _mT(ctx.output(0))))
        k = (1 if upper else -1) if unit else 0
        ga = unbroadcast(op("triu" if upper else "tril", outer, diagonal=k), am)
    return ga, (unbroadcast(gb, bm) if ctx.needs_input_grad[1] else None)


def _tri_solve_sbp(a, b, upper, unitriangular):
    out = _tri_solve_meta(a, b, upper, unitriangular)
    nb = out.ndim - 2
    sigs = [Signature((B, B), (B,)), Signature((B, P), (P,)),  # (B,P)->P: linear in B
            Signature((B, Split(b.ndim - 1)), (Split(out.ndim - 1),))]  # columns of B
    for j in range(nb):
        ia, ib = j - (nb - (a.ndim - 2)), j - (nb - (b.ndim - 2))
        sa = Split(ia) if ia >= 0 and a.shape[ia] == out.shape[j] else B
        sb = Split(ib) if ib >= 0 and b.shape[ib] == out.shape[j] else B
        if out.shape[j] > 1:  # batch axis j: independent systems
            sigs.append(Signature((sa, sb), (Split(j),)))
    return sigs


def _tri_solve_reference(torch, a, b, upper, unitriangular=False):
    return torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=unitriangular)


register(OpDef(
    "linalg_solve_triangular",
    inputs=("A", "B"),
    attrs={"upper": Attr("bool"), "unitriangular": Attr("bool", False)},
    infer_meta=_tri_solve_meta,
    kernel=_tri_solve_kernel,
    saves=("A", "out for A"),
    grad=_tri_solve_grad,
    sbp=_tri_solve_sbp,
    reference=_tri_solve_reference,
    samples=lambda rng: [
        Sample(_square_samples(rng)(3, 3), _rand(rng, 3, 2), upper=True),
        Sample(_square_samples(rng)(2, 3, 3), _rand(rng, 2, 3, 4), upper=False),
        Sample(_square_samples(rng)(2, 1, 3, 3), _rand(rng, 3, 3, 1), upper=True,
               unitriangular=True),
        Sample(_square_samples(rng)(4, 4), _rand(rng, 2, 4, 2), upper=False,
               unitriangular=True),
        Sample(_square_samples(rng, np.float32)(2, 3, 3), _rand(rng, 2, 3, 2, dtype=np.float32),
               upper=True),
        # (A zero on the diagonal gives inf/nan without an error: tested beside, as partial
        # sums of inf/nan cannot match for the (B,P)->P check.)
    ],
))
