"""Multi-rank test plumbing: launch MPI jobs with a timeout, and abort on a failing rank.

`run_job` starts a job in a subprocess with a hard timeout: on expiry it sends SIGTERM
(mpiexec and the launcher forward it to every rank), then SIGKILL, and always kills any
process of the job still alive afterwards (found by a marker in its environment: hydra puts
each rank in a session of its own, so a process group kill would miss them). CI never hangs.
The job is killed the same way when the test is interrupted during it (pytest-timeout's
per-test limit, Ctrl-C).

Timeouts: a launch's timeout has 4x headroom over a quiet run of the README's
`pytest -n 2` on the 2-core reference machine (the other worker takes half the cores), so a
busy machine (load average 6 to 7 on 2 cores) slows a job down without failing it. On a
slower machine, `SBPFLOW_TEST_TIMEOUT_SCALE=2` multiplies every launch timeout (raise
pytest's own per-test `--timeout`, 600 s in pyproject.toml, by as much). A job that times
out says how long it ran and the load average at its start and end.

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
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")  # the mpich wheel's, next to python
_MARKER = "SBPFLOW_TEST_JOB"
_LAUNCHER_VARS = ("PMI_", "MPI_LOCAL", "OMPI_", "HYDRA_", "MV2_", "PMIX_")
TIMEOUT_SCALE = "SBPFLOW_TEST_TIMEOUT_SCALE"
# pytest-timeout's per-test limit as configured: every launch of a test must end within it.
PYTEST_TIMEOUT_S = float(tomllib.loads((REPO / "pyproject.toml").read_text())
                         ["tool"]["pytest"]["ini_options"]["timeout"])


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


def timeout_scale() -> float:
    """The factor SBPFLOW_TEST_TIMEOUT_SCALE sets for every launch timeout (default 1)."""
    raw = os.environ.get(TIMEOUT_SCALE, "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale > 0 or scale == float("inf"):
        raise ValueError(f"{TIMEOUT_SCALE}={raw!r}: expected a positive number")
    return scale


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _stop(proc: subprocess.Popen, tag: str) -> tuple[str, str]:
    """End a job still running (SIGTERM, then SIGKILL) and every process of it."""
    proc.terminate()
    try:
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    _kill_marked(tag, grace=0)
    return out, err


def run_job(cmd: list[str], timeout: float, env: dict | None = None) -> Job:
    """Run cmd to its end, at most `timeout` seconds (times SBPFLOW_TEST_TIMEOUT_SCALE)."""
    limit = timeout * timeout_scale()
    tag = uuid.uuid4().hex
    start, load = time.monotonic(), _loadavg()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=job_env({**(env or {}), _MARKER: tag}),
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        elapsed = time.monotonic() - start
        out, err = _stop(proc, tag)
        pytest.fail(f"job timed out after {elapsed:.0f} s (timeout {limit:g} s: {timeout:g} s x "
                    f"{TIMEOUT_SCALE} {timeout_scale():g}; load average {load} at the start, "
                    f"{_loadavg()} at the end): {' '.join(cmd)}\n--- stdout\n{out}"
                    f"\n--- stderr\n{err}")
    except BaseException:  # the test was interrupted: leave nothing of the job running
        _stop(proc, tag)
        raise
    seconds = time.monotonic() - start
    return Job(proc.returncode, out, err, seconds, _kill_marked(tag))


def mpiexec_cmd(n: int, *program: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [MPIEXEC, *extra, "-n", str(n), sys.executable, *program]


def launcher_cmd(n: int, *program: str, hostfile: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "sbpflow.distributed.launch", "--nproc-per-node", str(n)]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    return cmd + list(program)
