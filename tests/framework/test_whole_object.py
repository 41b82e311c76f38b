"""Whole-object checkpoints: a pickle stream inside the safetensors container, tensors as
persistent ids, and the weights-only (restricted) unpickler that load uses by default."""

import io
import json
import os
import pickle
import re
import struct
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

import sbpflow as flow
from sbpflow import serialization
from sbpflow.framework.parameter import Parameter


class Scaled(flow.nn.Module):
    """A user module class: a weights-only load needs it allowlisted."""

    def __init__(self):
        super().__init__()
        self.body = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.Tanh(), flow.nn.Linear(4, 2))
        self.register_buffer("scale", flow.tensor([2.0, 0.5]))

    def forward(self, x):
        return self.body(x) * self.scale


class Marker:
    """A class that is not allowlisted."""

    def __init__(self, v):
        self.v = v


MODEL_CLASSES = [Scaled, flow.nn.Sequential, flow.nn.Linear, flow.nn.Tanh]


@pytest.fixture(autouse=True)
def _clean_allowlist():
    serialization.clear_safe_globals()
    yield
    serialization.clear_safe_globals()


def _model():
    flow.manual_seed(3)
    return Scaled()


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    flow.save(obj, buf)
    return buf.getvalue()


def _container(stream: bytes, arrays=None) -> bytes:
    """Our container with a hand-made pickle stream (what a hostile file would hold)."""
    arrays = dict(arrays or {})
    arrays["__sbpflow_pickle__"] = np.frombuffer(stream, np.uint8)
    meta = {"sbpflow": json.dumps({"version": 1, "root": {"P": "__sbpflow_pickle__"}}),
            "format": "pt"}
    return safetensors.numpy.save(arrays, metadata=meta)


def _hostile_stream(marker: str) -> bytes:
    # GLOBAL os.system, then REDUCE with ("touch <marker>",): runs a shell on unpickling.
    cmd = f"touch {marker}".encode()
    return (b"\x80\x02" + b"cos\nsystem\n" + b"X" + struct.pack("<I", len(cmd)) + cmd
            + b"\x85" + b"R" + b".")


def test_hostile_reduce_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "pwned"
    data = _container(_hostile_stream(str(marker)))
    # The stream really is hostile: the full unpickler runs it.
    with pytest.raises(pickle.UnpicklingError, match=r"^Weights only load failed\.") as info:
        flow.load(io.BytesIO(data))
    msg = str(info.value)
    assert "GLOBAL os.system" in msg or "GLOBAL posix.system" in msg, msg
    assert "add_safe_globals" in msg and "weights_only" in msg
    assert not marker.exists()
    flow.load(io.BytesIO(data), weights_only=False)  # the explicit opt-in: it does run
    assert marker.exists()


def test_hostile_stream_variants_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    cmd = f"touch {marker}".encode()
    arg = b"X" + struct.pack("<I", len(cmd)) + cmd
    streams = [
        # protocol-4 STACK_GLOBAL with memoised names
        b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93" + arg + b"\x85R.",
        # INST opcode (protocol 0)
        b"(" + arg + b"ios\nsystem\n.",
        # builtins.eval / getattr are not allowed either
        b"\x80\x02cbuiltins\neval\n" + b"X\x04\x00\x00\x001+1\x85R.",
        b"\x80\x02cbuiltins\ngetattr\n.",
        # a persistent id that is not ours
        b"\x80\x02X\x03\x00\x00\x00abcQ.",
    ]
    for stream in streams:
        with pytest.raises(pickle.UnpicklingError, match=r"^Weights only load failed\."):
            flow.load(io.BytesIO(_container(stream)))
    assert not marker.exists()


def test_whole_model_round_trip_weights_only_false(tmp_path):
    m = _model()
    path = tmp_path / "model.pt"
    flow.save(m, path)
    got = flow.load(path, weights_only=False)
    assert type(got) is Scaled and got is not m
    x = flow.randn(5, 3)
    want = m(x).detach().numpy()
    np.testing.assert_array_equal(got(x).detach().numpy(), want)  # bit for bit
    assert isinstance(got.body[0].weight, Parameter) and got.body[0].weight.requires_grad
    assert not isinstance(got.scale, Parameter)
    assert list(got.state_dict()) == list(m.state_dict())
    got(x).sum().backward()
    assert got.body[0].weight.grad is not None


def test_whole_model_needs_allowlist_with_weights_only():
    data = _saved(_model())
    with pytest.raises(pickle.UnpicklingError, match="Scaled was not an allowed global"):
        flow.load(io.BytesIO(data))
    x = flow.randn(2, 3)
    want = _model()(x).detach().numpy()
    with serialization.safe_globals(MODEL_CLASSES):
        assert serialization.get_safe_globals() == MODEL_CLASSES
        got = flow.load(io.BytesIO(data))
    np.testing.assert_array_equal(got(x).detach().numpy(), want)
    assert serialization.get_safe_globals() == []  # the context manager restores
    with pytest.raises(pickle.UnpicklingError):
        flow.load(io.BytesIO(data))
    serialization.add_safe_globals(MODEL_CLASSES)
    np.testing.assert_array_equal(flow.load(io.BytesIO(data))(x).detach().numpy(), want)
    serialization.clear_safe_globals()
    assert serialization.get_safe_globals() == []


def test_allowlisting_a_user_class_and_named_entries():
    data = _saved({"m": Marker(7), "t": flow.ones(2)})
    with pytest.raises(pickle.UnpicklingError, match="Marker"):
        flow.load(io.BytesIO(data))
    serialization.add_safe_globals([Marker])
    got = flow.load(io.BytesIO(data))
    assert isinstance(got["m"], Marker) and got["m"].v == 7
    serialization.clear_safe_globals()
    # (object, "module.name"): the name it was pickled under maps to this object.
    serialization.add_safe_globals([(Marker, f"{__name__}.Marker")])
    assert flow.load(io.BytesIO(data))["m"].v == 7


def test_checkpoint_dict_with_model_and_optimizer():
    m = _model()
    opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x = flow.randn(4, 3)
    m(x).sum().backward()
    opt.step()
    # state dicts only: the pure safetensors + JSON format, no pickle stream
    data = _saved({"model": m.state_dict(), "optimizer": opt.state_dict(), "epoch": 3})
    assert b"__sbpflow_pickle__" not in data
    got = flow.load(io.BytesIO(data))
    assert got["epoch"] == 3
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(got["model"][k].numpy(), v.numpy())
    m2 = Scaled()
    m2.load_state_dict(got["model"])
    opt2 = flow.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(got["optimizer"])
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()
    m2(x).sum().backward()
    opt2.step()
    for a, b in zip(m.parameters(), m2.parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    # whole objects in the dict: pickle stream, full load shares the parameters
    whole = flow.load(io.BytesIO(_saved({"model": m, "opt": opt, "epoch": 3})),
                      weights_only=False)
    assert whole["epoch"] == 3
    assert whole["opt"].param_groups[0]["params"][0] is whole["model"].body[0].weight
    np.testing.assert_array_equal(whole["model"](x).detach().numpy(), m(x).detach().numpy())


def test_state_dict_files_are_plain_safetensors(tmp_path):
    m = _model()
    path = tmp_path / "sd.safetensors"
    flow.save(m.state_dict(), path)
    arrays = safetensors.numpy.load_file(str(path))
    assert set(arrays) == set(m.state_dict())
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(arrays[k], v.numpy())


def test_tensor_bytes_never_go_through_pickle():
    big = flow.arange(4096, dtype=flow.float32)
    data = _saved({"m": Marker(1), "big": big})
    arrays = safetensors.numpy.load(data)
    stream = arrays["__sbpflow_pickle__"].tobytes()
    assert len(stream) < 1024  # the tensor is a reference, not 16 KiB of pickled bytes
    others = [a for k, a in arrays.items() if k != "__sbpflow_pickle__"]
    assert any(np.array_equal(a, big.numpy()) for a in others)


def test_value_types_load_without_allowlist():
    t = flow.tensor([1.0, 2.0], requires_grad=True)
    obj = {"dev": flow.device("cpu"), "size": flow.Size([2, 3]), "dtype": flow.float16,
           "set": {1, 2}, "fs": frozenset([3]), "bytes": b"ab", "c": 1 + 2j,
           "shared": [t, t], "np": np.arange(3), "p": Parameter(flow.ones(2)),
           "od": OrderedDict(a=1), "counter": Counter("aab")}
    got = flow.load(io.BytesIO(_saved(obj)))
    assert got["dev"] == flow.device("cpu") and got["size"] == flow.Size([2, 3])
    assert isinstance(got["size"], flow.Size) and got["dtype"] is flow.float16
    assert got["set"] == {1, 2} and got["fs"] == frozenset([3]) and got["bytes"] == b"ab"
    assert got["c"] == 1 + 2j and got["counter"] == Counter("aab")
    assert type(got["od"]) is OrderedDict and got["od"] == {"a": 1}
    assert got["shared"][0] is got["shared"][1] and got["shared"][0].requires_grad
    np.testing.assert_array_equal(got["np"], np.arange(3))
    assert isinstance(got["p"], Parameter) and got["p"].requires_grad


def test_load_arguments_as_torch():
    data = _saved({"m": Marker(1)})
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        flow.load(io.BytesIO(data), pickle_module=pickle, weights_only=True)
    # as torch: a pickle_module with weights_only left unset means a full unpickle
    assert flow.load(io.BytesIO(data), pickle_module=pickle)["m"].v == 1
    buf = io.BytesIO()
    torch.save({"a": torch.ones(1)}, buf)
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        torch.load(io.BytesIO(buf.getvalue()), pickle_module=pickle, weights_only=True)
    assert torch.load(io.BytesIO(buf.getvalue()), pickle_module=pickle)["a"].item() == 1.0
    with pytest.raises(ValueError, match="pickle_protocol"):
        flow.save({"m": Marker(1)}, io.BytesIO(), pickle_protocol=1)


def test_unpicklable_object_leaves_no_file(tmp_path):
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError), match="cannot pickle"):
        flow.save({"f": lambda: 1}, tmp_path / "x.pt")
    assert not os.listdir(tmp_path)


def test_plain_pickle_of_modules_tensors_and_parameters():
    m = _model()
    m2 = pickle.loads(pickle.dumps(m))
    x = flow.randn(3, 3)
    np.testing.assert_array_equal(m2(x).detach().numpy(), m(x).detach().numpy())
    assert isinstance(m2.body[0].weight, Parameter) and m2.body[0].weight.requires_grad
    t = flow.arange(6.0).reshape(2, 3).t()  # a non-contiguous view
    got = pickle.loads(pickle.dumps(t))
    np.testing.assert_array_equal(got.numpy(), t.numpy())
    assert not got.requires_grad
    p = pickle.loads(pickle.dumps(Parameter(flow.ones(2), requires_grad=False)))
    assert isinstance(p, Parameter) and not p.requires_grad
    # a plain pickle of a tensor is not a weights-only stream: its rebuild function and
    # NumPy's reconstructors are refused
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        flow.load(io.BytesIO(_container(pickle.dumps(flow.ones(2), protocol=2))))


def test_whole_optimizer_round_trip_continues_identically():
    import collections

    flow.manual_seed(5)
    m = flow.nn.Linear(3, 2)
    opt = flow.optim.Adam(m.parameters(), lr=0.01)
    x = flow.randn(4, 3)
    m(x).sum().backward()
    opt.step()
    data = _saved({"m": m, "opt": opt})
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        flow.load(io.BytesIO(data))
    # as torch: the optimizer's class and its defaultdict state must be allowlisted
    with serialization.safe_globals([flow.nn.Linear, type(opt), collections.defaultdict]):
        got = flow.load(io.BytesIO(data))
    for model, o in ((m, opt), (got["m"], got["opt"])):
        o.zero_grad()
        model(x).sum().backward()
        o.step()
    np.testing.assert_array_equal(got["m"].weight.detach().numpy(), m.weight.detach().numpy())
    assert got["opt"].param_groups[0]["params"][0] is got["m"].weight


def test_map_location_to_cpu_forms():
    data = _saved({"w": flow.ones(2)})
    for where in ("cpu", flow.device("cpu"), {"cuda:0": "cpu"}, None):
        np.testing.assert_array_equal(flow.load(io.BytesIO(data), map_location=where)["w"]
                                      .numpy(), [1.0, 1.0])
    with pytest.raises(RuntimeError, match="CUDA device but torch.cuda.is_available"):
        flow.load(io.BytesIO(data), map_location={"cpu": "cuda:0"})  # torch's CPU build
    with pytest.raises(NotImplementedError, match="map_location"):
        flow.load(io.BytesIO(data), map_location="mps")


def test_whole_object_with_global_parameters_on_two_ranks(tmp_path):
    from tests.mpijob import mpiexec_cmd, run_job

    scr = str(Path(__file__).resolve().parents[1] / "comm" / "scripts" /
              "whole_object_global.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", scr, str(tmp_path / "ckpt.pt")), timeout=90)
    assert job.returncode == 0, job.output
    assert sorted(re.findall(r"rank (\d): whole-object global ok", job.stdout)) == ["0", "1"]
    assert job.strays == 0
