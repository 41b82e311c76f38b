"""Heartbeats (sbpflow/comm/heartbeat.py): a rank that went silent ends the job, named.

The multi-machine faults (link cut, frozen machine) are in test_multi_machine.py; this one
needs no namespaces: a rank frozen by SIGSTOP on this machine is just as silent.
"""

import socket

import pytest

from sbpflow.comm import heartbeat

from .conftest import launcher_cmd, run_job, script


def test_frozen_rank_ends_the_job_named():
    job = run_job(launcher_cmd(2, script("freeze_rank.py"), "freeze"), timeout=90,
                  env={"SBPFLOW_HEARTBEAT_TIMEOUT": "3"})
    assert job.returncode != 0, job.output
    assert "rank 0: finished" not in job.stdout and "rank 1: first all_reduce done" in (
        job.stdout), job.output
    host = socket.gethostname()
    assert (f"sbpflow heartbeat: rank 0 (host {host}) has heard nothing from rank 1 (host "
            f"{host}) for 3.") in job.stderr, job.output
    assert "heartbeat timeout of 3 s (SBPFLOW_HEARTBEAT_TIMEOUT)" in job.stderr
    assert job.strays == 0


def test_rank_waiting_at_the_end_is_not_lost():
    # Rank 0 ends 4 s before rank 1, twice the heartbeat timeout, and waits at the exit
    # barrier, beating; then both say goodbye: status 0, no warning from MPI about
    # unreceived messages.
    job = run_job(launcher_cmd(2, script("freeze_rank.py"), "late"), timeout=90,
                  env={"SBPFLOW_HEARTBEAT_TIMEOUT": "2"})
    assert job.returncode == 0, job.output
    assert job.stdout.count("finished") == 2, job.output
    assert "heartbeat" not in job.output and "not matched" not in job.output, job.output


@pytest.mark.parametrize("raw, expected", [(None, heartbeat.DEFAULT_TIMEOUT_S),
                                           ("", heartbeat.DEFAULT_TIMEOUT_S),
                                           ("7.5", 7.5), ("0", 0.0)])
def test_timeout_from_the_environment(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(heartbeat.TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(heartbeat.TIMEOUT_ENV, raw)
    assert heartbeat.heartbeat_timeout() == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_bad_timeout_is_refused_with_its_name(monkeypatch, raw):
    monkeypatch.setenv(heartbeat.TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=f"{heartbeat.TIMEOUT_ENV} must be"):
        heartbeat.heartbeat_timeout()


def test_host_is_the_launchers_name(monkeypatch):
    monkeypatch.setenv("PMI_HOSTNAME", "node-b")
    assert heartbeat.host_name() == "node-b"
    monkeypatch.delenv("PMI_HOSTNAME")
    assert heartbeat.host_name() == socket.gethostname()
