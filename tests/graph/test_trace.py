"""The lazy interpreter: what build() turns into, and the errors it raises at once."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph.ir import Job
from sbpflow.graph.trace import LazyTensorError, trace_build

from .refeval import run_job


def _mlp():
    flow.manual_seed(0)
    return flow.nn.Sequential(flow.nn.Linear(4, 8), flow.nn.BatchNorm1d(8), flow.nn.ReLU(),
                              flow.nn.Linear(8, 3))


def _trace(build, *args, modules=None, **kwargs):
    job = Job("g")
    spec = trace_build(job, build, args, kwargs, modules or {})
    job.check()
    return job, spec


def _line(fn, text):
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(src) if text in s)


def test_mlp_job_structure_names_and_scopes():
    m = _mlp()
    x = flow.randn(5, 4)
    job, _ = _trace(lambda x: m(x).sum(), x, modules={"model": m})
    assert [o.op_type for o in job.ops[:2]] == ["input", "variable"]
    assert set(job.variables) == {
        "model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias",
        "model.1.running_mean", "model.1.running_var", "model.1.num_batches_tracked",
        "model.3.weight", "model.3.bias"}
    assert job.variables["model.0.weight"].trainable
    assert job.variables["model.0.weight"].tensor is m[0].weight  # the eager memory
    assert not job.variables["model.1.running_mean"].trainable
    linear = next(job.ops_of("linear"))
    assert linear.scope == "model.0" and linear.name.startswith("model.0-linear-")
    assert linear.loc[0] == __file__
    assert next(job.ops_of("relu")).scope == "model.2"
    # BatchNorm's running statistics: SSA values written back by assign ops.
    assigned = {job.producer(o.inputs[0]).attrs["var"] for o in job.ops_of("assign")}
    assert assigned == {"model.1.running_mean", "model.1.running_var",
                        "model.1.num_batches_tracked"}
    for t in job.tensors.values():
        assert t.placement.ranks == [0] and t.sbp == (flow.sbp.broadcast,)
    (out,) = job.outputs()
    assert job.tensors[out.inputs[0]].shape == ()
    # nothing ran: the eager buffers are unchanged
    assert m[1].num_batches_tracked.item() == 0
    text = str(job)
    assert "linear(input-0, model.0.weight, model.0.bias)" in text
    assert Job.from_json(job.to_json()).to_json() == job.to_json()


def test_traced_values_equal_eager():
    m = _mlp()
    x = flow.randn(5, 4)
    job, _ = _trace(lambda x: m(x), x, modules={"model": m})
    (got,), writes = run_job(job, [x.numpy()])
    ref = m(x)
    np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(writes["model.1.running_mean"], m[1].running_mean.numpy(),
                               rtol=1e-6)
    assert writes["model.1.num_batches_tracked"] == 1


def test_nested_inputs_outputs_and_constants():
    def build(pair, d, scale):
        a, b = pair
        return {"sum": a + b * scale, "parts": [a, d["c"]]}

    a, b, c = flow.ones(2), flow.ones(2) * 2, flow.zeros(3)
    job, spec = _trace(build, (a, b), {"c": c}, 3.0)
    assert [o.attrs["index"] for o in job.inputs()] == [0, 1, 2]
    assert len(job.outputs()) == 3
    outs, _ = run_job(job, [a.numpy(), b.numpy(), c.numpy()])
    from sbpflow.graph.trace import unflatten
    res = unflatten(spec, outs)
    np.testing.assert_allclose(res["sum"], [7, 7])
    assert res["parts"][1].shape == (3,)


def test_captured_eager_tensor_is_one_nontrainable_variable():
    w = flow.randn(3)

    def build(x):
        return x * w + w

    job, _ = _trace(build, flow.randn(3))
    assert list(job.variables) == ["captured-0"]
    assert not job.variables["captured-0"].trainable
    assert len(list(job.ops_of("variable"))) == 1


def test_inplace_is_ssa_and_writes_variables_back():
    buf = flow.zeros(3)

    def build(x):
        y = x * 2
        y.add_(1)  # lazy target: rebound
        with flow.no_grad():
            buf.add_(y)  # eager target: a variable plus an assign
        return y, buf + 0

    x = flow.ones(3)
    job, _ = _trace(build, x)
    (assign,) = job.ops_of("assign")
    assert job.producer(assign.inputs[0]).attrs["var"] == "captured-0"
    (y, b), writes = run_job(job, [x.numpy()])
    np.testing.assert_allclose(y, [3, 3, 3])
    np.testing.assert_allclose(b, [3, 3, 3])  # reads after the write see it
    np.testing.assert_allclose(writes["captured-0"], [3, 3, 3])
    assert buf.numpy().tolist() == [0, 0, 0]


def test_inplace_through_view_raises():
    def build(x):
        y = x * 1
        y[0].add_(1)
        return y

    with pytest.raises(NotImplementedError, match="through a view"):
        _trace(build, flow.ones(3))


def test_view_read_after_base_write_raises():
    def build(x):
        y = x * 1
        v = y[0:2]
        y.add_(1)
        return v * 1

    with pytest.raises(NotImplementedError, match="read after its base was written"):
        _trace(build, flow.ones(3))


def test_random_ops_are_recorded():
    drop = flow.nn.Dropout(0.5)
    job, _ = _trace(lambda x: drop(x), flow.ones(4, 4), modules={"drop": drop})
    assert any(o.scope == "drop" for o in job.ops if o.op_type not in ("input", "output"))


def _build_item(x):
    y = x.sum()
    return y.item()  # the offending line


def _build_numpy(x):
    return (x * 2).numpy()  # the offending line


def _build_if(x):
    if x.sum() > 0:  # the offending line
        return x
    return -x


def _build_shape(x):
    w = flow.randn(5, 2)
    return x @ w  # the offending line


@pytest.mark.parametrize("fn,exc,text", [
    (_build_item, LazyTensorError, ".item()"),
    (_build_numpy, LazyTensorError, ".numpy()"),
    (_build_if, LazyTensorError, "bool()"),
    (_build_shape, RuntimeError, "matmul"),
])
def test_build_errors_name_the_user_line(fn, exc, text):
    with pytest.raises(exc) as info:
        _trace(fn, flow.ones(3, 4))
    msg = str(info.value)
    assert text in msg
    assert f"{__file__}:{_line(fn, 'the offending line')}" in msg


def test_backward_records_loss_only():
    lin = flow.nn.Linear(3, 1)

    def build(x):
        loss = lin(x).sum()
        loss.backward()
        return loss

    job, _ = _trace(build, flow.ones(2, 3), modules={"lin": lin})
    assert len(job.loss) == 1 and job.tensors[job.loss[0]].shape == ()
    assert lin.weight.grad is None


def test_backward_errors_as_torch():
    lin = flow.nn.Linear(3, 2)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        _trace(lambda x: lin(x).backward(), flow.ones(2, 3), modules={"lin": lin})
    with pytest.raises(RuntimeError, match="does not require grad"):
        _trace(lambda x: (x * 2).sum().backward(), flow.ones(2, 3))


def test_lazy_tensor_repr_and_meta():
    seen = {}

    def build(x):
        y = x.reshape(6)
        seen["repr"] = repr(y)
        seen["shape"] = tuple(y.shape)
        seen["dtype"] = y.dtype
        return y

    _trace(build, flow.ones(2, 3))
    assert "is_lazy=True" in seen["repr"]
    assert seen["shape"] == (6,) and seen["dtype"] is flow.float32


def test_autograd_backward_of_a_lazy_loss():
    lin = flow.nn.Linear(3, 1)

    def build(x):
        loss = lin(x).sum()
        flow.autograd.backward(loss)
        return loss

    job, _ = _trace(build, flow.ones(2, 3), modules={"lin": lin})
    assert len(job.loss) == 1


def test_global_tensor_input_keeps_its_placement_and_sbp():
    p = flow.placement("cpu", [0])
    x = flow.randn(4, 3).to_global(p, flow.sbp.split(0))
    lin = flow.nn.Linear(3, 2).to_global(p, flow.sbp.broadcast)
    seen = {}

    def build(x):
        y = lin(x)
        seen.update(x=(x.is_global, x.placement, x.sbp), y=(y.is_global, y.placement, y.sbp))
        return y

    job, _ = _trace(build, x, modules={"lin": lin})
    (inp,) = job.inputs()
    t = job.tensors[inp.outputs[0]]
    assert t.is_global and t.sbp == (flow.sbp.split(0),) and t.placement == p
    # inside build(), is_global, placement and sbp answer as in eager
    eager = lin(x)
    assert seen["x"] == (True, p, (flow.sbp.split(0),))
    assert seen["y"] == (True, p, eager.sbp)
    (out,) = job.outputs()
    assert job.tensors[out.inputs[0]].sbp == eager.sbp


def test_local_tensor_among_global_ones_raises_as_eager():
    p = flow.placement("cpu", [0])
    x = flow.randn(4, 3).to_global(p, flow.sbp.split(0))
    w = flow.randn(2, 3)
    with pytest.raises(RuntimeError) as eager:
        flow.nn.functional.linear(x, w)
    with pytest.raises(RuntimeError) as lazy:
        _trace(lambda x: flow.nn.functional.linear(x, w), x)
    assert str(eager.value) in str(lazy.value)


def test_views_carry_eager_strides():
    # contiguous() and reshape decide between a view and a copy by the strides.
    seen = {}

    def build(x):
        t = x.transpose(0, 1)
        seen["contiguous"] = t.is_contiguous()
        return t.contiguous().view(6), t.reshape(6)

    job, _ = _trace(build, flow.ones(2, 3))
    assert seen["contiguous"] is False
    assert any(o.op_type == "clone" for o in job.ops)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (a, b), _ = run_job(job, [x])
    np.testing.assert_array_equal(a, x.T.reshape(6))
    np.testing.assert_array_equal(b, x.T.reshape(6))


def test_detach_in_build_stops_gradients():
    lin = flow.nn.Linear(3, 3)

    def build(x):
        h = lin(x)
        target = h.detach()
        assert target.is_lazy and not target.requires_grad and h.requires_grad
        loss = ((h - target * 2) ** 2).sum()
        loss.backward()
        return loss

    job, _ = _trace(build, flow.ones(2, 3), modules={"lin": lin})
    from sbpflow.graph.passes import autograd

    autograd.run(job)
    assert not job.variables.keys() - {"lin.weight", "lin.bias"}  # nothing captured
    x = flow.ones(2, 3)
    outs, _ = run_job(job, [x.numpy()])
    h = lin(x)
    ref = ((h - h.detach() * 2) ** 2).sum()
    np.testing.assert_allclose(outs[0], ref.item(), rtol=1e-6)


def test_host_read_of_an_eager_tensor_written_in_build_raises():
    bn = flow.nn.BatchNorm1d(4, momentum=None)  # cumulative average: reads the count

    with pytest.raises(LazyTensorError, match="num_batches_tracked"):
        _trace(lambda x: bn(x), flow.randn(5, 4), modules={"bn": bn})
    w = flow.ones(2)
    seen = {}

    def build(x):
        seen["before"] = float(w.numpy().sum())  # NumPy on the host: no op is traced
        return x + w

    _trace(build, flow.ones(2))  # reading an unwritten eager tensor is fine
    assert seen["before"] == 2.0
    assert bn.num_batches_tracked.item() == 0  # eager again after tracing


def test_other_threads_stay_eager_while_build_traces():
    """Tracing routes only the tracing thread's ops into the Job: a thread training eagerly
    meanwhile gets real values (checked against NumPy), and the Job gets none of its ops."""
    import threading

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    started, traced = threading.Event(), threading.Event()
    result = {}

    def eager_worker():
        started.wait(10)
        x = flow.tensor(a)
        y = (x * 2.0 + 1.0).relu().sum(dim=1)
        y.add_(1.0)
        result["y"] = y.numpy()
        traced.set()

    def build(x):
        started.set()
        traced.wait(10)  # the other thread runs its eager ops while this one traces
        return x.exp()

    job = Job("threads")
    th = threading.Thread(target=eager_worker)
    th.start()
    trace_build(job, build, (flow.tensor(a),), {}, {}, {})
    th.join(10)
    np.testing.assert_allclose(result["y"], (a * 2 + 1).clip(0).sum(1) + 1)
    assert [op.op_type for op in job.ops] == ["input", "exp", "output"]
