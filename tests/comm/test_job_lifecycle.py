"""Every way a job ends, ends it: a rank's SystemExit, signals to the launcher, and the
launcher's summary of which rank failed first.

Each job runs with a timeout and its processes are found by a marker in their environment
(tests/mpijob.py), so a test that fails still leaves no process behind.
"""

import os
import signal
import subprocess
import time
import uuid

import pytest

from sbpflow.distributed.launch import describe_failures, first_failure, rank_statuses
from tests.mpijob import _MARKER, _kill_marked, _marked, timeout_scale

from .conftest import REPO, job_env, launcher_cmd, mpiexec_cmd, run_job, script

# A run takes a few seconds quiet; 29 s was seen at load 8.6 on 2 cores. A hang would
# last until the 600 s collective timeout, or the launch timeout of 120 s here.
ENDS_WITHIN_S = 45 * timeout_scale()
GONE_WITHIN_S = 10  # after a signal to the launcher, no process of the job may remain


def _w(exit_code=0, sig=0):
    """A wait status as hydra reports it."""
    return sig if sig else exit_code << 8


# -- a rank's script ends by SystemExit -------------------------------------------------------
@pytest.mark.parametrize("how", ["raise", "exit", "quit"])
@pytest.mark.parametrize("runner", ["launcher", "mpi4py"])
def test_system_exit_on_one_rank_ends_the_job_with_its_status(runner, how):
    program = (script("end_script.py"), how, "3")
    if runner == "launcher":
        cmd = launcher_cmd(2, *program)
    else:
        cmd = mpiexec_cmd(2, "-m", "mpi4py", *program)
    job = run_job(cmd, timeout=120, env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert job.returncode == 3, job.output
    assert job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    word = "SystemExit" if how == "raise" else how
    assert f"rank 1: {word}(3) (rank 1 of 2); ending the job" in job.stderr, job.output
    assert "finished" not in job.stdout


def test_builtin_exit_under_plain_mpiexec_ends_the_job():
    job = run_job(mpiexec_cmd(2, script("end_script.py"), "exit", "3"), timeout=120,
                  env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert job.returncode == 3 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "rank 1: exit(3) (rank 1 of 2); ending the job" in job.stderr, job.output


@pytest.mark.parametrize("mode, status", [("literal", 3), ("named", 4)])
def test_raise_system_exit_under_plain_mpiexec_ends_the_job_with_its_status(mode, status):
    # CPython runs no hook between an uncaught SystemExit and exit: the status is read from
    # the raise statement the script stopped at (a constant, or a module-level name).
    job = run_job(mpiexec_cmd(2, script("end_script.py"), mode, str(status)), timeout=120,
                  env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert job.returncode == status and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert f"rank 1: SystemExit({status}) (rank 1 of 2); ending the job" in job.stderr, (
        job.output)
    assert "finished" not in job.stdout


def test_unreadable_system_exit_under_plain_mpiexec_ends_the_job_naming_the_rank():
    # `raise SystemExit(n)` inside a function: no status can be read. Rank 1 tells the others
    # it has ended; rank 0, blocked in an all_reduce rank 1 never issued, ends the job at
    # once (not after the collective timeout), naming rank 1 and saying the status is unknown.
    job = run_job(mpiexec_cmd(2, script("end_script.py"), "raise", "3"), timeout=120,
                  env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert ("sbpflow watchdog: rank 0: all_reduce #1 on world can never complete: rank 1 has "
            "ended (its script ended by an exception that no sbpflow hook saw") in job.stderr, (
        job.output)
    assert "status unknown) after issuing 0 collectives on world" in job.stderr, job.output
    assert "has waited" not in job.stderr  # not the collective timeout's report


@pytest.mark.parametrize("mode, status", [("literal_all", 0), ("raise_all", 0),
                                          ("raise_all", 3)])
def test_system_exit_on_every_rank_under_plain_mpiexec_keeps_its_status(mode, status):
    # Every rank ends so after the same collectives: nobody is stuck, the job is not ended
    # early, and each rank exits with its own status (0: a clean end).
    job = run_job(mpiexec_cmd(2, script("end_script.py"), mode, str(status),
                              extra=("-print-all-exitcodes",)), timeout=120)
    assert job.returncode == status, job.output
    assert job.strays == 0
    assert "ending the job" not in job.stderr and "watchdog" not in job.stderr, job.output
    line = next(x for x in job.stdout.splitlines() if "Exit codes:" in x)
    assert rank_statuses(line) == [_w(exit_code=status)] * 2, line


def test_os_exit_on_one_rank_ends_the_launched_job_with_its_status():
    job = run_job(launcher_cmd(2, script("end_script.py"), "os_exit", "5"), timeout=120)
    assert job.returncode == 5 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "rank 1 exited with status 5 (the first failure)" in job.stderr, job.output


def test_sigterm_to_a_rank_ends_the_job_naming_it():
    job = run_job(launcher_cmd(2, script("end_script.py"), "sigterm", "1"), timeout=120)
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "rank 1 was killed by signal 15 (SIGTERM) (the first failure)" in job.stderr, (
        job.output)


def test_sigint_to_a_rank_ends_the_job_naming_it():
    job = run_job(launcher_cmd(2, script("end_script.py"), "sigint", "1"), timeout=120)
    assert job.returncode == 130 and job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "rank 1: uncaught KeyboardInterrupt" in job.stderr, job.output


@pytest.mark.parametrize("how", ["raise_all", "exit_all"])
def test_system_exit_zero_on_every_rank_is_a_clean_end(how):
    job = run_job(launcher_cmd(2, script("end_script.py"), how, "0"), timeout=120)
    assert job.returncode == 0, job.output
    assert job.strays == 0
    assert "ending the job" not in job.stderr, job.output


@pytest.mark.parametrize("runner", ["launcher", "plain"])
def test_a_caught_sys_exit_does_not_end_the_job(runner):
    program = (script("end_script.py"), "caught", "3")
    cmd = launcher_cmd(2, *program) if runner == "launcher" else mpiexec_cmd(2, *program)
    job = run_job(cmd, timeout=120, env={"SBPFLOW_COLLECTIVE_TIMEOUT": "120"})
    assert job.returncode == 0, job.output
    assert "ending the job" not in job.stderr, job.output
    assert job.stdout.count("finished") == 2, job.output


# -- signals to the launcher ------------------------------------------------------------------
def _start_job(tag, *program, n=2):
    env = job_env({_MARKER: tag})
    return subprocess.Popen(launcher_cmd(n, *program), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                            env=env, text=True)


def _wait_ready(proc, n, timeout):
    """Read the launcher's output until every rank said "rank R: ready" (bounded by
    `timeout`).  The output is read in chunks and searched as a whole: a rank's line may
    arrive glued to another process's output (stderr is merged), so lines are not trusted."""
    import selectors

    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    want = [f"rank {r}: ready" for r in range(n)]
    text, deadline = "", time.monotonic() + timeout
    while not all(w in text for w in want) and time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        text += chunk.decode(errors="replace")
    sel.close()
    assert all(w in text for w in want), text


def _gone_within(tag, seconds):
    """The job's processes still alive after `seconds` (polled), as "pid cmdline" lines."""
    deadline = time.monotonic() + seconds
    while _marked(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = []
    for pid in _marked(tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid} {cmdline}")
        except OSError:
            pass
    return left


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM,
                                 signal.SIGHUP])
def test_signal_to_the_launcher_ends_every_process_of_the_job(sig):
    tag = uuid.uuid4().hex
    proc = _start_job(tag, script("end_script.py"), "loop")
    try:
        _wait_ready(proc, 2, timeout=120)
        assert len(_marked(tag)) >= 4  # launcher, mpiexec, hydra's proxy, the ranks
        os.kill(proc.pid, sig)
        proc.wait(timeout=GONE_WITHIN_S)
        left = _gone_within(tag, GONE_WITHIN_S)
        assert not left, f"left running after {sig.name} to the launcher:\n" + "\n".join(left)
        if sig != signal.SIGKILL:
            assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        _kill_marked(tag, grace=0)


def test_ctrl_c_at_a_terminal_ends_every_process_of_the_job():
    # A terminal sends SIGINT to the whole foreground process group: the launcher forwards it
    # to mpiexec, which gets it directly too. Twice is as good as once.
    tag = uuid.uuid4().hex
    env = job_env({_MARKER: tag})
    proc = subprocess.Popen(launcher_cmd(2, script("end_script.py"), "loop"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=REPO, env=env, text=True,
                            start_new_session=True)
    try:
        _wait_ready(proc, 2, timeout=120)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=GONE_WITHIN_S)
        left = _gone_within(tag, GONE_WITHIN_S)
        assert not left, "left running after Ctrl-C:\n" + "\n".join(left)
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        _kill_marked(tag, grace=0)


# -- which rank failed first ------------------------------------------------------------------
def test_summary_names_the_first_failure_and_the_stopped_ranks():
    statuses = [_w(sig=9), _w(sig=9), _w(sig=9), _w(sig=9)]
    lines = describe_failures(statuses, culprit=2)
    assert lines == ["rank 2 was killed by signal 9 (SIGKILL) (the first failure)",
                     "ranks 0, 1, 3 were stopped because of it (killed by signal 9 (SIGKILL))"]
    # Without hydra naming it, the rank that exited by itself is the cause, not the killed.
    statuses = [_w(sig=9), _w(sig=9), _w(exit_code=5), _w()]
    assert first_failure(statuses) == 2
    assert describe_failures(statuses) == [
        "rank 2 exited with status 5 (the first failure)",
        "ranks 0, 1 were stopped because of it (killed by signal 9 (SIGKILL))"]
    assert describe_failures([_w(), _w(sig=9)]) == [
        "rank 1 was killed by signal 9 (SIGKILL) (the first failure)"]
    assert describe_failures([0, 0]) == []


def test_the_first_rank_seen_ending_is_the_cause_only_when_every_rank_was_watched():
    from sbpflow.distributed.launch import RankRecords, _culprit

    statuses = [_w(sig=9), _w(sig=9), _w(sig=9)]
    seen = RankRecords(ended=[[1], [0, 2]], all_watched=True)
    assert _culprit(b"", seen, statuses) == 1
    # A rank not watched (another machine's): rank 0, seen first here, is not the cause.
    unseen = RankRecords(ended=[[0], [2]], all_watched=False)
    assert _culprit(b"", unseen, statuses) is None
    # Two at once cannot be told apart; hydra naming an MPI_Abort caller can.
    together = RankRecords(ended=[[0, 2]], all_watched=True)
    assert _culprit(b"", together, statuses) is None
    abort = b"application called MPI_Abort(MPI_COMM_WORLD, 3) - process 2\n"
    assert _culprit(abort, together, statuses) == 2
    # The MPI_Abort caller ended the job on purpose, even if a rank hydra killed ended first.
    assert _culprit(abort, seen, statuses) == 2
    # A rank that ended cleanly first (status 0) is not a failure: the next batch is.
    assert _culprit(b"", RankRecords([[0], [2], [1]], True), [0, _w(sig=9), _w(sig=9)]) == 2
    # A rank whose status this machine's hydra did not report (it ran on another machine,
    # with its watcher writing here) ended first: the cause is not a rank seen here.
    assert _culprit(b"", RankRecords([[1], [0]], True), [_w(sig=9)]) is None


def test_rank_records_are_read_from_the_watchers_lines(tmp_path):
    from sbpflow.distributed.launch import RankRecords

    boot, other = "b00t", "0ther"
    record = tmp_path / "ranks"
    record.write_text("".join([
        f"watch 2 {boot}\n", f"watch 0 {boot}\n", f"watch 1 {boot}\n",
        f"end 2 500 {boot}\n", f"end 0 700 {boot}\n", f"end 1 700 {boot}\n",
        f"end 3 100 {other}\n",  # another machine's clock: not comparable, ignored
        "end 1 9",  # a line cut short
    ]))
    records = RankRecords.read(str(record), 3, boot=boot)
    assert records.ended == [[2], [0, 1]] and records.all_watched
    # Rank 3 watched only on another boot: not every rank of 4 was watched here.
    assert not RankRecords.read(str(record), 4, boot=boot).all_watched
    missing = RankRecords.read(str(tmp_path / "none"), 2, boot=boot)
    assert missing.ended == [] and not missing.all_watched


def test_kill_summary_on_four_ranks_names_the_victim_as_the_cause():
    job = run_job(launcher_cmd(4, script("end_script.py"), "sigkill", "2"), timeout=180)
    assert job.returncode != 0 and job.seconds < 2 * ENDS_WITHIN_S, job.output
    assert job.strays == 0
    summary = next(x for x in job.stderr.splitlines()
                   if x.startswith("sbpflow.distributed.launch: the job failed"))
    assert "rank 2 was killed by signal 9 (SIGKILL) (the first failure)" in summary, summary
    for r in (0, 1, 3):  # bystanders are never named as killed like the victim
        assert f"rank {r} was killed" not in summary, summary



@pytest.mark.parametrize("end", ["os._exit(3)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_a_ranks_files_close_only_after_its_end_is_recorded(tmp_path, end):
    # hydra reacts to a rank's end when its PMI socket and stdout close: with rank_start.py
    # the watcher holds them until it has recorded the end, so whatever hydra does about it
    # (killing the other ranks) comes after the record. Here the test plays hydra.
    import socket
    import sys

    from sbpflow.distributed.launch import RANK_START

    record = tmp_path / "ranks"
    program = ("import os, signal, sys; sys.stdout.write(f'{os.getpid()} {os.getppid()}\\n'); "
               f"sys.stdout.flush(); {end}")
    ours, theirs = socket.socketpair()
    with ours, theirs:
        env = {**os.environ, "PMI_RANK": "5", "PMI_FD": str(theirs.fileno()),
               "SBPFLOW_RANK_RECORD": str(record)}
        proc = subprocess.Popen([sys.executable, "-I", "-S", RANK_START, sys.executable, "-c",
                                 program], stdout=subprocess.PIPE, env=env,
                                pass_fds=(theirs.fileno(),))
        theirs.close()
        first = proc.stdout.readline().split()
        ours.settimeout(30)
        assert ours.recv(1) == b""  # the PMI socket closed: the rank and its watcher ended
        at_pmi_eof = record.read_text()
        assert proc.stdout.read() == b""  # stdout closed too
        at_stdout_eof = record.read_text()
        status = proc.wait(timeout=30)
    # The rank is the process hydra started (the same pid and parent), not a child of it.
    assert [int(x) for x in first] == [proc.pid, os.getpid()]
    assert status == (3 if end.startswith("os._exit") else -signal.SIGKILL)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    for seen in (at_pmi_eof, at_stdout_eof):
        lines = seen.splitlines()
        assert lines[0] == f"watch 5 {boot}", seen
        assert len(lines) == 2 and lines[1].startswith("end 5 ") and lines[1].endswith(boot)
