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
