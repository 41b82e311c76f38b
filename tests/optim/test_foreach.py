"""Multi-tensor (foreach) optimizer steps: one fused instruction per param group and bucket,
bit for bit the per-parameter path (foreach=False) and torch, and no host reads per step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.vm import VirtualMachine

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3, maximize=True)),
    ("Adam", dict(lr=0.01, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, betas=(0.3, 0.5), maximize=True)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, amsgrad=True, maximize=True)),
    ("AdamW", dict(lr=0.02, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, maximize=True, initial_accumulator_value=0.5)),
]
SHAPES = [(3, 4), (5,), (2, 2, 2), (1,)]


def _arrays(seed=0, steps=5):
    """Initial params (float32, plus one float64: two dtype buckets) and per-step gradients;
    parameter 1 gets no gradient at step 2 (it is skipped that step)."""
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float32, np.float32, np.float64]
    init = [rng.standard_normal(s).astype(d) for s, d in zip(SHAPES, dtypes, strict=True)]
    grads = [[None if (k == 2 and i == 1) else rng.standard_normal(x.shape).astype(x.dtype)
              for i, x in enumerate(init)] for k in range(steps)]
    return init, grads


def _run_flow(name, kw, foreach, steps=5):
    init, grads = _arrays(steps=steps)
    ps = [flow.tensor(x, requires_grad=True) for x in init]
    opt = getattr(flow.optim, name)(ps, foreach=foreach, **kw)
    for step_grads in grads:
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = None if g is None else flow.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


def _run_torch(name, kw, steps=5):
    init, grads = _arrays(steps=steps)
    ps = [torch.tensor(x, requires_grad=True) for x in init]
    opt = getattr(torch.optim, name)(ps, foreach=False, **kw)
    for step_grads in grads:
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = None if g is None else torch.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


@pytest.mark.parametrize("name,kw", CASES)
def test_foreach_is_bitwise_the_per_parameter_path_and_torch(name, kw):
    fused, fopt = _run_flow(name, kw, None)
    single, sopt = _run_flow(name, kw, False)
    ref, topt = _run_torch(name, kw)
    for a, b, r in zip(fused, single, ref, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-6, atol=1e-7)
    fs, ss, ts = (o.state_dict()["state"] for o in (fopt, sopt, topt))
    assert fs.keys() == ss.keys() == ts.keys()
    for i in fs:
        assert fs[i].keys() == ss[i].keys() == ts[i].keys()
        for k in fs[i]:
            np.testing.assert_array_equal(fs[i][k].numpy(), ss[i][k].numpy())
            np.testing.assert_allclose(fs[i][k].numpy(), ts[i][k].detach().numpy(),
                                       rtol=1e-6, atol=1e-7)
            assert fs[i][k].dtype == ss[i][k].dtype


def _count_issues(monkeypatch):
    """The names of the instructions issued from now on (the VM's batched releases of dead
    storages aside: they free memory, they are not the step's work)."""
    issued = []
    orig = VirtualMachine.issue

    def issue(self, instr, *a, **k):
        if getattr(instr, "kind", None) != "release":
            issued.append(instr.name)
        return orig(self, instr, *a, **k)

    monkeypatch.setattr(VirtualMachine, "issue", issue)
    return issued


def _issued_by_step(monkeypatch, name, kw, n, foreach=None):
    ps = [flow.randn(3, requires_grad=True) for _ in range(n)]
    opt = getattr(flow.optim, name)(ps, foreach=foreach, **kw)
    for _ in range(2):  # the first step creates the state; count a later one
        for p in ps:
            p.grad = flow.randn(3)
        flow.synchronize()
        issued = _count_issues(monkeypatch)
        opt.step()
        monkeypatch.undo()
    return issued


@pytest.mark.parametrize("name,kw", [c for c in CASES if "maximize" not in c[1]])
def test_a_step_issues_a_constant_number_of_instructions(monkeypatch, name, kw):
    few = _issued_by_step(monkeypatch, name, kw, 2)
    many = _issued_by_step(monkeypatch, name, kw, 20)
    assert few == many and len(few) <= 2, (few, many)
    assert any(n.startswith("multi_") for n in few)
    # the per-parameter path issues several ops per parameter
    assert len(_issued_by_step(monkeypatch, name, kw, 20, foreach=False)) >= 20


def test_one_instruction_per_dtype_bucket(monkeypatch):
    ps = [flow.randn(3, requires_grad=True), flow.randn(2, dtype=flow.float64, requires_grad=True),
          flow.randn(4, requires_grad=True)]
    opt = flow.optim.Adam(ps)
    for p in ps:
        p.grad = flow.ones_like(p)
    opt.step()
    issued = _count_issues(monkeypatch)
    opt.step()
    monkeypatch.undo()
    assert issued == ["multi_adam_update", "multi_adam_update"]


def assert_three_steps_read_nothing(monkeypatch, opt, ps):
    """Three steps (on the worker: hand-off forced) make no host access and no synchronize;
    the step counts read 3 afterwards."""
    syncs = []
    for method in ("access", "synchronize"):
        orig = getattr(VirtualMachine, method)
        monkeypatch.setattr(VirtualMachine, method,
                            lambda self, *a, _o=orig, _m=method, **k: (syncs.append(_m),
                                                                        _o(self, *a, **k))[1])
    with flow.vm.inline_max(0):
        for _ in range(3):
            for p in ps:
                p.grad = flow.ones_like(p)
            opt.step()
    assert syncs == [], syncs
    monkeypatch.undo()
    for p in ps:
        assert opt.state[p]["step"].item() == 3.0


@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adagrad"])
@pytest.mark.parametrize("foreach", [None, False])
def test_step_does_not_read_the_device(monkeypatch, name, foreach):
    """No host access (item(), numpy()) and no synchronize in step(): the step counts are
    advanced by the fused op, or known on the host (foreach=False)."""
    ps = [flow.randn(4, requires_grad=True) for _ in range(3)]
    opt = getattr(flow.optim, name)(ps, foreach=foreach)
    assert_three_steps_read_nothing(monkeypatch, opt, ps)


@pytest.mark.parametrize("name", ["Adam", "Adagrad"])
def test_a_step_count_written_by_someone_else_is_read_again(name):
    """The host copy of a step count is keyed on the storage version: a write it did not make
    (here a user's fill_, as nn.Graph's update writes the same tensor) is seen."""
    init = np.arange(4, dtype=np.float32)
    fp = flow.tensor(init, requires_grad=True)
    tp = torch.tensor(init, requires_grad=True)
    fopt = getattr(flow.optim, name)([fp], lr=0.1, foreach=False)
    topt = getattr(torch.optim, name)([tp], lr=0.1, foreach=False)
    for k in range(3):
        g = np.full(4, 0.5 + k, np.float32)
        fp.grad, tp.grad = flow.tensor(g), torch.tensor(g)
        if k == 2:
            fopt.state[fp]["step"].fill_(10.0)
            topt.state[tp]["step"].fill_(10.0)
        fopt.step()
        topt.step()
    assert fopt.state[fp]["step"].item() == 11.0
    np.testing.assert_allclose(fp.detach().numpy(), tp.detach().numpy(), rtol=1e-6)


def test_graph_then_eager_adam_steps_continue_the_count():
    """nn.Graph's optimizer pass writes the step tensors in place; a following eager step
    (fused or per-parameter) continues from the graph's count."""
    for foreach in (None, False):
        flow.manual_seed(0)
        model = flow.nn.Linear(3, 2)
        opt = flow.optim.Adam(model.parameters(), lr=0.1, foreach=foreach)
        x = flow.randn(4, 3)

        class G(flow.nn.Graph):
            def __init__(self, model, opt):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)

            def build(self, x):
                loss = self.model(x).sum()
                loss.backward()
                return loss

        g = G(model, opt)
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()  # eager step 1
        g(x)
        g(x)  # graph steps 2, 3
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()  # eager step 4
        for p in model.parameters():
            assert opt.state[p]["step"].item() == 4.0


def test_zero_grad_keep_is_one_fill(monkeypatch):
    ps = [flow.randn(3, requires_grad=True) for _ in range(10)]
    opt = flow.optim.SGD(ps, lr=0.1)
    for p in ps:
        p.grad = flow.ones_like(p)
    flow.synchronize()
    issued = _count_issues(monkeypatch)
    opt.zero_grad(set_to_none=False)
    monkeypatch.undo()
    assert issued == ["zero_"]
    for p in ps:
        assert p.grad is not None and not p.grad.numpy().any()
    # the per-parameter path zeroes the same
    opt2 = flow.optim.SGD(ps, lr=0.1, foreach=False)
    for p in ps:
        p.grad = flow.ones_like(p)
    opt2.zero_grad(set_to_none=False)
    for p in ps:
        assert not p.grad.numpy().any()


def test_zero_grad_keep_bumps_the_version():
    p = flow.randn(3, requires_grad=True)
    p.grad = flow.ones(3)
    g = p.grad
    v = g._version
    flow.optim.SGD([p], lr=0.1).zero_grad(set_to_none=False)
    assert p.grad is g and g._version > v


def test_multi_adagrad_update_checks_its_inputs():
    from sbpflow.ops.registry import op

    p, g = flow.randn(3), flow.randn(4)
    s, t, lr = flow.zeros(3), flow.zeros(()), flow.tensor(0.1)
    with pytest.raises(RuntimeError, match=r"adagrad_update.*grad must match param"):
        op("multi_adagrad_update", [p, g, s, t, lr], n=1)
    with pytest.raises(RuntimeError, match=r"multi_adagrad_update.*blocks"):
        op("multi_adagrad_update", [p, p, s, t, lr], n=2)
    new_p, new_s, new_t = op("multi_adagrad_update", [p, p, s, t, lr], n=1)
    assert new_t.item() == 1.0 and new_s.shape == (3,)
