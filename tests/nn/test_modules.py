"""nn layers against torch 2.13: same weights, same input -> same output and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn


def _load_from_torch(ours, theirs):
    sd = {k: flow.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()}
    result = ours.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys


def _compare(ours, theirs, *inputs, rtol=1e-5, atol=1e-5, train=True, int_inputs=()):
    ours.train(train)
    theirs.train(train)
    _load_from_torch(ours, theirs)
    f_in = [flow.tensor(x, requires_grad=(i not in int_inputs and x.dtype.kind == "f"))
            for i, x in enumerate(inputs)]
    t_in = [torch.tensor(x, requires_grad=(i not in int_inputs and x.dtype.kind == "f"))
            for i, x in enumerate(inputs)]
    f_out = ours(*f_in)
    t_out = theirs(*t_in)
    if isinstance(t_out, tuple):
        f_out, t_out = f_out[0], t_out[0]
    np.testing.assert_allclose(f_out.detach().numpy(), t_out.detach().numpy(), rtol, atol)
    cot = np.random.default_rng(0).standard_normal(tuple(t_out.shape)).astype(np.float32)
    f_out.backward(flow.tensor(cot))
    t_out.backward(torch.tensor(cot))
    for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol * 10, atol * 10,
                                   err_msg=name)
    for a, b in zip(f_in, t_in):
        if b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol * 10, atol * 10)
    return ours, theirs


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CASES = [
    ("Linear", lambda m: m.Linear(5, 3), (_x(4, 5),)),
    ("Linear-nobias-3d", lambda m: m.Linear(5, 3, bias=False), (_x(2, 4, 5),)),
    ("Conv1d", lambda m: m.Conv1d(3, 4, 3, stride=2, padding=1), (_x(2, 3, 9),)),
    ("Conv2d", lambda m: m.Conv2d(3, 4, 3, padding=1), (_x(2, 3, 6, 6),)),
    ("Conv2d-groups", lambda m: m.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 2),
                                         groups=2), (_x(2, 4, 7, 8),)),
    ("BatchNorm1d", lambda m: m.BatchNorm1d(4), (_x(8, 4),)),
    ("BatchNorm1d-3d", lambda m: m.BatchNorm1d(4), (_x(3, 4, 5),)),
    ("BatchNorm2d", lambda m: m.BatchNorm2d(3), (_x(4, 3, 5, 5),)),
    ("LayerNorm", lambda m: m.LayerNorm(6), (_x(3, 4, 6),)),
    ("LayerNorm-2d", lambda m: m.LayerNorm((4, 6)), (_x(3, 4, 6),)),
    ("RMSNorm", lambda m: m.RMSNorm(6), (_x(3, 4, 6),)),
    ("RMSNorm-2d-eps", lambda m: m.RMSNorm([4, 6], eps=1e-2), (_x(3, 4, 6) * 0.05,)),
    ("RMSNorm-no-affine", lambda m: m.RMSNorm(6, elementwise_affine=False), (_x(2, 6),)),
    ("GroupNorm", lambda m: m.GroupNorm(2, 4), (_x(3, 4, 5, 5),)),
    ("ReLU", lambda m: m.ReLU(), (_x(3, 4),)),
    ("GELU", lambda m: m.GELU(), (_x(3, 4),)),
    ("GELU-tanh", lambda m: m.GELU(approximate="tanh"), (_x(3, 4),)),
    ("SiLU", lambda m: m.SiLU(), (_x(3, 4),)),
    ("Tanh", lambda m: m.Tanh(), (_x(3, 4),)),
    ("Sigmoid", lambda m: m.Sigmoid(), (_x(3, 4),)),
    ("Softmax", lambda m: m.Softmax(dim=1), (_x(3, 4),)),
    ("LogSoftmax", lambda m: m.LogSoftmax(dim=-1), (_x(3, 4),)),
    ("LeakyReLU", lambda m: m.LeakyReLU(0.2), (_x(3, 4),)),
    ("MaxPool2d", lambda m: m.MaxPool2d(2), (_x(2, 3, 6, 6),)),
    ("MaxPool2d-stride", lambda m: m.MaxPool2d(3, stride=2, padding=1), (_x(2, 3, 7, 7),)),
    ("AvgPool2d", lambda m: m.AvgPool2d(2), (_x(2, 3, 6, 6),)),
    ("AdaptiveAvgPool2d", lambda m: m.AdaptiveAvgPool2d((2, 3)), (_x(2, 3, 7, 8),)),
    ("Flatten", lambda m: m.Flatten(), (_x(2, 3, 4, 5),)),
    ("Identity", lambda m: m.Identity(), (_x(2, 3),)),
    ("Sequential", lambda m: m.Sequential(m.Linear(4, 8), m.ReLU(), m.Linear(8, 2)),
     (_x(5, 4),)),
    ("MultiheadAttention", lambda m: m.MultiheadAttention(8, 2), (_x(5, 3, 8), _x(5, 3, 8, seed=1),
                                                              _x(5, 3, 8, seed=2))),
    ("MultiheadAttention-batch_first", lambda m: m.MultiheadAttention(8, 4, batch_first=True),
     (_x(3, 5, 8), _x(3, 5, 8, seed=1), _x(3, 5, 8, seed=2))),
    ("TransformerEncoderLayer", lambda m: m.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
     (_x(5, 3, 8),)),
    ("TransformerEncoderLayer-norm_first-gelu",
     lambda m: m.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                         norm_first=True, batch_first=True), (_x(3, 5, 8),)),
]


@pytest.mark.parametrize("name,make,inputs", CASES, ids=[c[0] for c in CASES])
def test_layer_matches_torch(name, make, inputs):
    torch.manual_seed(0)
    _compare(make(nn), make(torch.nn), *inputs, rtol=1e-4, atol=1e-5)


def test_batchnorm_running_stats_and_eval():
    ours, theirs = nn.BatchNorm2d(3, momentum=0.3), torch.nn.BatchNorm2d(3, momentum=0.3)
    x = _x(4, 3, 5, 5)
    for _ in range(3):
        ours(flow.tensor(x))
        theirs(torch.tensor(x))
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), 1e-5,
                               1e-6)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), 1e-5, 1e-6)
    assert ours.num_batches_tracked.item() == 3
    ours.eval()
    theirs.eval()
    np.testing.assert_allclose(ours(flow.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), 1e-5, 1e-5)


def test_embedding_and_padding_idx():
    torch.manual_seed(0)
    ours, theirs = nn.Embedding(10, 4, padding_idx=0), torch.nn.Embedding(10, 4, padding_idx=0)
    _load_from_torch(ours, theirs)
    idx = np.array([[0, 2, 5], [5, 9, 0]])
    out = ours(flow.tensor(idx))
    tout = theirs(torch.tensor(idx))
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy())
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy())


LOSSES = [
    ("CrossEntropyLoss", lambda m: m.CrossEntropyLoss(), _x(6, 5), np.array([0, 4, 2, 1, 3, 0])),
    ("CrossEntropyLoss-smooth-ignore",
     lambda m: m.CrossEntropyLoss(ignore_index=2, label_smoothing=0.1), _x(6, 5),
     np.array([0, 4, 2, 1, 3, 2])),
    ("NLLLoss", lambda m: m.NLLLoss(reduction="sum"), _x(6, 5), np.array([0, 4, 2, 1, 3, 0])),
    ("MSELoss", lambda m: m.MSELoss(), _x(4, 3), _x(4, 3, seed=1)),
    ("L1Loss", lambda m: m.L1Loss(reduction="sum"), _x(4, 3), _x(4, 3, seed=1)),
    ("SmoothL1Loss", lambda m: m.SmoothL1Loss(beta=0.5), _x(4, 3), _x(4, 3, seed=1)),
    ("BCELoss", lambda m: m.BCELoss(), 1 / (1 + np.exp(-_x(4, 3))),
     (_x(4, 3, seed=1) > 0).astype(np.float32)),
    ("BCEWithLogitsLoss", lambda m: m.BCEWithLogitsLoss(), _x(4, 3),
     (_x(4, 3, seed=1) > 0).astype(np.float32)),
]


@pytest.mark.parametrize("name,make,x,y", LOSSES, ids=[c[0] for c in LOSSES])
def test_loss_matches_torch(name, make, x, y):
    fx, tx = flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    f = make(nn)(fx, flow.tensor(y))
    t = make(torch.nn)(tx, torch.tensor(y))
    np.testing.assert_allclose(f.item(), t.item(), 1e-5, 1e-6)
    f.backward()
    t.backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), 1e-5, 1e-6)


def test_module_api_matches_torch():
    def build(m):
        net = m.Sequential(m.Conv2d(1, 2, 3), m.BatchNorm2d(2), m.ReLU(), m.Flatten(),
                           m.Linear(8, 3))
        net.head = m.ModuleDict({"a": m.Linear(3, 2)})
        return net

    ours, theirs = build(nn), build(torch.nn)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    ours.eval()
    assert not any(m.training for m in ours.modules())


def test_load_state_dict_reports_keys():
    net = nn.Linear(3, 2)
    sd = net.state_dict()
    sd["extra"] = flow.zeros(1)
    del sd["bias"]
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "bias"'):
        net.load_state_dict(sd)
    res = net.load_state_dict(sd, strict=False)
    assert res.missing_keys == ["bias"] and res.unexpected_keys == ["extra"]
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        net.load_state_dict({"weight": flow.zeros(3, 3), "bias": flow.zeros(2)})


def test_load_state_dict_takes_numpy_arrays_as_oneflow_does():
    net = nn.Linear(3, 2)
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1.0, -1.0], np.float32)
    net.load_state_dict({"weight": w.T.copy().T, "bias": b})  # a non-contiguous array too
    np.testing.assert_array_equal(net.weight.detach().numpy(), w)
    np.testing.assert_array_equal(net.bias.detach().numpy(), b)
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        net.load_state_dict({"weight": np.zeros((3, 3), np.float32), "bias": b})


def test_hooks_buffers_and_to_dtype():
    net = nn.Linear(3, 2)
    calls = []
    h1 = net.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    h2 = net.register_forward_hook(lambda m, args, out: out * 2)
    x = flow.ones(1, 3)
    y = net(x)
    assert calls == ["pre"]
    np.testing.assert_allclose(y.detach().numpy(), 2 * (x @ net.weight.T + net.bias).detach()
                               .numpy(), 1e-6)
    h1.remove()
    h2.remove()
    net(x)
    assert calls == ["pre"]
    net.register_buffer("steps", flow.zeros(1), persistent=False)
    assert "steps" not in net.state_dict()
    net.double()
    assert net.weight.dtype == flow.float64 and net.weight.requires_grad
    assert isinstance(net.weight, nn.Parameter)


def test_init_functions_statistics():
    w = flow.empty(400, 300)
    nn.init.kaiming_uniform_(w, a=0, nonlinearity="relu")
    bound = np.sqrt(6 / 300)
    a = w.numpy()
    assert a.min() >= -bound and a.max() <= bound and abs(a.std() - bound / np.sqrt(3)) < 2e-3
    nn.init.xavier_normal_(w)
    assert abs(w.numpy().std() - np.sqrt(2 / 700)) < 2e-3
    nn.init.trunc_normal_(w, std=1.0, a=-1.0, b=1.0)
    assert w.numpy().min() >= -1.0 and w.numpy().max() <= 1.0
    q = flow.empty(6, 4)
    nn.init.orthogonal_(q)
    np.testing.assert_allclose(q.numpy().T @ q.numpy(), np.eye(4), atol=1e-5)
    nn.init.constant_(q, 0.5)
    assert (q.numpy() == 0.5).all()


def test_clip_grad_norm_matches_torch():
    torch.manual_seed(0)
    tnet = torch.nn.Linear(4, 3)
    net = nn.Linear(4, 3)
    _load_from_torch(net, tnet)
    x = _x(5, 4)
    (net(flow.tensor(x)) ** 2).sum().backward()
    (tnet(torch.tensor(x)) ** 2).sum().backward()
    total = nn.utils.clip_grad_norm_(net.parameters(), 0.5)
    ttotal = torch.nn.utils.clip_grad_norm_(tnet.parameters(), 0.5)
    np.testing.assert_allclose(total.item(), ttotal.item(), 1e-5)
    for p, tp in zip(net.parameters(), tnet.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), 1e-5, 1e-6)
    nn.utils.clip_grad_value_(net.parameters(), 0.01)
    assert max(np.abs(p.grad.numpy()).max() for p in net.parameters()) <= 0.01 + 1e-7


def test_dropout_module_train_and_eval():
    flow.manual_seed(0)
    drop = nn.Dropout(0.25)
    x = flow.ones(200, 50)
    y = drop(x).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02  # 10000 draws: 4 standard deviations ~ 0.017
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), x.numpy())
    assert repr(drop) == repr(torch.nn.Dropout(0.25))


def test_containers_match_torch():
    def build(m):
        return m.ModuleList([m.Linear(2, 3), m.ReLU()]), m.ModuleDict({"a": m.Linear(3, 1)}), \
            m.ParameterList([m.Parameter(flow.zeros(2) if m is nn else torch.zeros(2))])

    ours, theirs = build(nn), build(torch.nn)
    for a, b in zip(ours, theirs):
        assert len(a) == len(b)
        assert [n for n, _ in a.named_parameters()] == [n for n, _ in b.named_parameters()]
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    assert isinstance(seq[1], nn.ReLU) and len(seq[1:]) == 2
    del seq[0]
    assert [n for n, _ in seq.named_parameters()] == ["1.weight", "1.bias"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_rms_norm_functional_matches_torch(dtype):
    x, w = _x(2, 3, 5) * 3, _x(3, 5, seed=1)
    outs = []
    for lib in (flow, torch):
        xt = lib.tensor(x).to(getattr(lib, dtype)).requires_grad_()
        wt = lib.tensor(w).to(getattr(lib, dtype)).requires_grad_()
        y = lib.nn.functional.rms_norm(xt, (3, 5), wt)
        z = lib.rms_norm(xt, [5], eps=0.5)  # the top-level name, no weight
        (y * y + z).sum().backward()
        outs.append([t.detach().float().numpy() for t in (y, z, xt.grad, wt.grad)])
        assert y.dtype == xt.dtype
    tol = 1e-2 if dtype == "bfloat16" else 1e-5
    for a, b in zip(*outs, strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("call", [
    lambda lib: lib.nn.functional.rms_norm(lib.ones(3, 5), (4,)),
    lambda lib: lib.nn.functional.rms_norm(lib.ones(3, 5), (2, 3, 5)),
    lambda lib: lib.nn.functional.rms_norm(lib.ones(3, 5), (5,), weight=lib.ones(4)),
])
def test_rms_norm_errors_match_torch(call):
    with pytest.raises((RuntimeError, ValueError)) as theirs:
        call(torch)
    with pytest.raises(type(theirs.value)) as ours:
        call(flow)
    assert str(ours.value) == str(theirs.value)


def test_rms_norm_module_repr_and_state():
    for kwargs in ({}, {"eps": 1e-6, "elementwise_affine": False}):
        ours, theirs = nn.RMSNorm([5], **kwargs), torch.nn.RMSNorm([5], **kwargs)
        assert repr(ours) == repr(theirs)
        assert list(ours.state_dict()) == list(theirs.state_dict())
