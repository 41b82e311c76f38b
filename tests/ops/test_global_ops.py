"""Every registered op x every input SBP combination on 2 ranks equals the single-device op.

The checks live in tests/ops/global_ops_check.py, which runs every case of its shard in one
`mpiexec -n 2` job (no pytest per case: a case is a few milliseconds of work, pytest's per
test overhead would dominate). tests/ops/global_ops_shards.py deals the cases to shards of
balanced estimated work (a heavy sample's cases may span shards); the number of shards grows
with the registry and each job's timeout follows its own estimated work, so no job's work
outgrows its timeout on a busy machine. pytest-xdist runs the jobs side by side; each job
prints every failing case with its max error and a summary line, and exits non-zero when
any case failed.
"""

from __future__ import annotations

import re

import pytest

from sbpflow.ops import registry
from tests.mpijob import PYTEST_TIMEOUT_S, mpiexec_cmd, run_job
from tests.ops import global_ops_shards

CHECK = "tests/ops/global_ops_check.py"
SHARDS = global_ops_shards.shard_count(registry.list_ops())
GROUPS = global_ops_shards.shards(registry.list_ops(), SHARDS)
SUMMARY = re.compile(
    r"global ops shard (\d+)/(\d+): (\d+) ops, (\d+) samples, (\d+) SBP combinations "
    r"\((\d+) factory outputs\), (\d+) gradients checked, (\d+) failures, .*; the shards "
    r"cover (\d+) ops"
)


def _report(job) -> str:
    """Rank 0's list of every failing case (with max errors), then the end of the output."""
    start = job.stdout.find("FAILED rank ")
    failures = job.stdout[start:start + 100_000] if start >= 0 else "(no failure list)"
    return f"exit status {job.returncode}\n{failures}\n--- end of output\n{job.output[-8000:]}"


def test_shards_fit_their_timeouts():
    """Every case is in one shard, and each job's timeout ends well within pytest's own
    per-test limit (which would otherwise end the test first, with less to say)."""
    global_ops_shards.check_partition(registry.list_ops(), GROUPS)
    longest = max(global_ops_shards.timeout_s(g) for g in GROUPS)
    assert longest <= PYTEST_TIMEOUT_S * 0.75, (longest, PYTEST_TIMEOUT_S)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_global_ops_match_single_device(shard):
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", CHECK, "--shard", str(shard), "--of",
                              str(SHARDS)),
                  timeout=global_ops_shards.timeout_s(GROUPS[shard]),
                  env={"SBPFLOW_COLLECTIVE_TIMEOUT": "60"})
    found = SUMMARY.search(job.stdout)
    assert job.returncode == 0 and found, f"shard {shard}: {_report(job)}"
    assert int(found[8]) == 0, _report(job)
    # Every shard holds some ops with real input-SBP products (not a vacuous pass).
    assert int(found[3]) > 0 and int(found[5]) > int(found[4]), found[0]
    assert int(found[9]) == len(registry.list_ops()), found[0]  # no op left out
    assert job.strays == 0
    print(found[0])
