"""A job over two simulated machines (network namespaces, see tests/comm/netns/harness.py).

Data-parallel training with one rank on each "machine" equals single-process training. Then
faults on the other machine: its rank killed, the link between the machines cut, the rank
frozen (SIGSTOP). Each ends the job within `ENDS_WITHIN_S` of the fault, with a message
naming the lost rank's host and rank, leaves no process behind,
and `--resume` from the last checkpoint ends with exactly the parameters of the run that had
no fault. A degraded link (200 ms more latency each way, 5% loss: tc netem, or the harness's
user-space relay where the kernel has no netem) slows the job down but must not end it, nor
change its result.

Needs root and iproute2 (CI has both: .ci/run installs iproute2 when missing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from .netns import harness
from .netns.harness import TwoMachines

_why_not = harness.unavailable()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=str(_why_not))

SCRIPT = str(harness.Path(__file__).resolve().parent / "netns" / "train_resume.py")
STEPS = 6
ENDS_WITHIN_S = 30  # the goal for every fault: the job has ended this long after it
JOB_LIMIT_S = 120  # a hard bound on any one job of this file
OTHER_HOST = harness.ADDRS[1]


def _final(directory) -> dict[str, np.ndarray]:
    with np.load(os.path.join(directory, "final.npz")) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    harness.remove_stale()
    m = TwoMachines(tmp_path_factory.mktemp("machines"))
    m.create()
    try:
        yield m
    finally:
        m.remove()
    assert not any(ns in harness.namespaces() for ns in m.ns)


@pytest.fixture(scope="module")
def reference(machines, tmp_path_factory):
    """(one process's final parameters, the two machines' final parameters)."""
    single = tmp_path_factory.mktemp("single")
    env = machines.env()
    for name in ("HYDRA_LAUNCHER", "HYDRA_LAUNCHER_EXEC", "HYDRA_IFACE"):
        env.pop(name)
    proc = subprocess.run([sys.executable, SCRIPT, "--dir", str(single), "--steps",
                           str(STEPS)], capture_output=True, text=True, env=env,
                          cwd=harness.REPO, timeout=JOB_LIMIT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    two = tmp_path_factory.mktemp("two")
    result = machines.launch(1, SCRIPT, "--dir", str(two), "--steps", str(STEPS)).finish(
        JOB_LIMIT_S)
    assert result.returncode == 0, result.output
    return _final(single), _final(two), result


def test_two_machines_train_like_one_process(reference):
    single, two, result = reference
    # One rank ran on each machine, and both took every step.
    assert f"rank 0: on {harness.ADDRS[0]}" in result.stdout, result.output
    assert f"rank 1: on {OTHER_HOST}" in result.stdout, result.output
    assert f"rank 1: step {STEPS}" in result.stdout, result.output
    assert single.keys() == two.keys()
    for name in single:
        # Gradients are averaged over the link instead of summed in one batch: float32
        # rounding differs, nothing more.
        np.testing.assert_allclose(two[name], single[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def _no_process_left(machines, within_s=5.0):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = machines.processes(0) + machines.processes(1)
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left in the namespaces: {left}")


def _fault_then_resume(machines, tmp_path, reference, inject, env=None, resume=True,
                       nproc=1):
    """Start training, inject a fault after step 2, check how the job ended; then resume
    from the checkpoint and check the result. Returns the faulty job's result."""
    run = tmp_path / "run"
    run.mkdir()
    job = machines.launch(nproc, SCRIPT, "--dir", str(run), "--steps", str(STEPS),
                          "--step-delay", "0.5", env=env)
    try:
        job.wait_for("rank 0: step 2", JOB_LIMIT_S)
        injected = time.monotonic()
        inject()
        result = job.finish(JOB_LIMIT_S)
        ended_after = time.monotonic() - injected
    finally:
        job.kill()
        machines.heal()
    assert result.returncode != 0, result.output
    assert ended_after < ENDS_WITHIN_S, (ended_after, result.output)
    assert "rank 0: done" not in result.stdout, result.output
    _no_process_left(machines)
    if not resume:
        return result

    import sbpflow as flow

    saved_at = flow.load(str(run / "checkpoint.safetensors"))["step"]
    assert 2 <= saved_at < STEPS
    resumed = machines.launch(1, SCRIPT, "--dir", str(run), "--steps", str(STEPS),
                              "--resume").finish(JOB_LIMIT_S)
    assert resumed.returncode == 0, resumed.output
    assert f"rank 1: resumed at step {saved_at}" in resumed.stdout, resumed.output
    _, uninterrupted, _ = reference
    final = _final(run)
    for name in uninterrupted:  # the same steps from the same state: bit for bit
        np.testing.assert_array_equal(final[name], uninterrupted[name], err_msg=name)
    return result


def test_killed_rank_on_other_machine(machines, tmp_path, reference):
    result = _fault_then_resume(
        machines, tmp_path, reference, lambda: machines.kill_rank(1, SCRIPT))
    out = result.output
    # hydra's report names the host and the signal; the launcher names the rank placed there.
    assert f"RUNNING AT {OTHER_HOST}" in out and "EXIT CODE: 9" in out, out
    assert (f"rank 1 on host {OTHER_HOST} ended with code 9 (or was killed by signal 9, "
            "SIGKILL) (the first failure)") in out, out


def test_cut_link_is_noticed_by_the_heartbeat(machines, tmp_path, reference):
    result = _fault_then_resume(machines, tmp_path, reference, machines.cut_link)
    assert (f"sbpflow heartbeat: rank 0 (host {harness.ADDRS[0]}) has heard nothing from "
            f"rank 1 (host {OTHER_HOST})") in result.stderr, result.output


def test_frozen_rank_on_other_machine(machines, tmp_path, reference):
    # Two ranks on each machine (rank 0 hears three peers), one of the other machine's
    # frozen; a shorter heartbeat timeout than the default, as a user may set it.
    frozen = []

    def freeze():
        frozen.append(machines.rank_of(machines.kill_rank(1, SCRIPT, signal.SIGSTOP)))

    result = _fault_then_resume(machines, tmp_path, reference, freeze,
                                env={"SBPFLOW_HEARTBEAT_TIMEOUT": "5"}, resume=False, nproc=2)
    assert frozen[0] in (2, 3)
    assert (f"has heard nothing from rank {frozen[0]} (host {OTHER_HOST}) for 5."
            in result.stderr), result.output


def test_slow_lossy_link_changes_nothing(machines, tmp_path, reference):
    """200 ms more latency each way and 5% of the packets lost: slower, the same result."""
    run = tmp_path / "run"
    run.mkdir()
    try:
        machines.degrade_link(200, 5)
        result = machines.launch(1, SCRIPT, "--dir", str(run), "--steps", str(STEPS)).finish(
            JOB_LIMIT_S)
    finally:
        machines.heal()
    assert result.returncode == 0, result.output
    assert "sbpflow heartbeat" not in result.output, result.output
    assert f"rank 1: step {STEPS}" in result.stdout, result.output
    _, uninterrupted, _ = reference
    final = _final(run)
    for name in uninterrupted:
        np.testing.assert_array_equal(final[name], uninterrupted[name], err_msg=name)


def test_namespaces_left_by_a_crashed_run_are_removed():
    gone = subprocess.Popen(["true"])
    gone.wait()  # a test process that no longer exists
    name = f"{harness.PREFIX}{gone.pid}-0a"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        assert name in harness.remove_stale()
        assert name not in harness.namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
