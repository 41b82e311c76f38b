"""nn.parallel.DistributedDataParallel: 2 ranks against single-process full-batch training
(the checks, and the single-process replica they compare with, live in scripts/ddp_check.py)."""

import re
import sys

import pytest

import sbpflow as flow
from sbpflow.nn.parallel import DistributedDataParallel

from .conftest import mpiexec_cmd, run_job, script


@pytest.mark.parametrize("n", [1, 2])
def test_ddp_matches_full_batch_training(n):
    cmd = ([sys.executable, script("ddp_check.py")] if n == 1 else
           mpiexec_cmd(n, "-m", "mpi4py", script("ddp_check.py")))
    job = run_job(cmd, timeout=90)
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): ddp ok", job.stdout))
    assert ranks == list(range(n)), job.output
    assert job.strays == 0


def test_buckets_reverse_order_and_cap():
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(10, 10), flow.nn.Linear(10, 10))  # 440 B per weight
    ddp = DistributedDataParallel(m, bucket_cap_mb=400 / 2**20)
    params = list(m.parameters())
    order = [p for b in ddp._buckets for p in b.params]
    assert [id(p) for p in order] == [id(p) for p in reversed(params)]
    assert all(sum(p.numel() * 4 for p in b.params[:-1]) < 400 for b in ddp._buckets)
    assert len(ddp._buckets) == 2  # bias+weight of each layer


def test_surface_single_process():
    m = flow.nn.Linear(3, 2)
    ddp = DistributedDataParallel(m)
    assert ddp.module is m
    assert set(ddp.state_dict()) == {"module.weight", "module.bias"}
    x = flow.ones(4, 3)
    with ddp.no_sync():
        ddp(x).sum().backward()
    ddp(x).sum().backward()
    assert (m.weight.grad.numpy() == 8.0).all()  # two batches of 4 ones, accumulated
    with pytest.raises(TypeError):
        DistributedDataParallel(object())
    with pytest.raises(ValueError):
        DistributedDataParallel(m, bucket_cap_mb=0)
