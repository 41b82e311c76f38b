"""sbpflow.utils.tensorboard.SummaryWriter: events written by sbpflow and read back with
tensorboard's own EventAccumulator (scalars, add_scalars' runs, histograms, images, text, the
traced graph, purge_step), the same calls through torch 2.13's SummaryWriter giving the same
values, and torch's ImportError when the tensorboard package is missing."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import sbpflow as flow


def needs_tensorboard(test):
    """Marks the tests that read events with the tensorboard package.  The dev extra
    installs it (sbpflow[tensorboard]), so they run, and fail, without it: never skipped."""
    return test


def _writer(log_dir, **kwargs):
    from sbpflow.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), **kwargs)


def _read(log_dir):
    """Everything in the event files of `log_dir` (not its sub-directories)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(log_dir),
                              size_guidance={k: 0 for k in ea.DEFAULT_SIZE_GUIDANCE})
    acc.Reload()
    return acc


def _png(encoded: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(encoded)))


def _histo_fields(h):
    return (h.min, h.max, h.num, h.sum, h.sum_squares, list(h.bucket_limit), list(h.bucket))


# -- scalars -------------------------------------------------------------------------------------
@needs_tensorboard
def test_scalars_values_steps_and_walltime(tmp_path):
    values = [flow.tensor(0.25), flow.tensor([1.5]), np.float64(2.75), 3, np.array(4.5),
              flow.tensor([[5.0]], requires_grad=True) * 2, True]
    with _writer(tmp_path) as w:
        for step, v in enumerate(values):
            w.add_scalar("loss/train", v, step * 10)
        w.add_scalar("lr", 0.1, 7, walltime=1234.5)
    acc = _read(tmp_path)
    got = acc.Scalars("loss/train")
    assert [e.step for e in got] == [0, 10, 20, 30, 40, 50, 60]
    assert [e.value for e in got] == [0.25, 1.5, 2.75, 3.0, 4.5, 10.0, 1.0]
    (lr,) = acc.Scalars("lr")
    assert (lr.step, lr.wall_time) == (7, 1234.5)
    assert lr.value == pytest.approx(0.1, rel=1e-7)  # float32 simple_value


@needs_tensorboard
def test_scalar_new_style_and_double_precision(tmp_path):
    from tensorboard.util import tensor_util

    x = 0.1 + 1e-12  # not a float32
    with _writer(tmp_path) as w:
        w.add_scalar("f32", flow.tensor(x, dtype=flow.float64), 1, new_style=True)
        w.add_scalar("f64", flow.tensor(x, dtype=flow.float64), 2, new_style=True,
                     double_precision=True)
    acc = _read(tmp_path)
    (f32,) = acc.Tensors("f32")
    (f64,) = acc.Tensors("f64")
    a32 = tensor_util.make_ndarray(f32.tensor_proto)
    a64 = tensor_util.make_ndarray(f64.tensor_proto)
    assert (a32.dtype, a32.shape, a32.item()) == (np.float32, (), np.float32(x))
    assert (a64.dtype, a64.shape, a64.item()) == (np.float64, (), x)
    assert acc.SummaryMetadata("f64").plugin_data.plugin_name == "scalars"
    assert (f32.step, f64.step) == (1, 2)


@needs_tensorboard
def test_scalar_errors(tmp_path):
    with _writer(tmp_path) as w:
        with pytest.raises(ValueError, match="exactly one element"):
            w.add_scalar("x", flow.ones(2), 0)
        with pytest.raises(ValueError, match="double_precision=True needs new_style=True"):
            w.add_scalar("x", 1.0, 0, double_precision=True)
        with pytest.raises(TypeError, match="tag must be a str"):
            w.add_scalar(3, 1.0)
        with pytest.raises(TypeError, match="expected an sbpflow tensor"):
            w.add_scalar("x", object())


@needs_tensorboard
def test_add_scalars_writes_one_run_per_tag(tmp_path):
    with _writer(tmp_path) as w:
        for step in range(3):
            w.add_scalars("loss/all", {"train": flow.tensor(float(step)),
                                       "val": np.float32(step + 0.5)}, step)
    runs = sorted(p for p in os.listdir(tmp_path) if (tmp_path / p).is_dir())
    assert runs == ["loss_all_train", "loss_all_val"]
    for run, offset in (("loss_all_train", 0.0), ("loss_all_val", 0.5)):
        events = _read(tmp_path / run).Scalars("loss/all")
        assert [(e.step, e.value) for e in events] == [(s, s + offset) for s in range(3)]
    assert _read(tmp_path).Tags()["scalars"] == []  # nothing in the main run itself


# -- histograms ----------------------------------------------------------------------------------
@needs_tensorboard
@pytest.mark.parametrize("bins", ["tensorflow", 10, "auto", [-3.0, -1.0, 0.0, 1.0, 3.0]])
def test_histogram_statistics(tmp_path, bins):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((20, 30)).astype(np.float32)
    with _writer(tmp_path) as w:
        w.add_histogram("w", flow.tensor(data), 5, bins=bins)
    (event,) = _read(tmp_path).Histograms("w")
    h = event.histogram_value
    ref = data.astype(np.float64).reshape(-1)
    assert event.step == 5
    assert (h.num, h.min, h.max) == (ref.size, ref.min(), ref.max())
    assert h.sum == pytest.approx(ref.sum(), rel=1e-12, abs=1e-9)
    assert h.sum_squares == pytest.approx(ref.dot(ref), rel=1e-12)
    assert h.bucket[0] == 0  # the empty bucket that records the left edge
    inside = ((ref >= h.bucket_limit[0]) & (ref <= h.bucket_limit[-1])).sum()
    assert sum(h.bucket) == inside
    if not isinstance(bins, str):
        counts, edges = np.histogram(ref, bins=bins)
        nz = np.flatnonzero(counts)
        assert list(h.bucket[1:]) == counts[nz[0]:nz[-1] + 1].tolist()
        assert list(h.bucket_limit) == edges[nz[0]:nz[-1] + 2].tolist()


@needs_tensorboard
def test_histogram_max_bins_and_raw(tmp_path):
    data = np.arange(100, dtype=np.float64)
    with _writer(tmp_path) as w:
        w.add_histogram("merged", data, 0, bins=10, max_bins=4)
        w.add_histogram_raw("raw", min=0.0, max=4.0, num=5, sum=10.0, sum_squares=30.0,
                            bucket_limits=[1.0, 2.0, 4.0], bucket_counts=[2, 1, 2],
                            global_step=3)
        with pytest.raises(ValueError, match="same length"):
            w.add_histogram_raw("bad", 0, 1, 1, 1, 1, [1.0, 2.0], [1.0])
        with pytest.raises(ValueError, match="values is empty"):
            w.add_histogram("empty", np.zeros(0))
        with pytest.raises(ValueError, match="max_bins"):
            w.add_histogram("x", data, max_bins=0)
    acc = _read(tmp_path)
    merged = acc.Histograms("merged")[0].histogram_value
    # 10 bins of 10 merged 3 at a time: 4 buckets, the last one holding one bin
    assert list(merged.bucket) == [0, 30, 30, 30, 10]
    edges = np.histogram_bin_edges(data, 10)
    assert list(merged.bucket_limit) == edges[[0, 3, 6, 9, 10]].tolist()
    raw = acc.Histograms("raw")[0]
    assert raw.step == 3
    assert _histo_fields(raw.histogram_value) == (0.0, 4.0, 5, 10.0, 30.0, [1.0, 2.0, 4.0],
                                                  [2.0, 1.0, 2.0])


# -- images and text -----------------------------------------------------------------------------
@needs_tensorboard
def test_images_chw_hwc_grey_and_float(tmp_path):
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)  # HWC
    rgba = rng.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    grey = rng.integers(0, 256, (3, 5), dtype=np.uint8)
    levels = rng.integers(0, 256, (3, 4, 2))
    as_float = (levels / 255.0).astype(np.float32)  # k/255 must come back as k
    with _writer(tmp_path) as w:
        w.add_image("chw", flow.tensor(rgb.transpose(2, 0, 1)), 1)
        w.add_image("hwc", rgb, 2, dataformats="HWC")
        w.add_image("rgba", flow.tensor(rgba.transpose(2, 0, 1)), 3)
        w.add_image("grey", grey, 4, dataformats="HW")
        w.add_image("grey1", grey[None], 5)
        w.add_image("float", flow.tensor(as_float), 6)
        w.add_image("wh", grey.T, 7, dataformats="WH")
    acc = _read(tmp_path)
    for tag, step, want, channels in [("chw", 1, rgb, 3), ("hwc", 2, rgb, 3),
                                      ("rgba", 3, rgba, 4), ("grey", 4, grey, 1),
                                      ("grey1", 5, grey, 1),
                                      ("float", 6, levels.transpose(1, 2, 0), 3),
                                      ("wh", 7, grey, 1)]:
        (event,) = acc.Images(tag)
        assert event.step == step
        assert (event.height, event.width) == want.shape[:2]
        np.testing.assert_array_equal(_png(event.encoded_image_string), want, err_msg=tag)
        assert len(_png(event.encoded_image_string).shape) == (2 if channels == 1 else 3)


@needs_tensorboard
def test_add_images_grid_and_image_errors(tmp_path):
    rng = np.random.default_rng(2)
    batch = rng.integers(0, 256, (10, 3, 2, 3), dtype=np.uint8)  # NCHW, 10 images
    with _writer(tmp_path) as w:
        w.add_images("batch", flow.tensor(batch), 0)
        w.add_images("batch_nhwc", batch.transpose(0, 2, 3, 1), 0, dataformats="NHWC")
        with pytest.raises(ValueError, match="needs a 3-d image"):
            w.add_image("x", np.zeros((2, 2), np.uint8))
        with pytest.raises(ValueError, match="ordering of the letters"):
            w.add_image("x", np.zeros((3, 2, 2), np.uint8), dataformats="CHN")
        with pytest.raises(TypeError, match="uint8"):
            w.add_image("x", np.zeros((3, 2, 2), np.int64))
        with pytest.raises(ValueError, match="channels"):
            w.add_image("x", np.zeros((5, 2, 2), np.uint8))
    acc = _read(tmp_path)
    want = np.zeros((2 * 2, 8 * 3, 3), np.uint8)  # 8 per row, 2 rows
    for k in range(10):
        r, c = divmod(k, 8)
        want[r * 2:(r + 1) * 2, c * 3:(c + 1) * 3] = batch[k].transpose(1, 2, 0)
    for tag in ("batch", "batch_nhwc"):
        np.testing.assert_array_equal(_png(acc.Images(tag)[0].encoded_image_string), want)


@needs_tensorboard
def test_text(tmp_path):
    from tensorboard.util import tensor_util

    with _writer(tmp_path) as w:
        w.add_text("notes", "**lr** = 0.1, ünïcode", 3)
        with pytest.raises(TypeError, match="must be a str"):
            w.add_text("notes", 3)
    acc = _read(tmp_path)
    (event,) = acc.Tensors("notes/text_summary")
    assert event.step == 3
    assert tensor_util.make_ndarray(event.tensor_proto).tolist() == [
        "**lr** = 0.1, ünïcode".encode()]
    assert acc.SummaryMetadata("notes/text_summary").plugin_data.plugin_name == "text"


# -- the graph -----------------------------------------------------------------------------------
class Block(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = flow.nn.Linear(4, 4)
        self.norm = flow.nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(self.lin(x)).relu()


class Net(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = flow.nn.Linear(3, 4)
        self.drop = flow.nn.Dropout(0.5)
        self.block = Block()
        self.register_buffer("offset", flow.ones(4))

    def forward(self, x, scale):
        return flow.softmax(self.block(self.drop(self.fc1(x))) * scale + self.offset, dim=-1)


@needs_tensorboard
def test_add_graph_nodes_match_the_traced_job(tmp_path):
    from sbpflow.graph.ir import Job
    from sbpflow.graph.trace import trace_build

    model = Net()
    x, scale = flow.randn(2, 3), flow.tensor(2.0)
    model.eval()  # add_graph traces in eval mode, as torch's does
    job = Job("expected")
    trace_build(job, model, (x, scale), {}, {"Net": model})
    model.train()
    with _writer(tmp_path) as w:
        w.add_graph(model, (x, scale))
    assert model.training and model.drop.training  # modes restored
    graph = _read(tmp_path).Graph()
    nodes = {n.name: n for n in graph.node}
    assert len(graph.node) == len(job.ops) == len(nodes)
    assert sorted(n.op for n in graph.node) == sorted(op.op_type for op in job.ops)
    assert "dropout" not in {n.op for n in graph.node}  # traced in eval mode

    # parameters and buffers by module path; other ops by scope path and their Job name
    params = {n.replace(".", "/") for n, _ in model.named_parameters(prefix="Net")}
    params |= {"Net/offset"}
    assert {n.name for n in graph.node if n.op == "variable"} == params
    expected = {"input_0", "input_1", "output_0"} | params
    for op in job.ops:
        if op.op_type not in ("variable", "input", "output"):
            expected.add(op.scope.replace(".", "/") + "/" + op.name[len(op.scope) + 1:])
    assert set(nodes) == expected

    # edges: each node's inputs are the nodes producing its Job inputs
    by_job_name = dict(zip([op.name for op in job.ops], [n.name for n in graph.node]))
    producer = {t: op.name for op in job.ops for t in op.outputs}
    for op, node in zip(job.ops, graph.node):
        assert list(node.input) == [by_job_name[producer[t]] for t in op.inputs]
        if op.outputs:
            shapes = node.attr["_output_shapes"].list.shape
            assert [[d.size for d in s.dim] for s in shapes] == [
                list(job.tensors[t].shape) for t in op.outputs]
    linear = [n for n in graph.node if n.name.startswith("Net/block/lin/linear")]
    assert len(linear) == 1
    assert list(linear[0].input)[1:] == ["Net/block/lin/weight", "Net/block/lin/bias"]
    from tensorboard.compat.proto import types_pb2

    assert list(nodes["Net/fc1/weight"].attr["_output_types"].list.type) == [
        types_pb2.DT_FLOAT]


class DataDependent(flow.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


class ListOut(flow.nn.Module):
    def forward(self, x):
        return [x + 1, x * 2]


@needs_tensorboard
def test_add_graph_errors(tmp_path, capsys):
    with _writer(tmp_path) as w:
        with pytest.raises(RuntimeError, match=r"add_graph: .*could not trace DataDependent"):
            w.add_graph(DataDependent(), flow.randn(3))
        with pytest.raises(RuntimeError, match="add_graph: ListOut returned a list"):
            w.add_graph(ListOut(), flow.randn(3))
        with pytest.raises(TypeError, match="add_graph: model must be an nn.Module"):
            w.add_graph(lambda x: x, flow.randn(3))
        w.add_graph(ListOut(), flow.randn(3), verbose=True, use_strict_trace=False)
    assert "add_scalar" in capsys.readouterr().out  # verbose prints the Job
    assert {n.op for n in _read(tmp_path).Graph().node} >= {"add_scalar", "mul_scalar"}


# -- the writer ----------------------------------------------------------------------------------
@needs_tensorboard
def test_default_log_dir_comment_flush_and_reopen(tmp_path, monkeypatch):
    from sbpflow.utils.tensorboard import SummaryWriter

    monkeypatch.chdir(tmp_path)
    w = SummaryWriter(comment="_exp")
    head, tail = os.path.split(w.get_logdir())
    assert head == "runs" and tail.endswith("_" + socket.gethostname() + "_exp")
    w.add_scalar("a", 1.0, 0)
    w.flush()
    assert [e.value for e in _read(w.get_logdir()).Scalars("a")] == [1.0]
    w.close()
    w.add_scalar("a", 2.0, 1)  # after close, a new event file in the same directory
    w.close()
    events = sorted(_read(w.get_logdir()).Scalars("a"), key=lambda e: e.step)
    assert [(e.step, e.value) for e in events] == [(0, 1.0), (1, 2.0)]
    with pytest.warns(UserWarning, match="comment is only appended to the default log_dir"):
        SummaryWriter(str(tmp_path / "given"), comment="_x").close()
    assert os.path.isdir(tmp_path / "given")
    with SummaryWriter(str(tmp_path / "sfx"), filename_suffix=".v2") as w2:
        w2.add_scalar("a", 1.0)
    assert all(f.endswith(".v2") for f in os.listdir(tmp_path / "sfx"))


@needs_tensorboard
def test_purge_step_hides_later_events_of_the_restarted_run(tmp_path):
    with _writer(tmp_path) as w:
        for step in range(5):
            w.add_scalar("loss", float(step), step)
            w.add_scalars("cmp", {"a": float(step)}, step)
    # Event files are read in name order; make the first run's files sort first.
    for d in (tmp_path, tmp_path / "cmp_a"):
        (name,) = [f for f in os.listdir(d) if "tfevents" in f]
        os.rename(d / name, d / "events.out.tfevents.0000000000.first")
    with _writer(tmp_path, purge_step=2) as w:
        for step in (2, 3):
            w.add_scalar("loss", 10.0 + step, step)
            w.add_scalars("cmp", {"a": 10.0 + step}, step)
    want = [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]
    assert [(e.step, e.value) for e in _read(tmp_path).Scalars("loss")] == want
    assert [(e.step, e.value) for e in _read(tmp_path / "cmp_a").Scalars("cmp")] == want


@needs_tensorboard
def test_unsupported_methods_raise_naming_themselves(tmp_path):
    with _writer(tmp_path) as w:
        for name in ("add_hparams", "add_embedding", "add_figure", "add_audio", "add_video",
                     "add_pr_curve", "add_mesh", "add_tensor"):
            with pytest.raises(NotImplementedError, match=f"SummaryWriter.{name} is not"):
                getattr(w, name)("tag", None)


@needs_tensorboard
def test_mock_torch_path():
    import sbpflow.utils.tensorboard as tb

    with flow.mock_torch.enable():
        import torch.utils.tensorboard
        from torch.utils.tensorboard import SummaryWriter

        assert torch.utils.tensorboard is tb
        assert SummaryWriter is tb.SummaryWriter


# -- against torch's SummaryWriter ---------------------------------------------------------------
@needs_tensorboard
def test_same_values_as_torch(tmp_path):
    import torch
    from torch.utils.tensorboard import SummaryWriter as TorchWriter

    rng = np.random.default_rng(3)
    hist = rng.standard_normal(500).astype(np.float32) * 3
    img = rng.integers(0, 256, (3, 4, 5), dtype=np.uint8)
    scalars = [0.5, 2, np.float32(1.25), np.array([3.5])]
    runs = {}
    for kind, writer, tensor in (("sbpflow", _writer, flow.tensor),
                                 ("torch", lambda d: TorchWriter(str(d)), torch.tensor)):
        d = tmp_path / kind
        runs[kind] = d
        with writer(d) as w:
            for step, v in enumerate(scalars):
                w.add_scalar("s", v, step)
            w.add_scalar("t", tensor(np.float32(4.75)), 9)
            w.add_scalars("m", {"x": 1.5, "y": tensor(2.5)}, 4)
            for bins in ("tensorflow", 7, "fd"):
                w.add_histogram(f"h_{bins}", tensor(hist), 1, bins=bins)
            w.add_histogram("h_int", tensor(np.arange(20)), 2)
            w.add_image("img", tensor(img), 0)
            w.add_image("img_hwc", img.transpose(1, 2, 0), 0, dataformats="HWC")
            w.add_text("txt", "hello", 0)
    ours, theirs = _read(runs["sbpflow"]), _read(runs["torch"])
    for tag in ("s", "t"):
        assert ([(e.step, e.value) for e in ours.Scalars(tag)]
                == [(e.step, e.value) for e in theirs.Scalars(tag)])
    dirs = {kind: sorted(p for p in os.listdir(d) if (d / p).is_dir()) for kind, d in runs.items()}
    assert dirs["sbpflow"] == dirs["torch"] == ["m_x", "m_y"]
    for sub in dirs["torch"]:
        assert ([(e.step, e.value) for e in _read(runs["sbpflow"] / sub).Scalars("m")]
                == [(e.step, e.value) for e in _read(runs["torch"] / sub).Scalars("m")])
    assert ours.Tags()["histograms"] == theirs.Tags()["histograms"]
    for tag in ours.Tags()["histograms"]:
        (a,), (b,) = ours.Histograms(tag), theirs.Histograms(tag)
        assert a.step == b.step
        assert _histo_fields(a.histogram_value) == _histo_fields(b.histogram_value), tag
    for tag in ("img", "img_hwc"):
        np.testing.assert_array_equal(_png(ours.Images(tag)[0].encoded_image_string),
                                      _png(theirs.Images(tag)[0].encoded_image_string))
    assert ours.Tags()["tensors"] == theirs.Tags()["tensors"] == ["txt/text_summary"]
    assert (ours.Tensors("txt/text_summary")[0].tensor_proto.string_val
            == theirs.Tensors("txt/text_summary")[0].tensor_proto.string_val)


# -- without the tensorboard package -------------------------------------------------------------
_IMPORT = """
import importlib.abc, sys
{block}
try:
    {stmt}
except ImportError as e:
    print(type(e).__name__ + ": " + str(e))
"""
_NOT_INSTALLED = textwrap.dedent("""
    class Missing(importlib.abc.MetaPathFinder):  # as if tensorboard were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "tensorboard" or name.startswith("tensorboard."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Missing())
""")
_NONE = 'sys.modules["tensorboard"] = None'


def _import_error(block: str, stmt: str) -> str:
    code = _IMPORT.format(block=block, stmt=stmt)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(flow.__file__)), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("block", [_NOT_INSTALLED, _NONE], ids=["not-installed", "none"])
def test_import_error_without_tensorboard_is_torchs(block):
    ours = _import_error(block, "from sbpflow.utils.tensorboard import SummaryWriter")
    mocked = _import_error(block, "import sbpflow.mock_torch as m; m.enable(); "
                                  "from torch.utils.tensorboard import SummaryWriter")
    torchs = _import_error(block, "from torch.utils.tensorboard import SummaryWriter")
    assert ours == mocked == torchs
    assert torchs in ("ModuleNotFoundError: No module named 'tensorboard'",
                      "ModuleNotFoundError: import of tensorboard halted; None in sys.modules")
