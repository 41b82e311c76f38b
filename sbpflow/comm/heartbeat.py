"""Heartbeats on the control plane: notice a rank that went silent, say which, end the job.

A rank that dies on its own machine is seen by hydra at once (its proxy reports the exit and
mpiexec ends the job). A rank cut off from the others is not: when a machine loses its
network, or freezes, every TCP connection to it just stalls, and the ranks left waiting in a
collective would wait for the collective timeout (600 s by default). So every rank of a
multi-process job runs a small daemon thread that exchanges heartbeats over MPI on a private
duplicate of the world communicator, in a star around rank 0: rank 0 beats to every rank and
every rank beats to rank 0, once per `interval` seconds. A rank that has heard nothing from a
peer it watches for `heartbeat_timeout()` seconds (`SBPFLOW_HEARTBEAT_TIMEOUT`, default 20;
0 turns heartbeats off) prints which rank, on which host, went silent, and aborts the job.

Host names are hydra's (`PMI_HOSTNAME`, the host as the hostfile names it), else the machine's
hostname. The thread needs MPI_THREAD_MULTIPLE (mpi4py's default); with a lower thread level
heartbeats stay off. A process that was itself frozen (its own thread woke up late) does not
blame the others: it starts counting afresh.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from .faults import abort_job

DEFAULT_TIMEOUT_S = 20.0
TIMEOUT_ENV = "SBPFLOW_HEARTBEAT_TIMEOUT"
_TAG = 7311
_BEAT, _BYE = 1, 2
BYE_WAIT_S = 5.0  # at the end, how long to wait for the peers' last message
_HOST_BYTES = 256

_heart: Heartbeat | None = None


def heartbeat_timeout() -> float:
    """Seconds of silence after which a peer rank is declared lost (0: heartbeats off)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds (0 turns heartbeats "
                         f"off), got {raw!r}") from None
    if value < 0 or value != value:
        raise ValueError(f"{TIMEOUT_ENV} must be 0 or positive, got {raw!r}")
    return value


def host_name() -> str:
    """This rank's host, as the launcher named it (hydra's PMI_HOSTNAME) or the hostname."""
    return os.environ.get("PMI_HOSTNAME") or socket.gethostname()


class Heartbeat:
    """One per process of a multi-process job; `stop()` before MPI is finalized."""

    def __init__(self, mpi, comm, timeout: float, interval: float | None = None):
        self._mpi = mpi
        self._comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = timeout
        self.interval = interval if interval is not None else min(1.0, timeout / 5)
        self.hosts = self._exchange_hosts()
        self.peers = list(range(1, self.size)) if self.rank == 0 else [0]
        now = time.monotonic()
        self.last_heard = {p: now for p in self.peers}
        self._out: list = []  # sends in flight, with their buffers
        self._beat = bytearray([_BEAT])
        self._byes: set[int] = set()
        # One receive per peer (not one from any source: with MPICH over UCX a wildcard
        # receive was seen to leave messages from some peers unmatched).
        self._recvs = {peer: self._post(peer, bytearray(1)) for peer in self.peers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sbpflow-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _exchange_hosts(self) -> list[str]:
        mine = bytearray(_HOST_BYTES)
        name = host_name().encode()[: _HOST_BYTES - 1]
        mine[: len(name)] = name
        table = bytearray(_HOST_BYTES * self.size)
        self._comm.Allgather([mine, self._mpi.BYTE], [table, self._mpi.BYTE])
        return [bytes(table[i * _HOST_BYTES:(i + 1) * _HOST_BYTES]).rstrip(b"\0").decode(
            errors="replace") for i in range(self.size)]

    def where(self, rank: int) -> str:
        return f"rank {rank} (host {self.hosts[rank]})"

    # -- the thread ---------------------------------------------------------------------------
    def _run(self):
        try:
            poll = min(0.1, self.interval)
            next_beat = 0.0
            last_wake = time.monotonic()
            while not self._stop.wait(poll):
                now = time.monotonic()
                if now - last_wake > self.timeout / 2:
                    # This process was frozen (stopped, swapped out, starved): the silence
                    # is ours, not the peers'. Count afresh.
                    self.last_heard = {p: now for p in self.last_heard}
                last_wake = now
                self._hear(now)
                if now >= next_beat:
                    self._send_beats()
                    next_beat = now + self.interval
                lost = self._lost(now)
                if lost is not None:
                    self._report_and_abort(lost, now)
                    return
        except Exception as exc:  # never let the heartbeat itself take the job down
            sys.stderr.write(f"rank {self.rank}: sbpflow heartbeat stopped: {exc!r}\n")

    def _post(self, peer: int, buf: bytearray):
        return self._comm.Irecv([buf, self._mpi.BYTE], peer, _TAG), buf

    def _hear(self, now: float) -> None:
        for peer, (req, buf) in list(self._recvs.items()):
            while req.Test():
                if buf[0] == _BYE:  # that peer has ended: nothing more comes from it
                    self._byes.add(peer)
                    self.last_heard.pop(peer, None)
                    del self._recvs[peer]
                    break
                self.last_heard[peer] = now
                req, buf = self._recvs[peer] = self._post(peer, buf)

    def _send_beats(self) -> None:
        self._out = [(req, buf) for req, buf in self._out if not req.Test()]
        for peer in self.peers:
            self._out.append((self._comm.Isend([self._beat, self._mpi.BYTE], peer, _TAG),
                              self._beat))

    def _lost(self, now: float) -> int | None:
        for peer, heard in list(self.last_heard.items()):
            if now - heard > self.timeout:
                return peer
        return None

    def _report_and_abort(self, peer: int, now: float) -> None:
        abort_job(
            f"sbpflow heartbeat: {self.where(self.rank)} has heard nothing from "
            f"{self.where(peer)} for {now - self.last_heard[peer]:.1f} s, longer than the "
            f"heartbeat timeout of {self.timeout:g} s ({TIMEOUT_ENV}).\n"
            f"{self.where(peer)} is lost: its machine is unreachable (network down or cut "
            "off), frozen, or the process is stopped. Aborting the job.",
            prefix=False)

    # -- shutdown -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the thread, say goodbye to the peers and hear theirs, withdraw the receive.

        Every peer's last message is a goodbye (messages between two ranks arrive in order),
        so once each peer's has arrived nothing is left unreceived when MPI is finalized.
        """
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._recvs is None:
            return
        bye = bytearray([_BYE])
        for peer in self.peers:
            self._out.append((self._comm.Isend([bye, self._mpi.BYTE], peer, _TAG), bye))
        deadline = time.monotonic() + BYE_WAIT_S
        while not self._byes.issuperset(self.peers) and time.monotonic() < deadline:
            self._hear(time.monotonic())
            time.sleep(0.002)
        for req, _ in self._recvs.values():  # peers that said no goodbye in time
            req.Cancel()
            req.Wait()
        self._recvs = None
        while self._out and time.monotonic() < deadline:
            self._out = [(req, buf) for req, buf in self._out if not req.Test()]
            if self._out:
                time.sleep(0.002)


def start() -> Heartbeat | None:
    """Start this rank's heartbeat (collective over the world: every rank calls it once)."""
    global _heart
    if _heart is not None:
        return _heart
    timeout = heartbeat_timeout()
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() < 2:
        return None
    # Every rank takes the same decision (same environment), so the Dup below is collective.
    if timeout == 0 or MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return None
    _heart = Heartbeat(MPI, MPI.COMM_WORLD.Dup(), timeout)
    return _heart


def stop() -> None:
    """Stop this rank's heartbeat (after the exit barrier, before MPI is finalized)."""
    global _heart
    if _heart is not None:
        _heart.stop()
        _heart = None
