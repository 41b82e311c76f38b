"""The T1 API-fill functions on global tensors equal the single-device run (run under
`mpiexec -n N`): compositions (quantile, mode, cov, cdist, ...) and host-reading functions
(histc, unique, bincount) on inputs split S(0), S(1) or broadcast; values, and gradients
where the function has one.  Each rank prints `rank R: api fill T1 global check passed
(N cases)` and exits non-zero on any failure.
"""

from __future__ import annotations

import sys

import numpy as np

import sbpflow as flow

FNS = {
    "quantile": (lambda m, t: m.quantile(t, 0.3, dim=1), True),
    "nanquantile": (lambda m, t: m.nanquantile(t, 0.6), True),
    "nanmedian": (lambda m, t: m.nanmedian(t, 1)[0], True),
    "mode": (lambda m, t: m.mode(t.round(), 0)[0], False),
    "kthvalue": (lambda m, t: m.kthvalue(t, 2, 0)[0], True),
    "cummax": (lambda m, t: m.cummax(t, 1)[0], True),
    "cummin_indices": (lambda m, t: m.cummin(t, 0)[1], False),
    "logcumsumexp": (lambda m, t: m.logcumsumexp(t, 0), True),
    "cdist": (lambda m, t: m.cdist(t, t * 2), True),
    "cov": (lambda m, t: m.cov(t), True),
    "corrcoef": (lambda m, t: m.corrcoef(t), True),
    "histc": (lambda m, t: m.histc(t, 5), False),
    "isin": (lambda m, t: m.isin(t.round(), t[0].round()), False),
    "searchsorted": (lambda m, t: m.searchsorted(m.sort(t, 1)[0], t), False),
    "renorm": (lambda m, t: m.renorm(t, 2, 0, 1.0), True),
    "trapezoid": (lambda m, t: m.trapezoid(t, dim=0), True),
    "cumulative_trapezoid": (lambda m, t: m.cumulative_trapezoid(t), True),
    "nansum": (lambda m, t: m.nansum(t, 0), True),
    "nanmean": (lambda m, t: m.nanmean(t, 1), True),
    "aminmax": (lambda m, t: m.aminmax(t, dim=0)[1], True),
    "xlogy": (lambda m, t: m.xlogy(t, t.abs()), True),
    "logaddexp": (lambda m, t: m.logaddexp(t, t.flip(0)), True),
    "hypot": (lambda m, t: m.hypot(t, t.flip(1)), True),
    "sinc": (lambda m, t: m.sinc(t), True),
    "copysign": (lambda m, t: m.copysign(t, t.flip(0)), True),
    "frexp": (lambda m, t: m.frexp(t)[0], True),
    "nextafter": (lambda m, t: m.nextafter(t, t.flip(0)), False),
    "unique": (lambda m, t: m.unique(t.round()), False),
    "bincount": (lambda m, t: m.bincount(t.abs().round().long().reshape(-1)), False),
    "gcd": (lambda m, t: m.gcd(t.long(), t.long() + 3), False),
    "inner": (lambda m, t: m.inner(t, t), True),
    "addr": (lambda m, t: m.addr(t[:, :4], t[:, 0], t[1, :4]), True),
    "isclose": (lambda m, t: m.isclose(t, t.round(), atol=0.3), False),
}


def main() -> int:
    rank = flow.env.get_rank()
    p = flow.placement("cpu", list(range(flow.env.get_world_size())))
    x = np.random.default_rng(0).standard_normal((6, 6)) * 2
    failures, cases = 0, 0
    for sbp in (flow.sbp.split(0), flow.sbp.split(1), flow.sbp.broadcast):
        for name, (fn, grad) in FNS.items():
            cases += 1
            try:
                local = flow.tensor(x, requires_grad=grad)
                glob = flow.tensor(x).to_global(p, flow.sbp.broadcast).to_global(p, sbp)
                glob.requires_grad_(grad)
                want, got = fn(flow, local), fn(flow, glob)
                value = got.detach().to_global(p, flow.sbp.broadcast).to_local().numpy()
                ok = np.allclose(value, want.detach().numpy(), equal_nan=True, atol=1e-10)
                if grad:
                    want.sum().backward()
                    got.sum().backward()
                    g = glob.grad.to_global(p, flow.sbp.broadcast).to_local().numpy()
                    ok = ok and np.allclose(g, local.grad.numpy(), atol=1e-10)
                if not ok:
                    failures += 1
                    print(f"rank {rank}: MISMATCH {name} {sbp}", flush=True)
            except Exception as e:  # report every case, then fail
                failures += 1
                print(f"rank {rank}: FAILED {name} {sbp}: {type(e).__name__}: {e}", flush=True)
    if failures:
        print(f"rank {rank}: api fill T1 global check: {failures} failures", flush=True)
        return 1
    print(f"rank {rank}: api fill T1 global check passed ({cases} cases)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
