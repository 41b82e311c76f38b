"""OneFlow's `flow.comm` collectives on local tensors.

`all_reduce` and `broadcast` run as collective instructions on the VM's comm stream, writing
the tensor in place, and return once done.  The others first wait for the comm stream to
drain (so every collective keeps one issue order), then read the tensors' host arrays
(`_host()` waits for their writers), run the array collective of `sbpflow.comm`, and write
results back with the framework's own in-place assignment (`copy_` under `no_grad`), so
version counters move as for any in-place op. Like torch.distributed's,
these collectives are not recorded by autograd.

Every rank must call the same collectives in the same order with matching shapes; `group`
(default: all ranks) is a communicator from `sbpflow.comm.world().group(ranks)`, and ranks
(`src`, `dst`) are ranks of that group. On import this module publishes its functions as
`sbpflow.comm.<name>` (`flow.comm.all_reduce(t)`).
"""

from __future__ import annotations

import numpy as np

from .. import comm as _comm
from .._core import dtype as _dt
from ..autograd import no_grad
from ..comm import ReduceOp
from ..framework.functional.creation import empty, from_numpy
from ..framework.tensor import Tensor
from ..vm import InstructionsBuilder

_builder = InstructionsBuilder()

_MAX_NDIM = 14
_META_LEN = 2 + _MAX_NDIM  # ndim, dtype index, shape padded with zeros


def _group(group) -> _comm.Communicator:
    if group is None:
        return _comm.world()
    if not isinstance(group, _comm.Communicator):
        raise TypeError(f"group must be a sbpflow.comm.Communicator, got {type(group).__name__}")
    return group


def _local(op: str, arg: str, t) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {arg} must be a Tensor, got {type(t).__name__}")
    if t.is_global:
        raise TypeError(f"{op}: {arg} must be a local tensor; global tensors move with "
                        "to_global")
    return t


def _tensor_list(op: str, arg: str, tensors, size: int, like: Tensor | None) -> list:
    if not isinstance(tensors, (list, tuple)) or len(tensors) != size:
        got = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise ValueError(f"{op}: {arg} must be a list of {size} tensors (one per rank), got "
                         f"{got}")
    for i, t in enumerate(tensors):
        _local(op, f"{arg}[{i}]", t)
        if like is not None and (t.shape != like.shape or t.dtype is not like.dtype):
            raise ValueError(
                f"{op}: {arg}[{i}] is {t.dtype} {list(t.shape)}, expected {like.dtype} "
                f"{list(like.shape)}"
            )
    return list(tensors)


def _flat(t: Tensor) -> np.ndarray:
    return t._host().reshape(-1)


def _write(t: Tensor, values: np.ndarray) -> None:
    with no_grad():
        t.copy_(from_numpy(np.ascontiguousarray(values).reshape(tuple(t.shape))))


def _on_comm_stream(name: str, tensor: Tensor, fn) -> None:
    """Run fn(array) -> new values as a collective instruction on the VM's comm stream,
    writing tensor's memory in place: ordered after the tensor's earlier writers and readers,
    before its later readers, and in issue order with every other collective."""
    blob = tensor._blob

    def run():
        arr = blob.array
        np.copyto(arr, fn(arr))

    instr = _builder.collective(name, run, ins=(blob,), outs=(blob,),
                                writes=(tensor._storage,))
    tensor._storage.version += 1
    # Wait for it: the array-level collectives of sbpflow.comm (and raw mpi4py) run on the
    # calling thread, and MPI needs every rank to issue collectives in one order, so a
    # user-facing collective must not still be pending on the comm stream when the next one
    # starts.  (Overlap comes from DDP, which keeps all its collectives on the stream.)
    instr.stream.wait(instr.seq)
    _builder.vm.raise_pending()


def _after_comm_stream() -> None:
    """The collectives that run on the calling thread start only once the comm stream has
    drained, so every collective, DDP's queued buckets included, keeps one issue order."""
    vm = _builder.vm
    stream = vm.streams.get("comm")
    if stream is not None:
        stream.wait(stream.issued)
        vm.raise_pending()


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group=None) -> None:
    """Reduce `tensor` over all ranks, in place: afterwards every rank holds the result.
    It runs as a collective instruction on the VM's comm stream, after the tensor's writers."""
    _local("all_reduce", "tensor", tensor)
    comm = _group(group)
    _on_comm_stream("all_reduce", tensor, lambda a: comm.all_reduce(
        np.ascontiguousarray(a), op, out=np.empty(a.shape, a.dtype)))


def all_gather(tensor_list: list, tensor: Tensor, group=None) -> None:
    """Fill `tensor_list[i]` with rank i's `tensor` (entries may differ in size per rank)."""
    _after_comm_stream()
    comm = _group(group)
    _local("all_gather", "tensor", tensor)
    outs = _tensor_list("all_gather", "tensor_list", tensor_list, comm.size, None)
    if outs[comm.rank].numel() != tensor.numel() or outs[comm.rank].dtype is not tensor.dtype:
        raise ValueError(
            f"all_gather: tensor_list[{comm.rank}] is {outs[comm.rank].dtype} "
            f"{list(outs[comm.rank].shape)} but this rank's tensor is {tensor.dtype} "
            f"{list(tensor.shape)}"
        )
    sizes = [t.numel() for t in outs]
    gathered = comm.all_gather(_flat(tensor), sizes=sizes)
    start = 0
    for t, n in zip(outs, sizes):
        _write(t, gathered[start:start + n])
        start += n


def broadcast(tensor: Tensor, src: int, group=None) -> None:
    """Overwrite `tensor` on every rank with rank `src`'s."""
    comm = _group(group)
    _local("broadcast", "tensor", tensor)

    def run(a):
        buf = np.array(a, order="C")
        comm.broadcast(buf, src)
        return buf

    _on_comm_stream("broadcast", tensor, run)


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group=None) -> None:
    """Reduce `tensor` over all ranks into rank `dst`'s `tensor`; others keep theirs."""
    _after_comm_stream()
    comm = _group(group)
    _local("reduce", "tensor", tensor)
    buf = np.array(tensor._host(), order="C")
    comm.reduce(buf, dst, op)
    if comm.rank == dst:
        _write(tensor, buf)


def gather(tensor: Tensor, gather_list: list | None = None, dst: int = 0, group=None) -> None:
    """On `dst`, fill `gather_list[i]` with rank i's `tensor` (all the same shape)."""
    _after_comm_stream()
    comm = _group(group)
    _local("gather", "tensor", tensor)
    if comm.rank == dst:
        if gather_list is None:
            raise ValueError("gather: gather_list must be given on the destination rank")
        outs = _tensor_list("gather", "gather_list", gather_list, comm.size, tensor)
    gathered = comm.gather(_flat(tensor), dst, sizes=[tensor.numel()] * comm.size)
    if comm.rank == dst:
        for i, t in enumerate(outs):
            _write(t, gathered[i * tensor.numel():(i + 1) * tensor.numel()])


def scatter(tensor: Tensor, scatter_list: list | None = None, src: int = 0, group=None) -> None:
    """Fill every rank's `tensor` with `scatter_list[rank]` from rank `src`."""
    _after_comm_stream()
    comm = _group(group)
    _local("scatter", "tensor", tensor)
    send = None
    if comm.rank == src:
        if scatter_list is None:
            raise ValueError("scatter: scatter_list must be given on the source rank")
        ins = _tensor_list("scatter", "scatter_list", scatter_list, comm.size, tensor)
        send = np.concatenate([_flat(t) for t in ins])
    out = np.empty(tensor.numel(), tensor.dtype.np)
    comm.scatter(out, send, src, sizes=[tensor.numel()] * comm.size)
    _write(tensor, out)


def reduce_scatter(output: Tensor, input_list: list, op=ReduceOp.SUM, group=None) -> None:
    """`output` on rank i becomes the reduction over ranks of their `input_list[i]`."""
    _after_comm_stream()
    comm = _group(group)
    _local("reduce_scatter", "output", output)
    ins = _tensor_list("reduce_scatter", "input_list", input_list, comm.size, None)
    mine = ins[comm.rank]
    if mine.numel() != output.numel() or mine.dtype is not output.dtype:
        raise ValueError(
            f"reduce_scatter: output is {output.dtype} {list(output.shape)} but "
            f"input_list[{comm.rank}] is {mine.dtype} {list(mine.shape)}"
        )
    send = np.concatenate([_flat(t) for t in ins])
    result = comm.reduce_scatter(send, op, sizes=[t.numel() for t in ins])
    _write(output, result)


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group=None) -> None:
    """`output_tensor` (group size x `input_tensor`'s elements, any shape) becomes every
    rank's `input_tensor` in rank order, as torch.distributed's."""
    _after_comm_stream()
    comm = _group(group)
    _local("all_gather_into_tensor", "output_tensor", output_tensor)
    _local("all_gather_into_tensor", "input_tensor", input_tensor)
    n = input_tensor.numel()
    if output_tensor.numel() != n * comm.size or output_tensor.dtype is not input_tensor.dtype:
        raise ValueError(
            f"all_gather_into_tensor: output_tensor is {output_tensor.dtype} "
            f"{list(output_tensor.shape)}, expected {input_tensor.dtype} with {comm.size} x {n} "
            f"elements (group size x input_tensor {list(input_tensor.shape)})")
    _write(output_tensor, comm.all_gather(_flat(input_tensor), sizes=[n] * comm.size))


def reduce_scatter_tensor(output_tensor: Tensor, input_tensor: Tensor, op=ReduceOp.SUM,
                          group=None) -> None:
    """Reduce `input_tensor` (group size x `output_tensor`'s elements) over ranks; rank i
    keeps block i, as torch.distributed's."""
    _after_comm_stream()
    comm = _group(group)
    _local("reduce_scatter_tensor", "output_tensor", output_tensor)
    _local("reduce_scatter_tensor", "input_tensor", input_tensor)
    n = output_tensor.numel()
    if input_tensor.numel() != n * comm.size or input_tensor.dtype is not output_tensor.dtype:
        raise ValueError(
            f"reduce_scatter_tensor: input_tensor is {input_tensor.dtype} "
            f"{list(input_tensor.shape)}, expected {output_tensor.dtype} with {comm.size} x {n} "
            f"elements (group size x output_tensor {list(output_tensor.shape)})")
    _write(output_tensor, comm.reduce_scatter(_flat(input_tensor), op, sizes=[n] * comm.size))


def all_to_all(output_tensor_list: list, input_tensor_list: list, group=None) -> None:
    """Rank i's `input_tensor_list[j]` lands in rank j's `output_tensor_list[i]`."""
    _after_comm_stream()
    comm = _group(group)
    outs = _tensor_list("all_to_all", "output_tensor_list", output_tensor_list, comm.size, None)
    ins = _tensor_list("all_to_all", "input_tensor_list", input_tensor_list, comm.size, None)
    send = np.concatenate([_flat(t) for t in ins])
    recv_sizes = [t.numel() for t in outs]
    got = comm.all_to_all(send, [t.numel() for t in ins], recv_sizes)
    start = 0
    for t, n in zip(outs, recv_sizes):
        _write(t, got[start:start + n])
        start += n


def send(tensor: Tensor, dst: int, send_meta: bool = True, tag: int = 0, group=None) -> None:
    """Send `tensor` to rank `dst`; with `send_meta`, its shape and dtype go first."""
    _after_comm_stream()
    comm = _group(group)
    _local("send", "tensor", tensor)
    if send_meta:
        if tensor.dim() > _MAX_NDIM:
            raise ValueError(f"send: tensors of more than {_MAX_NDIM} dims cannot send meta")
        meta = np.zeros(_META_LEN, np.int64)
        meta[0], meta[1] = tensor.dim(), _dt.ALL.index(tensor.dtype)
        meta[2:2 + tensor.dim()] = tuple(tensor.shape)
        comm.send(meta, dst, tag)
    comm.send(tensor._host(), dst, tag)


def recv(src: int, shape=None, dtype=None, device=None, *, out: Tensor | None = None,
         tag: int = 0, group=None) -> Tensor:
    """Receive a tensor from rank `src`.

    As OneFlow's: give both `shape` and `dtype` when the sender used `send_meta=False`, and
    neither when it sent its meta (the default). `out`, when given, receives the data.
    """
    _after_comm_stream()
    comm = _group(group)
    if (shape is None) != (dtype is None):
        raise ValueError("recv: give both shape and dtype (sender used send_meta=False) or "
                         "neither (the sender sends its meta)")
    if shape is None:
        meta = np.empty(_META_LEN, np.int64)
        comm.recv(meta, src, tag)
        shape = tuple(int(n) for n in meta[2:2 + int(meta[0])])
        dtype = _dt.ALL[int(meta[1])]
    dtype = _dt.as_dtype(dtype)
    shape = tuple(shape)
    if out is not None:
        _local("recv", "out", out)
        if tuple(out.shape) != shape or out.dtype is not dtype:
            raise ValueError(f"recv: out is {out.dtype} {list(out.shape)} but rank {src} sent "
                             f"{dtype} {list(shape)}")
    buf = np.empty(shape, dtype.np)
    comm.recv(buf, src, tag)
    if out is None:
        out = empty(shape, dtype=dtype, device=device)
    _write(out, buf)
    return out


def barrier(group=None) -> None:
    """Wait until every rank has reached this barrier."""
    _after_comm_stream()
    _group(group).barrier()


TENSOR_API = {
    "all_reduce": all_reduce, "all_gather": all_gather, "broadcast": broadcast,
    "reduce": reduce, "gather": gather, "scatter": scatter, "reduce_scatter": reduce_scatter,
    "all_to_all": all_to_all, "send": send, "recv": recv, "barrier": barrier,
    "all_gather_into_tensor": all_gather_into_tensor,
    "reduce_scatter_tensor": reduce_scatter_tensor,
}
_comm.install_tensor_api(TENSOR_API)

__all__ = list(TENSOR_API) + ["ReduceOp"]


def _drain_vm() -> None:
    # Collectives still queued on the comm stream must finish before the exit barrier.
    from ..vm import get_vm

    get_vm().synchronize()


_comm.on_clean_exit(_drain_vm)
