"""Communicators: how ranks (processes) talk. OneFlow's ccl/transport/control layer.

`world()` is the communicator of all ranks: an MPI one (`mpi.MpiCommunicator`) under a
multi-process MPI launch, else `WorldOfOne`, which needs no MPI. A single process therefore
never imports mpi4py. A multi-process launch starts MPI when this package is imported and
installs the failure handlers (`faults`) and the collective watchdog (`watchdog`): a rank that
crashes, raises or exits non-zero ends the whole job within seconds, and a collective waiting
longer than `collective_timeout()` is reported on every rank and aborts the job.

Ranks that run different collectives (another dtype, shape or op, or one rank skipping some)
are caught by the divergence check (`communicator.SequenceCheck`, on by default: every call
is fingerprinted, the first calls and then a sample are compared across ranks), which ends the
job naming what each rank ran. `SBPFLOW_CHECK_DIVERGENCE=0` or `set_divergence_check(False)`
turns it off; `SBPFLOW_CHECK_GLOBAL=1` (`set_full_check`) compares every call.

Collectives here take NumPy arrays (see `Communicator`). The tensor-level user API
(`flow.comm.all_reduce(t)` and the rest, OneFlow's) lives in the user layer
(`sbpflow.distributed.collectives`), which installs its functions into this namespace with
`install_tensor_api`, so `flow.comm` is this package and this layer imports only `_core`.
"""

from __future__ import annotations

from . import env, faults, heartbeat
from .communicator import (
    Communicator,
    DivergenceError,
    ReduceOp,
    WorldOfOne,
    balanced_sizes,
    divergence_check_enabled,
    run_at_step,
    set_divergence_check,
    set_full_check,
)
from .faults import abort_job
from .watchdog import DEFAULT_TIMEOUT_S, collective_timeout, set_collective_timeout

_world: Communicator | None = None
_node_info: tuple[int, int, int] | None = None


def world() -> Communicator:
    """The communicator of every rank of the job (created once)."""
    global _world
    if _world is None:
        if env.is_multi_process():
            from .mpi import MpiCommunicator

            _world = MpiCommunicator.world()
        else:
            _world = WorldOfOne()
    return _world


def control() -> Communicator:
    """The control plane's communicator (plan agreement): the ranks of `world()` on a private
    MPI duplicate. Its collectives never meet the data collectives that the VM's comm stream
    or a running Plan issue on `world()` from other threads, so the main thread may run one
    at any point without draining those first. `world()` itself on one process."""
    w = world()
    return getattr(w, "control", w)


def is_multi_process() -> bool:
    return env.is_multi_process()


def get_rank() -> int:
    """This process's rank in the job (0 for a single process)."""
    return env.launched_rank()


def get_world_size() -> int:
    return env.launched_world_size()


def _nodes() -> tuple[int, int, int]:
    global _node_info
    if _node_info is None:
        comm = world()
        _node_info = comm.node_count() if hasattr(comm, "node_count") else (1, 0, 1)
    return _node_info


def get_local_rank() -> int:
    """This process's rank among the processes on its machine."""
    local = env.launched_local_rank()
    return local if local is not None else _nodes()[1]


def get_local_world_size() -> int:
    local = env.launched_local_world_size()
    return local if local is not None else _nodes()[2]


def get_node_size() -> int:
    """The number of machines in the job (OneFlow's name).

    Counted collectively under MPI (ranks sharing memory are one machine), so every rank
    must call it the first time; the answer is cached.
    """
    if not env.is_multi_process():
        return 1
    return _nodes()[0]


_TENSOR_API: tuple[str, ...] = ()


def install_tensor_api(functions: dict) -> None:
    """Publish the user layer's tensor-level collectives as `sbpflow.comm.<name>`."""
    global _TENSOR_API
    globals().update(functions)
    _TENSOR_API = tuple(functions)


_exit_hooks: list = []


def on_clean_exit(fn) -> None:
    """Run `fn()` when this rank's script ends normally, before the exit barrier.

    For work that must finish while every rank can still communicate (the VM drains its
    streams here). A hook that raises ends the job, as an uncaught exception does.
    """
    _exit_hooks.append(fn)


def _clean_exit() -> None:
    for fn in _exit_hooks:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - any failure here must end the job
            faults._excepthook(type(exc), exc, exc.__traceback__)
    if _world is not None:
        _world.exit_barrier()
    heartbeat.stop()


def _start_multi_process() -> None:
    env.export_torch_style_vars()
    # Handlers first, so that a failure while MPI starts also ends the job.
    faults.install(env.launched_rank(), env.launched_world_size(), _clean_exit)
    world()
    heartbeat.start()  # a rank cut off from the others ends the job in seconds


if env.is_multi_process():
    _start_multi_process()


__all__ = [
    "Communicator", "DEFAULT_TIMEOUT_S", "DivergenceError", "ReduceOp", "WorldOfOne",
    "abort_job", "balanced_sizes", "collective_timeout", "control", "divergence_check_enabled",
    "env",
    "get_local_rank", "get_local_world_size", "get_node_size", "get_rank", "get_world_size",
    "install_tensor_api", "is_multi_process", "on_clean_exit", "run_at_step",
    "set_collective_timeout", "set_divergence_check", "set_full_check", "world",
]
