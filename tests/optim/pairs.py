"""The harness the optimizer tests share: the same parameters and gradients stepped by an
sbpflow optimizer and by torch's, side by side."""

from __future__ import annotations

import numpy as np
import torch

import sbpflow as flow
from sbpflow import optim

STEPS = 20
# (rtol, atol) for trajectories after STEPS updates.
TOL = {"float64": (1e-10, 1e-12), "float32": (2e-5, 2e-6)}


def _ids(cfg):
    name, kw = cfg
    return name + "-" + ",".join(f"{k}={v}" for k, v in kw.items())


def _data(dtype, seed=0):
    """Initial weights of two parameters and STEPS gradients for each."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,)]
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(STEPS)]
    return init, grads


def _skips(step: int, i: int) -> bool:
    # The second parameter has no gradient on every third step: its state must not advance.
    return i == 1 and step % 3 == 2


class _Pair:
    """The same parameters and optimizer in sbpflow and torch."""

    def __init__(self, name, kw, init, groups=False):
        self.fp = [flow.tensor(a.copy(), requires_grad=True) for a in init]
        self.tp = [torch.tensor(a.copy(), requires_grad=True) for a in init]
        if groups:
            lr = kw.get("lr", 1.0)
            fparams = [{"params": [self.fp[0]]}, {"params": [self.fp[1]], "lr": lr / 2}]
            tparams = [{"params": [self.tp[0]]}, {"params": [self.tp[1]], "lr": lr / 2}]
        else:
            fparams, tparams = self.fp, self.tp
        # foreach=False: torch's single-tensor path, the one we follow (and the same group keys).
        self.fopt = getattr(optim, name)(fparams, foreach=False, **kw)
        self.topt = getattr(torch.optim, name)(tparams, foreach=False, **kw)

    def step(self, k, grads):
        for i, (f, t) in enumerate(zip(self.fp, self.tp, strict=True)):
            if _skips(k, i):
                f.grad, t.grad = None, None
            else:
                f.grad = flow.tensor(grads[k][i].copy())
                t.grad = torch.tensor(grads[k][i].copy())
        self.fopt.step()
        self.topt.step()

    def check(self, dtype, what="", tol=None):
        rtol, atol = (tol or TOL)[np.dtype(dtype).name]
        for i, (f, t) in enumerate(zip(self.fp, self.tp, strict=True)):
            np.testing.assert_allclose(f.detach().numpy(), t.detach().numpy(), rtol=rtol,
                                       atol=atol, err_msg=f"param {i} {what}")
