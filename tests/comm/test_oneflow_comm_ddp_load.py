"""OneFlow's comm.all_gather_into_tensor / reduce_scatter_tensor, DDP's bucket_size /
use_bucket / broadcast_buffers, and load(path, global_src_rank) on 1, 2 and 4 ranks (the
checks, against NumPy, live in scripts/check_oneflow_comm_ddp_load.py); boxing.nccl."""

import re
import sys

import pytest

import sbpflow as flow

from .conftest import mpiexec_cmd, run_job, script


@pytest.mark.parametrize("n", [1, 2, 4])
def test_oneflow_comm_ddp_and_load(n, tmp_path):
    prog = (script("check_oneflow_comm_ddp_load.py"), str(tmp_path))
    cmd = ([sys.executable, *prog] if n == 1 else mpiexec_cmd(n, "-m", "mpi4py", *prog))
    job = run_job(cmd, timeout=120)
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): oneflow api ok", job.stdout))
    assert ranks == list(range(n)), job.output
    assert job.strays == 0


def test_boxing_nccl_settings_are_checked_no_ops():
    nccl = flow.boxing.nccl
    before = nccl.settings()
    try:
        nccl.enable_use_compute_stream(True)
        nccl.enable_use_compute_stream()  # OneFlow's default: False
        nccl.set_fusion_threshold_mbytes(16)
        nccl.set_fusion_max_ops_num(24)
        nccl.enable_all_to_all(True)
        nccl.allow_fuse_all_reduce(False)
        nccl.set_stream_num(2)
        nccl.disable_group_boxing_by_dst_parallel(True)
        got = nccl.settings()
        assert got["enable_use_compute_stream"] is False
        assert got["set_fusion_threshold_mbytes"] == 16 and got["enable_all_to_all"] is True
        assert got["set_stream_num"] == 2 and got["allow_fuse_all_reduce"] is False
        with pytest.raises(TypeError, match="enable_all_to_all.*must be bool, not int"):
            nccl.enable_all_to_all(1)
        with pytest.raises(TypeError, match="set_fusion_threshold_mbytes.*must be int"):
            nccl.set_fusion_threshold_mbytes(1.5)
        with pytest.raises(ValueError, match="set_stream_num"):
            nccl.set_stream_num(0)
        with pytest.raises(TypeError, match="missing required argument"):
            nccl.enable_all_to_all()
        with pytest.raises(AttributeError, match="no attribute 'enable_warp_drive'"):
            nccl.enable_warp_drive(True)
        assert "enable_use_compute_stream" in dir(nccl)
        # A no-op: boxing still moves the same values.
        x = flow.randn(4, 3)
        g = x.to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.split(0))
        y = g.to_global(sbp=flow.sbp.broadcast)
        assert (y.to_local().numpy() == x.numpy()).all()
    finally:
        nccl._values.clear()
        nccl._values.update(before)
