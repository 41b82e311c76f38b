"""Print what a rank sees of its place in the job: tab-separated key=value pairs on one line."""

import os
import sys

import sbpflow  # noqa: F401
from sbpflow import comm

names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MPI_LOCALRANKID")
fields = {name: os.environ.get(name) for name in names}
fields.update(get_rank=comm.get_rank(), get_world_size=comm.get_world_size(),
              get_local_rank=comm.get_local_rank(), get_node_size=comm.get_node_size(),
              argv=",".join(sys.argv[1:]))
# One write per line: the ranks share stdout.
sys.stdout.write("ENV\t" + "\t".join(f"{k}={v}" for k, v in fields.items()) + "\n")
