"""nn.Graph reuses a compiled plan only while it is still right, and says so when it is not.

Each class of change a user can make between two calls of a graph is made here, and the
graph's result after it is compared with what eager mode (or torch) gives for the same
program: Python constants that compare equal but differ in type or sign, NaN constants, a
replaced parameter, buffer or submodule, `model.double()`, `requires_grad_(False)`,
`p.data = ...`, in-place writes to inputs, a second backward, optimizer state of the wrong
shape, and the errors for nesting, torch tensors and running out of memory."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.nn import graph as G
from sbpflow.runtime import runtime as runtime_mod

F = flow.nn.functional


class Fn(flow.nn.Graph):
    """A graph of a plain function of the call's arguments (and optional modules)."""

    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for k, m in modules.items():
            setattr(self, k, m)

    def build(self, *args):
        return self.fn(self, *args)


class Train(flow.nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x):
        loss = self.model(x).square().sum()
        loss.backward()
        return loss


def _x(*shape, seed=0):
    return flow.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _plans(g) -> list:
    return list(g._cache.values())


# -- Python constants ---------------------------------------------------------------------------
@pytest.mark.parametrize("first,second", [(1, 1.0), (1, True), (1.0, True), (0.0, -0.0),
                                          (-0.0, 0.0), (2, 2.0)])
def test_constants_equal_under_eq_get_their_own_plan(first, second):
    """`full(c)` has a dtype per Python type and `1 / c` a sign per zero: a plan traced for
    one constant must not serve the other (1 == 1.0 == True, 0.0 == -0.0 in Python)."""
    g = Fn(lambda self, x, c: (x + flow.full((2,), c), 1 / flow.full((2,), c)))
    x = flow.zeros(2, dtype=flow.float64)
    for c in (first, second, first):
        total, inv = g(x, c)
        want_total = torch.zeros(2, dtype=torch.float64) + torch.full((2,), c)
        want_inv = 1 / torch.full((2,), c)
        assert total.dtype.name == str(want_total.dtype).split(".")[1]
        assert inv.dtype.name == str(want_inv.dtype).split(".")[1]
        np.testing.assert_array_equal(inv.numpy(), want_inv.numpy())
        np.testing.assert_array_equal(np.signbit(inv.numpy()), np.signbit(want_inv.numpy()))
    assert len(g._cache) == 2


@pytest.mark.parametrize("make_nan", [lambda: float("nan"), lambda: -float("nan"),
                                      lambda: np.float64("nan"), lambda: math.nan,
                                      lambda: (1.0, float("nan"))])
def test_nan_constant_reuses_its_plan(make_nan):
    """NaN != NaN, but a NaN constant is the same constant: 20 calls, one plan."""
    g = Fn(lambda self, x, c: x * (c[1] if isinstance(c, tuple) else c))
    x = flow.ones(3)
    for _ in range(20):
        out = g(x, make_nan())
        assert np.isnan(out.numpy()).all()
    assert len(g._cache) == 1


def test_numpy_array_constant_is_keyed_by_value():
    g = Fn(lambda self, x, a: x + flow.tensor(a))
    x = flow.zeros(2000, dtype=flow.float64)
    a = np.arange(2000.0)  # long enough that its repr elides the middle
    np.testing.assert_array_equal(g(x, a).numpy(), a)
    a[1000] = -1.0  # the same object, now another constant
    np.testing.assert_array_equal(g(x, a).numpy(), a)
    np.testing.assert_array_equal(g(x, a.copy()).numpy(), a)  # equal values: its plan
    assert len(g._cache) == 2


# -- the plan cache's bound ----------------------------------------------------------------------
def test_plan_cache_is_bounded_and_warns_once():
    g = Fn(lambda self, x, c: x * c)
    x = flow.ones(2)
    n = G.DEFAULT_PLAN_CACHE_SIZE
    with pytest.warns(RuntimeWarning, match="keeps the 10 most recently used") as record:
        for c in range(n + 5):
            np.testing.assert_array_equal(g(x, c).numpy(), [c, c])
    assert len([w for w in record if w.category is RuntimeWarning]) == 1
    assert len(g._cache) == n
    # An evicted constant compiles again and is still right.
    np.testing.assert_array_equal(g(x, 0).numpy(), [0, 0])


def test_dynamic_input_shape_bound_drops_quietly():
    class Dyn(flow.nn.Graph):
        @flow.nn.Graph.with_dynamic_input_shape(size=3)
        def __init__(self):
            super().__init__()

        def build(self, x):
            return x.sum(0)

    g = Dyn()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in range(1, 8):
            np.testing.assert_array_equal(g(flow.ones(n, 2)).numpy(), [n, n])
    assert len(g._cache) == 3


# -- module changes after the first call --------------------------------------------------------
def _linear(seed=0, i=3, o=2):
    flow.manual_seed(seed)
    return flow.nn.Linear(i, o)


def _eval_graph(m):
    return Fn(lambda self, x: self.m(x), m=m)


def test_replaced_parameter_is_read():
    m = _linear()
    g = _eval_graph(m)
    x = _x(4, 3)
    g(x)
    new = np.arange(6, dtype=np.float32).reshape(2, 3)
    m.weight = flow.nn.Parameter(flow.tensor(new))
    np.testing.assert_allclose(g(x).numpy(), x.numpy() @ new.T + m.bias.numpy(), rtol=1e-6)


def test_replaced_buffer_and_submodule_are_read():
    flow.manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.BatchNorm1d(4)).eval()
    g = _eval_graph(model)
    x = _x(5, 3)
    g(x)
    model[1].running_mean = flow.full((4,), 2.0)
    np.testing.assert_allclose(g(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    model[0] = _linear(seed=7, o=4)
    np.testing.assert_allclose(g(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_forward_hooks_added_or_removed_after_first_call_run_as_eager():
    m = _linear()
    g = _eval_graph(m)
    x = _x(4, 3)
    g(x)
    handle = m.register_forward_hook(lambda mod, args, out: out * 10)
    np.testing.assert_allclose(g(x).numpy(), m(x).numpy(), rtol=1e-6)
    pre = m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    np.testing.assert_allclose(g(x).numpy(), m(x).numpy(), rtol=1e-6)
    handle.remove()
    pre.remove()
    np.testing.assert_allclose(g(x).numpy(), m(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(g(x).numpy(), x.numpy() @ m.weight.numpy().T + m.bias.numpy(),
                               rtol=1e-6)


def test_data_assignment_is_read():
    m = _linear()
    g = _eval_graph(m)
    x = _x(4, 3)
    g(x)
    m.weight.data = flow.ones(2, 3)  # the same Parameter, new memory
    np.testing.assert_allclose(g(x).numpy(), x.numpy() @ np.ones((3, 2)) + m.bias.numpy(),
                               rtol=1e-6)
    m.weight.data = flow.ones(3, 2).T  # a transposed layout
    np.testing.assert_allclose(g(x).numpy(), x.numpy() @ np.ones((3, 2)) + m.bias.numpy(),
                               rtol=1e-6)


def test_double_after_first_call_follows_eager():
    m = _linear()
    g = _eval_graph(m)
    x = _x(4, 3)
    g(x)
    m.double()
    # Eager refuses a float32 input to float64 weights; the old float32 plan must not run.
    with pytest.raises(RuntimeError) as eager:
        m(x)
    with pytest.raises(type(eager.value)):
        g(x)
    out = g(x.double())
    assert out.dtype == flow.float64
    np.testing.assert_allclose(out.numpy(), m(x.double()).numpy(), rtol=1e-12)


def _torch_linear(m):
    t = torch.nn.Linear(m.in_features, m.out_features)
    with torch.no_grad():
        t.weight.copy_(torch.from_numpy(m.weight.numpy()))
        t.bias.copy_(torch.from_numpy(m.bias.numpy()))
    return t


def test_frozen_weight_stops_training_as_torch():
    m = _linear()
    tm = _torch_linear(m)
    g = Train(m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    x = _x(4, 3)
    for step in range(4):
        if step == 2:
            m.weight.requires_grad_(False)
            tm.weight.requires_grad_(False)
            tm.weight.grad = None  # what torch's zero_grad(set_to_none) leaves for it
        g(x)
        topt.zero_grad()
        tm(torch.from_numpy(x.numpy())).square().sum().backward()
        topt.step()
    np.testing.assert_allclose(m.weight.numpy(), tm.weight.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(m.bias.numpy(), tm.bias.detach().numpy(), rtol=1e-5)


def test_replaced_parameter_in_training_graph_as_torch():
    """The optimizer still holds the old parameter (as in torch), so the new one is read but
    not updated, and the old one is no longer trained."""
    m = _linear()
    tm = _torch_linear(m)
    g = Train(m, flow.optim.SGD(m.parameters(), lr=0.1))
    topt = torch.optim.SGD(tm.parameters(), lr=0.1)
    x = _x(4, 3)
    tx = torch.from_numpy(x.numpy())
    for step in range(3):
        if step == 1:
            new = np.full((2, 3), 0.5, np.float32)
            m.weight = flow.nn.Parameter(flow.tensor(new))
            tm.weight = torch.nn.Parameter(torch.from_numpy(new.copy()))
        loss = g(x)
        topt.zero_grad()
        tloss = tm(tx).square().sum()
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(m.weight.numpy(), tm.weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(m.bias.numpy(), tm.bias.detach().numpy(), rtol=1e-5)


def test_eager_steps_between_calls_keep_the_plan():
    """The guards are no false alarm: eager training between graph calls changes values,
    not the objects, layouts or flags the plan was built for."""
    m = _linear()
    opt = flow.optim.Adam(m.parameters(), lr=0.01)
    g = Train(m, opt)
    x = _x(4, 3)
    g(x)
    plan = _plans(g)
    for _ in range(2):
        opt.zero_grad()
        m(x).square().sum().backward()
        opt.step()
        g(x)
    m.load_state_dict(m.state_dict())
    g(x)
    assert _plans(g) == plan and _plans(g)[0] is plan[0]


# -- in-place writes to inputs ------------------------------------------------------------------
def _writers():
    return {
        "add_": lambda x: (x.add_(1), x * 2)[1],
        "mul_ twice": lambda x: (x.mul_(3), x.mul_(x), x.sum())[2],
        "zero_": lambda x: (x.zero_(), x + 1)[1],
        "copy_": lambda x: (x.copy_(x.flip(0)), x.exp())[1],
        "fill_ then clamp_": lambda x: (x.fill_(5.0), x.clamp_(max=2.0), x)[2],
    }


@pytest.mark.parametrize("name", list(_writers()))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_inplace_write_to_input_reaches_the_caller(name, layout):
    fn = _writers()[name]
    g = Fn(lambda self, x: fn(x))

    def make():
        base = _x(4, 6, seed=1)
        if layout == "transposed":
            return base, base.T
        if layout == "strided":
            return base, base[:, ::2]
        return base, base

    for _ in range(2):  # the second call runs the compiled plan
        base_e, x_e = make()
        want = fn(x_e)
        base_g, x_g = make()
        out = g(x_g)
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)
        np.testing.assert_allclose(x_g.numpy(), x_e.numpy(), rtol=1e-6)
        np.testing.assert_allclose(base_g.numpy(), base_e.numpy(), rtol=1e-6)


def test_inplace_write_to_leaf_requiring_grad_raises_as_eager():
    fn = _writers()["add_"]
    x = _x(3).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad") as eager:
        fn(x)
    g = Fn(lambda self, x: fn(x))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        g(x)
    assert "in-place" in str(eager.value)


def test_inplace_write_with_aliased_inputs_raises():
    g = Fn(lambda self, x, y: (x.add_(1), x + y)[1])
    a = flow.zeros(3)
    np.testing.assert_array_equal(g(a, flow.ones(3)).numpy(), [2, 2, 2])
    with pytest.raises(NotImplementedError, match="share memory"):
        g(a, a)


def test_graph_without_writes_has_no_writeback():
    g = Fn(lambda self, x: x + 1)
    x = flow.zeros(3)
    g(x)
    assert _plans(g)[0].writebacks == []
    np.testing.assert_array_equal(x.numpy(), [0, 0, 0])


# -- a second backward in build() ---------------------------------------------------------------
def _loss(w, x, saves):
    return (w * x).square().sum() if saves else (w + x).sum()


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("saves", [True, False])
def test_second_backward_in_build_as_eager(retain, saves):
    """torch raises for a second backward only through nodes whose saved tensors the first
    freed (mul and square save theirs, add and sum save none); with retain_graph=True, or
    without saved tensors, both gradients add up."""
    class W(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = flow.nn.Parameter(flow.ones(3))

    class Twice(flow.nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

        def build(self, x):
            loss = _loss(self.m.w, x, saves)
            loss.backward(retain_graph=retain)
            loss.backward()
            return loss

    w = torch.ones(3, requires_grad=True)
    loss = _loss(w, torch.arange(3.0), saves)
    loss.backward(retain_graph=retain)
    m = W()
    g = Twice(m)
    try:
        loss.backward()
    except RuntimeError as e:
        assert "second time" in str(e)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            g(flow.arange(3.0))
        return
    g(flow.arange(3.0))
    np.testing.assert_allclose(m.w.numpy(), 1.0 - w.grad.numpy(), rtol=1e-6)


# -- optimizer state ----------------------------------------------------------------------------
def _adam_graph():
    flow.manual_seed(0)
    m = flow.nn.Linear(8, 4)
    g = Train(m, flow.optim.Adam(m.parameters(), lr=0.01))
    g(_x(2, 8))
    return m, g


@pytest.mark.parametrize("bad", [flow.zeros(1), flow.zeros(8, 4), flow.zeros(4, 8).double(),
                                 flow.zeros(4, 8, dtype=flow.int64)])
def test_load_state_dict_checks_optimizer_state(bad):
    m, g = _adam_graph()
    sd = g.state_dict()
    before = {k: v.numpy().copy() for k, v in sd.items() if isinstance(v, flow.Tensor)}
    before_model = {k: v.numpy().copy() for k, v in sd["model"].items()}
    sd["model.weight-m"] = bad
    sd["model"] = {k: v + 1 for k, v in sd["model"].items()}  # must not be loaded either
    with pytest.raises(RuntimeError, match="'model.weight-m'"):
        g.load_state_dict(sd)
    bad_step = dict(g.state_dict())
    bad_step["model.weight-step"] = flow.zeros(2)
    with pytest.raises(RuntimeError, match="'model.weight-step'"):
        g.load_state_dict(bad_step)
    good = g.state_dict()
    for k, v in good.items():
        if isinstance(v, flow.Tensor):
            np.testing.assert_array_equal(v.numpy(), before[k])
    for k, v in good["model"].items():
        np.testing.assert_array_equal(v.numpy(), before_model[k])


def test_load_state_dict_round_trip_still_trains_as_before():
    m, g = _adam_graph()
    m2, g2 = _adam_graph()
    g2.load_state_dict(g.state_dict())
    x = _x(2, 8, seed=3)
    np.testing.assert_array_equal(g(x).numpy(), g2(x).numpy())
    np.testing.assert_array_equal(m.weight.numpy(), m2.weight.numpy())


def test_eager_state_of_wrong_shape_is_refused_at_the_call():
    m, g = _adam_graph()
    opt = g._optimizers[0][0]
    opt.state[m.weight]["exp_avg"] = flow.zeros(1)
    with pytest.raises(RuntimeError, match="model.weight-m"):
        g(_x(2, 8))


# -- clear errors -------------------------------------------------------------------------------
def test_nested_graph_call_says_nesting_is_unsupported():
    inner = Fn(lambda self, x: x + 1)
    outer = Fn(lambda self, x: inner(x) * 2)
    with pytest.raises(RuntimeError, match="nesting graphs is not supported"):
        outer(flow.ones(2))
    np.testing.assert_array_equal(inner(flow.ones(2)).numpy(), [2, 2])  # still usable


@pytest.mark.parametrize("wrap", [lambda t: (t,), lambda t: ([t],), lambda t: ({"x": t},)])
def test_torch_tensor_argument_is_named(wrap):
    g = Fn(lambda self, *a: a)
    with pytest.raises(TypeError, match="expected sbpflow Tensor, got torch.Tensor"):
        g(*wrap(torch.ones(2)))


def test_torch_tensor_inside_build_is_named():
    t = torch.ones(2)
    g = Fn(lambda self, x: x + flow.relu(t))
    with pytest.raises(TypeError, match="not torch.Tensor"):
        g(flow.ones(2))


def test_memory_error_while_compiling_names_graph_and_op(monkeypatch):
    """A memory block the machine cannot give: a RuntimeError naming the graph and the op
    with the largest buffer (numpy's allocation refused as on a machine without the room)."""
    real = np.empty

    class _NumpyWithoutRoom:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype=float):
            if isinstance(shape, int) and shape > 1 << 20:
                raise MemoryError(f"Unable to allocate {shape} bytes")
            return real(shape, dtype)

    monkeypatch.setattr(runtime_mod, "np", _NumpyWithoutRoom())
    # an outer product by broadcasting, + 1: one fused elementwise kernel writing a planned
    # 1024 x 1024 float32 buffer (kernels that allocate their own results get no offset)
    g = Fn(lambda self, x: (x.reshape(-1, 1) * x.reshape(1, -1) + 1).sum())
    with pytest.raises(RuntimeError) as err:
        g(flow.ones(1024))
    msg = str(err.value)
    assert g.name in msg and "out of memory while compiling" in msg
    assert "op fused_elementwise" in msg and "4,194,304 bytes" in msg
    assert __file__.split("/")[-1] in msg
    assert isinstance(err.value.__cause__, MemoryError)
