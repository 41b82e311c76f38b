"""Training with global tensors: the same numbers as on one device, on 1, 2 and 4 ranks.

The oracle is always the single-device program on local tensors (no placement, no SBP, no
boxing), run from the same initial weights on the same data: with global tensors the
parallelism is in the annotations only, so the logical losses and weights must not change.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.mpijob import launcher_cmd, mpiexec_cmd, run_job

CHECK = str(Path(__file__).resolve().parent / "nn" / "global_train_check.py")


def _ok(job) -> None:
    assert job.returncode == 0, job.output
    assert job.strays == 0, job.output


@pytest.mark.parametrize("n", [1, 2, 4])
def test_training_with_global_tensors_equals_single_device_training(n):
    # data parallel (B params, S(0) batch), tensor parallel (S(0)/S(1) Linear weights), and on
    # 4 ranks both on a 2x2 grid; SGD with momentum, Adam, AdamW; the oracle runs in-process.
    cmd = [sys.executable, CHECK] if n == 1 else mpiexec_cmd(n, "-m", "mpi4py", CHECK)
    job = run_job(cmd, timeout=90)
    _ok(job)
    passed = re.findall(r"rank (\d+): global training check passed \((\d+) configurations\)",
                        job.stdout)
    assert sorted(int(r) for r, _ in passed) == list(range(n)), job.output
    assert {int(c) for _, c in passed} == {6 + (n > 1) + 2 * (n == 4)}, job.output


def _tp_losses(output: str) -> np.ndarray:
    """The example's table: step, loss with global tensors, loss on one device."""
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)$", output, re.M)
    return np.array([[float(a), float(b)] for _, a, b in rows])


def test_tensor_parallel_example_two_ranks_matches_single_device():
    from sbpflow.examples import tensor_parallel as tp

    job = run_job(launcher_cmd(2, "-m", "sbpflow.examples.tensor_parallel"), timeout=90)
    _ok(job)
    out = job.stdout
    # The Megatron layout, as the example prints it on rank 0 (piece: rank 0's local shape).
    for name, sbp, piece in [("w1", "S(1)", "[64, 128]"), ("h = x @ w1 + b1", "S(1)",
                                                             "[32, 128]"),
                             ("a = gelu(h)", "S(1)", "[32, 128]"), ("w2", "S(0)", "[128, 64]"),
                             ("a @ w2", "P", "[32, 64]"), ("y", "B", "[32, 64]"),
                             ("w1.grad", "S(1)", "[64, 128]"), ("w2.grad", "S(0)", "[128, 64]")]:
        assert re.search(rf"^\s+{re.escape(name)}\s+\[[\d, ]+\]\s+sbp {re.escape(sbp)}\s+"
                         rf"piece {re.escape(piece)}$", out, re.M), (name, out)
    assert "P -> B: all_reduce over ranks [0, 1]" in out
    assert "MATCH" in out and "MISMATCH" not in out
    # An oracle of our own: the single-device model trained here, in this process.
    x, y = tp.make_data(0, 32)
    want = tp.train(tp.ParallelMLP(0), tp.flow.tensor(x), tp.flow.tensor(y), 8, 0.05)
    table = _tp_losses(out)
    assert table.shape == (8, 2), out
    np.testing.assert_allclose(table[:, 0], want, rtol=1e-5, atol=2e-8)
    assert want[-1] < want[0]


def test_tensor_parallel_example_one_rank():
    from sbpflow.examples import tensor_parallel as tp

    got, want = tp.main(["--steps", "4"])  # placement [0]: P -> B is a local copy
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def _gpt_losses(output: str) -> np.ndarray:
    return np.array([float(v) for v in re.findall(r"^step\s+\d+\s+loss ([\d.]+)", output,
                                                  re.M)])


def test_gpt_global_two_ranks_has_the_single_device_loss_curve(capsys):
    # --global on 2 ranks is the single-device program: parameters B, the same logical batch
    # S(0), gradients all-reduced by boxing (no DDP). So its loss at every step must be the
    # plain single-device run's (same seed, same batches) up to float32 rounding; a broken
    # all-reduce or a wrong split of the batch changes the losses from step 1 or 2 on.
    from sbpflow.examples import gpt

    args = ["--steps", "6", "--length", "3", "--batch-size", "16", "--log-every", "1"]
    gpt.main(args)
    want = _gpt_losses(capsys.readouterr().out)
    job = run_job(launcher_cmd(2, "-m", "sbpflow.examples.gpt", *args, "--global"),
                  timeout=120)
    _ok(job)
    got = _gpt_losses(job.stdout)
    assert len(want) == len(got) == 6, job.output
    assert want[-1] < 0.8 * want[0]  # it trains
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-5)  # 6 printed decimals
    assert "2 ranks, global tensors" in job.stdout
