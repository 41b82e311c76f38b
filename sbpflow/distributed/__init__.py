"""Multi-process training: the launcher, the rank environment and the tensor collectives.

`python -m sbpflow.distributed.launch --nproc-per-node N script.py` starts a job;
`sbpflow.comm` (`flow.comm`) holds the communicators and, once this package is imported,
the tensor-level collectives defined in `collectives`.
"""

from __future__ import annotations

from ..comm import (
    ReduceOp,
    get_local_rank,
    get_local_world_size,
    get_node_size,
    get_rank,
    get_world_size,
    is_multi_process,
)
from .collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
)

__all__ = [
    "ReduceOp", "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather",
    "get_local_rank", "get_local_world_size", "get_node_size", "get_rank", "get_world_size",
    "is_multi_process", "recv", "reduce", "reduce_scatter", "scatter", "send",
]
