"""SBP signature inference: the one chooser that eager global ops and graph tracing both call.

`choose_signature(opdef, ...)` is the entry: given an op call's logical metas, input nd-SBPs,
placement, attrs (and for a creation op the requested SBP), it returns the input nd-SBPs the
kernel needs and the output nd-SBPs it produces, cached here by the call's metadata. What is
specific to one rank (piece metas, slices, fingerprints) stays with the caller.

An op declares 1-D candidate signatures (`OpDef.sbp`). On an nd placement the candidates are
the product of the 1-D lists, one per grid axis (OneFlow's rule), keeping only those whose
split axes are long enough for the ranks that cut them. The choice: the signature whose
inputs already match wins; otherwise the one of least cost, earlier declared signatures
winning ties. A candidate's cost is the boxing of its inputs (the copy-cost model of
`boxing.cost`) plus the reduction each of its P outputs owes (`partial_output_cost`), so a
signature that leaves a big partial sum behind no longer looks free. Inputs an op updates in
place (`OpDef.keeps_sbp`: an optimizer update's parameters) keep their SBP. All-broadcast is always
valid (every rank computes the whole op), so it is the fallback for ops that declare nothing.
"""

from __future__ import annotations

import itertools

from .._core.meta import TensorMeta
from . import boxing
from .placement import Placement
from .sbp import B, P, Signature, Split


def _fits(sbps, metas, hierarchy, even=(), short_ok=False) -> bool:
    """Every split cuts an axis at least as long as its grid axis, after the cuts before it
    (unless `short_ok`); and the grid axes in `even[i]` cut tensor i's split axis evenly,
    after even cuts before them."""
    for i, (m, nd) in enumerate(zip(metas, sbps)):
        sizes = list(m.shape)
        exact = [True] * len(sizes)
        for k, x in enumerate(nd):
            if isinstance(x, Split):
                a = x.axis
                if a >= len(sizes) or (sizes[a] < hierarchy[k] and not short_ok):
                    return False
                if even and k in even[i] and (sizes[a] % hierarchy[k] or not exact[a]):
                    return False
                exact[a] = exact[a] and sizes[a] % hierarchy[k] == 0
                sizes[a] //= hierarchy[k]
    return True


def candidates(sigs_1d, in_metas, out_metas, placement: Placement, keep=None):
    """nd signatures (tuple of in nd-SBPs, tuple of out nd-SBPs) from 1-D ones.

    A signature whose inputs are `keep` (the inputs' current nd-SBPs) stays even where its
    splits are short: those pieces exist already (some empty), and boxing them away would
    change the SBP on every op.  Its `even` conditions still apply.
    """
    n_in, n_out = len(in_metas), len(out_metas)
    all_b = Signature((B,) * n_in, (B,) * n_out)
    sigs = list(dict.fromkeys([*sigs_1d, all_b]))  # keep declared order, drop repeats
    hierarchy = placement.hierarchy
    out = []
    for combo in itertools.product(sigs, repeat=len(hierarchy)):
        ins = tuple(tuple(s.inputs[i] for s in combo) for i in range(n_in))
        outs = tuple(tuple(s.outputs[i] for s in combo) for i in range(n_out))
        even_in = even_out = ()
        if any(s.even for s in combo):  # grid axes whose cut must be even, per tensor
            even = [{k for k, s in enumerate(combo) if i in s.even}
                    for i in range(n_in + n_out)]
            even_in, even_out = even[:n_in], even[n_in:]
        short_ok = ins == keep
        if (_fits(ins, in_metas, hierarchy, even_in, short_ok)
                and _fits(outs, out_metas, hierarchy, even_out, short_ok)):
            out.append((ins, outs))
    return out


def choose(sigs_1d, in_metas: tuple[TensorMeta, ...], in_sbps: tuple, out_metas,
           placement: Placement, cost_fn, kept=()):
    """The signature to run: (input nd-SBPs, output nd-SBPs).

    `cost_fn(meta, placement, src_sbp, dst_sbp)` is the boxing copy cost on one placement.
    A candidate whose inputs match wins outright (nothing to box; its P outputs are what the
    program's layout implies, as a tensor-parallel matmul's). Otherwise a candidate costs the
    boxing of its inputs plus `partial_output_cost` of each output.  `kept`: indices of
    inputs whose nd-SBP must stay (`OpDef.keeps_sbp`); candidates that box them count only
    when no other is left.
    """
    cands = candidates(sigs_1d, in_metas, out_metas, placement, in_sbps)
    if kept:
        keeping = [c for c in cands if all(c[0][i] == in_sbps[i] for i in kept)]
        cands = keeping or cands
    best, best_cost = None, None
    for ins, outs in cands:
        if ins == in_sbps:
            return ins, outs  # nothing to box
        total = 0.0
        for m, have, want in zip(in_metas, in_sbps, ins):
            if have != want:
                total += cost_fn(m, placement, have, want)
        for m, s in zip(out_metas, outs):
            if P in s:
                total += partial_output_cost(m, placement, s, cost_fn)
        if best_cost is None or total < best_cost:
            best, best_cost = (ins, outs), total
    return best


def partial_output_cost(meta, placement: Placement, nd_sbp: tuple, cost_fn) -> float:
    """What an output of nd-SBP `nd_sbp` owes for its later reduction: P -> S, 0 without P.

    Every P output is reduced before anything non-linear reads it, and the cheapest reduction
    is a reduce-scatter: each P grid axis becomes a split of the longest tensor axis free
    there (`boxing._without_partial`; a 0-d tensor needs P -> B). P -> S, not P -> B, because
    it is the premium a P output carries over an S output whatever the consumer wants:
    P -> B costs P -> S plus the S -> B an S output would pay too (2T(n-1) = T(n-1) + T(n-1)),
    and P -> S(i) costs a reduce-scatter where an S(j) output pays an all-to-all at most. So
    S candidates and P candidates are compared fairly; against a B output it is a lower
    bound, the cheapest reduction the P output can get.
    """
    if P not in nd_sbp:
        return 0.0
    return cost_fn(meta, placement, nd_sbp, boxing._without_partial(meta.shape, nd_sbp))


def same_placement_cost(meta, placement: Placement, src, dst) -> float:
    """`boxing.cost` of boxing `meta` from nd-SBP `src` to `dst` on one placement."""
    return boxing.cost(meta, placement, src, placement, dst)


def creation_signature(opdef, out_metas, placement: Placement, sbp, attrs) -> tuple:
    """The output nd-SBPs of a creation op (no tensor inputs) asked to make `sbp` (None: B).

    It fills the requested pieces directly when it declares that signature; otherwise (and for
    P, which no creation declares) it makes B and the caller boxes to what was asked."""
    sbp = sbp if sbp is not None else (B,) * placement.ndim
    wanted = tuple(B if x is P else x for x in sbp)
    declared = {s.outputs[0] for s in opdef.signatures((), attrs)} | {B}
    ok = all(x in declared for x in wanted) and _fits((wanted,), out_metas, placement.hierarchy)
    return ((wanted if ok else (B,) * placement.ndim),) * len(out_metas)


_CHOICES: dict = {}
_CHOICES_LIMIT = 65536


def choose_signature(opdef, in_metas: tuple, in_sbps: tuple, out_metas: tuple,
                     placement: Placement, attrs: dict, creation_sbp=None) -> tuple:
    """(input nd-SBPs, output nd-SBPs) of one op call on `placement`, cached.

    `opdef` is the op's OpDef (its `name`, `keeps_sbp` and `signatures(in_metas, attrs)` are
    used);
    `in_metas`/`out_metas` are logical; `attrs` are bound. With no inputs, the op creates a
    tensor and `creation_sbp` (None: B) is what the caller asked for (`creation_signature`);
    otherwise `choose` picks among the op's candidates with the boxing cost model. The result
    depends only on these arguments, so every rank, and the graph tracer, gets the same one.
    """
    try:
        values = tuple(attrs.values())
        key = (opdef.name, in_metas, in_sbps, out_metas, placement, values,
               tuple(map(type, values)), creation_sbp)
        hit = _CHOICES.get(key)
    except TypeError:  # an unhashable attr: choose without caching
        key, hit = None, None
    if hit is not None:
        return hit
    if in_metas:
        kept = opdef.keeps_sbp(*in_metas, **attrs) if opdef.keeps_sbp is not None else ()
        hit = choose(opdef.signatures(in_metas, attrs), in_metas, in_sbps, out_metas,
                     placement, same_placement_cost, kept)
    else:
        hit = ((), creation_signature(opdef, out_metas, placement, creation_sbp, attrs))
    if key is not None and len(_CHOICES) < _CHOICES_LIMIT:
        _CHOICES[key] = hit
    return hit
