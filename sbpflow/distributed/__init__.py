"""torch.distributed for sbpflow: process groups and collectives over MPI, and the launcher.

`python -m sbpflow.distributed.launch --nproc-per-node N script.py` starts a job (as
torchrun does); `init_process_group(backend)` and the collectives follow torch.distributed
(see `distributed_c10d`). OneFlow's `flow.comm` tensor collectives (ranks of a
`sbpflow.comm.Communicator`) are defined in `collectives` and published in `sbpflow.comm`
when this package is imported.
"""

from __future__ import annotations

from ..comm import get_local_rank, get_local_world_size, get_node_size, is_multi_process
from . import collectives, distributed_c10d  # collectives publishes flow.comm.all_reduce...
from .distributed_c10d import *  # noqa: F403
from .distributed_c10d import __all__ as _c10d_all

__all__ = [*_c10d_all, "collectives", "distributed_c10d", "get_local_rank", "get_local_world_size",
           "get_node_size", "is_multi_process"]
