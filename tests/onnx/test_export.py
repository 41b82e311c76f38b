"""sbpflow.onnx.export: models traced into a Job, written as ONNX, run by onnxruntime and
compared with sbpflow eager."""

import io

import numpy as np
import pytest

import sbpflow as flow
from sbpflow import nn
from sbpflow.examples.digits import DigitsCNN, EvalGraph, TrainGraph
from sbpflow.examples.gpt import TinyGPT

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ATOL = 1e-5


def _flat(r):
    if isinstance(r, (tuple, list)):
        for x in r:
            yield from _flat(x)
    else:
        yield r


def _export(model, args, **kw):
    buf = io.BytesIO()
    flow.onnx.export(model, args, buf, **kw)
    proto = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(proto)
    return proto, ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])


def _run(sess, *arrays):
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})


def _check(model, args, ref_args=None, **kw):
    """Export on `args`, run on `ref_args` (default: args), compare every output with eager."""
    model.eval()
    proto, sess = _export(model, args, **kw)
    ref_args = args if ref_args is None else ref_args
    with flow.no_grad():
        ref = list(_flat(model(*ref_args)))
    outs = _run(sess, *[a.numpy() for a in ref_args])
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert o.shape == tuple(r.shape)
        np.testing.assert_allclose(o, r.numpy(), atol=ATOL, rtol=0)
    return proto, sess


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _randomise_bn(model, seed=0):
    """Non-trivial running statistics, so eval-mode batch norm is really exercised."""
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(flow.tensor(rng.normal(size=m.num_features).astype("f4")))
            m.running_var.copy_(flow.tensor(rng.uniform(0.5, 2, m.num_features).astype("f4")))


# -- the three models -----------------------------------------------------------------------------
def test_digits_cnn_matches_eager(tmp_path):
    flow.manual_seed(0)
    model = DigitsCNN()
    _randomise_bn(model)
    model.eval()
    x = flow.randn(4, 1, 8, 8)
    path = tmp_path / "digits.onnx"
    flow.onnx.export(model, (x,), str(path))  # f as a path
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with flow.no_grad():
        ref = model(x).numpy()
    (out,) = _run(sess, x.numpy())
    np.testing.assert_allclose(out, ref, atol=ATOL, rtol=0)
    # exported in eval mode even from a training-mode module, and the mode is restored
    model.train()
    _check(model, (x,))
    assert model.training is False  # _check put it in eval; now check restore from train:
    model.train()
    _export(model, (x,))
    assert model.training and model.features[1].training


def test_gpt_matches_eager():
    flow.manual_seed(0)
    model = TinyGPT(8, n_layer=2)
    idx = flow.randint(0, 11, (3, 8))
    _check(model, (idx,))


@pytest.mark.parametrize("batch_first", [True, False])
def test_lstm_matches_eager(batch_first):
    flow.manual_seed(0)
    model = nn.LSTM(3, 5, num_layers=2, batch_first=batch_first)
    x = flow.randn(2, 4, 3)
    proto, sess = _check(model, (x,))
    assert len(sess.get_outputs()) == 3  # output, h_n, c_n


def test_lstm_with_initial_state_and_gru():
    flow.manual_seed(0)
    lstm = nn.LSTM(3, 4)
    x, h0, c0 = flow.randn(5, 2, 3), flow.randn(1, 2, 4), flow.randn(1, 2, 4)

    class WithState(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x, h0, c0):
            return self.lstm(x, (h0, c0))

    _check(WithState(), (x, h0, c0))
    _check(nn.GRU(3, 4, batch_first=True), (flow.randn(2, 5, 3),))


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_bidirectional_recurrent_layers_export_as_onnx_nodes(name):
    """A bidirectional, 2-layer LSTM/GRU without bias: one ONNX LSTM/GRU node per layer and
    direction (the reverse ones with direction="reverse"), equal to eager."""
    flow.manual_seed(0)
    model = getattr(nn, name)(3, 4, num_layers=2, bidirectional=True, bias=False)
    proto, _ = _check(model, (flow.randn(6, 2, 3),))
    nodes = [n for n in proto.graph.node if n.op_type == name]
    directions = sorted(a.s.decode() for n in nodes for a in n.attribute if a.name == "direction")
    assert directions == ["forward", "forward", "reverse", "reverse"]


def test_nn_graph_exports_like_its_module():
    flow.manual_seed(0)
    model = DigitsCNN()
    _randomise_bn(model, seed=1)
    model.eval()
    graph = EvalGraph(model)
    x = flow.randn(3, 1, 8, 8)
    proto, sess = _export(graph, (x,))
    (out,) = _run(sess, x.numpy())
    np.testing.assert_array_equal(out, graph(x).numpy())  # EvalGraph returns argmax classes


def test_training_graph_exports_its_forward_and_loss():
    """A training nn.Graph: its build() (forward and loss) is traced; loss.backward() and the
    optimizer add nothing to the export (no graph pass runs)."""
    flow.manual_seed(0)
    model = DigitsCNN()
    graph = TrainGraph(model, flow.optim.SGD(model.parameters(), lr=0.1))
    x, y = flow.randn(4, 1, 8, 8), flow.randint(0, 10, (4,))
    proto, sess = _export(graph, (x, y))
    assert [i.name for i in sess.get_inputs()] == ["x", "y"]
    (loss,) = _run(sess, x.numpy(), y.numpy())
    model.eval()
    with flow.no_grad():
        ref = flow.nn.functional.cross_entropy(model(x), y)
    np.testing.assert_allclose(loss, ref.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("opset", [17, 18])
def test_older_opsets(opset):
    """Gelu is composed from Erf before opset 20; reductions take axes as attributes in 17."""
    flow.manual_seed(0)
    proto, _ = _check(TinyGPT(8, n_layer=1), (flow.randint(0, 11, (2, 8)),),
                      opset_version=opset)
    assert proto.opset_import[0].version == opset


# -- names and dynamic axes -----------------------------------------------------------------------
def test_default_and_given_names():
    model = nn.Linear(3, 2)
    proto, sess = _export(model, (flow.randn(4, 3),))
    assert [i.name for i in sess.get_inputs()] == ["input"]  # forward's parameter name
    assert [o.name for o in sess.get_outputs()] == ["output"]
    lstm = nn.LSTM(3, 4)
    proto, sess = _export(lstm, flow.randn(2, 1, 3), input_names=["seq"],
                          output_names=["y", "h"])
    assert [i.name for i in sess.get_inputs()] == ["seq"]
    assert [o.name for o in sess.get_outputs()] == ["y", "h", "output_2"]
    with pytest.raises(ValueError, match="output_names"):
        _export(model, (flow.randn(4, 3),), output_names=["a", "b"])


def test_dynamic_batch_digits():
    flow.manual_seed(0)
    model = DigitsCNN()
    _randomise_bn(model, seed=2)
    proto, sess = _check(model, (flow.randn(2, 1, 8, 8),), ref_args=(flow.randn(7, 1, 8, 8),),
                         input_names=["images"], output_names=["logits"],
                         dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
    assert _dims(proto.graph.input[0]) == ["batch", 1, 8, 8]
    assert _dims(proto.graph.output[0]) == ["batch", 10]
    # without dynamic axes the batch is fixed: onnxruntime rejects another one
    _, fixed = _export(model, (flow.randn(2, 1, 8, 8),))
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        _run(fixed, np.zeros((7, 1, 8, 8), np.float32))


def test_dynamic_batch_and_length_gpt():
    flow.manual_seed(0)
    model = TinyGPT(8, n_layer=2)
    proto, sess = _check(model, (flow.randint(0, 11, (3, 8)),),
                         ref_args=(flow.randint(0, 11, (5, 6)),), input_names=["idx"],
                         dynamic_axes={"idx": {0: "batch", 1: "seq"}})
    assert _dims(proto.graph.input[0]) == ["batch", "seq"]
    assert _dims(proto.graph.output[0]) == ["batch", "seq", 11]  # named from the input's axes
    # still right at the traced size
    x = flow.randint(0, 11, (3, 8))
    with flow.no_grad():
        np.testing.assert_allclose(_run(sess, x.numpy())[0], model(x).numpy(), atol=ATOL,
                                   rtol=0)


def test_dynamic_batch_lstm_list_form():
    flow.manual_seed(0)
    model = nn.LSTM(3, 4, batch_first=True)
    proto, _ = _check(model, (flow.randn(2, 5, 3),), ref_args=(flow.randn(6, 5, 3),),
                      input_names=["x"], dynamic_axes={"x": [0]})
    assert _dims(proto.graph.input[0]) == ["x_dynamic_axes_1", 5, 3]


def test_dynamic_axes_unknown_name_warns():
    with pytest.warns(UserWarning, match="not a valid input/output name"):
        _export(nn.Linear(3, 2), (flow.randn(2, 3),), dynamic_axes={"nope": {0: "b"}})


def test_size_dependent_control_flow_cannot_be_dynamic():
    class Branchy(nn.Module):
        def forward(self, x):
            return x.relu() if x.shape[0] > 2 else x.sigmoid()

    with pytest.raises(flow.onnx.OnnxExporterError, match="control flow depends"):
        _export(Branchy(), (flow.randn(3, 2),), input_names=["x"],
                dynamic_axes={"x": {0: "batch"}})
    _check(Branchy(), (flow.randn(3, 2),))  # static: fine


def test_data_tensor_depending_on_a_dynamic_size_is_refused():
    class FromData(nn.Module):
        def forward(self, x):
            return x + flow.tensor(np.arange(x.shape[0], dtype=np.float32)).unsqueeze(1)

    with pytest.raises(flow.onnx.OnnxExporterError, match="builds from data"):
        _export(FromData(), (flow.randn(3, 2),), input_names=["x"],
                dynamic_axes={"x": {0: "batch"}})
    _check(FromData(), (flow.randn(3, 2),))  # a constant at a static size


def test_size_used_nonlinearly_cannot_be_dynamic():
    class Square(nn.Module):
        def forward(self, x):
            return x.sum() + flow.zeros(x.shape[0] * x.shape[0])

    with pytest.raises(flow.onnx.OnnxExporterError, match="not linear"):
        _export(Square(), (flow.randn(3, 2),), input_names=["x"],
                dynamic_axes={"x": {0: "batch"}})


# -- errors ---------------------------------------------------------------------------------------
class _Inverts(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x):
        return flow.linalg.inv(self.proj(x))  # the unsupported line


def test_unsupported_op_names_op_module_and_line():
    model = nn.Sequential(nn.ReLU(), _Inverts())
    with pytest.raises(flow.onnx.UnsupportedOperatorError) as info:
        _export(model, (flow.randn(2, 3, 3),))
    msg = str(info.value)
    assert "'linalg_inv'" in msg
    assert "module '1'" in msg  # the Sequential's child that called it
    assert "test_export.py:" in msg
    assert isinstance(info.value, flow.onnx.OnnxExporterError)
    assert "linalg_inv" not in flow.onnx.supported_ops()
    assert {"conv2d", "linear", "layer_norm", "lstm_cell"} <= set(flow.onnx.supported_ops())


def test_bad_arguments():
    with pytest.raises(TypeError, match="nn.Module or an nn.Graph"):
        flow.onnx.export(lambda x: x, (flow.ones(1),), io.BytesIO())
    with pytest.raises(ValueError, match="opset_version"):
        _export(nn.Linear(2, 2), (flow.ones(1, 2),), opset_version=9)
    with pytest.raises(NotImplementedError, match="dynamic_shapes"):
        _export(nn.Linear(2, 2), (flow.ones(1, 2),), dynamic_shapes={"input": {0: "b"}})
    assert flow.onnx.is_in_onnx_export() is False


def test_returns_model_proto_without_f():
    proto = flow.onnx.export(nn.Linear(2, 2), (flow.ones(1, 2),))
    assert isinstance(proto, onnx.ModelProto)
    onnx.checker.check_model(proto)


def test_training_mode_argument():
    """EVAL (default) drops dropout; PRESERVE keeps the module's mode; TRAINING keeps dropout,
    which has no ONNX mapping."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    x = flow.randn(2, 3)
    _check(model, (x,))
    model.train()
    for mode in (flow.onnx.TrainingMode.PRESERVE, flow.onnx.TrainingMode.TRAINING):
        with pytest.raises(flow.onnx.UnsupportedOperatorError, match="'dropout'"):
            _export(model, (x,), training=mode)
        assert model.training
    model.eval()
    _export(model, (x,), training=flow.onnx.TrainingMode.PRESERVE)
    assert not model.training


def test_kwargs_and_is_in_onnx_export():
    flow.manual_seed(0)
    lstm = nn.LSTM(3, 4)
    seen = []

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x, hx=None):
            seen.append(flow.onnx.is_in_onnx_export())
            return self.lstm(x, hx)[0]

    x, h0, c0 = flow.randn(5, 2, 3), flow.randn(1, 2, 4), flow.randn(1, 2, 4)
    for kw in ({"kwargs": {"hx": (h0, c0)}, "args": (x,)}, {"args": (x, {"hx": (h0, c0)})}):
        proto, sess = _export(Wrap(), kw.pop("args"), **kw)
        assert [i.name for i in sess.get_inputs()] == ["input_0", "input_1", "input_2"]
        with flow.no_grad():
            ref = lstm(x, (h0, c0))[0].numpy()
        np.testing.assert_allclose(_run(sess, x.numpy(), h0.numpy(), c0.numpy())[0], ref,
                                   atol=ATOL, rtol=0)
    assert seen and all(seen) and flow.onnx.is_in_onnx_export() is False
