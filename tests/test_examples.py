"""The examples train for real, and one script runs unchanged on torch and on sbpflow."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

import sbpflow as flow


def _train(lib, init_state, x, y, steps=25):
    """One training script; `lib` is torch or sbpflow. Returns the loss curve."""
    nn, F = lib.nn, lib.nn.functional
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 4, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 10),
    )
    model.load_state_dict({k: lib.tensor(v) for k, v in init_state.items()})
    opt = lib.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = lib.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    loader = lib.utils.data.DataLoader(
        lib.utils.data.TensorDataset(lib.tensor(x), lib.tensor(y)), batch_size=16)
    losses = []
    it = iter(loader)
    for _ in range(steps):
        try:
            xb, yb = next(it)
        except StopIteration:
            it = iter(loader)
            xb, yb = next(it)
        loss = F.cross_entropy(model(xb), yb, label_smoothing=0.05)
        opt.zero_grad()
        loss.backward()
        lib.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return np.array(losses)


def test_same_script_same_loss_curve_as_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    torch.manual_seed(0)
    ref_model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.GELU(),
        torch.nn.LayerNorm(32), torch.nn.Linear(32, 10))
    init = {k: v.detach().numpy().copy() for k, v in ref_model.state_dict().items()}
    ours = _train(flow, init, x, y)
    theirs = _train(torch, init, x, y)
    assert theirs[-1] < theirs[0] * 0.7  # the script really trains
    np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def test_digits_example_trains_saves_and_resumes(tmp_path):
    from sbpflow.examples import digits

    out = str(tmp_path / "digits")
    acc = digits.main(["--epochs", "2", "--out", out])
    assert acc > 0.9
    assert os.path.getsize(os.path.join(out, "curves.png")) > 1000
    state = flow.load(os.path.join(out, "checkpoint.safetensors"))
    assert state["epoch"] == 2 and len(state["history"]["test_acc"]) == 2
    acc2 = digits.main(["--epochs", "1", "--out", out, "--resume"])
    state = flow.load(os.path.join(out, "checkpoint.safetensors"))
    assert state["epoch"] == 3 and len(state["history"]["test_acc"]) == 3
    assert acc2 > 0.9
    with open(os.path.join(out, "result.json")) as f:
        assert json.load(f)["epochs"] == 3


def test_gpt_example_learns():
    from sbpflow.examples import gpt

    flow.manual_seed(0)
    rng = np.random.default_rng(0)
    model = gpt.TinyGPT(block=9, d_model=32, n_head=2, n_layer=1)
    opt = flow.optim.Adam(model.parameters(), lr=3e-3)
    first = last = None
    for _ in range(40):
        x, y = gpt.make_batch(rng, 32, 4)
        logits = model(flow.tensor(x))
        loss = flow.nn.functional.cross_entropy(logits.reshape(-1, gpt.VOCAB),
                                                flow.tensor(y).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    assert last < 0.6 * first
    acc = gpt.sort_accuracy(model, np.random.default_rng(1), 4, n=32)
    assert 0.0 <= acc <= 1.0


def _digits_losses(out, *flags):
    from sbpflow.examples import digits

    acc = digits.main(["--epochs", "1", "--batch-size", "128", "--out", out, *flags])
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    assert result["graph"] == ("--graph" in flags)
    return acc, np.array(result["losses"])


def test_digits_graph_mode_trains_and_resumes_like_eager(tmp_path):
    # One epoch of 12 steps (the last batch is smaller: the training graph compiles a second
    # plan), then --resume from the checkpoint for another; eager mode is the oracle.
    eager, graph = str(tmp_path / "eager"), str(tmp_path / "graph")
    acc_e, loss_e = _digits_losses(eager)
    acc_g, loss_g = _digits_losses(graph, "--graph")
    assert len(loss_g) == len(loss_e) == 12
    np.testing.assert_allclose(loss_g, loss_e, rtol=1e-5, atol=1e-6)
    assert abs(acc_g - acc_e) <= 1 / 360  # at most one of the 360 test digits differs
    acc_e, loss_e = _digits_losses(eager, "--resume")
    acc_g, loss_g = _digits_losses(graph, "--resume", "--graph")
    np.testing.assert_allclose(loss_g, loss_e, rtol=1e-5, atol=1e-6)
    assert loss_g[-1] < 0.5 and acc_g > 0.9 and abs(acc_g - acc_e) <= 1 / 360
    assert flow.load(os.path.join(graph, "checkpoint.safetensors"))["epoch"] == 2


def _gpt_losses(capsys, *flags):
    from sbpflow.examples import gpt

    acc = gpt.main(["--steps", "8", "--length", "4", "--batch-size", "16", "--log-every", "1",
                    *flags])
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    losses = [float(ln[3]) for ln in lines if ln and ln[0] == "step"]
    assert len(losses) == 8
    return acc, np.array(losses)


def test_gpt_graph_mode_gives_the_eager_losses(capsys):
    # Clipping (the group's clip_grad_max_norm) and the cosine schedule (lr_sch) in the graph.
    acc_e, eager = _gpt_losses(capsys)
    acc_g, graph = _gpt_losses(capsys, "--graph")
    assert eager[-1] < eager[0]
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=2e-6)
    assert abs(acc_g - acc_e) <= 1 / 256  # generation is eager: same weights up to rounding


def test_gpt_graph_over_global_tensors_gives_the_eager_global_losses(capsys):
    # One rank: the graph traced over the global model (placement [0]) and eager global mode
    # (more ranks: tests/test_examples_graph_global.py).
    acc_e, eager = _gpt_losses(capsys, "--global")
    acc_g, graph = _gpt_losses(capsys, "--graph", "--global")
    np.testing.assert_allclose(graph, eager, rtol=1e-5, atol=2e-6)
    assert abs(acc_g - acc_e) <= 1 / 256
