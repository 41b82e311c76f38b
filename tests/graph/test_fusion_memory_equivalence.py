"""Fusion and memory planning change how a step runs, never what it computes: training with
every pass equals training with `fuse_elementwise` and `memory_plan` left out, for the MLP,
the digits CNN and the gpt example (losses and final parameters).  Each run also checks that
the passes really acted: fused ops in the Job (numba-jitted ones included) and planned
buffers."""

from __future__ import annotations

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph import passes

F = flow.nn.functional


class TrainGraph(flow.nn.Graph):
    def __init__(self, model, opt, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self.add_optimizer(opt)
        self.config._flags["fuse_jit_min_numel"] = 256  # reach the numba kernels too

    def build(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss


def _mlp():
    return flow.nn.Sequential(flow.nn.Linear(32, 64), flow.nn.Tanh(), flow.nn.Linear(64, 64),
                              flow.nn.GELU(), flow.nn.Linear(64, 10))


def _digits():
    from sbpflow.examples.digits import DigitsCNN

    return DigitsCNN()


def _gpt():
    from sbpflow.examples.gpt import TinyGPT

    return TinyGPT(block=7)


def _seq_ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _batches(kind, rng, steps=4):
    if kind == "gpt":
        from sbpflow.examples.gpt import make_batch

        return [tuple(flow.tensor(a) for a in make_batch(rng, 16, 3)) for _ in range(steps)]
    shape = (32, 32) if kind == "mlp" else (32, 1, 8, 8)
    return [(flow.tensor(rng.standard_normal(shape).astype(np.float32)),
             flow.tensor(rng.integers(0, 10, 32))) for _ in range(steps)]


FULL_ORDER = passes.ORDER
MODELS = {"mlp": (_mlp, F.cross_entropy), "digits": (_digits, F.cross_entropy),
          "gpt": (_gpt, _seq_ce)}


def _train(kind, monkeypatch, skip):
    make, loss_fn = MODELS[kind]
    monkeypatch.setattr(passes, "ORDER", tuple(n for n in FULL_ORDER if n not in skip))
    flow.manual_seed(0)
    model = make()
    opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = TrainGraph(model, opt, loss_fn)
    flow.manual_seed(1)  # dropout masks: the same stream in both runs
    losses = [g(x, y).item() for x, y in _batches(kind, np.random.default_rng(0))]
    params = [t.detach().numpy().copy() for t in model.state_dict().values()]
    return losses, params, g._last.job


@pytest.mark.parametrize("kind", list(MODELS))
def test_fusion_and_memory_planning_do_not_change_results(kind, monkeypatch):
    plain_losses, plain_params, plain_job = _train(
        kind, monkeypatch, skip=("fuse_elementwise", "memory_plan"))
    losses, params, job = _train(kind, monkeypatch, skip=())
    fused = [op for op in job.ops if op.op_type == "fused_elementwise"]
    assert fused and any(op.attrs["jit"] for op in fused), "fusion did not act"
    assert any(t.mem is not None for t in job.tensors.values()), "no buffer was planned"
    memory = job.stats["memory"]
    assert memory["block_bytes"] < memory["naive_bytes"], "no buffer was reused"
    assert not any(op.op_type == "fused_elementwise" for op in plain_job.ops)
    assert all(t.mem is None for t in plain_job.tensors.values())
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6, atol=1e-7)
    for a, b in zip(params, plain_params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
