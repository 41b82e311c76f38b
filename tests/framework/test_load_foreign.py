"""flow.load of another library's checkpoint names what the file is and how to convert it,
with the ValueError any file that is not sbpflow/safetensors gets."""

import io
import pickle

import pytest
import safetensors.torch
import torch

import sbpflow as flow


def _state():
    return {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}


def _refusal(path_or_file) -> str:
    with pytest.raises(ValueError) as err:
        flow.load(path_or_file)
    return str(err.value)


def test_torch_zip_checkpoint_is_named_with_a_conversion(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_state(), path)  # torch's default: a zip archive
    msg = _refusal(path)
    assert str(path) in msg and "is not a valid sbpflow/safetensors file" in msg
    assert "torch checkpoint" in msg and "zip" in msg
    assert "torch.load" in msg and "safetensors.torch.save_file" in msg


def test_torch_zip_from_a_file_object():
    buf = io.BytesIO()
    torch.save(_state(), buf)
    assert "torch checkpoint" in _refusal(io.BytesIO(buf.getvalue()))


@pytest.mark.parametrize("make", [
    lambda p: torch.save(_state(), p, _use_new_zipfile_serialization=False),
    lambda p: p.write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=2)),
    lambda p: p.write_bytes(pickle.dumps(1, protocol=4)),  # shorter than 8 bytes
], ids=["torch legacy", "pickle.dump", "tiny pickle"])
def test_pickle_files_are_named(tmp_path, make):
    path = tmp_path / "model.pkl"
    make(path)
    msg = _refusal(path)
    assert "pickle file" in msg and "safetensors.torch.save_file" in msg


def test_the_suggested_conversion_loads(tmp_path):
    """What the message suggests works: torch.load, then safetensors.torch.save_file."""
    src = tmp_path / "model.pt"
    torch.save(_state(), src)
    sd = torch.load(src, map_location="cpu", weights_only=True)
    out = tmp_path / "model.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, out)
    got = flow.load(out)
    assert list(got) == ["b", "w"] or list(got) == ["w", "b"]
    assert got["w"].tolist() == _state()["w"].tolist()


def test_other_garbage_keeps_the_generic_message(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\xff" * 64)
    msg = _refusal(path)
    assert "header length field" in msg and "torch" not in msg and "pickle" not in msg
