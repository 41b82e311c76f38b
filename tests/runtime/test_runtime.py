"""The actor runtime: results against NumPy and eager, the actor protocol (pipelining,
back-pressure, end of data), errors, and the graph call's order with eager ops."""

import threading
import time

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph import ir
from sbpflow.graph.compiler import build_runtime, compile_job, kernel_resolver
from sbpflow.ops import registry
from sbpflow.runtime.actor import Instance
from sbpflow.runtime.runtime import Runtime
from sbpflow.vm import get_vm
from tests.runtime.jobs import JobBuilder, mlp_job

MODES = ["inline", "stream"]


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def _run(job, mode, inputs, feeds=None):
    rt = build_runtime(job, threads=mode)
    try:
        return [o.numpy() for o in rt.run([flow.tensor(a) for a in inputs], feeds)]
    finally:
        rt.stop()


def test_mlp_steps_match_numpy(mode):
    jb, W = mlp_job(seed=1)
    w = W.numpy().copy()
    rt = build_runtime(jb.job, threads=mode)
    rng = np.random.default_rng(2)
    for step in range(5):
        a = rng.standard_normal((4, 3)).astype(np.float32)
        lr = 0.1 * (step + 1)
        (r,) = rt.run([flow.tensor(a)], {"lr": lr})
        np.testing.assert_array_equal(r.numpy(), np.maximum(a @ w, 0))
        w = w - w * np.float32(lr)
        np.testing.assert_array_equal(W.numpy(), w)
    rt.stop()


def test_equals_eager_bitwise():
    """The chain applies ensure_contiguous as the VM does: the same kernels, the same bits."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 7)).astype(np.float32)
    jb = JobBuilder("eager")
    x, y = jb.input(a.shape), jb.input(b.shape)
    h = jb.op("matmul", x, y)
    t = jb.op("transpose", h, dim0=0, dim1=1)
    s = jb.op("softmax", t, dim=1)
    m = jb.op("sum", s, dim=(0,))
    jb.output(s)
    jb.output(m)
    rt = build_runtime(jb.job)
    s_g, m_g = rt.run([flow.tensor(a), flow.tensor(b)])
    ex, ey = flow.tensor(a), flow.tensor(b)
    s_e = flow.softmax(flow.matmul(ex, ey).transpose(0, 1), dim=1)
    m_e = s_e.sum(dim=0)
    assert s_g.numpy().tobytes() == s_e.numpy().tobytes()
    assert m_g.numpy().tobytes() == m_e.numpy().tobytes()
    assert s_g.is_contiguous()


def test_view_outputs_and_aliases(mode):
    """Outputs that are views, inputs, variables or constants are the caller's own copies."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    jb = JobBuilder("views")
    x = jb.input(a.shape)
    v, V = jb.variable("v", np.ones((2, 2), np.float32))
    c = jb.constant(np.full((2,), 7, np.float32))
    t = jb.op("transpose", x, dim0=0, dim1=1)
    e = jb.op("exp", x)
    te = jb.op("transpose", e, dim0=0, dim1=1)
    for o in (t, x, v, c, te, e, e):
        jb.output(o)
    jb.assign(v, jb.op("add", v, v))
    rt = build_runtime(jb.job, threads=mode)
    for step in range(2):
        outs = rt.run([flow.tensor(a + step)])
        got = [o.numpy() for o in outs]
        np.testing.assert_array_equal(got[0], (a + step).T)
        np.testing.assert_array_equal(got[1], a + step)
        np.testing.assert_array_equal(got[2], np.full((2, 2), 2.0 ** step, np.float32))
        np.testing.assert_array_equal(got[3], np.full((2,), 7, np.float32))
        np.testing.assert_array_equal(got[4], np.exp(a + step).T)
        np.testing.assert_array_equal(got[5], np.exp(a + step))
        np.testing.assert_array_equal(got[6], np.exp(a + step))
        assert all(o.is_contiguous() for o in outs)
        # Each output owns its memory: writing one changes nothing else.
        outs[5].add_(1.0)
        np.testing.assert_array_equal(outs[6].numpy(), np.exp(a + step))
        outs[3].add_(1.0)
    np.testing.assert_array_equal(V.numpy(), np.full((2, 2), 4, np.float32))
    rt.stop()


def test_variadic_and_multi_output_ops():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    jb = JobBuilder("multi")
    x = jb.input(a.shape)
    y = jb.op("neg", x)
    c = jb.op("cat", [x, y], dim=0)
    flow.manual_seed(5)
    d, mask = jb.op("dropout", c, p=0.5)
    jb.output(c)
    jb.output(d)
    jb.output(mask)
    (c_g, d_g, m_g) = _run(jb.job, "inline", [a])
    np.testing.assert_array_equal(c_g, np.concatenate([a, -a]))
    flow.manual_seed(5)
    d_e, m_e = registry.op("dropout", flow.tensor(np.concatenate([a, -a])), p=0.5)
    np.testing.assert_array_equal(d_g, d_e.numpy())
    np.testing.assert_array_equal(m_g, m_e.numpy())


def test_random_ops_draw_the_eager_stream(mode):
    jb = JobBuilder("random")
    n1 = jb.op("normal", shape=(3, 4), dtype=flow.float32)
    x = jb.input((3, 4))
    u = jb.op("uniform", shape=(5,), dtype=flow.float32)
    jb.output(jb.op("add", n1, x))
    jb.output(u)
    rt = build_runtime(jb.job, threads=mode)
    z = np.zeros((3, 4), np.float32)
    flow.manual_seed(11)
    g = [[o.numpy() for o in rt.run([flow.tensor(z)])] for _ in range(2)]
    after_graph = flow.randn(2).numpy()
    flow.manual_seed(11)
    for step in range(2):
        e1 = registry.op("normal", shape=(3, 4), dtype=flow.float32).numpy()
        e2 = registry.op("uniform", shape=(5,), dtype=flow.float32).numpy()
        np.testing.assert_array_equal(g[step][0], e1)
        np.testing.assert_array_equal(g[step][1], e2)
    np.testing.assert_array_equal(flow.randn(2).numpy(), after_graph)
    rt.stop()


def test_feeds_missing_and_wrong_inputs():
    jb, _ = mlp_job()
    rt = build_runtime(jb.job)
    x = flow.tensor(np.ones((4, 3), np.float32))
    with pytest.raises(KeyError, match="lr"):
        rt.run([x], {})
    with pytest.raises(ValueError, match=r"input 0 .*float32\[4, 3\]"):
        rt.run([flow.tensor(np.ones((4, 4), np.float32))], {"lr": 0.1})
    with pytest.raises(TypeError, match="expected 1 inputs"):
        rt.run([x, x], {"lr": 0.1})
    rt.run([x], {"lr": 0.1})


# -- errors --------------------------------------------------------------------------------------
def _failing_job():
    """A job whose `index_select` fails at run time when the index input is out of range."""
    jb = JobBuilder("failing")
    x = jb.input((3, 2))
    i = jb.input((2,), flow.int64)
    w, W = jb.variable("w", np.ones((3, 2), np.float32))
    s = jb.op("add", x, w)
    g = jb.op("index_select", s, i, dim=0, name="model-index_select-7")
    jb.output(g)
    jb.assign(w, jb.op("add", w, w))
    return jb, W


def test_kernel_error_names_op_and_line_and_the_graph_stays_callable(mode):
    jb, W = _failing_job()
    node = jb.job.op("model-index_select-7")
    rt = build_runtime(jb.job, threads=mode)
    x = flow.tensor(np.zeros((3, 2), np.float32))
    with pytest.raises(IndexError) as info:
        (out,) = rt.run([x, flow.tensor(np.array([0, 5]))])
        out.numpy()
    msg = str(info.value)
    assert "index_select" in msg and "model-index_select-7" in msg and node.where() in msg
    # No assign happened: the step stopped at the failing op.
    np.testing.assert_array_equal(W.numpy(), np.ones((3, 2), np.float32))
    for _ in range(3):  # the runtime is usable afterwards, and pipelining still works
        (out,) = rt.run([x, flow.tensor(np.array([2, 0]))])
    np.testing.assert_array_equal(out.numpy(), np.full((2, 2), 4, np.float32))
    np.testing.assert_array_equal(W.numpy(), np.full((3, 2), 8, np.float32))
    rt.stop()


def test_error_in_one_of_many_async_instances():
    jb, _ = _failing_job()
    rt = build_runtime(jb.job, threads="stream")
    x = np.zeros((3, 2), np.float32)
    insts = [Instance([x, np.array([0, 9 if k == 3 else 1])], {}, ()) for k in range(8)]
    for inst in insts:
        rt.launch(inst)
    for inst in insts:
        assert inst.event.wait(10)
    assert [inst.error is not None for inst in insts] == [k == 3 for k in range(8)]
    assert isinstance(insts[3].error, IndexError)
    rt.stop()


# -- the actor protocol --------------------------------------------------------------------------
def _slow_job(delay):
    """input -> slow (a resolver kernel that sleeps) -> output."""

    def slow(ctx, a):
        time.sleep(delay)
        return a * 2

    jb = JobBuilder("slow")
    x = jb.input((3,))
    t = jb.tensor((3,))
    jb.job.add_op("test_slow", [x], [t])
    jb.output(t)
    return jb.job, slow


def test_back_pressure_pipelining_and_end_of_data():
    job, slow = _slow_job(0.01)
    ir.KERNEL_RESOLVERS["test_slow"] = lambda node, job: slow
    try:
        plan = compile_job(job, threads="stream")
        rt = Runtime(plan, {}, resolve=kernel_resolver(job), trace=True)
    finally:
        del ir.KERNEL_RESOLVERS["test_slow"]
    done = []
    lock = threading.Lock()

    def callback(inst):
        with lock:
            done.append(inst.piece)

    n = 20
    insts = [Instance([np.full(3, k, np.float32)], {}, (), callback=callback)
             for k in range(n)]
    for inst in insts:  # launched asynchronously, all at once
        rt.launch(inst)
    rt.stop(timeout=30)  # end of data: drains everything launched, then the threads end
    assert done == list(range(n))  # all finished, in order
    for k, inst in enumerate(insts):
        assert inst.error is None
        np.testing.assert_array_equal(inst.results[0], np.full(3, 2 * k, np.float32))
    # The input copy runs ahead of the slow compute, but never more than its 2 slots.
    ahead, most = 0, 0
    for task, _ in rt.trace:
        if task == "copy_in":
            ahead += 1
        elif task == "compute":
            ahead -= 1
        most = max(most, ahead)
        assert ahead <= 2
    assert most == 2  # it did run ahead: the pipelining is real
    pieces = [p for task, p in rt.trace if task == "compute"]
    assert pieces == list(range(n))
    assert all(a.done for a in rt.actors.values())
    assert not any(th.is_alive() for th in rt.bus._threads)


def test_end_of_data_inline():
    jb, _ = mlp_job()
    rt = build_runtime(jb.job)
    rt.run([flow.tensor(np.ones((4, 3), np.float32))], {"lr": 0.0})
    rt.stop()
    assert all(a.done for a in rt.actors.values())
    with pytest.raises(RuntimeError, match="closed"):
        rt.run_instance([np.ones((4, 3), np.float32)], {"lr": 0.0})


def test_register_slots_return_to_producers(mode):
    jb, _ = mlp_job()
    rt = build_runtime(jb.job, threads=mode)
    for _ in range(5):
        rt.run([flow.tensor(np.ones((4, 3), np.float32))], {"lr": 0.0})[0].numpy()
    get_vm().synchronize()
    rt.stop(timeout=10)
    for actor in rt.actors.values():
        for reg, free in actor.free.items():
            assert len(free) == rt.registers[reg].desc.register_num, actor.name
            assert all(s.readers == 0 for s in free)
            if not any(s.persistent for s in free):  # no step's arrays outlive it
                assert all(s.arrays is None for s in free)


# -- the graph call as a VM instruction ----------------------------------------------------------
def test_graph_call_orders_with_eager_inplace_ops(mode):
    jb, W = mlp_job(seed=4)
    w0 = W.numpy().copy()
    rt = build_runtime(jb.job, threads=mode)
    a = np.ones((4, 3), np.float32)
    W.add_(1.0)  # eager, before the call: the graph must read it
    (r,) = rt.run([flow.tensor(a)], {"lr": 0.5})
    W.mul_(3.0)  # eager, after the call: must apply to the graph's update
    w1 = w0 + 1
    np.testing.assert_array_equal(r.numpy(), np.maximum(a @ w1, 0))
    np.testing.assert_array_equal(W.numpy(), (w1 - w1 * np.float32(0.5)) * 3)
    # An eager op reading the variable right after the call sees the update.
    (r2,) = rt.run([flow.tensor(a)], {"lr": 0.0})
    s = W.sum()
    w2 = (w1 - w1 * np.float32(0.5)) * 3
    np.testing.assert_allclose(s.item(), w2.sum(), rtol=1e-6)
    np.testing.assert_array_equal(r2.numpy(), np.maximum(a @ w2, 0))
    rt.stop()


def test_graph_call_bumps_assigned_variables_version():
    jb, W = mlp_job()
    rt = build_runtime(jb.job)
    v = W._version
    rt.run([flow.tensor(np.ones((4, 3), np.float32))], {"lr": 0.1})
    assert W._version == v + 1


@pytest.mark.parametrize("copy_inputs", [False, True])
def test_graph_call_reads_input_as_issued(copy_inputs):
    """An eager in-place write to an input after the call does not change the call's result."""
    jb = JobBuilder("inp")
    x = jb.input((2, 2))
    jb.output(jb.op("mul", x, x))
    rt = Runtime(compile_job(jb.job, copy_inputs=copy_inputs), {})
    t = flow.tensor(np.full((2, 2), 3, np.float32))
    (y,) = rt.run([t])
    t.add_(1.0)
    np.testing.assert_array_equal(y.numpy(), np.full((2, 2), 9, np.float32))


def test_graph_call_orders_with_eager_ops_on_the_vm_worker(monkeypatch):
    """Large eager ops go to the VM's worker; the graph call must still wait for them, and
    eager ops issued after it must wait for the graph's writes."""
    from sbpflow.vm import stream

    handed = []
    push = stream.Stream.push

    def counting_push(self, instr):
        handed.append(instr.name)
        return push(self, instr)

    monkeypatch.setattr(stream.Stream, "push", counting_push)
    vm = get_vm()
    mode = vm.mode
    vm.set_mode("async")  # the point is the worker: also under SBPFLOW_VM_MODE=sync
    try:
        _orders_with_worker(handed)
    finally:
        vm.set_mode(mode)


def _orders_with_worker(handed):
    n = 1 << 19  # above the VM's inline threshold: eager ops on it are handed to the worker
    jb = JobBuilder("big")
    x = jb.input((n,))
    w, W = jb.variable("w", np.zeros(n, np.float32))
    jb.output(jb.op("add", x, w))
    jb.assign(w, jb.op("add", w, x))
    rt = build_runtime(jb.job)
    ones = flow.tensor(np.ones(n, np.float32))
    outs = []
    for _ in range(3):
        W.add_(1.0)
        W.mul_(2.0)
        outs.append(rt.run([ones])[0])
        W.sub_(1.0)
    expect_w, expect_out = 0.0, []
    for _ in range(3):
        expect_w = (expect_w + 1) * 2
        expect_out.append(1 + expect_w)
        expect_w = expect_w + 1 - 1
    for o, e in zip(outs, expect_out):
        np.testing.assert_array_equal(o.numpy(), np.full(n, e, np.float32))
    np.testing.assert_array_equal(W.numpy(), np.full(n, expect_w, np.float32))
    assert handed.count("graph big") >= 1  # the calls really queued behind eager work


def test_none_variable_tensor_is_a_link_error():
    jb, _ = mlp_job()
    plan = compile_job(jb.job)
    with pytest.raises(ValueError, match="fc.weight"):
        Runtime(plan, {"fc.weight": None})


# -- where assigns happen ------------------------------------------------------------------------
def _reusing_kernel():
    """A resolver kernel that writes into its planned buffer (as fused kernels do)."""

    def kernel(ctx, a, *, k, out=None):
        return np.multiply(a, np.float32(k), out=out)

    kernel.accepts_out = True
    return kernel


@pytest.mark.parametrize("old_read_late", [False, True])
def test_assign_survives_buffer_reuse_after_its_place(old_read_late):
    """Memory planning ends an assign value's lifetime at the assign op; a later op may reuse
    its buffer.  The variable still gets the value, and later readers of the variable's old
    value still see the old value."""
    ir.KERNEL_RESOLVERS["test_times"] = lambda node, job: _reusing_kernel()
    try:
        jb = JobBuilder("bn_like")
        x = jb.input((4,))
        rm, RM = jb.variable("running_mean", np.full(4, 10, np.float32))
        new = jb.tensor((4,))
        jb.job.add_op("test_times", [x], [new], {"k": 100.0})  # the new statistic, at offset 0
        jb.assign(rm, new)
        other = jb.tensor((4,))
        jb.job.add_op("test_times", [x], [other], {"k": 3.0})  # reuses offset 0 after the assign
        late = jb.op("add", rm, other) if old_read_late else jb.op("add", other, other)
        jb.output(late)
        jb.job.tensors[new].mem = (0, 16)
        jb.job.tensors[other].mem = (0, 16)
        rt = build_runtime(jb.job)
        a = np.arange(4, dtype=np.float32)
        (out,) = rt.run([flow.tensor(a)])
        np.testing.assert_array_equal(RM.numpy(), a * 100)
        expect = 10 + a * 3 if old_read_late else a * 6
        np.testing.assert_array_equal(out.numpy(), expect)
        src = rt.chains["compute"].source
        assert ("s0 = cp(" in src) == old_read_late  # a snapshot only when needed
    finally:
        del ir.KERNEL_RESOLVERS["test_times"]


def test_variable_output_is_the_old_value_even_when_assigned_early():
    jb = JobBuilder("varout")
    x = jb.input((3,))
    v, V = jb.variable("v", np.ones(3, np.float32))
    t = jb.op("transpose", jb.op("unsqueeze", v, dim=0), dim0=0, dim1=1)
    jb.assign(v, jb.op("add", v, x))
    jb.output(v)
    jb.output(t)
    rt = build_runtime(jb.job)
    a = np.full(3, 5, np.float32)
    old, old_t = rt.run([flow.tensor(a)])
    np.testing.assert_array_equal(old.numpy(), np.ones(3, np.float32))
    np.testing.assert_array_equal(old_t.numpy(), np.ones((3, 1), np.float32))
    np.testing.assert_array_equal(V.numpy(), np.full(3, 6, np.float32))


def _momentum_update():
    """An elementwise multi-output update kernel that may write into its inputs."""

    def kernel(ctx, ts, out=None):
        p, g, m = ts
        out_p, out_m = out if out is not None else (None, None)
        m_new = np.multiply(m, np.float32(0.9), out=out_m)
        m_new += g
        p_new = np.subtract(p, np.float32(0.1) * m_new, out=out_p)
        return p_new, m_new

    kernel.accepts_out = True
    kernel.out_may_alias_inputs = True
    kernel.variadic = True
    return kernel


@pytest.mark.parametrize("case", ["in_place", "old_value_read_later", "value_is_output"])
def test_update_kernels_write_variables_in_place(case):
    ir.KERNEL_RESOLVERS["test_momentum"] = lambda node, job: _momentum_update()
    try:
        jb = JobBuilder("momentum")
        g = jb.input((3,))
        p, P = jb.variable("p", np.ones(3, np.float32))
        m, M = jb.variable("m", np.zeros(3, np.float32))
        p2, m2 = jb.tensor((3,)), jb.tensor((3,))
        jb.job.add_op("test_momentum", [p, g, m], [p2, m2])
        jb.assign(p, p2)
        jb.assign(m, m2)
        if case == "old_value_read_later":
            jb.output(jb.op("mul", p, p))
        elif case == "value_is_output":
            jb.output(p2)
        else:
            jb.output(jb.op("mul", p2, p2))
        rt = build_runtime(jb.job)
        p_arr, m_arr = P._blob.array, M._blob.array
        pe, me = np.ones(3, np.float32), np.zeros(3, np.float32)
        for step in range(3):
            a = np.full(3, step + 1, np.float32)
            (out,) = rt.run([flow.tensor(a)])
            old = pe.copy()
            me = me * np.float32(0.9) + a
            pe = pe - np.float32(0.1) * me
            np.testing.assert_array_equal(P.numpy(), pe)
            np.testing.assert_array_equal(M.numpy(), me)
            expect = {"in_place": pe * pe, "old_value_read_later": old * old,
                      "value_is_output": pe}[case]
            np.testing.assert_array_equal(out.numpy(), expect)
        assert P._blob.array is p_arr and M._blob.array is m_arr  # the variables' own memory
        chain = rt.chains["compute"]
        if case == "in_place":
            assert chain.inplace_assigns == {"p", "m"}
            assert "copy(" not in chain.source
        elif case == "old_value_read_later":
            assert chain.inplace_assigns == {"m"}
        else:
            assert chain.inplace_assigns == {"m"}
            out.add_(1.0)  # the output is the caller's own memory
            np.testing.assert_array_equal(P.numpy(), pe)
    finally:
        del ir.KERNEL_RESOLVERS["test_momentum"]


def test_job_without_inputs_or_outputs(mode):
    jb = JobBuilder("counter")
    v, V = jb.variable("step", np.zeros((), np.float32))
    one = jb.constant(np.ones((), np.float32))
    jb.assign(v, jb.op("add", v, one))
    rt = build_runtime(jb.job, threads=mode)
    for _ in range(4):
        assert rt.run([]) == []
    assert V.item() == 4.0
    rt.stop()


def test_an_actor_failing_outside_its_act_fails_the_call_instead_of_hanging():
    jb, _ = mlp_job()
    rt = build_runtime(jb.job, threads="stream")
    x = flow.tensor(np.ones((4, 3), np.float32))
    rt.run([x], {"lr": 0.0})[0].numpy()
    tick = next(a for a in rt.actors.values() if a.kind == "tick")

    def broken(kind, slot):
        raise AssertionError("protocol bug")

    tick.on_msg = broken
    with pytest.raises(RuntimeError, match="actor tick failed.*protocol bug"):
        rt.run([x], {"lr": 0.0})[0].numpy()
    with pytest.raises(RuntimeError, match="unusable"):
        rt.run_instance([np.ones((4, 3), np.float32)], {"lr": 0.0})
    rt.stop(timeout=10)


def test_profile_times_every_op():
    jb, W = mlp_job()
    rt = build_runtime(jb.job, profile=True)
    w = W.numpy().copy()
    a = np.ones((4, 3), np.float32)
    for _ in range(3):
        (r,) = rt.run([flow.tensor(a)], {"lr": 0.0})
    np.testing.assert_array_equal(r.numpy(), np.maximum(a @ w, 0))  # same results
    times = rt.chains["compute"].op_times()
    assert {op.op_type for op, _ in times} >= {"matmul", "relu", "mul", "sub", "assign"}
    assert all(t >= 0 for _, t in times) and rt.chains["compute"].calls[0] == 3
    table = rt.op_times()
    assert "matmul (model-matmul-" in table and "build.py:" in table and "total" in table
    with pytest.raises(RuntimeError, match="profile=True"):
        build_runtime(jb.job).op_times()
