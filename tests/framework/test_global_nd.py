"""Ops and training on a 2x2 hierarchy, under `mpiexec -n 4` (see global_nd_check.py)."""

from pathlib import Path

from tests.mpijob import mpiexec_cmd, run_job

CHECK = str(Path(__file__).resolve().parent / "global_nd_check.py")


def test_ops_and_training_on_a_2x2_hierarchy_match_one_device():
    job = run_job(mpiexec_cmd(4, "-m", "mpi4py", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              CHECK), timeout=240)
    assert job.returncode == 0, job.output
    assert " passed" in job.stdout and "failed" not in job.stdout, job.output
