"""`sbpflow.profiler.profile`: torch.profiler's API over sbpflow's own events.

What is recorded (see _recorder.py for the hooks):
- "cpu_op": the Python-side dispatch of every op (`interpreter.apply`), on its thread;
- "vm_instruction": every VM instruction run, on its stream's track ("stream cpu" for
  compute, "stream comm" for collectives and boxing, "stream copy"), named by its op;
- "boxing": a boxing's steps (collective names) and bytes, inside its instruction;
- "actor": every act of an nn.Graph run's actors, on the runtime thread that ran it;
- "user_annotation": `record_function` ranges.

`key_averages()` rows are keyed by name: "# of Calls" counts the host-side events (op
dispatches, user ranges, actor acts); the VM columns sum the instructions of that name, and a
name with instructions only (release, boxing) gets a row counting its instructions.

Under MPI each rank records and exports its own trace, with pid = rank: one file per rank
(`export_chrome_trace` inserts `.rank<r>` before the suffix when the job has several ranks);
`merge_chrome_traces` joins them into one file whose tracks are grouped by rank.
"""

from __future__ import annotations

import enum
import gzip
import json
import os
import socket
import time
import warnings
from collections import defaultdict

from . import _recorder


class ProfilerActivity(enum.Enum):
    """As torch's: CPU is what sbpflow records; the others are accepted with a warning."""

    CPU = 0
    XPU = 1
    MTIA = 2
    CUDA = 3
    HPU = 4
    PrivateUse1 = 5


class DeviceType(enum.Enum):
    CPU = 0
    CUDA = 1


def supported_activities() -> set:
    return {ProfilerActivity.CPU}


def kineto_available() -> bool:
    return False


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def schedule(*, wait: int, warmup: int, active: int, repeat: int = 0, skip_first: int = 0,
             skip_first_wait: int = 0):
    """torch.profiler.schedule: the action for each step number (wait, warmup, active steps,
    the last active one saving; `repeat` cycles, 0 for ever)."""
    for name, v in (("wait", wait), ("warmup", warmup), ("repeat", repeat),
                    ("skip_first", skip_first), ("skip_first_wait", skip_first_wait)):
        if v < 0:
            raise AssertionError(f"schedule(): {name} must be >= 0, got {v}")
    if active <= 0:
        raise AssertionError(f"schedule(): active must be > 0, got {active}")
    if warmup == 0:
        warnings.warn("Profiler won't be using warmup, this can skew profiler results",
                      UserWarning, stacklevel=2)

    def schedule_fn(step: int) -> ProfilerAction:
        if step < 0:
            raise AssertionError(f"schedule: step must be >= 0, got {step}")
        if step < skip_first:
            return ProfilerAction.NONE
        step -= skip_first
        if skip_first_wait:  # the first cycle starts without its wait
            step += wait
        cycle = wait + warmup + active
        if repeat > 0 and step // cycle >= repeat:
            return ProfilerAction.NONE
        mod = step % cycle
        if mod < wait:
            return ProfilerAction.NONE
        if mod < wait + warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if mod < cycle - 1 else ProfilerAction.RECORD_AND_SAVE

    return schedule_fn


def _default_schedule(_step: int) -> ProfilerAction:
    return ProfilerAction.RECORD


def tensorboard_trace_handler(dir_name: str, worker_name: str | None = None,
                              use_gzip: bool = False):
    """on_trace_ready handler writing `<dir>/<worker>.<ns>.pt.trace.json[.gz]` (TensorBoard's
    profiler plugin and Perfetto read it)."""

    def handler(prof) -> None:
        os.makedirs(dir_name, exist_ok=True)
        name = worker_name or f"{socket.gethostname()}_{os.getpid()}"
        path = os.path.join(dir_name, f"{name}.{time.time_ns()}.pt.trace.json")
        if use_gzip:
            path += ".gz"
        prof.export_chrome_trace(path)

    return handler


# -- events ---------------------------------------------------------------------------------
def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f}s"
    if us >= 1e3:
        return f"{us / 1e3:.3f}ms"
    return f"{us:.3f}us"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("Gb", 1 << 30), ("Mb", 1 << 20), ("Kb", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} b"


class Interval:
    def __init__(self, start: float, end: float):
        self.start = start
        self.end = end

    def elapsed_us(self) -> float:
        return self.end - self.start


class FunctionEvent:
    """One recorded event (times in µs, relative to the start of profiling)."""

    def __init__(self, id, name, cat, track, thread, start_us, end_us, args):
        self.id = id
        self.name = name
        self.cat = cat  # cpu_op | vm_instruction | boxing | actor | user_annotation
        self.track = track  # the thread id, or "stream <name>" for VM instructions
        self.thread = thread  # the track's display name
        self.time_range = Interval(start_us, end_us)
        self.args = args or {}
        self.input_shapes = self.args.get("Input Dims", [])
        self.stack = self.args.get("Call stack", [])
        self.self_cpu_memory_usage = self.args.get("Bytes", 0)  # its outputs' bytes
        self.cpu_memory_usage = self.self_cpu_memory_usage  # plus its children's (set later)
        self.cpu_children: list = []
        self.cpu_parent = None
        self.count = 1
        self.is_user_annotation = cat == "user_annotation"
        self.device_type = DeviceType.CPU

    @property
    def key(self) -> str:
        return self.name

    @property
    def on_vm_stream(self) -> bool:
        return self.cat in ("vm_instruction", "boxing")

    @property
    def cpu_time_total(self) -> float:
        return self.time_range.elapsed_us()

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    def __repr__(self):
        return (f"<FunctionEvent id={self.id} name={self.name} cat={self.cat} "
                f"thread={self.thread} cpu_time_total={_fmt_us(self.cpu_time_total)} "
                f"input_shapes={self.input_shapes}>")


class FunctionEventAvg:
    """Events of one key (and input shapes) added up, as torch's."""

    def __init__(self, key: str, input_shapes=None):
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.device_time_total = 0.0  # time of this name's VM instructions (stream tracks)
        self.self_device_time_total = 0.0
        self.vm_instructions = 0
        self.cpu_memory_usage = 0
        self.self_cpu_memory_usage = 0
        self.is_user_annotation = False

    def _add_host(self, e: FunctionEvent) -> None:
        self.count += 1
        self.cpu_time_total += e.cpu_time_total
        self.self_cpu_time_total += e.self_cpu_time_total
        self.cpu_memory_usage += e.cpu_memory_usage
        self.self_cpu_memory_usage += e.self_cpu_memory_usage
        self.is_user_annotation = self.is_user_annotation or e.is_user_annotation

    def _add_vm(self, e: FunctionEvent) -> None:
        self.vm_instructions += 1
        self.device_time_total += e.cpu_time_total
        self.self_device_time_total += e.self_cpu_time_total

    @property
    def cpu_time(self) -> float:
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def self_cpu_time(self) -> float:
        return self.self_cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        n = self.vm_instructions
        return self.device_time_total / n if n else 0.0

    # torch's CUDA-era names
    cuda_time_total = property(lambda self: self.device_time_total)
    self_cuda_time_total = property(lambda self: self.self_device_time_total)
    cuda_time = property(lambda self: self.device_time)

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"cpu_time_total={_fmt_us(self.cpu_time_total)} "
                f"self_cpu_time_total={_fmt_us(self.self_cpu_time_total)} "
                f"vm_time_total={_fmt_us(self.device_time_total)} "
                f"input_shapes={self.input_shapes}>")


class EventList(list):
    """A list of FunctionEvents (or of FunctionEventAvgs, from key_averages)."""

    def __init__(self, *args, trace=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._trace = trace  # the profile's trace dict builder, for export_chrome_trace

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0):
        if group_by_stack_n:
            raise NotImplementedError("sbpflow.profiler: key_averages(group_by_stack_n=) is "
                                      "not implemented; group by name or input shape")
        rows: dict = {}
        for e in self:
            shapes = (str(e.input_shapes) if group_by_input_shape else None)
            k = (e.key, shapes)
            row = rows.get(k)
            if row is None:
                row = rows[k] = FunctionEventAvg(e.key, e.input_shapes if shapes else None)
            if e.on_vm_stream:
                row._add_vm(e)
            else:
                row._add_host(e)
        for row in rows.values():  # instructions with no host-side event: count those
            if row.count == 0:
                row.count = row.vm_instructions
        return EventList(rows.values())

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg("Total")
        for e in self:
            if isinstance(e, FunctionEvent):
                (total._add_vm if e.on_vm_stream else total._add_host)(e)
            else:
                total.count += e.count
                total.cpu_time_total += e.cpu_time_total
                total.self_cpu_time_total += e.self_cpu_time_total
                total.device_time_total += e.device_time_total
                total.self_device_time_total += e.self_device_time_total
        return total

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_src_column_width: int = 75, max_name_column_width: int = 55,
              max_shapes_column_width: int = 80, header: str | None = None,
              top_level_events_only: bool = False) -> str:
        rows = list(self) if self and isinstance(self[0], FunctionEventAvg) else \
            list(self.key_averages())
        return _build_table(rows, sort_by, row_limit, max_name_column_width,
                            max_shapes_column_width, header)

    def export_chrome_trace(self, path: str) -> None:
        if self._trace is None:
            raise RuntimeError("export_chrome_trace: this EventList does not come from a "
                               "profile (key_averages() results carry no timeline)")
        _write_trace(self._trace(), path)

    def __str__(self):
        return self.table()


_SORT_ALIASES = {"cuda_time_total": "device_time_total",
                 "self_cuda_time_total": "self_device_time_total",
                 "cuda_time": "device_time"}


def _build_table(rows, sort_by, row_limit, name_width, shapes_width, header) -> str:
    if sort_by is not None:
        attr = _SORT_ALIASES.get(sort_by, sort_by)
        rows = sorted(rows, key=lambda r: getattr(r, attr), reverse=True)
    has_vm = any(r.device_time_total for r in rows)
    has_mem = any(r.cpu_memory_usage for r in rows)
    has_shapes = any(r.input_shapes is not None for r in rows)
    self_sum = sum(r.self_cpu_time_total for r in rows)
    vm_sum = sum(r.self_device_time_total for r in rows)
    self_total, vm_total = self_sum or 1.0, vm_sum or 1.0
    if row_limit is not None and row_limit > 0:
        rows = rows[:row_limit]
    name_w = min(max([len("Name")] + [len(r.key) for r in rows]) + 4, name_width)
    cols = [("Name", name_w)] + [(h, 12) for h in (
        "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg")]
    if has_vm:
        cols += [(h, 12) for h in ("Self VM", "Self VM %", "VM total", "VM time avg")]
    if has_mem:
        cols += [("CPU Mem", 12), ("Self CPU Mem", 12)]
    cols.append(("# of Calls", 12))
    if has_shapes:
        cols.append(("Input Shapes", min(shapes_width,
                                         max([12] + [len(str(r.input_shapes)) + 2
                                                     for r in rows]))))
    sep = "  ".join("-" * w for _, w in cols) + "  "
    fmt = lambda vals: "  ".join(  # noqa: E731
        (v[:w - 3] + "..." if len(v) > w else v).rjust(w) for v, (_, w) in zip(vals, cols)) \
        + "  "
    lines = []
    if header:
        lines.append("=" * len(sep))
        lines.append(header)
    lines += [sep, fmt([h for h, _ in cols]), sep]
    for r in rows:
        vals = [r.key, f"{100 * r.self_cpu_time_total / self_total:.2f}%",
                _fmt_us(r.self_cpu_time_total),
                f"{100 * r.cpu_time_total / self_total:.2f}%", _fmt_us(r.cpu_time_total),
                _fmt_us(r.cpu_time)]
        if has_vm:
            vals += [_fmt_us(r.self_device_time_total),
                     f"{100 * r.self_device_time_total / vm_total:.2f}%",
                     _fmt_us(r.device_time_total), _fmt_us(r.device_time)]
        if has_mem:
            vals += [_fmt_bytes(r.cpu_memory_usage), _fmt_bytes(r.self_cpu_memory_usage)]
        vals.append(str(r.count))
        if has_shapes:
            vals.append(str(r.input_shapes) if r.input_shapes is not None else "")
        lines.append(fmt(vals))
    lines.append(sep)
    lines.append(f"Self CPU time total: {_fmt_us(self_sum)}")
    if has_vm:
        lines.append(f"Self VM time total: {_fmt_us(vm_sum)}")
    return "\n".join(lines) + "\n"


# -- the trace ------------------------------------------------------------------------------
def _write_trace(trace: dict, path: str) -> None:
    data = json.dumps(trace, separators=(",", ":"))
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)


def rank_path(path: str, rank: int, world_size: int) -> str:
    """The file rank `rank` writes for `path`: path itself in a job of one rank, else with
    `.rank<r>` before the suffix (`trace.json` -> `trace.rank1.json`); a `{rank}` in the path
    is filled in instead."""
    path = os.fspath(path)
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if world_size <= 1:
        return path
    for suffix in (".json.gz", ".json"):
        if path.endswith(suffix):
            return f"{path[:-len(suffix)]}.rank{rank}{suffix}"
    return f"{path}.rank{rank}"


def merge_chrome_traces(paths, out_path: str) -> None:
    """Join per-rank traces (pid = rank, timestamps on one wall clock) into one file that
    Perfetto opens with a process track group per rank."""
    events: list = []
    for p in paths:
        opener = gzip.open if os.fspath(p).endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8") as f:
            events.extend(json.load(f)["traceEvents"])
    _write_trace({"traceEvents": events, "displayTimeUnit": "ms"}, out_path)


def _track_order(track) -> tuple:
    return (0, "") if not isinstance(track, str) else (1, track)


class profile:
    """torch.profiler.profile for sbpflow (a context manager, or start()/stop()/step())."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config=None,
                 execution_trace_observer=None, acc_events: bool = False, use_cuda=None,
                 custom_trace_id_callback=None):
        acts = set(activities) if activities is not None else supported_activities()
        for a in acts:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"profile(): activities must be ProfilerActivity values, got "
                                f"{a!r}")
        if use_cuda:
            acts.add(ProfilerActivity.CUDA)
        if with_flops:
            raise NotImplementedError("sbpflow.profiler: with_flops=True is not implemented")
        if with_modules:
            raise NotImplementedError("sbpflow.profiler: with_modules=True is not implemented")
        if execution_trace_observer is not None:
            raise NotImplementedError("sbpflow.profiler: execution_trace_observer is not "
                                      "implemented")
        self.activities = acts
        self.record_cpu = ProfilerActivity.CPU in acts
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.schedule = schedule if schedule is not None else _default_schedule
        self.on_trace_ready = on_trace_ready
        self.step_num = 0
        self.current_action = self.schedule(self.step_num)
        self._rec: _recorder.Recorder | None = None
        self._done: _recorder.Recorder | None = None  # the last finished recording
        self._events: EventList | None = None

    # -- control ------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop()
        return False

    def _begin(self) -> None:
        if self._rec is None and self.record_cpu:
            self._rec = _recorder.Recorder(self.record_shapes, self.profile_memory,
                                           self.with_stack)
            _recorder.start(self._rec)

    def _end(self) -> None:
        rec, self._rec = self._rec, None
        if rec is not None:
            _recorder.stop(rec)
            self._done, self._events = rec, None

    def start(self) -> None:
        # As torch's CPU build: other activities are accepted, and dropped with a warning.
        if ProfilerActivity.CUDA in self.activities:
            warnings.warn("CUDA is not available, disabling CUDA profiling", UserWarning,
                          stacklevel=2)
        for a in self.activities - {ProfilerActivity.CPU, ProfilerActivity.CUDA}:
            warnings.warn(f"{a.name} is not available in sbpflow, disabling {a.name} "
                          f"profiling", UserWarning, stacklevel=2)
        if not self.record_cpu:
            raise AssertionError("No activities specified for the profiler")
        if self.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._begin()

    def stop(self) -> None:
        if self._rec is not None:
            self._end()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)

    def step(self) -> None:
        """Mark a step boundary: the schedule decides what the next step records."""
        prev = self.current_action
        self.step_num += 1
        self.current_action = self.schedule(self.step_num)
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        if prev == ProfilerAction.RECORD_AND_SAVE:
            self._end()
            if self.on_trace_ready is not None:
                self.on_trace_ready(self)
        elif prev in recording and self.current_action not in recording:
            self._end()
        if self.current_action in recording:
            self._begin()

    # -- results ------------------------------------------------------------------------------
    def _rank(self) -> tuple[int, int]:
        from .. import comm

        return comm.get_rank(), comm.get_world_size()

    def events(self) -> EventList:
        """The recorded events, in start order (after the profiler stopped)."""
        if self._rec is not None:
            raise RuntimeError("profile.events(): the profiler is still recording; leave the "
                               "`with` block (or call stop()) first")
        if self._events is None:
            self._events = self._build_events()
        return self._events

    def _build_events(self) -> EventList:
        rec = self._done
        if rec is None:
            return EventList(trace=self._chrome_trace)
        base = rec.perf0_ns
        names = self._track_names(rec)
        evs = []
        for i, (name, cat, track, t0, t1, args) in enumerate(
                sorted(rec.events, key=lambda e: (e[3], -e[4]))):
            evs.append(FunctionEvent(i, name, cat, track, names[track], (t0 - base) / 1e3,
                                     (t1 - base) / 1e3, args))
        # Nesting: on each track, an event inside another's interval is its child.
        stacks: dict = defaultdict(list)
        for e in evs:
            st = stacks[e.track]
            while st and st[-1].time_range.end <= e.time_range.start:
                st.pop()
            if st:
                e.cpu_parent = st[-1]
                st[-1].cpu_children.append(e)
            st.append(e)
        for e in reversed(evs):  # children start after their parent: done first
            if e.cpu_children:
                e.cpu_memory_usage = e.self_cpu_memory_usage + sum(
                    c.cpu_memory_usage for c in e.cpu_children)
        return EventList(evs, trace=self._chrome_trace)

    @staticmethod
    def _track_names(rec) -> dict:
        names = {}
        tracks = {e[2] for e in rec.events}
        for t in tracks:
            if isinstance(t, str):
                names[t] = f"VM {t}"
            else:
                names[t] = f"thread {rec.thread_names.get(t, t)}"
        return names

    def key_averages(self, group_by_input_shape: bool = False, group_by_stack_n: int = 0,
                     group_by_overload_name: bool = False) -> EventList:
        if group_by_input_shape and not self.record_shapes:
            raise AssertionError("key_averages(group_by_input_shape=True) needs "
                                 "profile(record_shapes=True)")
        return self.events().key_averages(group_by_input_shape, group_by_stack_n)

    def _chrome_trace(self) -> dict:
        rec = self._done
        rank, world_size = self._rank()
        out: list = [
            {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
             "args": {"name": f"rank {rank}" if world_size > 1 else "sbpflow"}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}},
        ]
        if rec is None:
            return {"traceEvents": out, "displayTimeUnit": "ms"}
        names = self._track_names(rec)
        tids = {}
        for i, t in enumerate(sorted(names, key=_track_order)):
            tids[t] = i + 1
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": i + 1,
                        "args": {"name": names[t]}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": i + 1,
                        "args": {"sort_index": i + 1}})
        # Timestamps on the wall clock (µs), so that the ranks' traces line up when merged.
        base = rec.wall0_ns - rec.perf0_ns
        for name, cat, track, t0, t1, args in rec.events:
            ev = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tids[track],
                  "ts": round((t0 + base) / 1e3, 3), "dur": round((t1 - t0) / 1e3, 3)}
            if args:
                ev["args"] = args
            out.append(ev)
        return {"traceEvents": out, "displayTimeUnit": "ms",
                "otherData": {"framework": "sbpflow", "rank": rank, "world_size": world_size}}

    def export_chrome_trace(self, path: str) -> str:
        """Write the trace (Trace Event Format JSON; Perfetto and chrome://tracing open it).
        Under MPI each rank writes its own file (see rank_path); returns the path written."""
        if self._rec is not None:
            raise RuntimeError("export_chrome_trace(): the profiler is still recording")
        rank, world_size = self._rank()
        target = rank_path(path, rank, world_size)
        _write_trace(self._chrome_trace(), target)
        return target

    def export_stacks(self, path: str, metric: str = "self_cpu_time_total") -> None:
        raise NotImplementedError("sbpflow.profiler: export_stacks is not implemented; use "
                                  "export_chrome_trace (with_stack=True puts the call stacks "
                                  "in its events' args)")

    def export_memory_timeline(self, path: str, device=None) -> None:
        raise NotImplementedError("sbpflow.profiler: export_memory_timeline is not "
                                  "implemented")
