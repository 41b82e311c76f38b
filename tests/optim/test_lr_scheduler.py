"""Learning-rate schedulers against torch 2.13: lr (and momentum) sequences, state dicts."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow import optim
from sbpflow.framework import serialization
from sbpflow.optim import lr_scheduler as lrs

STEPS = 30


def _optimizers(opt_name="SGD", **kw):
    """Two param groups (lr 0.1 and 0.02) in both frameworks."""
    fw = [flow.tensor([1.0], requires_grad=True), flow.tensor([2.0], requires_grad=True)]
    tw = [torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)]
    fopt = getattr(optim, opt_name)([{"params": [fw[0]]}, {"params": [fw[1]], "lr": 0.02}],
                                    lr=0.1, **kw)
    topt = getattr(torch.optim, opt_name)(
        [{"params": [tw[0]]}, {"params": [tw[1]], "lr": 0.02}], lr=0.1, foreach=False, **kw)
    return fopt, topt


def _sched(lib, opt, spec):
    """Build the scheduler (or schedulers) `spec` names on `opt`, from lib's lr_scheduler."""
    mod = lrs if lib is flow else torch.optim.lr_scheduler
    kind, kw = spec
    if kind == "Sequential":
        first = mod.LinearLR(opt, start_factor=0.2, total_iters=5)
        second = mod.CosineAnnealingLR(opt, T_max=12, eta_min=0.001)
        third = mod.ExponentialLR(opt, gamma=0.9)
        return mod.SequentialLR(opt, [first, second, third], milestones=[5, 17])
    if kind == "Chained":
        return mod.ChainedScheduler([mod.StepLR(opt, step_size=4, gamma=0.5),
                                     mod.ExponentialLR(opt, gamma=0.95)])
    if kind == "LambdaLR":
        return mod.LambdaLR(opt, lr_lambda=[lambda e: 0.95**e, lambda e: 1.0 / (1 + e)])
    if kind == "MultiplicativeLR":
        return mod.MultiplicativeLR(opt, lr_lambda=lambda e: 0.9 if e % 2 else 1.0)
    return getattr(mod, kind)(opt, **kw)


SPECS = [
    ("StepLR", {"step_size": 7, "gamma": 0.3}),
    ("MultiStepLR", {"milestones": [3, 8, 8, 20], "gamma": 0.5}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 10, "eta_min": 0.001}),  # past T_max: goes back up
    ("CosineAnnealingLR", {"T_max": 30}),
    ("LinearLR", {"start_factor": 0.25, "end_factor": 0.9, "total_iters": 12}),
    ("ConstantLR", {"factor": 0.5, "total_iters": 6}),
    ("PolynomialLR", {"total_iters": 20, "power": 2.0}),
    ("CosineAnnealingWarmRestarts", {"T_0": 4, "T_mult": 2, "eta_min": 0.001}),
    ("LambdaLR", {}),
    ("MultiplicativeLR", {}),
    ("OneCycleLR", {"max_lr": [1.0, 0.5], "total_steps": STEPS + 1}),
    ("OneCycleLR", {"max_lr": 1.0, "total_steps": STEPS + 1, "anneal_strategy": "linear",
                    "pct_start": 0.25}),
    ("OneCycleLR", {"max_lr": 0.8, "epochs": 4, "steps_per_epoch": 8, "three_phase": True,
                    "base_momentum": 0.8, "max_momentum": 0.9}),
    ("Sequential", {}),
    ("Chained", {}),
]


def _ids(spec):
    return spec[0] + "-" + ",".join(f"{k}={v}" for k, v in spec[1].items())


def _momenta(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups]


def _run(fopt, topt, fs, ts, steps, momentum=False):
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


@pytest.mark.parametrize("spec", SPECS, ids=_ids)
def test_lr_sequence_matches_torch(spec):
    kw = {"momentum": 0.9} if spec[0] == "OneCycleLR" else {}
    fopt, topt = _optimizers(**kw)
    fs, ts = _sched(flow, fopt, spec), _sched(torch, topt, spec)
    np.testing.assert_allclose(fs.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
    _run(fopt, topt, fs, ts, 31 if "epochs" in spec[1] else STEPS, momentum=bool(kw))


def test_one_cycle_cycles_adam_beta1():
    fopt, topt = _optimizers("Adam", betas=(0.9, 0.99))
    spec = ("OneCycleLR", {"max_lr": 0.5, "total_steps": 25, "three_phase": True})
    fs, ts = _sched(flow, fopt, spec), _sched(torch, topt, spec)
    assert _momenta(fopt) == _momenta(topt) == [0.95, 0.95]
    _run(fopt, topt, fs, ts, 24, momentum=True)
    assert [g["betas"][1] for g in fopt.param_groups] == [0.99, 0.99]
    with pytest.raises(ValueError, match="Tried to step 26 times"):
        fs.step()
        fs.step()


def test_two_chainable_schedulers_on_one_optimizer():
    fopt, topt = _optimizers()
    fa, fb = lrs.StepLR(fopt, 3, 0.5), lrs.CosineAnnealingLR(fopt, T_max=9)
    ta = torch.optim.lr_scheduler.StepLR(topt, 3, 0.5)
    tb = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=9)
    for _ in range(STEPS):
        fopt.step()
        topt.step()
        for s in (fa, fb, ta, tb):
            s.step()
        np.testing.assert_allclose([g["lr"] for g in fopt.param_groups],
                                   [g["lr"] for g in topt.param_groups], rtol=1e-12)


def test_step_with_epoch_uses_closed_form():
    fopt, topt = _optimizers()
    fs = lrs.MultiStepLR(fopt, [2, 5], gamma=0.1)
    ts = torch.optim.lr_scheduler.MultiStepLR(topt, [2, 5], gamma=0.1)
    fopt.step()
    topt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fs.step(6)
        ts.step(6)
    np.testing.assert_allclose(fs.get_last_lr(), ts.get_last_lr(), rtol=1e-14)


def test_reduce_lr_on_plateau_matches_torch():
    metrics = [1.0, 0.9, 0.91, 0.92, 0.93, 0.89, 0.95, 0.96, 0.97, 0.98, 0.97, 0.5, 0.6, 0.7,
               0.8, 0.9, 0.9, 0.9, 0.9, 0.9]
    for kw in [{"patience": 2}, {"mode": "max", "factor": 0.5, "patience": 1, "cooldown": 2,
                                 "threshold_mode": "abs", "threshold": 0.01,
                                 "min_lr": [0.01, 0.001]}]:
        fopt, topt = _optimizers()
        fs = lrs.ReduceLROnPlateau(fopt, **kw)
        ts = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, **kw)
        for m in metrics:
            fs.step(m)
            ts.step(m)
            assert fs.num_bad_epochs == ts.num_bad_epochs
            np.testing.assert_allclose(fs.get_last_lr(), ts.get_last_lr(), rtol=1e-14)
        assert fs.get_last_lr() != [0.1, 0.02]  # the lr was reduced at least once


RESUME_SPECS = [SPECS[1], SPECS[3], SPECS[8], SPECS[11], SPECS[14], SPECS[15], SPECS[9]]


@pytest.mark.parametrize("spec", RESUME_SPECS, ids=_ids)
def test_state_dict_resumes_identically(spec, tmp_path):
    """Checkpoint optimizer + scheduler after 10 steps (through sbpflow.save), restore into
    fresh objects, and the remaining lrs equal the uninterrupted run's."""
    kw = {"momentum": 0.9} if spec[0] == "OneCycleLR" else {}
    fopt, _ = _optimizers(**kw)
    sched = _sched(flow, fopt, spec)
    for _ in range(10):
        fopt.step()
        sched.step()
    path = tmp_path / "ckpt.safetensors"
    serialization.save({"optimizer": fopt.state_dict(), "scheduler": sched.state_dict()}, path)
    ckpt = serialization.load(path)
    fopt2, _ = _optimizers(**kw)
    sched2 = _sched(flow, fopt2, spec)
    fopt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    for k in range(10, STEPS):
        for opt, s in ((fopt, sched), (fopt2, sched2)):
            opt.step()
            s.step()
        assert sched2.get_last_lr() == sched.get_last_lr(), f"step {k + 1}"
        assert _momenta(fopt2) == _momenta(fopt)


def test_scheduler_state_dict_keys_match_torch():
    fopt, topt = _optimizers()
    fs = lrs.StepLR(fopt, 3)
    ts = torch.optim.lr_scheduler.StepLR(topt, 3)
    assert set(fs.state_dict()) == set(ts.state_dict())
    assert fs.state_dict()["base_lrs"] == ts.state_dict()["base_lrs"] == [0.1, 0.02]


def test_warns_when_scheduler_steps_before_optimizer():
    fopt, _ = _optimizers()
    s = lrs.StepLR(fopt, 3)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):
        s.step()
    fopt2, _ = _optimizers()
    s2 = lrs.StepLR(fopt2, 3)
    fopt2.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s2.step()


def test_resume_needs_initial_lr():
    fopt, _ = _optimizers()
    with pytest.raises(KeyError, match="initial_lr"):
        lrs.StepLR(fopt, 3, last_epoch=4)


def test_constructor_validation():
    fopt, _ = _optimizers()
    with pytest.raises(TypeError, match="is not an Optimizer"):
        lrs.StepLR(object(), 3)
    with pytest.raises(ValueError, match="total_steps OR"):
        lrs.OneCycleLR(fopt, max_lr=1.0)
    with pytest.raises(ValueError, match="pct_start"):
        lrs.OneCycleLR(fopt, max_lr=1.0, total_steps=10, pct_start=1.5)
    with pytest.raises(ValueError, match="max_lr must have the same length"):
        lrs.OneCycleLR(fopt, max_lr=[1.0, 2.0, 3.0], total_steps=10)
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        lrs.ReduceLROnPlateau(fopt, factor=1.5)
    with pytest.raises(ValueError, match="milestone"):
        lrs.SequentialLR(fopt, [lrs.StepLR(fopt, 2)], milestones=[3])
    adagrad = optim.Adagrad([flow.tensor([1.0], requires_grad=True)])
    with pytest.raises(ValueError, match="momentum or beta1"):
        lrs.OneCycleLR(adagrad, max_lr=1.0, total_steps=10)


def test_cosine_annealing_reaches_eta_min_at_t_max():
    fopt, _ = _optimizers()
    s = lrs.CosineAnnealingLR(fopt, T_max=8, eta_min=0.01)
    for _ in range(8):
        fopt.step()
        s.step()
    assert math.isclose(s.get_last_lr()[0], 0.01, rel_tol=1e-12)
