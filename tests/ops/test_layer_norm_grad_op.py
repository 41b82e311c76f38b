"""layer_norm's backward as one op (`layer_norm_grad`, a row loop where the device has it),
and a double backward through the composed, differentiable rule; torch as the oracle."""

from __future__ import annotations

import numpy as np
import torch

import sbpflow as flow
from sbpflow.device.primitives import Primitives


def _run(lib, x, w, b, gy, create_graph=False, after_grad=lambda: None):
    tx = lib.tensor(x, requires_grad=True)
    tw, tb = lib.tensor(w, requires_grad=True), lib.tensor(b, requires_grad=True)
    y = lib.nn.functional.layer_norm(tx, (x.shape[-1],), tw, tb, 1e-5)
    if not create_graph:
        (y * lib.tensor(gy)).sum().backward()
        return [t.grad.detach().numpy() for t in (tx, tw, tb)]
    gx, gw = lib.autograd.grad((y * y * lib.tensor(gy)).sum(), (tx, tw), create_graph=True)
    after_grad()
    ((gx * gx).sum() + (gw * gw).sum()).backward()
    return [t.grad.detach().numpy() for t in (tx, tw, tb)]


def _data(dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 3, 10)) * 2 + 1).astype(dtype)
    w, b = rng.standard_normal(10).astype(dtype), rng.standard_normal(10).astype(dtype)
    return x, w, b, rng.standard_normal(x.shape).astype(dtype)


def test_layer_norm_backward_is_one_loop_and_matches_torch(monkeypatch):
    calls = []
    original = Primitives.layer_norm_grad_rows

    def counted(self, *args):
        out = original(self, *args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(Primitives, "layer_norm_grad_rows", counted)
    for dtype, tol in (("float32", 1e-4), ("float64", 1e-10)):
        got, want = _run(flow, *_data(dtype)), _run(torch, *_data(dtype))
        for a, e in zip(got, want, strict=True):
            np.testing.assert_allclose(a, e, rtol=tol, atol=tol)
    assert calls == [True, True]


def test_double_backward_through_layer_norm_matches_torch(monkeypatch):
    calls = []
    original = Primitives.layer_norm_grad_rows
    monkeypatch.setattr(Primitives, "layer_norm_grad_rows",
                        lambda self, *a: calls.append(1) or original(self, *a))
    seen = []
    got = _run(flow, *_data("float64"), create_graph=True,
               after_grad=lambda: seen.append(len(calls)))
    assert seen == [0]  # building the differentiable gradient composed ops
    want = _run(torch, *_data("float64"), create_graph=True)
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-9, atol=1e-10)
