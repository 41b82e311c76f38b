"""DataLoader workers: a dead worker is reported with its signal or exit code, and workers
never outlive their main process, even one SIGKILLed under a subreaper.

Every subprocess runs with a timeout; every worker a test learns of is killed at the end.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import sbpflow as flow
from sbpflow.utils.data import DataLoader, Dataset

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _DiesAt(Dataset):
    """Item `at` ends the worker that fetches it: by a signal, or by os._exit(code)."""

    def __init__(self, at, sig=None, code=None):
        self.at, self.sig, self.code = at, sig, code

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.at:
            if self.sig is not None:
                os.kill(os.getpid(), self.sig)
            os._exit(self.code)
        return flow.tensor([float(i)])


@pytest.mark.parametrize("sig, words", [(signal.SIGKILL, "is killed by signal: Killed."),
                                        (signal.SIGTERM, "is killed by signal: Terminated.")])
def test_a_killed_worker_is_named_with_its_signal(sig, words):
    loader = DataLoader(_DiesAt(3, sig=sig), batch_size=1, num_workers=2)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) \d+\) exited "
                                           r"unexpectedly") as info:
        for _ in loader:
            pass
    assert "DataLoader worker 1 (pid" in str(info.value)  # item 3 goes to worker 1 of 2
    assert words in str(info.value)


def test_a_worker_that_exits_is_named_with_its_exit_code():
    loader = DataLoader(_DiesAt(2, code=7), batch_size=1, num_workers=2)
    with pytest.raises(RuntimeError, match="exited with exit code 7"):
        for _ in loader:
            pass


# The main process of a DataLoader: makes the iterator (on the main thread, or on another
# thread that then ends), takes one batch, prints its workers' PIDs and waits to be killed.
_MAIN = textwrap.dedent("""
    import sys, threading, time
    import sbpflow as flow
    from sbpflow.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(flow.arange(64.0)), batch_size=4, num_workers=2)
    made = {}
    def make():
        made["it"] = iter(loader)
        next(made["it"])
    if sys.argv[1] == "thread":
        t = threading.Thread(target=make); t.start(); t.join()
    else:
        make()
    print(" ".join(str(w.pid) for w in made["it"]._workers), flush=True)
    time.sleep(120)
""")

# A harness that is a subreaper (as systemd --user, tini, or a container's init are): the
# orphaned workers become its children instead of init's. It SIGKILLs the main process and
# reports which workers are still alive after GONE_WITHIN_S, reaping those that exit.
_HARNESS = textwrap.dedent("""
    import ctypes, json, os, signal, subprocess, sys, time
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    main = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                            stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in main.stdout.readline().split()]
    os.kill(main.pid, signal.SIGKILL)
    main.wait()
    deadline = time.monotonic() + float(sys.argv[3])
    alive = set(workers)
    while alive and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        alive.discard(pid)
        time.sleep(0.05)
    print(json.dumps({"workers": workers, "alive": sorted(alive)}), flush=True)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
""")

GONE_WITHIN_S = 5.0  # a worker checks its parent every second when it is not told sooner


@pytest.mark.parametrize("made_on", ["main", "thread"])
def test_workers_exit_when_their_parent_is_killed_under_a_subreaper(made_on):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get(
        "PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", _HARNESS, _MAIN, made_on, str(GONE_WITHIN_S)],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["workers"]) == 2
    assert report["alive"] == [], f"workers left running: {report} {out.stderr}"


def test_workers_still_serve_a_live_parent():
    # The parent check never ends a worker whose parent is alive: a slow epoch completes.
    loader = DataLoader(_SlowFirst(), batch_size=1, num_workers=1)
    assert [int(b.item()) for b in loader] == [0, 1, 2]


class _SlowFirst(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, i):
        if i == 0:
            time.sleep(1.5)
        return flow.tensor(i)
