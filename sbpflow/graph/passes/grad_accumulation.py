"""Gradient accumulation: one graph call is a mini-batch of n micro-batches, one update.

`graph.config.set_gradient_accumulation_steps(n)` with n > 1 (`job.config[
"gradient_accumulation_steps"]`).  The semantics are OneFlow's (its lazy interpreter inserts
unpack after every input, repeat after every variable, pack before every output; the
optimizer runs on the accumulated gradient):

- A call's tensor arguments are the mini-batch: each is split along axis 0 into n equal
  micro-batches, in order (every argument must have an axis 0 that n divides; the front end
  says which does not).  `build()` is traced once on micro-batch shapes, so inside it
  `x.shape` is a micro-batch's shape, as in OneFlow.
- Each micro-batch runs the whole of build() on its slices, as eager code would run it once
  per micro-batch: random ops draw anew per micro-batch, in eager order (micro-batch 0's
  draws first); buffers written in forward (BatchNorm's running statistics and
  `num_batches_tracked`) are updated by every micro-batch in turn, micro-batch i+1 reading
  what micro-batch i wrote.  Variables (parameters, optimizer state) are shared by all
  micro-batches (OneFlow's repeat), and the optimizer steps once per call, on the sum of
  the micro-batches' gradients.
- Loss scaling: the gradient equals that of the mean of the micro-batch losses.  OneFlow
  multiplies the accumulated gradient by 1/n (`ScaleModelDiffByLossInstanceNum`); here each
  micro-batch's backward is seeded with 1/n instead of 1, which is exactly eager's recipe
  (`(loss / n).backward()` per micro-batch, gradients summed in `.grad`, one
  `optimizer.step()`), so graph and eager training agree to the bit when 1/n is exact.
- Outputs are OneFlow's pack: each output of build() is the concatenation along axis 0 of
  the n micro-batches' values, and a 0-dim output (a scalar loss) becomes shape (n,), the
  n micro-batch losses, unscaled.  (`g(x, y).mean()` is the mini-batch's mean loss.)  A
  tensor argument that build() writes in place is written back whole, micro-batch by
  micro-batch.
- Only training graphs accumulate (the front end refuses the setting on a graph without an
  optimizer, where OneFlow silently ignores it).

Global tensors (data parallelism, OneFlow's lazy global mode): a rank's micro-batch is the
k-th n-th of *its own piece* along axis 0, as OneFlow's unpack and eager DDP's recipe cut it
(each rank splits its share of the batch): micro-batch k of an S(0) input is the global
tensor of the same placement and SBP whose pieces are those slices, so no rank sends a row.
For a B, P or S(i>0) input that is the logical slice itself.  Every rank's piece must be n
times its micro-batch piece (the front end checks it and names the rank).  Pack is the
inverse, per piece: an S(0) output's pieces are each rank's micro-batch pieces concatenated,
so its rows come back in the input's order.  The gradients add up as in eager (each
micro-batch's P gradient of a B parameter is summed as P, and boxed once, for the update).
With global tensors the micro-batches of a mini-batch group other rows than logical slices
would (rank r's k-th slice, for every r): the accumulated gradient of a loss that averages
over rows is the same, but row-coupled ops (BatchNorm's statistics) see per-rank groups, as
in eager DDP.

How: the Job (traced on micro-batch shapes) is rewritten into

    inputs (now of mini-batch shape), variables
    micro-batch 0:  micro_batch(input; index=0) ...  forward copy 0  backward 0 (seed 1/n)
    micro-batch 1:  micro_batch(input; index=1) ...  forward copy 1  backward 1  acc += grads
    ...
    micro_batch_pack (cat / stack) of each output's n copies, outputs

`micro_batch` and `micro_batch_pack` are this pass's op types (kernels in
`ir.KERNEL_RESOLVERS`; SBP: the input's, unchanged): on each rank they slice and join the
rank's pieces, which for local tensors is `narrow` and `cat`/`stack`.

The micro-batch index is part of every op of micro-batch i (its name ends in `@mb<i>`, and
its random ops are draws of their own), distinct from the call number (the runtime's piece).
Because backward i comes right after forward i, memory planning sees micro-batch i's
activations die before micro-batch i+1 starts, so the plan's peak is that of one
micro-batch plus the accumulated gradients.  The slices are views of the input, not copies.
`job.stats["micro_batches"]` (and so the Plan's stats) records n.  The autograd pass sees the
flag and leaves the Job alone: this pass differentiates each micro-batch with
`autograd.differentiate`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..._core.meta import TensorMeta
from ...ops import registry
from ...sbp import layout
from .. import ir
from ..ir import Job
from ..trace import Trace
from . import autograd

# Ops every micro-batch shares (OneFlow's repeat: the same value for each).
_SHARED = ("input", "variable", "feed", "constant")


def steps(job: Job) -> int:
    return int(job.config.get("gradient_accumulation_steps", 1))


def run(job: Job) -> None:
    n = steps(job)
    if n == 1:
        return
    inputs = job.inputs()
    for op in inputs:
        t = job.tensors[op.outputs[0]]
        if not t.shape:
            raise ValueError(
                f"Job {job.name}: gradient accumulation ({n} micro-batches) splits every input "
                f"along axis 0, but input {op.attrs['index']} is 0-dim")
    shared = [op for op in job.ops if op.op_type in _SHARED]
    outputs = job.outputs()
    body = [op for op in job.ops if op.op_type not in _SHARED and op.op_type != "output"]
    losses = list(job.loss)

    # The body's tensors are made anew per micro-batch; the traced ones are templates.
    template = {o: job.tensors.pop(o) for op in body for o in op.outputs}
    micro = {}
    for op in inputs:
        t = job.tensors[op.outputs[0]]
        micro[t.name] = t.meta
        t.meta = TensorMeta((t.shape[0] * n, *t.shape[1:]), t.dtype)
        _check_pieces(job, t, micro[t.name], n, f"input {op.attrs['index']}")
    job.ops = list(shared)
    variables = [op for op in shared if op.op_type == "variable"]

    carried: dict[str, str] = {}  # variable tensor -> value the previous micro-batch wrote
    copies: list[dict[str, str]] = []  # per micro-batch: traced tensor -> its copy
    acc: dict[str, str] = {}  # trainable variable -> accumulated gradient
    all_losses: list[str] = []
    for k in range(n):
        tag = f"@mb{k}"
        rename = dict(carried)
        start = len(job.ops)
        for op in inputs:
            src = op.outputs[0]
            lt = job.tensors[src]
            piece = job.add_tensor(micro[src], lt.placement, lt.sbp, name=f"{src}{tag}",
                                   is_global=lt.is_global).name
            job.add_op("micro_batch", (src,), (piece,), {"index": k, "steps": n},
                       name=f"{op.name}-unpack{tag}", micro_batch=k)
            rename[src] = piece
        writes: dict[str, str] = {}
        for op in body:
            if op.op_type == "assign":
                target, value = op.inputs
                value = rename.get(value, value)
                writes[target] = value
                if k == n - 1:  # only the last write of the step reaches the variable
                    job.add_op("assign", (target, value), (), dict(op.attrs), op.scope,
                               op.loc, name=f"{op.name}{tag}", micro_batch=k)
                continue
            ins = tuple(rename.get(i, i) for i in op.inputs)
            outs = []
            for o in op.outputs:
                lt = template[o]
                outs.append(job.add_tensor(lt.meta, lt.placement, lt.sbp, name=f"{o}{tag}",
                                           is_global=lt.is_global).name)
                rename[o] = outs[-1]
            job.add_op(op.op_type, ins, outs, dict(op.attrs), op.scope, op.loc,
                       name=f"{op.name}{tag}", micro_batch=k)
        forward = job.ops[start:]
        mb_losses = [rename.get(x, x) for x in losses]
        all_losses.extend(mb_losses)
        if mb_losses:
            bstart = len(job.ops)
            autograd.differentiate(job, mb_losses, variables + forward, seed=1.0 / n,
                                   on_grad=functools.partial(_accumulate, acc))
            _tag(job, job.ops[bstart:], k)
        carried = writes
        copies.append(rename)

    packed: dict[str, str] = {}
    for op in outputs:
        src = op.inputs[0]
        if src not in packed:
            parts = [c.get(src, src) for c in copies]
            lt = template.get(src) or job.tensors[src]
            if any(job.tensors[p].placement != lt.placement or job.tensors[p].sbp != lt.sbp
                   for p in parts):
                raise NotImplementedError(
                    f"Job {job.name}: output {op.attrs['index']} of build() is not on one "
                    "placement and SBP in every micro-batch; gradient accumulation packs the "
                    "micro-batches' pieces as they are")
            meta = TensorMeta((n,) if not lt.shape else (lt.shape[0] * n, *lt.shape[1:]),
                              lt.dtype)
            if lt.shape:
                _check_pieces(job, lt, lt.meta, n, f"output {op.attrs['index']}",
                              whole=meta)
            packed[src] = job.add_tensor(meta, lt.placement, lt.sbp,
                                         name=job.new_name(f"{src}-pack"),
                                         is_global=lt.is_global).name
            job.add_op("micro_batch_pack", parts, (packed[src],),
                       {"stack": not lt.shape}, op.scope, op.loc, name=f"{op.name}-pack")
        job.add_op("output", (packed[src],), (), dict(op.attrs), name=op.name)
    job.loss = all_losses
    job.grads = acc
    job.stats["micro_batches"] = n


def _accumulate(acc: dict, trace: Trace, var: str, g) -> None:
    """acc[var] += g, where micro-batch k's gradient of var is complete (the sum as eager's
    `.grad` accumulates it; g first, so that elementwise fusion may write the sum straight
    into the output of the op that made g)."""
    if var in acc:
        with trace.scope("grad_accumulation"):
            acc[var] = trace.name_of(registry.op("add", g, trace.lazy(acc[var])))
    else:
        acc[var] = trace.name_of(g)


def _tag(job: Job, ops, k: int) -> None:
    """Mark the ops a pass appended for micro-batch k (names end in @mb<k>; their tensors'
    producers follow)."""
    for op in ops:
        op.name = f"{op.name}@mb{k}"
        op.micro_batch = k
        for o in op.outputs:
            job.tensors[o].producer = op.name


def _check_pieces(job: Job, t, micro: TensorMeta, n: int, what: str, whole=None) -> None:
    """Every rank's piece of global tensor t (of meta `whole`, default t's) along axis 0 is
    n times its piece of the micro-batch (meta `micro`): the micro-batches are slices of the
    pieces."""
    if not t.is_global:
        return
    whole = t.meta if whole is None else whole
    for rank in t.placement.rank_list:
        have = layout.local_shape(whole.shape, t.placement, t.sbp, rank)[0]
        want = layout.local_shape(micro.shape, t.placement, t.sbp, rank)[0]
        if have != n * want:
            raise ValueError(
                f"Job {job.name}: gradient accumulation ({n} micro-batches) cuts each rank's "
                f"piece of {what} along axis 0 into {n}, but rank {rank} holds {have} rows of "
                f"{whole.shape[0]} ({t.sbp} on {t.placement}), not {n} x {want}: use a batch "
                f"that splits into {n} equal micro-batches on every rank")


# -- kernels: on each rank, its pieces ---------------------------------------------------------
def _resolve_micro_batch(node, job):
    k, n = node.attrs["index"], node.attrs["steps"]

    def kernel(ctx, x, **_attrs):
        m = x.shape[0] // n
        return x[k * m:(k + 1) * m]  # a view: ir.VIEW_OPS

    kernel.view = True
    return kernel


def _resolve_micro_batch_pack(node, job):
    def kernel(ctx, *parts, stack=False):
        return np.stack(parts) if stack else np.concatenate(parts, axis=0)

    return kernel


ir.KERNEL_RESOLVERS["micro_batch"] = _resolve_micro_batch
ir.KERNEL_RESOLVERS["micro_batch_pack"] = _resolve_micro_batch_pack
ir.VIEW_OPS.add("micro_batch")
