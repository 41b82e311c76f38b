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
    flag = flow.ones((), dtype=flow.float64)  # the first-step flag the update clears
    job.variables["first"] = Variable("first", flag._meta, False, tensor=flag)
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
    assert [o.attrs["key"] for o in job.ops_of("feed")] == ["lr"]
    assert len(list(job.ops_of("sgd_update"))) == 2
    targets = [job.producer(o.inputs[0]).attrs["var"] for o in job.ops_of("assign")]
    assert sorted(targets) == ["first", "m.bias", "m.bias-momentum", "m.weight",
                               "m.weight-momentum"]
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
    _, writes = run_job(job, [x.numpy()], {"lr": 0.1})
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


# -- the update ops against torch.optim, every option, several steps ---------------------------
SGD_OPTIONS = [
    {},
    {"weight_decay": 0.1, "maximize": True},
    {"momentum": 0.9},
    {"momentum": 0.9, "dampening": 0.5, "weight_decay": 0.01},
    {"momentum": 0.8, "nesterov": True, "weight_decay": 0.02, "maximize": True},
]
ADAM_OPTIONS = [
    {},
    {"weight_decay": 0.1, "maximize": True},
    {"weight_decay": 0.01, "decoupled_weight_decay": True, "beta1": 0.3},
    {"amsgrad": True, "beta2": 0.9},
    {"amsgrad": True, "decoupled_weight_decay": True, "weight_decay": 0.05, "eps": 1e-3},
]


def _torch_steps(kind, params, grads, lr, options, steps):
    import torch

    ps = [torch.tensor(p) for p in params]
    if kind == "sgd":
        opt = torch.optim.SGD(ps, lr=lr, **options)
    else:
        o = dict(options)
        betas = (o.pop("beta1", 0.9), o.pop("beta2", 0.999))
        cls = torch.optim.AdamW if o.pop("decoupled_weight_decay", False) else torch.optim.Adam
        if cls is torch.optim.AdamW:
            o.setdefault("weight_decay", 0.0)
        opt = cls(ps, lr=lr, betas=betas, **o)
    for k in range(steps):
        for p, g in zip(ps, grads):
            p.grad = torch.tensor(g * (k + 1))
        opt.step()
    return [p.detach().numpy() for p in ps]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind,options", [("sgd", o) for o in SGD_OPTIONS]
                         + [("adam", o) for o in ADAM_OPTIONS])
def test_update_ops_equal_torch_optim(kind, options, dtype, fused):
    from sbpflow.ops import registry

    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(dtype) for s in ((3, 2), (4,), (1,))]
    grads = [rng.standard_normal(p.shape).astype(dtype) for p in params]
    lr, steps = 0.05, 3
    momentum = options.get("momentum", 0.0)
    ps = [flow.tensor(p) for p in params]
    states = []
    for p in ps:
        if kind == "sgd":
            states.append([flow.zeros_like(p)] if momentum else [])
        else:
            n = 3 if options.get("amsgrad") else 2
            states.append([flow.zeros_like(p) for _ in range(n)] + [flow.tensor(0.0)])
    for k in range(steps):
        gs = [flow.tensor(g * (k + 1)) for g in grads]
        shared = [flow.tensor(lr, dtype=flow.float64)]
        if kind == "sgd" and momentum:
            shared.append(flow.tensor(1.0 if k == 0 else 0.0, dtype=flow.float64))
        blocks = [[p, g, *st] for p, g, st in zip(ps, gs, states)]
        if fused:
            flat = [t for b in blocks for t in b] + shared
            outs = list(registry.op(f"multi_{kind}_update", flat, n=len(blocks), **options))
        else:
            outs = []
            for b in blocks:
                res = registry.op(f"{kind}_update", [*b, *shared], **options)
                outs.extend(res if isinstance(res, tuple) else (res,))
        per = len(outs) // len(ps)
        for i in range(len(ps)):
            ps[i], *states[i] = outs[i * per:(i + 1) * per]
    expected = _torch_steps(kind, params, grads, lr, options, steps)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for p, e in zip(ps, expected):
        np.testing.assert_allclose(p.numpy(), e, rtol=tol, atol=tol)
