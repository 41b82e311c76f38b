"""Unit tests of the optimisation passes (constant_fold, cse, dce, fuse_elementwise,
memory_plan) on small hand-built Jobs.

Numerics are checked with a tiny evaluator that runs a Job op by op with the OpDef kernels (or
a kernel resolver's): a test helper only, not the runtime's executor.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.device import Device
from sbpflow.graph import ir
from sbpflow.graph.ir import Job
from sbpflow.graph.passes import constant_fold, cse, dce, fuse_elementwise, memory_plan
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext
from sbpflow.sbp import B
from sbpflow.sbp.placement import Placement

PRIMS = Device("cpu").prims


# -- building Jobs -----------------------------------------------------------------------------
class Builder:
    def __init__(self, name="job"):
        self.job = Job(name)
        self.placement = Placement("cpu", [0])
        self.n_inputs = 0
        self.n_outputs = 0

    def tensor(self, shape, dtype):
        return self.job.add_tensor(TensorMeta(tuple(shape), dtype), self.placement, (B,)).name

    def input(self, shape, dtype=dt.float32):
        t = self.tensor(shape, dtype)
        self.job.add_op("input", (), (t,), {"index": self.n_inputs})
        self.n_inputs += 1
        return t

    def variable(self, name, shape, dtype=dt.float32):
        meta = TensorMeta(tuple(shape), dtype)
        self.job.variables[name] = ir.Variable(name, meta, True)
        t = self.tensor(shape, dtype)
        self.job.add_op("variable", (), (t,), {"var": name})
        return t

    def constant(self, value):
        value = np.asarray(value)
        t = self.tensor(value.shape, dt.from_numpy(value.dtype))
        self.job.add_op("constant", (), (t,), {"value": value})
        return t

    def op(self, op_type, *inputs, **attrs):
        opdef = registry.get(op_type)
        attrs = opdef.bind_attrs(attrs)
        in_metas = tuple(self.job.tensors[i].meta for i in inputs)
        outs = [self.tensor(m.shape, m.dtype) for m in opdef.meta(in_metas, attrs)]
        self.job.add_op(op_type, inputs, outs, attrs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def output(self, t):
        self.job.add_op("output", (t,), (), {"index": self.n_outputs})
        self.n_outputs += 1

    def assign(self, var_tensor, value):
        self.job.add_op("assign", (var_tensor, value), ())


def evaluate(job, inputs, variables=None):
    """Run `job` op by op; returns (outputs, variables after the assigns)."""
    variables = {k: np.array(v) for k, v in (variables or {}).items()}
    env, results = {}, {}
    for op in job.ops:
        t = op.op_type
        if t == "input":
            env[op.outputs[0]] = inputs[op.attrs["index"]]
        elif t == "variable":
            env[op.outputs[0]] = variables[op.attrs["var"]]
        elif t == "constant":
            env[op.outputs[0]] = op.attrs["value"]
        elif t == "output":
            results[op.attrs["index"]] = env[op.inputs[0]]
        elif t == "assign":
            np.copyto(env[op.inputs[0]], env[op.inputs[1]])
        else:
            if t in ir.KERNEL_RESOLVERS:
                kernel, variadic = ir.KERNEL_RESOLVERS[t](op, job), False
            else:
                kernel, variadic = registry.get(t).kernel, registry.get(t).variadic
            in_metas = tuple(job.tensors[i].meta for i in op.inputs)
            out_metas = tuple(job.tensors[o].meta for o in op.outputs)
            ctx = KernelContext(PRIMS, t, in_metas, out_metas)
            arrays = [env[i] for i in op.inputs]
            res = kernel(ctx, arrays, **op.attrs) if variadic else kernel(ctx, *arrays,
                                                                        **op.attrs)
            if len(op.outputs) == 1:
                res = (res,)
            for o, r in zip(op.outputs, res, strict=True):
                assert r.shape == job.tensors[o].shape, (op.op_type, r.shape)
                assert r.dtype == job.tensors[o].dtype.np, (op.op_type, r.dtype)
                env[o] = r
    return [results[k] for k in sorted(results)], variables


def op_types(job):
    return [op.op_type for op in job.ops]


def copy_job(job):
    return Job.from_json(job.to_json())


# -- dce ----------------------------------------------------------------------------------------
def test_dce_keeps_outputs_assigns_and_their_inputs():
    b = Builder()
    x = b.input((3,))
    b.input((3,))  # unused input: part of the call signature
    w = b.variable("w", (3,))
    b.variable("unused", (3,))
    a = b.op("exp", x)
    b.op("neg", a)  # dead
    dead2 = b.op("mul", x, x)
    b.op("add", dead2, dead2)  # dead chain
    c = b.op("mul", a, w)
    b.output(c)
    b.assign(w, b.op("add_scalar", w, other=1.0))
    job = b.job
    dce.run(job)
    job.check()
    assert op_types(job) == ["input", "input", "variable", "exp", "mul", "output",
                             "add_scalar", "assign"]
    assert "unused" in job.variables  # state stays; only its op went
    assert job.stats["dce_removed"] == 4
    xs = [np.arange(3, dtype=np.float32), np.zeros(3, np.float32)]
    (out,), vs = evaluate(job, xs, {"w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(out, np.exp(xs[0]))
    np.testing.assert_array_equal(vs["w"], 2.0)


def test_dce_keeps_assigned_variable_even_if_value_is_unused():
    b = Builder()
    w = b.variable("w", (2,))
    z = b.constant(np.zeros(2, np.float32))
    b.assign(w, z)
    dce.run(b.job)
    assert op_types(b.job) == ["variable", "constant", "assign"]


# -- cse ----------------------------------------------------------------------------------------
def test_cse_merges_equal_ops_and_keeps_distinct_ones():
    b = Builder()
    x = b.input((2, 3))
    y = b.input((3,))
    a1 = b.op("add", x, y)
    a2 = b.op("add", x, y)
    m1 = b.op("mul", a1, a1)
    m2 = b.op("mul", a2, a2)  # equal once a2 is a1
    s1 = b.op("mul_scalar", x, other=1)
    s2 = b.op("mul_scalar", x, other=1.0)  # another type: another promotion
    s3 = b.op("mul_scalar", x, other=1.0)
    z1 = b.op("mul_scalar", x, other=0.0)
    z2 = b.op("mul_scalar", x, other=-0.0)
    r1 = b.op("uniform", shape=(2, 3), dtype=dt.float32)
    r2 = b.op("uniform", shape=(2, 3), dtype=dt.float32)
    c1 = b.constant(np.array([1.0, 2.0], np.float32))
    c2 = b.constant(np.array([1.0, 2.0], np.float32))
    c3 = b.constant(np.array([1.0, 2.0], np.float64))
    for t in (m1, m2, s1, s2, s3, z1, z2, r1, r2, c1, c2, c3):
        b.output(t)
    job = b.job
    before = copy_job(job)
    cse.run(job)
    job.check()
    assert job.stats["cse_merged"] == 4  # a2, m2, s3, c2
    ins = [op.inputs[0] for op in job.outputs()]
    assert ins[0] == ins[1] and ins[3] == ins[4] and ins[9] == ins[10]
    assert len({ins[2], ins[3], ins[5], ins[6], ins[7], ins[8], ins[9], ins[11]}) == 8
    assert len(list(job.ops_of("uniform"))) == 2
    xs = [np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32),
          np.ones(3, np.float32)]
    got, _ = evaluate(job, xs)
    want, _ = evaluate(before, xs)
    for g, w in list(zip(got, want))[:7]:
        np.testing.assert_array_equal(g, w)


def test_cse_never_merges_variable_reads_across_an_assign():
    b = Builder()
    w = b.variable("w", (2,))
    w2 = b.variable("w", (2,))  # two variable ops are never merged
    before = b.op("mul_scalar", w, other=2.0)
    b.assign(w, b.op("add_scalar", w, other=1.0))
    after = b.op("mul_scalar", w, other=2.0)
    b.output(before)
    b.output(after)
    b.output(w2)
    job = b.job
    cse.run(job)
    assert len(list(job.ops_of("mul_scalar"))) == 2
    assert len(list(job.ops_of("variable"))) == 2
    (o1, o2, _), _ = evaluate(job, [], {"w": np.ones(2, np.float32)})
    np.testing.assert_array_equal(o1, 2.0)
    np.testing.assert_array_equal(o2, 4.0)


def test_cse_renames_loss_and_grads():
    b = Builder()
    x = b.input((2,))
    a = b.op("exp", x)
    a2 = b.op("exp", x)
    b.output(a)
    b.job.loss = [a2]
    b.job.grads = {"w": a2}
    cse.run(b.job)
    assert b.job.loss == [a] and b.job.grads == {"w": a}


# -- constant folding ---------------------------------------------------------------------------
def test_constant_fold_folds_constant_subgraphs_and_creation_ops():
    b = Builder()
    x = b.input((3,))
    w = b.variable("w", (3,))
    c1 = b.constant(np.array([1.0, 2.0, 3.0], np.float32))
    c2 = b.constant(np.array(2.0, np.float32))
    s = b.op("mul", c1, c2)
    f = b.op("full", shape=(3,), fill_value=0.5, dtype=dt.float32)
    g = b.op("add", s, f)  # folds after its inputs did
    r = b.op("reshape", g, shape=(3, 1))  # a view of a constant folds to a copy
    ar = b.op("arange", start=0, end=3, step=1, dtype=dt.float32)
    rnd = b.op("uniform", shape=(3,), dtype=dt.float32)  # random: never folded
    yv = b.op("add", g, w)  # a variable is not a constant
    yx = b.op("mul", x, g)
    for t in (yv, yx, r, ar, rnd):
        b.output(t)
    job = b.job
    before = copy_job(job)
    constant_fold.run(job)
    job.check()
    types = op_types(job)
    assert "full" not in types and "arange" not in types and "reshape" not in types
    assert types.count("mul") == 1 and types.count("add") == 1  # the ones reading x and w
    assert "uniform" in types
    assert job.stats["constants_folded"] == 5  # mul, full, add, reshape, arange
    folded = job.producer(g)
    assert folded.op_type == "constant"
    np.testing.assert_array_equal(folded.attrs["value"], [2.5, 4.5, 6.5])
    assert folded.attrs["value"].dtype == np.float32
    xs = [np.array([1.0, -1.0, 2.0], np.float32)]
    vs = {"w": np.array([1.0, 1.0, 1.0], np.float32)}
    got, _ = evaluate(job, xs, vs)
    want, _ = evaluate(before, xs, vs)
    for g_, w_ in list(zip(got, want))[:4]:
        np.testing.assert_array_equal(g_, w_)
    copy_job(job)  # folded constants serialise
    dce.run(job)
    assert "constant" in op_types(job)


def test_constant_fold_leaves_failing_kernels_and_large_results():
    b = Builder()
    idx = b.constant(np.array([5], np.int64))
    table = b.constant(np.zeros((2, 3), np.float32))
    bad = b.op("embedding", idx, table)  # index out of range: raised when the graph runs
    big = b.op("full", shape=(64,), fill_value=1.0, dtype=dt.float64)
    b.output(bad)
    b.output(big)
    b.job.config["constant_fold_max_bytes"] = 256
    constant_fold.run(b.job)
    assert "embedding" in op_types(b.job) and "full" in op_types(b.job)


# -- fusion -------------------------------------------------------------------------------------
@pytest.fixture
def numba_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SBPFLOW_NUMBA_CACHE", str(tmp_path / "numba"))
    return tmp_path / "numba"


def _chain_job(dtype, shape=(8, 16)):
    """x * 0.5 + bias -> relu -> * y -> 2 - . ; exp and where on a comparison; bool cast."""
    b = Builder()
    x = b.input(shape, dtype)
    bias = b.input(shape[-1:], dtype)
    y = b.input(shape, dtype)
    v = b.op("mul_scalar", x, other=0.5)
    v = b.op("add", v, bias)
    v = b.op("relu", v)
    v = b.op("mul", v, y)
    v = b.op("sub_scalar", v, other=2, reverse=True)
    e = b.op("exp", v)
    m = b.op("gt_scalar", x, other=0.0)
    w = b.op("where", m, e, v)
    w = b.op("div", w, b.op("add_scalar", b.op("square", y), other=1.0))
    w = b.op("mul", w, b.op("to_dtype", m, dtype=dtype))
    w = b.op("clamp", w, min=-3.0, max=50.0)
    w = b.op("sigmoid", w)
    w = b.op("rsqrt", b.op("add_scalar", w, other=0.25))
    b.output(w)
    return b.job


def _inputs(dtype, shape=(8, 16), seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(shape) * 2, rng.standard_normal(shape[-1:]),
          rng.standard_normal(shape)]
    xs[0][0, :3] = [np.nan, np.inf, -0.0]
    return [a.astype(dtype.np) for a in xs]


@pytest.mark.parametrize("dtype", [dt.float64, dt.float32, dt.float16])
@pytest.mark.parametrize("jit", [True, False])
def test_fuse_chain_equals_unfused(dtype, jit, numba_cache):
    job = _chain_job(dtype)
    job.config["fuse_jit_min_numel"] = 0 if jit else 1 << 30
    before = copy_job(job)
    fuse_elementwise.run(job)
    job.check()
    assert op_types(job) == ["input", "input", "input", "fused_elementwise", "output"]
    node = next(job.ops_of("fused_elementwise"))
    assert node.attrs["jit"] == (jit and dtype is not dt.float16)
    assert node.attrs["ops"].startswith("mul_scalar+add+relu")
    job2 = copy_job(job)  # the attrs serialise
    assert job2.op(node.name).attrs == node.attrs
    xs = _inputs(dtype)
    (got,), _ = evaluate(job2, xs)
    (want,), _ = evaluate(before, xs)
    assert got.dtype == want.dtype
    # Bitwise equal (NaN where NaN): the generated arithmetic is IEEE-exact, and
    # transcendentals run through the same NumPy loops.
    np.testing.assert_array_equal(got, want)
    kernel = fuse_elementwise.resolve(node, job)
    if node.attrs["jit"]:
        assert kernel.sources and any(p.suffix == ".py" for p in numba_cache.iterdir())
    # A planned output buffer is honoured.
    assert kernel.accepts_out
    out = np.empty(want.shape, want.dtype)
    ctx = KernelContext(PRIMS, "fused_elementwise",
                        tuple(job.tensors[i].meta for i in node.inputs),
                        (job.tensors[node.outputs[0]].meta,))
    r = kernel(ctx, *xs, out=out, **node.attrs)
    assert r is out
    np.testing.assert_array_equal(out, want)


def test_fuse_stops_at_values_read_outside_the_chain():
    b = Builder()
    x = b.input((4, 4))
    a = b.op("mul_scalar", x, other=3.0)
    c = b.op("exp", a)
    d = b.op("add", c, x)
    e = b.op("neg", d)
    b.output(e)
    b.output(c)  # c is also a graph output: it stays a tensor of its own
    s = b.op("sum", a)  # a non-elementwise reader of a
    b.output(s)
    fuse_elementwise.run(b.job)
    fused = list(b.job.ops_of("fused_elementwise"))
    assert len(fused) == 1 and fused[0].attrs["ops"] == "add+neg"
    assert "mul_scalar" in op_types(b.job) and "exp" in op_types(b.job)
    xs = [np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)]
    (o1, o2, _), _ = evaluate(b.job, xs)
    np.testing.assert_array_equal(o1, -(np.exp(xs[0] * np.float32(3)) + xs[0]))


def test_fuse_backward_chain_and_broadcast_inputs(numba_cache):
    # relu backward as the autograd pass writes it: g * (y > 0), then a scaled update.
    b = Builder()
    y = b.input((32, 8), dt.float64)
    g = b.input((32, 8), dt.float64)
    lr = b.input((1, 8), dt.float64)
    mask = b.op("gt_scalar", y, other=0)
    gx = b.op("mul", g, mask)
    step = b.op("mul", gx, lr)
    b.output(b.op("sub", y, step))
    b.job.config["fuse_jit_min_numel"] = 0
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    assert op_types(b.job).count("fused_elementwise") == 1
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((32, 8)), rng.standard_normal((32, 8)),
          rng.standard_normal((1, 8))]
    np.testing.assert_array_equal(evaluate(b.job, xs)[0][0], evaluate(before, xs)[0][0])


@pytest.mark.parametrize("dtype", [dt.float64, dt.float32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fuse_gelu_and_gelu_grad_match_torch(dtype, approximate, numba_cache):
    torch = pytest.importorskip("torch")
    # The scale after gelu_grad fuses with it.
    shape = (64, 96)
    b = Builder()
    x = b.input(shape, dtype)
    dy = b.input(shape, dtype)
    h = b.op("add_scalar", x, other=0.25)
    b.output(b.op("gelu", h, approximate=approximate))
    b.output(b.op("mul_scalar", b.op("gelu_grad", dy, h, approximate=approximate), other=0.5))
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    fused = list(b.job.ops_of("fused_elementwise"))
    # h is read by both groups, so it stays a tensor; a lone gelu still gets its loop
    assert sorted(f.attrs["ops"] for f in fused) == ["gelu", "gelu_grad+mul_scalar"]
    assert "gelu" not in op_types(b.job) and "gelu_grad" not in op_types(b.job)
    assert all(f.attrs["jit"] for f in fused)
    rng = np.random.default_rng(4)
    xs = rng.standard_normal(shape) * 4
    xs.flat[:6] = [0.0, -0.0, 12.0, -12.0, 30.0, -3.0]
    xs = [xs.astype(dtype.np), rng.standard_normal(shape).astype(dtype.np)]
    (got_y, got_g), _ = evaluate(b.job, xs)
    (eager_y, eager_g), _ = evaluate(before, xs)
    # torch in float64 (its float32 tanh form loses ~1e-6 to cancellation in 1 - t^2; the
    # fused loop computes in float64 and rounds once)
    th = torch.from_numpy(xs[0].astype(np.float64)) + 0.25
    want_y = torch.nn.functional.gelu(th, approximate=approximate).numpy()
    want_g = torch.ops.aten.gelu_backward(torch.from_numpy(xs[1].astype(np.float64)), th,
                                          approximate=approximate).numpy() * 0.5
    rtol, atol = (1e-6, 1e-12) if dtype is dt.float64 else (1e-5, 1e-6)
    for got, eager, want in ((got_y, eager_y, want_y), (got_g, eager_g, want_g)):
        assert got.dtype == dtype.np
        np.testing.assert_allclose(got, want.astype(dtype.np), rtol=rtol, atol=atol)
        # eager's float32 kernels round every step: a few ulp of the larger terms apart
        np.testing.assert_allclose(got, eager, rtol=rtol, atol=atol * 5)


def test_fuse_gelu_left_alone_below_the_jit_size():
    b = Builder()
    x = b.input((4, 4))
    b.output(b.op("gelu", x))
    fuse_elementwise.run(b.job)
    assert op_types(b.job) == ["input", "gelu", "output"]


@pytest.mark.parametrize("flag", [True, False])
def test_fuse_cast_scale_flag(flag):
    b = Builder()
    x = b.input((4, 4), dt.float16)
    h = b.op("to_dtype", x, dtype=dt.float32)
    b.output(b.op("mul_scalar", h, other=0.125))
    b.job.config["allow_fuse_cast_scale"] = flag
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    assert ("fused_elementwise" in op_types(b.job)) == flag
    xs = [np.random.default_rng(3).standard_normal((4, 4)).astype(np.float16)]
    np.testing.assert_array_equal(evaluate(b.job, xs)[0][0], evaluate(before, xs)[0][0])


@pytest.mark.parametrize("flag", [True, False])
def test_fuse_add_to_output(flag, numba_cache):
    b = Builder()
    x = b.input((16, 32))
    w = b.variable("w", (32, 64))
    bias = b.variable("b", (64,))
    res = b.input((16, 64))
    h = b.op("matmul", x, w)
    h = b.op("add", h, bias)  # bias add folds into the matmul's buffer
    h = b.op("add", h, res)  # and so does the residual, in the same kernel
    b.output(b.op("relu", h))
    b.job.config.update(allow_fuse_add_to_output=flag, fuse_jit_min_numel=0)
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    node = next(b.job.ops_of("fused_elementwise"))
    assert ("matmul" in op_types(b.job)) != flag
    assert (node.attrs["head"] is not None) == flag
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((16, 32)).astype(np.float32),
          rng.standard_normal((16, 64)).astype(np.float32)]
    vs = {"w": rng.standard_normal((32, 64)).astype(np.float32),
          "b": rng.standard_normal(64).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(b.job, xs, vs)[0][0],
                                  evaluate(before, xs, vs)[0][0])


def test_fuse_second_process_loads_from_disk_cache(numba_cache):
    pytest.importorskip("numba")
    b = Builder()
    x = b.input((64, 64), dt.float64)
    b.output(b.op("mul_scalar", b.op("add_scalar", x, other=1.5), other=-3.0))
    b.job.config["fuse_jit_min_numel"] = 0
    fuse_elementwise.run(b.job)
    text = b.job.to_json()
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from sbpflow.device import Device
        from sbpflow.graph.ir import Job
        from sbpflow.graph.passes import fuse_elementwise
        from sbpflow.ops.registry import KernelContext
        job = Job.from_json(sys.stdin.read())
        node = next(job.ops_of("fused_elementwise"))
        k = fuse_elementwise.resolve(node, job)
        meta = job.tensors[node.outputs[0]].meta
        ctx = KernelContext(Device("cpu").prims, "fused", (meta,), (meta,))
        out = k(ctx, np.ones((64, 64)))
        assert (out == -7.5).all()
        fn = fuse_elementwise._COMPILED.popitem()[1]
        print(sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()))
    """)
    env = dict(os.environ, SBPFLOW_NUMBA_CACHE=str(numba_cache))
    runs = [subprocess.run([sys.executable, "-c", script], input=text, env=env, text=True,
                           capture_output=True, timeout=120) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split() == ["0", "1"]  # compiled (and cached) in the first process
    assert runs[1].stdout.split() == ["1", "0"]  # loaded from disk in the second


# -- memory planning ---------------------------------------------------------------------------
# These Jobs of plain ops (add, exp, ...) test the placement: their kernels allocate their own
# outputs, so by default nothing of them is planned (tests/graph/test_memory_plan_honest.py
# checks that, and that planned buffers are really written); here every computing op is.
def _every_op(op):
    return True


def _plan(job):
    memory_plan.run(job, writes=_every_op)
    return job.stats["memory"]


def _check_plan(job):
    """No two tensors that are live at once overlap in memory; the block holds them all."""
    planned = {n: t for n, t in job.tensors.items() if t.mem is not None}
    index = {}
    for k, op in enumerate(job.ops):
        for o in op.outputs:
            index[o] = k
    end = len(job.ops)
    views = {}
    for op in job.ops:
        if op.op_type not in ir.KERNEL_RESOLVERS and op.op_type not in ir.STRUCTURAL and \
                registry.get(op.op_type).view:
            views[op.outputs[0]] = views.get(op.inputs[0], op.inputs[0])
    last = {n: index[n] for n in planned}
    for k, op in enumerate(job.ops):
        for i in op.inputs:
            root = views.get(i, i)
            if root in last:
                last[root] = max(last[root], end if op.op_type == "output" else k)
    items = list(planned.items())
    for a in range(len(items)):
        na, ta = items[a]
        oa, sa = ta.mem
        assert oa % memory_plan.ALIGN == 0
        assert oa + sa <= job.stats["memory"]["block_bytes"]
        for nb, tb in items[a + 1:]:
            ob, sb = tb.mem
            live_together = index[na] <= last[nb] and index[nb] <= last[na]
            if live_together and sa and sb:
                assert oa + sa <= ob or ob + sb <= oa, (na, ta.mem, nb, tb.mem)
    m = job.stats["memory"]
    assert m["naive_bytes"] >= m["block_bytes"] >= m["peak_bytes"]


def test_memory_plan_reuses_buffers_on_a_chain():
    b = Builder()
    x = b.input((256,))
    w = b.variable("w", (256,))
    v = x
    for _ in range(10):
        v = b.op("mul", b.op("exp", v), w)
    b.output(v)
    job = b.job
    m = _plan(job)
    _check_plan(job)
    assert job.tensors[w].mem is None  # variables use the eager tensors' memory
    assert job.tensors[x].mem is None  # inputs live in the input register
    # A chain needs two live buffers at a time (an op's input and output), not 20.
    assert m["naive_bytes"] == 20 * 1024
    assert m["peak_bytes"] == 2 * 1024
    assert m["block_bytes"] == 2 * 1024


def test_memory_plan_keeps_assigned_values_to_the_end():
    b = Builder()
    x = b.input((64,))
    w = b.variable("w", (64,))
    new_w = b.op("add", w, x)
    b.assign(w, new_w)  # mid-step, as BatchNorm's running statistics
    v = x
    for _ in range(4):
        v = b.op("exp", v)
    b.output(v)
    _plan(b.job)
    _check_plan(b.job)
    o, n = b.job.tensors[new_w].mem
    for t in b.job.tensors.values():
        if t.mem is not None and t.name != new_w and t.producer != b.job.ops[0].name:
            assert t.mem[0] + t.mem[1] <= o or o + n <= t.mem[0]


def test_memory_plan_views_extend_their_base():
    b = Builder()
    x = b.input((4, 8))
    a = b.op("exp", x)
    r = b.op("view", a, shape=(32,))  # a view: no memory of its own
    c = b.op("neg", x)
    d = b.op("sin", c)
    e = b.op("add", r, b.op("view", d, shape=(32,)))
    b.output(e)
    job = b.job
    _plan(job)
    _check_plan(job)
    assert job.tensors[r].mem is None
    # a is read (through r) by the last add, so it may not share memory with c or d.
    for t in (c, d):
        oa, sa = job.tensors[a].mem
        ot, st = job.tensors[t].mem
        assert oa + sa <= ot or ot + st <= oa


def test_memory_plan_random_dags_never_overlap_live_tensors():
    rng = np.random.default_rng(5)
    for trial in range(5):
        b = Builder()
        ts = [b.input((int(rng.integers(1, 40)),)) for _ in range(2)]
        for _ in range(40):
            src = ts[int(rng.integers(len(ts)))]
            same = [t for t in ts if b.job.tensors[t].shape == b.job.tensors[src].shape]
            r = rng.random()
            if r < 0.4:
                t = b.op("exp", src)
            elif r < 0.7:
                t = b.op("add", src, same[int(rng.integers(len(same)))])
            elif r < 0.85:
                t = b.op("unsqueeze", src, dim=0)  # a view
                t = b.op("squeeze", t, dim=0)
            else:
                t = b.op("full", shape=(int(rng.integers(1, 60)),), fill_value=1.0,
                         dtype=dt.float32)
            ts.append(t)
        for t in rng.choice(ts, 3, replace=False):
            b.output(str(t))
        _plan(b.job)
        _check_plan(b.job)
        m = b.job.stats["memory"]
        assert m["block_bytes"] < m["naive_bytes"], trial


def _random_big_job(rng, n_ops):
    """A Job of n_ops ops over random sizes and lifetimes (no meta inference: memory planning
    reads only the op order, the tensors' metas and which ops are views, outputs or assigns)."""
    b = Builder()
    job = b.job
    live = [b.input((int(rng.integers(1, 512)),)) for _ in range(4)]
    w = b.variable("w", (64,))
    for k in range(n_ops):
        r = rng.random()
        # Mostly recent tensors, sometimes old ones: long lifetimes, as saved activations.
        srcs = [live[-1 - int(rng.integers(min(len(live), 8)))] if rng.random() < 0.8
                else live[int(rng.integers(len(live)))] for _ in range(int(rng.integers(1, 3)))]
        if r < 0.1:  # a view of its first input
            t = b.tensor(job.tensors[srcs[0]].shape, dt.float32)
            job.add_op("view", srcs[:1], (t,), {"shape": job.tensors[srcs[0]].shape})
        elif r < 0.15:
            t = b.tensor(job.tensors[w].shape, dt.float32)
            job.add_op("add", (w, srcs[0]), (t,))
            if k % 97 == 0:
                b.assign(w, t)
        else:
            t = b.tensor((int(rng.integers(0, 4096)),), dt.float32)  # 0 bytes too
            job.add_op("add", srcs, (t,))
        live.append(t)
    for t in rng.choice(live, 5, replace=False):
        b.output(str(t))
    return job


def _check_plan_sweep(job):
    """As _check_plan, in O(n log n): sweep over time with the live tensors sorted by offset;
    a tensor that overlaps a live one overlaps its neighbour in that order."""
    import bisect

    planned = {n: t for n, t in job.tensors.items() if t.mem is not None}
    start, views, end = {}, {}, len(job.ops)
    for k, op in enumerate(job.ops):
        if op.op_type not in ir.STRUCTURAL and registry.get(op.op_type).view:
            views[op.outputs[0]] = views.get(op.inputs[0], op.inputs[0])
        for o in op.outputs:
            start[o] = k
    last = {n: start[n] for n in planned}
    forever = set(job.loss) | set(job.grads.values())
    for k, op in enumerate(job.ops):
        for n, i in enumerate(op.inputs):
            root = views.get(i, i)
            if root in last:
                keep = op.op_type == "output" or (op.op_type == "assign" and n == 1)
                last[root] = max(last[root], end if keep or root in forever else k)
    by_start = sorted(planned, key=start.get)
    by_last = sorted(planned, key=last.get)
    live: list[tuple[int, int, str]] = []  # (offset, end offset, name), sorted
    j = 0
    for name in by_start:
        t = start[name]
        while j < len(by_last) and last[by_last[j]] < t:
            gone = by_last[j]
            j += 1
            o, n = planned[gone].mem
            if n:
                live.remove((o, o + n, gone))
        o, n = planned[name].mem
        assert o % memory_plan.ALIGN == 0
        assert o + n <= job.stats["memory"]["block_bytes"]
        if not n:
            continue
        p = bisect.bisect_left(live, (o, o + n, name))
        if p > 0:
            assert live[p - 1][1] <= o, (live[p - 1], name, (o, n))
        if p < len(live):
            assert o + n <= live[p][0], (live[p], name, (o, n))
        live.insert(p, (o, o + n, name))
    m = job.stats["memory"]
    assert m["naive_bytes"] >= m["block_bytes"] >= m["peak_bytes"]


def test_memory_plan_stays_valid_on_a_big_random_job():
    rng = np.random.default_rng(11)
    job = _random_big_job(rng, 3000)
    _plan(job)
    planned = sum(t.mem is not None for t in job.tensors.values())
    assert planned > 2000
    _check_plan_sweep(job)
    m = job.stats["memory"]
    assert m["block_bytes"] < m["naive_bytes"] / 4
    # The sweep is within a few percent of the least possible block.
    assert m["block_bytes"] <= 1.1 * m["peak_bytes"], m
    # The sweep checker agrees with the brute-force one on a smaller Job.
    small = _random_big_job(rng, 200)
    _plan(small)
    _check_plan(small)
    _check_plan_sweep(small)


def test_fuse_without_numba_falls_back_to_numpy(monkeypatch, numba_cache):
    monkeypatch.setattr(fuse_elementwise, "_numba_available", lambda: False)
    job = _chain_job(dt.float32)
    job.config["fuse_jit_min_numel"] = 0
    before = copy_job(job)
    fuse_elementwise.run(job)
    node = next(job.ops_of("fused_elementwise"))
    kernel = fuse_elementwise.resolve(node, job)
    assert kernel.sources == [] and "np." in kernel.source
    xs = _inputs(dt.float32)
    np.testing.assert_array_equal(evaluate(job, xs)[0][0], evaluate(before, xs)[0][0])
    assert not numba_cache.exists()


def test_fuse_add_to_output_writes_into_the_heads_buffer(numba_cache):
    b = Builder()
    x = b.input((8, 4), dt.float64)
    w = b.input((4, 16), dt.float64)
    bias = b.input((16,), dt.float64)
    b.output(b.op("add", b.op("matmul", x, w), bias))
    fuse_elementwise.run(b.job)
    node = next(b.job.ops_of("fused_elementwise"))
    assert node.attrs["ops"] == "matmul+add" and node.inputs[:2] == (x, w)
    seen = []
    real = registry.get("matmul").kernel

    def spy(ctx, a, b_):
        r = real(ctx, a, b_)
        seen.append(r)
        return r

    ctx = KernelContext(PRIMS, "fused_elementwise",
                        tuple(b.job.tensors[i].meta for i in node.inputs),
                        (b.job.tensors[node.outputs[0]].meta,))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((8, 4)), rng.standard_normal((4, 16)), rng.standard_normal(16)]
    opdef = registry.get("matmul")
    try:
        opdef.kernel = spy
        kernel = fuse_elementwise.resolve(node, b.job)
        r = kernel(ctx, *xs)
    finally:
        opdef.kernel = real
    assert r is seen[0]  # the add went into the matmul's result, no second buffer
    np.testing.assert_array_equal(r, xs[0] @ xs[1] + xs[2])


@pytest.mark.parametrize("dtype", [dt.float64, dt.float32])
def test_row_kernels_replace_layer_norm_and_softmax_within_rounding(dtype, numba_cache):
    torch = pytest.importorskip("torch")
    b = Builder()
    x = b.input((64, 12, 64), dtype)
    w = b.input((64,), dtype)
    bias = b.input((64,), dtype)
    s = b.input((16, 4, 12, 12), dtype)
    b.output(b.op("layer_norm", x, w, bias, normalized_shape=(64,), eps=1e-5))
    b.output(b.op("softmax", s, dim=-1))
    b.output(b.op("log_softmax", s, dim=3))
    b.output(b.op("softmax", s, dim=1))  # not the last axis: stays
    b.output(b.op("sum", x, dim=(-1,), keepdim=True))
    b.output(b.op("sum", x, dim=(2,)))
    b.output(b.op("sum", x, dim=(0, 1)))  # leading axes: a column sum
    b.output(b.op("sum", x, dim=(0, 2)))  # neither: stays
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    kinds = [t for t in op_types(b.job) if t not in ("input", "output")]
    assert kinds == ["row_layer_norm", "row_softmax", "row_log_softmax", "softmax", "row_sum",
                     "row_sum", "col_sum", "sum"]
    rng = np.random.default_rng(5)
    sv = rng.standard_normal((16, 4, 12, 12)) * 4
    sv[..., np.triu(np.ones((12, 12), bool), 1)] = -np.inf  # a causal mask
    sv[0, 0, 0, :] = -np.inf  # a row of -inf: NaN, as eager
    sv[0, 0, 1, 0] = np.nan
    xs = [a.astype(dtype.np) for a in (rng.standard_normal((64, 12, 64)) * 3 + 1,
                                       rng.standard_normal(64), rng.standard_normal(64), sv)]
    got, _ = evaluate(b.job, xs)
    eager, _ = evaluate(before, xs)
    t = [torch.from_numpy(a.astype(np.float64)) for a in xs]
    want = [torch.nn.functional.layer_norm(t[0], (64,), t[1], t[2], 1e-5),
            torch.softmax(t[3], -1), torch.log_softmax(t[3], -1), torch.softmax(t[3], 1),
            t[0].sum(-1, keepdim=True), t[0].sum(2), t[0].sum((0, 1)), t[0].sum((0, 2))]
    rtol, atol = (1e-6, 1e-12) if dtype is dt.float64 else (1e-5, 1e-6)
    for g_, e_, w_ in zip(got, eager, want, strict=True):
        assert g_.dtype == dtype.np
        np.testing.assert_allclose(g_, w_.numpy().astype(dtype.np), rtol=rtol, atol=atol)
        np.testing.assert_allclose(g_, e_, rtol=rtol, atol=atol)


def test_row_embedding_grad_equals_eager_and_keeps_its_index_error(numba_cache):
    b = Builder()
    g = b.input((64, 12, 16))
    idx = b.input((64, 12), dt.int64)
    b.output(b.op("embedding_grad", g, idx, num_weights=40))
    before = copy_job(b.job)
    fuse_elementwise.run(b.job)
    assert "row_embedding_grad" in op_types(b.job)
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((64, 12, 16)).astype(np.float32), rng.integers(0, 40, (64, 12))]
    # the same float32 adds in the same order as the eager index_put: bitwise equal
    np.testing.assert_array_equal(evaluate(b.job, xs)[0][0], evaluate(before, xs)[0][0])
    xs[1][3, 4] = 40
    with pytest.raises(IndexError, match="index out of range"):
        evaluate(b.job, xs)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_norm_backward_is_one_op_in_a_graph(dtype, numba_cache):
    """The graph's backward calls the fused `layer_norm_grad` op, as an eager backward does,
    and trains as eager."""
    import sbpflow as flow

    def make():
        flow.manual_seed(0)
        m = flow.nn.Sequential(flow.nn.Linear(64, 64), flow.nn.LayerNorm(64))
        return m.to(getattr(flow, dtype))

    rng = np.random.default_rng(7)
    x = flow.tensor(rng.standard_normal((64, 12, 64)).astype(dtype))
    w = flow.tensor(rng.standard_normal((64, 12, 64)).astype(dtype))
    m1, m2 = make(), make()
    o1 = flow.optim.SGD(m1.parameters(), lr=1.0)
    loss = (m1(x) * w).sum()
    loss.backward()
    o1.step()

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m2
            self.add_optimizer(flow.optim.SGD(m2.parameters(), lr=1.0))

        def build(self, x):
            loss = (self.m(x) * w).sum()
            loss.backward()
            return loss

    g = G()
    g(x)
    types = op_types(g._last.job)
    assert types.count("layer_norm_grad") == 1 and "rsqrt" not in types
    rtol, atol = (1e-10, 1e-10) if dtype == "float64" else (1e-4, 1e-4)
    for (name, a), b in zip(m2.state_dict().items(), m1.state_dict().values(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol, err_msg=name)
