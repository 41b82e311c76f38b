"""The message bus: actors talk only through `ActorMsg`s on per-thread queues.

Each actor lives on one thread; a message goes to the queue of its destination's thread,
and that thread dispatches it to the actor.  In the inline mode every actor lives on the
calling thread and the bus is one deque that the caller drains (a per-step hand-off between
threads costs tens of microseconds under the GIL); in the threaded mode each thread id of the
plan gets a real thread that blocks on its queue.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, NamedTuple

# Message kinds.
REGST = 0  # a produced slot is readable (producer -> consumer)
ACK = 1  # a consumer is done with a slot (consumer -> producer)
EORD = 2  # end of data: no more job instances (producer -> consumer)
START = 3  # a new job instance (caller -> source)

_KIND_NAMES = {REGST: "regst", ACK: "ack", EORD: "eord", START: "start"}


class ActorMsg(NamedTuple):
    """A message: (destination actor, kind, payload).  The payload is a RegisterSlot for
    REGST and ACK, the job instance for START, None for EORD.  On the hot path actors send
    plain tuples of the same layout (building a NamedTuple costs ten times more)."""

    dst: Any
    kind: int
    slot: Any = None

    def __repr__(self):
        name = getattr(self.dst, "name", self.dst)
        return f"ActorMsg({_KIND_NAMES[self.kind]} -> {name}, {self.slot!r})"


class MessageBus:
    """Routes messages to the queue of the destination actor's thread."""

    def __init__(self, thread_of: dict[int, int], inline: bool):
        self.thread_of = thread_of  # actor id -> thread id
        self.inline = inline
        # Threaded mode: fn(actor, exception) for a failure outside an act (a protocol bug),
        # which leaves the actors' state unknown.
        self.on_fatal = None
        if inline:
            self._deque: collections.deque = collections.deque()
            self.send = self._deque.append  # no Python frame per message
        else:
            self._queues = {t: queue.SimpleQueue() for t in set(thread_of.values())}
            self._threads: list[threading.Thread] = []
            self.send = self._send_threaded

    # -- inline ------------------------------------------------------------------------------
    def drain(self) -> None:
        """Inline mode: dispatch messages on this thread until none is left."""
        q = self._deque
        pop = q.popleft
        while q:
            dst, kind, slot = pop()
            dst.on_msg(kind, slot)

    def clear(self) -> None:
        if self.inline:
            self._deque.clear()

    # -- threaded ----------------------------------------------------------------------------
    def _send_threaded(self, msg) -> None:
        self._queues[self.thread_of[msg[0].id]].put(msg)

    def start(self, name: str = "plan") -> None:
        if self.inline or self._threads:
            return
        for tid, q in sorted(self._queues.items()):
            th = threading.Thread(target=self._loop, args=(q,), daemon=True,
                                  name=f"sbpflow-actor-{name}-{tid}")
            th.start()
            self._threads.append(th)

    def _loop(self, q) -> None:
        get = q.get
        while True:
            msg = get()
            if msg is None:
                return
            dst, kind, slot = msg
            try:
                dst.on_msg(kind, slot)
            except BaseException as e:  # noqa: BLE001 - a broken protocol must not hang callers
                on_fatal = self.on_fatal
                if on_fatal is not None:
                    on_fatal(dst, e)

    def stop(self, join: bool = True) -> None:
        """Threaded mode: end every thread (after the messages already queued)."""
        if self.inline:
            return
        for q in self._queues.values():
            q.put(None)
        if join:
            for th in self._threads:
                if th is not threading.current_thread():
                    th.join()
        self._threads = []
