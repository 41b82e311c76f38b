"""Optimizers against torch 2.13: parameter trajectories, state, state dicts, groups, hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow import optim

from .pairs import STEPS, _data, _ids, _Pair, _skips  # noqa: F401 - shared harness

CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.3, "weight_decay": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "maximize": True}),
    ("Adam", {"lr": 0.05}),
    ("Adam", {"lr": 0.05, "amsgrad": True}),
    ("Adam", {"lr": 0.05, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.02, "betas": (0.8, 0.9), "eps": 1e-6, "amsgrad": True,
              "weight_decay": 0.01, "maximize": True}),
    ("AdamW", {"lr": 0.05}),
    ("AdamW", {"lr": 0.05, "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 0.05, "maximize": True}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "centered": True}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "centered": True, "momentum": 0.5,
                 "weight_decay": 0.05}),
    ("RMSprop", {"lr": 0.01, "maximize": True}),
    ("Adagrad", {"lr": 0.1}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.05, "initial_accumulator_value": 0.1,
                 "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.1, "eps": 1e-6, "maximize": True}),
]


def _torch_opt(name, params, **kw):
    return getattr(torch.optim, name)(params, foreach=False, **kw)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_trajectory_matches_torch(cfg, dtype):
    name, kw = cfg
    init, grads = _data(dtype)
    pair = _Pair(name, kw, init, groups=(dtype is np.float64))
    for k in range(STEPS):
        pair.step(k, grads)
        pair.check(dtype, f"after step {k + 1}")
    assert pair.fp[0].dtype is flow.float64 if dtype is np.float64 else flow.float32


@pytest.mark.parametrize("cfg", CONFIGS[1::2], ids=_ids)
def test_state_matches_torch(cfg):
    """The per-parameter state (buffers, step counts) has torch's keys and values."""
    name, kw = cfg
    init, grads = _data(np.float64, seed=1)
    pair = _Pair(name, kw, init)
    for k in range(5):
        pair.step(k, grads)
    fsd, tsd = pair.fopt.state_dict(), pair.topt.state_dict()
    assert sorted(fsd["state"]) == sorted(tsd["state"])
    for idx, tstate in tsd["state"].items():
        fstate = fsd["state"][idx]
        assert sorted(fstate) == sorted(tstate)
        for key, tval in tstate.items():
            fval = fstate[key]
            if isinstance(tval, torch.Tensor):
                assert fval.dtype.name == str(tval.dtype).replace("torch.", "")
                np.testing.assert_allclose(fval.numpy(), tval.numpy(), rtol=1e-10, atol=1e-12,
                                           err_msg=f"state[{idx}][{key}]")
            else:
                assert fval == tval
    tgroups = [{k: v for k, v in g.items()} for g in tsd["param_groups"]]
    assert fsd["param_groups"] == tgroups


@pytest.mark.parametrize("cfg", [CONFIGS[3], CONFIGS[8], CONFIGS[10], CONFIGS[15],
                                 CONFIGS[18]], ids=_ids)
def test_state_dict_resumes_identically(cfg):
    """Save after 8 steps, load into a fresh optimizer on copied weights: the rest matches."""
    name, kw = cfg
    init, grads = _data(np.float64, seed=2)
    pair = _Pair(name, kw, init, groups=True)
    for k in range(8):
        pair.step(k, grads)
    sd = pair.fopt.state_dict()
    params2 = [flow.tensor(p.detach().numpy().copy(), requires_grad=True) for p in pair.fp]
    opt2 = getattr(optim, name)([{"params": [params2[0]]}, {"params": [params2[1]]}], **kw)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[1]["lr"] == kw["lr"] / 2  # group options come from the dict
    for k in range(8, STEPS):
        pair.step(k, grads)
        for i, p in enumerate(params2):
            p.grad = None if _skips(k, i) else flow.tensor(grads[k][i].copy())
        opt2.step()
        for a, b in zip(pair.fp, params2, strict=True):
            np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    pair.check(np.float64)


def test_loaded_state_is_not_aliased():
    """Loading clones the buffers: stepping one optimizer leaves the other's state alone."""
    init, grads = _data(np.float64)
    pair = _Pair("Adam", {"lr": 0.1}, init)
    pair.step(0, grads)
    sd = pair.fopt.state_dict()
    before = sd["state"][0]["exp_avg"].numpy().copy()
    p2 = [flow.tensor(a, requires_grad=True) for a in init]
    opt2 = optim.Adam(p2, lr=0.1)
    opt2.load_state_dict(sd)
    p2[0].grad = flow.tensor(grads[1][0])
    opt2.step()
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"].numpy(), before)


def test_load_state_dict_casts_to_param_dtype():
    init, grads = _data(np.float64)
    pair = _Pair("Adam", {"lr": 0.1}, init)
    pair.step(0, grads)
    p32 = [flow.tensor(a.astype(np.float32), requires_grad=True) for a in init]
    opt = optim.Adam(p32, lr=0.1)
    opt.load_state_dict(pair.fopt.state_dict())
    assert opt.state[p32[0]]["exp_avg"].dtype is flow.float32
    assert opt.state[p32[0]]["step"].dtype is flow.float32
    assert opt.state[p32[0]]["step"].item() == 1.0


def test_load_state_dict_rejects_mismatched_groups():
    init, _ = _data(np.float64)
    p = [flow.tensor(a, requires_grad=True) for a in init]
    sd = optim.SGD(p, lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        optim.SGD([{"params": [p[0]]}, {"params": [p[1]]}], lr=0.1).load_state_dict(sd)
    with pytest.raises(ValueError, match="doesn't match the size"):
        optim.SGD([p[0]], lr=0.1).load_state_dict(sd)


def _quadratic(lib, x, y, w):
    err = lib.matmul(x, w) - y
    return (err * err).sum()


@pytest.mark.parametrize("name,kw", [("SGD", {"lr": 0.01, "momentum": 0.9}),
                                     ("Adam", {"lr": 0.05}),
                                     ("RMSprop", {"lr": 0.01, "centered": True})])
def test_closure_with_autograd_matches_torch(name, kw):
    """step(closure) re-evaluates the loss with grad enabled; gradients come from backward."""
    rng = np.random.default_rng(3)
    x, y, w0 = rng.standard_normal((8, 3)), rng.standard_normal((8, 2)), rng.standard_normal(
        (3, 2))
    fw = flow.tensor(w0, requires_grad=True)
    tw = torch.tensor(w0, requires_grad=True)
    fx, fy, tx, ty = flow.tensor(x), flow.tensor(y), torch.tensor(x), torch.tensor(y)
    fopt, topt = getattr(optim, name)([fw], **kw), _torch_opt(name, [tw], **kw)

    def fclosure():
        fopt.zero_grad()
        loss = _quadratic(flow, fx, fy, fw)
        loss.backward()
        return loss

    def tclosure():
        topt.zero_grad()
        loss = _quadratic(torch, tx, ty, tw)
        loss.backward()
        return loss

    with flow.no_grad():  # the closure must still record (step enables grad for it)
        for _ in range(10):
            fl = fopt.step(fclosure)
            tl = topt.step(tclosure)
            np.testing.assert_allclose(fl.item(), tl.item(), rtol=1e-10)
    np.testing.assert_allclose(fw.detach().numpy(), tw.detach().numpy(), rtol=1e-10)
    assert fw.grad is not None and fw.grad.grad_fn is None


def test_step_does_not_record_autograd():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = flow.tensor([0.5, 0.5])
    opt.step()
    assert w.grad_fn is None and w.is_leaf
    assert not opt.state[w]["momentum_buffer"].requires_grad
    np.testing.assert_allclose(w.detach().numpy(), [0.95, 1.95])


def test_zero_grad():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    w.grad = flow.tensor([3.0, 4.0])
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 0.0])
    opt.zero_grad()
    assert w.grad is None


def test_param_group_validation():
    w = flow.tensor([1.0], requires_grad=True)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(w, lr=0.1)
    empty = optim.Adam([], lr=0.1)  # OneFlow's behaviour (torch raises): steps do nothing
    assert [g["params"] for g in empty.param_groups] == [[]]
    empty.zero_grad()
    empty.step()
    assert empty.state_dict()["param_groups"][0]["params"] == []
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([w * 2], lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [w]}, {"params": [w]}], lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD([{"params": {w}}], lr=0.1)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        optim.Adam([w], lr=-1.0)
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1"):
        optim.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        optim.SGD([w], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Invalid alpha"):
        optim.RMSprop([w], alpha=-0.5)
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        optim.Adagrad([w], initial_accumulator_value=-1.0)


def test_add_param_group_and_named_params():
    a = flow.tensor([1.0], requires_grad=True)
    b = flow.tensor([2.0], requires_grad=True)
    opt = optim.SGD([("a", a)], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": [("b", b)], "lr": 0.5})
    assert opt.param_groups[1]["momentum"] == 0.9  # defaults fill the new group
    assert opt.param_groups[1]["param_names"] == ["b"]
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    with pytest.raises(ValueError, match="with/without names"):
        opt.add_param_group({"params": [flow.tensor([3.0], requires_grad=True)]})
    a.grad, b.grad = flow.tensor([1.0]), flow.tensor([1.0])
    opt.step()
    np.testing.assert_allclose([a.item(), b.item()], [0.9, 1.5])


def test_adagrad_state_is_created_eagerly_like_torch():
    w = flow.tensor([1.0, 2.0], requires_grad=True)
    tw = torch.tensor([1.0, 2.0], requires_grad=True)
    f = optim.Adagrad([w], initial_accumulator_value=0.25).state_dict()
    t = torch.optim.Adagrad([tw], initial_accumulator_value=0.25).state_dict()
    assert sorted(f["state"][0]) == sorted(t["state"][0])
    np.testing.assert_array_equal(f["state"][0]["sum"].numpy(), t["state"][0]["sum"].numpy())


def test_step_hooks():
    w = flow.tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    calls = []
    h1 = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append(("pre", w.item())))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append(("post", w.item())))
    w.grad = flow.tensor([1.0])
    opt.step()
    h1.remove()
    opt.step()
    assert [c[0] for c in calls] == ["pre", "post", "post"]
    np.testing.assert_allclose([c[1] for c in calls], [1.0, 0.9, 0.8])


def test_repr_lists_groups():
    w = flow.tensor([1.0], requires_grad=True)
    text = repr(optim.SGD([w], lr=0.1))
    assert text.startswith("SGD (\nParameter Group 0\n") and "    lr: 0.1\n" in text


@pytest.mark.parametrize("foreach", [None, False])
def test_adam_without_bias_correction_as_oneflow(foreach):
    """OneFlow's Adam(do_bias_correction=False): m / (sqrt(v) + eps) with no 1 - beta^t
    corrections (checked against NumPy), per group; a graph refuses it by name."""
    rng = np.random.default_rng(3)
    w0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(3)]
    w = flow.tensor(w0.copy(), requires_grad=True)
    other = flow.tensor(w0.copy(), requires_grad=True)
    opt = optim.Adam([{"params": [w], "do_bias_correction": False}, {"params": [other]}],
                     lr=0.1, betas=(0.8, 0.9), eps=1e-8, foreach=foreach)
    m = v = np.zeros(4)
    want = w0.copy()
    for g in grads:
        w.grad, other.grad = flow.tensor(g), flow.tensor(g)
        opt.step()
        m, v = 0.8 * m + 0.2 * g, 0.9 * v + 0.1 * g * g
        want = want - 0.1 * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-12)
    ref = torch.tensor(w0.copy(), requires_grad=True)  # the other group: torch's Adam
    topt = torch.optim.Adam([ref], lr=0.1, betas=(0.8, 0.9), eps=1e-8)
    for g in grads:
        ref.grad = torch.tensor(g)
        topt.step()
    np.testing.assert_allclose(other.detach().numpy(), ref.detach().numpy(), rtol=1e-12)

    model = flow.nn.Linear(2, 1)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(optim.Adam(model.parameters(), do_bias_correction=False))

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss

    with pytest.raises(NotImplementedError, match="do_bias_correction=False"):
        G()(flow.ones(3, 2))


def test_oneflow_cosine_decay_lr():
    """OneFlow's CosineDecayLR, against its documented formula."""
    w = flow.tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.5)
    sched = optim.lr_scheduler.CosineDecayLR(opt, decay_steps=4, alpha=0.1)
    got = []
    for _ in range(7):
        got.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    want = [0.5 * ((0.9 * 0.5 * (1 + np.cos(np.pi * s / 4)) + 0.1) if s < 4 else 0.1)
            for s in range(7)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert sched.last_step == 7 and sched.get_last_lr() == [opt.param_groups[0]["lr"]]
    with pytest.raises(ValueError, match="decay_steps"):
        optim.lr_scheduler.CosineDecayLR(opt, decay_steps=0)
