"""Streams: FIFO queues of instructions, each drained by one worker thread.

Instructions on one stream run in issue order.  The worker takes everything queued at once (a
batch), runs it, then publishes how far it got; waiters block on that counter, so no per-
instruction event is ever created.  An instruction that depends on another stream waits for
that stream's counter before running.
"""

from __future__ import annotations

import collections
import threading


class Stream:
    def __init__(self, name: str, vm):
        self.name = name
        self.vm = vm
        self.issued = 0  # seq of the last instruction issued (Python thread)
        self.completed = 0  # seq of the last instruction finished (worker)
        self.handed_off = 0  # instructions pushed to the worker (the rest ran inline)
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._sleeping = False
        self._waiters = 0
        self._thread: threading.Thread | None = None
        self._stop = False

    def __repr__(self):
        return f"Stream({self.name})"

    # -- Python thread --------------------------------------------------------------------
    def push(self, instr) -> None:
        self.handed_off += 1
        self._queue.append(instr)
        if self._sleeping:
            with self._cond:
                self._cond.notify()
        elif self._thread is None:
            self._start()

    def wait(self, seq: int) -> None:
        """Block until instruction `seq` of this stream has run."""
        if self.completed >= seq:
            return
        with self._cond:
            self._waiters += 1
            try:
                while self.completed < seq:
                    if self._sleeping and self._queue:
                        self._cond.notify()
                    self._cond.wait(0.05)
            finally:
                self._waiters -= 1

    # -- worker ---------------------------------------------------------------------------
    def _start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"sbpflow-vm-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        queue = self._queue
        run = self.vm._run
        while not self._stop:
            if not queue:
                with self._cond:
                    self._sleeping = True
                    while not queue and not self._stop:
                        self._cond.wait(0.1)
                    self._sleeping = False
                continue
            # One batch: everything queued now.
            for _ in range(len(queue)):
                instr = queue.popleft()
                run(instr)
                self.completed = instr.seq
                if self._waiters:
                    with self._cond:
                        self._cond.notify_all()

    def stop(self) -> None:
        self._stop = True
        with self._cond:
            self._cond.notify_all()
