"""One rank of a --nnodes job: its place, the rendezvous variables, and a sum over all ranks
(which only one job can compute).
`--fail-rank N`: rank N exits with status 3 instead. One write per line: the ranks share stdout."""

import os
import sys

import numpy as np

import sbpflow as flow
from sbpflow import comm

if "--fail-rank" in sys.argv and comm.get_rank() == int(sys.argv[-1]):
    sys.stdout.write(f"rank {comm.get_rank()} fails\n")
    sys.stdout.flush()
    sys.exit(3)
t = flow.tensor(np.array([comm.get_rank() + 1.0]))
flow.comm.all_reduce(t)
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
         "MASTER_PORT")
fields = {name: os.environ.get(name) for name in names}
fields.update(get_rank=comm.get_rank(), get_world_size=comm.get_world_size(),
              total=int(t.numpy()[0]), argv=",".join(sys.argv[1:]))
sys.stdout.write("ENV\t" + "\t".join(f"{k}={v}" for k, v in fields.items()) + "\n")
sys.stdout.flush()
