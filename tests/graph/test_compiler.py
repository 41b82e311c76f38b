"""The compiler: Job -> Plan, the Plan's text and JSON forms, and linking a Plan."""

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph import ir
from sbpflow.graph.compiler import build_runtime, compile_job, kernel_resolver
from sbpflow.runtime.plan import Plan
from sbpflow.runtime.runtime import Runtime
from tests.runtime.jobs import JobBuilder, mlp_job


def test_plan_structure():
    jb, _ = mlp_job()
    plan = compile_job(jb.job)
    kinds = [t.kind for t in plan.tasks]
    assert kinds == ["source", "copy_in", "compute", "copy_out", "tick", "sink"]
    compute = plan.task("compute")
    assert [op.op_type for op in compute.ops] == ["variable", "matmul", "relu", "feed", "mul",
                                                  "sub"]
    assert compute.assigns == (("fc.weight", compute.ops[-1].outputs[0], len(compute.ops)),)
    copy_in = plan.register(plan.task("copy_in").produced[0])
    assert copy_in.register_num == 2 and copy_in.by_ref and copy_in.nbytes == 0
    copied = compile_job(jb.job, copy_inputs=True).register(copy_in.id)
    assert not copied.by_ref and copied.nbytes == 4 * 3 * 4
    assert not compile_job(jb.job, threads="stream").register(copy_in.id).by_ref
    assert copy_in.consumers == (compute.id,)
    out = plan.register(compute.produced[0])
    assert out.register_num == 1
    assert set(out.consumers) == {plan.task("copy_out").id, plan.task("tick").id}
    assert plan.threads() == [0]
    assert plan.feeds == {"lr": compute.ops[3].outputs[0]}
    assert plan.variables == {compute.ops[0].outputs[0]: "fc.weight"}


def test_stream_threads():
    jb, _ = mlp_job()
    plan = compile_job(jb.job, threads="stream")
    assert plan.threads() == [0, 1, 2]
    assert plan.task("compute").thread != plan.task("copy_in").thread
    with pytest.raises(ValueError, match="threads"):
        compile_job(jb.job, threads="bogus")


def test_plan_prints_and_round_trips():
    jb, _ = mlp_job()
    c = jb.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    jb.output(jb.op("transpose", c, dim0=0, dim1=1))
    plan = compile_job(jb.job)
    text = str(plan)
    for word in ("task 0 source", "[compute]", "matmul(", "register_num=2", "assign fc.weight",
                 "transpose(", "dim0=0"):
        assert word in text, word
    back = Plan.from_json(plan.to_json())
    assert str(back) == text
    assert back.to_json() == plan.to_json()
    const = [op for op in back.task("compute").ops if op.op_type == "constant"][0]
    np.testing.assert_array_equal(const.attrs["value"],
                                  np.arange(6, dtype=np.float32).reshape(2, 3))
    # A plan from JSON links and runs like the original.
    rt = Runtime(back, {n: v.tensor for n, v in jb.job.variables.items()})
    x = flow.tensor(np.ones((4, 3), np.float32))
    r, ct = rt.run([x], {"lr": 0.0})
    np.testing.assert_array_equal(ct.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T)


def test_memory_plan_offsets_become_buffers():
    jb = JobBuilder("planned")
    x = jb.input((4, 4))
    h = jb.op("exp", x)
    y = jb.op("neg", h)
    jb.output(y)
    jb.job.tensors[h].mem = (0, 64)
    jb.job.tensors[y].mem = (64, 64)
    jb.job.stats["memory_plan"] = {"peak_bytes": 128}
    plan = compile_job(jb.job)
    assert plan.task("compute").mem_bytes == 128
    assert plan.register(plan.task("compute").produced[0]).mem_block == "compute"
    assert "@64" in str(plan) and "in block of compute" in str(plan)
    assert Plan.from_json(plan.to_json()).stats["memory_plan"] == {"peak_bytes": 128}
    rt = build_runtime(jb.job)
    a = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    (out,) = rt.run([flow.tensor(a)])
    np.testing.assert_array_equal(out.numpy(), -np.exp(a))


def test_kernel_resolver_and_out_buffers():
    calls = []

    def kernel(ctx, a, b, *, scale, out=None):
        calls.append(out is not None)
        if out is None:
            return (a + b) * scale
        np.add(a, b, out=out)
        np.multiply(out, scale, out=out)
        return out

    kernel.accepts_out = True

    def resolve(node, job):
        assert node.op_type == "test_fused_axpb"
        return kernel

    ir.KERNEL_RESOLVERS["test_fused_axpb"] = resolve
    try:
        jb = JobBuilder("fused")
        x = jb.input((2, 3))
        y = jb.input((2, 3))
        t = jb.tensor((2, 3))
        jb.job.add_op("test_fused_axpb", [x, y], [t], {"scale": 2.0})
        jb.job.tensors[t].mem = (0, 24)
        z = jb.op("add", t, t)
        jb.output(z)
        plan = compile_job(jb.job)
        rt = Runtime(plan, {}, resolve=kernel_resolver(jb.job))
        a = np.ones((2, 3), np.float32)
        (out,) = rt.run([flow.tensor(a), flow.tensor(a)])
        np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 8, np.float32))
        assert calls == [True]
        assert "out=" in rt.chains["compute"].source
        # Without the resolver, linking names the op that has no kernel.
        with pytest.raises(RuntimeError, match="test_fused_axpb"):
            Runtime(plan, {})
    finally:
        del ir.KERNEL_RESOLVERS["test_fused_axpb"]


def test_unknown_op_type_is_a_compile_error():
    jb = JobBuilder("bad")
    x = jb.input((2,))
    t = jb.tensor((2,))
    jb.job.add_op("no_such_op", [x], [t], loc=("build.py", 7))
    with pytest.raises(ValueError, match="no_such_op.*build.py:7|build.py:7.*no_such_op"):
        compile_job(jb.job)


def test_fused_plan_from_json_links_in_a_fresh_process(tmp_path):
    """A saved plan links where no pass has run yet: the resolver imports the passes."""
    import subprocess
    import sys

    from sbpflow.graph import passes

    jb = JobBuilder("fused_json")
    x = jb.input((4, 3))
    h = jb.op("mul", jb.op("add", x, x), x)
    jb.output(jb.op("neg", h))
    passes.get("fuse_elementwise").run(jb.job)
    assert any(op.op_type == "fused_elementwise" for op in jb.job.ops)
    path = tmp_path / "plan.json"
    path.write_text(compile_job(jb.job).to_json())
    code = (
        "import numpy as np, sbpflow as flow\n"
        "from sbpflow.graph import ir\n"
        "from sbpflow.graph.compiler import kernel_resolver\n"
        "from sbpflow.runtime import Plan, Runtime\n"
        "assert 'fused_elementwise' not in ir.KERNEL_RESOLVERS\n"
        f"plan = Plan.from_json(open({str(path)!r}).read())\n"
        "rt = Runtime(plan, {}, resolve=kernel_resolver())\n"
        "a = np.arange(12, dtype=np.float32).reshape(4, 3)\n"
        "(out,) = rt.run([flow.tensor(a)])\n"
        "assert np.array_equal(out.numpy(), -((a + a) * a)), out\n"
        "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
