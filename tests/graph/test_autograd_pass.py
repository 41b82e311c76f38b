"""The autograd pass on small Jobs: gradients equal eager autograd's, checked by evaluating the
Job with the test-only reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph.ir import Job
from sbpflow.graph.passes import autograd
from sbpflow.graph.trace import trace_build

from .refeval import run_job


def _job(build, *args, modules=None):
    job = Job("g")
    trace_build(job, build, args, {}, modules or {})
    return job


def _grads(job, *inputs):
    """{variable: gradient array} from evaluating the differentiated Job."""
    for k, (_var, t) in enumerate(sorted(job.grads.items())):
        job.add_op("output", (t,), (), {"index": 1000 + k})
    outs, _ = run_job(job, [np.asarray(x.numpy()) for x in inputs])
    n = len(job.grads)
    return dict(zip(sorted(job.grads), outs[-n:]))


def _check(model, build, *inputs, rtol=1e-5):
    job = _job(build, *inputs, modules={"m": model})
    autograd.run(job)
    job.check()
    got = _grads(job, *inputs)
    for p in model.parameters():
        p.grad = None
    build(*inputs)
    expected = {f"m.{n}": p.grad.numpy() for n, p in model.named_parameters()
                if p.grad is not None}
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_allclose(got[k], expected[k], rtol=rtol, atol=1e-6, err_msg=k)
    return job


def _train(model, loss_fn):
    def build(*xs):
        loss = loss_fn(model, *xs)
        loss.backward()
        return loss
    return build


def test_mlp_gradients_equal_eager():
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(4, 8), flow.nn.Tanh(), flow.nn.Linear(8, 3))
    y = flow.tensor([0, 2, 1, 1, 0])
    job = _check(m, _train(m, lambda m, x: flow.nn.functional.cross_entropy(m(x), y)),
                 flow.randn(5, 4))
    assert set(job.grads) == {"m.0.weight", "m.0.bias", "m.2.weight", "m.2.bias"}


def test_batchnorm_and_conv_gradients_equal_eager():
    flow.manual_seed(1)
    m = flow.nn.Sequential(flow.nn.Conv2d(2, 3, 3), flow.nn.BatchNorm2d(3), flow.nn.ReLU(),
                           flow.nn.Flatten(), flow.nn.Linear(3 * 4 * 4, 2))
    m.train()
    state = {k: v.detach().clone() for k, v in m.state_dict().items()}
    job = _job(_train(m, lambda m, x: (m(x) ** 2).mean()), flow.randn(2, 2, 6, 6),
               modules={"m": m})
    m.load_state_dict(state)
    autograd.run(job)
    assert "m.1.weight" in job.grads and "m.0.weight" in job.grads


def test_gradients_meeting_at_a_tensor_are_summed():
    lin = flow.nn.Linear(3, 3)

    def loss(m, x):
        h = m(x)
        return (h * h).sum() + h.sum() + m(h).mean()  # h and the weight used twice

    _check(lin, _train(lin, loss), flow.randn(2, 3))


def test_integer_tensors_get_no_gradient():
    emb = flow.nn.Embedding(10, 4)

    def loss(m, idx):
        e = m(idx)
        vals, where = e.max(dim=1)  # `where` is int64: no gradient flows into it
        return vals.sum() + where.float().sum() * 0

    _check(emb, _train(emb, loss), flow.tensor([[1, 2], [3, 1]]))


def test_frozen_parameters_get_no_gradient():
    m = flow.nn.Sequential(flow.nn.Linear(3, 3), flow.nn.Linear(3, 1))
    m[0].weight.requires_grad_(False)
    job = _check(m, _train(m, lambda m, x: m(x).sum()), flow.randn(4, 3))
    assert "m.0.weight" not in job.grads and "m.0.bias" in job.grads


def test_backward_ops_are_scoped_and_located():
    lin = flow.nn.Linear(3, 1)
    job = _job(_train(lin, lambda m, x: m(x).sum()), flow.randn(2, 3), modules={"lin": lin})
    n = len(job.ops)
    autograd.run(job)
    new = job.ops[n:]
    assert new and all(op.scope.endswith("backward") for op in new)
    lin_bw = [op for op in new if op.scope == "lin-backward"]
    assert lin_bw and all(op.loc is not None and op.loc[0] == __file__ for op in lin_bw)


def test_no_loss_no_change():
    lin = flow.nn.Linear(3, 1)
    job = _job(lambda x: lin(x), flow.randn(2, 3), modules={"lin": lin})
    n = len(job.ops)
    autograd.run(job)
    assert len(job.ops) == n and not job.grads


@pytest.mark.parametrize("name", ["relu", "gelu", "softmax", "log_softmax", "layer_norm"])
def test_activation_gradients_equal_eager(name):
    F = flow.nn.functional
    fn = {"relu": F.relu, "gelu": F.gelu, "softmax": lambda h: F.softmax(h, dim=-1),
          "log_softmax": lambda h: F.log_softmax(h, dim=-1),
          "layer_norm": lambda h: F.layer_norm(h, (4,))}[name]
    flow.manual_seed(2)
    lin = flow.nn.Linear(3, 4)
    w = flow.randn(4)
    _check(lin, _train(lin, lambda m, x: (fn(m(x)) * w).sum()), flow.randn(5, 3))


# -- every registered op in a graph (OneFlow's check_graph) -----------------------------------
def _op_cases():
    from tests.ops import harness as H

    return H.all_cases()


@pytest.mark.parametrize("name,i", _op_cases(), ids=[f"{n}-{i}" for n, i in _op_cases()])
def test_every_op_sample_in_a_graph_equals_eager(name, i):
    """Each sample traced into a Job (inputs as module parameters and buffers), the
    autograd pass, every other pass, the compiler and the runtime: outputs and the
    gradients of sum(out * cotangent) equal eager's."""
    from sbpflow.framework.interpreter import apply
    from sbpflow.graph.compiler import build_runtime
    from sbpflow.graph.passes import run_passes
    from sbpflow.ops import registry
    from tests.ops import harness as H

    opdef = registry.get(name)
    s = H.op_samples(name)[i]
    differentiable = s.grad and opdef.grad is not None and not opdef.random
    ins = H.to_flow(opdef, s, requires_grad=differentiable)
    flat = list(ins[0]) if opdef.variadic else list(ins)
    outs = H.as_tuple(apply(opdef, ins, dict(s.attrs)))
    rng = np.random.default_rng(i)
    cots = [flow.tensor(rng.standard_normal(tuple(o.shape)), dtype=o.dtype)
            if o.dtype.is_floating_point and o.requires_grad else None for o in outs]
    if any(c is not None for c in cots):
        flow.autograd.backward([o for o, c in zip(outs, cots) if c is not None],
                               [c for c in cots if c is not None])
    mod = flow.nn.Module()
    params = []
    for k, (a, t) in enumerate(zip(H.flat_inputs(opdef, s), flat)):
        if t.requires_grad:
            params.append(flow.nn.Parameter(flow.tensor(a)))
            mod.register_parameter(f"p{k}", params[-1])
        else:
            params.append(flow.tensor(a))
            mod.register_buffer(f"b{k}", params[-1])

    def build():
        got = H.as_tuple(apply(opdef, (params,) if opdef.variadic else tuple(params),
                               dict(s.attrs)))
        terms = [(o * c).sum() for o, c in zip(got, cots) if c is not None]
        if terms:
            loss = terms[0]
            for t in terms[1:]:
                loss = loss + t
            loss.backward()
        return list(got)

    job = Job("check_graph")
    trace_build(job, build, (), {}, {"m": mod})
    autograd.run(job)
    grads = sorted(job.grads)
    for k, g in enumerate(grads):
        job.add_op("output", (job.grads[g],), (), {"index": len(outs) + k})
    run_passes(job, skip=("autograd", "optimizer"))
    res = build_runtime(job).run([], {})
    for k, (o, r) in enumerate(zip(outs, res)):
        assert tuple(r.shape) == tuple(o.shape) and r.dtype == o.dtype
        if not opdef.random:
            rtol, atol = H.tolerance(s, o.dtype.name)
            H.assert_close(H.host(r), H.host(o.detach()), rtol, atol, f"{name} output {k}")
    if differentiable:
        got = dict(zip(grads, res[len(outs):]))
        for k, t in enumerate(flat):
            if t.grad is not None:
                rtol, atol = H.tolerance(s, t.dtype.name)
                H.assert_close(H.host(got[f"m.p{k}"]), H.host(t.grad), rtol * 10, atol * 10,
                               f"{name} grad of input {k}")
