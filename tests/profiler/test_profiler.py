"""sbpflow.profiler: torch.profiler's API, and a Trace Event Format trace Perfetto opens.

The trace is checked as Perfetto's JSON importer reads it: one JSON object whose
"traceEvents" are complete events ("ph": "X", ts/dur in µs, pid/tid) and metadata events
naming every process and thread they use.  Counts are checked against the calls made.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.profiler as profiler
from sbpflow.profiler import ProfilerActivity, profile, record_function
from tests.mpijob import mpiexec_cmd, run_job

HERE = Path(__file__).resolve().parent


def _load_trace(path) -> dict:
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    _check_trace_event_format(trace)
    return trace


def _check_trace_event_format(trace: dict) -> None:
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    named_threads, named_procs = set(), set()
    for ev in trace["traceEvents"]:
        assert ev["ph"] in ("X", "M"), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name",
                                  "thread_sort_index"), ev
            if ev["name"] == "thread_name":
                assert isinstance(ev["args"]["name"], str) and ev["args"]["name"]
                named_threads.add((ev["pid"], ev["tid"]))
            if ev["name"] == "process_name":
                named_procs.add(ev["pid"])
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            assert isinstance(ev["name"], str) and ev["name"]
            assert isinstance(ev["cat"], str)
            assert isinstance(ev["ts"], (int, float)) and ev["ts"] > 0
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
            assert (ev["pid"], ev["tid"]) in named_threads, ev
            assert ev["pid"] in named_procs, ev
            assert isinstance(ev.get("args", {}), dict)


def _complete(trace, cat=None):
    return [e for e in trace["traceEvents"]
            if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def _thread_names(trace) -> dict:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _inside(outer, inner) -> bool:
    return (outer["tid"] == inner["tid"] and outer["ts"] <= inner["ts"]
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3)


def _model():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(3, 5), flow.nn.ReLU(), flow.nn.Linear(5, 2))


def test_trace_of_forward_and_backward(tmp_path):
    model = _model()
    x = flow.randn(4, 3)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with record_function("forward"):
            loss = model(x).sum()
        with record_function("backward"):
            loss.backward()
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert path == str(tmp_path / "trace.json")  # one rank: the path itself
    trace = _load_trace(path)

    ops = _complete(trace, "cpu_op")
    fwd = next(e for e in _complete(trace, "user_annotation") if e["name"] == "forward")
    bwd = next(e for e in _complete(trace, "user_annotation") if e["name"] == "backward")
    # The forward's op dispatches, in call order, with the input shapes of each call.
    in_fwd = sorted((e for e in ops if _inside(fwd, e)), key=lambda e: e["ts"])
    assert [e["name"] for e in in_fwd] == ["linear", "relu", "linear", "sum"]
    assert [e["args"]["Input Dims"] for e in in_fwd] == [
        [[4, 3], [5, 3], [5]], [[4, 5]], [[4, 5], [2, 5], [2]], [[4, 2]]]
    # The backward dispatches ops too: the weight gradients are matmuls.
    in_bwd = [e["name"] for e in ops if _inside(bwd, e)]
    assert in_bwd.count("matmul") >= 2, in_bwd
    # Every op dispatched ran as a VM instruction of the same name on the compute stream.
    names = _thread_names(trace)
    vm = _complete(trace, "vm_instruction")
    # (Only the ops' instructions: a comm stream made by an earlier test in this process may
    # run its own bookkeeping instructions meanwhile.)
    dispatched = {e["name"] for e in ops}
    assert {names[(e["pid"], e["tid"])] for e in vm if e["name"] in dispatched} == {
        "VM stream cpu"}
    vm_names = [e["name"] for e in vm]
    for op in ("linear", "relu", "sum", "matmul"):
        assert vm_names.count(op) == [e["name"] for e in ops].count(op), op
    # Op dispatches are on the Python thread's track, not on the stream's.
    assert {names[(e["pid"], e["tid"])] for e in ops} == {"thread MainThread"}
    assert grad_ok(model)


def grad_ok(model) -> bool:
    return all(p.grad is not None for p in model.parameters())


def _table_calls(table: str) -> dict:
    lines = table.splitlines()
    header = lines[1]
    cols = re.split(r"\s{2,}", header.strip())
    k = cols.index("# of Calls")
    out = {}
    for line in lines[3:]:
        if line.startswith("-"):
            break
        vals = re.split(r"\s{2,}", line.strip())
        out[vals[0]] = int(vals[k])
    return out


def test_key_averages_counts_equal_calls():
    a, b = flow.randn(3, 4), flow.randn(3, 4)
    with profile() as prof:
        for _ in range(5):
            flow.add(a, b)
        for _ in range(3):
            flow.mul(a, b)
        for _ in range(2):
            flow.relu(a)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    calls = _table_calls(table)
    assert calls["add"] == 5 and calls["mul"] == 3 and calls["relu"] == 2, table
    counts = {r.key: r.count for r in prof.key_averages()}
    assert (counts["add"], counts["mul"], counts["relu"]) == (5, 3, 2)
    assert "Self CPU time total" in table
    # Sorted by self CPU time, descending; row_limit cuts the rows.
    rows = prof.key_averages()
    ordered = sorted(rows, key=lambda r: -r.self_cpu_time_total)
    assert list(_table_calls(prof.key_averages().table(
        sort_by="self_cpu_time_total", row_limit=2))) == [r.key for r in ordered[:2]]
    with pytest.raises(AttributeError):
        rows.table(sort_by="no_such_column")


def test_group_by_input_shape():
    with profile(record_shapes=True) as prof:
        flow.add(flow.ones(2, 3), flow.ones(2, 3))
        flow.add(flow.ones(2, 3), flow.ones(2, 3))
        flow.add(flow.ones(4), flow.ones(4))
    rows = [r for r in prof.key_averages(group_by_input_shape=True) if r.key == "add"]
    assert sorted((str(r.input_shapes), r.count) for r in rows) == [
        ("[[2, 3], [2, 3]]", 2), ("[[4], [4]]", 1)]
    table = prof.key_averages(group_by_input_shape=True).table(sort_by="cpu_time_total")
    assert "Input Shapes" in table and "[[4], [4]]" in table
    with profile() as plain:
        flow.add(flow.ones(1), flow.ones(1))
    with pytest.raises(AssertionError, match="record_shapes"):
        plain.key_averages(group_by_input_shape=True)


def test_events_nest_and_time_ranges():
    with profile() as prof:
        with record_function("outer"):
            flow.relu(flow.ones(3))
    evs = prof.events()
    outer = next(e for e in evs if e.name == "outer")
    relu = next(e for e in evs if e.name == "relu" and e.cat == "cpu_op")
    assert relu.cpu_parent is outer and relu in outer.cpu_children
    assert outer.cpu_time_total >= relu.cpu_time_total >= 0
    assert outer.self_cpu_time_total == pytest.approx(
        outer.cpu_time_total - sum(c.cpu_time_total for c in outer.cpu_children))
    with pytest.raises(RuntimeError, match="still recording"):
        with profile() as p2:
            p2.events()


def test_worker_stream_events_when_handed_off(tmp_path):
    a = flow.randn(8, 8)
    with flow.vm.inline_max(0):
        with profile() as prof:
            for _ in range(4):
                a = flow.tanh(a)
            a.numpy()
    trace = _load_trace(prof.export_chrome_trace(str(tmp_path / "t.json")))
    names = _thread_names(trace)
    tanh = [e for e in _complete(trace, "vm_instruction") if e["name"] == "tanh"]
    assert len(tanh) == 4
    for e in tanh:
        assert names[(e["pid"], e["tid"])] == "VM stream cpu"
        assert e["args"]["ran on"] == "stream worker"
        assert e["args"]["thread"] == "sbpflow-vm-cpu"  # the stream's worker thread
    main = {e["tid"] for e in _complete(trace, "cpu_op")}
    assert main.isdisjoint({e["tid"] for e in tanh})
    # The instructions run in issue order on their stream.
    seqs = [e["args"]["seq"] for e in sorted(tanh, key=lambda e: e["ts"])]
    assert seqs == sorted(seqs)


def test_nn_graph_actors_join(tmp_path):
    model = _model()

    class Eval(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model

        def build(self, x):
            return self.model(x)

    g = Eval()
    x = flow.randn(4, 3)
    g(x)  # compiled outside the profile
    with profile() as prof:
        for _ in range(3):
            out = g(x)
        out.numpy()
    np.testing.assert_allclose(out.numpy(), model(x).detach().numpy(), rtol=1e-6, atol=1e-6)
    trace = _load_trace(prof.export_chrome_trace(str(tmp_path / "g.json")))
    actors = _complete(trace, "actor")
    compute = [e for e in actors if e["args"]["actor kind"] == "compute"]
    assert compute, {e["args"]["actor kind"] for e in actors}
    kernels = [op for e in compute for op in e["args"]["ops"]]
    assert "relu" in kernels
    # Each actor acts once per graph call.
    by_actor: dict = {}
    for e in compute:
        by_actor.setdefault(e["name"], []).append(e["args"]["piece"])
    for name, pieces in by_actor.items():
        assert len(pieces) == 3 and len(set(pieces)) == 3, (name, pieces)


def test_schedule_matches_torch():
    for kw in (dict(wait=1, warmup=1, active=2), dict(wait=0, warmup=2, active=1, repeat=2),
               dict(wait=2, warmup=1, active=3, repeat=1, skip_first=3),
               dict(wait=2, warmup=1, active=1, repeat=2, skip_first_wait=1)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours, theirs = profiler.schedule(**kw), torch.profiler.schedule(**kw)
        assert [ours(i).name for i in range(14)] == [theirs(i).name for i in range(14)], kw


def test_schedule_records_only_active_steps(tmp_path):
    saved = []
    a = flow.ones(2)
    sched = profiler.schedule(wait=1, warmup=1, active=2, repeat=1)
    with profile(schedule=sched, on_trace_ready=lambda p: saved.append(
            {r.key: r.count for r in p.key_averages()})) as prof:
        for step in range(6):
            for _ in range(step + 1):
                flow.add(a, a)
            prof.step()
    assert len(saved) == 1
    assert saved[0]["add"] == 3 + 4  # steps 2 and 3 recorded


def test_tensorboard_trace_handler(tmp_path):
    with profile(on_trace_ready=profiler.tensorboard_trace_handler(str(tmp_path), "w0")):
        flow.relu(flow.ones(2))
    files = list(tmp_path.glob("w0.*.pt.trace.json"))
    assert len(files) == 1
    assert "relu" in {e["name"] for e in _complete(_load_trace(files[0]), "cpu_op")}


def test_activities_as_torch_cpu_build():
    # CUDA alone: the same warning, then no activity left.
    for lib in (torch.profiler, profiler):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            with pytest.raises(AssertionError, match="No activities specified"):
                with lib.profile(activities=[lib.ProfilerActivity.CUDA]):
                    pass
    with pytest.warns(UserWarning, match="CUDA is not available"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            flow.relu(flow.ones(2))
    assert [r.count for r in prof.key_averages() if r.key == "relu"] == [1]
    assert profiler.supported_activities() == {ProfilerActivity.CPU}
    with pytest.raises(TypeError, match="ProfilerActivity"):
        profile(activities=["cpu"])
    with pytest.raises(NotImplementedError, match="with_flops"):
        profile(with_flops=True)


def test_record_function_decorator_and_memory():
    @record_function("my_step")
    def step(x):
        return flow.relu(x) * 2

    with profile(profile_memory=True) as prof:
        step(flow.ones(4, 4))
        step(flow.ones(4, 4))
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["my_step"].count == 2
    assert rows["relu"].cpu_memory_usage == 2 * 4 * 4 * 4  # two float32 4x4 outputs
    assert rows["my_step"].cpu_memory_usage >= 2 * 2 * 4 * 4 * 4  # relu's and mul's


def test_hooks_off_outside_profiling():
    from sbpflow.framework import global_tensor, interpreter
    from sbpflow.runtime import actor
    from sbpflow.vm import machine

    def hooks():
        return (interpreter._op_hook, machine._tracer, actor._tracer, global_tensor._box_hook)

    assert hooks() == (None, None, None, None)
    with profile() as prof:
        assert None not in hooks()
        with pytest.raises(RuntimeError, match="cannot be nested"):
            with profile():
                pass
    assert hooks() == (None, None, None, None)
    n = len(prof.events())
    flow.relu(flow.ones(2))  # not recorded
    assert len(prof.events()) == n
    # A kernel error inside the profile still surfaces and leaves the hooks off.
    with pytest.raises(RuntimeError):
        with profile():
            flow.ones(2, 3) @ flow.ones(2, 3)
    assert hooks() == (None, None, None, None)


def test_rank_paths_and_merge(tmp_path):
    assert profiler.rank_path("t.json", 1, 2) == "t.rank1.json"
    assert profiler.rank_path("t.json.gz", 0, 4) == "t.rank0.json.gz"
    assert profiler.rank_path("t.json", 0, 1) == "t.json"
    assert profiler.rank_path("t_{rank}.json", 3, 4) == "t_3.json"


def test_boxing_events_on_two_ranks(tmp_path):
    """Under mpiexec -n 2: each rank writes its trace (pid = rank) with the boxing steps,
    their collective and bytes; rank 0 merges them into one file Perfetto groups by rank."""
    check = str(HERE / "profiler_global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", check, str(tmp_path)), timeout=120)
    assert job.returncode == 0, job.output
    assert job.strays == 0, job.output
    for rank in (0, 1):
        trace = _load_trace(tmp_path / f"trace.rank{rank}.json")
        assert {e["pid"] for e in trace["traceEvents"]} == {rank}
        boxing = _complete(trace, "boxing")
        gather = [e for e in boxing if e["args"]["collectives"] == ["all_gather"]]
        assert len(gather) == 1, boxing
        # S(0) -> B of a 6x4 float32: the gather assembles the 96-byte tensor.
        assert gather[0]["args"]["shape"] == [6, 4]
        assert gather[0]["args"]["bytes"] == 6 * 4 * 4
        assert gather[0]["args"]["rank"] == rank
        assert "all_gather" in gather[0]["name"]
        reduce = [e for e in boxing if e["args"]["collectives"] == ["all_reduce"]]
        assert len(reduce) == 1 and reduce[0]["args"]["bytes"] == 6 * 4 * 4, boxing
        assert reduce[0]["args"]["from"].startswith("(P,)")
        names = _thread_names(trace)
        assert {names[(e["pid"], e["tid"])] for e in boxing} == {"VM stream comm"}
        # The boxing runs inside its "boxing" instruction on the comm stream.
        instrs = [e for e in _complete(trace, "vm_instruction") if e["name"] == "boxing"]
        assert all(any(_inside(i, b) for i in instrs) for b in boxing)
    merged = _load_trace(tmp_path / "merged.json")
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    procs = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {0: "rank 0", 1: "rank 1"}


def test_with_stack_names_the_user_line(tmp_path):
    with profile(with_stack=True) as prof:
        flow.relu(flow.ones(2))  # this line is in the stack
        with pytest.raises(RuntimeError, match="still recording"):
            prof.export_chrome_trace(str(tmp_path / "early.json"))
    relu = next(e for e in prof.events() if e.name == "relu" and e.cat == "cpu_op")
    assert relu.stack and relu.stack[0].startswith(__file__)
    assert relu.stack[0].endswith("test_with_stack_names_the_user_line")
    trace = _load_trace(prof.export_chrome_trace(str(tmp_path / "s.json")))
    ev = next(e for e in _complete(trace, "cpu_op") if e["name"] == "relu")
    assert ev["args"]["Call stack"] == relu.stack
