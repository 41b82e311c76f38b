"""Actors: one per task.  They talk only by messages (see bus.py).

An actor acts when every register it consumes has a readable slot and every register it
produces has a free slot.  Acting fills the produced slots, sends each to the consumers of its
register (REGST) and returns each consumed slot to its producer (ACK); a slot that all its
readers returned is free again.  There is no central scheduler: register counts alone give
pipelining and back-pressure.  End of data (EORD) flows from the source down once everything
before it has drained.

A failure while acting does not break the protocol: the job instance records the error, the
downstream actors skip their work for it, and the sink hands the error to the caller, so the
runtime stays usable.
"""

from __future__ import annotations

import collections
import threading

from .bus import ACK, EORD, REGST, START

# Set by sbpflow.profiler while it records: runs and times one act of an actor.
_tracer = None


class RuntimeKernelError(RuntimeError):
    """Base of errors raised by a kernel inside a compute chain; the concrete class also
    derives from the kernel's own exception type (as the VM's KernelError does)."""


def wrap_kernel_error(op, err: BaseException) -> BaseException:
    """err, re-raised naming the op type, the op's name and its build() line."""
    msg = f"{op.op_type} ({op.name}) at {op.where()}: {err}"
    cls = type(err)
    try:
        wrapped = type(cls.__name__, (cls, RuntimeKernelError),
                       {"__module__": cls.__module__})(msg)
    except Exception:
        wrapped = RuntimeKernelError(msg)
    wrapped.__cause__ = err
    return wrapped


class Instance:
    """One job instance (one graph call): what the caller gives and gets back."""

    __slots__ = ("piece", "inputs", "feeds", "rng", "results", "error", "done", "event",
                 "callback")

    def __init__(self, inputs, feeds=None, rng=(), event=None, callback=None):
        self.piece = -1  # set by the runtime: the instance number
        self.inputs = inputs  # the caller's input arrays
        self.feeds = feeds  # host scalars by key
        self.rng = rng  # (seed, offset) per random op, drawn when the call was issued
        self.results = None  # output arrays, in output order
        self.error = None
        self.done = False
        self.event = event
        self.callback = callback

    def finish(self) -> None:
        self.done = True
        if self.callback is not None:
            self.callback(self)
        if self.event is not None:
            self.event.set()


class Actor:
    kind = "actor"

    def __init__(self, desc, registers: dict, bus, trace=None):
        self.id = desc.id
        self.name = desc.name
        self.desc = desc
        self.bus = bus
        self.trace = trace  # a list to append (task name, piece) to at every act, or None
        self.consumed = tuple(desc.consumed)
        self.produced = tuple(desc.produced)
        self.readable = {r: collections.deque() for r in self.consumed}
        self.free = {r: collections.deque(registers[r].slots) for r in self.produced}
        self._in = [self.readable[r] for r in self.consumed]
        self._out = [self.free[r] for r in self.produced]
        self._registers = registers
        self.acted = 0
        self._eords = 0
        self.done = False  # end of data passed on

    def connect(self, actors: dict) -> None:
        """Resolve the actors at the other ends of this actor's registers."""
        regs = self._registers
        # Per produced register: its consumers; per consumed register: its producer.
        self._consumers = [tuple(actors[c] for c in regs[r].desc.consumers)
                           for r in self.produced]
        self._producer = {r: actors[regs[r].desc.producer] for r in self.consumed}
        self._n_producers = len({regs[r].desc.producer for r in self.consumed})
        if (type(self).try_act is Actor.try_act and len(self._in) == 1
                and len(self._out) == 1):
            self.try_act = self._try_act_single  # the common shape, without the lists

    def reset(self, registers: dict) -> None:
        """Back to the initial state: every produced slot free, nothing readable."""
        for r in self.consumed:
            self.readable[r].clear()
        for r in self.produced:
            free = self.free[r]
            free.clear()
            for slot in registers[r].slots:
                slot.readers = 0
                slot.inst = None
                if not slot.persistent:
                    slot.arrays = None
                free.append(slot)
        self._eords = 0
        self.done = False

    # -- messages ----------------------------------------------------------------------------
    def on_msg(self, kind: int, slot) -> None:
        if kind == REGST:
            self.readable[slot.reg].append(slot)
        elif kind == ACK:
            slot.readers -= 1
            if slot.readers:
                return
            if not slot.persistent:
                slot.arrays = None
            slot.inst = None
            self.free[slot.reg].append(slot)
            if not self._eords:
                for q in self._in:  # nothing to read: a free slot alone does not act
                    if not q:
                        return
        elif kind == EORD:
            self._eords += 1
        elif kind == START:
            self.start(slot)
        self.try_act()
        if self._eords and not self.done:
            self._maybe_end()

    def start(self, inst) -> None:
        raise RuntimeError(f"actor {self.name} ({self.kind}) got a job instance")

    def try_act(self) -> None:
        ins_q, outs_q = self._in, self._out
        send = self.bus.send
        while True:
            for q in ins_q:
                if not q:
                    return
            for q in outs_q:
                if not q:
                    return
            ins = [q.popleft() for q in ins_q]
            outs = [q.popleft() for q in outs_q]
            inst = ins[0].inst
            try:
                if _tracer is None:
                    self.act(inst, ins, outs)
                else:  # sbpflow.profiler is recording
                    _tracer(self, inst, ins, outs)
            except BaseException as e:  # noqa: BLE001 - the caller gets it through the sink
                if inst.error is None:
                    inst.error = self.wrap(e)
            self.acted += 1
            if self.trace is not None:
                self.trace.append((self.name, inst.piece))
            for slot, consumers in zip(outs, self._consumers):
                slot.inst = inst
                slot.readers = len(consumers)
                for c in consumers:
                    send((c, REGST, slot))
            producer = self._producer
            for slot in ins:
                send((producer[slot.reg], ACK, slot))

    def _try_act_single(self) -> None:
        iq, oq = self._in[0], self._out[0]
        consumers = self._consumers[0]
        n = len(consumers)
        producer = self._producer[self.consumed[0]]
        send = self.bus.send
        while iq and oq:
            src = iq.popleft()
            slot = oq.popleft()
            inst = src.inst
            try:
                if _tracer is None:
                    self.act(inst, (src,), (slot,))
                else:  # sbpflow.profiler is recording
                    _tracer(self, inst, (src,), (slot,))
            except BaseException as e:  # noqa: BLE001 - the caller gets it through the sink
                if inst.error is None:
                    inst.error = self.wrap(e)
            self.acted += 1
            if self.trace is not None:
                self.trace.append((self.name, inst.piece))
            slot.inst = inst
            slot.readers = n
            for c in consumers:
                send((c, REGST, slot))
            send((producer, ACK, src))

    def act(self, inst, ins, outs) -> None:
        pass

    def wrap(self, err: BaseException) -> BaseException:
        return err

    # -- end of data -------------------------------------------------------------------------
    def _maybe_end(self) -> None:
        if self._eords < self._n_producers or any(self._in):
            return
        self.end()

    def end(self) -> None:
        self.done = True
        sent = set()
        for consumers in self._consumers:
            for c in consumers:
                if c.id not in sent:
                    sent.add(c.id)
                    self.bus.send((c, EORD, None))


class SourceActor(Actor):
    """Starts job instances: one tick per instance the caller started."""

    kind = "source"

    def __init__(self, desc, registers, bus, trace=None):
        super().__init__(desc, registers, bus, trace)
        self.pending: collections.deque = collections.deque()
        self._eord_requested = False

    def reset(self, registers):
        super().reset(registers)
        self.pending.clear()
        self._eord_requested = False

    def start(self, inst) -> None:
        self.pending.append(inst)

    def try_act(self) -> None:
        send = self.bus.send
        pending = self.pending
        outs_q = self._out
        while pending:
            for q in outs_q:
                if not q:
                    return
            inst = pending.popleft()
            self.acted += 1
            if self.trace is not None:
                self.trace.append((self.name, inst.piece))
            for q, consumers in zip(outs_q, self._consumers):
                slot = q.popleft()
                slot.inst = inst
                slot.readers = len(consumers)
                for c in consumers:
                    send((c, REGST, slot))

    def on_msg(self, kind, slot) -> None:
        if kind == EORD:  # from the caller: end once the pending instances are out
            self._eord_requested = True
        else:
            Actor.on_msg(self, kind, slot)
        if self._eord_requested and not self.done and not self.pending:
            self.end()


class CopyInActor(Actor):
    """Copies the call's input arrays into its register's planned buffers (or, for a register
    by reference, hands the arrays on)."""

    kind = "copy_in"

    def __init__(self, desc, registers, bus, prims, trace=None):
        super().__init__(desc, registers, bus, trace)
        self._copyto = prims.copy
        self._by_ref = bool(self.produced) and registers[self.produced[0]].desc.by_ref

    def act(self, inst, ins, outs) -> None:
        arrays = inst.inputs
        inst.inputs = None  # the caller's arrays are not needed past this point
        if inst.error is not None or not outs:
            return
        if self._by_ref:
            outs[0].arrays = arrays
            return
        copy = self._copyto
        for buf, a in zip(outs[0].arrays, arrays):
            copy(buf, a)


class ComputeActor(Actor):
    """Runs its chain of ops (generated straight-line code) on the consumed slots."""

    kind = "compute"

    def __init__(self, desc, registers, bus, chain, trace=None):
        super().__init__(desc, registers, bus, trace)
        self.chain = chain
        self._fn = chain.fn

    def act(self, inst, ins, outs) -> None:
        if inst.error is not None:
            return
        if len(ins) == 1:
            args = ins[0].arrays or ()
        else:
            args = [a for s in ins for a in (s.arrays or ())]
        results = self._fn(args, inst.feeds, inst.rng, inst.piece)
        for slot in outs:
            slot.arrays = results

    def wrap(self, err: BaseException) -> BaseException:
        op = self.chain.op_at(err.__traceback__)
        if op is None:
            return err
        return wrap_kernel_error(op, err)


class CopyOutActor(Actor):
    """Hands the outputs to the caller: as they are when the chain made them fresh, else
    as C-contiguous copies (views, planned buffers, constants)."""

    kind = "copy_out"

    def __init__(self, desc, registers, bus, prims, picks, trace=None):
        super().__init__(desc, registers, bus, trace)
        self._copy = prims.contiguous
        # Per output: (index in the consumed slot's arrays, whether to copy).
        self._picks = picks

    def act(self, inst, ins, outs) -> None:
        if inst.error is not None:
            return
        arrays = ins[0].arrays
        cp = self._copy
        inst.results = [cp(arrays[i]) if copy else arrays[i] for i, copy in self._picks]


class TickActor(Actor):
    """Joins completions: acts once every consumed register has this instance's slot."""

    kind = "tick"


class SinkActor(Actor):
    """Notifies the caller that an instance finished (or failed)."""

    kind = "sink"

    def __init__(self, desc, registers, bus, trace=None):
        super().__init__(desc, registers, bus, trace)
        self.drained = threading.Event()

    def reset(self, registers):
        super().reset(registers)
        self.drained.clear()

    def act(self, inst, ins, outs) -> None:
        inst.finish()

    def end(self) -> None:
        self.done = True
        self.drained.set()
