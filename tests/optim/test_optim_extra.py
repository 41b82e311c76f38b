"""Adadelta, Adamax, NAdam, RAdam, ASGD, LBFGS, CyclicLR and WeightedRandomSampler against
torch 2.13: parameter trajectories, state and state dicts, errors, lr/momentum sequences and
the sampler's distribution."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow import optim
from sbpflow.optim import lr_scheduler as lrs
from sbpflow.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from .pairs import STEPS, _data, _ids, _Pair, _skips

# (rtol, atol) for trajectories after STEPS updates (one decade looser in float64 than
# test_optim's: these updates chain more transcendental steps).
TOL = {"float64": (1e-9, 1e-12), "float32": (2e-5, 2e-6)}

CONFIGS = [
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1}),
    ("Adadelta", {"lr": 0.5, "maximize": True}),
    ("Adamax", {"lr": 0.05}),
    ("Adamax", {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-4, "weight_decay": 0.1}),
    ("Adamax", {"lr": 0.05, "maximize": True}),
    ("NAdam", {"lr": 0.05}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1, "momentum_decay": 0.01}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("RAdam", {"lr": 0.05}),
    ("RAdam", {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True,
               "maximize": True}),
    ("ASGD", {"lr": 0.05}),
    ("ASGD", {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 4, "weight_decay": 0.1}),
    ("ASGD", {"lr": 0.05, "t0": 0, "maximize": True}),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_trajectory_matches_torch(cfg, dtype):
    name, kw = cfg
    init, grads = _data(dtype)
    pair = _Pair(name, kw, init, groups=(dtype is np.float64))
    for k in range(STEPS):
        pair.step(k, grads)
        pair.check(dtype, f"after step {k + 1}", TOL)
    assert pair.fp[0].dtype is (flow.float64 if dtype is np.float64 else flow.float32)


def _assert_state_equal(fsd, tsd, rtol=1e-10):
    assert sorted(fsd["state"]) == sorted(tsd["state"])
    for idx, tstate in tsd["state"].items():
        fstate = fsd["state"][idx]
        assert sorted(fstate) == sorted(tstate)
        for key, tval in tstate.items():
            fval = fstate[key]
            if isinstance(tval, torch.Tensor):
                assert fval.dtype.name == str(tval.dtype).replace("torch.", ""), key
                assert tuple(fval.shape) == tuple(tval.shape), key
                np.testing.assert_allclose(fval.numpy(), tval.numpy(), rtol=rtol, atol=1e-12,
                                           err_msg=f"state[{idx}][{key}]")
            else:
                assert fval == tval, key


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_state_matches_torch(cfg):
    """The per-parameter state (buffers, step counts, mu_product, eta, mu) has torch's keys,
    dtypes and values, and the param groups torch's options."""
    name, kw = cfg
    init, grads = _data(np.float64, seed=1)
    pair = _Pair(name, kw, init)
    for k in range(6):
        pair.step(k, grads)
    fsd, tsd = pair.fopt.state_dict(), pair.topt.state_dict()
    _assert_state_equal(fsd, tsd)
    assert fsd["param_groups"] == tsd["param_groups"]


def _resumed(name, kw, fparams, tparams, fsd, tsd):
    """Fresh optimizers (two groups) on copies of the parameters, loaded from state dicts."""
    f2 = [flow.tensor(p.detach().numpy().copy(), requires_grad=True) for p in fparams]
    t2 = [torch.tensor(p.detach().numpy().copy(), requires_grad=True) for p in tparams]
    fopt = getattr(optim, name)([{"params": [f2[0]]}, {"params": [f2[1]]}], **kw)
    topt = getattr(torch.optim, name)([{"params": [t2[0]]}, {"params": [t2[1]]}],
                                      foreach=False, **kw)
    fopt.load_state_dict(fsd)
    topt.load_state_dict(copy.deepcopy(tsd))  # torch's loaded buffers may alias the dict's
    return f2, t2, fopt, topt


# Their 0-d float32 state (mu_product; eta, mu) becomes float64 when loaded into float64
# parameters (torch's casting policy), so a resumed run leaves the uninterrupted one by ~1e-9.
_SCALAR_STATE = ("NAdam", "ASGD")


@pytest.mark.parametrize("cfg", CONFIGS[1::2], ids=_ids)
def test_state_dict_resumes_like_torch(cfg):
    """Save after 8 steps, load into fresh optimizers on copied weights (ours from our state
    dict, torch's from its own): the resumed runs match, and where loading casts nothing,
    equal the optimizer that went on bit for bit."""
    name, kw = cfg
    init, grads = _data(np.float64, seed=2)
    pair = _Pair(name, kw, init, groups=True)
    for k in range(8):
        pair.step(k, grads)
    f2, t2, fopt2, topt2 = _resumed(name, kw, pair.fp, pair.tp, pair.fopt.state_dict(),
                                    pair.topt.state_dict())
    assert fopt2.param_groups[1]["lr"] == kw.get("lr", 1.0) / 2  # options come from the dict
    _assert_state_equal(fopt2.state_dict(), topt2.state_dict())
    for k in range(8, STEPS):
        pair.step(k, grads)
        for i, (fp, tp) in enumerate(zip(f2, t2, strict=True)):
            fp.grad = None if _skips(k, i) else flow.tensor(grads[k][i].copy())
            tp.grad = None if _skips(k, i) else torch.tensor(grads[k][i].copy())
        fopt2.step()
        topt2.step()
        for a, b, c in zip(f2, t2, pair.fp, strict=True):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10)
            if name not in _SCALAR_STATE:
                np.testing.assert_array_equal(a.detach().numpy(), c.detach().numpy())
    pair.check(np.float64, tol=TOL)


def test_torch_state_dict_loads_and_continues():
    """A torch NAdam/ASGD state dict (tensors converted) continues exactly as torch does."""
    for name, kw in [("NAdam", {"lr": 0.05}), ("ASGD", {"lr": 0.05, "t0": 3})]:
        init, grads = _data(np.float64, seed=3)
        pair = _Pair(name, kw, init, groups=True)
        for k in range(5):
            pair.step(k, grads)
        tsd = pair.topt.state_dict()
        converted = {
            "state": {i: {k: flow.tensor(v.numpy()) for k, v in s.items()}
                      for i, s in tsd["state"].items()},
            "param_groups": tsd["param_groups"],
        }
        f2, t2, fopt2, topt2 = _resumed(name, kw, pair.tp, pair.tp, converted, tsd)
        for k in range(5, STEPS):
            for i, (fp, tp) in enumerate(zip(f2, t2, strict=True)):
                fp.grad = None if _skips(k, i) else flow.tensor(grads[k][i].copy())
                tp.grad = None if _skips(k, i) else torch.tensor(grads[k][i].copy())
            fopt2.step()
            topt2.step()
        for a, b in zip(f2, t2, strict=True):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-10)
        _assert_state_equal(fopt2.state_dict(), topt2.state_dict())


def _mlp(lib, dtype):
    lib.manual_seed(0)
    model = lib.nn.Sequential(lib.nn.Linear(4, 8), lib.nn.Tanh(), lib.nn.Linear(8, 1))
    return model.to(dtype)


@pytest.mark.parametrize("name,kw", [("Adadelta", {"weight_decay": 0.01}),
                                     ("Adamax", {"lr": 0.01}),
                                     ("NAdam", {"lr": 0.01}),
                                     ("RAdam", {"lr": 0.01, "decoupled_weight_decay": True,
                                                "weight_decay": 0.01}),
                                     ("ASGD", {"lr": 0.05, "t0": 5})])
def test_small_model_matches_torch(name, kw):
    """A 2-layer MLP trained with closures for 20 steps: losses and weights match torch."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((16, 4)), rng.standard_normal((16, 1))
    tmodel = _mlp(torch, torch.float64)
    fmodel = _mlp(flow, flow.float64)
    fmodel.load_state_dict({k: flow.tensor(v.detach().numpy())
                            for k, v in tmodel.state_dict().items()})
    topt = getattr(torch.optim, name)(tmodel.parameters(), **kw)
    fopt = getattr(optim, name)(fmodel.parameters(), **kw)

    def closure(lib, model, opt):
        def run():
            opt.zero_grad()
            loss = lib.nn.functional.mse_loss(model(lib.tensor(x)), lib.tensor(y))
            loss.backward()
            return loss
        return run

    for k in range(STEPS):
        tl = topt.step(closure(torch, tmodel, topt))
        fl = fopt.step(closure(flow, fmodel, fopt))
        np.testing.assert_allclose(fl.item(), tl.item(), rtol=1e-9, err_msg=f"loss {k}")
    for (n, tv), fv in zip(tmodel.state_dict().items(), fmodel.state_dict().values(),
                           strict=True):
        np.testing.assert_allclose(fv.numpy(), tv.detach().numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=n)


INVALID = [
    ("Adadelta", {"lr": -1.0}), ("Adadelta", {"rho": 1.5}), ("Adadelta", {"eps": -1.0}),
    ("Adadelta", {"weight_decay": -0.1}),
    ("Adamax", {"lr": -0.1}), ("Adamax", {"eps": -1.0}), ("Adamax", {"betas": (1.0, 0.9)}),
    ("Adamax", {"betas": (0.9, -0.1)}), ("Adamax", {"weight_decay": -1}),
    ("NAdam", {"lr": -0.1}), ("NAdam", {"betas": (0.9, 1.0)}),
    ("NAdam", {"momentum_decay": -0.1}), ("NAdam", {"weight_decay": -1}),
    ("RAdam", {"lr": -0.1}), ("RAdam", {"eps": -1e-8}), ("RAdam", {"betas": (-0.1, 0.9)}),
    ("RAdam", {"weight_decay": -1}),
    ("ASGD", {"lr": -0.1}), ("ASGD", {"weight_decay": -1}),
    ("LBFGS", {"lr": -1.0}),
]


@pytest.mark.parametrize("name,kw", INVALID, ids=[_ids(c) for c in INVALID])
def test_invalid_hyper_parameters_raise_torch_errors(name, kw):
    with pytest.raises(ValueError) as expected:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **kw)
    with pytest.raises(ValueError) as got:
        getattr(optim, name)([flow.zeros(2, requires_grad=True)], **kw)
    assert str(got.value) == str(expected.value)


def test_tensor_lr_must_have_one_element():
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        optim.NAdam([flow.zeros(2, requires_grad=True)], lr=flow.tensor([0.1, 0.2]))


def test_flags_accepted_or_refused_clearly():
    p = flow.zeros(2, requires_grad=True)
    for name in ("Adadelta", "Adamax", "NAdam", "RAdam", "ASGD"):
        for foreach in (None, True, False):
            opt = getattr(optim, name)([p], foreach=foreach)
            assert opt.param_groups[0]["foreach"] is foreach
        with pytest.raises(NotImplementedError, match="capturable=True is not supported"):
            getattr(optim, name)([p], capturable=True)
        with pytest.raises(NotImplementedError, match="differentiable=True is not supported"):
            getattr(optim, name)([p], differentiable=True)


def test_step_count_follows_loaded_or_replaced_state():
    """The host copy of `step` is dropped when the state's tensor is not the one we wrote."""
    init, grads = _data(np.float64)
    pair = _Pair("RAdam", {"lr": 0.05}, init)
    for k in range(3):
        pair.step(k, grads)
    for state in (pair.fopt.state[p] for p in pair.fp):
        state["step"] = flow.tensor(float(state["step"].item()), dtype=flow.float32)
    for state in (pair.topt.state[p] for p in pair.tp):
        state["step"] = torch.tensor(float(state["step"].item()))
    for k in range(3, STEPS):
        pair.step(k, grads)
    pair.check(np.float64, tol=TOL)
    assert pair.fopt.state[pair.fp[0]]["step"].item() == STEPS


# -- LBFGS --------------------------------------------------------------------------------
def _rosenbrock(x):
    return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2


def _rosenbrock_np(x):
    """Rosenbrock's value and gradient in NumPy: both frameworks see the same numbers."""
    a, b = x
    value = (1 - a) ** 2 + 100 * (b - a * a) ** 2
    grad = np.array([-2 * (1 - a) - 400 * a * (b - a * a), 200 * (b - a * a)])
    return value, grad


def _lbfgs_rosenbrock(lib, steps, autograd=False, **kw):
    x = lib.tensor([-1.5, 2.0], dtype=lib.float64, requires_grad=True)
    opt = lib.optim.LBFGS([x], **kw)

    def closure():
        opt.zero_grad()
        if autograd:
            loss = _rosenbrock(x)
            loss.backward()
            return loss
        value, grad = _rosenbrock_np(x.detach().numpy())
        x.grad = lib.tensor(grad)
        return lib.tensor(value)

    losses = [opt.step(closure).item() for _ in range(steps)]
    return np.array(losses), x.detach().numpy(), opt


@pytest.mark.parametrize("kw", [{}, {"line_search_fn": "strong_wolfe"},
                                {"history_size": 3, "max_iter": 7},
                                {"history_size": 3, "max_iter": 7,
                                 "line_search_fn": "strong_wolfe"},
                                {"lr": 0.5, "max_eval": 12, "line_search_fn": "strong_wolfe"},
                                {"tolerance_change": 1e-4, "tolerance_grad": 1e-3,
                                 "line_search_fn": "strong_wolfe"},
                                {"tolerance_change": 1e-3, "max_iter": 6}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_lbfgs_rosenbrock_matches_torch(kw):
    tl, tx, topt = _lbfgs_rosenbrock(torch, 5, **kw)
    fl, fx, fopt = _lbfgs_rosenbrock(flow, 5, **kw)
    # Same losses and gradients in both: only the update math differs, and only in the last
    # bits (torch fuses p + alpha * d into one rounding); Rosenbrock's valley amplifies them
    # to ~1e-7 of the first loss (12.5) after 5 steps of up to 20 iterations.
    np.testing.assert_allclose(fl, tl, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(fx, tx, rtol=1e-6, atol=1e-8)
    tstate, fstate = next(iter(topt.state.values())), next(iter(fopt.state.values()))
    assert fstate["func_evals"] == tstate["func_evals"]
    assert fstate["n_iter"] == tstate["n_iter"]
    assert len(fstate["old_dirs"]) == len(tstate["old_dirs"])
    assert sorted(fstate) == sorted(tstate)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_rosenbrock_with_autograd(line_search_fn):
    """The loss built from tensor ops and differentiated by autograd: both runs converge to
    (1, 1) along torch's path (without a line search the unit steps amplify last-bit
    differences of the backward pass, so the agreement there is looser)."""
    tl, tx, _ = _lbfgs_rosenbrock(torch, 5, autograd=True, line_search_fn=line_search_fn)
    fl, fx, _ = _lbfgs_rosenbrock(flow, 5, autograd=True, line_search_fn=line_search_fn)
    rtol = 1e-9 if line_search_fn else 1e-3
    np.testing.assert_allclose(fl, tl, rtol=rtol, atol=1e-12 if line_search_fn else 1e-4)
    np.testing.assert_allclose(fx, tx, rtol=rtol)
    if line_search_fn:
        assert fl[-1] < 1e-8
        np.testing.assert_allclose(fx, [1.0, 1.0], atol=1e-4)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_regression_matches_torch(line_search_fn):
    """Least squares on a linear model with two parameters (weight and bias), float64."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 3))
    y = x @ np.array([[1.5], [-2.0], [0.5]]) + 0.3 + 0.01 * rng.standard_normal((32, 1))

    def fit(lib):
        lin = lib.nn.Linear(3, 1).to(lib.float64)
        with lib.no_grad():
            lin.weight.copy_(lib.tensor([[0.1, 0.2, -0.3]], dtype=lib.float64))
            lin.bias.zero_()
        opt = lib.optim.LBFGS(lin.parameters(), history_size=5, max_iter=10,
                              line_search_fn=line_search_fn)
        xt, yt = lib.tensor(x), lib.tensor(y)

        def closure():
            opt.zero_grad()
            loss = ((lin(xt) - yt) ** 2).mean()
            loss.backward()
            return loss

        losses = [opt.step(closure).item() for _ in range(3)]
        return losses, lin.weight.detach().numpy(), lin.bias.detach().numpy()

    tl, tw, tb = fit(torch)
    fl, fw, fb = fit(flow)
    np.testing.assert_allclose(fl, tl, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(fw, tw, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(fb, tb, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(fw, [[1.5, -2.0, 0.5]], atol=0.02)


def test_lbfgs_state_dict_round_trip_continues():
    """Save LBFGS after 2 steps, load into a fresh optimizer: the next steps match torch."""
    _, _, fopt = _lbfgs_rosenbrock(flow, 2, history_size=4, max_iter=5)
    tl, tx, _ = _lbfgs_rosenbrock(torch, 4, history_size=4, max_iter=5)
    x = flow.tensor(fopt.param_groups[0]["params"][0].detach().numpy(), requires_grad=True)
    opt2 = optim.LBFGS([x], history_size=4, max_iter=5)
    opt2.load_state_dict(fopt.state_dict())

    def closure():
        opt2.zero_grad()
        loss = _rosenbrock(x)
        loss.backward()
        return loss

    losses = [opt2.step(closure).item() for _ in range(2)]
    np.testing.assert_allclose(losses, tl[2:], rtol=1e-6)
    np.testing.assert_allclose(x.detach().numpy(), tx, rtol=1e-6, atol=1e-8)


def test_lbfgs_parameter_without_gradient_stays_put():
    """A parameter the loss does not use counts as a zero gradient (torch's flat gradient)."""
    def run(lib):
        x = lib.tensor([-1.5, 2.0], dtype=lib.float64, requires_grad=True)
        unused = lib.tensor([3.0], dtype=lib.float64, requires_grad=True)
        opt = lib.optim.LBFGS([unused, x], line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            value, grad = _rosenbrock_np(x.detach().numpy())
            x.grad = lib.tensor(grad)
            return lib.tensor(value)

        losses = [opt.step(closure).item() for _ in range(3)]
        return losses, x.detach().numpy(), unused.detach().numpy()

    (tl, tx, tu), (fl, fx, fu) = run(torch), run(flow)
    np.testing.assert_allclose(fl, tl, rtol=1e-9)
    np.testing.assert_allclose(fx, tx, rtol=1e-9)
    assert fu.tolist() == tu.tolist() == [3.0]


def test_lbfgs_errors():
    p = flow.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match="doesn't support per-parameter options"):
        optim.LBFGS([{"params": [p]}, {"params": [flow.zeros(1, requires_grad=True)]}])
    opt = optim.LBFGS([p], line_search_fn="armijo")
    p.grad = flow.ones(2)
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        opt.step(lambda: (p * p).sum())
    with pytest.raises(TypeError):
        optim.LBFGS([p]).step()  # closure is required, as in torch
    with pytest.raises(RuntimeError, match="requires a closure"):
        optim.LBFGS([p]).step(None)
    assert optim.LBFGS([p], max_iter=8).param_groups[0]["max_eval"] == 10


def test_lbfgs_stops_at_optimum():
    """A zero gradient returns the first loss without moving (tolerance_grad)."""
    x = flow.tensor([1.0, 1.0], dtype=flow.float64, requires_grad=True)
    opt = optim.LBFGS([x])

    def closure():
        opt.zero_grad()
        loss = _rosenbrock(x)
        loss.backward()
        return loss

    assert opt.step(closure).item() == 0.0
    np.testing.assert_array_equal(x.detach().numpy(), [1.0, 1.0])
    assert opt.state[x]["func_evals"] == 1 and opt.state[x]["n_iter"] == 0


# -- CyclicLR and OneCycleLR -----------------------------------------------------------------
def _optimizers(opt_name="SGD", **kw):
    """Two param groups (lr 0.1 and 0.02) in both frameworks."""
    fw = [flow.tensor([1.0], requires_grad=True), flow.tensor([2.0], requires_grad=True)]
    tw = [torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)]
    fopt = getattr(optim, opt_name)([{"params": [fw[0]]}, {"params": [fw[1]], "lr": 0.02}],
                                    lr=0.1, **kw)
    topt = getattr(torch.optim, opt_name)(
        [{"params": [tw[0]]}, {"params": [tw[1]], "lr": 0.02}], lr=0.1, foreach=False, **kw)
    return fopt, topt


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups]


def _half_per_cycle(x):
    return 0.5 ** (x - 1)


class _Decay:
    """A callable-object scale_fn: its __dict__ goes into the scheduler's state dict."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, x):
        return math.exp(-self.rate * x)

    def __repr__(self):  # a stable test id (xdist workers must collect the same names)
        return f"_Decay({self.rate})"


CYCLIC = [
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 4},
    {"base_lr": [0.01, 0.002], "max_lr": [0.1, 0.05], "step_size_up": 3, "step_size_down": 7,
     "mode": "triangular2"},
    {"base_lr": 0.01, "max_lr": 0.2, "step_size_up": 5, "mode": "exp_range", "gamma": 0.97,
     "base_momentum": 0.7, "max_momentum": 0.95},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 6, "scale_fn": _half_per_cycle},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 6, "scale_fn": _Decay(0.02),
     "scale_mode": "iterations"},
    {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 2, "step_size_down": 5,
     "cycle_momentum": False},
]


def _sched_ids(kw):
    return ",".join(f"{k}={getattr(v, '__name__', v)}" for k, v in kw.items())


def _run(fopt, topt, fs, ts, steps, momentum):
    for k in range(steps):
        fopt.step()
        topt.step()
        fs.step()
        ts.step()
        np.testing.assert_allclose(fs.get_last_lr(), ts.get_last_lr(), rtol=1e-12, atol=1e-15,
                                   err_msg=f"lr after step {k + 1}")
        assert [g["lr"] for g in fopt.param_groups] == fs.get_last_lr()
        if momentum:
            np.testing.assert_allclose(_momenta(fopt), _momenta(topt), rtol=1e-12,
                                       err_msg=f"momentum after step {k + 1}")


@pytest.mark.parametrize("opt_name,opt_kw", [("SGD", {"momentum": 0.9}),
                                             ("Adam", {"betas": (0.9, 0.99)})])
@pytest.mark.parametrize("kw", CYCLIC, ids=_sched_ids)
def test_cyclic_lr_matches_torch(kw, opt_name, opt_kw):
    fopt, topt = _optimizers(opt_name, **opt_kw)
    fs = lrs.CyclicLR(fopt, **kw)
    ts = torch.optim.lr_scheduler.CyclicLR(topt, **kw)
    np.testing.assert_allclose(fs.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
    cycles = kw.get("cycle_momentum", True)
    assert _momenta(fopt) == _momenta(topt)
    _run(fopt, topt, fs, ts, 50, momentum=cycles)
    if opt_name == "Adam":
        assert [g["betas"][1] for g in fopt.param_groups] == [0.99, 0.99]
    for key in ("max_momentum", "base_momentum"):
        assert [g.get(key) for g in fopt.param_groups] == [g.get(key) for g in
                                                           topt.param_groups]


def test_cyclic_lr_state_dict_round_trip():
    fopt, topt = _optimizers("SGD", momentum=0.9)
    kw = {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 3, "scale_fn": _Decay(0.1),
          "scale_mode": "iterations"}
    fs, ts = lrs.CyclicLR(fopt, **kw), torch.optim.lr_scheduler.CyclicLR(topt, **kw)
    _run(fopt, topt, fs, ts, 7, momentum=True)
    fsd, tsd = fs.state_dict(), ts.state_dict()
    assert fsd["_scale_fn_custom"] == tsd["_scale_fn_custom"] == {"rate": 0.1}
    assert "optimizer" not in fsd
    fopt2, _ = _optimizers("SGD", momentum=0.9)
    fopt2.load_state_dict(fopt.state_dict())
    fs2 = lrs.CyclicLR(fopt2, scale_fn=_Decay(0.5), **{k: v for k, v in kw.items()
                                                          if k != "scale_fn"})
    fs2.load_state_dict(fsd)
    assert fs2._scale_fn_custom.rate == 0.1
    _run(fopt2, topt, fs2, ts, 10, momentum=True)


def test_cyclic_lr_errors():
    fopt, _ = _optimizers("SGD", momentum=0.9)
    with pytest.raises(ValueError, match="mode is invalid and scale_fn is None"):
        lrs.CyclicLR(fopt, 0.01, 0.1, mode="sine")
    with pytest.raises(ValueError, match="max_lr must have the same length"):
        lrs.CyclicLR(fopt, 0.01, [0.1, 0.2, 0.3])
    adagrad = optim.Adagrad([flow.zeros(1, requires_grad=True)])
    with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
        lrs.CyclicLR(adagrad, 0.01, 0.1)
    lrs.CyclicLR(adagrad, 0.01, 0.1, cycle_momentum=False)  # fine without momentum
    with pytest.raises(TypeError, match="is not an Optimizer"):
        lrs.CyclicLR(object(), 0.01, 0.1)


@pytest.mark.parametrize("opt_name,opt_kw,kw", [
    ("SGD", {"momentum": 0.9}, {"max_lr": [1.0, 0.4], "total_steps": 51}),
    ("NAdam", {}, {"max_lr": 0.5, "total_steps": 51, "anneal_strategy": "linear",
                   "pct_start": 0.2}),
    ("RAdam", {}, {"max_lr": 0.5, "epochs": 5, "steps_per_epoch": 11, "three_phase": True}),
])
def test_one_cycle_lr_50_steps_matches_torch(opt_name, opt_kw, kw):
    fopt, topt = _optimizers(opt_name, **opt_kw)
    fs = lrs.OneCycleLR(fopt, **kw)
    ts = torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
    _run(fopt, topt, fs, ts, 50, momentum=True)


# -- WeightedRandomSampler -------------------------------------------------------------------
def test_weighted_sampler_distribution():
    """With replacement the index frequencies follow the weights (a tolerant chi-square test
    at a fixed seed); zero weights never appear."""
    weights = [1.0, 2.0, 0.0, 4.0, 3.0]
    n = 20000
    gen = flow.Generator().manual_seed(7)
    draws = list(WeightedRandomSampler(weights, n, generator=gen))
    assert len(draws) == n and all(isinstance(i, int) for i in draws)
    counts = np.bincount(draws, minlength=5)
    assert counts[2] == 0
    expected = n * np.array(weights) / sum(weights)
    mask = expected > 0
    chi2 = (((counts - expected)[mask]) ** 2 / expected[mask]).sum()
    assert chi2 < 25.0  # 4 degrees of freedom: P(chi2 > 25) < 1e-4
    np.testing.assert_allclose(counts / n, expected / n, atol=0.015)


def test_weighted_sampler_without_replacement():
    weights = flow.tensor([0.5, 5.0, 0.0, 1.0, 3.0, 0.0])
    gen = flow.Generator().manual_seed(3)
    sampler = WeightedRandomSampler(weights, 6, replacement=False, generator=gen)
    firsts = []
    for _ in range(3000):
        draw = list(sampler)
        assert sorted(draw) == list(range(6))  # distinct indices
        assert set(draw[4:]) == {2, 5}  # zero weights only after every positive one
        firsts.append(draw[0])
    # The first pick is a single weighted draw: P(first = i) = w_i / sum(w).
    freq = np.bincount(firsts, minlength=6) / len(firsts)
    np.testing.assert_allclose(freq, np.array([0.5, 5.0, 0.0, 1.0, 3.0, 0.0]) / 9.5,
                               atol=0.03)
    # The second pick, given the first was index 1: weights without index 1.
    seconds = [list(sampler)[:2] for _ in range(3000)]
    after_1 = [b for a, b in seconds if a == 1]
    freq2 = np.bincount(after_1, minlength=6) / len(after_1)
    np.testing.assert_allclose(freq2, np.array([0.5, 0, 0, 1.0, 3.0, 0]) / 4.5, atol=0.04)


def test_weighted_sampler_is_reproducible_with_a_generator():
    a = list(WeightedRandomSampler([1, 2, 3], 50, generator=flow.Generator().manual_seed(1)))
    b = list(WeightedRandomSampler([1, 2, 3], 50, generator=flow.Generator().manual_seed(1)))
    assert a == b
    flow.manual_seed(5)
    c = list(WeightedRandomSampler([1, 2, 3], 50))
    flow.manual_seed(5)
    assert list(WeightedRandomSampler([1, 2, 3], 50)) == c
    sampler = WeightedRandomSampler([1.0, 2.0], 4)
    assert len(sampler) == 4
    assert sampler.weights.dtype is flow.float64


def test_weighted_sampler_in_a_dataloader():
    data = TensorDataset(flow.arange(10))
    sampler = WeightedRandomSampler([0.0] * 5 + [1.0] * 5, 40,
                                    generator=flow.Generator().manual_seed(2))
    seen = [int(v) for (batch,) in DataLoader(data, batch_size=8, sampler=sampler)
            for v in batch.tolist()]
    assert len(seen) == 40 and set(seen) <= {5, 6, 7, 8, 9}


@pytest.mark.parametrize("args", [
    ([1.0, -1.0], 2), ([0.0, 0.0], 2), ([1.0, float("nan")], 2), ([1.0, float("inf")], 2),
    ([], 3), ([1.0, 2.0], 3, False), ([[1.0, 2.0]], 2), ([1.0], 0), ([1.0], 2.0),
    ([1.0], True), ([1.0], 2, 1),
], ids=str)
def test_weighted_sampler_errors_match_torch(args):
    with pytest.raises((ValueError, RuntimeError)) as expected:
        list(torch.utils.data.WeightedRandomSampler(*args))
    with pytest.raises(expected.type) as got:
        list(WeightedRandomSampler(*args))
    assert str(got.value) == str(expected.value)
