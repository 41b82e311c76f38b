"""torch's module paths: `import sbpflow.X.Y` works wherever torch has a module for a feature
sbpflow offers, and the names torch exposes there (those sbpflow supports) are there too,
with the same kind of object (class, function, module).  Plus torch.testing.assert_close."""

from __future__ import annotations

import importlib
import inspect
import types

import numpy as np
import pytest
import torch

import sbpflow as flow

# Where sbpflow's public names for a path live: a name torch exposes at the path counts as
# supported when sbpflow has it at the path or in this home namespace.
HOMES = {
    "nn.modules": "nn", "nn.parameter": "nn", "nn.init": "nn.init",
    "nn.functional": "nn.functional", "nn.utils": "nn.utils", "optim": "optim",
    "utils.data": "utils.data", "autograd": "autograd", "cuda": "cuda", "amp": "amp",
    "backends": "backends", "linalg": "linalg", "random": "", "serialization": "",
    "distributed": "distributed", "onnx": "onnx", "testing": "testing",
    "accelerator": "accelerator", "types": "types",
}

PATHS = [
    "nn", "nn.modules", "nn.modules.module", "nn.modules.activation", "nn.modules.linear",
    "nn.modules.conv", "nn.modules.pooling", "nn.modules.normalization",
    "nn.modules.batchnorm", "nn.modules.instancenorm", "nn.modules.dropout",
    "nn.modules.sparse", "nn.modules.flatten", "nn.modules.loss", "nn.modules.transformer",
    "nn.modules.rnn", "nn.modules.pixelshuffle", "nn.modules.upsampling", "nn.modules.fold",
    "nn.modules.padding", "nn.modules.distance", "nn.modules.container", "nn.parameter",
    "nn.init", "nn.functional", "nn.utils", "nn.utils.rnn", "nn.utils.clip_grad",
    "nn.utils.convert_parameters", "optim", "optim.optimizer", "optim.lr_scheduler",
    "optim.sgd", "optim.adam", "optim.adagrad", "optim.adadelta", "optim.rmsprop",
    "optim.adamw", "optim.adamax", "optim.nadam", "optim.radam", "optim.asgd", "optim.lbfgs",
    "optim.rprop",
    "utils", "utils.data", "utils.data.dataloader", "utils.data.dataset",
    "utils.data.sampler", "utils.data.distributed", "autograd", "autograd.function",
    "autograd.grad_mode", "serialization", "distributed", "cuda", "cuda.amp", "amp",
    "amp.autocast_mode", "amp.grad_scaler", "backends", "backends.cudnn", "backends.cuda",
    "backends.mps", "backends.mkldnn", "backends.openmp", "onnx", "linalg", "random",
    "testing", "accelerator", "types", "special", "utils.checkpoint", "distributions",
    "distributions.constraints", "distributions.distribution", "distributions.kl",
    "distributions.utils", "distributions.categorical", "distributions.bernoulli",
    "distributions.normal", "distributions.uniform", "distributions.independent",
    "distributions.one_hot_categorical", "distributions.multivariate_normal",
]

# Names that must be at a path (what programs import from there), whatever HOMES says.
REQUIRED = {
    "nn.parameter": ["Parameter", "Buffer", "UninitializedParameter", "is_lazy"],
    "nn.modules.loss": ["KLDivLoss", "HuberLoss", "SoftMarginLoss", "MarginRankingLoss",
                        "HingeEmbeddingLoss", "CosineEmbeddingLoss", "PoissonNLLLoss",
                        "MultiLabelSoftMarginLoss", "TripletMarginLoss",
                        "TripletMarginWithDistanceLoss", "CrossEntropyLoss"],
    "nn.modules.batchnorm": ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"],
    "nn.modules.instancenorm": ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"],
    "nn.modules.normalization": ["LayerNorm", "GroupNorm", "LocalResponseNorm"],
    "nn.modules.padding": ["ZeroPad2d", "ConstantPad1d", "ReflectionPad2d",
                           "ReplicationPad3d", "CircularPad1d"],
    "nn.modules.distance": ["PairwiseDistance", "CosineSimilarity"],
    "nn.utils.clip_grad": ["clip_grad_norm_", "clip_grad_value_"],
    "optim.optimizer": ["Optimizer"],
    "optim.lr_scheduler": ["LRScheduler", "StepLR"],
    "utils.data.distributed": ["DistributedSampler"],
    "utils.data.dataloader": ["DataLoader"],
    "utils.data.dataset": ["Dataset", "TensorDataset"],
    "utils.data.sampler": ["Sampler", "RandomSampler"],
    "autograd": ["Function", "grad", "backward", "no_grad"],
    "autograd.function": ["Function"],
    "autograd.grad_mode": ["no_grad", "enable_grad", "set_grad_enabled"],
    "cuda": ["is_available", "device_count", "manual_seed_all", "amp"],
    "cuda.amp": ["autocast", "GradScaler"],
    "amp": ["autocast", "GradScaler", "custom_fwd", "custom_bwd"],
    "backends": ["cudnn", "cuda", "mps", "mkldnn", "openmp"],
    "backends.cudnn": ["is_available"],
    "backends.mkldnn": ["is_available"], "backends.openmp": ["is_available"],
    "backends.mps": ["is_available", "is_built"],
    "backends.cuda": ["matmul", "is_built"],
    "onnx": ["export"],
    "random": ["manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
               "fork_rng"],
    "testing": ["assert_close"],
    "accelerator": ["current_accelerator", "is_available", "device_count"],
    "types": ["Number", "Device"],
}

# Known differences in kind, left to the owners of that code (see the report).
KIND_EXCEPTIONS = {("autograd.function", "once_differentiable")}


def _home(path: str) -> str:
    best = ""
    for k in HOMES:
        if (path == k or path.startswith(k + ".")) and len(k) > len(best):
            best = k
    return HOMES.get(best, "")


def _kind(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "callable"
    return "value"


def _public(mod):
    names = getattr(mod, "__all__", None)
    return list(names) if names is not None else [n for n in vars(mod) if n[0] != "_"]


@pytest.mark.parametrize("path", PATHS)
def test_torch_module_path(path):
    theirs = importlib.import_module("torch." + path)
    ours = importlib.import_module("sbpflow." + path)
    home = importlib.import_module("sbpflow" + ("." + _home(path) if _home(path) else ""))
    checked = 0
    for name in _public(theirs):
        t = getattr(theirs, name, None)
        if t is None:
            continue
        here, there = getattr(ours, name, None), getattr(home, name, None)
        if here is None and (there is None or (_kind(there) == "module") != (
                _kind(t) == "module")):
            continue  # not supported (or only a same-named module, as optim.sgd's sgd)
        if here is None and _kind(t) == "module":
            # a torch submodule that some earlier import attached (torch.utils.serialization
            # after `import torch.utils.serialization`): module paths are checked by PATHS
            continue
        assert here is not None, f"sbpflow.{path} lacks {name} (sbpflow has it elsewhere)"
        if (path, name) not in KIND_EXCEPTIONS:
            assert _kind(here) == _kind(t), (path, name, _kind(here), _kind(t))
        checked += 1
    for name in REQUIRED.get(path, []):
        assert hasattr(ours, name), f"sbpflow.{path}.{name}"
        assert _kind(getattr(ours, name)) == _kind(getattr(theirs, name)), (path, name)
        checked += 1
    assert checked or path in ("utils",), path


def test_paths_reexport_the_same_objects():
    import sbpflow.nn.modules.batchnorm as bn
    import sbpflow.nn.modules.instancenorm as inorm
    import sbpflow.nn.modules.loss as loss
    import sbpflow.nn.parameter as param
    import sbpflow.random as rnd
    import sbpflow.utils.data.distributed as dist

    assert bn.BatchNorm3d is flow.nn.BatchNorm3d
    assert inorm.InstanceNorm2d is flow.nn.InstanceNorm2d
    assert loss.KLDivLoss is flow.nn.KLDivLoss
    assert param.Parameter is flow.nn.Parameter and param.Buffer is flow.nn.Buffer
    assert dist.DistributedSampler is flow.utils.data.DistributedSampler
    assert rnd.manual_seed is flow.manual_seed


def test_random_fork_rng_restores_the_stream():
    for lib in (flow, torch):
        lib.random.manual_seed(7)
        a = lib.rand(3).numpy().copy()
        lib.random.manual_seed(7)
        with lib.random.fork_rng(devices=[]):
            lib.rand(5)
        b = lib.rand(3).numpy().copy()
        np.testing.assert_array_equal(a, b)
        state = lib.random.get_rng_state()
        c = lib.rand(2).numpy().copy()
        lib.random.set_rng_state(state)
        np.testing.assert_array_equal(lib.rand(2).numpy(), c)
        assert lib.random.initial_seed() == 7


def test_buffer_registers_as_torch():
    for lib in (flow, torch):
        m = lib.nn.Module()
        m.a = lib.nn.Buffer(lib.ones(2))
        m.b = lib.nn.Buffer(lib.zeros(1), persistent=False)
        assert list(m.state_dict()) == ["a"]
        assert [n for n, _ in m.named_buffers()] == ["a", "b"]
        assert isinstance(m.a, lib.nn.Buffer) or lib is torch
        assert not isinstance(lib.zeros(1), lib.nn.Buffer)
    with pytest.raises(NotImplementedError, match="lazy modules"):
        flow.nn.parameter.UninitializedParameter()
    assert flow.nn.parameter.is_lazy(flow.nn.Parameter(flow.ones(1))) is False


# -- torch.testing.assert_close ----------------------------------------------------------------
def _cases(lib):
    t = lib.tensor
    nan, inf = float("nan"), float("inf")
    return [
        (t([1., 2., 3.]), t([1., 2.5, 3.1]), {}),
        (t([1., 2., 3.]), t([1., 2., 3. + 1e-6]), {}),
        (t([1, 2]), t([1, 3]), {}),
        (t([1., 2.]), t([1., 2.], dtype=lib.float64), {}),
        (t([1., 2.]), t([1., 2.], dtype=lib.float64), {"check_dtype": False}),
        (lib.zeros(2), lib.zeros(3), {}),
        (1.0, 1.1, {}), (1, 2, {}), (1.0, 1.0 + 1e-9, {}),
        ([lib.zeros(2)], [lib.ones(2)], {}),
        ({"a": lib.zeros(2)}, {"a": lib.ones(2)}, {}),
        ([lib.zeros(2), [lib.zeros(1), lib.ones(1)]],
         [lib.zeros(2), [lib.zeros(1), lib.zeros(1)]], {}),
        (t([nan]), t([nan]), {}), (t([nan, 1.]), t([nan, 1.]), {"equal_nan": True}),
        (lib.zeros(2), lib.zeros(2), {"rtol": 1e-3}),
        (lib.zeros(2, 2), t([[0., 1e-4], [0, 0]]), {}),
        (t([1., 2.]), t([1.1, 2.]), {"rtol": 0.0, "atol": 0.2}),
        (t([1., 2.]), t([1.1, 2.]), {"rtol": 0.0, "atol": 0.0}),
        (t([1., 2.]), t([1.5, 2.]), {"msg": "custom"}),
        (t([1., 2.]), t([1.5, 2.]), {"msg": lambda m: m.upper()}),
        (t([1., inf]), t([1., inf]), {}), (t([1., inf]), t([1., -inf]), {}),
        (t([True, False]), t([True, True]), {}),
        (t([1., 2.], dtype=lib.float16), t([1.001, 2.], dtype=lib.float16), {}),
        ([1, 2], [1, 2, 3], {}),
    ]


def _outcome(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return type(e), str(e).replace("torch.", "sbpflow.")
    return None


@pytest.mark.parametrize("i", range(len(_cases(torch))))
def test_assert_close_matches_torch(i):
    a, e, kw = _cases(flow)[i]
    ta, te, tkw = _cases(torch)[i]
    assert _outcome(flow.testing.assert_close, a, e, **kw) == _outcome(
        torch.testing.assert_close, ta, te, **tkw)


def test_assert_close_type_errors():
    with pytest.raises(TypeError, match="No comparison pair was able to handle"):
        flow.testing.assert_close(flow.zeros(2), [0.0, 0.0])
    flow.testing.assert_close(flow.zeros(2), np.zeros(2, dtype=np.float32))
