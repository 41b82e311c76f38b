"""One rank fails in the way named by argv[1] while the others wait in a collective.

Modes: raise, sys_exit, os_exit, sigkill (rank 1, right after `import sbpflow`, while the
other ranks block in an all_reduce that rank 1 never joins); skip (rank 1 skips the second
all_reduce and ends its script); diverge (rank 1 skips the second all_reduce and waits in a
broadcast instead); exit_hook_raises (rank 1's `on_clean_exit` hook raises). Mode exit_hook
succeeds: every rank's hook runs a last all_reduce. In the other modes the job must end
with a non-zero status and a message naming rank 1.
"""

import os
import signal
import sys

import numpy as np

import sbpflow  # noqa: F401  (starts MPI and installs the failure handlers)
from sbpflow import comm

mode = sys.argv[1]
world = comm.world()
buf = np.ones(4, np.float32)
if mode == "exit_hook":
    # Hooks run at the end of the script, while collectives still work.
    def last_collective():
        total = world.all_reduce(np.array([world.rank + 1.0]))
        sys.stdout.write(f"rank {world.rank}: exit hook saw {total[0]:g}\n")

    comm.on_clean_exit(last_collective)
if mode == "exit_hook_raises" and world.rank == 1:
    def failing_hook():
        raise RuntimeError("exit hook failed on purpose")

    comm.on_clean_exit(failing_hook)
if world.rank == 1:
    if mode == "raise":
        raise RuntimeError("boom on purpose")
    if mode == "sys_exit":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(5)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
world.all_reduce(buf)
if world.rank == 1 and mode == "diverge":
    world.broadcast(buf, 0)
elif world.rank != 1 or mode not in ("skip", "diverge"):
    world.all_reduce(buf)
sys.stdout.write(f"rank {world.rank}: finished\n")  # one write: ranks share stdout
