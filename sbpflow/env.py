"""`flow.env`: where this process sits in the job (OneFlow's names).

Under a single process every answer is that of a world of one, and no MPI is started.
"""

from __future__ import annotations

from .comm import get_local_rank, get_local_world_size, get_node_size, get_rank, get_world_size

__all__ = ["get_local_rank", "get_local_world_size", "get_node_size", "get_rank",
           "get_world_size"]
