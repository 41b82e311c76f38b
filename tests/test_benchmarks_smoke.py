"""Every benchmark in benchmarks/ runs to the end and prints its results (smoke runs).

Each script found in benchmarks/ (so a new one is covered without being listed) runs in a
subprocess with `--smoke` (benchmarks/_common.py: its smallest settings), launched as its
docstring says: the multi-rank ones start themselves under the project's mpiexec, and the
scripts with more than one documented way to run (another launch, another mode) run each way.
A run passes when it exits 0, leaves no process behind and printed its result rows: the last
row of each table, or for a benchmark not listed in RESULTS, at least one line with a number.
Timings are not checked: a smoke run measures nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.mpijob import mpiexec_cmd, run_job

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TIMEOUT_S = 400  # a smoke run takes 5-60 s on a loaded 2-core machine
N = r"[\d.]+"  # a number as the tables print it

# Extra documented runs: script -> (id, arguments after the script, or None for the mpiexec
# launch `mpiexec -n 2 python -m mpi4py <script>`).
EXTRA_RUNS = {
    "global_overhead.py": [("mpiexec -n 2", None)],
    "graph_global.py": [("mpiexec -n 2", None)],
    "one_embedding.py": [("--ranks 2", ["--ranks", "2"]),
                         ("large table", ["--cache-mb", "0.1", "--graph"])],
}

# Rows each run must print (regular expressions, one line each): the last of each table.
RESULTS = {
    "boxing.py": [rf"\| \[0\]->\[1\] B \| 64 KB \| \w+ \| Send/Recv \| {N} \| {N} \| {N} \| "
                  rf"{N} \|"],
    "collectives.py": [rf"\| flow\.comm\.all_reduce\(t\) \| 4 KB \| {N} \| {N} \|",
                       rf"\| broadcast \| {N} \| {N} \| [+-]{N} \|"],
    "compile_time.py": [rf" +4 +\d+ +\d+ +\d+ +{N} +{N}", r"marginal cost \d+\.\.\d+ traced ops"],
    "ddp.py": [rf"\| sbpflow DDP, 2 ranks, bucket_cap_mb=25 \| 2 \| {N} \| {N} \|",
               rf"\| sbpflow, 2 ranks, no overlap \(no_sync \+ all_reduce per grad\) \| 2 \| "
               rf"{N} \| {N} \|",
               rf"\| torch DDP \(gloo\), 2 ranks, bucket 25 MB \| 2 \| {N} \| {N} \|"],
    "divergence_check.py": [rf"flow\.comm\.all_reduce\(t\) 4 KB +{N}( +{N}){{9}}",
                            rf"all_reduce 8 B on COMM_SELF +{N}( +{N}){{9}}"],
    "eager_ops.py": [rf"chain 512 x8 +{N} +{N} +{N} +{N} +{N}x +{N}x +{N}x"],
    "eager_profile.py": [rf"MLP train step +{N} +{N}( +{N}){{10}}"],
    "fusion.py": [rf"bwd3 +\(64, 256\) +float32 +{N} +{N} +{N} +{N} +{N}"],
    "global_overhead.py": [rf"add 2x2, check on +S\(0\)\+S\(0\) +{N} +{N} +{N}x"],
    "global_overhead.py mpiexec -n 2": [
        r"threads: 1 per rank; ranks: 2;",
        rf"add 2x2, check on +S\(0\)\+S\(0\) +{N} +{N} +{N}x"],
    "graph_global.py": [r"2 ranks on \d+ cores; 1 BLAS/OpenMP thread\(s\) per rank",
                        rf"\| dp2 \| .* \| {N} \| {N} \|",
                        rf"\| width \d+ \| {N}x \| {N}x \| {N}x \|",
                        rf"\| TP \| \d+ \| \d+ \| \d+ \| \d+ \|( -?{N} \|){{8}}$"],
    "graph_global.py mpiexec -n 2": [
        r"2 ranks on \d+ cores; 1 BLAS/OpenMP thread\(s\) per rank",
        rf"\| dp2 \| .* \| {N} \| {N} \|",
        rf"\| TP \| \d+ \| \d+ \| \d+ \| \d+ \|( -?{N} \|){{8}}$"],
    "layers.py": [rf"MHA 16x32x128 h4 +{N} +{N} +{N}x +{N} +{N} +- +{N}x"],
    "one_embedding.py": [r"  sbpflow nn\.Embedding dense \+ SGD +[\d,]+ ids/s",
                         rf"  cache +5% of the table: hit rate +{N}% +[\d,]+ ids/s"],
    "one_embedding.py --ranks 2": [r"2 ranks, 10000 keys, dim 16, batch 256 ids per rank: "
                                   r"[\d,]+ ids/s in all"],
    "one_embedding.py large table": [r"  training \(nn\.Graph\): 2 steps, [\d,]+ ids/s",
                                     rf"  peak RSS \(VmHWM\) {N} GiB"],
    "optim_step.py": [rf"Rprop +\d+ +\d+ +{N}x +\d+ +\d+ +{N}x"],
    "train_step.py": [rf"small GPT +{N} +{N} +{N} +{N} +- +- +{N}x",
                      rf"small GPT +\d+ +\d+ +{N}x +{N} +-"],
}


def _runs():
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name.startswith("_"):
            continue  # shared helpers
        yield pytest.param(path.name, [], id=path.name)
        for label, extra in EXTRA_RUNS.get(path.name, []):
            yield pytest.param(path.name, extra, id=f"{path.name} {label}")


def test_every_benchmark_is_run():
    # The glob sees the benchmarks (a wrong folder would make the test below vacuous), and the
    # expected rows name only runs that exist.
    ids = {p.id for p in _runs()}
    assert {"ddp.py", "train_step.py", "eager_ops.py", "divergence_check.py"} <= ids
    assert set(RESULTS) <= ids, set(RESULTS) - ids


@pytest.mark.parametrize("name, extra", _runs())
def test_benchmark_runs_to_the_end(name, extra, request):
    script = str(BENCHMARKS / name)
    if extra is None:  # the documented mpiexec launch; the switch then travels as the variable
        cmd = mpiexec_cmd(2, "-m", "mpi4py", script)
        env = {"SBPFLOW_BENCH_SMOKE": "1"}
    else:
        cmd = [sys.executable, script, "--smoke", *extra]
        env = {}
    # As a user runs them: the default (sampled) divergence check, not the suite's full one.
    job = run_job(cmd, timeout=TIMEOUT_S, env={"SBPFLOW_CHECK_GLOBAL": "0", **env})
    assert job.returncode == 0, job.output
    assert job.strays == 0, job.output
    assert "Traceback" not in job.stderr, job.output
    expected = RESULTS.get(request.node.callspec.id)
    if expected is None:
        assert re.search(r"^.*\d.*$", job.stdout, re.MULTILINE), job.output
        return
    for pattern in expected:
        assert re.search(rf"^{pattern}", job.stdout, re.MULTILINE), (pattern, job.output)
