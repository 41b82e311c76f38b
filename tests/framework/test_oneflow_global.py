"""OneFlow's global-tensor semantics (issue 14): flow.sbp as functions and a type, the legacy
global constructor, `.data =`, `.device`, random initialisers on global parameters,
Parameter.numpy, Module.to_local, flow.to_global/to_local, local_to_global/global_to_global,
env.all_device_placement and flow.utils.global_view.

The tests live in oneflow_global_check.py, written for any number of ranks: imported here
they run on one rank, and the jobs below run them under `mpiexec -n 2` and `-n 4`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.framework.oneflow_global_check import *  # noqa: F403 (the tests, on one rank)
from tests.mpijob import mpiexec_cmd, run_job

CHECK = str(Path(__file__).resolve().parent / "oneflow_global_check.py")


@pytest.mark.parametrize("n", [2, 4])
def test_oneflow_global_semantics_under_mpi(n):
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", CHECK), timeout=300)
    assert job.returncode == 0, job.output
    counts = re.findall(r"(\d+) passed in", job.stdout)
    assert len(counts) == n and len(set(counts)) == 1, job.output
    assert int(counts[0]) >= 95, job.output
    assert not re.search(r"\b(failed|errors?|skipped|xpassed|xfailed)\b", job.stdout), \
        job.output
    assert job.strays == 0
