"""The graph call as one VM instruction (OneFlow's "run lazy job").

The instruction reads the input tensors' storages, reads the variables' storages and writes
those the plan assigns, and writes the output tensors' storages, so the VM orders it with
eager ops on the same tensors exactly as it orders eager ops among themselves.  The outputs
are new eager tensors whose blobs the instruction fills, built as the interpreter builds an
op's outputs.  Random ops draw from the default generator when the call is issued, in
execution order, as eager would.
"""

from __future__ import annotations

from ..framework.tensor import Tensor
from ..vm import Blob, InstructionsBuilder
from .actor import Instance

_builder = InstructionsBuilder()


class _Bound:
    """What every call of one runtime needs, looked up once."""

    __slots__ = ("name", "var_blobs", "reads", "writes", "assigned")

    def __init__(self, rt):
        plan = rt.plan
        self.name = f"graph {plan.name}"
        used = list(dict.fromkeys(plan.variables.values()))
        assigned = {var for t in plan.tasks for var, _ in t.assigns}
        tensors = [rt.variables[v] for v in used]
        self.var_blobs = [t._blob for t in tensors]
        self.reads = [rt.variables[v]._storage for v in used if v not in assigned]
        self.assigned = [rt.variables[v]._storage for v in used if v in assigned]
        self.writes = self.assigned


def call_graph(rt, inputs, feeds=None) -> list:
    """Run one job instance of runtime `rt` on eager tensors; returns the output tensors."""
    bound = rt.__dict__.get("_bound")
    if bound is None:
        bound = rt._bound = _Bound(rt)
    in_metas = rt.in_metas
    if len(inputs) != len(in_metas):
        raise TypeError(f"{bound.name}: expected {len(in_metas)} inputs, got {len(inputs)}")
    for i, (t, m) in enumerate(zip(inputs, in_metas)):
        if not isinstance(t, Tensor) or t._meta != m:
            got = (f"{t.dtype.name}{list(t.shape)}" if isinstance(t, Tensor)
                   else type(t).__name__)
            raise ValueError(f"{bound.name}: input {i} must be a tensor of "
                             f"{m.dtype.name}{list(m.shape)}, got {got}")
    feeds = dict(feeds) if feeds else {}
    if len(feeds) < len(rt.plan.feeds):
        missing = sorted(set(rt.plan.feeds) - set(feeds))
        if missing:
            raise KeyError(f"{bound.name}: no value fed for {missing}")
    dev = rt.device
    outs = [Tensor._make(Blob(), m, dev) for m in rt.out_metas]
    out_blobs = [o._blob for o in outs]
    in_blobs = [t._blob for t in inputs]
    rng = rt.draw_rng()
    inline = rt.inline

    def run_lazy_job():
        inst = Instance([b.array for b in in_blobs], feeds, rng)
        rt.launch(inst)
        if not inline:
            inst.event.wait()
        if inst.error is not None:
            raise inst.error
        for b, a in zip(out_blobs, inst.results):
            b.array = a

    _builder.call(bound.name, run_lazy_job, ins=in_blobs + bound.var_blobs, outs=out_blobs,
                  reads=[t._storage for t in inputs] + bound.reads,
                  writes=[o._storage for o in outs] + bound.writes, stream=dev.type,
                  kind="call", numel=0)
    for st in bound.assigned:  # as eager in-place writes do, at issue
        st.version += 1
    return outs
