"""Run under `mpiexec -n 2`: distributions on global tensors equal the single-device result
(log_prob, entropy, KL and their gradients), and rsample/sample give one logical draw."""

from __future__ import annotations

import numpy as np

import sbpflow as flow
import sbpflow.distributions as D


def _np(t):
    return (t.to_global(sbp=flow.sbp.broadcast).to_local() if t.is_global else t).detach().numpy()


def main():
    rank = flow.env.get_rank()
    pl = flow.placement("cpu", [0, 1])
    rng = np.random.default_rng(0)  # same numbers on every rank
    loc = rng.standard_normal((4, 3)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, (4, 3)).astype(np.float32)
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    value = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([0, 4, 2, 1])
    checks = 0
    for sbp in [flow.sbp.split(0), flow.sbp.broadcast]:
        def glob(a, grad=False, sbp=sbp):
            # every rank holds the whole array: make it broadcast, then lay it out as `sbp`
            t = flow.tensor(a).to_global(placement=pl, sbp=flow.sbp.broadcast).to_global(sbp=sbp)
            return t.requires_grad_() if grad else t

        gl, gs, glg = glob(loc, True), glob(scale, True), glob(logits, True)
        ll, ls, llg = (flow.tensor(a, requires_grad=True) for a in (loc, scale, logits))
        outs = []
        for lo, sc, lg, v, ix in [(gl, gs, glg, glob(value), glob(idx)),
                                  (ll, ls, llg, flow.tensor(value), flow.tensor(idx))]:
            n, q = D.Normal(lo, sc), D.Normal(sc, sc * 2)
            c = D.Categorical(logits=lg)
            total = (n.log_prob(v).sum() + n.entropy().sum() + D.kl_divergence(n, q).sum()
                     + c.log_prob(ix).sum() + c.entropy().sum()
                     + D.kl_divergence(c, D.Categorical(logits=lg * 0.5)).sum())
            total.backward()
            outs.append([total, lo.grad, sc.grad, lg.grad])
        for g, loc_ in zip(*outs, strict=True):
            np.testing.assert_allclose(_np(g), loc_.detach().numpy(), rtol=1e-5, atol=1e-6)
            checks += 1
        before = _np(gl.grad).copy()  # numpy() may share the grad buffer
        flow.manual_seed(5)
        x = D.Normal(gl, gs).rsample((2,))
        assert x.is_global and tuple(x.shape) == (2, 4, 3)
        full = _np(x)
        eps = (full - loc) / scale
        assert np.isfinite(eps).all() and eps.std() > 0.3
        x.sum().backward()  # pathwise gradient reaches the global parameter
        np.testing.assert_allclose(_np(gl.grad), before + 2.0, rtol=1e-5, atol=1e-5)
        s = D.Categorical(logits=glg).sample((3,))
        assert s.is_global and tuple(s.shape) == (3, 4)
        assert ((_np(s) >= 0) & (_np(s) < 5)).all()
        checks += 2
    print(f"rank {rank}: distributions global check passed ({checks} checks)", flush=True)


if __name__ == "__main__":
    main()
