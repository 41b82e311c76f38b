"""Sharding over ranks: ids shuffled to their owners by all-to-all, gradients back; the
sharded training equals the dense single-process training (scripts/sharded_check.py)."""

import re
import sys

import pytest

from .conftest import mpiexec_cmd, run_job, script


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sharded_equals_single_rank(n):
    cmd = ([sys.executable, script("sharded_check.py")] if n == 1 else
           mpiexec_cmd(n, "-m", "mpi4py", script("sharded_check.py")))
    job = run_job(cmd, timeout=120 + 90 * n)  # 2 shared cores: 4 ranks start slowly
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): sharded ok", job.stdout))
    assert ranks == list(range(n)), job.output
    assert job.strays == 0
