"""Every registered op's samples inside an nn.Graph on 2 ranks equal the op in eager global
mode, for each input SBP: the graph twin of tests/ops/test_global_ops.py.

The checks live in tests/ops/graph_global_ops_check.py (which cases run, forward and
gradients, and why not the full product, are described there); tests/ops/global_ops_shards.py
deals whole samples to shards of balanced estimated work (8 jobs of about 30 s quiet: 18,099
input-SBP combinations forward and 5,074 gradients over every registered op), each run in
one `mpiexec -n 2` job, side by side under pytest-xdist. Each job prints every failing case
and a summary line, and exits non-zero when any case failed; the test also asserts that every
registered op is run or excluded with a reason (GRAPH_EXCLUDED, empty) and that the job left
no process behind.
"""

from __future__ import annotations

import re

import pytest

from sbpflow.ops import registry
from tests.mpijob import PYTEST_TIMEOUT_S, mpiexec_cmd, run_job
from tests.ops import global_ops_shards as shards
from tests.ops import harness as H

CHECK = "tests/ops/graph_global_ops_check.py"
OPS = registry.list_ops()
SHARDS = shards.graph_shard_count(OPS)
GROUPS = shards.graph_shards(OPS, SHARDS)
EXCLUDED = shards.GRAPH_EXCLUDED
SUMMARY = re.compile(
    r"graph global ops shard (\d+)/(\d+): (\d+) ops, (\d+) samples, (\d+) SBP combinations "
    r"\((\d+) factory outputs\), (\d+) gradients checked, (\d+) graphs .*?, (\d+) failures, "
    r".*; the shards cover (\d+) ops, (\d+) excluded"
)
# The eager ops here are only the oracle (global_ops_check runs them with the full check);
# comparing every eager op's metadata across ranks would triple their cost. The sampled
# divergence check stays on.
ENV = {"SBPFLOW_COLLECTIVE_TIMEOUT": "60", "SBPFLOW_CHECK_GLOBAL": "0"}


def _report(job) -> str:
    start = job.stdout.find("FAILED rank ")
    failures = job.stdout[start:start + 100_000] if start >= 0 else "(no failure list)"
    return f"exit status {job.returncode}\n{failures}\n--- end of output\n{job.output[-8000:]}"


def test_every_op_is_run_or_excluded_with_a_reason():
    """Each sample is in exactly one shard, every op is run or listed in EXCLUDED (with a
    reason), and each job's timeout ends well within pytest's own per-test limit."""
    run = [(w.name, w.index) for g in GROUPS for w in g]
    assert len(run) == len(set(run))
    want = set()
    for name in OPS:
        if name not in EXCLUDED:
            n = len(H.op_samples(name))
            want |= {(name, index) for index in (range(n) if n else [None])}
    assert set(run) == want
    assert set(EXCLUDED) <= set(OPS), sorted(set(EXCLUDED) - set(OPS))
    assert all(isinstance(why, str) and why for why in EXCLUDED.values())
    longest = max(shards.graph_timeout_s(g) for g in GROUPS)
    assert longest <= PYTEST_TIMEOUT_S * 0.75, (longest, PYTEST_TIMEOUT_S)


@pytest.mark.parametrize("shard", range(SHARDS))
def test_graph_global_ops_match_eager_global(shard):
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", CHECK, "--shard", str(shard), "--of",
                              str(SHARDS)),
                  timeout=shards.graph_timeout_s(GROUPS[shard]), env=ENV)
    found = SUMMARY.search(job.stdout)
    assert job.returncode == 0 and found, f"shard {shard}: {_report(job)}"
    assert int(found[9]) == 0, _report(job)
    # Every shard runs graphs over real input-SBP products (not a vacuous pass).
    assert int(found[3]) > 0 and int(found[5]) > int(found[4]) and int(found[8]) > 0, found[0]
    # every registered op is run by some shard or excluded with a reason
    assert int(found[10]) + int(found[11]) == len(OPS), found[0]
    assert job.strays == 0
    print(found[0])
