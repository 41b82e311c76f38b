"""BatchNorm's load_state_dict without num_batches_tracked, as torch's _NormBase: a dict without
version metadata (or older than version 2) gets the module's own count filled in; a current
state_dict() that lacks it is missing a key."""

import collections

import numpy as np
import pytest
import torch

import sbpflow as flow


def _trained(m, cls_name="BatchNorm1d", **kw):
    bn = getattr(m.nn, cls_name)(3, **kw)
    bn.train()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):
        bn(m.tensor(x))
    return bn


def _load(m, make_dict, strict):
    """(result keys or the exception, the target's num_batches_tracked, the caller's keys)."""
    src = _trained(m)
    sd = make_dict(src.state_dict())
    target = m.nn.BatchNorm1d(3)
    target.num_batches_tracked.fill_(7)
    keys = list(sd)
    try:
        r = target.load_state_dict(sd, strict=strict)
        out = (sorted(r.missing_keys), sorted(r.unexpected_keys))
    except RuntimeError as e:
        out = (type(e), str(e).split("\n")[1].strip())
    assert list(sd) == keys, "load_state_dict changed the caller's dict"
    return out, int(target.num_batches_tracked.item())


def _drop(sd, key="num_batches_tracked"):
    del sd[key]
    return sd


DICTS = {
    "plain dict": lambda sd: _drop(dict(sd)),
    "OrderedDict copy (no metadata)": lambda sd: _drop(collections.OrderedDict(sd)),
    "state_dict() itself (version 2)": lambda sd: _drop(sd),
    "version 1 metadata": lambda sd: (_drop(sd), sd._metadata[""].update(version=1))[0],
    "complete": lambda sd: sd,
}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("kind", list(DICTS))
def test_missing_num_batches_tracked_as_torch(kind, strict):
    assert _load(flow, DICTS[kind], strict) == _load(torch, DICTS[kind], strict)


def test_state_dict_records_versions_as_torch():
    def versions(m):
        net = m.nn.Sequential(m.nn.Linear(3, 3), m.nn.BatchNorm1d(3),
                              m.nn.Sequential(m.nn.BatchNorm2d(2)))
        return dict(net.state_dict()._metadata)

    assert versions(flow) == versions(torch)


def test_nested_batchnorm_filled_in():
    def run(m):
        net = m.nn.Sequential(m.nn.Linear(3, 3), m.nn.BatchNorm1d(3))
        net[1].num_batches_tracked.fill_(5)
        sd = {k: v for k, v in net.state_dict().items() if "num_batches" not in k}
        r = net.load_state_dict(sd)
        return r.missing_keys, r.unexpected_keys, int(net[1].num_batches_tracked.item())

    assert run(flow) == run(torch)


def test_saved_and_loaded_dict_without_count(tmp_path):
    """A dict read back from a file has no version metadata (as torch's would not after
    dict()), so the count is filled in from the module."""
    bn = _trained(flow)
    sd = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    flow.save(sd, tmp_path / "bn.safetensors")
    target = flow.nn.BatchNorm1d(3)
    r = target.load_state_dict(flow.load(tmp_path / "bn.safetensors"))
    assert (r.missing_keys, r.unexpected_keys) == ([], [])
    np.testing.assert_array_equal(target.running_mean.numpy(), bn.running_mean.numpy())
