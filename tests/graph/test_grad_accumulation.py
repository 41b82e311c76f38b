"""Gradient accumulation in nn.Graph (`config.set_gradient_accumulation_steps(n)`): a call
is a mini-batch of n micro-batches and one optimizer step, equal to the eager recipe (per
micro-batch: forward, `(loss / n).backward()`; then one `step()`), dropout and BatchNorm
included; outputs packed as OneFlow packs them; bad settings refused; the setting is part of
the plan's signature; micro-batch i's activations die before micro-batch i+1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph.ir import Job

F = flow.nn.functional
BATCH = 8


def _model(kind):
    flow.manual_seed(0)
    layers = [flow.nn.Linear(6, 16)]
    if kind == "bn":
        layers.append(flow.nn.BatchNorm1d(16))
    layers.append(flow.nn.ReLU())
    if kind == "dropout":
        layers.append(flow.nn.Dropout(0.3))
    layers.append(flow.nn.Linear(16, 4))
    return flow.nn.Sequential(*layers)


OPTS = {
    "sgd_momentum": lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
    "adam": lambda p: flow.optim.Adam(p, lr=0.01, weight_decay=0.01),
}


def _data(steps=3, batch=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    return [(flow.tensor(rng.standard_normal((batch, 6)).astype(np.float32)),
             flow.tensor(rng.integers(0, 4, batch))) for _ in range(steps)]


class AccGraph(flow.nn.Graph):
    def __init__(self, model, opt, n, lr_sch=None):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=lr_sch)
        self.config.set_gradient_accumulation_steps(n)

    def build(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        return loss, logits


def _eager_call(model, opt, x, y, n, clip=None):
    """The eager recipe for one graph call: n micro-batches, loss / n, one step.  Returns the
    micro-batch losses (unscaled) and the logits, as the graph packs them."""
    opt.zero_grad()
    m = x.shape[0] // n
    losses, logits = [], []
    for k in range(n):
        out = model(x[k * m:(k + 1) * m])
        loss = F.cross_entropy(out, y[k * m:(k + 1) * m])
        (loss / n).backward()
        losses.append(loss.item())
        logits.append(out.detach().numpy())
    if clip is not None:
        flow.nn.utils.clip_grad_norm_(model.parameters(), *clip)
    opt.step()
    return np.array(losses, np.float32), np.concatenate(logits)


def _state(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _same(a, b, rtol=1e-6, atol=1e-7):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("kind", ["mlp", "dropout", "bn"])
@pytest.mark.parametrize("opt", list(OPTS))
@pytest.mark.parametrize("n", [1, 2, 4])
def test_training_equals_the_eager_recipe(n, opt, kind):
    data = _data()
    m1 = _model(kind)
    o1 = OPTS[opt](m1.parameters())
    flow.manual_seed(5)  # dropout: both modes draw from the default generator in this order
    eager = [_eager_call(m1, o1, x, y, n) for x, y in data]
    m2 = _model(kind)
    g = AccGraph(m2, OPTS[opt](m2.parameters()), n)
    flow.manual_seed(5)
    graph = [tuple(t.numpy() for t in g(x, y)) for x, y in data]
    for (el, eo), (gl, go) in zip(eager, graph):
        # OneFlow's outputs: the n micro-batch losses (a scalar when n == 1), and the
        # micro-batches' logits concatenated along axis 0
        assert gl.shape == (() if n == 1 else (n,))
        assert go.shape == (BATCH, 4)
        np.testing.assert_allclose(gl.reshape(-1), el, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(go, eo, rtol=1e-6, atol=1e-6)
    _same(_state(m2), _state(m1))  # parameters, and BatchNorm's running statistics
    if kind == "bn":
        assert m2[1].num_batches_tracked.item() == n * len(data)  # once per micro-batch
    assert len(g._cache) == 1
    assert g.state_dict()["System-Train-TrainStep"].item() == len(data)  # one step per call
    job = g._last.job
    assert job.stats.get("micro_batches", 1) == n
    assert g._last.runner.plan.stats.get("micro_batches", 1) == n
    assert {op.micro_batch for op in job.ops} - {None} == set(range(n) if n > 1 else ())


def test_dropout_draws_anew_per_micro_batch():
    flow.manual_seed(0)
    lin = flow.nn.Linear(64, 64)

    class Drop(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.drop = flow.nn.Dropout(0.5)
            self.add_optimizer(flow.optim.SGD(lin.parameters(), lr=0.0))
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            self.drop(self.lin(x)).sum().backward()
            return self.drop(x)

    masks = Drop()(flow.ones(2, 64)).numpy()  # micro-batch k is row k
    assert set(np.unique(masks)) <= {0.0, 2.0}
    assert not np.array_equal(masks[0], masks[1])  # not micro-batch 0's draw again


def test_gradient_clipping_acts_on_the_accumulated_gradient():
    data = _data()
    m1 = _model("mlp")
    o1 = flow.optim.SGD(m1.parameters(), lr=0.5, momentum=0.5)
    eager = [_eager_call(m1, o1, x, y, 4, clip=(0.1, 2.0))[0] for x, y in data]
    m2 = _model("mlp")
    o2 = flow.optim.SGD([{"params": m2.parameters(), "clip_grad_max_norm": 0.1,
                          "clip_grad_norm_type": 2.0}], lr=0.5, momentum=0.5)
    g = AccGraph(m2, o2, 4)
    graph = [g(x, y)[0].numpy() for x, y in data]
    np.testing.assert_allclose(np.concatenate(graph), np.concatenate(eager), rtol=1e-6,
                               atol=1e-7)
    _same(_state(m2), _state(m1), rtol=1e-5, atol=1e-6)


def test_lr_scheduler_steps_once_per_call():
    data = _data(steps=4)
    m2 = _model("mlp")
    o2 = flow.optim.SGD(m2.parameters(), lr=0.2, momentum=0.9)
    g = AccGraph(m2, o2, 2, flow.optim.lr_scheduler.StepLR(o2, step_size=1, gamma=0.5))
    for x, y in data:
        g(x, y)
    assert o2.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5 ** 4)


def test_inputs_written_in_place_and_nested_results():
    flow.manual_seed(0)
    lin = flow.nn.Linear(3, 2)

    class Nested(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(flow.optim.SGD(lin.parameters(), lr=0.0))
            self.config.set_gradient_accumulation_steps(3)

        def build(self, batch):
            y = self.lin(batch["x"])
            y.sum().backward()
            batch["z"].mul_(2)  # written back whole, micro-batch by micro-batch
            return {"y": y, "rows": batch["x"].shape[0], "z": batch["z"] + 1}

    x, z = flow.randn(6, 3), flow.randn(6, 2)
    z0 = z.numpy().copy()
    out = Nested()({"x": x, "z": z})
    assert out["rows"] == 2  # build() sees a micro-batch, as in OneFlow
    np.testing.assert_allclose(out["y"].numpy(), lin(x).detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), z0 * 2)
    np.testing.assert_allclose(out["z"].numpy(), z0 * 2 + 1)


@pytest.mark.parametrize("value, exc, text", [
    (0, ValueError, "at least 1, got 0"),
    (-2, ValueError, "at least 1, got -2"),
    (2.0, TypeError, "must be an int, got float"),
    ("2", TypeError, "must be an int, got str"),
    (True, TypeError, "must be an int, got bool"),
])
def test_bad_settings_raise(value, exc, text):
    with pytest.raises(exc, match=text):
        flow.nn.Graph().config.set_gradient_accumulation_steps(value)


def test_batch_that_n_does_not_divide_raises_naming_the_setting():
    m = _model("mlp")
    g = AccGraph(m, OPTS["adam"](m.parameters()), 4)
    x, y = _data(batch=6)[0]
    with pytest.raises(ValueError, match=r"set_gradient_accumulation_steps\(4\).*tensor argument"
                                         r" 0 .*batch size 6 \(shape \[6, 6\]\), which 4 does "
                                         "not divide"):
        g(x, y)
    with pytest.raises(ValueError, match="argument 1 .* is 0-dim"):
        g(flow.randn(8, 6), flow.tensor(1))
    g(*_data(batch=12)[0])  # the graph still works on a good batch


def test_eval_graph_refuses_accumulation():
    class Eval(flow.nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            return self.m(x)

    with pytest.raises(RuntimeError, match=r"set_gradient_accumulation_steps\(2\) needs a "
                                           "training graph"):
        Eval(_model("mlp"))(flow.randn(4, 6))


def test_changing_the_setting_recompiles():
    m = _model("mlp")
    g = AccGraph(m, OPTS["sgd_momentum"](m.parameters()), 1)
    x, y = _data()[0]
    assert g(x, y)[0].shape == ()
    first = g._last
    g.config.set_gradient_accumulation_steps(2)
    assert g(x, y)[0].shape == (2,)
    assert len(g._cache) == 2 and g._last is not first
    assert g._last.job.config["gradient_accumulation_steps"] == 2
    g.config.set_gradient_accumulation_steps(1)
    g(x, y)
    assert g._last is first and len(g._cache) == 2  # the n = 1 plan again
    g.config.set_gradient_accumulation_steps(4)
    assert g(x, y)[0].shape == (4,)
    assert len(g._cache) == 3


def _activation_heavy(n):
    flow.manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Linear(32, 128), flow.nn.ReLU(),
                               flow.nn.Linear(128, 128), flow.nn.ReLU(), flow.nn.Linear(128, 4))

    class Loss(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
            self.config.set_gradient_accumulation_steps(n)

        def build(self, x, y):
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            return loss

    g = Loss()
    g(flow.randn(256, 32), flow.randint(0, 4, (256,)))
    return g._last.job


def _peak_live_bytes(job) -> int:
    """The most bytes of op outputs alive at once over the Job's order (every tensor from its
    producer to its last reader; variables and outputs aside), whichever kernels allocate
    them: the planner's figure counts only the buffers it places."""
    start, end = {}, {}
    for k, op in enumerate(job.ops):
        for t in op.inputs:
            if t in start:
                end[t] = k
        if op.op_type not in ("variable", "input", "constant"):
            for t in op.outputs:
                start[t] = end[t] = k
    live = [0] * (len(job.ops) + 1)
    for t, a in start.items():
        lt = job.tensors[t]
        for k in range(a, end[t] + 1):
            live[k] += lt.meta.numel * lt.dtype.itemsize
    return max(live)


def test_micro_batch_activations_die_before_the_next_micro_batch():
    one, four = _activation_heavy(1), _activation_heavy(4)
    assert _peak_live_bytes(four) < 0.75 * _peak_live_bytes(one)
    # Every value of micro-batch k with the micro-batch's rows (an activation or its
    # gradient) is last read inside micro-batch k.
    mb = {t: op.micro_batch for op in four.ops for t in op.outputs}
    last = {}
    for op in four.ops:
        for t in op.inputs:
            last[t] = op.micro_batch
    checked = 0
    for name, t in four.tensors.items():
        if mb.get(name) is not None and name in last and t.shape and t.shape[0] == 64:
            assert last.get(name) == mb[name], name
            checked += 1
    assert checked >= 10


def test_the_job_shows_and_keeps_micro_batches():
    job = _activation_heavy(2)
    assert "micro-batch 1" in str(job)
    again = Job.from_json(job.to_json())
    assert [op.micro_batch for op in again.ops] == [op.micro_batch for op in job.ops]
    # the accumulated gradients: one sum per parameter, in micro-batch 1
    sums = [op for op in job.ops if op.scope == "grad_accumulation"]
    assert len(sums) == 6 and {op.micro_batch for op in sums} == {1}


SCRIPT = Path(__file__).resolve().parent / "scripts" / "grad_acc_check.py"


def test_two_ranks_each_running_its_own_graph_with_accumulation():
    """SPMD over local tensors: each rank trains its own graph on its own batches, equal to
    the eager recipe on that rank.  (Data parallelism over global tensors with accumulation:
    tests/graph/graph_global_check.py.)"""
    import re

    from tests.mpijob import mpiexec_cmd, run_job

    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", str(SCRIPT)), timeout=300)
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): grad acc ok", job.stdout))
    assert ranks == [0, 1], job.output
    assert job.strays == 0


@pytest.mark.parametrize("sbp", ["split", "broadcast"])
def test_accumulation_over_global_tensors_on_one_rank_equals_the_eager_recipe(sbp):
    """A graph over global tensors on placement [0] (one rank), S(0) or B batches: the
    micro-batches are the pieces' slices, and training equals eager global's recipe.  (Two
    and four ranks: tests/graph/graph_global_check.py.)"""
    p = flow.placement("cpu", [0])
    x_sbp = flow.sbp.split(0) if sbp == "split" else flow.sbp.broadcast

    def model():
        return _model("mlp").to_global(p, flow.sbp.broadcast)

    n = 2
    m1, m2 = model(), model()
    o1 = OPTS["adam"](m1.parameters())
    g = AccGraph(m2, OPTS["adam"](m2.parameters()), n)
    for x, y in _data():
        x, y = x.to_global(p, x_sbp), y.to_global(p, x_sbp)
        el, eo = _eager_call(m1, o1, x, y, n)
        gl, go = g(x, y)
        assert gl.is_global and gl.shape == (n,) and go.sbp == (x_sbp,)
        np.testing.assert_allclose(gl.numpy(), el, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(go.numpy(), eo, rtol=1e-6, atol=1e-6)
    _same(_state(m2), _state(m1))
    kinds = [op.op_type for op in g._last.job.ops]
    assert kinds.count("micro_batch") == 2 * n and kinds.count("micro_batch_pack") == 2
