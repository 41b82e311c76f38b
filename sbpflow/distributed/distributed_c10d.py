"""torch.distributed's process-group API over sbpflow's MPI communicators.

`init_process_group(backend)` makes the default process group from the MPI job: under
`python -m sbpflow.distributed.launch --nproc-per-node N script.py` or
`mpiexec -n N python -m mpi4py script.py` (a plain single process is a world of one). The
rendezvous is MPI's: ranks and world size are the MPI job's, and `init_method` ("env://",
"tcp://...", "file://...") is only checked against it: RANK and WORLD_SIZE in the environment
(the launcher sets them, and MASTER_ADDR/MASTER_PORT, as torchrun does) and the `rank` and
`world_size` arguments must agree with the MPI job, or init raises a ValueError saying how.

Backends: "mpi", "gloo" (and None) run over MPI on the CPU. "nccl" is accepted and runs over
MPI on the CPU too (sbpflow has no CUDA here), with a warning, once, saying so: scripts that
hard-code "nccl" run unchanged. `is_nccl_available()` is False, as for a CPU build of torch.

Collectives take torch's signatures. `src`/`dst` are global ranks (`group_src`/`group_dst`:
ranks within `group`), as torch's. They run when called (all_reduce and broadcast on the VM's
comm stream, in issue order with DDP's buckets): `async_op=True` returns a `Work` that is
already complete. `isend`/`irecv` run on a helper thread (MPI is initialised with
THREAD_MULTIPLE); their `Work.wait()` joins it. A rank outside a group gets
`GroupMember.NON_GROUP_MEMBER` from `new_group`, and collectives called with it warn and do
nothing, as torch's. The object collectives pickle (the peers are the job's own ranks, not
files); tensors inside objects travel as arrays.
"""

from __future__ import annotations

import datetime
import enum
import os
import pickle
import threading
import warnings

import numpy as np

from .. import comm as _comm
from ..autograd import no_grad
from ..framework.serialization import dumps_with_tensors
from ..framework.tensor import Tensor
from . import collectives as _c

# -- backends, reduce ops, groups -------------------------------------------------------------


class Backend(str):
    """torch.distributed.Backend: a lower-case backend name."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    backend_list = [UNDEFINED, GLOO, NCCL, MPI]

    def __new__(cls, name: str):
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, got {name!r}")
        value = name.lower()
        if value == "undefined" or not all(_backend_ok(p) for p in value.split(",")):
            raise ValueError(f"Invalid backend: '{name}'")
        return str.__new__(cls, value)


def _backend_ok(part: str) -> bool:
    # "gloo" or a per-device form like "cpu:gloo" / "cuda:nccl"
    name = part.split(":", 1)[1] if ":" in part else part
    return name.strip() in ("gloo", "nccl", "mpi")


class RedOpType(enum.Enum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9

    def __repr__(self):
        return f"<RedOpType.{self.name}: {self.value}>"


class ReduceOp:
    """torch.distributed.ReduceOp: `ReduceOp.SUM` and the others are `RedOpType` members."""

    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM


_TO_COMM = {RedOpType.SUM: _comm.ReduceOp.SUM, RedOpType.PRODUCT: _comm.ReduceOp.PROD,
            RedOpType.MIN: _comm.ReduceOp.MIN, RedOpType.MAX: _comm.ReduceOp.MAX,
            RedOpType.AVG: _comm.ReduceOp.SUM}


def _reduce_op(fn: str, op, t: Tensor | None) -> tuple[_comm.ReduceOp, bool]:
    """(the communicator's op, whether to divide by the group size afterwards: AVG)."""
    if isinstance(op, RedOpType):
        if op not in _TO_COMM:
            raise NotImplementedError(
                f"{fn}: ReduceOp.{op.name} is not supported by sbpflow's MPI backend "
                "(supported: SUM, AVG, PRODUCT, MIN, MAX)")
        if op is RedOpType.AVG and t is not None and not t.dtype.is_floating_point:
            raise RuntimeError(f"{fn}: ReduceOp.AVG needs a floating-point tensor: result "
                               f"type Float can't be cast to the desired output type {t.dtype}")
        return _TO_COMM[op], op is RedOpType.AVG
    return _comm.ReduceOp.parse(op), False  # flow.comm's ReduceOp and "sum"/"max"/...


class ProcessGroup:
    """A group of ranks running collectives together (wraps a sbpflow communicator)."""

    def __init__(self, communicator: _comm.Communicator, backend: str, name: str):
        self.communicator = communicator
        self.ranks = list(communicator.world_ranks)  # global rank of each member, in order
        self._backend = backend
        self._name = name
        self._destroyed = False

    def rank(self) -> int:
        return self.communicator.rank

    def size(self) -> int:
        return self.communicator.size

    def name(self) -> str:
        return self._name

    @property
    def group_name(self) -> str:
        return self._name

    def __repr__(self):
        return f"<ProcessGroup {self._name} ({self._backend}): ranks {self.ranks}>"


class _NonGroupMember:
    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


_NON_MEMBER = _NonGroupMember()
_default: ProcessGroup | None = None
_groups: list[ProcessGroup] = []
_nccl_warned = False


class _WorldMeta(type):
    @property
    def WORLD(cls):  # noqa: N802 - torch's name
        return _default


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's name
    """`group.WORLD`: the default process group (None before init_process_group)."""


class GroupMember(metaclass=_WorldMeta):
    NON_GROUP_MEMBER = _NON_MEMBER


_NOT_INIT = ("Default process group has not been initialized, please make sure to call "
             "init_process_group.")


def _world_pg() -> ProcessGroup:
    if _default is None:
        raise ValueError(_NOT_INIT)
    return _default


def _pg(fn: str, grp) -> ProcessGroup | None:
    """The process group a call runs on; None for a rank outside `grp` (the call warns and
    does nothing, as torch's)."""
    if grp is None:
        return _world_pg()
    if grp is _NON_MEMBER:
        warnings.warn(f"Running {fn} on global rank {_comm.get_rank()} which does not belong "
                      "to the given group.", stacklevel=3)
        return None
    if isinstance(grp, ProcessGroup):
        _world_pg()
        if grp._destroyed:
            raise ValueError(f"{fn}: {grp!r} was destroyed (destroy_process_group)")
        return grp
    if isinstance(grp, _comm.Communicator):  # a flow.comm communicator, for interop
        return ProcessGroup(grp, _default._backend if _default else "mpi", grp.name)
    raise TypeError(f"{fn}: group must be a ProcessGroup from new_group (or None for the "
                    f"default group), got {type(grp).__name__}")


def _group_rank(fn: str, pg: ProcessGroup, arg: str, global_rank, group_rank) -> int:
    """A rank argument as a rank of `pg`: torch's `src`/`dst` are global ranks,
    `group_src`/`group_dst` ranks within the group."""
    if global_rank is not None and group_rank is not None:
        raise ValueError(f"{fn}: give {arg} or group_{arg}, not both")
    if group_rank is not None:
        if not isinstance(group_rank, int) or not 0 <= group_rank < pg.size():
            raise ValueError(f"{fn}: group_{arg} must be a rank in [0, {pg.size()}) of "
                             f"{pg!r}, got {group_rank!r}")
        return group_rank
    if global_rank is None:
        global_rank = 0
    if not isinstance(global_rank, (int, np.integer)):
        raise TypeError(f"{fn}: {arg} must be an int rank, got {type(global_rank).__name__}")
    if int(global_rank) not in pg.ranks:
        raise ValueError(f"{fn}: global rank {global_rank} ({arg}) is not part of group "
                         f"{pg!r}")
    return pg.ranks.index(int(global_rank))


class Store:
    """torch.distributed's key-value stores are not provided: sbpflow's rendezvous is MPI's."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"torch.distributed.{type(self).__name__} is not supported by sbpflow: ranks meet "
            "through MPI (init_process_group needs no store)")


class TCPStore(Store):
    pass


class FileStore(Store):
    pass


class HashStore(Store):
    pass


class PrefixStore(Store):
    pass


# -- work objects -------------------------------------------------------------------------------


class _Future:
    def __init__(self, work: Work):
        self._work = work

    def wait(self):
        self._work.wait()
        return self._work.result()

    def value(self):
        return self.wait()

    def done(self) -> bool:
        return self._work.is_completed()

    def then(self, callback):
        self.wait()
        return _DoneFuture(callback(self))


class _DoneFuture:
    def __init__(self, value):
        self._value = value

    def wait(self):
        return self._value

    value = wait

    def done(self) -> bool:
        return True


class Work:
    """What an `async_op=True` collective returns. The collectives run when called, so the
    work is complete already; isend/irecv finish on a helper thread that `wait` joins."""

    def __init__(self, result=None, thread: threading.Thread | None = None, finish=None):
        self._result = result if result is not None else []
        self._thread = thread
        self._finish = finish  # runs on the caller's thread once the helper thread is done
        self._error: BaseException | None = None

    def wait(self, timeout=None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout.total_seconds() if isinstance(timeout, datetime.timedelta)
                              else timeout)
            if self._thread.is_alive():
                raise RuntimeError("Work.wait: timed out waiting for the operation")
            self._thread = None
            if self._error is not None:
                raise self._error
            if self._finish is not None:
                self._finish()
                self._finish = None
        return True

    def is_completed(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list:
        return list(self._result)

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> _Future:
        return _Future(self)


def _done(async_op: bool, *tensors):
    return Work([t for t in tensors if isinstance(t, Tensor)]) if async_op else None


# -- init and groups ----------------------------------------------------------------------------


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


def is_gloo_available() -> bool:
    return True  # "gloo" runs over MPI


def is_nccl_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_initialized() -> bool:
    return _default is not None


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: "
                         f"environment variable {name} must be an integer, got {value!r}"
                         ) from None


def _mismatch(what: str, given, actual, comm) -> ValueError:
    return ValueError(
        f"init_process_group: {what} is {given}, but this process is rank {comm.rank} of an "
        f"MPI job of {comm.size} rank(s). sbpflow's rendezvous is MPI's: start N ranks with "
        "`python -m sbpflow.distributed.launch --nproc-per-node N script.py` or "
        "`mpiexec -n N python -m mpi4py script.py`"
    )


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: datetime.timedelta | None = None, world_size: int = -1,
                       rank: int = -1, store=None, group_name: str = "", pg_options=None,
                       device_id=None) -> None:
    """Make the default process group: every rank of the MPI job (see the module doc)."""
    global _default, _nccl_warned
    if _default is not None:  # torch 2.13 raises ValueError here
        raise ValueError("trying to initialize the default process group twice!")
    try:
        name = Backend(backend) if backend is not None else Backend.MPI
    except ValueError:  # torch's type for an unknown backend
        raise AssertionError(f"Unknown backend type {backend} (sbpflow supports 'mpi', "
                             "'gloo' and 'nccl', all over MPI)") from None
    # The CPU half decides what CPU tensors use: "nccl" alone (or no cpu part) means NCCL.
    cpu_parts = [p.split(":", 1)[-1] for p in name.split(",")
                 if ":" not in p or p.startswith("cpu:")]
    if (not cpu_parts or "nccl" in cpu_parts) and not _nccl_warned:
        _nccl_warned = True
        warnings.warn(f"init_process_group: backend {backend!r}: sbpflow runs NCCL's "
                      "collectives over MPI on the CPU (no CUDA/NCCL here); results are the "
                      "same", UserWarning, stacklevel=2)
    if store is not None:
        raise NotImplementedError(
            "init_process_group: store= is not supported: sbpflow's rendezvous is the MPI "
            "job's (leave store unset)")
    if timeout is not None:
        if not isinstance(timeout, datetime.timedelta):
            raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got "
                            f"{type(timeout).__name__}")
        _comm.set_collective_timeout(timeout.total_seconds())
    if init_method is not None and not (
        isinstance(init_method, str) and init_method.split("://", 1)[0] in ("env", "tcp", "file")
        and "://" in init_method
    ):
        raise ValueError(f"init_process_group: init_method must be 'env://', 'tcp://...' or "
                         f"'file://...', got {init_method!r}")
    comm = _comm.world()
    if isinstance(init_method, str) and init_method.startswith("env://"):
        for var in ("RANK", "WORLD_SIZE"):
            if var not in os.environ and not (var == "RANK" and rank != -1) and not (
                    var == "WORLD_SIZE" and world_size != -1):
                raise ValueError(f"Error initializing torch.distributed using env:// "
                                 f"rendezvous: environment variable {var} expected, but not "
                                 "set")
    env_rank, env_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if env_size is not None and env_size != comm.size:
        raise _mismatch("WORLD_SIZE (environment)", env_size, comm.size, comm)
    if env_rank is not None and env_rank != comm.rank:
        raise _mismatch("RANK (environment)", env_rank, comm.rank, comm)
    if world_size != -1 and world_size != comm.size:
        raise _mismatch("world_size", world_size, comm.size, comm)
    if rank != -1 and rank != comm.rank:
        raise _mismatch("rank", rank, comm.rank, comm)
    _default = ProcessGroup(comm, str(name), group_name or "default_pg")
    _groups.append(_default)


def destroy_process_group(group=None) -> None:
    """Destroy `group`, or (None) the default group and every group made from it."""
    global _default
    if group is None or group is _default:
        if _default is None:
            raise AssertionError("Process group cannot be None")
        _c._after_comm_stream()
        for pg in _groups:
            pg._destroyed = True
        _groups.clear()
        _default = None
        return
    if group is _NON_MEMBER:
        return
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"destroy_process_group: expected a ProcessGroup, got "
                        f"{type(group).__name__}")
    group._destroyed = True
    if group in _groups:
        _groups.remove(group)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization: bool = False, group_desc=None, device_id=None,
              sort_ranks: bool = True):
    """A process group of `ranks` (global ranks; default all). Every rank of the job calls
    it, as in torch; ranks outside it get `GroupMember.NON_GROUP_MEMBER`."""
    world = _world_pg()
    size = world.size()
    if ranks is None:
        ranks = list(range(size))
    ranks = [int(r) for r in ranks]
    if len(set(ranks)) != len(ranks) or not all(0 <= r < size for r in ranks):
        raise ValueError(f"new_group: ranks must be distinct ranks in [0, {size}), got {ranks}")
    if not ranks:
        raise ValueError("new_group: ranks must not be empty")
    if sort_ranks:
        ranks = sorted(ranks)
    name = Backend(backend) if backend is not None else world._backend
    if world.rank() not in ranks:
        return _NON_MEMBER
    _c._after_comm_stream()
    sub = world.communicator.group([world.ranks.index(r) for r in ranks])
    pg = ProcessGroup(sub, str(name), group_desc or f"group{ranks}")
    _groups.append(pg)
    return pg


def get_rank(group=None) -> int:
    pg = _pg_quiet(group)
    return -1 if pg is None else pg.rank()


def get_world_size(group=None) -> int:
    pg = _pg_quiet(group)
    return -1 if pg is None else pg.size()


def _pg_quiet(grp) -> ProcessGroup | None:
    if grp is _NON_MEMBER:
        _world_pg()
        return None
    return _pg("get_rank", grp)


def get_backend(group=None) -> Backend:
    pg = _pg_quiet(group)
    if pg is None:
        raise ValueError("Invalid process group specified")
    return Backend(pg._backend)


def get_process_group_ranks(group) -> list[int]:
    pg = _pg_quiet(group)
    if pg is None:
        raise ValueError("get_process_group_ranks: this rank is not in the group")
    return list(pg.ranks)


def get_global_rank(group, group_rank: int) -> int:
    pg = _pg_quiet(group)
    if pg is None or not 0 <= group_rank < pg.size():
        raise ValueError(f"Group rank {group_rank} is not part of group {group!r}")
    return pg.ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    pg = _pg_quiet(group)
    if pg is None or global_rank not in pg.ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group!r}")
    return pg.ranks.index(global_rank)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not in the environment. Consider passing fallback_rank "
                       "to allow `get_node_local_rank` to work, assuming you are not running "
                       "in a multi-device context and want the code to run locally instead.")


# -- tensor collectives ------------------------------------------------------------------------


def _divide(t: Tensor, n: int) -> None:
    with no_grad():
        t.div_(n)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """Reduce `tensor` over the group's ranks, in place on every rank."""
    pg = _pg("all_reduce", group)
    if pg is None:
        return None
    _c._local("all_reduce", "tensor", tensor)
    cop, avg = _reduce_op("all_reduce", op, tensor)
    comm = pg.communicator

    def run(a):
        out = comm.all_reduce(np.ascontiguousarray(a), cop, out=np.empty(a.shape, a.dtype))
        if avg:
            out = (out.astype(np.float64) / comm.size).astype(a.dtype)
        return out

    _c._on_comm_stream("all_reduce", tensor, run)
    return _done(async_op, tensor)


def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False,
              group_src: int | None = None):
    """Overwrite `tensor` on every rank of the group with global rank `src`'s."""
    pg = _pg("broadcast", group)
    if pg is None:
        return None
    _c.broadcast(tensor, _group_rank("broadcast", pg, "src", src, group_src), pg.communicator)
    return _done(async_op, tensor)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """`tensor_list[i]` becomes group rank i's `tensor`."""
    pg = _pg("all_gather", group)
    if pg is None:
        return None
    _c.all_gather(tensor_list, tensor, pg.communicator)
    return _done(async_op, *tensor_list)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """`output_tensor` (group size x input, concatenated or stacked along dim 0) becomes every
    rank's `input_tensor` in rank order."""
    pg = _pg("all_gather_into_tensor", group)
    if pg is None:
        return None
    _c._after_comm_stream()
    _c._local("all_gather_into_tensor", "output_tensor", output_tensor)
    _c._local("all_gather_into_tensor", "input_tensor", input_tensor)
    comm = pg.communicator
    n = input_tensor.numel()
    if output_tensor.numel() != n * comm.size or output_tensor.dtype is not input_tensor.dtype:
        raise ValueError(
            f"all_gather_into_tensor: output_tensor is {output_tensor.dtype} "
            f"{list(output_tensor.shape)}, expected {input_tensor.dtype} with {comm.size} x "
            f"{n} elements (group size x input_tensor {list(input_tensor.shape)})")
    gathered = comm.all_gather(_c._flat(input_tensor), sizes=[n] * comm.size)
    _c._write(output_tensor, gathered)
    return _done(async_op, output_tensor)


def _reduce_scatter_flat(fn, output, send, sizes, op, pg):
    cop, avg = _reduce_op(fn, op, output)
    comm = pg.communicator
    result = comm.reduce_scatter(send, cop, sizes=sizes)
    if avg:
        result = (result.astype(np.float64) / comm.size).astype(result.dtype)
    _c._write(output, result)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None,  # noqa: A002
                          async_op: bool = False):
    """Reduce `input` (group size x output elements) over ranks; rank i keeps block i."""
    pg = _pg("reduce_scatter_tensor", group)
    if pg is None:
        return None
    _c._after_comm_stream()
    _c._local("reduce_scatter_tensor", "output", output)
    _c._local("reduce_scatter_tensor", "input", input)
    n, size = output.numel(), pg.size()
    if input.numel() != n * size or input.dtype is not output.dtype:
        raise ValueError(
            f"reduce_scatter_tensor: input is {input.dtype} {list(input.shape)}, expected "
            f"{output.dtype} with {size} x {n} elements (group size x output "
            f"{list(output.shape)})")
    _reduce_scatter_flat("reduce_scatter_tensor", output, _c._flat(input), [n] * size, op, pg)
    return _done(async_op, output)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
    """`output` on group rank i becomes the reduction of every rank's `input_list[i]`."""
    pg = _pg("reduce_scatter", group)
    if pg is None:
        return None
    _c._after_comm_stream()
    _c._local("reduce_scatter", "output", output)
    ins = _c._tensor_list("reduce_scatter", "input_list", input_list, pg.size(), None)
    mine = ins[pg.rank()]
    if mine.numel() != output.numel() or mine.dtype is not output.dtype:
        raise ValueError(f"reduce_scatter: output is {output.dtype} {list(output.shape)} but "
                         f"input_list[{pg.rank()}] is {mine.dtype} {list(mine.shape)}")
    send = np.concatenate([_c._flat(t) for t in ins])
    _reduce_scatter_flat("reduce_scatter", output, send, [t.numel() for t in ins], op, pg)
    return _done(async_op, output)


def reduce(tensor, dst: int | None = None, op=ReduceOp.SUM, group=None,
           async_op: bool = False, group_dst: int | None = None):
    """Reduce `tensor` over the group into global rank `dst`'s `tensor`."""
    pg = _pg("reduce", group)
    if pg is None:
        return None
    root = _group_rank("reduce", pg, "dst", dst, group_dst)
    cop, avg = _reduce_op("reduce", op, tensor)
    _c.reduce(tensor, root, cop, pg.communicator)
    if avg and pg.rank() == root:
        _divide(tensor, pg.size())
    return _done(async_op, tensor)


def gather(tensor, gather_list=None, dst: int | None = None, group=None,
           async_op: bool = False, group_dst: int | None = None):
    """On global rank `dst`, `gather_list[i]` becomes group rank i's `tensor`."""
    pg = _pg("gather", group)
    if pg is None:
        return None
    root = _group_rank("gather", pg, "dst", dst, group_dst)
    if pg.rank() != root and gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination "
                         "ranks.")
    _c.gather(tensor, gather_list, root, pg.communicator)
    return _done(async_op, *(gather_list or []))


def scatter(tensor, scatter_list=None, src: int | None = None, group=None,
            async_op: bool = False, group_src: int | None = None):
    """Every rank's `tensor` becomes `scatter_list[its group rank]` of global rank `src`."""
    pg = _pg("scatter", group)
    if pg is None:
        return None
    root = _group_rank("scatter", pg, "src", src, group_src)
    if pg.rank() != root and scatter_list:
        raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source "
                         "ranks.")
    _c.scatter(tensor, scatter_list, root, pg.communicator)
    return _done(async_op, tensor)


def all_gather_single(output_tensor, input_tensor, group=None, async_op: bool = False):
    """torch 2.13's new name for `all_gather_into_tensor`."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def reduce_scatter_single(output, input, op=ReduceOp.SUM, group=None,  # noqa: A002
                          async_op: bool = False):
    """torch 2.13's new name for `reduce_scatter_tensor`."""
    return reduce_scatter_tensor(output, input, op, group, async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
    """Rank i's `input_tensor_list[j]` lands in rank j's `output_tensor_list[i]`."""
    pg = _pg("all_to_all", group)
    if pg is None:
        return None
    _c.all_to_all(output_tensor_list, input_tensor_list, pg.communicator)
    return _done(async_op, *output_tensor_list)


def all_to_all_single(output, input, output_split_sizes=None,  # noqa: A002
                      input_split_sizes=None, group=None, async_op: bool = False):
    """all_to_all on dim 0 of one tensor: block j of `input` (`input_split_sizes[j]` rows,
    default equal) goes to rank j; `output` holds the received blocks in rank order."""
    pg = _pg("all_to_all_single", group)
    if pg is None:
        return None
    _c._after_comm_stream()
    _c._local("all_to_all_single", "output", output)
    _c._local("all_to_all_single", "input", input)
    size = pg.size()
    if input.dtype is not output.dtype or tuple(input.shape[1:]) != tuple(output.shape[1:]):
        raise ValueError(f"all_to_all_single: output {output.dtype} {list(output.shape)} and "
                         f"input {input.dtype} {list(input.shape)} must agree in dtype and in "
                         "every dim but the first")

    def splits(arg, given, rows):
        if given is None or len(given) == 0:
            if rows % size:
                raise ValueError(f"all_to_all_single: {rows} rows of {arg} do not split "
                                 f"evenly over {size} ranks; give {arg}_split_sizes")
            return [rows // size] * size
        given = [int(s) for s in given]
        if len(given) != size or sum(given) != rows:
            raise ValueError(f"all_to_all_single: {arg}_split_sizes {given} must give {size} "
                             f"counts adding up to {rows}")
        return given

    if input.dim() == 0 or output.dim() == 0:
        raise ValueError("all_to_all_single: input and output need at least one dim")
    send_sizes = splits("input", input_split_sizes, input.shape[0])
    recv_sizes = splits("output", output_split_sizes, output.shape[0])
    got = pg.communicator.all_to_all(np.ascontiguousarray(input._host()), send_sizes,
                                     recv_sizes)
    _c._write(output, got)
    return _done(async_op, output)


def barrier(group=None, async_op: bool = False, device_ids=None, timeout=None):
    """Wait until every rank of the group has reached this barrier."""
    pg = _pg("barrier", group)
    if pg is None:
        return None
    _c.barrier(pg.communicator)
    return _done(async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier; a rank that never arrives is reported by sbpflow's collective watchdog."""
    barrier(group)


# -- point to point ------------------------------------------------------------------------------


def _p2p_peer(fn: str, pg: ProcessGroup, arg: str, peer, group_peer) -> int:
    if peer is None and group_peer is None:
        if arg == "src":
            raise NotImplementedError(f"{fn}: receiving from any source (src=None) is not "
                                      "supported by sbpflow's MPI backend; give src")
        raise ValueError(f"{fn}: {arg} must be given")
    r = _group_rank(fn, pg, arg, peer, group_peer)
    if r == pg.rank():
        raise ValueError(f"Invalid {'source' if arg == 'src' else 'destination'} rank: "
                         f"should not be the same as the rank of the current process.")
    return r


def send(tensor, dst: int | None = None, group=None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send `tensor`'s data to global rank `dst` (which receives it with `recv`)."""
    pg = _pg("send", group)
    if pg is None:
        return None
    peer = _p2p_peer("send", pg, "dst", dst, group_dst)
    _c._after_comm_stream()
    _c._local("send", "tensor", tensor)
    pg.communicator.send(np.ascontiguousarray(tensor._host()), peer, tag)
    return None


def recv(tensor, src: int | None = None, group=None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into `tensor` from global rank `src`; returns the sender's rank."""
    pg = _pg("recv", group)
    if pg is None:
        return -1
    peer = _p2p_peer("recv", pg, "src", src, group_src)
    _c._after_comm_stream()
    _c._local("recv", "tensor", tensor)
    buf = np.empty(tuple(tensor.shape), tensor.dtype.np)
    pg.communicator.recv(buf, peer, tag)
    _c._write(tensor, buf)
    return pg.ranks[peer]


def _threaded(fn, work: Work) -> threading.Thread:
    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised by Work.wait
            work._error = e

    return threading.Thread(target=run, name="sbpflow-p2p", daemon=True)


def isend(tensor, dst: int | None = None, group=None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Send without blocking; the returned Work's `wait()` returns once it is sent."""
    pg = _pg("isend", group)
    if pg is None:
        return None
    peer = _p2p_peer("isend", pg, "dst", dst, group_dst)
    _c._after_comm_stream()
    _c._local("isend", "tensor", tensor)
    data = np.array(tensor._host(), order="C")  # a snapshot: the caller may reuse tensor
    work = Work([tensor])
    work._thread = _threaded(lambda: pg.communicator.send(data, peer, tag), work)
    work._thread.start()
    return work


def irecv(tensor, src: int | None = None, group=None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Receive without blocking; `tensor` holds the data once the Work's `wait()` returns."""
    pg = _pg("irecv", group)
    if pg is None:
        return None
    peer = _p2p_peer("irecv", pg, "src", src, group_src)
    _c._after_comm_stream()
    _c._local("irecv", "tensor", tensor)
    buf = np.empty(tuple(tensor.shape), tensor.dtype.np)
    work = Work([tensor], finish=lambda: _c._write(tensor, buf))
    work._thread = _threaded(lambda: pg.communicator.recv(buf, peer, tag), work)
    work._thread.start()
    return work


class P2POp:
    """One isend/irecv for `batch_isend_irecv`."""

    def __init__(self, op, tensor, peer: int | None = None, group=None, tag: int = 0,
                 group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed"
                             ".isend`` or ``torch.distributed.irecv``.")
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list: list) -> list:
    """Start every P2POp; returns their Work objects."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("batch_isend_irecv: expected a non-empty list of P2POp")
    return [p.op(p.tensor, p.peer, p.group, p.tag, p.group_peer) for p in p2p_op_list]


# -- object collectives (pickle: the peers are this job's own ranks) -----------------------------


def _to_bytes_array(obj) -> np.ndarray:
    return np.frombuffer(dumps_with_tensors(obj), np.uint8).copy()


def _from_bytes(buf: np.ndarray):
    return pickle.loads(buf.tobytes())


def _gathered_bytes(comm, data: np.ndarray, root: int | None) -> list | None:
    lens = comm.all_gather(np.array([data.size], np.int64)) if root is None else None
    if root is None:
        flat = comm.all_gather(data, sizes=[int(n) for n in lens])
    else:
        lens = comm.gather(np.array([data.size], np.int64), root)
        flat = comm.gather(data, root, sizes=None)
        if comm.rank != root:
            return None
    out, start = [], 0
    for n in lens:
        out.append(flat[start:start + int(n)])
        start += int(n)
    return out


def _object_list(fn: str, arg: str, lst, size: int) -> list:
    if not isinstance(lst, list) or len(lst) != size:
        got = len(lst) if isinstance(lst, list) else type(lst).__name__
        raise ValueError(f"{fn}: {arg} must be a list of {size} entries (the group size), got "
                         f"{got}")
    return lst


def all_gather_object(object_list: list, obj, group=None) -> None:
    """`object_list[i]` becomes group rank i's `obj` (pickled)."""
    pg = _pg("all_gather_object", group)
    if pg is None:
        return None
    _object_list("all_gather_object", "object_list", object_list, pg.size())
    _c._after_comm_stream()
    for i, b in enumerate(_gathered_bytes(pg.communicator, _to_bytes_array(obj), None)):
        object_list[i] = _from_bytes(b)
    return None


def gather_object(obj, object_gather_list=None, dst: int | None = None, group=None,
                  group_dst: int | None = None) -> None:
    """On global rank `dst`, `object_gather_list[i]` becomes group rank i's `obj`."""
    pg = _pg("gather_object", group)
    if pg is None:
        return None
    root = _group_rank("gather_object", pg, "dst", dst, group_dst)
    if pg.rank() == root:
        _object_list("gather_object", "object_gather_list", object_gather_list, pg.size())
    _c._after_comm_stream()
    got = _gathered_bytes(pg.communicator, _to_bytes_array(obj), root)
    if got is not None:
        for i, b in enumerate(got):
            object_gather_list[i] = _from_bytes(b)
    return None


def broadcast_object_list(object_list: list, src: int | None = None, group=None, device=None,
                          group_src: int | None = None) -> None:
    """Every rank's `object_list` (same length everywhere) becomes global rank `src`'s."""
    pg = _pg("broadcast_object_list", group)
    if pg is None:
        return None
    root = _group_rank("broadcast_object_list", pg, "src", src, group_src)
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list: object_list must be a list, got "
                        f"{type(object_list).__name__}")
    comm = pg.communicator
    _c._after_comm_stream()
    if comm.rank == root:
        parts = [_to_bytes_array(o) for o in object_list]
        lens = np.array([p.size for p in parts], np.int64)
    else:
        lens = np.empty(len(object_list), np.int64)
    count = np.array([lens.size], np.int64)
    comm.broadcast(count, root)
    if int(count[0]) != len(object_list):
        raise ValueError(f"broadcast_object_list: object_list has {len(object_list)} entries "
                         f"on rank {_comm.get_rank()} but {int(count[0])} on the source")
    comm.broadcast(lens, root)
    flat = (np.concatenate(parts) if comm.rank == root and parts else
            np.empty(int(lens.sum()), np.uint8))
    comm.broadcast(flat, root)
    if comm.rank != root:
        start = 0
        for i, n in enumerate(lens):
            object_list[i] = _from_bytes(flat[start:start + int(n)])
            start += int(n)
    return None


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list=None,
                        src: int | None = None, group=None,
                        group_src: int | None = None) -> None:
    """`scatter_object_output_list[0]` on each rank becomes global rank `src`'s
    `scatter_object_input_list[its group rank]`."""
    pg = _pg("scatter_object_list", group)
    if pg is None:
        return None
    root = _group_rank("scatter_object_list", pg, "src", src, group_src)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    comm = pg.communicator
    _c._after_comm_stream()
    if comm.rank == root:
        ins = _object_list("scatter_object_list", "scatter_object_input_list",
                           scatter_object_input_list, pg.size())
        parts = [_to_bytes_array(o) for o in ins]
        lens = np.array([p.size for p in parts], np.int64)
        flat = np.concatenate(parts)
    else:
        lens, flat = np.empty(pg.size(), np.int64), None
    comm.broadcast(lens, root)
    mine = np.empty(int(lens[comm.rank]), np.uint8)
    comm.scatter(mine, flat, root, sizes=[int(n) for n in lens])
    scatter_object_output_list[0] = _from_bytes(mine)
    return None


__all__ = [
    "Backend", "FileStore", "GroupMember", "HashStore", "P2POp", "PrefixStore", "ProcessGroup",
    "ReduceOp", "Store", "TCPStore", "Work", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_single", "all_reduce", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "destroy_process_group",
    "gather", "gather_object", "get_backend", "get_global_rank", "get_group_rank",
    "get_node_local_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
    "init_process_group", "irecv", "is_available", "is_gloo_available", "is_initialized",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "is_ucc_available",
    "isend", "monitored_barrier", "new_group", "recv", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
]
