"""Two ranks for the heartbeat tests: `freeze_rank.py freeze|late`.

freeze: rank 1 stops itself (SIGSTOP) after one all-reduce while rank 0 goes on to the next:
only the heartbeat can tell, as rank 1's process exists and its connections are open.
late: rank 1 computes (sleeps) for 4 s after the all-reduce while rank 0 has ended and waits
at the exit barrier: both still beat, so nothing is wrong.
"""

import os
import signal
import sys
import time

import sbpflow as flow

mode = sys.argv[1]
rank = flow.comm.get_rank()
t = flow.ones(4)
flow.comm.all_reduce(t)
print(f"rank {rank}: first all_reduce done", flush=True)
if mode == "freeze":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    flow.comm.all_reduce(t)
elif rank == 1:
    time.sleep(4.0)
print(f"rank {rank}: finished", flush=True)
