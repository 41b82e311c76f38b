"""The Job verifier (`Job.check(placements=True)`), which `run_passes` runs after every pass
under `nn.Graph.debug()` and in the tests (SBPFLOW_CHECK_JOBS, set by tests/conftest.py)."""

from __future__ import annotations

import pytest

import sbpflow as flow
from sbpflow.graph import passes
from sbpflow.graph.ir import Job
from sbpflow.graph.trace import trace_build

P1 = flow.placement("cpu", [0])
B, S = flow.sbp.broadcast, flow.sbp.split


def _job(build, *args, modules=None):
    job = Job("verify")
    trace_build(job, build, args, {}, modules or {})
    return job


def _global_job():
    lin = flow.nn.Linear(3, 2).to_global(P1, B)
    x = flow.randn(4, 3).to_global(P1, S(0))
    return _job(lambda x: lin(x).relu().sum(), x, modules={"lin": lin}), lin


def test_a_traced_global_job_passes_and_every_pass_keeps_it_consistent():
    job, _ = _global_job()
    job.check(placements=True)
    passes.run_passes(job, check=True)
    job.check(placements=True)


def test_a_wrong_sbp_is_named_with_the_op_and_the_signature():
    job, _ = _global_job()
    relu = next(op for op in job.ops if op.op_type == "relu")
    job.tensors[relu.outputs[0]].sbp = (flow.sbp.partial_sum,)
    with pytest.raises(ValueError, match=r"relu.*nd-SBPs \(S\(0\)\) -> \(P\) are not a "
                                         r"signature of relu"):
        job.check(placements=True)
    job.check()  # the structural check alone does not look at SBPs


def test_mixing_local_and_global_tensors_is_named():
    job, _ = _global_job()
    relu = next(op for op in job.ops if op.op_type == "relu")
    job.tensors[relu.inputs[0]].is_global = False
    name = relu.inputs[0]
    with pytest.raises(ValueError, match=rf"\(linear\).*mixes local and global tensors: "
                                         rf"{name} are local"):
        job.check(placements=True)


def test_a_boxing_node_must_match_its_ends():
    x = flow.randn(4, 3).to_global(P1, B)
    job = _job(lambda x: x.to_global(P1, S(0)) * 2, x)
    box = next(op for op in job.ops if op.op_type == "boxing")
    job.check(placements=True)
    job.tensors[box.outputs[0]].sbp = (S(1),)
    with pytest.raises(ValueError, match=r"boxing.*attrs say"):
        job.check(placements=True)


def test_an_assign_of_another_sbp_is_refused():
    job, lin = _global_job()
    job.add_tensor(lin.weight._meta, P1, (B,), name="w-new", is_global=True)
    job.add_op("full", (), ("w-new",), {})
    job.tensors["w-new"].sbp = (S(0),)
    job.add_op("assign", ("lin.weight", "w-new"), ())
    with pytest.raises(ValueError, match=r"assign.*box it first"):
        job.check(placements=True)


def test_run_passes_names_the_pass_that_broke_the_job(monkeypatch):
    job, _ = _global_job()
    cse = passes.get("cse")
    real = cse.run

    def breaking(j):
        real(j)
        op = next(o for o in j.ops if o.op_type == "relu")
        j.tensors[op.outputs[0]].sbp = (flow.sbp.partial_sum,)

    monkeypatch.setattr(cse, "run", breaking)
    with pytest.raises(ValueError, match=r"inconsistent after pass cse: .*relu"):
        passes.run_passes(job, check=True)


def test_debug_verifies_graphs(monkeypatch):
    calls = []
    real = Job.check

    def counting(self, placements=False):
        calls.append(placements)
        return real(self, placements)

    monkeypatch.setattr(passes, "CHECK_JOBS", False)
    monkeypatch.setattr(Job, "check", counting)
    lin = flow.nn.Linear(3, 2)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def build(self, x):
            return self.lin(x)

    g = G()
    g(flow.randn(2, 3))
    assert not any(calls)  # off by default (outside the tests' SBPFLOW_CHECK_JOBS)
    g2 = G()
    g2.debug(0)
    g2(flow.randn(2, 3))
    assert sum(calls) == len(passes.ORDER) + 1
