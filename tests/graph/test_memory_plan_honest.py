"""The memory plan is honest: a tensor has an offset in the Plan exactly when its kernel writes
it into the runtime's memory block, the block is sized for those tensors only, and sizes are
this rank's pieces.

The step test runs an MLP training graph (fused elementwise chains, row kernels, the
optimizer's updates) with every kernel wrapped, and counts, per step, the arrays the kernels
hand back: planned outputs are the block's views at their offsets (no allocation), and the
arrays of memory of their own are exactly the unplanned outputs, the same number every step.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import sbpflow as flow
from sbpflow import comm
from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.graph import ir
from sbpflow.graph.passes import fuse_elementwise, memory_plan
from sbpflow.runtime import chain as chain_mod
from sbpflow.runtime import runtime as runtime_mod
from sbpflow.sbp import B, S
from sbpflow.sbp.placement import Placement

F = flow.nn.functional


# -- the rule, on hand-built Jobs ---------------------------------------------------------------
def _job(shape=(64,), placement=None, sbp=(B,), is_global=False):
    job = ir.Job("job")
    placement = placement or Placement("cpu", [0])

    def tensor(shape=shape, placement=placement, sbp=sbp):
        return job.add_tensor(TensorMeta(tuple(shape), dt.float32), placement, sbp,
                              is_global=is_global).name

    return job, tensor


def test_plain_ops_are_not_planned_and_count_as_unplanned():
    job, tensor = _job()
    x, a, b = tensor(), tensor(), tensor()
    job.add_op("input", (), (x,), {"index": 0})
    job.add_op("exp", (x,), (a,))
    job.add_op("add", (a, x), (b,))
    job.add_op("output", (b,), (), {"index": 0})
    memory_plan.run(job)
    assert all(t.mem is None for t in job.tensors.values())  # exp and add allocate their own
    assert job.stats["memory"] == {"block_bytes": 0, "peak_bytes": 0, "naive_bytes": 0,
                                   "unplanned_bytes": 2 * 64 * 4, "order": "none"}


def test_which_producers_write_their_planned_buffer():
    writes = memory_plan.writes_block
    assert fuse_elementwise.resolve  # its module declares its op types (and rows.py's)
    assert "fused_elementwise" in ir.OUT_WRITERS and "row_softmax" in ir.OUT_WRITERS
    assert writes(ir.OpNode("f", "fused_elementwise", ("a",), ("b",), {}), set())
    assert not writes(ir.OpNode("m", "matmul", ("a", "w"), ("b",), {}), set())
    assert not writes(ir.OpNode("x", "boxing", ("a",), ("b",), {}), set())
    assert not writes(ir.OpNode("v", "view", ("a",), ("b",), {}), set())
    # a multi-tensor update of one parameter: its kernel takes `out=`; the value an assign
    # writes may go straight into the variable, so it never gets a block offset
    upd = ir.OpNode("u", "multi_sgd_update", ("p", "g"), ("b",), {})
    assert writes(upd, set())
    assert not writes(upd, {"b"})
    assert not writes(ir.OpNode("s", "sgd_update", ("p", "g", "m"), ("b", "c"), {}), set())


def test_sizes_are_this_ranks_piece(monkeypatch):
    # the Job of a world of two ranks, planned for each of them in this one process
    monkeypatch.setattr(comm, "get_world_size", lambda: 2)
    two = Placement("cpu", [0, 1])
    job, tensor = _job((5, 16), two, (S(0),), is_global=True)
    x, a, b = tensor(), tensor(), tensor()
    other = tensor(placement=Placement("cpu", [1]), sbp=(B,))  # rank 1 only
    job.add_op("input", (), (x,), {"index": 0})
    job.add_op("exp", (x,), (a,))
    job.add_op("exp", (a,), (b,))
    job.add_op("exp", (x,), (other,))
    job.add_op("output", (b,), (), {"index": 0})
    job.add_op("output", (other,), (), {"index": 1})
    sizes = {}
    for rank in (0, 1):
        memory_plan.run(job, rank=rank, writes=lambda op: True)
        sizes[rank] = {n: t.mem[1] for n, t in job.tensors.items() if t.mem is not None}
    # 5 rows on 2 ranks are 3, 2; the tensor placed on rank 1 only is not made on rank 0
    assert sizes[0] == {a: 3 * 16 * 4, b: 3 * 16 * 4}
    assert sizes[1] == {a: 2 * 16 * 4, b: 2 * 16 * 4, other: 5 * 16 * 4}


def test_place_on_synthetic_lifetimes():
    # three buffers: 0 and 1 overlap, 2 starts after 0 died and reuses its memory
    s, e, n = [0, 1, 3], [2, 4, 5], [100, 200, 100]
    offsets, stats = memory_plan.place(s, e, n)
    assert offsets[2] == offsets[0] and offsets[0] != offsets[1]
    assert offsets.tolist()[0] % memory_plan.ALIGN == 0
    assert stats["peak_bytes"] == 300
    assert stats["naive_bytes"] == 128 + 256 + 128
    assert stats["block_bytes"] == int(max(o + k for o, k in zip(offsets, n)))
    assert stats["naive_bytes"] >= stats["block_bytes"] >= stats["peak_bytes"]


# -- a compiled training step -------------------------------------------------------------------
class _Recorder:
    """Wraps every linked kernel; per call, what it handed back: each output array and the
    arrays it read or was given (`out=`)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, list]] = []  # (op name, outputs, inputs)

    def wrap(self, desc, kernel):
        def recorded(*args, **kw):
            r = kernel(*args, **kw)
            ins = []
            for a in args[1:]:  # args[0]: the kernel context
                ins.extend(a if isinstance(a, (list, tuple)) else (a,))
            outs = r if isinstance(r, tuple) else (r,)
            self.calls.append((desc.name, outs, ins))
            return r

        recorded.__dict__.update(kernel.__dict__)  # accepts_out, view, ... as linked
        return recorded


class TrainGraph(flow.nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        self.config._flags["fuse_jit_min_numel"] = 256  # the numba kernels too

    def build(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def _owns(a, others) -> bool:
    """Whether array a is memory of its own: not the block's, an input's or a variable's."""
    return isinstance(a, np.ndarray) and a.nbytes > 0 and not any(
        np.shares_memory(a, o) for o in others if isinstance(o, np.ndarray))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_planned_tensors_are_written_into_the_block_and_allocate_nothing(optimizer,
                                                                           monkeypatch):
    rec = _Recorder()
    real_link = runtime_mod.link_op

    def link(desc, resolve=None):
        lk = real_link(desc, resolve)
        lk.kernel = rec.wrap(desc, lk.kernel)
        return lk

    monkeypatch.setattr(runtime_mod, "link_op", link)
    flow.manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Linear(32, 64), flow.nn.LayerNorm(64), flow.nn.Tanh(),
                               flow.nn.Linear(64, 64), flow.nn.GELU(), flow.nn.Linear(64, 10))
    opt = (flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
           else flow.optim.Adam(model.parameters(), lr=1e-3))
    g = TrainGraph(model, opt)
    rng = np.random.default_rng(0)
    batches = [(flow.tensor(rng.standard_normal((32, 32)).astype(np.float32)),
                flow.tensor(rng.integers(0, 10, 32))) for _ in range(4)]
    g(*batches[0])  # compile, link, first run
    rt = g._last.runner
    plan, job = rt.plan, g._last.job
    assert len(rt.chains) == 1 and len(rt.blocks) == 1
    block = next(iter(rt.blocks.values()))
    base = block.__array_interface__["data"][0]

    # The Plan prints an offset exactly for the tensors the chain writes into the block, and
    # the block is sized for them.
    offsets = {n for n, t in plan.tensors.items() if t.mem is not None}
    planned = set().union(*(c.planned for c in rt.chains.values()))
    assert offsets and offsets == planned
    assert len(re.findall(r" @\d+", str(plan))) == len(offsets)
    producers = {o: op for op in job.ops for o in op.outputs}
    kinds = {producers[t].op_type for t in offsets}
    assert "fused_elementwise" in kinds and any(k.startswith("row_") for k in kinds), kinds
    memory = plan.stats["memory"]
    assert memory == job.stats["memory"]
    assert "memory_block_bytes" not in plan.stats and "mem_block_bytes" not in job.stats
    task = next(t for t in plan.tasks if t.kind == "compute")
    assert memory["block_bytes"] == task.mem_bytes == block.nbytes
    assert memory["block_bytes"] == max(sum(plan.tensors[t].mem) for t in offsets)

    # What each op should hand back: in the block (planned), into a variable (updates
    # written in place), else an array of its own.
    ops = [op for op in task.ops if op.op_type not in chain_mod.STRUCTURAL]
    linked = {op.name: op for op in ops}
    inplace_values = {value for var, value, _ in task.assigns
                      if var in rt.chains[task.name].inplace_assigns}
    views = {o for op in ops for o in op.outputs if plan.tensors[o].view}
    expect_own = sorted(o for op in ops for o in op.outputs
                        if plan.tensors[o].mem is None and o not in inplace_values
                        and o not in views)
    variables = [t._blob.array for t in rt.variables.values()]

    own_per_step = []
    for x, y in batches[1:]:
        rec.calls.clear()
        g(x, y)
        assert [c[0] for c in rec.calls] == [op.name for op in ops]  # every kernel once
        own, in_block = [], []
        for name, outs, ins in rec.calls:
            for o, a in zip(linked[name].outputs, outs, strict=True):
                if o in offsets:  # the block's own view at the planned offset
                    assert np.shares_memory(a, block), o
                    assert a.__array_interface__["data"][0] == base + plan.tensors[o].mem[0]
                    in_block.append(o)
                elif _owns(a, [block, *ins, *variables]):
                    own.append(o)
                else:
                    assert o in inplace_values or o in views, (o, name)
        assert sorted(in_block) == sorted(offsets)
        own_per_step.append(sorted(own))
    # Steady state: planned tensors allocate nothing; the arrays allocated per step are the
    # unplanned outputs, the same ones every step.
    assert own_per_step[0] == own_per_step[1] == own_per_step[2] == expect_own
    unplanned = [o for op in ops for o in op.outputs
                 if plan.tensors[o].mem is None and o not in views]
    assert memory["unplanned_bytes"] == sum(plan.tensors[o].nbytes for o in unplanned)
