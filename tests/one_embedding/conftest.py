"""Helpers shared by the one-embedding tests (multi-rank launch: see tests/mpijob.py)."""

from pathlib import Path

from tests.mpijob import mpiexec_cmd, run_job  # noqa: F401 - re-exported

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def script(name: str) -> str:
    return str(SCRIPTS / name)
