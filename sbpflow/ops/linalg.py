"""Matrix products: matmul, mm, bmm, dot, outer and einsum.

einsum runs as a chain of pairwise contractions, each one batched `matmul` primitive after a
permute and reshape (the fast path NumPy and cuBLAS offer), with diagonals, broadcast size-1
axes and labels summed early handled per operand first.  Its gradient is einsum again: the
output gradient contracted with the other operands.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .._core import dtype as dt
from .._core.errors import broadcast_shapes, op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, einsum_signatures
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


def _reshape(ctx, x, shape):
    """A reshape that copies only when the array's strides do not allow a view."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    try:
        return ctx.prims.reshape(x, shape)
    except (ValueError, AttributeError):
        return ctx.prims.reshape(ctx.prims.contiguous(x), shape)


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
        t.x = _reshape(ctx, t.x, [n for i, n in enumerate(t.x.shape) if i not in drop])
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
    xa = _reshape(ctx, xa, batch_shape + [m, k])
    xb = _reshape(ctx, xb, batch_shape + [k, n])
    out = ctx.prims.matmul(xa, xb)
    out = _reshape(ctx, out, batch_shape + a_sizes + b_sizes)
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
