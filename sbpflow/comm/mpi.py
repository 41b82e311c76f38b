"""Communicators over MPI: mpi4py with the mpich wheel, upper-case (buffer) calls only.

Importing this module starts MPI (`MPI_Init_thread`, MULTIPLE), which waits until every
rank of the job has started it; `sbpflow.comm` imports it only in a multi-process launch.
Arrays are never pickled: each call passes `[array, MPI datatype]` (and counts and
displacements for the uneven `v` forms), so MPI reads and writes the NumPy memory itself.
float16 and bfloat16 travel as their raw 16-bit patterns (UINT16); their reductions add in
float32 and round once, since MPI has no half-precision types.
"""

from __future__ import annotations

import faulthandler
import math
import time
from _thread import get_ident

import ml_dtypes
import numpy as np

from . import communicator as _cc
from . import watchdog as _watchdog
from .communicator import (
    DIVERGENCE,
    Communicator,
    DivergenceError,
    ReduceOp,
    SequenceCheck,
    _rows,
    balanced_sizes,
)
from .faults import abort_job

_START_FLOOR_S = 30.0


def _start_mpi_waits_for_every_rank():
    # MPI start-up is itself collective and holds the GIL (the watchdog thread cannot run),
    # so faulthandler's C thread guards it: a rank that never starts MPI ends the job after
    # the collective timeout with this function in the printed traceback.  Never less than
    # _START_FLOOR_S: start-up waits for every rank's imports, seconds on a loaded machine,
    # so a short collective timeout (tests use 1 s) must not end a healthy start.
    faulthandler.dump_traceback_later(max(_watchdog.collective_timeout(), _START_FLOOR_S),
                                      exit=True)
    try:
        from mpi4py import MPI
    finally:
        faulthandler.cancel_dump_traceback_later()
    return MPI


MPI = _start_mpi_waits_for_every_rank()

_HALF = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_DATATYPES = {
    np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
    np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T,
    np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
    np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint16): MPI.UINT16_T,
    np.dtype(np.bool_): MPI.C_BOOL,
    _HALF[0]: MPI.UINT16_T, _HALF[1]: MPI.UINT16_T,
}
_DTYPE_CODES = {dt: i for i, dt in enumerate(_DATATYPES)}
_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.PROD: MPI.PROD, ReduceOp.MAX: MPI.MAX,
        ReduceOp.MIN: MPI.MIN}
# Bool: a sum or max of truth values saturates to "any", a product or min to "all".
_BOOL_OPS = {ReduceOp.SUM: MPI.LOR, ReduceOp.PROD: MPI.LAND, ReduceOp.MAX: MPI.LOR,
             ReduceOp.MIN: MPI.LAND}
_F32 = np.dtype(np.float32)


# The divergence check's descriptor of a collective: ints only (see communicator.SequenceCheck)
# (op code, dtype code, reduce op or root, pinned step or -1, whole shape (1) or rows (0), dims)
_OP_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
             "gather", "scatter", "barrier", "create_group", "node_count")
_OP_CODES = {name: i for i, name in enumerate(_OP_NAMES)}
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROP_NAMES = tuple(o.value for o in ReduceOp)
_ROP_CODES = {o: i for i, o in enumerate(ReduceOp)}
_DTYPE_NAMES = tuple(str(d) for d in _DTYPE_CODES)
_pinned = _cc._pinned


def _describe_call(entry) -> str:
    """A collective's descriptor as text: 'all_reduce (float32 [4], op sum)', and the step
    pinned on it where one is (DDP's: 'in backward pass 3 through its DDP model')."""
    op, dt, arg, step, whole, dims = entry
    name = _OP_NAMES[op] if 0 <= op < len(_OP_NAMES) else f"<collective {op}>"
    parts = []
    if dt >= 0:
        dtype = _DTYPE_NAMES[dt] if dt < len(_DTYPE_NAMES) else f"<dtype {dt}>"
        parts.append(f"{dtype} {list(dims)}" if whole else f"{dtype} rows of {list(dims)}")
    if name in _REDUCING and 0 <= arg & 0xFF < len(_ROP_NAMES):
        parts.append(f"op {_ROP_NAMES[arg & 0xFF]}")
        if name == "reduce":
            parts.append(f"root {arg >> 8}")
    elif name in _ROOTED:
        parts.append(f"root {arg}")
    text = name + (f" ({', '.join(parts)})" if parts else "")
    if step >= 0:
        text += f" in backward pass {step} {_cc.STEP_TEXT}"
    return text


def _datatype(op: str, dtype: np.dtype):
    try:
        return _DATATYPES[dtype]
    except KeyError:
        raise TypeError(
            f"{op}: dtype {dtype} cannot be communicated; supported: "
            f"{sorted(str(d) for d in _DATATYPES)}"
        ) from None


def _buf(a: np.ndarray, mpi_type):
    # Half types have no PEP 3118 buffer format (bfloat16 cannot export one at all): view
    # their bits as uint16, which is what the UINT16 datatype describes.
    if a.dtype in _HALF:
        a = a.view(np.uint16)
    return [a, mpi_type]


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _displacements(counts) -> list[int]:
    return [int(x) for x in np.concatenate(([0], np.cumsum(counts[:-1])))] if counts else []


def _end_job_from_worker(exc: BaseException) -> None:
    # On the main thread the error is raised (uncaught, it ends the job); a collective run by
    # a worker (the VM's comm stream) ends the job itself, since the main thread may not read
    # the error before it blocks in another collective.
    if get_ident() != _cc._main_ident:
        abort_job(f"{type(exc).__name__}: {exc}")


class MpiCommunicator(Communicator):
    def __init__(self, comm, world_ranks, name, watchdog, global_check_comm=None):
        super().__init__(comm.Get_rank(), comm.Get_size(), tuple(world_ranks), name)
        self._comm = comm
        # The divergence check talks on duplicates: its all-gathers never match a data
        # collective, and the global-op check (main thread) never meets the collectives' check
        # (whichever thread runs the collectives: the VM's comm stream).
        self._check_comm = comm.Dup()
        self._global_check_comm = global_check_comm
        self._divergence = SequenceCheck("collectives")
        self._global_seq = SequenceCheck("global ops")
        self._seq = 0  # collectives issued on this communicator, for the watchdog's report
        self._watchdog = watchdog
        self._pending = watchdog.pending
        watchdog.register(self)

    @classmethod
    def world(cls) -> MpiCommunicator:
        world = MPI.COMM_WORLD
        # Private duplicates: our traffic never matches a user's own mpi4py messages, and the
        # watchdog talks on a communicator of its own.
        watchdog = _watchdog.Watchdog(MPI, world.Dup(), world.Get_rank(), world.Get_size())
        ranks = range(world.Get_size())
        comm = cls(world.Dup(), ranks, "world", watchdog, world.Dup())
        # The control plane (`sbpflow.comm.control()`), duplicated now, on the main thread at
        # start-up: a later Dup of the world would be a collective racing the comm stream's.
        comm.control = cls(world.Dup(), ranks, "control", watchdog)
        return comm

    # -- bookkeeping --------------------------------------------------------------------------
    def _enter(self, op: str, a) -> int:
        self._seq += 1
        ident = get_ident()
        self._pending[ident] = _watchdog.Pending(
            self, op, self._seq, a.shape if a is not None else (),
            a.dtype if a is not None else None, time.monotonic())
        return ident

    # -- divergence check -----------------------------------------------------------------
    def _check(self, op: str, a, arg: int = -1, whole: bool = True) -> None:
        """Fold this collective into the running fingerprint; on a sampled call compare it
        across ranks (before the data moves, so a mismatch never returns garbage)."""
        step = _pinned.step
        if step is None:  # never None in a fingerprint: hash(None) differs between processes
            step = -1
        if a is None:
            entry = (_OP_CODES[op], -1, arg, step, 1, ())
        else:
            entry = (_OP_CODES[op], _DTYPE_CODES.get(a.dtype, -1), arg, step,
                     1 if whole else 0, a.shape if whole else a.shape[1:])
        if self._divergence.note(entry, entry):
            self._compare(self._divergence, self._check_comm, _describe_call)

    def _compare(self, seq: SequenceCheck, comm, describe) -> None:
        def allgather(a):
            a = np.ascontiguousarray(a)
            out = np.empty((self.size,) + a.shape, a.dtype)
            t = _DATATYPES[a.dtype]
            comm.Allgather([a, t], [out, t])
            return out

        try:
            seq.compare(allgather, describe, self.world_ranks, self.name)
        except DivergenceError as exc:
            _end_job_from_worker(exc)
            raise

    def check_global_ops(self, fingerprint: int, entry, describe) -> None:
        """The framework's global-op sequence (world only, main thread): fold one op in and,
        on a sampled call, compare across ranks."""
        seq = self._global_seq
        if not seq.note(fingerprint, entry):
            return
        ident = get_ident()
        self._pending[ident] = _watchdog.Pending(
            self, "the divergence check of global ops", seq.count, (), None, time.monotonic())
        try:
            self._compare(seq, self._global_check_comm, describe)
        finally:
            del self._pending[ident]

    def _create_group(self, ranks):
        ident = self._enter("create_group", None)
        try:
            group = self._comm.Get_group()
            sub_group = group.Incl(list(ranks))
            # Group-collective creation: only the members take part (MPI-3).
            sub = self._comm.Create_group(sub_group)
            sub_group.Free()
            group.Free()
        finally:
            del self._pending[ident]
        world_ranks = tuple(self.world_ranks[r] for r in ranks)
        return MpiCommunicator(sub, world_ranks, f"group{list(world_ranks)}", self._watchdog)

    def _exchange_rows(self, op: str, send: np.ndarray, root: int | None) -> tuple | None:
        """Every rank's (rows, row size, dtype), to everyone (root None) or to root.

        Returns the row counts where known; raises where ranks disagree on row size or dtype.
        """
        row_elems = math.prod(send.shape[1:])
        mine = np.array([send.shape[0], row_elems, _DTYPE_CODES[send.dtype]], np.int64)
        table = np.empty((self.size, 3), np.int64)
        if root is None:
            self._comm.Allgather([mine, MPI.INT64_T], [table, MPI.INT64_T])
        else:
            self._comm.Gather([mine, MPI.INT64_T],
                              [table, MPI.INT64_T] if self.rank == root else None, root)
            if self.rank != root:
                return None
        self._check_rows_agree(op, table, row_elems, send.dtype)
        return tuple(int(n) for n in table[:, 0])

    def _check_rows_agree(self, op, table, row_elems, dtype):
        codes = list(_DTYPE_CODES)
        for r, (_, elems, code) in enumerate(table.tolist()):
            # A code out of range means rank r is in another collective altogether.
            theirs = codes[code] if 0 <= code < len(codes) else f"<unknown dtype code {code}>"
            if elems != row_elems or theirs != dtype:
                raise ValueError(
                    f"{op} on {self.name}: rank {r} sends rows of {elems} {theirs} "
                    f"elements but rank {self.rank} has rows of {row_elems} {dtype} elements"
                    " (do all ranks run the same collectives in the same order?)"
                )

    # -- collectives --------------------------------------------------------------------------
    def all_reduce(self, buf, op="sum", out=None):
        self._check_array("all_reduce", "buf", buf, writable=out is None)
        target = buf
        if out is not None:
            target = self._check_array("all_reduce", "out", out, writable=True)
            if out.shape != buf.shape or out.dtype != buf.dtype:
                raise ValueError(
                    f"all_reduce: out is {out.dtype} {out.shape}, buf is {buf.dtype} {buf.shape}"
                )
        rop = ReduceOp.parse(op)
        dtype = buf.dtype
        mpi_op = _BOOL_OPS[rop] if dtype == np.bool_ else _OPS[rop]
        ident = self._enter("all_reduce", buf)
        try:
            if DIVERGENCE.on:
                self._check("all_reduce", buf, _ROP_CODES[rop])
            if dtype not in _HALF and target.flags.c_contiguous:
                t = _datatype("all_reduce", dtype)
                if target is buf:
                    self._comm.Allreduce(MPI.IN_PLACE, [buf, t], mpi_op)
                else:
                    self._comm.Allreduce([_contiguous(buf), t], [target, t], mpi_op)
            else:
                work = buf.astype(_F32 if dtype in _HALF else dtype, order="C")  # a copy
                self._comm.Allreduce(MPI.IN_PLACE, [work, _datatype("all_reduce", work.dtype)],
                                     mpi_op)
                np.copyto(target, work, casting="unsafe")
        finally:
            del self._pending[ident]
        return target

    def all_gather(self, send, sizes=None, out=None):
        send = _rows(self._check_array("all_gather", "send", send))
        t = _datatype("all_gather", send.dtype)
        ident = self._enter("all_gather", send)
        try:
            if DIVERGENCE.on:
                self._check("all_gather", send, whole=False)
            if sizes is None:
                sizes = self._exchange_rows("all_gather", send, None)
            else:
                sizes = self._check_sizes("all_gather", "sizes", sizes, send.shape[0])
            result = self._out("all_gather", out, (sum(sizes),) + send.shape[1:], send.dtype)
            recv = result if result.flags.c_contiguous else np.empty(result.shape, result.dtype)
            src = _buf(_contiguous(send), t)
            if len(set(sizes)) == 1:
                self._comm.Allgather(src, _buf(recv, t))
            else:
                row_elems = math.prod(send.shape[1:])
                counts = [n * row_elems for n in sizes]
                self._comm.Allgatherv(src, [_buf(recv, t)[0], (counts, _displacements(counts)),
                                            t])
        finally:
            del self._pending[ident]
        if recv is not result:
            np.copyto(result, recv)
        return result

    def reduce_scatter(self, send, op="sum", sizes=None, out=None):
        send = _rows(self._check_array("reduce_scatter", "send", send))
        rop = ReduceOp.parse(op)
        sizes = self._split_sizes("reduce_scatter", "sizes", send.shape[0], sizes)
        dtype = send.dtype
        mpi_op = _BOOL_OPS[rop] if dtype == np.bool_ else _OPS[rop]
        work_dtype = _F32 if dtype in _HALF else dtype
        t = _datatype("reduce_scatter", work_dtype)
        row_elems = math.prod(send.shape[1:])
        src = send.astype(work_dtype, order="C") if dtype in _HALF else _contiguous(send)
        result = self._out("reduce_scatter", out, (sizes[self.rank],) + send.shape[1:], dtype)
        direct = dtype not in _HALF and result.flags.c_contiguous
        recv = result if direct else np.empty(result.shape, work_dtype)
        ident = self._enter("reduce_scatter", send)
        try:
            if DIVERGENCE.on:
                self._check("reduce_scatter", send, _ROP_CODES[rop])
            if len(set(sizes)) == 1:
                self._comm.Reduce_scatter_block([src, t], [recv, t], mpi_op)
            else:
                self._comm.Reduce_scatter([src, t], [recv, t], [n * row_elems for n in sizes],
                                          mpi_op)
        finally:
            del self._pending[ident]
        if not direct:
            np.copyto(result, recv, casting="unsafe")
        return result

    def all_to_all(self, send, send_sizes=None, recv_sizes=None, out=None):
        send = _rows(self._check_array("all_to_all", "send", send))
        send_sizes = self._split_sizes("all_to_all", "send_sizes", send.shape[0], send_sizes)
        t = _datatype("all_to_all", send.dtype)
        row_elems = math.prod(send.shape[1:])
        ident = self._enter("all_to_all", send)
        try:
            if DIVERGENCE.on:
                self._check("all_to_all", send, whole=False)
            if recv_sizes is None:
                code = _DTYPE_CODES[send.dtype]
                mine = np.array([[n, row_elems, code] for n in send_sizes], np.int64)
                table = np.empty((self.size, 3), np.int64)
                self._comm.Alltoall([mine, MPI.INT64_T], [table, MPI.INT64_T])
                self._check_rows_agree("all_to_all", table, row_elems, send.dtype)
                recv_sizes = tuple(int(n) for n in table[:, 0])
            else:
                recv_sizes = self._check_sizes("all_to_all", "recv_sizes", recv_sizes,
                                               send_sizes[self.rank])
            result = self._out("all_to_all", out, (sum(recv_sizes),) + send.shape[1:],
                               send.dtype)
            recv = result if result.flags.c_contiguous else np.empty(result.shape, result.dtype)
            src = _buf(_contiguous(send), t)
            dst = _buf(recv, t)
            # Always Alltoallv: one rank's sizes may be even while another's are not, and
            # every rank must call the same MPI collective (Alltoall on one and Alltoallv on
            # the other hangs).
            scounts = [n * row_elems for n in send_sizes]
            rcounts = [n * row_elems for n in recv_sizes]
            self._comm.Alltoallv([src[0], (scounts, _displacements(scounts)), t],
                                 [dst[0], (rcounts, _displacements(rcounts)), t])
        finally:
            del self._pending[ident]
        if recv is not result:
            np.copyto(result, recv)
        return result

    def broadcast(self, buf, root=0):
        self._check_array("broadcast", "buf", buf, writable=True)
        root = self._check_rank("broadcast", "root", root)
        t = _datatype("broadcast", buf.dtype)
        ident = self._enter("broadcast", buf)
        try:
            if DIVERGENCE.on:
                self._check("broadcast", buf, root)
            if buf.flags.c_contiguous:
                self._comm.Bcast(_buf(buf, t), root)
            else:
                work = np.ascontiguousarray(buf)
                self._comm.Bcast(_buf(work, t), root)
                np.copyto(buf, work)
        finally:
            del self._pending[ident]
        return buf

    def reduce(self, buf, root=0, op="sum"):
        root = self._check_rank("reduce", "root", root)
        self._check_array("reduce", "buf", buf, writable=self.rank == root)
        rop = ReduceOp.parse(op)
        dtype = buf.dtype
        mpi_op = _BOOL_OPS[rop] if dtype == np.bool_ else _OPS[rop]
        copy_back = dtype in _HALF or not buf.flags.c_contiguous
        work = buf.astype(_F32 if dtype in _HALF else dtype, order="C") if copy_back else buf
        t = _datatype("reduce", work.dtype)
        ident = self._enter("reduce", buf)
        try:
            if DIVERGENCE.on:
                self._check("reduce", buf, _ROP_CODES[rop] | root << 8)
            if self.rank == root:
                self._comm.Reduce(MPI.IN_PLACE, [work, t], mpi_op, root)
            else:
                self._comm.Reduce([work, t], None, mpi_op, root)
        finally:
            del self._pending[ident]
        if copy_back and self.rank == root:
            np.copyto(buf, work, casting="unsafe")
        return buf

    def gather(self, send, root=0, sizes=None):
        send = _rows(self._check_array("gather", "send", send))
        root = self._check_rank("gather", "root", root)
        t = _datatype("gather", send.dtype)
        row_elems = math.prod(send.shape[1:])
        ident = self._enter("gather", send)
        try:
            if DIVERGENCE.on:
                self._check("gather", send, root, whole=False)
            if sizes is None:
                sizes = self._exchange_rows("gather", send, root)
            else:
                sizes = self._check_sizes("gather", "sizes", sizes, send.shape[0])
            src = _buf(_contiguous(send), t)
            if self.rank != root:
                self._comm.Gatherv(src, None, root)
                return None
            recv = np.empty((sum(sizes),) + send.shape[1:], send.dtype)
            counts = [n * row_elems for n in sizes]
            self._comm.Gatherv(src, [_buf(recv, t)[0], (counts, _displacements(counts)), t],
                               root)
        finally:
            del self._pending[ident]
        return recv

    def scatter(self, out, send=None, root=0, sizes=None):
        self._check_array("scatter", "out", out, writable=True)
        root = self._check_rank("scatter", "root", root)
        rows_out = _rows(out)
        t = _datatype("scatter", out.dtype)
        row_elems = math.prod(rows_out.shape[1:])
        if self.rank == root:
            send = _rows(self._check_array("scatter", "send", send))
            send_elems = math.prod(send.shape[1:])
            if send.dtype != out.dtype or send_elems != row_elems:
                raise ValueError(
                    f"scatter: root's send has rows of {send_elems} {send.dtype} elements, "
                    f"its out has rows of {row_elems} {out.dtype} elements"
                )
        ident = self._enter("scatter", out)
        try:
            if DIVERGENCE.on:
                self._check("scatter", rows_out, root, whole=False)
            if sizes is None:
                sizes = self._exchange_rows("scatter", rows_out, root)
            else:
                sizes = self._check_sizes("scatter", "sizes", sizes, rows_out.shape[0])
            work = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
            dst = _buf(work, t)
            if self.rank == root:
                if sum(sizes) != send.shape[0]:
                    raise ValueError(
                        f"scatter: the ranks receive {list(sizes)} rows ({sum(sizes)} in all) "
                        f"but root's send has {send.shape[0]}"
                    )
                counts = [n * row_elems for n in sizes]
                src = _buf(_contiguous(send), t)
                self._comm.Scatterv([src[0], (counts, _displacements(counts)), t], dst, root)
            else:
                self._comm.Scatterv(None, dst, root)
        finally:
            del self._pending[ident]
        if work is not out:
            np.copyto(out, work)
        return out

    def send(self, buf, dest, tag=0):
        self._check_array("send", "buf", buf)
        dest = self._check_rank("send", "dest", dest)
        t = _datatype("send", buf.dtype)
        ident = self._enter("send", buf)
        try:
            self._comm.Send(_buf(_contiguous(buf), t), dest, tag)
        finally:
            del self._pending[ident]

    def recv(self, buf, source, tag=0):
        self._check_array("recv", "buf", buf, writable=True)
        source = self._check_rank("recv", "source", source)
        t = _datatype("recv", buf.dtype)
        work = buf if buf.flags.c_contiguous else np.empty(buf.shape, buf.dtype)
        status = MPI.Status()
        ident = self._enter("recv", buf)
        try:
            # A longer message raises MPI's truncation error; a shorter one is caught below.
            self._comm.Recv(_buf(work, t), source, tag, status)
        finally:
            del self._pending[ident]
        got = status.Get_count(t)
        if got != buf.size:
            raise ValueError(
                f"recv: rank {source} sent {got} elements but buf holds {buf.size} "
                f"({buf.dtype} {buf.shape})"
            )
        if work is not buf:
            np.copyto(buf, work)
        return buf

    def barrier(self):
        ident = self._enter("barrier", None)
        try:
            if DIVERGENCE.on:
                self._check("barrier", None)
            self._comm.Barrier()
        finally:
            del self._pending[ident]

    # -- process end --------------------------------------------------------------------------
    def node_count(self) -> tuple[int, int, int]:
        """(number of machines, this rank's index on its machine, ranks on its machine)."""
        ident = self._enter("node_count", None)
        try:
            local = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
            leaders = np.array([1 if local.Get_rank() == 0 else 0], np.int64)
            self._comm.Allreduce(MPI.IN_PLACE, [leaders, MPI.INT64_T], MPI.SUM)
            result = (int(leaders[0]), local.Get_rank(), local.Get_size())
            local.Free()
        finally:
            del self._pending[ident]
        return result

    def exit_barrier(self) -> None:
        """Wait until every rank has ended its script; then stop the watchdog.

        Waits politely (test and sleep, not MPI's busy polling, which would take a core from
        ranks still computing) and never times out: an early finisher is not a fault. A rank
        blocked in a collective meanwhile is reported by its own watchdog, which names this
        rank as being at the exit barrier.
        """
        if MPI.Is_finalized():  # the script finalized MPI itself: nothing left to wait on
            return
        ctl = self._watchdog._ctl
        ident = get_ident()
        self._pending[ident] = _watchdog.Pending(
            self, "at the exit barrier (its script ended)", None, (), None, time.monotonic(),
            times_out=False)
        try:
            req = ctl.Ibarrier()
            delay = 1e-4
            while not req.Test():
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        finally:
            del self._pending[ident]
        self._watchdog.stop()


__all__ = ["MPI", "MpiCommunicator", "balanced_sizes"]
