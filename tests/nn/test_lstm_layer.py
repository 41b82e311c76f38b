"""The fused recurrent layers: `lstm_layer` / `gru_layer` and their backward ops (ops/rnn.py),
and the numba step loops behind them (primitives `lstm_step`, `gru_step` and their grads,
device/_jit.py).

nn.LSTM and nn.GRU run a padded sequence through one layer op per layer and direction; the
op's kernel loops over time steps and calls the step loop, or composes the other primitives
where a device has no loop.  Checked here: the loops against float64 formulas (NaN, inf, tiny and
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


def _run(name, x, state, kwargs, dtype):
    """Our module (weights from torch's) and torch's, float64 oracle: outputs, final states
    and the gradients of inputs, states and parameters."""
    torch.manual_seed(0)
    ref = getattr(torch.nn, name)(3, 5, dtype=torch.float64, **kwargs)
    m = getattr(flow.nn, name)(3, 5, **kwargs).to(dtype)
    m.load_state_dict({k: flow.tensor(v.detach().numpy(), dtype=dtype)
                       for k, v in ref.state_dict().items()})

    def go(lib, mod, leaf):
        xs = leaf(x)
        hs = [leaf(v) for v in state]
        out, hn = mod(xs, tuple(hs) if name == "LSTM" else hs[0])
        finals = list(hn) if name == "LSTM" else [hn]
        loss = out.pow(2).sum()
        for k, f in enumerate(finals):
            loss = loss + (f * f).sum() * (0.5 + k)
        loss.backward()
        return [out] + finals + [xs.grad] + [v.grad for v in hs] + [q.grad for q in
                                                                    mod.parameters()]

    ours = go(flow, m, lambda a: flow.tensor(a, dtype=dtype, requires_grad=True))
    theirs = go(torch, ref, lambda a: torch.tensor(a, requires_grad=True))
    return ours, theirs


@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True},
                                    {"batch_first": True, "bias": False}])
@pytest.mark.parametrize("dtype", [flow.float64, flow.float32])
@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_loop_and_composed_kernels_agree_with_torch(monkeypatch, name, kwargs, dtype):
    """The same module with the numba step loops and with the loops declined (the kernels
    compose primitives): both equal torch's, outputs, final states and every gradient."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 3) if kwargs.get("batch_first") else (6, 4, 3))
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    state = [rng.standard_normal((layers, 4, 5)) for _ in range(2 if name == "LSTM" else 1)]
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == flow.float64 else dict(rtol=2e-4, atol=2e-5)
    op = name.lower()
    loops = {f"{op}_step": 0, f"{op}_step_grad": 0}
    for prim in loops:
        real = getattr(Primitives, prim)

        def counted(self, *a, _real=real, _prim=prim):
            out = _real(self, *a)
            loops[_prim] += out is not None  # the loop ran (it did not decline)
            return out

        monkeypatch.setattr(Primitives, prim, counted)
    looped, want = _run(name, x, state, kwargs, dtype)
    steps = 6 * kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    assert loops == dict.fromkeys(loops, steps)
    for prim in ("lstm_step", "lstm_step_grad", "gru_step", "gru_step_grad"):
        monkeypatch.setattr(Primitives, prim, lambda self, *a: None)
    composed, _ = _run(name, x, state, kwargs, dtype)
    assert len(looped) == len(want) == len(composed)
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
        monkeypatch.setattr(opdef, "local_calls", {})  # cached calls hold their kernel
    return counts


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_module_runs_one_layer_op_per_direction(monkeypatch, name):
    """A 2-layer bidirectional LSTM/GRU over 7 steps: 4 layer ops forward, 4 layer backward
    ops, and no per-step cell op."""
    op = name.lower()
    counts = _count_kernels(monkeypatch, (f"{op}_layer", f"{op}_layer_backward", f"{op}_cell",
                                          f"{op}_cell_backward"))
    m = getattr(flow.nn, name)(3, 4, num_layers=2, bidirectional=True)
    out, _ = m(flow.randn(7, 2, 3, requires_grad=True))
    out.sum().backward()
    flow.synchronize()
    assert counts == {f"{op}_layer": 4, f"{op}_layer_backward": 4, f"{op}_cell": 0,
                      f"{op}_cell_backward": 0}


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("name,shapes", [
    ("lstm", ((5, 2, 12), (2, 3), (2, 3), (12, 3))),
    ("gru", ((5, 2, 9), (2, 3), (9, 3), (9,)))])
def test_layer_op_runs_the_step_loops_once_per_step(reverse, name, shapes):
    """On the mock device (which counts primitive calls): one step loop per time step forward
    and one step-gradient loop per step backward; the result equals the cpu device's."""
    prims = primitives("mock")
    names = (f"{name}_step", f"{name}_step_grad")
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(s) for s in shapes]

    def run(device):
        ins = [flow.tensor(a, device=device, requires_grad=True) for a in arrays]
        outs = registry.op(f"{name}_layer", *ins, reverse=reverse)
        sum(o.sum() for o in outs if o.requires_grad).backward()
        return list(outs[:-1]) + [t.grad for t in ins]

    before = {n: prims.calls[n] for n in names}
    mock = run("mock")
    flow.synchronize()
    assert {n: prims.calls[n] - before[n] for n in names} == dict.fromkeys(names, 5)
    for a, b in zip(mock, run("cpu")):
        np.testing.assert_array_equal(np.asarray(a.detach()._host()), b.detach().numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_step_loops_match_formula(dtype):
    rows, hs = 4, 6
    proj, gh = _data((rows, 3 * hs), dtype, 11), _data((rows, 3 * hs), dtype, 12)
    h = _data((rows, hs), dtype, 13)
    r, h_out = np.empty((rows, 5 * hs), dtype), np.empty((rows, hs), dtype)
    assert P.gru_step(proj, gh, h, r, h_out)
    p64, g64, h64 = (a.astype(np.float64) for a in (proj, gh, h))
    rg = _sig(p64[:, :hs] + g64[:, :hs])
    z = _sig(p64[:, hs:2 * hs] + g64[:, hs:2 * hs])
    n = np.tanh(p64[:, 2 * hs:] + rg * g64[:, 2 * hs:])
    np.testing.assert_allclose(r, np.concatenate([h64, rg, z, n, g64[:, 2 * hs:]], 1),
                               **TOL[dtype])
    np.testing.assert_allclose(h_out, n + z * (h64 - n), **TOL[dtype])
    g_t, dh = _data((rows, hs), dtype, 14), _data((rows, hs), dtype, 15)
    d_gi, d_gh = np.empty((rows, 3 * hs), dtype), np.empty((rows, 3 * hs), dtype)
    part = P.gru_step_grad(g_t, dh, r, d_gi, d_gh)
    g = g_t.astype(np.float64) + dh.astype(np.float64)
    hp, rg, z, n, ghn = (r.astype(np.float64)[:, k * hs:(k + 1) * hs] for k in range(5))
    dn = g * (1 - z) * (1 - n * n)
    dz = g * (hp - n) * z * (1 - z)
    dr = dn * ghn * rg * (1 - rg)
    np.testing.assert_allclose(d_gi, np.concatenate([dr, dz, dn], 1), **TOL[dtype])
    np.testing.assert_allclose(d_gh, np.concatenate([dr, dz, dn * rg], 1), **TOL[dtype])
    np.testing.assert_allclose(part, g * z, **TOL[dtype])


def test_projected_lstms_keep_the_step_path(monkeypatch):
    """proj_size still runs step by step (lstm_cell per step)."""
    seen = []
    opdef = registry.get("lstm_cell")
    kernel = opdef.kernel
    monkeypatch.setattr(opdef, "kernel", lambda *a, **k: (seen.append(1), kernel(*a, **k))[1])
    monkeypatch.setattr(opdef, "local_calls", {})  # cached calls hold their kernel
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
