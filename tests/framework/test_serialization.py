"""save/load: nested round trips, torch interchange through safetensors, hostile files,
atomic writes."""

from __future__ import annotations

import builtins
import io
import json
import math
import os
import pickle
import struct
from collections import OrderedDict

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import sbpflow as flow
from sbpflow import optim
from sbpflow.framework import serialization
from sbpflow.framework.parameter import Parameter

DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int64, np.int32, np.int16,
          np.int8, np.uint8, np.bool_]


def _arr(dtype, shape=(2, 3), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 10).astype(dtype)


def _check_tensor(got, want: np.ndarray, requires_grad=False):
    assert isinstance(got, flow.Tensor) and not isinstance(got, Parameter)
    assert got.dtype.np == want.dtype and tuple(got.shape) == want.shape
    assert got.requires_grad == requires_grad
    np.testing.assert_array_equal(got.detach().numpy(), want)


def _guarded_load(path):
    """load(path), failing if it unpickles, evals, execs or imports code-running modules."""

    def forbidden(*args, **kwargs):
        raise AssertionError("load() must not run code")

    real_import = builtins.__import__

    def guarded_import(name, *args, **kwargs):
        if name in ("subprocess", "importlib", "marshal") or name.startswith("pickle"):
            raise AssertionError(f"load() imported {name}")
        return real_import(name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for name in ("loads", "load", "Unpickler"):
            mp.setattr(pickle, name, forbidden)
        mp.setattr(builtins, "eval", forbidden)
        mp.setattr(builtins, "exec", forbidden)
        mp.setattr(builtins, "__import__", guarded_import)
        return serialization.load(path)


def test_nested_round_trip(tmp_path):
    arrays = {np.dtype(d).name: _arr(d, seed=i) for i, d in enumerate(DTYPES)}
    shared = flow.tensor(_arr(np.float32, (4,)))
    base = flow.tensor(_arr(np.float64, (3, 4)))
    obj = {
        "tensors": {k: flow.tensor(v) for k, v in arrays.items()},
        "scalar": flow.tensor(np.float32(2.5)),
        "empty": flow.zeros(0, 3),
        "transposed": base.t(),  # a non-contiguous view
        "param": Parameter(flow.tensor(_arr(np.float32, (2,)))),
        "shared": [shared, (shared, 7)],
        3: {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "x": 1.5, "big": 2**70,
            "neg": -3, None: None, True: False, 2.5: "two and a half", "s": "ünïcode"},
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "tuple": (1, (2.0, [3, None]), ()),
        "dtype": flow.bfloat16,
        "numpy": np.arange(5, dtype=np.int32),
        "np_scalar": np.float32(0.25),
    }
    path = tmp_path / "ckpt.safetensors"
    serialization.save(obj, path)
    got = _guarded_load(path)
    assert list(got) == list(obj)
    for k, v in arrays.items():
        _check_tensor(got["tensors"][k], v)
    _check_tensor(got["scalar"], np.array(2.5, np.float32))
    _check_tensor(got["empty"], np.zeros((0, 3), np.float32))
    _check_tensor(got["transposed"], base.numpy().T)
    _check_tensor(got["param"], obj["param"].detach().numpy(), requires_grad=True)
    a, (b, seven) = got["shared"]
    assert a is b and seven == 7  # one tensor saved once loads as one tensor
    _check_tensor(a, shared.numpy())
    misc = got[3]
    assert math.isnan(misc["nan"]) and misc["inf"] == math.inf and misc["-inf"] == -math.inf
    assert {k: v for k, v in misc.items() if k != "nan"} == {
        k: v for k, v in obj[3].items() if k != "nan"}
    assert type(got["ordered"]) is OrderedDict and list(got["ordered"]) == ["b", "a"]
    assert got["tuple"] == (1, (2.0, [3, None]), ())
    assert isinstance(got["tuple"][1][1], list)
    assert got["dtype"] is flow.bfloat16
    assert isinstance(got["numpy"], np.ndarray)
    np.testing.assert_array_equal(got["numpy"], np.arange(5, dtype=np.int32))
    assert got["np_scalar"] == 0.25
    # Loaded tensors own writable memory.
    got["tensors"]["float32"].add_(1.0)


def test_single_tensor_and_file_objects():
    buf = io.BytesIO()
    t = flow.tensor(_arr(ml_dtypes.bfloat16, (5,)))
    serialization.save(t, buf)
    buf.seek(0)
    _check_tensor(serialization.load(buf), t.numpy())


def test_optimizer_state_dict_round_trip(tmp_path):
    w = flow.tensor(_arr(np.float64, (3,)), requires_grad=True)
    opt = optim.Adam([w], lr=0.1)
    w.grad = flow.tensor(_arr(np.float64, (3,), seed=1))
    opt.step()
    path = tmp_path / "opt.safetensors"
    serialization.save(opt.state_dict(), path)
    sd = serialization.load(path)
    assert list(sd["state"]) == [0]  # int keys survive
    assert sd["param_groups"][0]["betas"] == (0.9, 0.999)  # tuples survive
    assert sd["param_groups"][0]["foreach"] is None
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"].numpy(),
                                  opt.state[w]["exp_avg"].numpy())


def test_torch_state_dict_loads_as_flat_dict(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    sd = dict(model.state_dict())
    sd["extra.bf16"] = torch.randn(2, 2).to(torch.bfloat16)
    sd["extra.mask"] = torch.tensor([True, False])
    sd["extra.count"] = torch.tensor(5)
    path = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(sd, path)
    got = _guarded_load(path)
    assert sorted(got) == sorted(sd)
    for k, v in sd.items():
        want = v.float().numpy().astype(ml_dtypes.bfloat16) if v.dtype == torch.bfloat16 \
            else v.numpy()
        _check_tensor(got[k], want)


def test_our_state_dict_loads_in_torch(tmp_path):
    sd = {
        "layer.weight": flow.tensor(_arr(np.float32, (3, 4))),
        "layer.bias": Parameter(flow.tensor(_arr(np.float32, (3,)))),
        "emb": flow.tensor(_arr(ml_dtypes.bfloat16, (2, 2))),
        "steps": flow.tensor(np.int64(12)),
    }
    path = tmp_path / "ours.safetensors"
    serialization.save(sd, path)
    theirs = safetensors.torch.load_file(path)
    assert sorted(theirs) == sorted(sd)
    for k, v in sd.items():
        t = theirs[k]
        assert str(t.dtype).replace("torch.", "") == v.dtype.name
        np.testing.assert_array_equal(t.float().numpy(), v.detach().numpy().astype(np.float32))
    # Nested structures are readable by torch too, under dotted names.
    serialization.save({"model": {"w": sd["emb"]}, "step": 3}, path)
    assert list(safetensors.torch.load_file(path)) == ["model.w"]


def _valid_file(tmp_path):
    path = tmp_path / "valid.safetensors"
    serialization.save({"a": flow.tensor(_arr(np.float32, (8, 8))), "b": [1, 2]}, path)
    return path, path.read_bytes()


@pytest.mark.parametrize("keep", [0, 5, 8, 20, -300, -1])
def test_truncated_file_raises_value_error(tmp_path, keep):
    _, data = _valid_file(tmp_path)
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:keep])
    with pytest.raises(ValueError, match=r"truncated\.safetensors.*(truncated|corrupted)"):
        _guarded_load(bad)


def test_corrupted_and_garbage_files(tmp_path):
    _, data = _valid_file(tmp_path)
    n = struct.unpack("<Q", data[:8])[0]
    cases = {
        "garbage": os.urandom(256),
        "huge_length": struct.pack("<Q", 2**62) + data[8:],
        "not_utf8": data[:8] + b"\xff\xfe" + data[10:],
        "not_json": data[:8] + b"{" * n + data[8 + n:],
        "json_list": struct.pack("<Q", 2) + b"[]",
        "bad_offsets": data[:8]
        + data[8:8 + n].replace(b'"data_offsets":[0,', b'"data_offsets":[9,') + data[8 + n:],
        "extra_bytes": data + b"trailing",
    }
    for name, blob in cases.items():
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(blob)
        with pytest.raises(ValueError, match=f"{name}.safetensors") as info:
            _guarded_load(path)
        assert "not a valid" in str(info.value), name


def _with_header(tmp_path, metadata: dict, tensors=None, name="hostile"):
    arrays = tensors if tensors is not None else {"a": np.zeros(2, np.float32)}
    path = tmp_path / f"{name}.safetensors"
    safetensors.numpy.save_file(arrays, path, metadata=metadata)
    return path


@pytest.mark.parametrize("tree,problem", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (json.dumps({"version": 1, "root": {"__class__": "os.system", "args": ["echo hi"]}}),
     "no single known tag"),
    (json.dumps({"version": 1, "root": {"T": "missing"}}), "missing tensor"),
    (json.dumps({"version": 1, "root": {"T": "a", "evil": 1}}), "unknown keys"),
    (json.dumps({"version": 1, "root": {"D": [[{"T": "a"}, 1]]}}), "dict key"),
    (json.dumps({"version": 1, "root": {"D": [[1, 2, 3]]}}), "not a \\[key, value\\] pair"),
    (json.dumps({"version": 1, "root": {"F": "1e999"}}), "bad float"),
    (json.dumps({"version": 1, "root": {"dtype": "object"}}), "unknown dtype"),
    (json.dumps({"version": 99, "root": None}), "unsupported sbpflow structure"),
    ('{"version": 1, "root": NaN}', "non-JSON constant"),
    ('{"version": 1, "root": ' + "9" * 5000 + "}", "not valid JSON"),
    (json.dumps({"version": 1, "root": {"U": "x"}}), "must hold a list"),
])
def test_hostile_structure_header(tmp_path, tree, problem):
    path = _with_header(tmp_path, {"sbpflow": tree})
    with pytest.raises(ValueError, match=f"hostile.safetensors.*{problem}"):
        _guarded_load(path)


def test_deep_but_legal_nesting_is_limited(tmp_path):
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        serialization.save(deep, tmp_path / "deep.safetensors")
    tree = {"version": 1, "root": None}
    node = None
    for _ in range(300):
        node = [node]
    tree["root"] = node
    path = _with_header(tmp_path, {"sbpflow": json.dumps(tree)}, name="deep")
    with pytest.raises(ValueError, match="deeper than"):
        serialization.load(path)


def test_unsupported_tensor_dtype_in_plain_file(tmp_path):
    path = _with_header(tmp_path, {}, {"u": np.arange(3, dtype=np.uint32)}, name="uint32")
    with pytest.raises(ValueError, match="uint32.safetensors.*dtype U32"):
        serialization.load(path)


def test_unpicklable_objects_leave_nothing_half_written(tmp_path):
    # Objects the JSON tree cannot hold go into a pickle stream (tests/framework/
    # test_whole_object.py); one that cannot be pickled either fails before any write.
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError), match="cannot pickle"):
        serialization.save({"a": [1, lambda: 0]}, tmp_path / "x.safetensors")
    assert not os.listdir(tmp_path)  # nothing half-written


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_crash_mid_save_keeps_the_previous_file(tmp_path, monkeypatch, exc):
    path = tmp_path / "ckpt.safetensors"
    serialization.save({"w": flow.tensor([1.0, 2.0])}, path)
    before = path.read_bytes()
    real_write = serialization._write_container

    def crashing_write(fh, arrays, metadata):
        real_write(fh, arrays, metadata)
        fh.flush()
        fh.truncate(fh.tell() // 2)  # half the bytes made it to disk, then the crash
        raise exc

    monkeypatch.setattr(serialization, "_write_container", crashing_write)
    with pytest.raises(type(exc)):
        serialization.save({"w": flow.tensor([3.0, 4.0, 5.0])}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # the temp file is gone
    np.testing.assert_array_equal(serialization.load(path)["w"].numpy(), [1.0, 2.0])


def test_overwrite_keeps_permissions(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    serialization.save({"x": 1}, path)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    os.chmod(path, 0o600)
    serialization.save({"x": 2}, path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert serialization.load(path) == {"x": 2}


def test_map_location_as_torch_on_a_cpu_machine(tmp_path):
    path = tmp_path / "sd.pt"
    flow.save({"w": flow.ones(2, 3)}, path)
    for where in ("cpu", flow.device("cpu"), {"cuda:0": "cpu"}, None):
        assert flow.load(path, map_location=where)["w"].shape == (2, 3)
    # the common `lambda storage, loc: storage` idiom; and a callable that changes the tensor
    assert flow.load(path, map_location=lambda storage, loc: storage)["w"].sum().item() == 6
    doubled = flow.load(path, map_location=lambda t, loc: t * 2)["w"]
    assert doubled.sum().item() == 12
    for where in ("cuda", "cuda:0", flow.device("cuda"), {"cpu": "cuda:1"}):
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA "
                                               "device but torch.cuda.is_available"):
            flow.load(path, map_location=where)
