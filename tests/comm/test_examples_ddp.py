"""The digits example trains data-parallel through the launcher, to the single-rank accuracy."""

from __future__ import annotations

import json
import os

from .conftest import launcher_cmd, run_job


def _accuracy(out_dir: str) -> float:
    with open(os.path.join(out_dir, "result.json")) as f:
        return json.load(f)["test_accuracy"]


def test_digits_two_ranks_matches_one_rank(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    job1 = run_job(launcher_cmd(1, "-m", "sbpflow.examples.digits", "--epochs", "3",
                                "--out", one), timeout=240)
    assert job1.returncode == 0, job1.output
    job2 = run_job(launcher_cmd(2, "-m", "sbpflow.examples.digits", "--epochs", "3",
                                "--out", two), timeout=240)
    assert job2.returncode == 0, job2.output
    assert job2.strays == 0
    assert "2 ranks" in job2.output
    acc1, acc2 = _accuracy(one), _accuracy(two)
    assert acc1 > 0.95 and acc2 > 0.95
    assert abs(acc1 - acc2) < 0.02  # same global batch and schedule, different sample order
