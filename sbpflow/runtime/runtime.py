"""The Runtime: links a Plan (kernels, generated chains, registers, actors) and runs job
instances on it.

    rt = Runtime(plan, variables={"fc.weight": w, ...}, resolve=None)
    outs = rt.run([x], {"lr": 0.1})      # the graph call: one VM instruction (launch.py)

    inst = rt.launch(Instance([x_array], feeds, rt.draw_rng()))   # lower level: arrays
    inst.event.wait()                    # threaded plans: returns at once, runs ahead
    rt.stop()                            # end of data: drain, then end the actor threads

`resolve(op_desc) -> kernel or None` finds kernels of op types that are not registered ops
(the graph layer passes it; runtime/ never imports graph/).  Every actor of a plan whose
tasks all sit on thread 0 runs on the calling thread: the graph call drains the message bus
inline.  Otherwise each thread id gets its own thread.  `trace=True` records (task, piece)
at every act in `rt.trace`; `profile=True` times every op of the chains (`rt.op_times()`).
"""

from __future__ import annotations

import collections
import threading

import numpy as np

from ..device import Device
from .actor import (
    ComputeActor,
    CopyInActor,
    CopyOutActor,
    Instance,
    SinkActor,
    SourceActor,
    TickActor,
)
from .bus import EORD, START, MessageBus
from .chain import STRUCTURAL, Chain, StepFacts, link_op
from .launch import GraphCall
from .register import Register


class Runtime:
    def __init__(self, plan, variables: dict | None = None, resolve=None, trace: bool = False,
                 profile: bool = False):
        self.plan = plan
        self.variables = dict(variables or {})
        missing = sorted(v for v in set(plan.variables.values())
                         if self.variables.get(v) is None)
        if missing:
            raise ValueError(f"Runtime of plan {plan.name}: no tensor given for variables "
                             f"{missing}")
        self.device = Device(plan.device)
        prims = self.prims = self.device.prims
        self.trace: list | None = [] if trace else None

        # Kernels, and the generator draws of random ops (in execution order, as eager).
        linked = {}
        random_ops = []
        for task in plan.tasks:
            for op in task.ops:
                if op.op_type in STRUCTURAL:
                    continue
                lk = linked[op.name] = link_op(op, resolve)
                if lk.random:
                    random_ops.append(op)
        self.random_ops = tuple(op.name for op in random_ops)
        self.rng_words = tuple(
            # the logical draw, on every rank (a piece of a global tensor takes its part)
            prims.words_used("normal",
                             sum(plan.tensors[t].logical_meta.numel for t in op.outputs))
            for op in random_ops)
        rng_index = {name: j for j, name in enumerate(self.random_ops)}

        # Registers: the input copy's slots hold planned buffers.
        self.registers: dict[int, Register] = {}
        for rd in plan.registers:
            producer = plan.task(rd.producer)
            buffers = None
            if producer.kind == "copy_in" and not rd.by_ref:
                buffers = [[prims.empty(plan.tensors[t].shape, plan.tensors[t].meta.dtype)
                            for t in rd.blobs] for _ in range(rd.register_num)]
            self.registers[rd.id] = Register(rd, buffers)

        # Actors, on their threads.
        thread_of = {t.id: t.thread for t in plan.tasks}
        self.inline = set(thread_of.values()) == {0}
        self.bus = bus = MessageBus(thread_of, self.inline)
        self.actors: dict = {}
        self.chains: dict[str, Chain] = {}
        self.blocks: dict[str, np.ndarray] = {}
        self.source = self.sink = None
        facts = StepFacts(plan, linked)
        regs, tr = self.registers, self.trace
        for task in plan.tasks:
            if task.kind == "source":
                actor = self.source = SourceActor(task, regs, bus, tr)
            elif task.kind == "copy_in":
                actor = CopyInActor(task, regs, bus, prims, tr)
            elif task.kind in ("compute", "boxing"):  # a boxing task: a chain of one node
                block = None
                if task.mem_bytes:
                    key = task.block or task.name
                    block = self.blocks.get(key)
                    if block is None:
                        block = self.blocks[key] = _block(plan, task)
                chain = self.chains[task.name] = Chain(task, plan, linked, self.variables,
                                                       prims, block, rng_index, profile,
                                                       facts)
                actor = ComputeActor(task, regs, bus, chain, tr)
            elif task.kind == "copy_out":
                actor = CopyOutActor(task, regs, bus, prims, self._picks(task), tr)
            elif task.kind == "tick":
                actor = TickActor(task, regs, bus, tr)
            elif task.kind == "sink":
                actor = self.sink = SinkActor(task, regs, bus, tr)
            else:
                raise ValueError(f"plan {plan.name}: unknown task kind {task.kind!r}")
            self.actors[task.id] = actor
        if self.source is None or self.sink is None:
            raise ValueError(f"plan {plan.name} needs a source and a sink task")
        for actor in self.actors.values():
            actor.connect(self.actors)
        self._pieces = 0
        self._lock = threading.Lock()
        self._inflight: collections.deque = collections.deque()  # threaded: unfinished
        self._broken: BaseException | None = None
        bus.on_fatal = self._fatal
        self._closed = False
        self.in_metas = tuple(plan.tensors[t].meta for t in plan.inputs)
        self.out_metas = tuple(plan.tensors[t].meta for t in plan.outputs)
        bus.start(plan.name)
        # rt.graph_call(inputs, feeds) is rt.run without one Python frame.
        self.graph_call = GraphCall(self)

    def _picks(self, task):
        """copy_out: per output, (index in the compute register's arrays, copy or not)."""
        plan = self.plan
        rd = self.registers[task.consumed[0]].desc
        # the chains of every compute task: an output may be made by an earlier one and
        # passed on through the registers between them
        copied = set().union(*(c.copied for c in self.chains.values()))
        planned = set().union(*(c.planned for c in self.chains.values()))
        picks, seen = [], set()
        for name in plan.outputs:
            t = plan.tensors[name]
            fresh = name in copied or (t.root == "own" and not t.view and name not in planned)
            picks.append((rd.blobs.index(name), not fresh or name in seen))
            seen.add(name)
        return picks

    # -- running -------------------------------------------------------------------------------
    def draw_rng(self):
        """(seed, offset) for every random op of one call, drawn now (at issue, as eager)."""
        if not self.rng_words:
            return ()
        from ..framework.generator import default_generator

        take = default_generator.take
        return tuple(take(w) for w in self.rng_words)

    def launch(self, inst: Instance) -> Instance:
        """Start a job instance.  Inline mode: run it to completion here.  Threaded mode:
        return at once; `inst.event` (or `inst.callback`) says when it is done."""
        if self._closed:
            raise RuntimeError(f"Runtime of plan {self.plan.name} is closed")
        if self.inline:
            with self._lock:
                inst.piece = self._pieces
                self._pieces += 1
                self.bus.send((self.source, START, inst))
                try:
                    self.bus.drain()
                except BaseException:
                    self._reset()
                    raise
                if not inst.done:  # a protocol bug: never leave the runtime wedged
                    self._reset()
                    raise RuntimeError(f"plan {self.plan.name}: job instance {inst.piece} "
                                       "did not reach the sink")
            return inst
        if inst.event is None:
            inst.event = threading.Event()
        with self._lock:
            if self._broken is not None:
                raise RuntimeError(f"plan {self.plan.name}: the actor runtime failed earlier "
                                   f"and is unusable: {self._broken!r}")
            inst.piece = self._pieces
            self._pieces += 1
            inflight = self._inflight
            while inflight and inflight[0].done:
                inflight.popleft()
            inflight.append(inst)
        self.bus.send((self.source, START, inst))
        return inst

    def _fatal(self, actor, err: BaseException) -> None:
        """Threaded mode: an actor failed outside an act.  Fail every unfinished instance
        (so no caller waits forever) and refuse new ones."""
        with self._lock:
            self._broken = err
            pending = [inst for inst in self._inflight if not inst.done]
            self._inflight.clear()
        for inst in pending:
            if inst.error is None:
                inst.error = RuntimeError(
                    f"plan {self.plan.name}: actor {actor.name} failed: {err!r}")
                inst.error.__cause__ = err
            inst.finish()
        self.sink.drained.set()

    def run_instance(self, inputs, feeds=None, rng=None):
        """Run one job instance on arrays; return its output arrays (raise its error)."""
        inst = Instance(list(inputs), feeds or {}, self.draw_rng() if rng is None else rng)
        self.launch(inst)
        if not self.inline:
            inst.event.wait()
        if inst.error is not None:
            raise inst.error
        return inst.results

    def run(self, inputs, feeds=None):
        """The graph call: one VM instruction that runs a job instance on the tensors'
        memory.  Returns new eager tensors for the outputs."""
        return self.graph_call(inputs, feeds)

    def op_times(self) -> str:
        """A table of each op's time per call, slowest first (link with profile=True)."""
        rows = [(op, t) for chain in self.chains.values() for op, t in chain.op_times()]
        rows.sort(key=lambda x: -x[1])
        total = sum(t for _, t in rows) or 1.0
        lines = [f"{'us/call':>9} {'share':>6}  op"]
        for op, t in rows:
            lines.append(f"{t * 1e6:9.1f} {t / total:6.1%}  {op.op_type} ({op.name}) "
                         f"at {op.where()}")
        lines.append(f"{total * 1e6:9.1f} {1:6.0%}  total")
        return "\n".join(lines)

    def reset_op_times(self) -> None:
        """Start the op timings afresh (e.g. after warm-up calls that compiled kernels)."""
        for chain in self.chains.values():
            if chain.profile:
                chain.times[:] = [0.0] * len(chain.times)
                chain.calls[0] = 0

    def _reset(self) -> None:
        self.bus.clear()
        for a in self.actors.values():
            a.reset(self.registers)

    def stop(self, timeout: float | None = None) -> None:
        """End of data: let every launched instance finish, then drain and stop the actor
        threads.  The runtime takes no more instances."""
        if self._closed:
            return
        self.graph_call.wait()  # graph calls still queued in the VM run first
        self._closed = True
        self.bus.send((self.source, EORD, None))
        if self.inline:
            self.bus.drain()
        elif not self.sink.drained.wait(timeout):
            raise TimeoutError(f"plan {self.plan.name}: the runtime did not drain")
        self.bus.stop()

    close = stop

    def __del__(self):
        try:
            if not self.inline and not self._closed:
                self._closed = True
                self.bus.stop(join=False)
        except Exception:
            pass

    def __repr__(self):
        mode = "inline" if self.inline else f"threads {sorted(set(self.bus.thread_of.values()))}"
        return f"Runtime({self.plan.name}, {len(self.actors)} actors, {mode})"


def _block(plan, task) -> np.ndarray:
    """The memory block of a compute task; a MemoryError names the op with the largest
    planned buffer in it (what the user can change), not only the byte count."""
    try:
        return np.empty(task.mem_bytes, np.uint8)
    except MemoryError as e:
        sizes = [(plan.tensors[t].mem[1], op) for op in task.ops for t in op.outputs
                 if plan.tensors[t].mem is not None]
        if not sizes:
            raise
        nbytes, op = max(sizes, key=lambda s: s[0])
        raise MemoryError(
            f"plan {plan.name}: cannot allocate the {task.mem_bytes:,}-byte memory block of "
            f"task {task.name} ({len(task.ops)} ops); its largest buffer, {nbytes:,} bytes, "
            f"is the output of op {op.op_type} ({op.name}) at {op.where()}") from e
