"""The optimizer pass on small Jobs: the ops it emits (feeds, update ops, assigns, clipping),
the multi-tensor form, and the numbers (reference evaluator) against the eager optimizers."""

from __future__ import annotations

import math

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph.ir import Job, Variable
from sbpflow.graph.passes import autograd, optimizer
from sbpflow.graph.trace import trace_build
from sbpflow.nn import graph as G

from .refeval import RefRunner, run_job


def _job(model, x):
    job = Job("g")

    def build(x):
        loss = (model(x) ** 2).mean()
        loss.backward()
        return loss

    trace_build(job, build, (x,), {}, {"m": model})
    autograd.run(job)
    return job


def _sgd_spec(job, params, momentum=0.9, clip=None):
    states = {}
    for p in params:
        var = job.variables[p]
        name = f"{p}-momentum"
        job.variables[name] = Variable(name, var.meta, False, tensor=flow.zeros_like(var.tensor))
        states[p] = {"momentum_buffer": name}
    return {"kind": "sgd", "groups": [{
        "params": params, "lr": "lr", "first": "first", "states": states,
        "hyper": {"momentum": momentum, "dampening": 0.0, "nesterov": False,
                  "weight_decay": 0.0, "maximize": False},
        "clip_grad_max_norm": clip, "clip_grad_norm_type": 2.0}]}


def test_sgd_ops_feeds_and_assigns():
    lin = flow.nn.Linear(3, 2)
    job = _job(lin, flow.randn(4, 3))
    job.config["optimizers"] = [_sgd_spec(job, ["m.weight", "m.bias"])]
    optimizer.run(job)
    job.check()
    assert sorted(o.attrs["key"] for o in job.ops_of("feed")) == ["first", "lr"]
    assert len(list(job.ops_of("sgd_update"))) == 2
    targets = [job.producer(o.inputs[0]).attrs["var"] for o in job.ops_of("assign")]
    assert sorted(targets) == ["m.bias", "m.bias-momentum", "m.weight", "m.weight-momentum"]
    assert all(o.scope == "optimizer" for o in job.ops_of("sgd_update"))
    assert Job.from_json(job.to_json()).config["optimizers"][0]["kind"] == "sgd"


def test_fused_update_is_one_multi_tensor_op():
    m = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Linear(4, 1))
    job = _job(m, flow.randn(4, 3))
    job.config["allow_fuse_model_update_ops"] = True
    params = ["m.0.weight", "m.0.bias", "m.1.weight", "m.1.bias"]
    job.config["optimizers"] = [_sgd_spec(job, params)]
    optimizer.run(job)
    (multi,) = job.ops_of("multi_sgd_update")
    assert multi.attrs["n"] == 4 and len(multi.outputs) == 8
    assert not list(job.ops_of("sgd_update"))


def test_parameters_without_gradient_are_not_updated():
    m = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Linear(4, 1))
    m[0].weight.requires_grad_(False)
    job = _job(m, flow.randn(4, 3))
    job.variables["m.0.weight"].trainable = False
    job.config["optimizers"] = [_sgd_spec(job, ["m.0.bias", "m.1.weight"], momentum=0.0)]
    optimizer.run(job)
    assert len(list(job.ops_of("sgd_update"))) == 2


def test_clipping_equals_clip_grad_norm():
    flow.manual_seed(0)
    lin = flow.nn.Linear(3, 2)
    x = flow.randn(4, 3)
    job = _job(lin, x)
    job.config["optimizers"] = [_sgd_spec(job, ["m.weight", "m.bias"], momentum=0.0,
                                          clip=0.05)]
    optimizer.run(job)
    assert any("clamp" in o.op_type for o in job.ops if o.scope == "optimizer")
    _, writes = run_job(job, [x.numpy()], {"lr": 0.1, "first": 1.0})
    ((lin(x) ** 2).mean()).backward()
    flow.nn.utils.clip_grad_norm_(lin.parameters(), 0.05)
    with flow.no_grad():
        for p in lin.parameters():
            p.add_(p.grad, alpha=-0.1)
    np.testing.assert_allclose(writes["m.weight"], lin.weight.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(writes["m.bias"], lin.bias.detach().numpy(), rtol=1e-6)


class _Train(flow.nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x):
        loss = (self.model(x) ** 2).mean()
        loss.backward()
        return loss


def _mk(kind, params):
    return {
        "sgd_damp": lambda: flow.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.3,
                                           weight_decay=0.01, maximize=True),
        "adam": lambda: flow.optim.Adam(params, lr=0.02, betas=(0.8, 0.99), weight_decay=0.1),
        "adamw": lambda: flow.optim.AdamW(params, lr=0.02, amsgrad=True),
        "clip_inf": lambda: flow.optim.SGD([{"params": params, "clip_grad_max_norm": 0.01,
                                             "clip_grad_norm_type": math.inf}], lr=0.1),
    }[kind]()


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("kind", ["sgd_damp", "adam", "adamw", "clip_inf"])
def test_pass_numbers_equal_eager_on_reference_evaluator(monkeypatch, kind, fuse):
    # The reference evaluator checks the pass independently of the compiler and runtime.
    monkeypatch.setattr(G, "_runner_factory", RefRunner)
    xs = [flow.randn(5, 3) for _ in range(4)]
    flow.manual_seed(3)
    m1 = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh(), flow.nn.Linear(4, 2))
    o1 = _mk(kind, list(m1.parameters()))
    eager = []
    for x in xs:
        o1.zero_grad()
        loss = (m1(x) ** 2).mean()
        loss.backward()
        if kind == "clip_inf":
            flow.nn.utils.clip_grad_norm_(m1.parameters(), 0.01, math.inf)
        o1.step()
        eager.append(loss.item())
    flow.manual_seed(3)
    m2 = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh(), flow.nn.Linear(4, 2))
    g = _Train(m2, _mk(kind, list(m2.parameters())))
    g.config.allow_fuse_model_update_ops(fuse)
    graph = [g(x).item() for x in xs]
    assert isinstance(g._last.runner, RefRunner)
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=1e-7)
    for a, b in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5,
                                   atol=1e-7)
