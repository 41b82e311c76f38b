"""Multi-tensor (foreach) steps of RMSprop, Adadelta, Adamax, NAdam, RAdam, ASGD and Rprop:
one fused instruction per param group and (device, dtype) bucket, bit for bit the
per-parameter path (foreach=False), torch's foreach=False within rtol 1e-5, and no host read
per step.

Every case matches the per-parameter path exactly: each `multi_*_update` kernel runs the
same elementwise arithmetic, in the same order and with the same scalar roundings, as the
eager ops of the per-parameter step, and reads its 0-d state scalars (step, NAdam's
mu_product, ASGD's eta and mu) as they are stored, where the per-parameter path keeps the
same values on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.vm import VirtualMachine

from .test_foreach import assert_three_steps_read_nothing

# Against torch, float32 after several steps: torch's vectorised updates fuse multiply-adds
# where the CPU has them (AVX2 and AVX-512 differ), so they agree to some ulps, not bitwise.
TORCH_RTOL = 1e-5

CASES = [
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, momentum=0.9)),
    ("RMSprop", dict(lr=0.01, momentum=0.9, centered=True, alpha=0.9, maximize=True)),
    ("Adadelta", dict(lr=1.0)),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1, maximize=True)),
    ("Adamax", dict(lr=0.01)),
    ("Adamax", dict(lr=0.01, betas=(0.5, 0.8), weight_decay=0.1, maximize=True)),
    ("NAdam", dict(lr=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    # beta2 0.999: rho_t passes 5 at step 6 (both branches within the 8 steps); 0.9 earlier
    ("RAdam", dict(lr=0.01)),
    ("RAdam", dict(lr=0.01, weight_decay=0.1, maximize=True)),
    ("RAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, betas=(0.8, 0.9))),
    ("ASGD", dict(lr=0.01)),  # t0 = 1e6: mu stays 1, ax follows p
    ("ASGD", dict(lr=0.05, lambd=0.01, alpha=0.5, t0=3, weight_decay=0.1)),  # ax averages
    ("ASGD", dict(lr=0.05, t0=0, maximize=True)),
    ("Rprop", dict(lr=0.01)),
    ("Rprop", dict(lr=0.05, etas=(0.3, 1.5), step_sizes=(1e-3, 0.06), maximize=True)),
]
NAMES = sorted({name for name, _ in CASES})
SHAPES = [(3, 4), (5,), (2, 2, 2), (1,)]
STEPS = 8


def _arrays(seed=0, steps=STEPS):
    """Initial params (float32, plus one float64: two dtype buckets) and per-step gradients;
    parameter 1 gets no gradient at step 2 (it is skipped that step, its state stays)."""
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float32, np.float32, np.float64]
    init = [rng.standard_normal(s).astype(d) for s, d in zip(SHAPES, dtypes, strict=True)]
    grads = [[None if (k == 2 and i == 1) else rng.standard_normal(x.shape).astype(x.dtype)
              for i, x in enumerate(init)] for k in range(steps)]
    return init, grads


def _run_flow(name, kw, foreach, steps=STEPS, opt=None, ps=None, start=0):
    init, grads = _arrays(steps=steps)
    if ps is None:
        ps = [flow.tensor(x, requires_grad=True) for x in init]
    if opt is None:
        opt = getattr(flow.optim, name)(ps, foreach=foreach, **kw)
    for step_grads in grads[start:]:
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = None if g is None else flow.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


def _run_torch(name, kw, steps=STEPS):
    init, grads = _arrays(steps=steps)
    ps = [torch.tensor(x, requires_grad=True) for x in init]
    opt = getattr(torch.optim, name)(ps, foreach=False, **kw)
    for step_grads in grads:
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = None if g is None else torch.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


def _check_states(fused_opt, single_opt, torch_opt):
    fs, ss, ts = (o.state_dict()["state"] for o in (fused_opt, single_opt, torch_opt))
    assert fs.keys() == ss.keys() == ts.keys()
    for i in fs:
        assert fs[i].keys() == ss[i].keys() == ts[i].keys(), (fs[i].keys(), ts[i].keys())
        for k in fs[i]:
            np.testing.assert_array_equal(fs[i][k].numpy(), ss[i][k].numpy(), err_msg=k)
            np.testing.assert_allclose(fs[i][k].numpy(), ts[i][k].detach().numpy(),
                                       rtol=TORCH_RTOL, atol=1e-7, err_msg=k)
            assert fs[i][k].dtype == ss[i][k].dtype
            assert fs[i][k].dtype.name == str(ts[i][k].dtype).replace("torch.", ""), k
            assert fs[i][k].shape == tuple(ts[i][k].shape), k


@pytest.mark.parametrize("name,kw", CASES)
def test_foreach_is_bitwise_the_per_parameter_path_and_torch(name, kw):
    fused, fopt = _run_flow(name, kw, None)
    single, sopt = _run_flow(name, kw, False)
    ref, topt = _run_torch(name, kw)
    for a, b, r in zip(fused, single, ref, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=TORCH_RTOL, atol=1e-7)
    _check_states(fopt, sopt, topt)
    # the skipped parameter's step count lags by one, in every path
    assert fopt.state_dict()["state"][1]["step"].item() == STEPS - 1


def _resumed(lib, name, kw, foreach):
    """3 steps, the state dict into a fresh optimizer (lib's own load, which casts the
    floating state but the step count to the parameter's dtype, as torch does), 5 more."""
    init, grads = _arrays()
    ps = [lib.tensor(x, requires_grad=True) for x in init]
    cls = getattr(lib.optim, name)
    opt = cls(ps, foreach=False, **kw)
    for k, step_grads in enumerate(grads):
        if k == 3:
            state = opt.state_dict()
            opt = cls(ps, foreach=foreach, **kw)
            opt.load_state_dict(state)
        for p, g in zip(ps, step_grads, strict=True):
            p.grad = None if g is None else lib.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in ps], opt


@pytest.mark.parametrize("name,kw", [CASES[3], CASES[10], CASES[15], CASES[18]])
def test_foreach_continues_from_a_loaded_state(name, kw):
    """The fused op reads the loaded step counts (and NAdam's mu_product, ASGD's eta and mu,
    float64 for the float64 parameter after loading) from the state tensors themselves."""
    fused, fopt = _resumed(flow, name, kw, None)
    single, sopt = _resumed(flow, name, kw, False)
    ref, topt = _resumed(torch, name, kw, False)
    for a, b, r in zip(fused, single, ref, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=TORCH_RTOL, atol=1e-7)
    _check_states(fopt, sopt, topt)


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


def _issued_by_step(monkeypatch, name, kw, n, foreach=None, f64=0):
    ps = [flow.randn(3, requires_grad=True) for _ in range(n)]
    ps += [flow.randn(2, dtype=flow.float64, requires_grad=True) for _ in range(f64)]
    opt = getattr(flow.optim, name)(ps, foreach=foreach, **kw)
    for _ in range(2):  # the first step creates the state; count a later one
        for p in ps:
            p.grad = flow.randn(*p.shape, dtype=p.dtype)
        flow.synchronize()
        issued = _count_issues(monkeypatch)
        opt.step()
        monkeypatch.undo()
    return issued


@pytest.mark.parametrize("name,kw", CASES)
def test_a_step_is_one_instruction_per_dtype_bucket(monkeypatch, name, kw):
    op = f"multi_{name.lower()}_update"
    assert _issued_by_step(monkeypatch, name, kw, 2) == [op]
    assert _issued_by_step(monkeypatch, name, kw, 20) == [op]
    assert _issued_by_step(monkeypatch, name, kw, 20, f64=3) == [op, op]
    # the per-parameter path issues several ops per parameter
    assert len(_issued_by_step(monkeypatch, name, kw, 20, foreach=False)) >= 3 * 20


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("foreach", [None, False])
def test_step_does_not_read_the_device(monkeypatch, name, foreach):
    """No host access (item(), numpy()) and no synchronize in step(): the fused op advances
    and reads its state scalars itself; the per-parameter path knows them on the host."""
    kw = dict(CASES[[n for n, _ in CASES].index(name)][1])
    if name == "ASGD":
        kw["t0"] = 1  # mu leaves 1 (ax averages): both ASGD branches read mu
    ps = [flow.randn(4, requires_grad=True) for _ in range(3)]
    opt = getattr(flow.optim, name)(ps, foreach=foreach, **kw)
    assert_three_steps_read_nothing(monkeypatch, opt, ps)


def test_a_state_the_fused_op_does_not_fit_falls_back():
    """A state the fused op does not fit (no momentum buffer: momentum was turned on after
    the first step) leaves the step to the per-parameter path, which raises torch's error."""
    ps = [flow.randn(3, requires_grad=True) for _ in range(2)]
    opt = flow.optim.RMSprop(ps, lr=0.01)
    for p in ps:
        p.grad = flow.ones_like(p)
    opt.step()
    opt.param_groups[0]["momentum"] = 0.9  # no momentum_buffer in the state: torch raises
    with pytest.raises(KeyError, match="momentum_buffer"):
        opt.step()


def test_multi_updates_check_their_inputs():
    from sbpflow.ops.registry import op

    p, g = flow.randn(3), flow.randn(4)
    s, t, lr = flow.zeros(3), flow.zeros(()), flow.tensor(0.1)
    with pytest.raises(RuntimeError, match=r"adadelta_update.*grad must match param"):
        op("multi_adadelta_update", [p, g, s, s, t, lr], n=1)
    with pytest.raises(RuntimeError, match=r"multi_rprop_update.*blocks"):
        op("multi_rprop_update", [p, p, s, s, t], n=2)
    with pytest.raises(RuntimeError, match=r"nadam_update.*0-d"):
        op("multi_nadam_update", [p, p, s, s, t, s, lr], n=1)
    new_p, new_v, new_u, new_t = op("multi_adadelta_update", [p, p, s, s, t, lr], n=1)
    assert new_t.item() == 1.0 and new_v.shape == (3,)
