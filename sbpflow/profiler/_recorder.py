"""The recorder: installs the profiler's hooks and collects raw events.

The hot paths hold one module-level hook each, `None` unless a profiler records:
`framework.interpreter._op_hook` (Python-side op dispatch), `vm.machine._tracer` (an
instruction run on its stream), `runtime.actor._tracer` (an actor's act in an nn.Graph run)
and `framework.global_tensor._box_hook` (a boxing's steps, collective and bytes).  Installing
swaps those names; nothing else changes, so an unprofiled run pays one `is None` test.

A raw event is a tuple (name, category, track, start_ns, end_ns, args) appended to one list
(list.append is atomic under the GIL, so the VM's worker threads append without a lock).
A track is a Python thread id, or a string for a VM stream ("stream cpu", "stream comm"...):
an instruction shows on its stream's track whether a worker or the issuing thread ran it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from threading import get_ident

_clock = time.perf_counter_ns
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Recorder:
    """One recording session: the options, the raw events and the track names."""

    def __init__(self, record_shapes=False, profile_memory=False, with_stack=False):
        self.record_shapes = bool(record_shapes)
        self.profile_memory = bool(profile_memory)
        self.with_stack = bool(with_stack)
        self.events: list = []
        self.thread_names: dict = {}  # Python thread id -> name
        self.enabled = False
        # Wall-clock base, so that the traces of several ranks line up when merged.
        self.wall0_ns = time.time_ns()
        self.perf0_ns = _clock()

    def name_thread(self, tid) -> None:
        if tid not in self.thread_names:
            self.thread_names[tid] = threading.current_thread().name


_active: Recorder | None = None


def active() -> Recorder | None:
    return _active


# -- helpers --------------------------------------------------------------------------------
def _shape_of(x) -> list:
    meta = getattr(x, "_meta", None)
    return list(meta.shape) if meta is not None else []


def _input_shapes(opdef, inputs) -> list:
    items = inputs[0] if opdef.variadic and inputs else inputs
    return [_shape_of(t) for t in items]


def _out_bytes(out) -> int:
    n = 0
    for t in out if isinstance(out, tuple) else (out,):
        meta = getattr(t, "_meta", None)
        if meta is not None:
            n += meta.numel * meta.dtype.itemsize
    return n


def _user_stack(limit: int = 8) -> list:
    """The Python frames outside the sbpflow package, innermost first."""
    out = []
    f = sys._getframe(2)
    while f is not None and len(out) < limit:
        code = f.f_code
        if not code.co_filename.startswith(_PKG_DIR):
            out.append(f"{code.co_filename}({f.f_lineno}): {code.co_name}")
        f = f.f_back
    return out


# -- the hooks ------------------------------------------------------------------------------
def _op_hook(opdef, inputs, attrs, device, generator):
    """interpreter.apply while recording: the Python-side dispatch of one op, as an event."""
    from ..framework import interpreter

    rec = _active
    out = None
    t0 = _clock()
    try:
        out = interpreter.apply(opdef, inputs, attrs, device, generator, _profiled=True)
        return out
    finally:
        t1 = _clock()
        if rec is not None and rec.enabled:
            tid = get_ident()
            rec.name_thread(tid)
            args = {}
            if rec.record_shapes:
                args["Input Dims"] = _input_shapes(opdef, inputs)
            if rec.profile_memory and out is not None:
                args["Bytes"] = _out_bytes(out)
            if rec.with_stack:
                args["Call stack"] = _user_stack()
            rec.events.append((opdef.name, "cpu_op", tid, t0, t1, args))


def _vm_tracer(instr):
    """VirtualMachine._run while recording: one instruction, on its stream's track."""
    rec = _active
    shapes = None
    if rec is not None and rec.record_shapes:
        ctx = getattr(instr, "ctx", None)  # an op call's; cleared once it ran
        if ctx is not None:
            shapes = [list(m.shape) for m in ctx.in_metas]
    t0 = _clock()
    try:
        instr.run()
    finally:
        t1 = _clock()
        if rec is not None and rec.enabled:
            args = {"kind": instr.kind, "seq": instr.seq,
                    "thread": threading.current_thread().name,
                    "ran on": "stream worker" if instr.owner is not None else "issuing thread"}
            if shapes is not None:
                args["Input Dims"] = shapes
            stream = instr.stream
            track = "stream " + (stream.name if stream is not None else "?")
            rec.events.append((instr.name, "vm_instruction", track, t0, t1, args))


def _actor_tracer(actor, inst, ins, outs):
    """An actor's act in an nn.Graph run, on the runtime thread that ran it."""
    rec = _active
    t0 = _clock()
    try:
        actor.act(inst, ins, outs)
    finally:
        t1 = _clock()
        if rec is not None and rec.enabled:
            tid = get_ident()
            rec.name_thread(tid)
            args = {"actor kind": actor.kind, "piece": inst.piece}
            ops = getattr(actor.desc, "ops", None)
            if ops:  # a compute actor: the kernels its chain ran
                args["ops"] = [op.op_type for op in ops]
            rec.events.append((actor.name, "actor", tid, t0, t1, args))


def _box_hook(run, route, rank):
    """The boxing's closure, timed as one event naming its steps, collectives and bytes (on
    the comm stream's track, nested in the "boxing" instruction that runs it)."""
    rec = _active
    if rec is None:
        return run
    steps = route.steps
    name = "boxing: " + (" + ".join(s.name for s in steps) if steps else "nothing")
    # The data each step handles: the block a collective works on, or the bytes a
    # redistribution sends (as BoxingRoute.explain() prints them); "cost" is the cost model's.
    step_bytes = [int(getattr(s._move, "block_bytes", None)
                      or getattr(s._move, "moved_bytes", 0)) for s in steps]
    args = {
        "collectives": [s.name for s in steps],
        "bytes": sum(step_bytes),
        "step bytes": step_bytes,
        "cost": route.cost,
        "steps": [s.describe() for s in steps],
        "shape": list(route.meta.shape),
        "from": f"{route.src[1]} on ranks {route.src[0].ranks}",
        "to": f"{route.dst[1]} on ranks {route.dst[0].ranks}",
        "rank": rank,
    }

    def timed():
        t0 = _clock()
        try:
            run()
        finally:
            if rec.enabled:
                rec.events.append((name, "boxing", "stream comm", t0, _clock(), args))

    return timed


def record_range(name: str, t0: int, t1: int, args=None) -> None:
    """A user range (record_function) on the calling thread."""
    rec = _active
    if rec is not None and rec.enabled:
        tid = get_ident()
        rec.name_thread(tid)
        rec.events.append((name, "user_annotation", tid, t0, t1, args))


# -- installing -----------------------------------------------------------------------------
_lock = threading.Lock()


def start(rec: Recorder) -> None:
    """Make rec the active recorder and swap the hooks in."""
    global _active
    from ..framework import global_tensor, interpreter
    from ..runtime import actor
    from ..vm import machine

    with _lock:
        if _active is not None and _active is not rec:
            raise RuntimeError("sbpflow.profiler: another profiler is already recording; "
                               "profilers cannot be nested")
        _active = rec
        rec.enabled = True
        interpreter._op_hook = _op_hook
        machine._tracer = _vm_tracer
        actor._tracer = _actor_tracer
        global_tensor._box_hook = _box_hook


def stop(rec: Recorder) -> None:
    """Finish the work in flight (so its instructions are recorded), then unhook."""
    global _active
    from ..framework import global_tensor, interpreter
    from ..runtime import actor
    from ..vm import machine

    try:
        machine.get_vm().synchronize()
    finally:
        with _lock:
            interpreter._op_hook = None
            machine._tracer = None
            actor._tracer = None
            global_tensor._box_hook = None
            rec.enabled = False
            if _active is rec:
                _active = None
