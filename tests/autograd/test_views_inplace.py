"""In-place writes through views: values and gradients must match torch's (CopySlices)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

import sbpflow as flow

SEED = 777


def arrays(*shapes, seed=0):
    rng = np.random.default_rng(SEED + seed)
    return [rng.standard_normal(s) for s in shapes]


def leaves(lib, arrs):
    return [lib.tensor(a.copy(), dtype=lib.float64, requires_grad=True) for a in arrs]


def values(t):
    return None if t is None else t.detach().numpy()


def assert_same(ours, theirs):
    if ours is None or theirs is None:
        assert ours is None and theirs is None, (ours, theirs)
        return
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_allclose(values(ours), values(theirs), rtol=1e-10, atol=1e-12)


def run_both(program, arrs):
    out = {}
    for lib in (torch, flow):
        xs = leaves(lib, arrs)
        out[lib.__name__] = (program(lib, *xs), xs)
    return out["sbpflow"], out["torch"]


def check(program, arrs):
    """Same forward values (if returned) and same leaf gradients as torch."""
    (o_res, o_leaves), (t_res, t_leaves) = run_both(program, arrs)
    if o_res is not None:
        o_res = o_res if isinstance(o_res, tuple) else (o_res,)
        t_res = t_res if isinstance(t_res, tuple) else (t_res,)
        for o, t in zip(o_res, t_res, strict=True):
            assert_same(o, t)
    for o, t in zip(o_leaves, t_leaves, strict=True):
        assert_same(o.grad, t.grad)


# Each entry: (name, leaf shapes, program(lib, x, y) that writes into a view of a clone of x).
VIEW_WRITES = [
    ("slice_mul", ((4, 3), (2, 3)), lambda lib, x, y: x.clone()[1:3].mul_(y)),
    ("slice_add", ((4, 3), (2, 3)), lambda lib, x, y: x.clone()[1:3].add_(y)),
    ("slice_copy", ((4, 3), (2, 3)), lambda lib, x, y: x.clone()[1:3].copy_(y)),
    ("slice_fill", ((4, 3), (1,)), lambda lib, x, y: x.clone()[::2].fill_(3.0)),
    ("select_mul", ((4, 3), (3,)), lambda lib, x, y: x.clone()[2].mul_(y)),
    ("column_add", ((4, 3), (4,)), lambda lib, x, y: x.clone()[:, 1].add_(y)),
    ("transpose_mul", ((4, 3), (3, 4)), lambda lib, x, y: x.clone().t().mul_(y)),
    ("transpose_add_bcast", ((4, 3), (4,)), lambda lib, x, y: x.clone().t().add_(y)),
    ("view_mul", ((4, 3), (2, 6)), lambda lib, x, y: x.clone().view(2, 6).mul_(y)),
    ("permute_copy", ((2, 3, 2), (2, 2, 3)),
     lambda lib, x, y: x.clone().permute(2, 0, 1).copy_(y)),
    ("view_of_view", ((4, 3), (3, 2)), lambda lib, x, y: x.clone().view(2, 6).t()[1:4].mul_(y)),
    ("chain_three", ((2, 3, 4), (2,)),
     lambda lib, x, y: x.clone().transpose(0, 2)[1:3].select(1, 0)[1].mul_(y)),
    ("exp_inplace", ((4, 3), (1,)), lambda lib, x, y: x.clone()[1:].exp_()),
    ("neg_inplace", ((4, 3), (1,)), lambda lib, x, y: x.clone()[:, :2].neg_()),
    ("sub_inplace", ((4, 3), (3,)), lambda lib, x, y: x.clone()[0].sub_(y)),
    ("repeated_writes", ((4, 3), (3,)),
     lambda lib, x, y: x.clone()[0].mul_(y).add_(y).mul_(y)),
]


def _base_loss_program(make_write):
    """Write through the view, then use the *base* (and the view) in the loss."""

    def program(lib, x, y):
        base = x.clone()
        # Rebuild the same view on `base`: the write helpers clone x themselves, so
        # re-express them on base by swapping in a tensor whose clone() returns base.
        view = make_write(lib, _CloneReturns(base), y)
        loss = (base * base).sum() + (view * 3).sum()
        loss.backward()
        return base

    return program


class _CloneReturns:
    """Stands in for x in the VIEW_WRITES lambdas: x.clone() yields the prepared base."""

    def __init__(self, base):
        self._base = base

    def clone(self):
        return self._base


@pytest.mark.parametrize("name,shapes,write", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_write_through_view_gradients(name, shapes, write):
    check(_base_loss_program(write), arrays(*shapes))


@pytest.mark.parametrize("name,shapes,write", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_write_through_view_of_base_without_grad(name, shapes, write):
    # The base starts without history; the written value brings y's gradient in.
    def program(lib, x, y):
        base = x.detach().clone()
        view = write(lib, _CloneReturns(base), y)
        assert base.requires_grad == (name not in ("slice_fill", "exp_inplace", "neg_inplace"))
        if base.requires_grad:
            (base * base).sum().backward()
        return base, view

    check(program, arrays(*shapes))


@pytest.mark.parametrize("name,shapes,write", VIEW_WRITES, ids=[v[0] for v in VIEW_WRITES])
def test_write_through_view_double_backward(name, shapes, write):
    def program(lib, x, y):
        base = x.clone()
        write(lib, _CloneReturns(base), y)
        loss = (base * base * base).sum()
        gx, gy = lib.autograd.grad(loss, [x, y], create_graph=True, allow_unused=True)
        total = (gx * gx).sum()
        if gy is not None:
            total = total + (gy * gy).sum()
        total.backward()
        return gx

    check(program, arrays(*shapes, seed=1))


def test_setitem_gradients():
    def program(lib, x, y, z):
        base = x.clone()
        base[1] = y
        base[:, 0] = z * 2
        base[2:, 1:] = 5.0
        (base * base).sum().backward()
        return base

    check(program, arrays((4, 3), (3,), (4,)))


def test_setitem_on_tensor_without_grad():
    def program(lib, x, y):
        base = lib.zeros(3, 4, dtype=lib.float64)
        base[1, 1:3] = y
        base[0] = x[0] * x[1]
        (base.exp() * 2).sum().backward()
        return base

    check(program, arrays((2, 4), (2,)))


def test_in_place_on_base_with_live_views():
    def program(lib, x, y):
        base = x.clone()
        col = base[:, 1]
        tr = base.t()
        base.mul_(y)
        loss = (col * col).sum() + (tr * 2).sum() + base.sum()
        loss.backward()
        return base, col, tr

    check(program, arrays((4, 3), (4, 3)))


def test_view_used_after_write_through_sibling_view():
    def program(lib, x, y):
        base = x.clone()
        top, left = base[:2], base[:, :2]
        top.mul_(y)  # overlaps `left`
        (left * left).sum().backward()
        return left

    check(program, arrays((3, 3), (2, 3)))


def test_write_through_view_then_use_view_in_further_ops():
    def program(lib, x, y):
        base = x.clone()
        v = base[1:].t()
        v.mul_(y)
        w = v * v
        w.add_(1)
        (w * base[1:].t()).sum().backward()
        return w

    check(program, arrays((3, 4), (4, 2)))


def test_saved_view_modified_through_base_raises():
    def make(lib):
        x = lib.ones(2, 3, requires_grad=True)
        base = x.clone()
        v = base[0]
        y = v * v  # saves v
        base.add_(1)
        return lambda: y.sum().backward()

    with pytest.raises(RuntimeError) as theirs:
        make(torch)()
    with pytest.raises(RuntimeError) as ours:
        make(flow)()
    assert "modified by an inplace operation" in str(ours.value)
    assert "modified by an inplace operation" in str(theirs.value)


# -- errors ------------------------------------------------------------------------------------
def _same_error(make_torch, make_flow, text):
    with pytest.raises(RuntimeError) as theirs:
        make_torch()
    with pytest.raises(RuntimeError) as ours:
        make_flow()
    assert text in str(theirs.value)
    assert text in str(ours.value)


@pytest.mark.parametrize("make_view", [
    lambda x: x[0], lambda x: x.t(), lambda x: x.view(6), lambda x: x[:, 1:],
])
def test_view_of_leaf_in_place_raises(make_view):
    def attempt(lib):
        x = lib.ones(2, 3, requires_grad=True)
        make_view(x).mul_(2)

    _same_error(lambda: attempt(torch), lambda: attempt(flow),
                "a view of a leaf Variable that requires grad is being used in an in-place "
                "operation.")


def test_view_of_leaf_in_place_under_no_grad_is_allowed():
    for lib in (torch, flow):
        x = lib.ones(2, 3, requires_grad=True)
        with lib.no_grad():
            x[0].mul_(5)
        (x * x).sum().backward()
        assert x.grad.tolist() == [[10.0] * 3, [2.0] * 3]


@pytest.mark.parametrize("requires_grad", [False, True])
def test_in_place_on_expanded_tensor_raises(requires_grad):
    def attempt(lib):
        x = lib.ones(3, requires_grad=requires_grad)
        e = (x * 1).expand(2, 3)
        e.add_(1)

    _same_error(lambda: attempt(torch), lambda: attempt(flow),
                "unsupported operation: more than one element of the written-to tensor refers "
                "to a single memory location.")


def test_expand_then_clone_is_writable():
    def program(lib, x, y):
        e = x.expand(2, 3).clone()
        e[1].mul_(y)
        (e * e).sum().backward()
        return e

    check(program, arrays((3,), (3,)))


def test_base_and_view_versions_shared():
    for lib in (torch, flow):
        base = lib.zeros(3, 3)
        v = base[1]
        v.add_(1)
        assert base._version == v._version == 1
        base.mul_(2)
        assert v._version == 2


# -- random chains of views and in-place writes ------------------------------------------------
_VIEW_STEPS = {
    "t": lambda v: v.t() if v.ndim == 2 else None,
    "rows": lambda v: v[1:] if v.ndim >= 1 and v.shape[0] > 1 else None,
    "step": lambda v: v[::2] if v.ndim >= 1 and v.shape[0] > 1 else None,
    "select": lambda v: v[0] if v.ndim >= 2 else None,
    "cols": lambda v: v[:, 1:] if v.ndim >= 2 and v.shape[1] > 1 else None,
    "unsqueeze": lambda v: v.unsqueeze(0) if v.ndim < 3 else None,
    "flatten": lambda v: v.view(-1) if v.is_contiguous() else None,
    "reverse_dims": lambda v: v.permute(*reversed(range(v.ndim))) if v.ndim >= 2 else None,
}
_WRITE_STEPS = {
    "mul_y": lambda v, y: v.mul_(y[0]),
    "add_y": lambda v, y: v.add_(y[1]),
    "fill": lambda v, y: v.fill_(2.5),
    "zero": lambda v, y: v.zero_(),
    "exp": lambda v, y: v.exp_(),
    "mul2": lambda v, y: v.mul_(2),
    "copy_y": lambda v, y: v.copy_(y[: v.numel()].reshape(v.shape)),
    "setitem": lambda v, y: v.__setitem__(..., y[2]),
}


def _chain_program(lib, x, y, plan, detached):
    # A detached base starts without history and gains it from writes of y.
    base = x.detach().clone() if detached else x.clone()
    live = []
    for step in plan:
        if step in _VIEW_STEPS:
            view = _VIEW_STEPS[step](live[-1] if live else base)
            if view is not None:
                live.append(view)
        elif step == "base_mul":
            base.mul_(1.5)
        else:
            _WRITE_STEPS[step](live[-1] if live else base, y)
    loss = (base * base).sum()
    for view in live:
        loss = loss + (view * 0.5).sum()
    if loss.requires_grad:
        loss.backward()
    return base


_STEPS = sorted(_VIEW_STEPS) + sorted(_WRITE_STEPS) + ["base_mul"]


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          phases=(Phase.explicit, Phase.generate))
@given(plan=st.lists(st.sampled_from(_STEPS), min_size=1, max_size=6), seed=st.integers(0, 99),
       detached=st.booleans())
def test_random_view_and_write_chains(plan, seed, detached):
    # Known divergence: torch refuses to overwrite (copy_ from a tensor needing grad) a result
    # that saved itself (exp_), because it still walks the overwritten history; we do not
    # walk it and give the right gradient instead.
    assume(not ("exp" in plan and "copy_y" in plan))
    rng = np.random.default_rng(seed)
    xa, ya = rng.standard_normal((3, 4)) * 0.5, rng.standard_normal(12) * 0.5
    results = []
    for lib in (torch, flow):
        x, y = leaves(lib, [xa, ya])
        try:
            base = _chain_program(lib, x, y, plan, detached)
        except RuntimeError as exc:
            results.append(type(exc))
            continue
        # torch gives zeros where we may leave None (no path reached the leaf); compare values.
        grads = [np.zeros_like(a) if t.grad is None else values(t.grad)
                 for t, a in ((x, xa), (y, ya))]
        results.append([values(base)] + grads)
    ours, theirs = results[1], results[0]
    if not isinstance(theirs, list) or not isinstance(ours, list):
        assert ours == theirs, (plan, ours, theirs)
        return
    for o, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(o, t, rtol=1e-9, atol=1e-12, err_msg=str(plan))
