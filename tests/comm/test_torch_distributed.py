"""torch.distributed's API on sbpflow: a torch-style script on 1, 2 and 4 ranks (checks in
scripts/torch_distributed_check.py), and the single-process behaviour and errors, against the
installed torch where torch can run the same case in one process."""

import datetime
import pickle
import re
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as tdist

import sbpflow as flow
import sbpflow.distributed as dist

from .conftest import launcher_cmd, mpiexec_cmd, run_job, script


def _passed(job, n):
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): torch.distributed ok", job.stdout))
    assert ranks == list(range(n)), job.output
    assert job.strays == 0


@pytest.mark.parametrize("n,backend", [(2, "gloo"), (4, "nccl")])
def test_torch_style_script_under_mpiexec(n, backend):
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", script("torch_distributed_check.py"), backend),
                  timeout=120)
    _passed(job, n)


def test_torch_style_script_under_the_launcher_with_env_rendezvous():
    job = run_job(launcher_cmd(2, script("torch_distributed_check.py"), "gloo", "env://"),
                  timeout=120)
    _passed(job, 2)


def test_torch_style_script_in_one_process():
    job = run_job([sys.executable, script("torch_distributed_check.py"), "mpi"], timeout=60)
    _passed(job, 1)


def test_rank_mismatch_ends_the_job_with_a_clear_error():
    code = ("import sbpflow.distributed as d\n"
            "d.init_process_group('gloo', world_size=3)\n")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", "-c", code), timeout=60)
    assert job.returncode != 0
    assert "world_size is 3, but this process is rank" in job.output
    assert "MPI job of 2 rank(s)" in job.output and job.strays == 0


@pytest.fixture
def pg():
    dist.init_process_group("gloo")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def torch_pg(tmp_path):
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                             world_size=1)
    yield
    tdist.destroy_process_group()


def _error(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return type(e), str(e)
    return None, None


@pytest.mark.parametrize("call", [
    lambda d, m: d.all_reduce(m.ones(2)),
    lambda d, m: d.broadcast(m.ones(2), 0),
    lambda d, m: d.barrier(),
    lambda d, m: d.get_rank(),
    lambda d, m: d.get_world_size(),
    lambda d, m: d.get_backend(),
    lambda d, m: d.new_group([0]),
    lambda d, m: d.all_gather_object([None], 1),
    lambda d, m: d.destroy_process_group(),
])
def test_calls_before_init_raise_torchs_error(call):
    assert not dist.is_initialized() and not tdist.is_initialized()
    want = _error(lambda: call(tdist, torch))
    assert want[0] is not None
    assert _error(lambda: call(dist, flow)) == want


def test_init_twice_raises_as_torch(pg, torch_pg):
    want = _error(lambda: tdist.init_process_group("gloo"))
    assert _error(lambda: dist.init_process_group("gloo")) == want
    assert "twice" in want[1]


def test_world_of_one_matches_torch(pg, torch_pg):
    assert dist.get_rank() == tdist.get_rank() == 0
    assert dist.get_world_size() == tdist.get_world_size() == 1
    assert dist.get_backend() == tdist.get_backend() == "gloo"
    assert dist.is_available() and dist.is_mpi_available() and dist.is_gloo_available()
    assert not dist.is_nccl_available()
    for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        a, b = flow.tensor([1.5, -2.0]), torch.tensor([1.5, -2.0])
        dist.all_reduce(a, op=getattr(dist.ReduceOp, op))
        tdist.all_reduce(b, op=getattr(tdist.ReduceOp, op))
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert repr(dist.ReduceOp.SUM) == repr(tdist.ReduceOp.SUM)
    a, b = flow.arange(3, dtype=flow.int64), torch.arange(3)
    assert _error(lambda: dist.all_reduce(a, op=dist.ReduceOp.AVG))[0] is \
        _error(lambda: tdist.all_reduce(b, op=tdist.ReduceOp.AVG))[0]
    out_f, out_t = flow.zeros(3), torch.zeros(3)
    dist.all_gather_into_tensor(out_f, flow.tensor([1.0, 2.0, 3.0]))
    tdist.all_gather_into_tensor(out_t, torch.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(out_f.numpy(), out_t.numpy())
    objs_f, objs_t = [None], [None]
    dist.all_gather_object(objs_f, {"a": (1, "x")})
    tdist.all_gather_object(objs_t, {"a": (1, "x")})
    assert objs_f == objs_t
    g_f, g_t = dist.new_group([0]), tdist.new_group([0])
    assert dist.get_rank(g_f) == tdist.get_rank(g_t) == 0
    assert dist.get_process_group_ranks(g_f) == tdist.get_process_group_ranks(g_t) == [0]
    work_f = dist.all_reduce(flow.ones(2), async_op=True)
    work_t = tdist.all_reduce(torch.ones(2), async_op=True)
    assert work_f.wait() == work_t.wait() is True
    assert work_f.is_completed() and work_t.is_completed()


def test_world_of_one_collectives_and_objects(pg):
    t = flow.tensor([[1.0, 2.0], [3.0, 4.0]])
    dist.broadcast(t, src=0)
    outs = [flow.zeros(2, 2)]
    dist.all_gather(outs, t)
    np.testing.assert_array_equal(outs[0].numpy(), t.numpy())
    out = flow.zeros(2, 2)
    dist.reduce_scatter_tensor(out, t)
    np.testing.assert_array_equal(out.numpy(), t.numpy())
    objs = [None]
    dist.all_gather_object(objs, {"t": flow.tensor([1.0, 2.0], requires_grad=True),
                                  "p": flow.nn.Parameter(flow.ones(2)), "d": flow.float16})
    assert objs[0]["t"].requires_grad and isinstance(objs[0]["p"], flow.nn.Parameter)
    assert objs[0]["d"] is flow.float16
    np.testing.assert_array_equal(objs[0]["t"].detach().numpy(), [1.0, 2.0])
    lst = [1, {"x": flow.ones(1)}]
    dist.broadcast_object_list(lst, src=0)
    assert lst[0] == 1
    with pytest.raises(ValueError, match="not part of group"):
        dist.broadcast(t, src=1)
    with pytest.raises(ValueError, match="same as the rank"):
        dist.send(t, dst=0)
    with pytest.raises(NotImplementedError, match="any source"):
        dist.recv(t)
    with pytest.raises(NotImplementedError, match="BAND"):
        dist.all_reduce(t, op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="group size"):
        dist.all_gather_into_tensor(flow.zeros(3), flow.zeros(2))
    with pytest.raises(ValueError, match="distinct ranks"):
        dist.new_group([0, 3])
    with pytest.raises(TypeError, match="ProcessGroup"):
        dist.all_reduce(t, group="world")
    model = flow.nn.Linear(2, 2)
    ddp = flow.nn.parallel.DistributedDataParallel(model, process_group=dist.new_group([0]))
    ddp(flow.ones(3, 2)).sum().backward()
    np.testing.assert_array_equal(model.weight.grad.numpy(), np.full((2, 2), 3.0, np.float32))
    w = dist.barrier(async_op=True)
    assert w.wait() and w.get_future().wait() == []


def test_destroy_then_init_again_and_groups_die():
    dist.init_process_group("mpi")
    g = dist.new_group([0])
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group(backend=None, timeout=datetime.timedelta(seconds=120))
    try:
        assert dist.get_backend() == "mpi"
        with pytest.raises(ValueError, match="destroyed"):
            dist.all_reduce(flow.ones(1), group=g)
    finally:
        dist.destroy_process_group()


def test_nccl_on_cpu_warns_once(monkeypatch):
    monkeypatch.setattr(dist.distributed_c10d, "_nccl_warned", False)  # a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            dist.init_process_group("nccl")
            assert dist.get_backend() == "nccl"
            t = flow.ones(2)
            dist.all_reduce(t)
            np.testing.assert_array_equal(t.numpy(), [1.0, 1.0])
            dist.destroy_process_group()
    msgs = [str(w.message) for w in caught if "over MPI on the CPU" in str(w.message)]
    assert len(msgs) == 1, msgs


def test_init_checks_the_rendezvous(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="environment variable RANK expected"):
        dist.init_process_group("gloo", init_method="env://")
    with pytest.raises(ValueError, match="rank is 1, but this process is rank 0"):
        dist.init_process_group("gloo", rank=1, world_size=1)
    with pytest.raises(ValueError, match="world_size is 2"):
        dist.init_process_group("gloo", world_size=2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"WORLD_SIZE \(environment\) is 4"):
        dist.init_process_group("gloo", init_method="env://")
    with pytest.raises(ValueError, match="init_method"):
        dist.init_process_group("gloo", init_method="bogus")
    with pytest.raises(AssertionError, match="Unknown backend type foo"):
        dist.init_process_group("foo")
    with pytest.raises(NotImplementedError, match="store"):
        dist.init_process_group("gloo", store=object())
    with pytest.raises(TypeError, match="timedelta"):
        dist.init_process_group("gloo", timeout=30)
    assert not dist.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    dist.destroy_process_group()


def test_group_member_and_objects_pickle_as_plain_data():
    assert dist.group.WORLD is None and repr(dist.GroupMember.NON_GROUP_MEMBER)
    assert pickle.loads(pickle.dumps(dist.ReduceOp.MAX)) is dist.ReduceOp.MAX


def test_flow_comm_accepts_torch_reduce_ops():
    from sbpflow import comm

    assert comm.ReduceOp.parse(dist.ReduceOp.PRODUCT) is comm.ReduceOp.PROD
    assert comm.ReduceOp.parse(dist.ReduceOp.MIN) is comm.ReduceOp.MIN
    with pytest.raises(ValueError, match="reduce op must be one of"):
        comm.ReduceOp.parse(dist.ReduceOp.AVG)


def test_launcher_sets_torchrun_rendezvous_variables(tmp_path, monkeypatch):
    from sbpflow.distributed import launch

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a\nnode-b\n")
    cmd = launch.build_command(2, str(hostfile), ["train.py"], mpiexec="/bin/mpiexec")
    segments = " ".join(cmd[6:]).split(" : ")
    assert len(segments) == 4
    for rank, segment in enumerate(segments):
        assert (f"-env GROUP_RANK {rank // 2} -env MASTER_ADDR node-a -env MASTER_PORT 29500 "
                in segment), segment
    monkeypatch.setenv("MASTER_PORT", "1234")
    cmd = launch.build_command(1, None, ["train.py"], mpiexec="/bin/mpiexec")
    assert "-env MASTER_ADDR 127.0.0.1 -env MASTER_PORT 1234 " in " ".join(cmd)


def test_stores_are_refused_and_mixed_backends_do_not_warn(monkeypatch):
    with pytest.raises(NotImplementedError, match="TCPStore is not supported"):
        dist.TCPStore("127.0.0.1", 29500, 1, True)
    monkeypatch.setattr(dist.distributed_c10d, "_nccl_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("cpu:gloo,cuda:nccl")
    try:
        assert dist.get_backend() == "cpu:gloo,cuda:nccl"
        assert not [w for w in caught if "over MPI on the CPU" in str(w.message)]
    finally:
        dist.destroy_process_group()
