"""A rank's script ends in the way named by argv[1], while the other ranks go on.

Modes (argv[2] is the status or the rank):
- raise N / exit N / quit N: rank 1 ends by `raise SystemExit(N)` / builtin `exit(N)` /
  builtin `quit(N)` right after `import sbpflow`, while rank 0 waits in an all_reduce that
  rank 1 never joins;
- raise_all N / exit_all N: every rank ends so after one all_reduce;
- literal / named N: rank 1 ends by a `raise SystemExit(3)` / `raise SystemExit(N)` (a
  module-level name) written in this script's own code, where the others wait in an
  all_reduce; literal_all: every rank ends by a bare `raise SystemExit` after one all_reduce;
- caught N: rank 1 calls `sys.exit(N)` and `exit(N)` inside try/except SystemExit, then
  every rank runs to the end of the script;
- sigkill R / sigterm R / sigint R: rank R sends itself that signal while the others wait in
  an all_reduce;
- os_exit N: rank 1 ends by `os._exit(N)` while the others wait in an all_reduce;
- loop: every rank prints "rank R: ready" and then trains (all_reduce and sleep) for a
  minute, for tests that signal the launcher.
"""

import os
import signal
import sys
import time

import numpy as np

import sbpflow  # noqa: F401  (starts MPI and installs the failure handlers)
from sbpflow import comm

mode, arg = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
world = comm.world()
buf = np.ones(4, np.float32)


def end(how, status):
    if how == "raise":
        raise SystemExit(status)
    if how == "exit":
        exit(status)  # noqa: PLR1722 - the builtin on purpose
    if how == "quit":
        quit(status)  # noqa: PLR1722


if mode in ("raise", "exit", "quit") and world.rank == 1:
    end(mode, arg)
if mode == "literal" and world.rank == 1:
    raise SystemExit(3)
if mode == "named" and world.rank == 1:
    raise SystemExit(arg)
if mode == "caught" and world.rank == 1:
    for stop in (sys.exit, exit):
        try:
            stop(arg)
        except SystemExit:
            pass
if mode == "os_exit" and world.rank == 1:
    os._exit(arg)
if mode in ("sigkill", "sigterm", "sigint") and world.rank == arg:
    os.kill(os.getpid(), getattr(signal, mode.upper()))
    time.sleep(30)  # a signal Python handles (SIGINT) is acted on here
if mode == "loop":
    sys.stdout.write(f"rank {world.rank}: ready\n")
    sys.stdout.flush()
    for _ in range(600):  # about a minute: the test ends it long before
        world.all_reduce(buf)
        time.sleep(0.1)
world.all_reduce(buf)
if mode in ("raise_all", "exit_all"):
    end(mode.split("_")[0], arg)
if mode == "literal_all":
    raise SystemExit
if mode == "caught":
    world.all_reduce(buf)
sys.stdout.write(f"rank {world.rank}: finished\n")  # one write: ranks share stdout
