"""`flow.env`: where this process sits in the job (OneFlow's names), and job-wide switches.

Under a single process every answer is that of a world of one, and no MPI is started.
"""

from __future__ import annotations

from .comm import (
    divergence_check_enabled,
    get_local_rank,
    get_local_world_size,
    get_node_size,
    get_rank,
    get_world_size,
    set_divergence_check,
)
from .framework.global_tensor import consistency_check_enabled, set_consistency_check


def all_device_placement(device_type: str = "cpu"):
    """OneFlow's `flow.env.all_device_placement(type)`: a placement over every rank."""
    from .sbp.placement import Placement

    return Placement.all(device_type)


def check_global_consistency(on: bool = True) -> None:
    """Before each global op, all ranks compare its name, input metas, SBPs and placement;
    a rank whose program diverges then fails with both sides named instead of deadlocking.
    One all-gather per op, and every collective compared too: a debugging aid (on in the
    test suite; env var SBPFLOW_CHECK_GLOBAL=1 turns it on at start). Without it, the cheap
    divergence check (`check_divergence`) still runs."""
    set_consistency_check(on)


def global_consistency_checked() -> bool:
    return consistency_check_enabled()


def check_divergence(on: bool = True, *, first: int | None = None,
                     every: int | None = None) -> None:
    """The cheap divergence check, on by default in multi-process jobs: every collective and
    every global op folds (name, dtype, shape, SBP, call index) into a running hash per
    sequence; the ranks compare it with one tiny all-gather on each of the `first` calls (64)
    and then on one call in `every` (64). A rank that runs something else (another dtype,
    shape, op, or skips some calls) ends the job naming what each rank ran. Env var
    SBPFLOW_CHECK_DIVERGENCE=0 turns it off at start."""
    set_divergence_check(on, first=first, every=every)


def divergence_checked() -> bool:
    return divergence_check_enabled()


__all__ = ["all_device_placement", "check_divergence", "check_global_consistency",
           "divergence_checked", "get_local_rank", "get_local_world_size", "get_node_size",
           "get_rank", "get_world_size", "global_consistency_checked"]
