"""Builders for the candidate SBP signatures of common op shapes.

Ops call these from their `sbp` function; the registry's validator checks every signature they
produce against unsharded execution, so a wrong rule here shows up as a test failure.
"""

from __future__ import annotations

from .sbp import B, P, Signature, Split


def elementwise_signatures(in_shapes, out_shape, partial=(), n_outputs: int = 1):
    """Signatures for broadcasting elementwise ops.

    Splitting output axis i splits every input that has a real (size > 1) extent on that axis
    and broadcasts the others.  `partial` lists input-kind patterns like ("P", "B") that give a
    P output: an op linear in those P inputs.
    """
    nd = len(out_shape)
    sigs = [Signature(tuple(B for _ in in_shapes), (B,) * n_outputs)]
    for axis in range(nd):
        ins = []
        for s in in_shapes:
            a = axis - (nd - len(s))
            ins.append(Split(a) if a >= 0 and s[a] == out_shape[axis] and s[a] > 1 else B)
        if out_shape[axis] > 1 and any(x != B for x in ins):
            sigs.append(Signature(tuple(ins), (Split(axis),) * n_outputs))
    for pattern in partial:
        sigs.append(Signature(tuple(P if k == "P" else B for k in pattern), (P,) * n_outputs))
    return sigs


def einsum_signatures(spec: str, in_shapes):
    """Signatures of a multilinear contraction written as an einsum string ("mk,kn->mn").

    A letter kept in the output splits every operand holding it and the output; a contracted
    letter splits the operands and makes the output partial; one P operand with the others B
    gives P, since the op is linear in each operand.
    """
    lhs, out = spec.replace(" ", "").split("->")
    terms = lhs.split(",")
    sigs = [Signature((B,) * len(terms), (B,))]
    sizes = {}
    for t, s in zip(terms, in_shapes):
        for c, n in zip(t, s):
            sizes[c] = max(sizes.get(c, 1), n)
    for c in dict.fromkeys(lhs.replace(",", "")):
        if sizes[c] <= 1:
            continue
        ins = []
        for t, s in zip(terms, in_shapes):
            ins.append(Split(t.index(c)) if c in t and s[t.index(c)] == sizes[c] else B)
        outs = (Split(out.index(c)),) if c in out else (P,)
        sigs.append(Signature(tuple(ins), outs))
    for i in range(len(terms)):
        sigs.append(Signature(tuple(P if j == i else B for j in range(len(terms))), (P,)))
    return sigs
