"""Launch helpers for the multi-rank tests of this folder (see tests/mpijob.py)."""

from pathlib import Path

from tests.mpijob import (  # noqa: F401 - re-exported for the tests here
    MPIEXEC,
    REPO,
    Job,
    job_env,
    launcher_cmd,
    mpiexec_cmd,
    run_job,
)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def script(name: str) -> str:
    return str(SCRIPTS / name)
