"""nn.Graph over global tensors on 2 and 4 ranks: graph_global_check.py run under
`mpiexec -n N python -m mpi4py -m pytest` (each launch with a timeout; the conftest aborts the
whole job on the first failing test of any rank).  Every case compares a graph with the same
program in eager global mode: data parallel, the tensor-parallel MLP, a 2x2 data x tensor
grid, gradient accumulation over each rank's piece, P -> B inside a graph, to_global and
to_local inside build() with uneven splits, random ops, arange and means over a split axis,
the per-rank plan cut into tasks at its collectives (the same ids and collective order on
every rank), point-to-point tags per (register, piece), and threaded actors with
injected delays."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.mpijob import mpiexec_cmd, run_job

CHECK = str(Path(__file__).with_name("graph_global_check.py"))


@pytest.mark.parametrize("n, cases, timeout", [(2, 26, 150), (4, 29, 240)])
def test_graphs_over_global_tensors_equal_eager_global(n, cases, timeout):
    # quiet: about 15 s on 2 ranks and 30 s on 4 (2 cores); timeouts 4x over a loaded run
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", CHECK), timeout=timeout)
    assert job.returncode == 0, job.output
    counts = re.findall(r"(\d+) passed", job.stdout)
    assert len(counts) == n and set(counts) == {str(cases)}, job.output
    assert not re.search(r"\b(failed|errors?)\b", job.stdout), job.output
    assert job.strays == 0
