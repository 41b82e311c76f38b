"""Autograd against torch: each program runs on both libraries and the gradients must agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow

RNG_SEED = 20240601


def arrays(*shapes, seed=0, positive=False):
    rng = np.random.default_rng(RNG_SEED + seed)
    out = []
    for s in shapes:
        a = rng.standard_normal(s)
        out.append(np.abs(a) + 0.5 if positive else a)
    return out


def leaves(lib, arrs, requires_grad=True):
    return [lib.tensor(a.copy(), dtype=lib.float64, requires_grad=requires_grad) for a in arrs]


def values(t):
    if t is None:
        return None
    return t.detach().numpy()


def assert_same(ours, theirs, rtol=1e-10, atol=1e-12):
    if theirs is None or ours is None:
        assert ours is None and theirs is None, (ours, theirs)
        return
    assert tuple(ours.shape) == tuple(theirs.shape)
    np.testing.assert_allclose(values(ours), values(theirs), rtol=rtol, atol=atol)


def run_both(program, arrs, **kwargs):
    """Run program(lib, *leaf_tensors) on torch and sbpflow; return both (result, leaves)."""
    results = {}
    for lib in (torch, flow):
        xs = leaves(lib, arrs)
        results[lib.__name__] = (program(lib, *xs, **kwargs), xs)
    return results["sbpflow"], results["torch"]


def assert_leaf_grads_match(program, arrs, **kwargs):
    (_, ours), (_, theirs) = run_both(program, arrs, **kwargs)
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o.grad, t.grad)


def expect_same_error(program_torch, program_flow, match_upto=None):
    """Both raise the same exception type; messages agree up to `match_upto`."""
    with pytest.raises(Exception) as theirs:
        program_torch()
    with pytest.raises(Exception) as ours:
        program_flow()
    assert type(ours.value) is type(theirs.value), (ours.value, theirs.value)
    if match_upto is not None:
        t_msg = str(theirs.value)
        o_msg = str(ours.value)
        cut = t_msg.index(match_upto) + len(match_upto)
        assert o_msg.replace("sbpflow.", "torch.")[:cut] == t_msg[:cut]
    return ours.value, theirs.value


# -- requires_grad and the graph ---------------------------------------------------------------
def test_requires_grad_propagates():
    for lib in (torch, flow):
        x = lib.ones(2, 2, requires_grad=True)
        w = lib.ones(2, 2)
        assert x.requires_grad and x.is_leaf and x.grad_fn is None
        assert not w.requires_grad and w.is_leaf
        y = x * w
        assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
        z = w * w
        assert not z.requires_grad and z.is_leaf
        assert not (x.detach() * w).requires_grad


def test_grad_fn_names_match_torch():
    (x,), (tx,) = leaves(flow, arrays((3,))), leaves(torch, arrays((3,)))
    for fn in (lambda a: a * a, lambda a: a + a, lambda a: -a, lambda a: a.exp(),
               lambda a: a.sum()):
        assert fn(x).grad_fn.name() == fn(tx).grad_fn.name()


def test_requires_grad_rules_like_torch():
    expect_same_error(lambda: torch.ones(2, dtype=torch.int64).requires_grad_(),
                      lambda: flow.ones(2, dtype=flow.int64).requires_grad_(),
                      "only Tensors of floating point")
    tx = torch.ones(2, requires_grad=True) * 2
    fx = flow.ones(2, requires_grad=True) * 2
    expect_same_error(lambda: tx.requires_grad_(False), lambda: fx.requires_grad_(False),
                      "you can only change requires_grad flags of leaf variables.")
    fx.requires_grad_(True)  # allowed: already requires grad
    leaf = flow.ones(2, requires_grad=True)
    leaf.requires_grad_(False)
    assert not leaf.requires_grad


def test_integer_results_do_not_require_grad():
    x = flow.ones(3, requires_grad=True)
    assert not x.to(flow.int64).requires_grad
    tx = torch.ones(3, requires_grad=True)
    assert x.to(flow.int64).requires_grad == tx.to(torch.int64).requires_grad


# -- backward ------------------------------------------------------------------------------
def test_backward_polynomial():
    def program(lib, x, y):
        out = (x * x * 3 + x * y - y).sum()
        out.backward()
        return out

    assert_leaf_grads_match(program, arrays((3, 4), (3, 4)))


def test_backward_broadcasting_and_matmul():
    def program(lib, a, b, bias):
        out = ((a @ b) + bias).exp().sum()
        out.backward()

    assert_leaf_grads_match(program, arrays((2, 3), (3, 4), (4,), seed=1))


def test_backward_with_explicit_gradient():
    def program(lib, x):
        y = x * 2 + x * x
        y.backward(lib.tensor(np.arange(6.0).reshape(2, 3), dtype=lib.float64))

    assert_leaf_grads_match(program, arrays((2, 3)))


def test_backward_nonscalar_without_gradient_raises():
    tx, fx = (lib.ones(3, requires_grad=True) * 2 for lib in (torch, flow))
    expect_same_error(lambda: tx.backward(), lambda: fx.backward(),
                      "grad can be implicitly created only for scalar outputs")


def test_backward_gradient_shape_mismatch_raises():
    tx, fx = (lib.ones(3, requires_grad=True) * 2 for lib in (torch, flow))
    expect_same_error(lambda: tx.backward(torch.ones(4)), lambda: fx.backward(flow.ones(4)),
                      "Mismatch in shape")


def test_backward_on_tensor_without_grad_raises():
    expect_same_error(lambda: torch.ones(1).sum().backward(),
                      lambda: flow.ones(1).sum().backward(),
                      "element 0 of tensors does not require grad and does not have a grad_fn")


def test_retain_graph_allows_second_backward_and_accumulates():
    def program(lib, x):
        y = (x * x).sum()
        y.backward(retain_graph=True)
        y.backward()

    assert_leaf_grads_match(program, arrays((4,)))


def test_second_backward_without_retain_graph_raises():
    def make(lib):
        x = lib.ones(3, requires_grad=True)
        y = (x * x).sum()
        y.backward()
        return y

    ty, fy = make(torch), make(flow)
    expect_same_error(ty.backward, fy.backward,
                      "Trying to backward through the graph a second time")


def test_second_backward_through_nodes_that_save_nothing_is_allowed():
    # torch only fails on a freed graph when a node needs a saved tensor.
    def program(lib, x):
        y = (x + 1).sum()
        y.backward()
        y.backward()

    assert_leaf_grads_match(program, arrays((3,)))


def test_grad_accumulates_across_backwards():
    def program(lib, x, w):
        (x * w).sum().backward()
        (x * x).sum().backward()
        (w * 3).sum().backward()

    assert_leaf_grads_match(program, arrays((2, 2), (2, 2)))


def test_grad_reset_and_zero():
    x = flow.ones(2, requires_grad=True)
    (x * 2).sum().backward()
    x.grad = None
    (x * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    x.grad.zero_()
    (x * 5).sum().backward()
    assert x.grad.tolist() == [5.0, 5.0]


def test_grad_of_leaf_is_not_tracked():
    x = flow.ones(2, requires_grad=True)
    (x * x).sum().backward()
    assert not x.grad.requires_grad and x.grad.grad_fn is None


def test_backward_with_inputs_argument():
    def program(lib, x, y):
        (x * y).sum().backward(inputs=[x])

    (_, (fx, fy)), (_, (tx, ty)) = run_both(program, arrays((3,), (3,)))
    assert_same(fx.grad, tx.grad)
    assert fy.grad is None and ty.grad is None


def test_autograd_backward_many_roots():
    def program(lib, x):
        a, b = x * 2, x * x
        lib.autograd.backward([a.sum(), b], [None, lib.ones(3, dtype=lib.float64)])

    assert_leaf_grads_match(program, arrays((3,)))


def test_shared_subexpression_and_diamond():
    def program(lib, x):
        h = x * x
        y = (h * 2 + h.exp() + h * x).sum()
        y.backward()

    assert_leaf_grads_match(program, arrays((5,)))


# -- autograd.grad ------------------------------------------------------------------------------
def test_autograd_grad_basic():
    def program(lib, x, y):
        return lib.autograd.grad((x * y + x * x).sum(), [x, y])

    (ours, oleaves), (theirs, tleaves) = run_both(program, arrays((3,), (3,)))
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o, t)
    assert all(t.grad is None for t in oleaves)  # autograd.grad does not touch .grad


def test_autograd_grad_with_grad_outputs():
    def program(lib, x):
        y = x * x * x
        return lib.autograd.grad(y, x, grad_outputs=lib.ones(4, dtype=lib.float64) * 0.5)

    (ours, _), (theirs, _) = run_both(program, arrays((4,)))
    assert_same(ours[0], theirs[0])


def test_autograd_grad_allow_unused():
    def program(lib, x, unused):
        return lib.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)

    (ours, _), (theirs, _) = run_both(program, arrays((3,), (2,)))
    assert_same(ours[0], theirs[0])
    assert ours[1] is None and theirs[1] is None


def test_autograd_grad_unused_raises():
    def make(lib):
        x, unused = lib.ones(3, requires_grad=True), lib.ones(2, requires_grad=True)
        return lambda: lib.autograd.grad((x * 2).sum(), [x, unused])

    expect_same_error(make(torch), make(flow),
                      "The differentiated Tensor at index 1 appears to not have been used")


def test_autograd_grad_of_input_not_requiring_grad_raises():
    def make(lib):
        x = lib.ones(3, requires_grad=True)
        return lambda: lib.autograd.grad((x * 2).sum(), [lib.ones(2)])

    expect_same_error(make(torch), make(flow),
                      "One of the differentiated Tensors does not require grad")


def test_autograd_grad_results_are_detached_without_create_graph():
    x = flow.ones(3, requires_grad=True)
    (g,) = flow.autograd.grad((x * x).sum(), x)
    assert not g.requires_grad


def test_second_derivative_of_cube():
    def program(lib, x):
        y = x**3
        (g,) = lib.autograd.grad(y.sum(), x, create_graph=True)
        assert g.requires_grad
        (gg,) = lib.autograd.grad(g.sum(), x, create_graph=True)
        (ggg,) = lib.autograd.grad(gg.sum(), x)
        return g, gg, ggg

    (ours, (x,)), (theirs, _) = run_both(program, arrays((5,)))
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o, t)
    np.testing.assert_allclose(values(ours[1]), 6 * values(x))  # d2/dx2 x^3 = 6x


def test_higher_order_sin_exp_composition():
    def program(lib, x):
        y = (x.sin() * x.exp()).sum()
        (g,) = lib.autograd.grad(y, x, create_graph=True)
        (gg,) = lib.autograd.grad(g.sum(), x, create_graph=True)
        gg.sum().backward()
        return g, gg

    (ours, (ox,)), (theirs, (tx,)) = run_both(program, arrays((6,)))
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o, t)
    assert_same(ox.grad, tx.grad)  # third derivative accumulated into .grad


def test_hessian_vector_product():
    def program(lib, x, v):
        y = (x.tanh() * x * x).sum()
        (g,) = lib.autograd.grad(y, x, create_graph=True)
        (hv,) = lib.autograd.grad((g * v.detach()).sum(), x)
        return hv

    (ours, _), (theirs, _) = run_both(program, arrays((4,), (4,), seed=2))
    assert_same(ours, theirs)


def test_gradient_penalty():
    # WGAN-GP style: the gradient of a penalty on d(out)/d(input) reaches the weights.
    def program(lib, x, w1, w2):
        h = (x @ w1).tanh()
        out = (h @ w2).sum()
        (gx,) = lib.autograd.grad(out, x, create_graph=True)
        penalty = ((gx * gx).sum(1) - 1) * ((gx * gx).sum(1) - 1)
        loss = penalty.mean() + out * 0.1
        loss.backward()
        return gx

    (ours, oleaves), (theirs, tleaves) = run_both(program, arrays((4, 3), (3, 5), (5, 2),
                                                                  seed=3))
    assert_same(ours, theirs)
    for o, t in zip(oleaves, tleaves, strict=True):
        assert_same(o.grad, t.grad)


def test_create_graph_backward_accumulates_differentiable_grad():
    def program(lib, x):
        (x * x * x).sum().backward(create_graph=True)
        g = x.grad
        assert g.requires_grad
        x.grad = None
        g.sum().backward()

    assert_leaf_grads_match(program, arrays((3,)))


# -- grad modes ---------------------------------------------------------------------------------
def test_no_grad_context_and_nesting():
    x = flow.ones(2, requires_grad=True)
    assert flow.is_grad_enabled()
    with flow.no_grad():
        assert not flow.is_grad_enabled()
        y = x * 2
        with flow.enable_grad():
            assert flow.is_grad_enabled()
            z = x * 2
        assert not flow.is_grad_enabled()
    assert flow.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad


def test_grad_mode_restored_after_exception():
    with pytest.raises(ValueError):
        with flow.no_grad():
            raise ValueError
    assert flow.is_grad_enabled()


def test_grad_mode_decorators_match_torch():
    def probe(lib, deco):
        @deco
        def f():
            return lib.is_grad_enabled()

        return f

    for lib in (torch, flow):
        assert probe(lib, lib.no_grad())() is False
        assert probe(lib, lib.no_grad)() is False  # bare decorator, as torch allows
        assert probe(lib, lib.set_grad_enabled(False))() is False
        # Building the set_grad_enabled decorator must not leave grad disabled.
        assert lib.is_grad_enabled()
        with lib.no_grad():
            assert probe(lib, lib.enable_grad())() is True
            # torch's inference_mode(False) turns grad mode on inside no_grad.
            assert probe(lib, lib.inference_mode(False))() is True
        assert probe(lib, lib.inference_mode())() is False
        assert lib.is_grad_enabled()


def test_set_grad_enabled_as_function_and_context():
    for lib in (torch, flow):
        lib.set_grad_enabled(False)
        try:
            assert not lib.is_grad_enabled()
        finally:
            lib.set_grad_enabled(True)
        with lib.set_grad_enabled(False):
            assert not lib.is_grad_enabled()
            with lib.set_grad_enabled(True):
                assert lib.is_grad_enabled()
            assert not lib.is_grad_enabled()
        assert lib.is_grad_enabled()


def test_no_grad_decorated_function_result():
    x = flow.ones(2, requires_grad=True)

    @flow.no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad
    assert (x * 2).requires_grad


# -- detach --------------------------------------------------------------------------------------
def test_detach_stops_gradient():
    def program(lib, x):
        y = x * x
        (y.detach() * x + y).sum().backward()

    assert_leaf_grads_match(program, arrays((3,)))


def test_detach_in_place_variant():
    x = flow.ones(2, requires_grad=True)
    y = x * 2
    y.detach_()
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf


# -- hooks -----------------------------------------------------------------------------------
def test_leaf_hook_modifies_grad():
    def program(lib, x):
        seen = []
        x.register_hook(lambda g: seen.append(values(g).copy()))
        x.register_hook(lambda g: g * 2)
        (x * x).sum().backward()
        return seen

    (oseen, (ox,)), (tseen, (tx,)) = run_both(program, arrays((3,)))
    np.testing.assert_allclose(oseen[0], tseen[0])
    assert_same(ox.grad, tx.grad)


def test_non_leaf_hook_changes_upstream_grad():
    def program(lib, x):
        h = x * 3
        h.register_hook(lambda g: g * g)
        (h * h).sum().backward()

    assert_leaf_grads_match(program, arrays((4,)))


def test_hook_sees_summed_grad_once():
    def program(lib, x):
        calls = []
        h = x * 2
        h.register_hook(lambda g: calls.append(values(g).copy()))
        (h * 3 + h * h).sum().backward()
        return calls

    (ocalls, _), (tcalls, _) = run_both(program, arrays((3,)))
    assert len(ocalls) == len(tcalls) == 1
    np.testing.assert_allclose(ocalls[0], tcalls[0])


def test_hook_handle_remove():
    def program(lib, x):
        handle = x.register_hook(lambda g: g * 10)
        (x * 2).sum().backward()
        handle.remove()
        (x * 2).sum().backward()

    assert_leaf_grads_match(program, arrays((3,)))


def test_hook_on_tensor_without_grad_raises():
    expect_same_error(lambda: torch.ones(2).register_hook(lambda g: g),
                      lambda: flow.ones(2).register_hook(lambda g: g),
                      "cannot register a hook on a tensor that doesn't require gradient")


def test_retain_grad():
    def program(lib, x):
        h = x * x
        h.retain_grad()
        k = h * 2
        (k * h).sum().backward()
        return h, k

    ((oh, ok), (ox,)), ((th, tk), (tx,)) = run_both(program, arrays((3,)))
    assert oh.retains_grad and th.retains_grad
    assert_same(oh.grad, th.grad)
    assert ok.grad is None
    assert_same(ox.grad, tx.grad)


def test_retain_grad_accumulates_across_backwards():
    def program(lib, x):
        h = x * 2
        h.retain_grad()
        y = (h * h).sum()
        y.backward(retain_graph=True)
        y.backward()
        return h

    (oh, _), (th, _) = run_both(program, arrays((3,)))
    assert_same(oh.grad, th.grad)


def test_retain_grad_on_leaf_is_noop():
    x = flow.ones(2, requires_grad=True)
    x.retain_grad()
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


# -- custom Function ---------------------------------------------------------------------------
def _functions(lib):
    class Cube(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x * x

    class ScaledMul(lib.autograd.Function):
        """f(a, s, b) = s * a * b with a Python number s; records needs_input_grad."""

        @staticmethod
        def forward(ctx, a, scale, b):
            ctx.save_for_backward(a, b)
            ctx.scale = scale
            ctx.seen_needs = ctx.needs_input_grad
            return a * b * scale

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            ga = g * b * ctx.scale if ctx.needs_input_grad[0] else None
            gb = g * a * ctx.scale if ctx.needs_input_grad[2] else None
            return ga, None, gb

    class SplitTwo(lib.autograd.Function):
        """Two differentiable outputs and one integer output marked non-differentiable."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            idx = (x * 0).to(lib.int64)
            mask = x * 0
            ctx.mark_non_differentiable(mask)
            return x * 2, x.exp(), idx, mask

        @staticmethod
        def backward(ctx, g_double, g_exp, g_idx, g_mask):
            (x,) = ctx.saved_tensors
            return g_double * 2 + g_exp * x.exp()

    return Cube, ScaledMul, SplitTwo


def test_custom_function_cube_with_double_backward():
    def program(lib, x):
        Cube, _, _ = _functions(lib)
        y = Cube.apply(x)
        assert y.grad_fn.name() == "CubeBackward"
        (g,) = lib.autograd.grad(y.sum(), x, create_graph=True)
        g.sum().backward()
        return y, g

    ((oy, og), (ox,)), ((ty, tg), (tx,)) = run_both(program, arrays((4,)))
    assert_same(oy, ty)
    assert_same(og, tg)
    assert_same(ox.grad, tx.grad)


def _check_needs_input_grad(lib):
    _, ScaledMul, _ = _functions(lib)
    a = lib.ones(2, requires_grad=True)
    b = lib.ones(2)
    seen = {}

    class Probe(ScaledMul):
        @staticmethod
        def forward(ctx, a, scale, b):
            seen["needs"] = tuple(ctx.needs_input_grad)
            return ScaledMul.forward(ctx, a, scale, b)

    Probe.apply(a, 2.0, b).sum().backward()
    assert seen["needs"] == (True, False, False)
    assert a.grad.tolist() == [2.0, 2.0]


def test_custom_function_needs_input_grad_and_python_args():
    def program(lib, a, b):
        _, ScaledMul, _ = _functions(lib)
        ScaledMul.apply(a, 2.5, b.detach()).sum().backward()

    for lib in (torch, flow):
        _check_needs_input_grad(lib)
    assert_leaf_grads_match(program, arrays((3,), (3,)))


def test_custom_function_both_inputs_need_grad():
    def program(lib, a, b):
        _, ScaledMul, _ = _functions(lib)
        (ScaledMul.apply(a, -1.5, b) * a).sum().backward()

    assert_leaf_grads_match(program, arrays((3,), (3,), seed=4))


def test_custom_function_multiple_outputs_and_non_differentiable():
    def program(lib, x):
        _, _, SplitTwo = _functions(lib)
        d, e, idx, mask = SplitTwo.apply(x)
        assert d.requires_grad and e.requires_grad
        assert not idx.requires_grad and not mask.requires_grad
        d.sum().backward(retain_graph=True)  # e gets no gradient: backward receives zeros
        first = x.grad.detach().clone()
        (d * e).sum().backward()
        return d, e, first

    ((od, oe, ofirst), (ox,)), ((td, te, tfirst), (tx,)) = run_both(program, arrays((3,)))
    assert_same(od, td)
    assert_same(oe, te)
    assert_same(ofirst, tfirst)
    assert_same(ox.grad, tx.grad)


def _check_materialize_grads_off(lib):
    got = {}

    class Two(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, g1, g2):
            got["g2"] = g2
            return g1 * 2

    x = lib.ones(2, requires_grad=True)
    a, _ = Two.apply(x)
    a.sum().backward()
    assert got["g2"] is None, lib.__name__
    assert x.grad.tolist() == [2.0, 2.0]


def test_custom_function_materialize_grads_off():
    for lib in (torch, flow):
        _check_materialize_grads_off(lib)


def test_custom_function_saved_tensor_version_check():
    def make(lib):
        Cube, _, _ = _functions(lib)
        x = lib.ones(3, requires_grad=True)
        h = x * 1
        y = Cube.apply(h)
        h.mul_(2)
        return lambda: y.sum().backward()

    expect_same_error(make(torch), make(flow),
                      "one of the variables needed for gradient computation has been modified "
                      "by an inplace operation")


def test_custom_function_wrong_number_of_grads_raises():
    for lib in (torch, flow):
        class Bad(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x, y):
                return x * y

            @staticmethod
            def backward(ctx, g):
                return g

        x, y = lib.ones(2, requires_grad=True), lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="incorrect number of gradients"):
            Bad.apply(x, y).sum().backward()


# -- version counter -----------------------------------------------------------------------------
VERSION_MSG_END = "expected version 0 instead."


def test_modified_saved_output_raises_torch_message():
    def make(lib):
        x = lib.ones(3, requires_grad=True)
        y = x.exp()  # exp saves its output
        y.add_(1)
        return lambda: y.sum().backward()

    expect_same_error(make(torch), make(flow), VERSION_MSG_END)


def test_modified_saved_input_raises_torch_message():
    def make(lib):
        x = lib.ones(3, requires_grad=True)
        a = x * 1
        b = a * a  # saves a
        a.add_(1)
        return lambda: b.sum().backward()

    expect_same_error(make(torch), make(flow), VERSION_MSG_END)


def test_modified_saved_leaf_without_grad_raises_torch_message():
    def make(lib):
        x = lib.ones(3, requires_grad=True)
        w = lib.ones(3)
        y = x * w  # the gradient for x needs w
        w.add_(1)
        return lambda: y.sum().backward()

    expect_same_error(make(torch), make(flow), VERSION_MSG_END)


def test_modifying_tensor_the_formula_does_not_use_is_fine():
    def program(lib, x):
        a = x.clone()
        w = lib.ones(3, dtype=lib.float64) * 2
        z = a * w  # only d/da is needed, which uses w, not a
        a.add_(1)
        s = x + 0
        u = s + w  # add saves nothing
        s.mul_(3)
        (z + u).sum().backward()

    assert_leaf_grads_match(program, arrays((3,)))


def test_leaf_in_place_raises():
    tx, fx = torch.ones(2, requires_grad=True), flow.ones(2, requires_grad=True)
    expect_same_error(lambda: tx.add_(1), lambda: fx.add_(1),
                      "a leaf Variable that requires grad is being used in an in-place "
                      "operation.")
    expect_same_error(lambda: tx.mul_(2), lambda: fx.mul_(2), "a leaf Variable")


def test_leaf_in_place_under_no_grad_is_allowed():
    for lib in (torch, flow):
        x = lib.ones(2, requires_grad=True)
        with lib.no_grad():
            x.mul_(3)
        assert x.requires_grad and x.is_leaf and x.grad_fn is None
        (x * x).sum().backward()
        assert x.grad.tolist() == [6.0, 6.0]


def test_in_place_on_non_leaf_gives_torch_grads():
    def program(lib, x, y):
        h = x * y
        h.mul_(y)
        h.add_(x)
        h.mul_(2)
        (h * h).exp().sum().backward()

    assert_leaf_grads_match(program, arrays((3,), (3,), seed=5))


# -- a table of small programs: same results (or the same exception type) as torch -----------
def _p_leaf_backward(L):
    x = L.ones(2, requires_grad=True)
    x.backward(L.tensor([1.0, 2.0]))
    return [x.grad]


def _p_grad_wrt_intermediate(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    return list(L.autograd.grad((h * h).sum(), [h, x]))


def _p_backward_inputs_non_leaf(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    (h * h).sum().backward(inputs=[h])
    return [h.grad, x.grad]


def _p_retain_grad_then_hook(L):
    # retain_grad records the gradient after the tensor's other hooks, whatever the order.
    x = L.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.retain_grad()
    h.register_hook(lambda g: g * 10)
    (h * h).sum().backward()
    return [h.grad, x.grad]


def _p_hook_then_retain_grad(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.register_hook(lambda g: g * 10)
    h.retain_grad()
    (h * h).sum().backward()
    return [h.grad, x.grad]


def _p_retain_grad_follows_in_place(L):
    x = L.ones(3, requires_grad=True)
    v = x.clone()[1:]
    v.retain_grad()
    v.mul_(2)
    v.sum().backward()
    return [x.grad, v.grad]


def _p_integer_operand(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    (x * L.tensor([1, 2])).sum().backward()
    return [x.grad]


def _p_detach_then_requires_grad(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x.detach().requires_grad_()
    (y * 2).sum().backward()
    return [x.grad, y.grad]


def _p_hook_then_in_place(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x.clone()
    h.register_hook(lambda g: g * 2)
    h.mul_(3)
    h.sum().backward()
    return [x.grad]


def _p_view_after_base_in_place(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    z = y.view(3)
    y.mul_(2)
    (z * z).sum().backward()
    return [x.grad, z]


def _p_setitem_from_self(L):
    x = L.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = x.clone()
    b[0, 0] = b[1, 1] * 5
    (b * b).sum().backward()
    return [x.grad]


def _p_add_self_in_place(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    y.add_(y)
    (y * y).sum().backward()
    return [x.grad]


def _p_no_grad_mixed(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with L.no_grad():
        y = x * 2
    (y * x).sum().backward()
    return [x.grad]


def _p_leaf_hook_once_for_two_uses(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    x.register_hook(lambda g: calls.append(1))
    (x * x + x * 3).sum().backward()
    return [x.grad, L.tensor(float(len(calls)))]


def _p_grad_of_many_outputs(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    return list(L.autograd.grad([x * 2, x * x], [x], grad_outputs=[L.ones(2), L.ones(2) * 2]))


def _p_max_dim_values(L):
    x = L.tensor([[1.0, 5.0], [3.0, 2.0]], requires_grad=True)
    values, _ = x.max(dim=1)
    values.sum().backward()
    return [x.grad]


def _p_no_grad_in_place_on_saved(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    with L.no_grad():
        y.mul_(2)  # still bumps the version: backward must refuse
    y.sum().backward()
    return [x.grad]


def _p_cast_to_float64(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    (x.to(L.float64) * 3).sum().backward()
    return [x.grad]


def _p_in_place_into_tensor_without_grad(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    z = L.zeros(3)
    z.add_(x * 2)
    z.mul_(x)
    z.sum().backward()
    return [x.grad]


def _p_copy_from_leaf(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    z = L.zeros(3)
    z.copy_(x)
    (z * z).sum().backward()
    return [x.grad]


def _p_detach_shares_version(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    y.detach().add_(1)
    y.sum().backward()
    return [x.grad]


def _p_hessian_row(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    (g,) = L.autograd.grad((x * x * x).sum(), x, create_graph=True)
    (row,) = L.autograd.grad(g, x, grad_outputs=L.tensor([1.0, 0.0]))
    return [g, row]


def _p_grad_twice_retained(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    (g1,) = L.autograd.grad(y, x, retain_graph=True)
    (g2,) = L.autograd.grad(y, x)
    return [g1, g2]


def _p_grad_twice_freed(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    L.autograd.grad(y, x)
    return list(L.autograd.grad(y, x))


def _p_preset_grad_accumulates(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    x.grad = L.tensor([5.0, 5.0])
    (x * 2).sum().backward()
    return [x.grad]


def _p_hook_on_scalar_root(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x.sum()
    y.register_hook(lambda g: g * 3)
    y.backward()
    return [x.grad]


def _p_leaf_hook_applies_to_autograd_grad(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda g: g * 3)
    (g,) = L.autograd.grad((x * 2).sum(), x)
    return [g, x.grad]


def _p_non_leaf_hook_applies_to_autograd_grad(L):
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    y.register_hook(lambda g: g * 3)
    return list(L.autograd.grad((y * 2).sum(), y))


def _p_zero_dim_third_derivative(L):
    x = L.tensor(2.0, requires_grad=True)
    (g1,) = L.autograd.grad(x * x, x, create_graph=True)
    (g2,) = L.autograd.grad(g1, x, create_graph=True)
    (g3,) = L.autograd.grad(g2, x, allow_unused=True)
    return [g1, g2, g3]


def _p_fill_keeps_tensor_in_graph(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x * 2
    h.fill_(3.0)
    h.zero_()
    (h + x).sum().backward()
    return [x.grad, h]


def _p_copy_constant_keeps_tensor_in_graph(L):
    x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = x * 2
    h.copy_(L.ones(3))
    (h * x).sum().backward()
    return [x.grad]


def _p_in_place_result_saved_then_modified(L):
    # exp_ saves its result, which is the tensor itself: a later write must be caught.
    x = L.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1
    h.exp_()
    h.mul_(2)
    h.sum().backward()
    return [x.grad]


def _p_in_place_result_saved_then_view_modified(L):
    x = L.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    h = x * 1
    h[0].exp_()
    h.add_(1)
    h.sum().backward()
    return [x.grad]


def _p_in_place_result_saved_unmodified(L):
    x = L.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    h = x * 1
    h[0].exp_()
    h.sigmoid_()
    (h * h).sum().backward()
    return [x.grad]


PROGRAMS = [(f.__name__[3:], f) for f in [
    _p_fill_keeps_tensor_in_graph, _p_copy_constant_keeps_tensor_in_graph,
    _p_in_place_result_saved_then_modified, _p_in_place_result_saved_then_view_modified,
    _p_in_place_result_saved_unmodified,
    _p_leaf_backward, _p_grad_wrt_intermediate, _p_backward_inputs_non_leaf,
    _p_retain_grad_then_hook, _p_hook_then_retain_grad, _p_retain_grad_follows_in_place,
    _p_integer_operand, _p_detach_then_requires_grad, _p_hook_then_in_place,
    _p_view_after_base_in_place, _p_setitem_from_self, _p_add_self_in_place,
    _p_no_grad_mixed, _p_leaf_hook_once_for_two_uses, _p_grad_of_many_outputs,
    _p_max_dim_values, _p_no_grad_in_place_on_saved, _p_cast_to_float64,
    _p_in_place_into_tensor_without_grad, _p_copy_from_leaf, _p_detach_shares_version,
    _p_hessian_row, _p_grad_twice_retained, _p_grad_twice_freed, _p_preset_grad_accumulates,
    _p_hook_on_scalar_root, _p_leaf_hook_applies_to_autograd_grad,
    _p_non_leaf_hook_applies_to_autograd_grad, _p_zero_dim_third_derivative,
]]


@pytest.mark.parametrize("name,program", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_program_matches_torch(name, program):
    try:
        theirs = program(torch)
    except RuntimeError as exc:
        with pytest.raises(type(exc)):
            program(flow)
        return
    ours = program(flow)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o, t, rtol=1e-6, atol=1e-7)


# -- torch.autograd.Variable, the pre-0.4 wrapper --------------------------------------------
def _variable_program(lib):
    from_module = __import__(lib.__name__ + ".autograd.variable", fromlist=["Variable"]).Variable
    assert from_module is lib.autograd.Variable
    Variable = lib.autograd.Variable  # noqa: N806 - torch's name
    x = lib.tensor([1.0, 2.0, 3.0])
    w = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = w * 2
    v = Variable(x)
    vw = Variable(w)
    vy = Variable(y, requires_grad=True)
    (vy * v).sum().backward()
    v[0] = 5.0  # shares x's memory
    return [x, vy.grad, lib.tensor([float(v.requires_grad), float(vw.requires_grad),
                                    float(vw.grad_fn is None), float(y.grad_fn is not None)]),
            Variable(), lib.tensor([isinstance(x, Variable), isinstance(w, Variable),
                                    isinstance(lib.nn.Parameter(x), Variable),
                                    isinstance(3.0, Variable), isinstance([x], Variable)])]


def test_variable_matches_torch():
    ours, theirs = _variable_program(flow), _variable_program(torch)
    for o, t in zip(ours, theirs, strict=True):
        assert_same(o, t)
    assert ours[3].dtype == flow.float32 and tuple(ours[3].shape) == (0,)


@pytest.mark.parametrize("call", [
    lambda lib: lib.autograd.Variable([1.0]),
    lambda lib: lib.autograd.Variable(lib.ones(2, dtype=lib.int64), requires_grad=True),
    lambda lib: lib.autograd.Variable(lib.ones(2), foo=1),
])
def test_variable_errors_match_torch(call):
    with pytest.raises(Exception) as theirs:
        call(torch)
    with pytest.raises(type(theirs.value)):
        call(flow)


def test_variable_volatile_warns_like_torch():
    for lib in (torch, flow):
        with pytest.warns(UserWarning, match="volatile was removed"):
            v = lib.autograd.Variable(lib.ones(2), volatile=True)
        assert not v.requires_grad


def test_autograd_variable_function_is_deprecated_like_torch():
    for lib in (torch, flow):
        with pytest.raises(RuntimeError, match=r"variable\(...\) is deprecated"):
            lib.autograd.variable(1.0)


def _inference_mode_trace(lib):
    seen = [lib.is_inference_mode_enabled()]
    with lib.inference_mode():
        seen.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))
        with lib.inference_mode(False):
            seen.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))
        with lib.no_grad():
            seen.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))
        seen.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))

    @lib.inference_mode()
    def inside():
        return lib.is_inference_mode_enabled()

    @lib.inference_mode
    def inside_bare():
        return lib.is_inference_mode_enabled()

    seen += [inside(), inside_bare(), lib.is_inference_mode_enabled()]
    return seen


def test_is_inference_mode_enabled_matches_torch():
    assert _inference_mode_trace(flow) == _inference_mode_trace(torch)
