"""flow.nn.Graph end to end: training in a graph equals eager training (losses and final
parameters), eval graphs, switching modes, recompiling per signature, state dicts, proxies,
config, debug output, and build() errors raised at once."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph.trace import LazyTensorError
from sbpflow.nn import graph as G

F = flow.nn.functional


def _mlp(bn=False):
    flow.manual_seed(0)
    layers = [flow.nn.Linear(6, 16)]
    if bn:
        layers.append(flow.nn.BatchNorm1d(16))
    layers += [flow.nn.ReLU(), flow.nn.Linear(16, 4)]
    return flow.nn.Sequential(*layers)


def _cnn():
    flow.manual_seed(0)
    return flow.nn.Sequential(
        flow.nn.Conv2d(1, 4, 3, padding=1), flow.nn.BatchNorm2d(4), flow.nn.ReLU(),
        flow.nn.MaxPool2d(2), flow.nn.Flatten(), flow.nn.Linear(4 * 4 * 4, 4))


def _data(n=6, shape=(6,), steps=5, seed=0):
    rng = np.random.default_rng(seed)
    xs = [flow.tensor(rng.standard_normal((n, *shape)).astype(np.float32))
          for _ in range(steps)]
    ys = [flow.tensor(rng.integers(0, 4, n)) for _ in range(steps)]
    return xs, ys


class TrainGraph(flow.nn.Graph):
    def __init__(self, model, opt, lr_sch=None):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=lr_sch)

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


class EvalGraph(flow.nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


def _eager_step(model, opt, x, y, clip=None):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    if clip is not None:
        flow.nn.utils.clip_grad_norm_(model.parameters(), *clip)
    opt.step()
    return loss.item()


def _params(model):
    return [t.detach().numpy().copy() for t in model.state_dict().values()]


def _assert_same(a, b, rtol=1e-5, atol=1e-6):
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


OPTS = {
    "sgd": lambda p: flow.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
    "sgd_nesterov_wd": lambda p: flow.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                 weight_decay=0.01, maximize=False),
    "adam": lambda p: flow.optim.Adam(p, lr=0.01, weight_decay=0.01),
    "adamw_amsgrad": lambda p: flow.optim.AdamW(p, lr=0.01, amsgrad=True),
}


@pytest.mark.parametrize("fuse", [False, True], ids=["single", "fused"])
@pytest.mark.parametrize("opt", list(OPTS))
def test_mlp_trains_like_eager(opt, fuse):
    xs, ys = _data()
    m1 = _mlp()
    o1 = OPTS[opt](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _mlp()
    o2 = OPTS[opt](m2.parameters())
    g = TrainGraph(m2, o2)
    g.config.allow_fuse_model_update_ops(fuse)
    graph = [g(x, y).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))
    job = g._last.job
    multi = any(op.op_type.startswith("multi_") for op in job.ops)
    assert multi == fuse
    assert len(g._cache) == 1


@pytest.mark.parametrize("opt", ["sgd_momentum", "adam"])
def test_cnn_with_batchnorm_trains_like_eager(opt):
    xs, ys = _data(n=4, shape=(1, 8, 8), steps=4)
    m1 = _cnn()
    o1 = OPTS[opt](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _cnn()
    g = TrainGraph(m2, OPTS[opt](m2.parameters()))
    graph = [g(x, y).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))  # running statistics included
    assert m2[1].num_batches_tracked.item() == 4


def test_gradient_clipping_as_clip_grad_norm():
    xs, ys = _data()
    m1 = _mlp()
    o1 = flow.optim.SGD(m1.parameters(), lr=0.5, momentum=0.5)
    eager = [_eager_step(m1, o1, x, y, clip=(0.1, 2.0)) for x, y in zip(xs, ys)]
    m2 = _mlp()
    o2 = flow.optim.SGD([{"params": m2.parameters(), "clip_grad_max_norm": 0.1,
                          "clip_grad_norm_type": 2.0}], lr=0.5, momentum=0.5)
    g = TrainGraph(m2, o2)
    graph = [g(x, y).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))


def test_lr_scheduler_steps_after_each_call_without_recompiling():
    xs, ys = _data(steps=6)
    m1 = _mlp()
    o1 = flow.optim.SGD(m1.parameters(), lr=0.2, momentum=0.9)
    s1 = flow.optim.lr_scheduler.StepLR(o1, step_size=2, gamma=0.5)
    eager = []
    for x, y in zip(xs, ys):
        eager.append(_eager_step(m1, o1, x, y))
        s1.step()
    m2 = _mlp()
    o2 = flow.optim.SGD(m2.parameters(), lr=0.2, momentum=0.9)
    g = TrainGraph(m2, o2, flow.optim.lr_scheduler.StepLR(o2, step_size=2, gamma=0.5))
    graph = [g(x, y).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    assert o2.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 ** 3)
    assert len(g._cache) == 1


def test_eval_graph_equals_eager_forward():
    m = _mlp(bn=True)
    xs, ys = _data()
    o = flow.optim.SGD(m.parameters(), lr=0.1)
    for x, y in zip(xs, ys):
        _eager_step(m, o, x, y)
    m.eval()
    g = EvalGraph(m)
    for x in xs:
        np.testing.assert_allclose(g(x).numpy(), m(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    job = g._last.job
    assert not job.loss and not job.grads and not list(job.ops_of("assign"))


@pytest.mark.parametrize("opt", ["sgd_momentum", "adam", "adamw_amsgrad"])
def test_graph_then_eager_equals_eager_only(opt):
    xs, ys = _data(steps=6)
    m1 = _mlp()
    o1 = OPTS[opt](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _mlp()
    o2 = OPTS[opt](m2.parameters())
    g = TrainGraph(m2, o2)
    mixed = [g(x, y).item() for x, y in zip(xs[:3], ys[:3])]
    mixed += [_eager_step(m2, o2, x, y) for x, y in zip(xs[3:5], ys[3:5])]
    mixed.append(g(xs[5], ys[5]).item())  # and back into the graph
    np.testing.assert_allclose(mixed, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))


def test_eager_then_graph_sgd_first_step():
    # The first eager step sets buf = grad; the graph must not redo that, and an untouched
    # optimizer's first graph step must (dampening makes the difference visible).
    xs, ys = _data(steps=4)
    m1 = _mlp()
    o1 = OPTS["sgd_momentum"](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _mlp()
    o2 = OPTS["sgd_momentum"](m2.parameters())
    mixed = [_eager_step(m2, o2, xs[0], ys[0])]
    g = TrainGraph(m2, o2)
    mixed += [g(x, y).item() for x, y in zip(xs[1:], ys[1:])]
    np.testing.assert_allclose(mixed, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))


def test_new_shape_or_mode_recompiles_and_caches():
    m = _mlp(bn=True)
    g = EvalGraph(m)
    a, b = flow.randn(6, 6), flow.randn(3, 6)
    g(a)
    first = g._last
    g(b)
    assert len(g._cache) == 2 and g._last is not first
    g(a)
    assert g._last is first
    m.eval()
    np.testing.assert_allclose(g(b).numpy(), m(b).detach().numpy(), rtol=1e-6, atol=1e-6)
    assert len(g._cache) == 3
    g(b.double().float())  # same signature: no new plan
    assert len(g._cache) == 3


def test_compiling_pauses_the_gc_and_restores_its_state():
    import gc

    seen = []

    class Probe(EvalGraph):
        def build(self, x):
            seen.append(gc.isenabled())
            return self.model(x)

    g = Probe(_mlp())
    assert gc.isenabled()
    g(flow.randn(6, 6))
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        g(flow.randn(3, 6))  # a new plan: the GC stays off after it as before
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        g(flow.randn(3, 7))  # a build() error: the GC is on again
    assert gc.isenabled()


def test_state_dict_layout_and_round_trip():
    xs, ys = _data(steps=2)
    m = _mlp()
    o = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    g = TrainGraph(m, o)
    for x, y in zip(xs, ys):
        g(x, y)
    sd = g.state_dict()
    assert set(sd["model"]) == set(m.state_dict())
    assert "model.0.weight-momentum" in sd and "model.2.bias-momentum" in sd
    assert sd[G.TRAIN_STEP].item() == 2
    saved = {k: (v.detach().clone() if isinstance(v, flow.Tensor) else
                 {kk: vv.detach().clone() for kk, vv in v.items()}) for k, v in sd.items()}
    g(xs[0], ys[0])
    g.load_state_dict(saved)
    assert g.state_dict()[G.TRAIN_STEP].item() == 2
    np.testing.assert_array_equal(m[0].weight.detach().numpy(),
                                  saved["model"]["0.weight"].numpy())
    np.testing.assert_array_equal(o.state[m[0].weight]["momentum_buffer"].numpy(),
                                  saved["model.0.weight-momentum"].numpy())


def test_adam_state_names():
    xs, ys = _data(steps=1)
    m = _mlp()
    g = TrainGraph(m, flow.optim.Adam(m.parameters(), lr=0.01))
    g(xs[0], ys[0])
    sd = g.state_dict()
    for suffix in ("m", "v", "step"):
        assert f"model.0.weight-{suffix}" in sd
    assert sd["model.0.weight-step"].item() == 1


def test_proxy_modules_and_graph_module_settings():
    m = _mlp()
    g = EvalGraph(m)
    assert isinstance(g.model, G.ProxyModule)
    assert g.model.origin is m and g.model.to(flow.nn.Module) is m
    assert g.model[0].weight is m[0].weight
    gm = g.model.to(G.GraphModule)
    assert gm is g.model.to(flow.nn.graph.GraphModule)
    gm.set_stage(0, flow.placement("cpu", [0]))
    gm.activation_checkpointing = True
    g(flow.randn(2, 6))
    attrs = g._last.job.config["module_attrs"]["model"]
    assert attrs["stage_id"] == 0 and attrs["activation_checkpointing"] is True
    assert "(MODULE:model:Sequential())" in repr(g)
    assert "(MODULE:model.0:Linear(" in repr(g.model)


def test_config_flags_reach_the_job():
    g = EvalGraph(_mlp())
    g.config.allow_fuse_add_to_output(True)
    g.config.allow_fuse_cast_scale(False)
    g.config.allow_fuse_model_update_ops(True)
    g(flow.randn(2, 6))
    cfg = g._last.job.config
    assert cfg["allow_fuse_add_to_output"] is True
    assert cfg["allow_fuse_cast_scale"] is False
    assert cfg["allow_fuse_model_update_ops"] is True


def test_debug_prints_pass_timings_and_jobs(capsys):
    g = EvalGraph(_mlp())
    g.debug(0)
    g(flow.randn(2, 6))
    out = capsys.readouterr().out
    assert "passes:" in out and "autograd" in out and "Job " not in out
    g.debug(1)
    g(flow.randn(3, 6))
    out = capsys.readouterr().out
    assert "after pass autograd" in out and "Job " in out


def test_repr_and_to_dot():
    g = EvalGraph(_mlp())
    with pytest.raises(RuntimeError, match="not been called"):
        g.to_dot()
    g(flow.randn(2, 6))
    assert g.to_dot().startswith("digraph")
    text = repr(g)
    assert text.startswith(f"(GRAPH:{g.name}:EvalGraph)")
    assert "(INPUT:" in text and "(OUTPUT:" in text


def test_nested_arguments_and_results():
    lin = flow.nn.Linear(3, 2)

    class Nested(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def build(self, batch, scale=2.0):
            y = self.lin(batch["x"]) * scale
            return {"y": y, "both": (y, batch["z"] + 1)}

    x, z = flow.randn(4, 3), flow.randn(2)
    out = Nested()({"x": x, "z": z}, scale=3.0)
    np.testing.assert_allclose(out["y"].numpy(), (lin(x) * 3.0).detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(out["both"][1].numpy(), (z + 1).numpy())


def test_dropout_in_a_graph_runs():
    class Drop(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.drop = flow.nn.Dropout(0.5)

        def build(self, x):
            return self.drop(x)

    g = Drop()
    y1, y2 = g(flow.ones(64)).numpy(), g(flow.ones(64)).numpy()
    assert set(np.unique(y1)) <= {0.0, 2.0}
    assert not np.array_equal(y1, y2)  # fresh randomness per call


class _ItemGraph(flow.nn.Graph):
    def build(self, x):
        if x.sum() > 0:  # the offending line
            return x
        return x


class _NumpyGraph(flow.nn.Graph):
    def build(self, x):
        return flow.tensor(x.numpy())  # the offending line


class _ShapeGraph(flow.nn.Graph):
    def __init__(self):
        super().__init__()
        self.lin = flow.nn.Linear(5, 2)

    def build(self, x):
        return self.lin(x)  # the offending line


@pytest.mark.parametrize("cls,exc,text", [
    (_ItemGraph, LazyTensorError, "bool()"),
    (_NumpyGraph, LazyTensorError, ".numpy()"),
    (_ShapeGraph, RuntimeError, "shapes cannot be multiplied"),
])
def test_build_errors_raise_at_once_naming_the_line(cls, exc, text):
    src, start = inspect.getsourcelines(cls)
    line = start + next(i for i, s in enumerate(src) if "the offending line" in s)
    with pytest.raises(exc) as info:
        cls()(flow.ones(2, 3))
    assert text in str(info.value)
    assert f"{__file__}:{line}" in str(info.value)


def test_unsupported_optimizer_is_rejected():
    m = _mlp()

    class G2(flow.nn.Graph):
        def build(self, x):
            return x

    with pytest.raises(NotImplementedError, match="RMSprop"):
        G2().add_optimizer(flow.optim.RMSprop(m.parameters()))


def test_gpt_trains_like_eager_with_adamw_clipping_and_cosine_schedule():
    from sbpflow.examples.gpt import VOCAB, TinyGPT, make_batch

    def make():
        flow.manual_seed(0)
        return TinyGPT(block=15, d_model=32, n_head=4, n_layer=2)

    rng = np.random.default_rng(0)
    batches = [tuple(flow.tensor(a) for a in make_batch(rng, 8, 7)) for _ in range(4)]
    m1 = make()
    o1 = flow.optim.AdamW(m1.parameters(), lr=1e-3, weight_decay=0.01)
    s1 = flow.optim.lr_scheduler.CosineAnnealingLR(o1, T_max=4)
    eager = []
    for x, y in batches:
        loss = F.cross_entropy(m1(x).reshape(-1, VOCAB), y.reshape(-1))
        o1.zero_grad()
        loss.backward()
        flow.nn.utils.clip_grad_norm_(m1.parameters(), 1.0)
        o1.step()
        s1.step()
        eager.append(loss.item())
    m2 = make()
    o2 = flow.optim.AdamW([{"params": list(m2.parameters()), "clip_grad_max_norm": 1.0}],
                          lr=1e-3, weight_decay=0.01)

    class GPTGraph(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = m2
            self.add_optimizer(o2, lr_sch=flow.optim.lr_scheduler.CosineAnnealingLR(o2, 4))

        def build(self, x, y):
            loss = F.cross_entropy(self.model(x).reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            return loss

    g = GPTGraph()
    graph = [g(x, y).item() for x, y in batches]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    # The key bias's gradient is 0 in exact arithmetic (softmax ignores a shift of a row), so
    # it is rounding noise, which Adam scales up to lr-sized steps: with fused kernels (GELU's
    # loop rounds differently from eager's passes) those entries differ by more than rounding.
    # Compare everything else.
    p2, p1 = m2.state_dict(), m1.state_dict()
    for name in p1:
        a, b = p2[name].detach().numpy().copy(), p1[name].detach().numpy()
        if name.endswith("in_proj_bias"):
            d = a.shape[0] // 3
            a, b = np.delete(a, np.s_[d:2 * d]), np.delete(b, np.s_[d:2 * d])
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def test_digits_cnn_with_dropout_trains_like_eager():
    # BatchNorm buffers and dropout: the graph draws its random numbers from the default
    # generator in eager's order, so even the dropout masks agree.
    from sbpflow.examples.digits import DigitsCNN

    rng = np.random.default_rng(0)
    data = [(flow.tensor(rng.standard_normal((16, 1, 8, 8)).astype(np.float32)),
             flow.tensor(rng.integers(0, 10, 16))) for _ in range(3)]
    flow.manual_seed(0)
    m1 = DigitsCNN()
    # SGD, not Adam: the conv biases before BatchNorm get gradients that are rounding noise
    # (BatchNorm removes the mean), which Adam's normalisation would amplify.
    o1 = flow.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    flow.manual_seed(5)
    eager = [_eager_step(m1, o1, x, y) for x, y in data]
    flow.manual_seed(0)
    m2 = DigitsCNN()
    g = TrainGraph(m2, flow.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9,
                                      weight_decay=1e-4))
    flow.manual_seed(5)
    graph = [g(x, y).item() for x, y in data]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1), rtol=1e-4, atol=1e-5)


def test_optimizer_state_replaced_in_eager_is_synced_into_the_graph():
    xs, ys = _data(steps=5)
    m1 = _mlp()
    o1 = OPTS["adam"](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _mlp()
    o2 = OPTS["adam"](m2.parameters())
    g = TrainGraph(m2, o2)
    mixed = [g(x, y).item() for x, y in zip(xs[:2], ys[:2])]
    # load_state_dict replaces every state tensor: the graph must read the new ones
    o2.load_state_dict(o2.state_dict())
    mixed += [g(x, y).item() for x, y in zip(xs[2:], ys[2:])]
    np.testing.assert_allclose(mixed, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))


def test_failed_build_leaves_eager_mode_working():
    class Bad(flow.nn.Graph):
        def build(self, x):
            return x.sum().item()

    with pytest.raises(LazyTensorError):
        Bad()(flow.ones(2))
    assert (flow.ones(2) + 1).numpy().tolist() == [2.0, 2.0]  # eager again, no trace left


def test_with_dynamic_input_shape_bounds_the_plan_cache():
    lin = flow.nn.Linear(3, 2)

    class Dyn(flow.nn.Graph):
        @flow.nn.Graph.with_dynamic_input_shape(size=2)
        def __init__(self):
            super().__init__()
            self.lin = lin

        def build(self, x):
            return self.lin(x)

    g = Dyn()
    for n in (1, 2, 1, 3, 1):
        x = flow.randn(n, 3)
        np.testing.assert_allclose(g(x).numpy(), lin(x).detach().numpy(), rtol=1e-6)
    assert len(g._cache) == 2  # 1 was used last, so 2 was dropped when 3 came
    assert [k[1][0].shape[0] for k in g._cache] == [3, 1]


def test_train_and_eval_graphs_share_the_model():
    # OneFlow's usual pattern: one training graph, one eval graph, the same module.
    xs, ys = _data(steps=3)
    m = _mlp(bn=True)
    train = TrainGraph(m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    evaluate = EvalGraph(m)
    for x, y in zip(xs, ys):
        m.train()
        train(x, y)
        m.eval()
        np.testing.assert_allclose(evaluate(x).numpy(), m(x).detach().numpy(), rtol=1e-6,
                                   atol=1e-6)


def test_training_graph_without_backward_is_an_error():
    m = _mlp()

    class NoBackward(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=0.1))

        def build(self, x):
            return self.model(x).sum()

    with pytest.raises(RuntimeError, match="no loss.backward"):
        NoBackward()(flow.randn(2, 6))


def test_settings_on_nested_proxies_reach_the_job():
    m = _mlp()
    g = EvalGraph(m)
    g.model[2].to(G.GraphModule).set_stage(1)
    g.model[0].to(G.GraphModule).activation_checkpointing = True
    assert g.model[2] is g.model[2] and [p._path for p in g.model][0] == "model.0"
    g(flow.randn(2, 6))
    attrs = g._last.job.config["module_attrs"]
    assert attrs == {"model.2": {"stage_id": 1}, "model.0": {"activation_checkpointing": True}}


@pytest.mark.parametrize("inline_max", [None, 0], ids=["inline", "worker"])
def test_kernel_error_in_a_graph_names_the_op_and_line_and_the_graph_stays_callable(inline_max):
    """An out-of-range class index is found by the nll_loss kernel while the plan runs (no
    host check at trace time): the call raises torch's IndexError naming the op and the
    build() line (at once inline; at the next sync when the VM's worker ran the call), and
    the next calls with good targets train on, equal to eager: the failed step updated
    nothing, not even SGD's first-step state."""
    if inline_max is None:
        _kernel_error_case()
    else:
        with flow.vm.inline_max(inline_max):
            handoffs = flow.vm.handoffs()
            _kernel_error_case()
            assert flow.vm.handoffs() > handoffs  # the graph calls ran on the worker


def _kernel_error_case():
    xs, ys = _data(steps=2)
    m1 = _mlp()
    o1 = OPTS["sgd_momentum"](m1.parameters())
    eager = [_eager_step(m1, o1, x, y) for x, y in zip(xs, ys)]
    m2 = _mlp()
    g = TrainGraph(m2, OPTS["sgd_momentum"](m2.parameters()))
    bad = flow.tensor(np.array([0, 1, 7, 2, 3, 0]))  # 7: only 4 classes
    line = inspect.getsource(TrainGraph.build).splitlines()[1].strip()
    assert "cross_entropy" in line
    with pytest.raises(IndexError) as err:
        g(xs[0], bad).item()
    text = str(err.value)
    assert "nll_loss" in text and "Target 7 is out of bounds" in text
    assert f"{__file__}:{inspect.getsourcelines(TrainGraph.build)[1] + 1}" in text
    graph = [g(x, y).item() for x, y in zip(xs, ys)]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-6)
    _assert_same(_params(m2), _params(m1))


def test_global_inputs_give_global_outputs_on_one_rank():
    """OneFlow semantics on one rank: a graph of a global model called with global tensors
    returns global tensors with the placement and SBP eager mode gives the same program, and
    the values of the eager local forward; a local input to the global model raises eager's
    error (mixing local and global tensors), naming the op."""
    p = flow.placement("cpu", [0])
    g = EvalGraph(_mlp().to_global(p, flow.sbp.broadcast))
    x = flow.randn(6, 6)
    xg = x.to_global(p, flow.sbp.split(0))
    out = g(xg)
    with flow.no_grad():
        expect = _mlp()(x)
        eager = _mlp().to_global(p, flow.sbp.broadcast)(xg)
    assert out.is_global and out.placement == p and out.sbp == eager.sbp == (flow.sbp.split(0),)
    np.testing.assert_allclose(out.numpy(), expect.numpy(), rtol=1e-6, atol=1e-7)
    with pytest.raises(RuntimeError) as graph_err:
        g(x)
    with pytest.raises(RuntimeError) as eager_err, flow.no_grad():
        _mlp().to_global(p, flow.sbp.broadcast)(x)
    assert "expected all tensors to be global" in str(graph_err.value)
    assert str(eager_err.value) in str(graph_err.value)
