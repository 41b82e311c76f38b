"""A compute task's chain of ops as generated straight-line Python.

One `def` per task, built with `exec` once when the runtime links the plan.  It calls the
kernels directly on arrays, with the KernelContexts and bound attrs prebuilt (names in the
function's globals), makes non-view outputs C-contiguous as the eager VM does (so results are
bitwise equal to eager), drops each array after its last use, and writes each variable's
assign where the Job placed it, or after the last reader of the old value if one comes
later.  No Tensor, VM instruction or autograd object is made per op.

    def chain(ins, feeds, rng, piece):
        v0, = ins
        v1 = V_0._blob.array  # variable 'fc.weight'
        v2 = ec(F_1(C_1, v0, v1))  # matmul (fc-matmul-2)
        del v0
        ...
        copy(A0._blob.array, v9)  # assign 'fc.weight'
        return (v7,)

An error in a kernel is mapped back to its op through the generated line number
(`Chain.op_at`).
"""

from __future__ import annotations

import functools
import itertools
import linecache
import time
import weakref

import numpy as np

from ..ops import registry
from ..ops.registry import KernelContext

_counter = itertools.count()


class LinkedOp:
    """An op of a chain with its kernel and how to call it."""

    __slots__ = ("desc", "kernel", "variadic", "view", "random", "accepts_out", "inplace")

    def __init__(self, desc, kernel, variadic=False, view=False, random=False):
        self.desc = desc
        self.kernel = kernel
        self.variadic = variadic
        self.view = view
        self.random = random
        # `kernel.accepts_out`: the kernel takes `out=` (an array; a tuple with one array or
        # None per output for a multi-output kernel) and writes its results there.
        self.accepts_out = bool(getattr(kernel, "accepts_out", False))
        # `kernel.out_may_alias_inputs`: an `out` array may be the memory of an input of the
        # same shape (an elementwise update reads each element before writing it), so an
        # assigned result can be written straight into its variable.
        self.inplace = self.accepts_out and bool(getattr(kernel, "out_may_alias_inputs",
                                                         False))


STRUCTURAL = ("variable", "feed", "constant")


def _reshape_view(a, shape, kernel, ctx):
    """A reshape of a step input: a view of a C-contiguous array, else the kernel's copy."""
    if type(a) is np.ndarray and a.flags.c_contiguous:
        v = a.view()
        v.shape = shape
        return v
    return ctx.prims.ensure_contiguous(kernel(ctx, a))


def link_op(desc, resolve=None) -> LinkedOp:
    """Find the kernel of an op: `resolve(desc)` first (op types the graph layer knows, such
    as fused kernels), then the op registry."""
    if resolve is not None:
        kernel = resolve(desc)
        if kernel is not None:
            return LinkedOp(desc, kernel, bool(getattr(kernel, "variadic", False)),
                            bool(getattr(kernel, "view", False)),
                            bool(getattr(kernel, "random", False)))
    try:
        opdef = registry.get(desc.op_type)
    except KeyError:
        raise RuntimeError(f"plan: no kernel for op {desc.name!r} of type {desc.op_type!r} "
                           "(not a registered op, and the resolver gave none)") from None
    return LinkedOp(desc, opdef.kernel, opdef.variadic, opdef.view, opdef.random)


class StepFacts:
    """What every chain of one plan needs to know about the whole step, found once.

    - `aliases`: tensor -> the variable whose memory it may alias (variable ops' tensors and
      views of them, in the tasks' order: a task's incoming tensors are made before it);
    - `whole`: those of them that are a variable itself, not a view of it;
    - `kept`: tensors that outlive the step's reads of their variable (step outputs, assign
      values), so a chain snapshots them where they are made when they alias a variable;
    - `outputs`: the step's outputs;
    - `inputs_by_ref`: copy_in hands the caller's arrays on by reference (they stay unchanged
      until the step is done), rather than refilling buffers of its register."""

    def __init__(self, plan, linked: dict):
        aliases: dict[str, str] = {}
        kept = set(plan.outputs)
        for task in plan.tasks:
            kept.update(value for _, value, _ in task.assigns)
            for op in task.ops:
                if op.op_type == "variable":
                    aliases[op.outputs[0]] = op.attrs["var"]
                elif op.op_type not in STRUCTURAL and linked[op.name].view and op.inputs:
                    var = aliases.get(op.inputs[0])
                    if var is not None:
                        aliases[op.outputs[0]] = var
        self.aliases = aliases
        self.whole = {t for t in aliases if not plan.tensors[t].view}
        self.kept = kept
        self.outputs = set(plan.outputs)
        self.inputs_by_ref = all(rd.by_ref for rd in plan.registers
                                 if plan.task(rd.producer).kind == "copy_in")


class Chain:
    """The generated function of one compute task, and what its lines mean."""

    def __init__(self, task, plan, linked: dict, variables: dict, prims, block=None,
                 rng_index=None, profile: bool = False, facts: StepFacts | None = None):
        self.task = task
        self.profile = profile  # time every op (`op_times`); costs ~0.2 us per op
        self.filename = f"<sbpflow-chain-{next(_counter)}:{plan.name}:{task.name}>"
        self.line_op: dict[int, object] = {}  # generated line -> OpDesc
        self.planned: set[str] = set()  # tensors written into the memory block
        self.copied: set[str] = set()  # results copied inside the chain
        self.inplace_assigns: set[str] = set()  # variables their update kernel writes
        facts = facts if facts is not None else StepFacts(plan, linked)
        self.source, env = self._generate(task, plan, linked, variables, prims, block,
                                          rng_index or {}, facts)
        env["__name__"] = __name__  # the generated lines' module (warning filters)
        code = compile(self.source, self.filename, "exec")
        # So tracebacks show the generated lines.
        lines = self.source.splitlines(keepends=True)
        linecache.cache[self.filename] = (len(self.source), None, lines, self.filename)
        weakref.finalize(self, linecache.cache.pop, self.filename, None)
        exec(code, env)
        self.fn = env["chain"]

    def op_at(self, tb):
        """The OpDesc whose line raised, from a traceback (None if not in the chain)."""
        op = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename:
                op = self.line_op.get(tb.tb_lineno)
            tb = tb.tb_next
        return op

    # -- code generation ---------------------------------------------------------------------
    def _generate(self, task, plan, linked, variables, prims, block, rng_index, facts):
        """(source, globals) of the chain's function: the step's lines in op order, with
        each assign and `del` where its analysis below put it."""
        env: dict = {"ec": prims.ensure_contiguous, "cp": prims.contiguous,
                     "copy": prims.copy, "asarray": np.asarray, "rv": _reshape_view}
        local: dict[str, str] = {}  # tensor name -> local variable name

        def name_of(t):
            v = local.get(t)
            if v is None:
                v = local[t] = f"v{len(local)}"
            return v

        ins_names = [t for rid in task.consumed for t in plan.registers[rid].blobs]
        root_var, whole = facts.aliases, facts.whole  # the plan-wide aliases of variables
        old_read = self._old_reads(task, root_var)
        last = self._last_uses(task, ins_names)
        after, direct = self._place_assigns(task, plan, linked, variables, env, name_of, last,
                                            root_var, old_read, whole)
        # Results that alias a variable and outlive the step's reads of it (outputs of the
        # step, values of assigns) are snapshotted where they are made: an assign overwrites
        # the variable.  Other results handed to a later task of the step stay references:
        # the compiler places every assign after the last task reading the old value.
        # Results that alias an input register slot are copied at the end when the slot is
        # refilled behind them (a copy_in buffer) or the caller keeps them (step outputs).
        var_results = {t for t in task.results
                       if plan.tensors[t].root == "variable" and t in facts.kept}
        in_results = [t for t in dict.fromkeys(task.results)
                      if plan.tensors[t].root == "input"
                      and (t in facts.outputs or not facts.inputs_by_ref)]
        input_reshapes = self._input_reshapes(task, linked, ins_names)

        body: list[tuple[str, object]] = []  # (line, op or None)
        if ins_names:
            body.append((f"{', '.join(name_of(t) for t in ins_names)}, = ins", None))
        body.extend(after.get(-1, ()))
        dead = [name_of(t) for t in ins_names if last[t] == -1]
        if dead:
            body.append((f"del {', '.join(dead)}", None))
        for i, op in enumerate(task.ops):
            self._op_lines(body, i, op, plan, linked, variables, prims, block, rng_index,
                           env, name_of, direct, input_reshapes)
            for t in op.outputs:
                if t in var_results:
                    body.append((f"{name_of(t)} = cp({name_of(t)})  # a snapshot", None))
                    self.copied.add(t)
            body.extend(after.get(i, ()))
            dead = [t for t in dict.fromkeys(list(op.inputs) + list(op.outputs))
                    if last.get(t) == i]
            if dead:
                body.append((f"del {', '.join(name_of(t) for t in dead)}", None))
        for t in in_results:
            body.append((f"{name_of(t)} = cp({name_of(t)})", None))
            self.copied.add(t)
        ret = ", ".join(name_of(t) for t in task.results)
        body.append((f"return ({ret}{',' if len(task.results) == 1 else ''})", None))

        if self.profile:
            body = self._timed(body, env)
        lines = ["def chain(ins, feeds, rng, piece):"]
        for line, op in body:
            lines.append("    " + line)
            if op is not None:
                self.line_op[len(lines)] = op
        return "\n".join(lines) + "\n", env

    @staticmethod
    def _old_reads(task, root_var) -> dict[str, int]:
        """variable -> position of the last op of the task that reads its old value (through
        the variable op, a view of it, or such a tensor handed in by an earlier task)."""
        old_read: dict[str, int] = {}
        for i, op in enumerate(task.ops):
            if op.op_type == "variable":  # binds the array: it reads too
                old_read[op.attrs["var"]] = i
            for t in op.inputs:
                var = root_var.get(t)
                if var is not None:
                    old_read[var] = i
        return old_read

    @staticmethod
    def _last_uses(task, ins_names) -> dict[str, int]:
        """Last use of each tensor, by op position (-1: before the first op); results live
        to the end."""
        end = len(task.ops)
        last: dict[str, int] = {}
        for i, op in enumerate(task.ops):
            for t in op.inputs:
                last[t] = i
            for t in op.outputs:
                last.setdefault(t, i)
        for t in task.results:
            last[t] = end
        for t in ins_names:
            last.setdefault(t, -1)
        return last

    def _place_assigns(self, task, plan, linked, variables, env, name_of, last, root_var,
                       old_read, whole):
        """Where each assign's write goes: (op position -> lines to emit after it, value
        tensor -> assign index for values their kernel writes straight into the variable).

        The Job places an assign where the step wrote the variable; memory planning may reuse
        the value's buffer right after that point, and ops after it may still read the
        variable's old value.  So the write happens at the assign's place when every reader
        of the old value is done by then; otherwise the value is snapshotted there and
        written after the last reader.  `last` is extended to keep each value alive."""
        end = len(task.ops)
        after: dict[int, list] = {}
        produced_at = {t: i for i, op in enumerate(task.ops) for t in op.outputs}
        direct: dict[str, int] = {}
        for j, (var, value, pos) in enumerate(task.assigns):
            env[f"A{j}"] = variables[var]
            site = _AssignSite(var, value)
            if self._in_place_ok(task, plan, linked, variables, var, value, produced_at,
                                 old_read, root_var, whole, direct):
                direct[value] = j
                self.inplace_assigns.add(var)
                continue
            at = min(pos, end) - 1  # after the last chain op that precedes the assign op
            last[value] = max(last.get(value, -1), at)
            reader = old_read.get(var, -1)
            if reader <= at:
                after.setdefault(at, []).append(
                    (f"copy(A{j}._blob.array, {name_of(value)})  # assign {var!r}", site))
            else:
                after.setdefault(at, []).append((f"s{j} = cp({name_of(value)})", site))
                after.setdefault(reader, []).append(
                    (f"copy(A{j}._blob.array, s{j})  # assign {var!r}", site))
                after[reader].append((f"del s{j}", None))
        return after, direct

    @staticmethod
    def _input_reshapes(task, linked, ins_names) -> set[str]:
        """Reshapes of the step's inputs whose result only plain (non-view) ops read and the
        chain does not return: a view when the input array is C-contiguous (the copy-in
        slots are), so no copy; such ops never write their inputs."""
        readers: dict[str, list] = {}
        for op in task.ops:
            for t in op.inputs:
                readers.setdefault(t, []).append(op)
        results = set(task.results)
        return {
            op.name for op in task.ops
            if op.op_type == "reshape" and len(op.inputs) == 1 and op.inputs[0] in ins_names
            and op.outputs[0] not in results
            and all(r.op_type not in STRUCTURAL and not linked[r.name].view
                    for r in readers.get(op.outputs[0], ()))}

    def _op_lines(self, body, i, op, plan, linked, variables, prims, block, rng_index, env,
                  name_of, direct, input_reshapes) -> None:
        """Append the lines of op i: a structural binding, or its kernel call (into its
        variable, its planned buffer, a view of an input, or a fresh contiguous array)."""
        outs = [name_of(t) for t in op.outputs]
        k = f"_{i}"
        if op.op_type == "variable":
            env["V" + k] = variables[op.attrs["var"]]
            body.append((f"{outs[0]} = V{k}._blob.array  # variable {op.attrs['var']!r}", op))
            return
        if op.op_type == "feed":
            env["D" + k] = plan.tensors[op.outputs[0]].meta.dtype.np
            body.append((f"{outs[0]} = asarray(feeds[{op.attrs['key']!r}], D{k})  # feed", op))
            return
        if op.op_type == "constant":
            env["K" + k] = op.attrs["value"]
            body.append((f"{outs[0]} = K{k}  # constant", op))
            return
        lk = linked[op.name]
        env["C" + k] = _context(prims, op, plan)
        kernel = lk.kernel
        if op.attrs:
            kernel = functools.partial(kernel, **op.attrs)
        env["F" + k] = kernel
        if lk.random:
            body.append((f"C{k}.seed, C{k}.offset = rng[{rng_index[op.name]}]", op))
        if getattr(lk.kernel, "uses_instance", False):  # e.g. the boxing kernel's tags
            body.append((f"C{k}.instance = piece", op))
        args = ", ".join(name_of(t) for t in op.inputs)
        if lk.variadic:
            args = f"[{args}]"
        args = f"C{k}, {args}" if args else f"C{k}"
        what = f"{op.op_type} ({op.name})"
        writes = [direct.get(t) for t in op.outputs]
        if any(w is not None for w in writes):  # results straight into variables
            bufs = [f"A{w}._blob.array" if w is not None else "None" for w in writes]
            out_buf = bufs[0] if len(bufs) == 1 else f"({', '.join(bufs)})"
            lhs = outs[0] if len(outs) == 1 else f"{', '.join(outs)},"
            body.append((f"{lhs} = F{k}({args}, out={out_buf})  # {what}, in place", op))
            for o, w in zip(outs, writes):
                if w is None:
                    body.append((f"{o} = ec({o})", op))
            return
        t0 = plan.tensors[op.outputs[0]] if len(op.outputs) == 1 else None
        planned = (block is not None and t0 is not None and t0.mem is not None
                   and lk.accepts_out and not lk.view)
        if planned:
            env["O" + k] = np.ndarray(t0.shape, t0.meta.dtype.np, buffer=block,
                                      offset=t0.mem[0])
            self.planned.add(op.outputs[0])
            args += f", out=O{k}"
        call = f"F{k}({args})"
        if op.name in input_reshapes:
            env["S" + k] = tuple(plan.tensors[op.outputs[0]].shape)
            body.append((f"{outs[0]} = rv({name_of(op.inputs[0])}, S{k}, F{k}, C{k})"
                         f"  # {what}, a view of the input", op))
        elif lk.view or planned:
            body.append((f"{', '.join(outs)}{',' if len(outs) > 1 else ''} = {call}"
                         f"  # {what}", op))
        elif len(outs) == 1:
            body.append((f"{outs[0]} = ec({call})  # {what}", op))
        elif not outs:  # an effect (e.g. a one-embedding update in its store)
            body.append((f"{call}  # {what}", op))
        else:
            body.append((f"{', '.join(outs)}, = {call}  # {what}", op))
            for o in outs:
                body.append((f"{o} = ec({o})", op))

    def _timed(self, body, env):
        """The body with a clock read after each op's lines: the time since the previous
        read goes to that op (`del`s and bookkeeping go to the op after them)."""
        sites: list = []
        index: dict[int, int] = {}
        out = [("CALLS[0] += 1", None), ("t0 = clock()", None)]
        for line, op in body:
            out.append((line, op))
            if op is None or line.startswith("return"):
                continue
            k = index.get(id(op))
            if k is None:
                k = index[id(op)] = len(sites)
                sites.append(op)
            out.append((f"t1 = clock(); TIMES[{k}] += t1 - t0; t0 = t1", None))
        self.op_sites = sites
        self.times = env["TIMES"] = [0.0] * len(sites)
        self.calls = env["CALLS"] = [0]
        env["clock"] = time.perf_counter
        return out

    def op_times(self) -> list[tuple]:
        """(op, seconds per call) of each op, slowest first (profile mode)."""
        n = max(self.calls[0], 1) if self.profile else 1
        if not self.profile:
            raise RuntimeError("op_times: the runtime was not linked with profile=True")
        return sorted(((op, t / n) for op, t in zip(self.op_sites, self.times)),
                      key=lambda x: -x[1])

    @staticmethod
    def _in_place_ok(task, plan, linked, variables, var, value, produced_at, old_read,
                     root_var, whole, direct) -> bool:
        """Whether the kernel making `value` may write it straight into variable `var`: it
        allows aliasing, nothing reads the old value after it, it reads the old value (if at
        all) only with the variable's own layout, the value is not an output of the step, and
        the variable is a whole C-contiguous tensor of the value's meta."""
        i = produced_at.get(value)
        if i is None or value in direct or value in task.results:
            return False
        op = task.ops[i]
        if op.op_type in STRUCTURAL or not linked[op.name].inplace or linked[op.name].view:
            return False
        if old_read.get(var, -1) > i:
            return False
        if any(root_var.get(t) == var and t not in whole for t in op.inputs):
            return False  # a view of the variable: another layout of the memory written
        t = variables[var]
        meta = t._meta if t._gl is None else t._gl.local_meta
        if t._base is not None or meta != plan.tensors[value].meta or t._offset:
            return False
        return t.is_contiguous()


def _context(prims, op, plan) -> KernelContext:
    """The kernel context of one op: its pieces' metas and, for pieces of global tensors,
    the logical metas and where its output pieces lie (as eager global ops get them)."""
    descs_in = [plan.tensors[t] for t in op.inputs]
    descs_out = [plan.tensors[t] for t in op.outputs]
    in_metas = tuple(d.meta for d in descs_in)
    out_metas = tuple(d.meta for d in descs_out)
    if any(d.logical is not None for d in descs_in + descs_out):
        return KernelContext(prims, op.op_type, in_metas, out_metas,
                             tuple(d.logical_meta for d in descs_in),
                             tuple(d.logical_meta for d in descs_out),
                             tuple(d.slices for d in descs_out))
    return KernelContext(prims, op.op_type, in_metas, out_metas)


class _AssignSite:
    """Stands for an assign in error messages (it has no OpNode in the chain)."""

    def __init__(self, var, value):
        self.name = f"assign-{var}"
        self.op_type = "assign"
        self.var = var
        self.value = value

    def where(self):
        return "<assign>"
