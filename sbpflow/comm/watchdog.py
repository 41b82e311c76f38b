"""Collective timeouts: notice a collective that waits too long, say why, end the job.

Ranks that diverge (one skips or reorders a collective, or is stuck) leave the others blocked
in MPI forever: the classic SPMD deadlock. Every MPI collective registers itself in
`Watchdog.pending` while it runs (op, communicator, sequence number, shape, dtype, start
time). A daemon thread looks every `POLL_S` seconds; when a collective has waited longer than
the timeout (`SBPFLOW_COLLECTIVE_TIMEOUT` seconds, default 600, or `set_collective_timeout`),
it asks every other rank's watchdog what that rank is doing, over a private duplicate of the
world communicator, prints the answers as one report and calls `MPI_Abort`.

A rank whose script has ended tells the others when it reaches the exit barrier
(`announce_end`), sending the number of collectives it issued on each communicator; a rank
blocked in a collective that the ended rank never issued (its number on that communicator is
higher) cannot complete it, and its watchdog ends the job at once, naming the ended rank
and how its script ended.

The thread needs MPI_THREAD_MULTIPLE (mpi4py's default) to talk while the main thread is
blocked in MPI; with a lower thread level it reports only its own rank. The blocked main
thread does not hold the GIL (mpi4py releases it in blocking calls), so the thread runs.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from .faults import abort_job

DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_ENV = "SBPFLOW_COLLECTIVE_TIMEOUT"
POLL_S = 0.1
REPLY_WINDOW_S = 2.0  # how long the reporting rank waits for the others' answers
_TAG_ASK, _TAG_ANSWER, _TAG_ENDED = 7301, 7302, 7303
_ANSWER_BYTES = 4096
_ENDED_BYTES = 1 << 16

_current: Watchdog | None = None  # this process's (one per process: the world's)


def announce_end(how: str) -> None:
    """Say how this rank's script ended (`how`, in words). Once the rank is at the exit
    barrier (after the exit hooks, which may still issue collectives), its watchdog tells
    every other rank, with the collectives it issued on each communicator. A rank blocked in
    a collective that this rank never issued can never complete it: its watchdog ends the job
    at once, naming this rank, instead of after the collective timeout."""
    if _current is not None:
        _current.end_how = how


def _timeout_from_env() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV} must be positive, got {raw!r}")
    return value


_timeout_s = _timeout_from_env()


def collective_timeout() -> float:
    """Seconds a collective may wait before the watchdog ends the job."""
    return _timeout_s


def set_collective_timeout(seconds: float) -> None:
    global _timeout_s
    seconds = float(seconds)
    if not seconds > 0:
        raise ValueError(f"set_collective_timeout: seconds must be positive, got {seconds}")
    _timeout_s = seconds


class Pending:
    """One collective in flight on one thread."""

    __slots__ = ("comm", "op", "seq", "shape", "dtype", "start", "times_out")

    def __init__(self, comm, op, seq, shape, dtype, start, times_out=True):
        self.comm = comm
        self.op = op
        self.seq = seq
        self.shape = shape
        self.dtype = dtype
        self.start = start
        self.times_out = times_out

    def describe(self, now: float) -> str:
        if self.seq is None:  # not a collective of a communicator (the exit barrier)
            return f"{self.op} for {now - self.start:.1f} s"
        what = f"{self.op} #{self.seq} on {self.comm.name}"
        if self.dtype is not None:
            what += f" ({self.dtype} {tuple(self.shape)})"
        return f"waiting in {what} for {now - self.start:.1f} s"


class Watchdog:
    """One per process, created with the MPI world communicator."""

    def __init__(self, mpi, control_comm, rank: int, size: int):
        self.pending: dict[int, Pending] = {}  # thread ident -> its collective in flight
        self._mpi = mpi
        self._ctl = control_comm
        self._rank = rank
        self._size = size
        self._comms: list = []
        self._can_talk = mpi.Query_thread() == mpi.THREAD_MULTIPLE and size > 1
        self._ask_recv = None
        self._ask_buf = bytearray(8)
        self._ask_status = mpi.Status()
        self._answers_out: list = []
        self._abandoned: list = []
        self._last_asked = -1e9  # when another rank, reporting a late collective, asked us
        self._lowest_asker = size
        self._ended: dict[int, tuple[str, dict]] = {}  # rank -> (how, collectives issued)
        self._ended_recv = None
        self._ended_buf = bytearray(_ENDED_BYTES)
        self._announced: list | None = None  # the sends, once made
        self.end_how: str | None = None  # how this rank's script ended, once it has
        self._stop = threading.Event()
        if self._can_talk:
            self._post_ask_recv()
            self._post_ended_recv()
        global _current
        _current = self
        self._thread = threading.Thread(target=self._run, name="sbpflow-watchdog", daemon=True)
        self._thread.start()

    def register(self, comm) -> None:
        self._comms.append(comm)

    # -- the thread ---------------------------------------------------------------------------
    def _run(self):
        try:
            while not self._stop.wait(POLL_S):
                if self._can_talk:
                    self._answer_asks()
                    self._announce_at_the_exit_barrier()
                    self._hear_ends()
                    stuck = self._blocked_by_an_ended_rank()
                    if stuck is not None:
                        self._report_ended_and_abort(*stuck)
                        return
                late = self._late()
                # Another rank is reporting (it asked us): let its report stand alone, unless
                # it has not aborted the job well after its window.
                reporting = time.monotonic() - self._last_asked < REPLY_WINDOW_S + 2
                if late is not None and not reporting:
                    self._report_and_abort(late)
        except Exception as exc:  # never let the watchdog itself take the job down
            sys.stderr.write(f"rank {self._rank}: sbpflow watchdog stopped: {exc!r}\n")

    def _late(self) -> Pending | None:
        now = time.monotonic()
        limit = _timeout_s
        for entry in list(self.pending.values()):
            if entry.times_out and now - entry.start > limit:
                return entry
        return None

    def describe(self) -> str:
        """What this rank is doing now, in one line."""
        now = time.monotonic()
        entries = list(self.pending.values())
        if entries:
            doing = "; ".join(e.describe(now) for e in entries)
        else:
            doing = "not in a collective (running its own code)"
        issued = ", ".join(f"{c.name} {c._seq}" for c in self._comms)
        return f"{doing} [collectives issued: {issued}]"

    # -- ranks whose script ended ------------------------------------------------------------
    def _issued(self) -> dict[str, int]:
        """Collectives issued per communicator, keyed alike on every rank: its name and its
        index among this rank's communicators of that name (made collectively, in order)."""
        table, seen = {}, {}
        for c in self._comms:
            k = seen[c.name] = seen.get(c.name, -1) + 1
            table[f"{c.name}#{k}"] = c._seq
        return table

    def _key(self, comm) -> str | None:
        if comm not in self._comms:
            return None
        k = sum(1 for c in self._comms[: self._comms.index(comm)] if c.name == comm.name)
        return f"{comm.name}#{k}"

    def _announce_at_the_exit_barrier(self) -> None:
        if self._announced is not None or self.end_how is None:
            return
        if not any(e.seq is None for e in list(self.pending.values())):
            return  # not at the exit barrier yet
        message = json.dumps({"how": self.end_how, "issued": self._issued()}).encode()
        buf = bytearray(message[:_ENDED_BYTES])
        self._announced = [(self._ctl.Isend([buf, self._mpi.BYTE], r, _TAG_ENDED), buf)
                           for r in range(self._size) if r != self._rank]

    def _post_ended_recv(self):
        self._ended_status = self._mpi.Status()
        self._ended_recv = self._ctl.Irecv([self._ended_buf, self._mpi.BYTE],
                                           self._mpi.ANY_SOURCE, _TAG_ENDED)

    def _hear_ends(self):
        while self._ended_recv.Test(self._ended_status):
            source = self._ended_status.Get_source()
            size = self._ended_status.Get_count(self._mpi.BYTE)
            try:
                note = json.loads(bytes(self._ended_buf[:size]))
                self._ended[source] = (str(note["how"]), dict(note["issued"]))
            except (ValueError, KeyError, TypeError):
                pass
            self._post_ended_recv()

    def _blocked_by_an_ended_rank(self):
        """(the collective this rank waits in, the ended rank that never issued it)."""
        if not self._ended:
            return None
        for entry in list(self.pending.values()):
            if entry.seq is None:  # the exit barrier: every rank ends there
                continue
            key = self._key(entry.comm)
            if key is None:
                continue
            for r, (_, issued) in self._ended.items():
                if r in entry.comm.world_ranks and issued.get(key, 0) < entry.seq:
                    return entry, r
        return None

    def _report_ended_and_abort(self, entry: Pending, rank: int) -> None:
        how, issued = self._ended[rank]
        done = issued.get(self._key(entry.comm), 0)
        abort_job(
            f"sbpflow watchdog: rank {self._rank}: {entry.op} #{entry.seq} on "
            f"{entry.comm.name} can never complete: rank {rank} has ended ({how}) after "
            f"issuing {done} collective{'s' if done != 1 else ''} on {entry.comm.name}. "
            "Aborting the job.", prefix=False)

    def _post_ask_recv(self):
        self._ask_recv = self._ctl.Irecv(
            [self._ask_buf, self._mpi.BYTE], self._mpi.ANY_SOURCE, _TAG_ASK)

    def _answer_asks(self):
        while self._ask_recv.Test(self._ask_status):
            asker = self._ask_status.Get_source()
            self._last_asked = time.monotonic()
            self._lowest_asker = min(self._lowest_asker, asker)
            answer = bytearray(self.describe().encode()[: _ANSWER_BYTES - 1])
            req = self._ctl.Isend([answer, self._mpi.BYTE], asker, _TAG_ANSWER)
            self._answers_out.append((req, answer))  # keep the buffer alive until sent
            self._post_ask_recv()
        self._answers_out = [(r, b) for r, b in self._answers_out if not r.Test()]

    def _ask_others(self) -> dict[int, str] | None:
        """Every other rank's `describe()`; None when a lower rank is reporting too."""
        mpi = self._mpi
        self._lowest_asker = self._size
        asks, answers, replies = [], {}, {}
        for r in range(self._size):
            if r == self._rank:
                continue
            asks.append(self._ctl.Isend([b"?", mpi.BYTE], r, _TAG_ASK))
            buf = bytearray(_ANSWER_BYTES)
            replies[r] = (self._ctl.Irecv([buf, mpi.BYTE], r, _TAG_ANSWER), buf)
        deadline = time.monotonic() + REPLY_WINDOW_S
        while replies and time.monotonic() < deadline:
            self._answer_asks()  # another rank may be reporting at the same moment
            if self._lowest_asker < self._rank:
                # Two ranks timed out together: the lower rank reports. The answers to our
                # own asks may still arrive: keep their buffers alive for MPI to write into.
                self._abandoned.append((asks, replies))
                return None
            for r, (req, buf) in list(replies.items()):
                if req.Test():
                    answers[r] = bytes(buf).rstrip(b"\0").decode(errors="replace")
                    del replies[r]
            time.sleep(0.01)
        return answers

    def _report_and_abort(self, late: Pending):
        now = time.monotonic()
        states = {self._rank: self.describe()}
        if self._can_talk:
            others = self._ask_others()
            if others is None:
                return
            states.update(others)
        lines = [
            f"sbpflow watchdog: rank {self._rank}: {late.op} #{late.seq} on {late.comm.name} "
            f"has waited {now - late.start:.1f} s, longer than the collective timeout of "
            f"{_timeout_s:g} s ({TIMEOUT_ENV} or sbpflow.comm.set_collective_timeout).",
            "The ranks have diverged (one skipped or reordered a collective, or is stuck). "
            "What each rank is doing:",
        ]
        for r in range(self._size):
            state = states.get(r)
            if state is None:
                state = (f"no answer within {REPLY_WINDOW_S:g} s (exited, crashed, or blocked "
                         "outside MPI)" if self._can_talk else "unknown (MPI thread level is "
                         "below MULTIPLE, so ranks cannot be asked)")
            lines.append(f"  rank {r}: {state}")
        lines.append("Aborting the job.")
        abort_job("\n".join(lines), prefix=False)

    # -- shutdown -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the thread and withdraw its receive, so MPI can be finalized."""
        self._stop.set()
        self._thread.join(timeout=5 * POLL_S + 1)
        for name in ("_ask_recv", "_ended_recv"):
            req = getattr(self, name)
            if req is not None:
                req.Cancel()
                req.Wait()
                setattr(self, name, None)
        deadline = time.monotonic() + REPLY_WINDOW_S
        while self._announced and time.monotonic() < deadline:  # small: sent at once
            self._announced = [(r, b) for r, b in self._announced if not r.Test()]
            if self._announced:
                time.sleep(0.002)
