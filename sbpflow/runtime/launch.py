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


class GraphCall:
    """The graph call of one runtime, with what every call needs looked up once."""

    def __init__(self, rt):
        plan = rt.plan
        self.rt = rt
        self.name = f"graph {plan.name}"
        used = list(dict.fromkeys(plan.variables.values()))
        assigned = {a[0] for t in plan.tasks for a in t.assigns}
        self.var_blobs = [rt.variables[v]._blob for v in used]
        self.var_reads = [rt.variables[v]._storage for v in used if v not in assigned]
        # Storages the step writes in place: ordered after every earlier reader and writer.
        self.assigned = [rt.variables[v]._storage for v in used if v in assigned]
        self.feed_keys = tuple(plan.feeds)
        self.in_metas = rt.in_metas
        self.out_metas = rt.out_metas
        self.device = rt.device
        self.last = None  # (stream, seq) of the last call's VM instruction

    def wait(self) -> None:
        """Wait until the last graph call issued has run (the VM may hold it in a queue)."""
        if self.last is not None:
            stream, seq = self.last
            stream.wait(seq)

    def __call__(self, inputs, feeds=None) -> list:
        """Run one job instance on eager tensors; returns the output tensors."""
        in_metas = self.in_metas
        if len(inputs) != len(in_metas):
            raise TypeError(f"{self.name}: expected {len(in_metas)} inputs, got {len(inputs)}")
        for t, m in zip(inputs, in_metas):
            if type(t) is not Tensor or t._meta != m:
                self._bad_input(inputs)
        if feeds:
            feeds = dict(feeds)
        else:
            feeds = {}
        for k in self.feed_keys:
            if k not in feeds:
                missing = sorted(set(self.feed_keys) - set(feeds))
                raise KeyError(f"{self.name}: no value fed for {missing}")
        rt = self.rt
        dev = self.device
        outs = [Tensor._make(Blob(), m, dev) for m in self.out_metas]
        out_blobs = [o._blob for o in outs]
        in_blobs = [t._blob for t in inputs]
        rng = rt.draw_rng() if rt.rng_words else ()
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

        instr = _builder.call(self.name, run_lazy_job, ins=in_blobs + self.var_blobs,
                              outs=out_blobs, reads=[t._storage for t in inputs] + self.var_reads,
                              writes=[o._storage for o in outs] + self.assigned,
                              stream=dev.type, kind="call", numel=0)
        self.last = (instr.stream, instr.seq)  # not the instruction: it holds the blobs
        for st in self.assigned:  # as eager in-place writes do, at issue
            st.version += 1
        return outs

    def _bad_input(self, inputs):
        for i, (t, m) in enumerate(zip(inputs, self.in_metas)):
            if not isinstance(t, Tensor) or t._meta != m:
                got = (f"{t.dtype.name}{list(t.shape)}" if isinstance(t, Tensor)
                       else type(t).__name__)
                raise ValueError(f"{self.name}: input {i} must be a tensor of "
                                 f"{m.dtype.name}{list(m.shape)}, got {got}")


def call_graph(rt, inputs, feeds=None) -> list:
    """Run one job instance of runtime `rt` on eager tensors; returns the output tensors."""
    return rt.graph_call(inputs, feeds)
