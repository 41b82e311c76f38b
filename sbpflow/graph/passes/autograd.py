"""Autograd pass: reverse-mode differentiation of the Job from `job.loss`.

Each forward op's gradient comes from its OpDef's `grad` rule, the same rule eager autograd
runs, executed under the lazy interpreter so the ops it calls are appended to the same Job.
Gradients meeting at a tensor are summed; floating outputs without a gradient get zeros when
another output of the op has one; integer tensors get none.  Result: `job.grads[var] = grad
tensor` for every trainable variable the loss depends on.  Backward ops keep the scope of
their forward op (with a `-backward` suffix) and its `build()` line, so an error in a backward
kernel names the line that issued the forward op.
"""

from __future__ import annotations

from ...framework.global_tensor import GlobalDevice
from ...ops import registry
from ...sbp import layout
from ..ir import BOXING, STRUCTURAL, Job
from ..trace import Trace


class GraphGradContext:
    """What a grad rule sees in a graph: the forward op's tensors as lazy tensors, attrs,
    metas.  Only the tensors the OpDef declares in `saves` are available (as in eager)."""

    __slots__ = ("_trace", "_op", "_opdef", "attrs", "in_metas", "out_metas",
                 "needs_input_grad")

    def __init__(self, trace: Trace, op, opdef, needs_input_grad):
        job = trace.job
        self._trace = trace
        self._op = op
        self._opdef = opdef
        self.attrs = op.attrs
        self.in_metas = tuple(job.tensors[n].meta for n in op.inputs)
        self.out_metas = tuple(job.tensors[n].meta for n in op.outputs)
        self.needs_input_grad = needs_input_grad

    @property
    def inputs(self):
        return tuple(self.input(i) for i in range(len(self._op.inputs)))

    def input(self, i: int):
        n = len(self._op.inputs)
        self._check("input", i, n, self._opdef.saved_input_indices(n))
        return self._trace.lazy(self._op.inputs[i])

    @property
    def outputs(self):
        return tuple(self.output(i) for i in range(len(self._op.outputs)))

    def output(self, i: int):
        n = len(self._op.outputs)
        self._check("output", i, n, self._opdef.saved_output_indices(n))
        return self._trace.lazy(self._op.outputs[i])

    def _check(self, kind, i, n, keep):
        if not -n <= i < n:
            raise IndexError(f"grad rule of {self._opdef.name!r} read {kind} {i} of {n}")
        if i % n not in keep:
            raise AssertionError(
                f"internal error: grad rule of {self._opdef.name!r} read {kind} {i}, which its "
                f"OpDef does not save (saves={self._opdef.saves!r})")


def _requires_grad(job: Job, ops) -> set[str]:
    """Tensors of `ops` that depend on a trainable variable through differentiable ops."""
    rg: set[str] = set()
    for op in ops:
        if op.op_type == "variable":
            var = job.variables.get(op.attrs["var"])
            if var is not None and var.trainable:
                rg.update(op.outputs)
            continue
        if op.op_type in STRUCTURAL or not any(i in rg for i in op.inputs):
            continue
        if op.op_type in BOXING:  # conversions pass gradients through
            rg.update(op.outputs)
            continue
        try:
            opdef = registry.get(op.op_type)
        except KeyError:
            continue
        if opdef.grad is None:
            continue
        rg.update(o for i, o in enumerate(op.outputs)
                  if opdef.differentiable(i, job.tensors[o].meta))
    return rg


def run(job: Job) -> None:
    if not job.loss or job.config.get("gradient_accumulation_steps", 1) > 1:
        return  # nothing to differentiate, or the gradient-accumulation pass did it
    job.grads.update(differentiate(job, job.loss, list(job.ops)))


def differentiate(job: Job, losses, forward: list, seed: float = 1.0,
                  on_grad=None) -> dict[str, str]:
    """Append to `job` the backward of `losses` through the ops `forward` (a part of
    job.ops, in order), each loss's gradient seeded with `seed`.  Returns {trainable variable:
    its gradient tensor}; job.grads is left to the caller.

    `on_grad(trace, var, g)`, if given, is called (while `trace` records) as soon as
    variable `var`'s gradient `g` (a lazy tensor) is complete, i.e. right after the backward
    of the first forward op that reads the variable, so the ops it adds (gradient
    accumulation's sum) come where g is made and g need not outlive them.  Without it,
    gradients are totalled where their variable ops stand (the end of the backward)."""
    rg = _requires_grad(job, forward)
    out: dict[str, str] = {}
    trace = Trace(job)
    # Trainable variable tensor -> position in `forward` of its first reader: its gradient
    # is complete once that op's backward is done.
    complete_at: dict[int, list[str]] = {}
    trainable: dict[str, str] = {}
    if on_grad is not None:
        trainable = {op.outputs[0]: op.attrs["var"] for op in forward
                     if op.op_type == "variable" and getattr(
                         job.variables.get(op.attrs["var"]), "trainable", False)}
        first: dict[str, int] = {}
        for k, op in enumerate(forward):
            for i in op.inputs:
                if i in trainable:
                    first.setdefault(i, k)
        for t, k in first.items():
            complete_at.setdefault(k, []).append(t)

    grads: dict[str, list] = {}

    def add_grad(name, g):
        grads.setdefault(name, []).append(g)

    def total(name):
        gs = grads.get(name)
        if not gs:
            return None
        g = gs[0]
        for h in gs[1:]:
            g = registry.op("add", g, h)
        grads[name] = [g]
        return g

    def finish(t: str, var: str) -> None:
        g = total(t)
        if g is not None:
            out[var] = trace.name_of(g)
            if on_grad is not None:
                on_grad(trace, var, g)

    # One first-order backward: grad rules may use their fused gradient ops (batch_norm_grad,
    # layer_norm_grad), the same ops an eager backward runs.
    with trace.active(), registry.plain_backward():
        for loss in losses:
            meta = job.tensors[loss].meta
            with trace.scope("backward"):
                add_grad(loss, registry.op("full", shape=meta.shape, fill_value=seed,
                                           dtype=meta.dtype, _device=_where(job, loss)))
        for k in range(len(forward) - 1, -1, -1):
            op = forward[k]
            for t in complete_at.get(k + 1, ()):
                finish(t, trainable[t])
            if op.op_type == "variable":
                var = job.variables.get(op.attrs["var"])
                if var is not None and var.trainable and var.name not in out:
                    finish(op.outputs[0], var.name)
                continue
            if op.op_type in STRUCTURAL:
                continue
            if not any(grads.get(o) for o in op.outputs):
                continue
            if op.op_type in BOXING:
                if op.inputs[0] in rg:
                    trace.loc = op.loc
                    with trace.scope(f"{op.scope}-backward" if op.scope else "backward"):
                        add_grad(op.inputs[0], _conversion_grad(trace, job, op,
                                                                total(op.outputs[0])))
                continue
            opdef = registry.get(op.op_type)
            needs = tuple(i in rg for i in op.inputs)
            if opdef.grad is None or not any(needs):
                continue
            trace.loc = op.loc  # backward ops name the forward op's build() line
            with trace.scope(f"{op.scope}-backward" if op.scope else "backward"):
                out_grads = []
                for j, o in enumerate(op.outputs):
                    g = total(o)
                    meta = job.tensors[o].meta
                    if g is None and opdef.differentiable(j, meta):
                        g = registry.op("full", shape=meta.shape, fill_value=0.0,
                                        dtype=meta.dtype, _device=_where(job, o))
                    out_grads.append(g)
                ctx = GraphGradContext(trace, op, opdef, needs)
                in_grads = opdef.grad(ctx, *out_grads)
                if not isinstance(in_grads, (tuple, list)):
                    in_grads = (in_grads,)
            if len(in_grads) != len(op.inputs):
                raise RuntimeError(
                    f"grad rule of {op.op_type} returned {len(in_grads)} gradients for "
                    f"{len(op.inputs)} inputs (op {op.name} at {op.where()})")
            for name, g, need in zip(op.inputs, in_grads, needs):
                if g is None or not need:
                    continue
                if tuple(g.shape) != job.tensors[name].shape:
                    raise RuntimeError(
                        f"grad rule of {op.op_type} returned a gradient of shape "
                        f"{list(g.shape)} for input {name} of shape "
                        f"{list(job.tensors[name].shape)} (op {op.name} at {op.where()})")
                add_grad(name, g)
        for t in complete_at.get(0, ()):
            finish(t, trainable[t])
    return out


def _where(job: Job, name: str):
    """Where a gradient made from nothing goes: a global tensor's placement (B), as eager
    autograd's `_where`; None (the default device) for a local one."""
    t = job.tensors[name]
    return GlobalDevice(t.placement) if t.is_global else None


def _conversion_grad(trace: Trace, job: Job, op, g):
    """The gradient of a BOXING node, as eager autograd gives it: global -> global boxes the
    gradient back to the source placement with the dual SBP (B <-> P, S stays); local ->
    global boxes to the dual SBP and takes this rank's piece; to_local's gradient is the
    piece of a global gradient with the tensor's own SBP."""
    src, dst = job.tensors[op.inputs[0]], job.tensors[op.outputs[0]]
    if op.op_type == "boxing":
        return trace.convert("to_global", g, src.placement, layout.dual(src.sbp))
    if op.op_type == "local_to_global":
        full = trace.convert("to_global", g, dst.placement, layout.dual(dst.sbp))
        return trace.convert("to_local", full)
    return trace.piece_to_global(g, src.placement, src.sbp, src.meta)
