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

# Message kinds.
REGST = 0  # a produced slot is readable (producer -> consumer)
ACK = 1  # a consumer is done with a slot (consumer -> producer)
EORD = 2  # end of data: no more job instances (producer -> consumer)
START = 3  # a new job instance (caller -> source)

_KIND_NAMES = {REGST: "regst", ACK: "ack", EORD: "eord", START: "start"}


class ActorMsg:
    __slots__ = ("kind", "dst", "src", "slot")

    def __init__(self, kind: int, dst: int, src: int, slot=None):
        self.kind = kind
        self.dst = dst  # actor (task) id
        self.src = src  # actor id, -1 for the caller
        self.slot = slot  # RegisterSlot for REGST/ACK, the job instance for START

    def __repr__(self):
        return f"ActorMsg({_KIND_NAMES[self.kind]}, {self.src} -> {self.dst}, {self.slot!r})"


class MessageBus:
    """Routes messages to the queue of the destination actor's thread."""

    def __init__(self, thread_of: dict[int, int], inline: bool):
        self.thread_of = thread_of  # actor id -> thread id
        self.inline = inline
        self.actors: dict = {}
        self.sent = 0
        if inline:
            self._deque: collections.deque = collections.deque()
            self.send = self._send_inline
        else:
            self._queues = {t: queue.SimpleQueue() for t in set(thread_of.values())}
            self._threads: list[threading.Thread] = []
            self.send = self._send_threaded

    # -- inline ------------------------------------------------------------------------------
    def _send_inline(self, msg: ActorMsg) -> None:
        self._deque.append(msg)

    def drain(self) -> None:
        """Inline mode: dispatch messages on this thread until none is left."""
        q = self._deque
        actors = self.actors
        pop = q.popleft
        while q:
            msg = pop()
            actors[msg.dst].on_msg(msg)

    def clear(self) -> None:
        if self.inline:
            self._deque.clear()

    # -- threaded ----------------------------------------------------------------------------
    def _send_threaded(self, msg: ActorMsg) -> None:
        self._queues[self.thread_of[msg.dst]].put(msg)

    def start(self, name: str = "plan") -> None:
        if self.inline or self._threads:
            return
        for tid, q in sorted(self._queues.items()):
            th = threading.Thread(target=self._loop, args=(q,), daemon=True,
                                  name=f"sbpflow-actor-{name}-{tid}")
            th.start()
            self._threads.append(th)

    def _loop(self, q) -> None:
        actors = self.actors
        get = q.get
        while True:
            msg = get()
            if msg is None:
                return
            actors[msg.dst].on_msg(msg)

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
