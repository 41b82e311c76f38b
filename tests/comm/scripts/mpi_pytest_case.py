"""A test file run by pytest under `mpiexec -n 2` (by test_failures.py): rank 1's test fails
while rank 0 waits for it in a collective; tests/comm/conftest.py must abort the job."""

import numpy as np

from sbpflow import comm


def test_rank_one_fails_while_rank_zero_waits():
    world = comm.world()
    assert world.rank != 1, "rank 1 fails on purpose"
    world.all_reduce(np.ones(3))  # rank 0 waits here for rank 1, which never comes
