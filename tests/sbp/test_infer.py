"""Signature inference (sbp.infer): candidates on 1-D and 2-D placements, the eager choice,
and the conditions a signature carries (short splits, even cuts)."""

import pytest

from sbpflow import comm
from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.ops import registry
from sbpflow.sbp import B, P, Placement, S, boxing, infer


@pytest.fixture
def world_of(monkeypatch):
    # Placements check their ranks against the world size; inference needs no communication.
    def make(n):
        monkeypatch.setattr(comm, "get_world_size", lambda: n)

    return make


def _meta(*shape):
    return TensorMeta(tuple(shape), dt.float32)


def _cost(meta, placement, src, dst):
    return boxing.cost(meta, placement, src, placement, dst)


def _choose(op, in_metas, in_sbps, placement, **attrs):
    opdef = registry.get(op)
    attrs = opdef.bind_attrs(attrs)
    out_metas = opdef.meta(tuple(in_metas), attrs)
    return infer.choose(opdef.signatures(tuple(in_metas), attrs), tuple(in_metas),
                        tuple(in_sbps), out_metas, placement, _cost)


def test_matching_inputs_win_and_mismatches_take_the_cheapest_boxing(world_of):
    world_of(2)
    p = Placement("cpu", [0, 1])
    a, b = _meta(4, 6), _meta(6, 8)
    assert _choose("matmul", [a, b], [(S(0),), (B,)], p) == (((S(0),), (B,)), ((S(0),),))
    assert _choose("matmul", [a, b], [(S(1),), (S(0),)], p) == (((S(1),), (S(0),)), ((P,),))
    # (S(0), S(0)): re-splitting the left operand along k (all-to-all of 4x6 floats: 48 B
    # moved per the model) and reducing the 4x8 P output later (reduce-scatter: 128 B) beats
    # gathering the right one (S -> B of 6x8 floats: 192 B).
    ins, outs = _choose("matmul", [a, b], [(S(0),), (S(0),)], p)
    assert ins == ((S(1),), (S(0),)) and outs == ((P,),)
    out = _meta(4, 8)
    assert (_cost(a, p, (S(0),), (S(1),)) + _cost(out, p, (P,), (S(0),))
            < _cost(b, p, (S(0),), (B,)))


@pytest.mark.parametrize("n", [2, 4])
def test_a_partial_output_is_charged_for_its_reduction(world_of, n):
    world_of(n)
    p = Placement("cpu", list(range(n)))
    # A contraction over k = n with a big output: re-splitting a along k is the cheapest
    # boxing of the inputs, but it leaves an 8x8 partial sum to reduce, which costs more
    # than gathering the small b: the S(0) signature wins.
    a, b, out = _meta(8, n), _meta(n, 8), _meta(8, 8)
    to_p = _cost(a, p, (S(0),), (S(1),))
    gather_b = _cost(b, p, (S(0),), (B,))
    assert to_p < gather_b  # inputs alone: the P signature would win
    assert to_p + _cost(out, p, (P,), (S(0),)) > gather_b
    assert _choose("matmul", [a, b], [(S(0),), (S(0),)], p) == (((S(0),), (B,)), ((S(0),),))
    # The charge is a reduce-scatter of the output (P -> S), 0 for outputs without P.
    assert infer.partial_output_cost(out, p, (P,), _cost) == _cost(out, p, (P,), (S(0),))
    assert infer.partial_output_cost(out, p, (S(1),), _cost) == 0.0
    assert infer.partial_output_cost(_meta(), p, (P,), _cost) == _cost(_meta(), p, (P,), (B,))


def test_matching_inputs_still_win_with_a_partial_output(world_of):
    world_of(2)
    p = Placement("cpu", [0, 1])
    # The tensor-parallel matmul: h S(1) @ w S(0) -> P, however big the output.
    h, w = _meta(64, 2), _meta(2, 64)
    assert _choose("matmul", [h, w], [(S(1),), (S(0),)], p) == (((S(1),), (S(0),)), ((P,),))


def test_reshape_keeps_a_split_through_a_merge_only_when_the_cut_is_even(world_of):
    world_of(2)
    p = Placement("cpu", [0, 1])
    ins, outs = _choose("reshape", [_meta(4, 3, 5)], [(S(0),)], p, shape=(12, 5))
    assert ins == ((S(0),),) and outs == ((S(0),),)
    # 5 rows on 2 ranks are 3 + 2, but 15 merged rows split 8 + 7: the split must move.
    ins, outs = _choose("reshape", [_meta(5, 3, 5)], [(S(0),)], p, shape=(15, 5))
    assert ins != ((S(0),),)


def test_even_cuts_are_checked_per_grid_axis(world_of):
    world_of(4)
    grid = Placement("cpu", [[0, 1], [2, 3]])
    opdef = registry.get("reshape")
    attrs = opdef.bind_attrs({"shape": (24, 5)})
    ok = _meta(4, 6, 5)  # 4 rows: cut by 2, then 2 rows cut by 2: even at both levels
    found = infer.candidates(opdef.signatures((ok,), attrs), (ok,),
                             opdef.meta((ok,), attrs), grid)
    assert (((S(0), S(0)),), ((S(0), S(0)),)) in found
    odd = _meta(6, 4, 5)  # 6 rows: 3 + 3, then 3 cannot be cut evenly by the second axis
    attrs = opdef.bind_attrs({"shape": (24, 5)})
    found = infer.candidates(opdef.signatures((odd,), attrs), (odd,),
                             opdef.meta((odd,), attrs), grid)
    assert (((S(0), S(0)),), ((S(0), S(0)),)) not in found
    assert (((S(0), B),), ((S(0), B),)) in found


def test_short_splits_are_kept_only_when_the_inputs_already_have_them(world_of):
    world_of(3)
    p = Placement("cpu", [0, 1, 2])
    two_rows = _meta(2, 6)
    opdef = registry.get("relu")
    sigs = opdef.signatures((two_rows,), {})
    fresh = infer.candidates(sigs, (two_rows,), (two_rows,), p)
    assert (((S(0),),), ((S(0),),)) not in fresh  # never chosen to cut 2 rows over 3 ranks
    kept = infer.candidates(sigs, (two_rows,), (two_rows,), p, keep=((S(0),),))
    assert (((S(0),),), ((S(0),),)) in kept  # but an input already split that way stays


def test_every_op_has_the_all_broadcast_fallback(world_of):
    world_of(2)
    p = Placement("cpu", [0, 1])
    m = _meta(3, 3)
    found = infer.candidates([], (m, m), (m,), p)
    assert found == [(((B,), (B,)), ((B,),))]


# -- choose_signature: the one chooser of eager global ops and graph tracing ------------------
class _Counting:
    """An OpDef stand-in that counts how often its candidates are asked for."""

    def __init__(self, opdef):
        self.opdef, self.name, self.asked = opdef, opdef.name, 0
        self.keeps_sbp = opdef.keeps_sbp

    def signatures(self, in_metas, attrs):
        self.asked += 1
        return self.opdef.signatures(in_metas, attrs)


def _signature(op, in_metas, in_sbps, placement, creation_sbp=None, **attrs):
    opdef = registry.get(op)
    attrs = opdef.bind_attrs(attrs)
    out_metas = opdef.meta(tuple(in_metas), attrs, local=False)
    counting = _Counting(opdef)
    got = infer.choose_signature(counting, tuple(in_metas), tuple(in_sbps), out_metas,
                                 placement, attrs, creation_sbp)
    return got, counting


def test_choose_signature_is_choose_with_the_cost_model_and_cached(world_of, monkeypatch):
    world_of(2)
    monkeypatch.setattr(infer, "_CHOICES", {})
    p = Placement("cpu", [0, 1])
    a, b = _meta(4, 6), _meta(6, 8)
    for sbps in ([(S(0),), (B,)], [(S(0),), (S(0),)], [(B,), (S(1),)], [(P,), (S(1),)]):
        got, counting = _signature("matmul", [a, b], sbps, p)
        assert got == _choose("matmul", [a, b], sbps, p) and counting.asked == 1
        again, counting = _signature("matmul", [a, b], sbps, p)
        assert again == got and counting.asked == 0  # the cache answered


def test_an_update_keeps_its_parameters_sbp(world_of, monkeypatch):
    """An optimizer update runs where its parameter lies (`OpDef.keeps_sbp`): a B parameter
    with a P gradient takes the all-reduced gradient, though reduce-scattering the gradient
    and updating S(0) pieces would box less before the op (then the new S(0) parameter
    would need an all-gather into its B variable); a split parameter is updated piece by
    piece, its gradient and momentum as they are."""
    world_of(2)
    monkeypatch.setattr(infer, "_CHOICES", {})
    p = Placement("cpu", [0, 1])
    w, lr = _meta(8, 6), _meta()
    attrs = {"momentum": 0.9}
    dp = [(B,), (P,), (B,), (B,), (B,)]
    got, _ = _signature("sgd_update", [w, w, w, lr, lr], dp, p, **attrs)
    assert got == (((B,),) * 5, ((B,), (B,)))
    # without the rule, the cheapest boxing before the op moves the parameter
    assert _choose("sgd_update", [w, w, w, lr, lr], dp, p, **attrs)[0][0] == (S(0),)
    tp = [(S(1),), (S(1),), (S(1),), (B,), (B,)]
    got, _ = _signature("sgd_update", [w, w, w, lr, lr], tp, p, **attrs)
    assert got == (tuple(tp), ((S(1),), (S(1),)))
    n2 = [(S(0),), (B,), (S(0),), (P,), (B,)]  # multi-tensor: every block's parameter kept
    got, _ = _signature("multi_sgd_update", [w, w, w, w, lr], n2, p, n=2)
    assert got[0][:4] == ((S(0),),) * 4, got


def test_creation_ops_fill_declared_pieces_and_make_b_otherwise(world_of, monkeypatch):
    world_of(2)
    monkeypatch.setattr(infer, "_CHOICES", {})
    p = Placement("cpu", [0, 1])
    full = {"shape": (4, 3), "fill_value": 1.0, "dtype": dt.float32}
    assert _signature("full", [], [], p, (S(1),), **full)[0] == ((), ((S(1),),))
    assert _signature("full", [], [], p, None, **full)[0] == ((), ((B,),))
    # P: made as B (boxing makes the P); a split of 1 row over 2 ranks: B too.
    assert _signature("full", [], [], p, (P,), **full)[0] == ((), ((B,),))
    one_row = {"shape": (1, 3), "fill_value": 1.0, "dtype": dt.float32}
    assert _signature("full", [], [], p, (S(0),), **one_row)[0] == ((), ((B,),))


def test_eager_global_ops_take_their_signature_from_sbp_infer(monkeypatch):
    import numpy as np

    import sbpflow as flow
    from sbpflow.framework import global_tensor

    monkeypatch.setattr(global_tensor, "_GLOBAL_CALLS", {})
    global_tensor.clear_call_caches()  # and the per-op caches of interpreter.apply
    calls = []
    real = infer.choose_signature

    def spy(opdef, *args):
        calls.append(opdef.name)
        return real(opdef, *args)

    monkeypatch.setattr(infer, "choose_signature", spy)
    one = flow.placement("cpu", [0])
    x = np.arange(12.0).reshape(3, 4)
    a = flow.tensor(x, placement=one, sbp=S(0))
    w = flow.tensor(x.T.copy(), placement=one, sbp=B)
    y = a @ w
    assert "matmul" in calls and y.sbp == (S(0),)
    np.testing.assert_allclose(y.numpy(), x @ x.T)
