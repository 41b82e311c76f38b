"""The compiler: Job -> task graph -> Plan (see runtime/plan.py), and linking a Plan.

Each rank compiles its own share of the one logical Job (OneFlow's RankCompiler): every global
tensor becomes this rank's piece (`TensorDesc.shape`; the logical shape and the piece's bounds
ride along for the kernels' contexts), ops whose outputs lie on placements without this rank
become empty constants, and global constants are cut to their pieces.  A step without
collectives is

    source -> copy_in -> compute -> copy_out -> tick -> sink
                            \\__________________/

and a step with collectives is cut at each of them: every boxing node that sends data (and
every local -> global broadcast) is a task of its own (kind `boxing`, on the comm stream)
between compute tasks, `source -> copy_in -> compute-0 -> boxing-1 -> compute-2 -> ... ->
copy_out`; its point-to-point messages are tagged per (register, piece).  Task and register
ids follow the Job's order, so every rank derives the same ones, and the collectives run in
the one order the Plan fixes, whatever order tasks become ready in (each depends on the one
before).  The tasks of a step share its memory block.

The source starts a job instance; copy_in copies the call's inputs into its register's planned
buffers (register_num 2: it runs one step ahead of compute), or in the inline plan hands them on
by reference (the graph call's VM instruction already keeps them unchanged until the step is
done, and a copy would cost a pass over every batch); the compute tasks run the step (forward,
backward, update) as chains of ops in the Job's order; copy_out hands the outputs over; the tick
joins the completions of the last compute task and copy_out; the sink notifies the caller.
Task boundaries sit where something real happens (a data source, a copy, a collective), not at
every op: in Python a message costs microseconds.

`threads="inline"` (the default) maps every task to thread 0, the calling thread, which runs
the message loop inside the graph-call instruction; `threads="stream"` gives the copy tasks,
the compute tasks and the boxing tasks their own threads (one per stream).

Kernels are linked by the runtime from op types: the op registry, plus `kernel_resolver(job)`
for op types registered in `ir.KERNEL_RESOLVERS` (this module passes it in, because runtime/
never imports graph/).
"""

from __future__ import annotations

import json
import time

import numpy as np

from .. import comm
from .._core.codec import encode
from ..ops import registry
from ..runtime.plan import OpDesc, Plan, RegisterDesc, TaskDesc, TensorDesc
from ..runtime.runtime import Runtime
from ..sbp import B, P, boxing, layout
from . import ir
from .kernels import boxing as _boxing_kernels  # noqa: F401 - registers the BOXING kernels

THREAD_MODES = ("inline", "stream")


def compile_job(job: ir.Job, threads: str = "inline", copy_inputs: bool | None = None) -> Plan:
    """Lower a Job to a one-rank Plan.

    `copy_inputs`: whether copy_in copies the call's inputs into planned buffers (so it can
    run ahead while the caller reuses its arrays) or hands references on.  A graph call
    needs no copy: its VM instruction keeps the input arrays unchanged until the step is
    done.  Default: copy when the copy task has its own thread (`threads="stream"`)."""
    if threads not in THREAD_MODES:
        raise ValueError(f"compile_job: threads must be one of {THREAD_MODES}, not {threads!r}")
    t0 = time.perf_counter()
    inputs = tuple(op.outputs[0] for op in job.inputs())
    outputs = tuple(op.inputs[0] for op in job.outputs())
    feeds: dict[str, str] = {}
    variables: dict[str, str] = {}  # variable op's tensor -> variable name
    roots: dict[str, str] = {t: "input" for t in inputs}
    views: set[str] = set()
    chain: list[OpDesc] = []
    assigns: list[tuple[str, str, int]] = []
    random_ops: list[str] = []
    rank = comm.get_rank()
    pieces = {name: _piece_of(lt, rank) for name, lt in job.tensors.items()}
    for op in job.ops:
        kind = op.op_type
        if kind == "input" or kind == "output":
            continue
        if kind == "assign":
            target, value = op.inputs
            if target not in variables:
                raise ValueError(f"Job {job.name}: assign {op.name} at {op.where()} writes "
                                 f"{target!r}, which is not a variable op's tensor")
            assigns.append((variables[target], value, len(chain)))
            continue
        if kind == "variable":
            var = op.attrs["var"]
            if var not in job.variables:
                raise ValueError(f"Job {job.name}: variable op {op.name} names unknown "
                                 f"variable {var!r}")
            variables[op.outputs[0]] = var
            roots[op.outputs[0]] = "variable"
        elif kind == "feed":
            feeds[op.attrs["key"]] = op.outputs[0]
            roots[op.outputs[0]] = "feed"
        elif kind == "constant":
            roots[op.outputs[0]] = "constant"
        elif kind in ir.VIEW_OPS:
            views.add(op.outputs[0])
            roots[op.outputs[0]] = roots.get(op.inputs[0], "own")
        elif kind in ir.KERNEL_RESOLVERS:
            for o in op.outputs:
                roots[o] = "own"
        else:
            try:
                opdef = registry.get(kind)
            except KeyError:
                raise ValueError(f"Job {job.name}: op {op.name} at {op.where()} has type "
                                 f"{kind!r}, which is neither a registered op nor in "
                                 "ir.KERNEL_RESOLVERS") from None
            if opdef.view:
                views.add(op.outputs[0])
                roots[op.outputs[0]] = roots.get(op.inputs[0], "own")
            else:
                for o in op.outputs:
                    roots[o] = "own"
            if opdef.random:
                random_ops.append(op.name)
        if _elsewhere(job, op, rank):
            # Every output lies on placements without this rank: no kernel runs here (as in
            # eager, where such a rank holds empty pieces).
            if op.name in random_ops:
                raise NotImplementedError(
                    f"Job {job.name}: random op {op.name} at {op.where()} runs on placement "
                    f"{job.tensors[op.outputs[0]].placement}, which leaves rank {rank} out; "
                    "in a graph, random ops must run on every rank (the generators would "
                    "drift apart otherwise)")
            for o in op.outputs:
                roots[o] = "constant"
                views.discard(o)
                chain.append(OpDesc(f"{op.name}-empty", "constant", (), (o,),
                                    {"value": np.empty(pieces[o][0], job.tensors[o].dtype.np)},
                                    op.scope, op.loc))
            continue
        attrs = dict(op.attrs)
        if kind == "constant" and job.tensors[op.outputs[0]].is_global:
            attrs["value"] = _constant_piece(attrs["value"], job.tensors[op.outputs[0]], rank)
        chain.append(OpDesc(op.name, kind, tuple(op.inputs), tuple(op.outputs), attrs,
                            op.scope, op.loc))

    tensors: dict[str, TensorDesc] = {}
    mem_bytes = 0
    for name, lt in job.tensors.items():
        mem = tuple(lt.mem) if lt.mem is not None else None
        if mem is not None:
            mem_bytes = max(mem_bytes, mem[0] + mem[1])
        shape, logical, piece = pieces[name]
        tensors[name] = TensorDesc(name, shape, lt.dtype.name, mem, roots.get(name, "own"),
                                   name in views, logical, piece)

    stream_mode = threads == "stream"
    if copy_inputs is None:
        copy_inputs = stream_mode
    copy_thread, compute_thread = (1, 2) if stream_mode else (0, 0)
    results = tuple(dict.fromkeys(outputs))
    in_bytes = sum(tensors[t].nbytes for t in inputs)
    out_bytes = sum(tensors[t].nbytes for t in results)
    segments = _segments(job, chain)
    if len(segments) == 1:
        tasks = [
            TaskDesc(0, "source", "source", "host", 0, (), (0,)),
            TaskDesc(1, "copy_in", "copy_in", "copy", copy_thread, (0,), (1,)),
            TaskDesc(2, "compute", "compute", "compute", compute_thread, (1,), (2,), chain,
                     results, tuple(assigns), mem_bytes),
            TaskDesc(3, "copy_out", "copy_out", "copy", copy_thread, (2,), (3,)),
            TaskDesc(4, "tick", "tick", "host", 0, (2, 3), (4,)),
            TaskDesc(5, "sink", "sink", "host", 0, (4,), ()),
        ]
        registers = [
            RegisterDesc(0, "source-out", 0, (1,), 1),
            # Two slots: the input copy of step n+1 overlaps the compute of step n.
            RegisterDesc(1, "copy_in-out", 1, (2,), 2, inputs, in_bytes if copy_inputs else 0,
                         by_ref=not copy_inputs),
            RegisterDesc(2, "compute-out", 2, (3, 4), 1, results, out_bytes,
                         mem_block="compute" if any(tensors[t].mem for t in results)
                         else None),
            RegisterDesc(3, "copy_out-out", 3, (4,), 1),
            RegisterDesc(4, "tick-out", 4, (5,), 1),
        ]
    else:
        tasks, registers = _cut_step(segments, assigns, inputs, results, tensors, mem_bytes,
                                     copy_inputs, in_bytes, copy_thread, compute_thread,
                                     threads)
    device = "cpu"
    for lt in job.tensors.values():
        device = lt.placement.type
        break
    stats = {k: v for k, v in job.stats.items() if _serialisable(v)}
    stats.update({"ops": len(chain), "threads": threads})  # memory: job.stats["memory"]
    plan = Plan(job.name, tasks, registers, tensors, inputs, outputs, feeds, variables,
                {name: v.meta for name, v in job.variables.items()}, tuple(random_ops), stats,
                device)
    plan.stats["compile_seconds"] = time.perf_counter() - t0
    return plan


# -- the step's task graph ----------------------------------------------------------------------
def _collective(job: ir.Job, op: OpDesc) -> bool:
    """A node that talks to other ranks: a boxing route that sends data (not B -> S, a local
    slice), or a local -> global broadcast along a grid axis of more than one rank."""
    if op.op_type == "boxing":
        (sp, ss), (dp, ds) = ir.boxing_ends(op.attrs)
        return boxing.route(job.tensors[op.inputs[0]].meta, sp, ss, dp, ds).communicates
    if op.op_type == "local_to_global" and op.attrs.get("broadcast", True):
        _, (dp, ds) = ir.boxing_ends(op.attrs)
        return any(x is B and dp.hierarchy[k] > 1 for k, x in enumerate(ds))
    return False


def _segments(job: ir.Job, chain: list[OpDesc]) -> list[tuple[str, list[OpDesc]]]:
    """The step's chain cut where something real happens: each collective node is a task of
    its own (kind 'boxing', on the comm stream), the ops between them are compute tasks.
    A step without collectives is one compute task."""
    out: list[tuple[str, list[OpDesc]]] = []
    for op in chain:
        if _collective(job, op):
            out.append(("boxing", [op]))
        elif out and out[-1][0] == "compute":
            out[-1][1].append(op)
        else:
            out.append(("compute", [op]))
    return out or [("compute", [])]


def _cut_step(segments, assigns, inputs, results, tensors, mem_bytes, copy_inputs, in_bytes,
              copy_thread, compute_thread, threads):
    """Tasks and registers of a step cut into `segments`: source -> copy_in -> seg 0 -> ...
    -> seg k -> copy_out, with the tick joining seg k and copy_out.  Each segment's register
    holds the tensors later segments (or the outputs) read, in a fixed order; ids follow the
    Job's order, so every rank derives the same ones from the same Job.  The segments share
    the step's memory block (its offsets were planned over the whole step).  An assign goes to
    the segment that makes its value (so an update can write its variable in place), or to a
    later one that still reads the variable's old value (directly or through a view), but
    never past where the Job placed it unless a reader comes later.  Tensors that alias a
    variable are handed from segment to segment by reference: no segment after the assign
    reads the old value."""
    n = len(segments)
    seg_of: dict[str, int] = {}  # op name -> segment
    starts = []
    pos = 0
    for k, (_, ops) in enumerate(segments):
        starts.append(pos)
        for op in ops:
            seg_of[op.name] = k
        pos += len(ops)
    # which variable each tensor may alias (variable op tensors and views of them)
    root_var: dict[str, str] = {}
    last_reader: dict[str, int] = {}  # variable -> last segment reading its old value
    for k, (_, ops) in enumerate(segments):
        for op in ops:
            if op.op_type == "variable":
                root_var[op.outputs[0]] = op.attrs["var"]
                last_reader[op.attrs["var"]] = k
                continue
            if op.op_type not in ("feed", "constant") and op.inputs and \
                    _is_view(op.op_type) and op.inputs[0] in root_var:
                root_var[op.outputs[0]] = root_var[op.inputs[0]]
            for t in op.inputs:
                var = root_var.get(t)
                if var is not None:
                    last_reader[var] = k
    made: dict[str, int] = {t: -1 for t in inputs}  # tensor -> segment that makes it
    for k, (_, ops) in enumerate(segments):
        for op in ops:
            for o in op.outputs:
                made[o] = k
    placed: list[list] = [[] for _ in range(n)]
    for var, value, at in assigns:
        job_k = 0
        while job_k + 1 < n and starts[job_k + 1] < at:
            job_k += 1
        k = max(made.get(value, 0), last_reader.get(var, 0), 0)
        if k < job_k:  # the segment that makes the value (e.g. an update): written there
            local = len(segments[k][1])
        else:
            local = max(0, min(at - starts[k], len(segments[k][1])))
        placed[k].append((var, value, local))
    # what each boundary must carry: tensors read after it, made at or before it
    needed_after: list[list[str]] = [[] for _ in range(n)]
    reads: list[list[str]] = []
    for k, (_, ops) in enumerate(segments):
        r = [t for op in ops for t in op.inputs] + [v for _, v, _ in placed[k]]
        reads.append(r)
    for k in range(n):
        later = [t for j in range(k + 1, n) for t in reads[j]]
        if k == n - 1:
            later = list(results)
        else:
            later += list(results)
        needed_after[k] = [t for t in dict.fromkeys(later) if made.get(t, n) <= k]
    tasks = [TaskDesc(0, "source", "source", "host", 0, (), (0,)),
             TaskDesc(1, "copy_in", "copy_in", "copy", copy_thread, (0,), (1,))]
    registers = [RegisterDesc(0, "source-out", 0, (1,), 1),
                 RegisterDesc(1, "copy_in-out", 1, (2,), 2, inputs,
                              in_bytes if copy_inputs else 0, by_ref=not copy_inputs)]
    comm_thread = 3 if threads == "stream" else 0
    first = 2
    copy_out, tick, sink = first + n, first + n + 1, first + n + 2
    for k, (kind, ops) in enumerate(segments):
        tid = first + k
        name = f"{kind}-{k}"
        consumers = (tid + 1,) if k + 1 < n else (copy_out, tick)
        blobs = tuple(needed_after[k]) if k + 1 < n else tuple(results)
        thread = comm_thread if kind == "boxing" else compute_thread
        if kind == "boxing":  # its messages are tagged per (this register, piece)
            for op in ops:
                if op.op_type == "boxing":
                    op.attrs["register"] = tid
        tasks.append(TaskDesc(tid, name, kind, "comm" if kind == "boxing" else "compute",
                              thread, (tid - 1,), (tid,), list(ops), blobs,
                              tuple(placed[k]), mem_bytes, block="step" if mem_bytes else ""))
        # between the tasks of one step, slots hand the arrays on by reference (planned
        # ones live in the step's block); only the last one's results are the step's outputs
        registers.append(RegisterDesc(
            tid, f"{name}-out", tid, consumers, 1, blobs,
            sum(tensors[t].nbytes for t in blobs) if k + 1 == n else 0, by_ref=k + 1 < n,
            mem_block="step" if any(tensors[t].mem for t in blobs) else None))
    tasks += [TaskDesc(copy_out, "copy_out", "copy_out", "copy", copy_thread, (copy_out - 1,),
                       (copy_out,)),
              TaskDesc(tick, "tick", "tick", "host", 0, (copy_out - 1, copy_out), (tick,)),
              TaskDesc(sink, "sink", "sink", "host", 0, (tick,), ())]
    registers += [RegisterDesc(copy_out, "copy_out-out", copy_out, (tick,), 1),
                  RegisterDesc(tick, "tick-out", tick, (sink,), 1)]
    return tasks, registers


def _is_view(op_type: str) -> bool:
    if op_type in ir.KERNEL_RESOLVERS:
        return op_type in ir.VIEW_OPS
    try:
        return registry.get(op_type).view
    except KeyError:
        return False


def _piece_of(lt: ir.LogicalTensor, rank: int):
    """(this rank's shape, logical shape or None, piece bounds or None) of a Job tensor:
    a global tensor is lowered to this rank's piece (uneven splits included: 5 rows on 4
    ranks are 2, 1, 1, 1), a local one stays whole."""
    shape = tuple(lt.shape)
    if not lt.is_global:
        return shape, None, None
    local = layout.local_shape(shape, lt.placement, lt.sbp, rank)
    bounds = None
    if lt.placement.has(rank):
        bounds = tuple((s.start, s.stop)
                       for s in layout.piece(shape, lt.placement, lt.sbp, rank))
    return local, shape, bounds


def _constant_piece(value: np.ndarray, lt: ir.LogicalTensor, rank: int) -> np.ndarray:
    """This rank's piece of a constant (constants hold logical values): a slice for S, the
    whole for B, and for P the value on the first rank of each P axis and zeros elsewhere."""
    if not lt.placement.has(rank):
        return np.empty(layout.local_shape(lt.shape, lt.placement, lt.sbp, rank), value.dtype)
    piece = np.ascontiguousarray(value[layout.piece(tuple(lt.shape), lt.placement, lt.sbp,
                                                    rank)]).reshape(
        layout.local_shape(tuple(lt.shape), lt.placement, lt.sbp, rank))  # 0-d stays 0-d
    coords = lt.placement.coords(rank)
    if any(x is P and coords[k] != 0 for k, x in enumerate(lt.sbp)):
        piece = np.zeros_like(piece)
    return piece


def _elsewhere(job: ir.Job, op, rank: int) -> bool:
    """Whether op computes only tensors whose placement leaves this rank out (a boxing node
    always runs: the ranks of both ends take part)."""
    if op.op_type in ir.BOXING or not op.outputs:
        return False
    for o in op.outputs:
        lt = job.tensors[o]
        if not lt.is_global or lt.placement.has(rank):
            return False
    return True


def _serialisable(v) -> bool:
    try:
        json.dumps(encode(v))
        return True
    except (TypeError, ValueError):
        return False


def kernel_resolver(job: ir.Job | None = None):
    """resolve(op_desc) -> kernel for op types in `ir.KERNEL_RESOLVERS` (None for registry
    ops).  The resolver sees the Job's OpNode when the job is given, else the OpDesc (which
    has the same fields)."""
    nodes = {op.name: op for op in job.ops} if job is not None else {}

    def resolve(desc):
        fn = ir.KERNEL_RESOLVERS.get(desc.op_type)
        if fn is None:
            if _is_registered(desc.op_type):
                return None
            _import_passes()  # a plan from JSON: the pass that registers the resolver
            fn = ir.KERNEL_RESOLVERS.get(desc.op_type)
            if fn is None:
                return None
        return fn(nodes.get(desc.name, desc), job)

    return resolve


def _is_registered(op_type: str) -> bool:
    try:
        registry.get(op_type)
        return True
    except KeyError:
        return False


def _import_passes() -> None:
    """Import every pass module, so each registers its kernel resolvers."""
    from . import passes

    for name in passes.ORDER:
        try:
            passes.get(name)
        except ImportError:
            pass


def build_runtime(job: ir.Job, threads: str = "inline", plan: Plan | None = None,
                  trace: bool = False, profile: bool = False) -> Runtime:
    """Compile (unless `plan` is given) and link: a Runtime over the Job's variables' eager
    tensors.  `rt.run(inputs, feeds)` is then the graph call.  `profile=True` times every op
    (`print(rt.op_times())`); `trace=True` records every act in `rt.trace`."""
    if plan is None:
        plan = compile_job(job, threads=threads)
    t0 = time.perf_counter()
    variables = {name: v.tensor for name, v in job.variables.items()}
    rt = Runtime(plan, variables, resolve=kernel_resolver(job), trace=trace, profile=profile)
    plan.stats["link_seconds"] = time.perf_counter() - t0
    return rt
