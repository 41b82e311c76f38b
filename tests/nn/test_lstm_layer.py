"""The fused LSTM layer: `lstm_layer` / `lstm_layer_backward` (ops/rnn.py) and the numba step
loops behind them (primitives `lstm_step` / `lstm_step_grad`, device/_jit.py).

nn.LSTM runs a padded sequence through one `lstm_layer` op per layer and direction; the op's
kernel loops over time steps and calls the step loop, or composes the other primitives where
a device has no loop.  Checked here: the loops against float64 formulas (NaN, inf, tiny and
large values), the loop and the composed kernel against each other and against torch, and
that the module really takes this path (ops and primitive calls counted).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.device import _jit, primitives
from sbpflow.device.primitives import Primitives
from sbpflow.ops import registry

pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba is not installed")
P = Primitives()
TOL = {np.float32: dict(rtol=2e-6, atol=1e-7), np.float64: dict(rtol=1e-13, atol=1e-15)}


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _step_formula(pre, h, c):
    """One step in float64 NumPy: (reserve row, h, c)."""
    hs = c.shape[1]
    i, f, g, o = (pre[:, k * hs:(k + 1) * hs] for k in range(4))
    i, f, g, o = _sig(i), _sig(f), np.tanh(g), _sig(o)
    c_new = f * c + i * g
    tc = np.tanh(c_new)
    return np.concatenate([h, c, tc, i, f, g, o], 1), o * tc, c_new


def _data(shape, dtype, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows,hs", [(1, 1), (3, 5), (16, 33)])
def test_step_loop_matches_formula(dtype, rows, hs):
    proj, hw = _data((rows, 4 * hs), dtype, 1), _data((rows, 4 * hs), dtype, 2)
    # tiny, moderate and huge pre-activations (tanh's series branch, saturation)
    proj[:, :1] = np.array([1e-9, -3e-3, 40.0], dtype)[:1]
    h, c = _data((rows, hs), dtype, 3), _data((rows, hs), dtype, 4)
    r = np.empty((rows, 7 * hs), dtype)
    h_out = np.empty((rows, hs), dtype)
    c_new = P.lstm_step(proj, hw, h, c, r, h_out)
    pre = proj.astype(np.float64) + hw.astype(np.float64)
    want_r, want_h, want_c = _step_formula(pre, h.astype(np.float64), c.astype(np.float64))
    np.testing.assert_allclose(r, want_r, **TOL[dtype])
    np.testing.assert_allclose(c_new, want_c, **TOL[dtype])
    np.testing.assert_allclose(h_out, want_h, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_loop_special_values(dtype):
    hs = 4
    proj = np.array([[np.nan, np.inf, -np.inf, 0.0, 1e-30, -1e-30, 710.0, -710.0,
                      0.03, -0.03, 0.0312, 20.0, -20.0, 1e-5, 5.0, -1.0]], dtype)
    hw = np.zeros_like(proj)
    h, c = np.zeros((1, hs), dtype), np.array([[1.0, -2.0, 0.5, 0.0]], dtype)
    r, h_out = np.empty((1, 7 * hs), dtype), np.empty((1, hs), dtype)
    c_new = P.lstm_step(proj, hw, h, c, r, h_out)
    with np.errstate(all="ignore"):
        want_r, want_h, want_c = _step_formula(proj.astype(np.float64), h.astype(np.float64),
                                               c.astype(np.float64))
    np.testing.assert_allclose(r, want_r, **TOL[dtype])  # NaN where the formula has NaN
    np.testing.assert_allclose(c_new, want_c, **TOL[dtype])
    np.testing.assert_allclose(h_out, want_h, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_grad_loop_matches_formula(dtype):
    rows, hs = 5, 7
    g_t, dh, dc = (_data((rows, hs), dtype, s) for s in (5, 6, 7))
    r = _data((rows, 7 * hs), dtype, 8, 1.0)
    d = np.empty((rows, 4 * hs), dtype)
    dc_prev = P.lstm_step_grad(g_t, dh, dc, r, d)
    g64 = [a.astype(np.float64) for a in (g_t, dh, dc, r)]
    gh = g64[0] + g64[1]
    _, cp, tc, i, f, g, o = (g64[3][:, k * hs:(k + 1) * hs] for k in range(7))
    dcc = g64[2] + gh * o * (1 - tc * tc)
    want = np.concatenate([dcc * g * i * (1 - i), dcc * cp * f * (1 - f), dcc * i * (1 - g * g),
                           gh * tc * o * (1 - o)], 1)
    np.testing.assert_allclose(d, want, **TOL[dtype])
    np.testing.assert_allclose(dc_prev, dcc * f, **TOL[dtype])


def test_loops_decline_what_they_do_not_handle():
    a = np.zeros((2, 8), np.float32)
    h = np.zeros((2, 2), np.float32)
    r = np.zeros((2, 14), np.float32)
    assert P.lstm_step(a, a, h, h.astype(np.float64), r, h.copy()) is None  # mixed dtypes
    assert P.lstm_step(a.astype(np.int32), a.astype(np.int32), h.astype(np.int32),
                       h.astype(np.int32), r.astype(np.int32), h.astype(np.int32)) is None
    assert P.lstm_step(a, a, h, h, r[:, ::2], h.copy()) is None  # a strided reserve row
    assert P.lstm_step_grad(h, h, h, r, np.empty((2, 8), np.float64)) is None


def _run_lstm(device, x, state, kwargs, dtype):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(3, 5, dtype=torch.float64, **kwargs)
    m = flow.nn.LSTM(3, 5, **kwargs).to(dtype)
    m.load_state_dict({k: flow.tensor(v.detach().numpy(), dtype=dtype)
                       for k, v in ref.state_dict().items()})
    m = m.to(device)
    fx = flow.tensor(x, dtype=dtype, device=device, requires_grad=True)
    h0, c0 = (flow.tensor(s, dtype=dtype, device=device, requires_grad=True) for s in state)
    out, (hn, cn) = m(fx, (h0, c0))
    (out.pow(2).sum() + hn.sum() * 0.5 + (cn * cn).sum() * 0.25).backward()
    grads = [fx.grad, h0.grad, c0.grad] + [p.grad for p in m.parameters()]
    tx = torch.tensor(x, requires_grad=True)
    th0, tc0 = (torch.tensor(s, requires_grad=True) for s in state)
    tout, (thn, tcn) = ref(tx, (th0, tc0))
    (tout.pow(2).sum() + thn.sum() * 0.5 + (tcn * tcn).sum() * 0.25).backward()
    tgrads = [tx.grad, th0.grad, tc0.grad] + [p.grad for p in ref.parameters()]
    return [out, hn, cn] + grads, [tout, thn, tcn] + tgrads


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True},
                                    {"batch_first": True, "bias": False}])
@pytest.mark.parametrize("dtype", [flow.float64, flow.float32])
def test_loop_and_composed_kernels_agree_with_torch(monkeypatch, kwargs, dtype):
    """The same module on the cpu device (numba step loops) and with the loops declined (the
    kernel composes primitives): both equal torch's LSTM, outputs and every gradient."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 3) if kwargs.get("batch_first") else (6, 4, 3))
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    state = (rng.standard_normal((layers, 4, 5)), rng.standard_normal((layers, 4, 5)))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == flow.float64 else dict(rtol=2e-4, atol=2e-5)
    looped, want = _run_lstm("cpu", x, state, kwargs, dtype)
    monkeypatch.setattr(Primitives, "lstm_step", lambda self, *a: None)
    monkeypatch.setattr(Primitives, "lstm_step_grad", lambda self, *a: None)
    composed, _ = _run_lstm("cpu", x, state, kwargs, dtype)
    for k, (a, b, t) in enumerate(zip(looped, composed, want)):
        np.testing.assert_allclose(a.detach().numpy(), t.detach().numpy(), **tol,
                                   err_msg=f"loop, value {k}")
        np.testing.assert_allclose(b.detach().numpy(), t.detach().numpy(), **tol,
                                   err_msg=f"composed, value {k}")


def _count_kernels(monkeypatch, names):
    counts = dict.fromkeys(names, 0)
    for name in names:
        opdef = registry.get(name)

        def counted(*args, _kernel=opdef.kernel, _name=name, **kw):
            counts[_name] += 1
            return _kernel(*args, **kw)

        monkeypatch.setattr(opdef, "kernel", counted)
        monkeypatch.setattr(opdef, "plans", {})  # call plans hold the kernel they were made with
    return counts


def test_module_runs_one_layer_op_per_direction(monkeypatch):
    """A 2-layer bidirectional LSTM over 7 steps: 4 lstm_layer ops forward, 4
    lstm_layer_backward ops backward, and no per-step cell op."""
    counts = _count_kernels(monkeypatch, ("lstm_layer", "lstm_layer_backward", "lstm_cell",
                                          "lstm_cell_backward"))
    m = flow.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    out, _ = m(flow.randn(7, 2, 3, requires_grad=True))
    out.sum().backward()
    flow.synchronize()
    assert counts == {"lstm_layer": 4, "lstm_layer_backward": 4, "lstm_cell": 0,
                      "lstm_cell_backward": 0}


@pytest.mark.parametrize("reverse", [False, True])
def test_layer_op_runs_the_step_loops_once_per_step(reverse):
    """On the mock device (which counts primitive calls): one lstm_step per time step forward
    and one lstm_step_grad per step backward; the result equals the cpu device's."""
    prims = primitives("mock")
    names = ("lstm_step", "lstm_step_grad")
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(s) for s in ((5, 2, 12), (2, 3), (2, 3), (12, 3))]

    def run(device):
        ins = [flow.tensor(a, device=device, requires_grad=True) for a in arrays]
        out, c_n, _ = registry.op("lstm_layer", *ins, reverse=reverse)
        (out.sum() + c_n.sum()).backward()
        return [out, c_n] + [t.grad for t in ins]

    before = {n: prims.calls[n] for n in names}
    mock = run("mock")
    flow.synchronize()
    calls = {n: prims.calls[n] - before[n] for n in names}
    assert calls["lstm_step"] == 5 and calls["lstm_step_grad"] == 5, calls
    for a, b in zip(mock, run("cpu")):
        np.testing.assert_array_equal(np.asarray(a.detach()._host()), b.detach().numpy())


def test_packed_and_projected_lstms_keep_the_step_path(monkeypatch):
    """proj_size and packed sequences still run step by step (lstm_cell per step)."""
    seen = []
    opdef = registry.get("lstm_cell")
    kernel = opdef.kernel
    monkeypatch.setattr(opdef, "kernel", lambda *a, **k: (seen.append(1), kernel(*a, **k))[1])
    monkeypatch.setattr(opdef, "plans", {})  # call plans hold the kernel they were made with
    flow.nn.LSTM(3, 4, proj_size=2)(flow.randn(5, 2, 3))
    flow.synchronize()
    assert len(seen) == 5


def test_layer_op_errors_name_the_argument():
    proj, h = flow.zeros(3, 2, 8), flow.zeros(2, 2)
    w = flow.zeros(8, 2)
    with pytest.raises(RuntimeError, match=r"lstm_layer.*'w_hh'.*\[8, 2\].*\[8, 3\]"):
        registry.op("lstm_layer", proj, h, h, flow.zeros(8, 3))
    with pytest.raises(RuntimeError, match=r"lstm_layer.*'c0'.*\[2, 2\].*\[3, 2\]"):
        registry.op("lstm_layer", proj, h, flow.zeros(3, 2), w)
    with pytest.raises(RuntimeError, match=r"lstm_layer.*'h0'.*float32.*float64"):
        registry.op("lstm_layer", proj, h.double(), h, w)
