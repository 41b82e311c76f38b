"""`flow.env`: where this process sits in the job (OneFlow's names), and job-wide switches.

Under a single process every answer is that of a world of one, and no MPI is started.
"""

from __future__ import annotations

from .comm import get_local_rank, get_local_world_size, get_node_size, get_rank, get_world_size
from .framework.global_tensor import consistency_check_enabled, set_consistency_check


def check_global_consistency(on: bool = True) -> None:
    """Before each global op, all ranks compare its name, input metas, SBPs and placement;
    a rank whose program diverges then fails with both sides named instead of deadlocking.
    One all-gather per op: a debugging aid (on in the test suite; env var
    SBPFLOW_CHECK_GLOBAL=1 turns it on at start)."""
    set_consistency_check(on)


def global_consistency_checked() -> bool:
    return consistency_check_enabled()


__all__ = ["check_global_consistency", "get_local_rank", "get_local_world_size",
           "get_node_size", "get_rank", "get_world_size", "global_consistency_checked"]
