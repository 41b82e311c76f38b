"""A failing rank ends the whole job in seconds, with a non-zero status naming the rank.

Each case runs under the launcher, under `mpiexec python -m mpi4py script.py` and under a
plain `mpiexec python script.py`, on 2 ranks; rank 1 fails while rank 0 waits in a collective
it will never complete. `strays == 0` checks that no rank was left running.
"""

import pytest

from sbpflow.distributed.launch import rank_statuses
from tests.mpijob import timeout_scale

from .conftest import MPIEXEC, launcher_cmd, mpiexec_cmd, run_job, script

# A run takes a few seconds quiet; 29 s was seen at load 8.6 on 2 cores. A hang would
# last until the 600 s collective timeout, or the launch timeout of 120 s here.
ENDS_WITHIN_S = 45 * timeout_scale()
RUNNERS = ("launcher", "mpi4py", "plain")


def _run(runner, mode, env=None, rank0_finishes=False):
    program = (script("fail_one_rank.py"), mode)
    if runner == "launcher":
        cmd = launcher_cmd(2, *program)
    elif runner == "mpi4py":
        cmd = mpiexec_cmd(2, "-m", "mpi4py", *program, extra=("-print-all-exitcodes",))
    else:
        cmd = mpiexec_cmd(2, *program, extra=("-print-all-exitcodes",))
    job = run_job(cmd, timeout=120, env=env)
    assert job.returncode != 0, job.output
    assert job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert ("rank 0: finished" in job.output) == rank0_finishes, job.output
    return job


@pytest.mark.parametrize("runner", RUNNERS)
def test_exception_on_one_rank_ends_the_job(runner):
    job = _run(runner, "raise")
    assert "rank 1: uncaught RuntimeError: boom on purpose" in job.stderr, job.output
    assert "rank 1: Traceback (most recent call last):" in job.stderr


@pytest.mark.parametrize("runner", RUNNERS)
def test_sys_exit_on_one_rank_ends_the_job(runner):
    job = _run(runner, "sys_exit")
    assert job.returncode == 3, job.output
    assert "rank 1: sys.exit(3)" in job.stderr, job.output


def _crashed_rank_named(job, runner, words):
    if runner == "launcher":
        assert f"rank 1 {words}" in job.stderr, job.output
    else:  # hydra's exit-code line lists each rank's wait status in rank order
        line = next(x for x in job.stdout.splitlines() if "Exit codes:" in x)
        return rank_statuses(line)[1]


@pytest.mark.parametrize("runner", RUNNERS)
def test_crash_on_one_rank_ends_the_job(runner):
    job = _run(runner, "os_exit")
    status = _crashed_rank_named(job, runner, "exited with status 5")
    if status is not None:
        assert status >> 8 == 5, job.output  # a wait status: exit code 5


@pytest.mark.parametrize("runner", RUNNERS)
def test_sigkill_on_one_rank_ends_the_job(runner):
    job = _run(runner, "sigkill")
    status = _crashed_rank_named(job, runner, "was killed by signal 9 (SIGKILL)")
    if status is not None:
        assert status & 0x7F == 9, job.output  # a wait status: killed by signal 9


@pytest.mark.parametrize("runner", ["launcher", "plain"])
def test_skipped_collective_is_reported_by_the_watchdog(runner):
    # Rank 1 ends its script cleanly, having skipped the all_reduce rank 0 waits in: at the
    # exit barrier it tells the others how many collectives it issued, and rank 0's watchdog
    # ends the job at once, long before the collective timeout.
    job = _run(runner, "skip", env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert "rank 1: finished" in job.stdout
    err = job.stderr
    assert ("sbpflow watchdog: rank 0: all_reduce #2 on world can never complete: rank 1 has "
            "ended (its script ended, status 0) after issuing 1 collective on world") in err, (
        job.output)
    assert "has waited" not in err, job.output


def test_diverged_ranks_are_reported_on_four_ranks():
    cmd = mpiexec_cmd(4, script("fail_one_rank.py"), "diverge")
    # The watchdog's report: without the divergence check, which would catch this first.
    job = run_job(cmd, timeout=120, env={"SBPFLOW_COLLECTIVE_TIMEOUT": "1",
                                        "SBPFLOW_CHECK_DIVERGENCE": "0"})
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    err = job.stderr
    assert "sbpflow watchdog: rank" in err, job.output
    for r in (0, 2, 3):
        assert f"rank {r}: waiting in all_reduce #2 on world" in err, job.output
    assert "rank 1: waiting in broadcast #2 on world" in err, job.output


def test_failing_test_under_pytest_ends_the_job():
    cmd = mpiexec_cmd(2, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      script("mpi_pytest_case.py"))
    job = run_job(cmd, timeout=120)
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "rank 1: test " in job.stderr and "failed (call); ending the job" in job.stderr, (
        job.output)
    assert "rank 1 fails on purpose" in job.stderr


def test_mpiexec_is_the_wheels():
    import os
    import sys

    assert os.path.dirname(MPIEXEC) == os.path.dirname(sys.executable)
    assert os.access(MPIEXEC, os.X_OK)


def test_exit_hooks_run_before_the_exit_barrier():
    job = run_job(mpiexec_cmd(2, script("fail_one_rank.py"), "exit_hook"), timeout=120)
    assert job.returncode == 0, job.output
    assert job.stdout.count("exit hook saw 3") == 2, job.output  # 1 + 2 over both ranks


def test_failing_exit_hook_ends_the_job():
    job = _run("plain", "exit_hook_raises", rank0_finishes=True)  # then waits to exit
    assert "rank 1: uncaught RuntimeError: exit hook failed on purpose" in job.stderr, job.output
