"""The launcher's one-launcher-per-machine form (`--nnodes M --node_rank K --master_addr A
--master_port P`), tested on one machine with a launcher process per "node"; and its
`--no_python` and `--logdir` options."""

import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from sbpflow.distributed import launch
from tests.mpijob import _MARKER, _kill_marked, job_env

from .conftest import REPO, run_job, script

TIMEOUT = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cmd(nnodes, node_rank, port, nproc, *program, spelling="_"):
    o = (lambda name: "--" + name.replace("_", spelling))
    return [sys.executable, "-m", "sbpflow.distributed.launch", o("nnodes"), str(nnodes),
            o("node_rank"), str(node_rank), o("master_addr"), "127.0.0.1", o("master_port"),
            str(port), o("nproc_per_node"), str(nproc), *program]


def _run_nodes(cmds, stagger=1.0):
    """Start one launcher per node (the last node first: it must wait for node 0), wait for
    all with a timeout, and kill whatever of the job is left. [(rc, stdout, stderr)]."""
    tag = uuid.uuid4().hex
    env = job_env({_MARKER: tag})
    procs = {}
    try:
        for k in reversed(range(len(cmds))):
            procs[k] = subprocess.Popen(cmds[k], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
            if k:
                time.sleep(stagger)
        results = {}
        deadline = time.monotonic() + TIMEOUT
        for k, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                pytest.fail(f"node {k}'s launcher timed out: {' '.join(cmds[k])}")
            results[k] = (proc.returncode, out, err)
        return [results[k] for k in range(len(cmds))]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        _kill_marked(tag)


def _rows(stdout):
    rows = [dict(kv.split("=", 1) for kv in line.split("\t")[1:])
            for line in stdout.splitlines() if line.startswith("ENV\t")]
    return sorted(rows, key=lambda row: int(row["RANK"]))


@pytest.mark.parametrize("spelling", ["_", "-"])
def test_two_launchers_form_one_job(spelling):
    port = _free_port()
    prog = (script("nnodes_env.py"), "a", "b c")
    (rc0, out0, err0), (rc1, out1, err1) = _run_nodes(
        [_node_cmd(2, k, port, 2, *prog, spelling=spelling) for k in range(2)])
    assert rc0 == 0 and rc1 == 0, (out0, err0, out1, err1)
    rows = _rows(out0)  # node 0's launcher prints every rank's output
    assert [row["RANK"] for row in rows] == ["0", "1", "2", "3"], out0
    for r, row in enumerate(rows):
        assert row["get_rank"] == str(r) and row["WORLD_SIZE"] == row["get_world_size"] == "4"
        assert row["LOCAL_RANK"] == str(r % 2) and row["LOCAL_WORLD_SIZE"] == "2"
        assert row["GROUP_RANK"] == str(r // 2)
        assert row["MASTER_ADDR"] == "127.0.0.1" and row["MASTER_PORT"] == str(port)
        assert row["total"] == "10"  # 1 + 2 + 3 + 4: one all_reduce over both nodes
        assert row["argv"] == "a,b c"
    assert "HYDRA_LAUNCH" not in out0 + out1


def test_a_rank_failing_on_another_node_fails_the_job():
    port = _free_port()
    prog = (script("nnodes_env.py"), "--fail-rank", "3")
    (rc0, out0, err0), (rc1, out1, err1) = _run_nodes(
        [_node_cmd(2, k, port, 2, *prog) for k in range(2)])
    # node 0's launcher has the job's status (the other nodes' end with their hydra proxy).
    assert rc0 == 3, (out0, err0, out1, err1)
    assert "rank 3 fails" in out0
    assert "sbpflow.distributed.launch: the job failed" in err0
    assert "rank 3" in err0 or "ranks 2-3 on host node1" in err0, err0


def test_a_node_without_node_0_gives_up(monkeypatch):
    monkeypatch.setattr(launch, "PROXY_RETRIES", 2)
    port = _free_port()
    opts = launch.parse_options(["--nnodes", "2", "--node_rank", "1", "--master_addr",
                                 "127.0.0.1", "--master_port", str(port),
                                 "--nproc_per_node", "1", "x.py"])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as info:
            launch._join(opts)  # installs the launcher's signal forwarding: restored below
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert info.value.code != 0


def test_node_1_runs_the_proxy_mpiexec_asks_for():
    # node K builds its proxy's command line itself: it must be the one node 0's mpiexec
    # prints for it under `-launcher manual` (no rendezvous of our own carries it over).
    port = str(_free_port())
    cmd = launch.build_command(1, None, ["x.py"], nnodes=2, master_addr="127.0.0.1",
                               master_port=port)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**job_env(), "MPIEXEC_PORT_RANGE": f"{port}:{port}"},
                            start_new_session=True)
    try:
        lines = []
        while not lines or lines[-1] != "HYDRA_LAUNCH_END":
            line = proc.stdout.readline()
            assert line, lines
            lines.append(line.strip())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    printed = [line.split(":", 1)[1].split() for line in lines[:-1]]
    assert printed == [launch.proxy_command(k, "127.0.0.1", port) for k in range(2)]


def test_launcher_option_spellings_and_errors():
    a = launch.parse_options(["--nnodes=2", "--node-rank", "1", "--master-addr", "h",
                              "--master_port=1234", "--nproc_per_node", "3", "--no-python",
                              "--logdir", "logs", "./prog", "x"])
    assert (a.nnodes, a.node_rank, a.master_addr, a.master_port, a.nproc, a.no_python,
            a.logdir, a.program) == (2, 1, "h", "1234", 3, True, "logs", ["./prog", "x"])
    assert launch.parse_args(["--nproc-per-node", "2", "--no_python", "p"]) == (
        2, None, False, ["p"])
    for bad in (["--nnodes", "2", "--node_rank", "2", "--nproc_per_node", "1", "a.py"],
                ["--nnodes", "0", "--nproc_per_node", "1", "a.py"],
                ["--nnodes", "2", "--hostfile", "h", "--nproc_per_node", "1", "a.py"],
                ["--no_python", "--nproc_per_node", "1", "-m", "mod"],
                ["--master_port", "0", "--nproc_per_node", "1", "a.py"]):
        with pytest.raises(SystemExit):
            launch.parse_options(bad)


def test_no_python_runs_the_program_itself():
    job = run_job([sys.executable, "-m", "sbpflow.distributed.launch", "--nproc_per_node", "2",
                   "--no_python", "/bin/sh", "-c", 'echo "rank=$RANK port=$MASTER_PORT"'],
                  timeout=TIMEOUT)
    assert job.returncode == 0, job.output
    assert sorted(job.stdout.split()) == ["port=29500", "port=29500", "rank=0", "rank=1"]


def test_logdir_on_two_nodes(tmp_path):
    logdir = tmp_path / "logs" / "run"  # made by each rank's machine
    port = _free_port()
    prog = ("--logdir", str(logdir), script("nnodes_env.py"))
    (rc0, out0, err0), (rc1, out1, err1) = _run_nodes(
        [_node_cmd(2, k, port, 1, *prog) for k in range(2)])
    assert rc0 == 0 and rc1 == 0, (out0, err0, out1, err1)
    assert "ENV\t" not in out0
    assert sorted(os.listdir(logdir)) == ["rank-0.log", "rank-1.log"]
    for r in range(2):
        row = _rows((logdir / f"rank-{r}.log").read_text())
        assert [(x["RANK"], x["GROUP_RANK"], x["total"]) for x in row] == [(str(r), str(r), "3")]


def test_logdir_writes_one_log_per_rank(tmp_path):
    logdir = tmp_path / "logs"
    job = run_job([sys.executable, "-m", "sbpflow.distributed.launch", "--nproc_per_node", "2",
                   "--logdir", str(logdir), script("nnodes_env.py"), "--fail-rank", "1"],
                  timeout=TIMEOUT)
    assert job.returncode == 3, job.output  # rank 1's status
    assert "ENV\t" not in job.stdout and "rank 1 fails" not in job.stdout
    assert sorted(os.listdir(logdir)) == ["rank-0.log", "rank-1.log"]
    assert (logdir / "rank-1.log").read_text().startswith("rank 1 fails")
