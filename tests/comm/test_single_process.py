"""A single process: no MPI at all, world-of-one semantics, env detection, launcher parsing."""

import os
import signal
import sys

import numpy as np
import pytest
import torch

from sbpflow import comm
from sbpflow.comm import env as comm_env
from sbpflow.comm import watchdog
from sbpflow.comm.communicator import WorldOfOne, balanced_sizes
from sbpflow.distributed import launch

from .conftest import mpiexec_cmd, run_job

SNIPPET = """
import sys
import sbpflow as flow
import sbpflow.distributed
from sbpflow import comm
t = flow.ones(3)
comm.all_reduce(t)
comm.broadcast(t, 0)
comm.barrier()
assert t.tolist() == [1.0, 1.0, 1.0]
assert comm.world().size == 1 and comm.get_rank() == 0 and comm.get_node_size() == 1
print("mpi4py imported:", "mpi4py" in sys.modules)
"""


def test_single_process_never_imports_mpi4py():
    job = run_job([sys.executable, "-c", SNIPPET], timeout=60)
    assert job.returncode == 0, job.output
    assert "mpi4py imported: False" in job.stdout


def test_mpiexec_with_one_rank_is_a_world_of_one_without_mpi():
    job = run_job(mpiexec_cmd(1, "-c", SNIPPET), timeout=60)
    assert job.returncode == 0, job.output
    assert "mpi4py imported: False" in job.stdout


@pytest.mark.parametrize("total", [0, 1, 4, 5, 7, 13])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_balanced_sizes_match_torch_tensor_split(total, parts):
    want = [len(c) for c in torch.tensor_split(torch.arange(total), parts)]
    assert list(balanced_sizes(total, parts)) == want


def test_world_of_one_groups_are_itself():
    w = WorldOfOne()
    assert w.group([0]) is w and w.hierarchy_axis([[0]], 0) is w
    assert w.hierarchy_axis([[0]], -1) is w
    with pytest.raises(ValueError, match="distinct ranks"):
        w.group([0, 0])
    with pytest.raises(ValueError, match="distinct ranks"):
        w.group([1])
    with pytest.raises(IndexError, match="axis 2 out of range"):
        w.hierarchy_axis([[0]], 2)


def test_world_of_one_argument_errors():
    w = WorldOfOne()
    with pytest.raises(TypeError, match="all_reduce: buf must be a NumPy array"):
        w.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="reduce op must be one of"):
        w.all_reduce(np.ones(2), "mean")
    with pytest.raises(ValueError, match=r"broadcast: root must be a rank in \[0, 1\)"):
        w.broadcast(np.ones(2), 1)
    with pytest.raises(ValueError, match="add up to 3, but the array has 4 rows"):
        w.reduce_scatter(np.ones((4, 2)), sizes=[3])
    with pytest.raises(ValueError, match="read-only"):
        w.all_reduce(np.ones(2), out=np.broadcast_to(np.zeros(1), (2,)))
    with pytest.raises(RuntimeError, match="nothing was sent"):
        w.recv(np.empty(2), 0, tag=9)


def test_world_of_one_send_to_self_is_buffered_in_order():
    w = WorldOfOne()
    w.send(np.array([1, 2]), 0, tag=3)
    w.send(np.array([3, 4]), 0, tag=3)
    a, b = np.empty(2, np.int64), np.empty(2, np.int64)
    assert w.recv(a, 0, tag=3).tolist() == [1, 2]
    assert w.recv(b, 0, tag=3).tolist() == [3, 4]


def test_reduce_op_parse():
    assert comm.ReduceOp.parse("SUM") is comm.ReduceOp.SUM
    assert comm.ReduceOp.parse(comm.ReduceOp.MAX) is comm.ReduceOp.MAX


@pytest.mark.parametrize("variables, rank, size, local", [
    ({}, 0, 1, 0),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, 3, 4, 1),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 2, 8, 2),
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, 0, 1, 0),
    # torchrun's variables alone do not make an MPI job.
    ({"RANK": "1", "WORLD_SIZE": "2"}, 0, 1, 0),
])
def test_launcher_environment_detection(monkeypatch, variables, rank, size, local):
    for name in list(os.environ):
        if name.startswith(("PMI_", "MPI_LOCAL", "OMPI_", "MV2_")) or name in ("RANK",
                                                                                "WORLD_SIZE"):
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert comm_env.launched_rank() == rank
    assert comm_env.launched_world_size() == size
    assert comm_env.launched_local_rank() == local
    assert comm_env.is_multi_process() == (size > 1)


def test_collective_timeout_from_environment(monkeypatch):
    monkeypatch.setenv(watchdog.TIMEOUT_ENV, "2.5")
    assert watchdog._timeout_from_env() == 2.5
    monkeypatch.delenv(watchdog.TIMEOUT_ENV)
    assert watchdog._timeout_from_env() == 600.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(watchdog.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=watchdog.TIMEOUT_ENV):
            watchdog._timeout_from_env()
    before = comm.collective_timeout()
    try:
        comm.set_collective_timeout(7)
        assert comm.collective_timeout() == 7.0
        with pytest.raises(ValueError):
            comm.set_collective_timeout(0)
    finally:
        comm.set_collective_timeout(before)


def test_launcher_arguments():
    assert launch.parse_args(["--nproc-per-node", "3", "train.py", "--lr", "1"]) == (
        3, None, False, ["train.py", "--lr", "1"])
    assert launch.parse_args(["--nproc_per_node=2", "--hostfile=h", "-m", "pkg.mod", "x"]) == (
        2, "h", False, ["-m", "pkg.mod", "x"])
    for bad in (["train.py"], ["--nproc-per-node", "0", "a.py"], ["--nproc-per-node", "2"],
                ["--nproc-per-node", "two", "a.py"], ["--bogus", "a.py"]):
        with pytest.raises(SystemExit):
            launch.parse_args(bad)


def test_launcher_command_one_segment_per_rank(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# machines\nnode-a:4\n\nnode-b  # second\nnode-c\n")
    assert launch.read_hostfile(str(hostfile)) == ["node-a", "node-b", "node-c"]
    cmd = launch.build_command(2, str(hostfile), ["train.py", "--x"], mpiexec="/bin/mpiexec")
    assert cmd[:6] == ["/bin/mpiexec", "-print-all-exitcodes", "-f", str(hostfile), "-ppn", "2"]
    segments = " ".join(cmd[6:]).split(" : ")
    assert len(segments) == 6
    for rank, segment in enumerate(segments):
        assert segment.startswith(
            f"-n 1 -env RANK {rank} -env WORLD_SIZE 6 -env LOCAL_RANK {rank % 2} "
            "-env LOCAL_WORLD_SIZE 2 ")
        assert segment.endswith(f"{sys.executable} -m mpi4py train.py --x")


def test_launcher_reads_hydra_exit_codes():
    # Linux wait statuses: exit code n is n << 8, death by signal s is s.
    line = "[mpiexec@node-a] Exit codes: [node-a] 0,1280 [node-b] 9,0"
    statuses = launch.rank_statuses(line)
    assert statuses == [0, 5 << 8, signal.SIGKILL, 0]
    assert launch.describe_failures(statuses) == [
        "rank 1 exited with status 5 (the first failure)",
        "rank 2 was stopped because of it (killed by signal 9 (SIGKILL))"]
