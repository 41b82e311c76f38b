"""Multi-rank test plumbing: launch MPI jobs with a timeout, and abort on a failing rank.

`run_job` starts a job in a subprocess with a hard timeout: on expiry it sends SIGTERM
(mpiexec and the launcher forward it to every rank), then SIGKILL, and always kills any
process of the job still alive afterwards (found by a marker in its environment: hydra puts
each rank in a session of its own, so a process group kill would miss them). CI never hangs.

Under `mpiexec -n N python -m pytest ...`, a test that fails on one rank would leave the
others blocked in their next collective: the `pytest_runtest_makereport` hook in
tests/conftest.py aborts the whole job on the first failing test of any rank, naming the rank
and the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")  # the mpich wheel's, next to python
_MARKER = "SBPFLOW_TEST_JOB"
_LAUNCHER_VARS = ("PMI_", "MPI_LOCAL", "OMPI_", "HYDRA_", "MV2_", "PMIX_")


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    strays: int  # processes of the job still alive after it ended (then killed)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def job_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Several ranks share 2 cores: one BLAS thread each.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # Global ops compare their metadata across ranks before running (a diverging rank fails
    # with both sides named instead of deadlocking); jobs may turn it off with "0".
    env.setdefault("SBPFLOW_CHECK_GLOBAL", "1")
    env.update(extra or {})
    return env


def _marked(tag: str) -> list[int]:
    pids = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            environ = (pid_dir / "environ").read_bytes()
        except OSError:
            continue  # gone, or a zombie (its environment is no longer readable)
        if f"{_MARKER}={tag}".encode() in environ.split(b"\0"):
            pids.append(int(pid_dir.name))
    return pids


def _kill_marked(tag: str, grace: float = 3.0) -> int:
    """Kill the job's processes still alive `grace` seconds from now; return how many.

    mpiexec may return while its SIGKILLs to the other ranks are still landing, so a
    process seen at once is not yet a stray.
    """
    deadline = time.monotonic() + grace
    while _marked(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    strays = _marked(tag)
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(strays)


def run_job(cmd: list[str], timeout: float, env: dict | None = None) -> Job:
    tag = uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=job_env({**(env or {}), _MARKER: tag}),
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        _kill_marked(tag, grace=0)
        pytest.fail(f"job timed out after {timeout} s: {' '.join(cmd)}\n--- stdout\n{out}"
                    f"\n--- stderr\n{err}")
    seconds = time.monotonic() - start
    return Job(proc.returncode, out, err, seconds, _kill_marked(tag))


def mpiexec_cmd(n: int, *program: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [MPIEXEC, *extra, "-n", str(n), sys.executable, *program]


def launcher_cmd(n: int, *program: str, hostfile: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "sbpflow.distributed.launch", "--nproc-per-node", str(n)]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    return cmd + list(program)
