"""Every collective on 1, 2 and 4 ranks against NumPy (the checks live in scripts/)."""

import re
import sys

import pytest

from .conftest import mpiexec_cmd, run_job, script


def _passed(job, n, pattern):
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(rf"rank (\d+): {pattern}", job.stdout))
    assert ranks == list(range(n)), job.output
    assert job.strays == 0


@pytest.mark.parametrize("n", [2, 4])
def test_array_collectives_match_numpy(n):
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", script("check_collectives.py")), timeout=90)
    _passed(job, n, r"\d+ checks passed")


def test_array_collectives_world_of_one_match_numpy():
    job = run_job([sys.executable, script("check_collectives.py")], timeout=60)
    _passed(job, 1, r"\d+ checks passed")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_tensor_api_matches_numpy(n):
    cmd = ([sys.executable, script("check_tensor_api.py")] if n == 1 else
           mpiexec_cmd(n, "-m", "mpi4py", script("check_tensor_api.py")))
    job = run_job(cmd, timeout=90)
    _passed(job, n, "tensor API ok")
