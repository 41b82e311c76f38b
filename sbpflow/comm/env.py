"""Where this process sits in the job, read from the MPI launcher's environment.

Nothing here imports mpi4py: a single process must not pay for MPI start-up, so the rank and
world size come from the variables every MPI launcher sets for its children (MPICH's and
Intel's hydra: PMI_*; Open MPI: OMPI_COMM_WORLD_*; MVAPICH: MV2_COMM_WORLD_*). RANK and
WORLD_SIZE are *outputs* (the launcher and `export_torch_style_vars` set them for user
scripts), never inputs: torchrun sets them too, and they do not mean an MPI job exists.
"""

from __future__ import annotations

import os

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def launched_world_size() -> int:
    """How many processes the MPI launcher started (1 when not under a launcher)."""
    size = _first_int(_SIZE_VARS)
    return size if size is not None and size > 0 else 1


def launched_rank() -> int:
    rank = _first_int(_RANK_VARS)
    return rank if rank is not None else 0


def launched_local_rank() -> int | None:
    """The rank among the processes on this machine, or None when the launcher did not say."""
    if launched_world_size() == 1:
        return 0
    return _first_int(_LOCAL_RANK_VARS)


def launched_local_world_size() -> int | None:
    if launched_world_size() == 1:
        return 1
    return _first_int(_LOCAL_SIZE_VARS)


def is_multi_process() -> bool:
    """True under an MPI launcher that started more than one process."""
    return launched_world_size() > 1


def export_torch_style_vars() -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (and, on one machine, MASTER_ADDR
    and MASTER_PORT) for scripts that read them.

    The launcher sets them already; this covers a plain `mpiexec -n N python script.py`.
    Values already present are kept (the launcher's agree with the MPI ones).
    """
    values = {"RANK": launched_rank(), "WORLD_SIZE": launched_world_size(),
              "LOCAL_RANK": launched_local_rank(),
              "LOCAL_WORLD_SIZE": launched_local_world_size()}
    if launched_local_world_size() == launched_world_size():  # one machine: rank 0 is here
        values.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=29500)  # torchrun's default port
    for name, value in values.items():
        if value is not None:
            os.environ.setdefault(name, str(value))
