"""torch.linalg's functions on global tensors equal the single-device run (run under
`mpiexec -n N`): the compositions (norms, pinv, lstsq, matrix_exp, solve_triangular, ...)
make helper tensors (identities, empty fields) that must follow the input's placement.

Each case runs on local tensors (the oracle) and on global ones split S(0) over the batch or
broadcast; values and gradients must agree.  Each rank prints
`rank R: linalg global check passed (N cases)`.
"""

from __future__ import annotations

import numpy as np

import sbpflow as flow
from sbpflow.sbp import B, S

L = flow.linalg


def _square(rng, *shape):
    """Random, plus n I when square (well-conditioned)."""
    x = rng.standard_normal(shape)
    return x + shape[-1] * np.eye(shape[-1]) if shape[-1] == shape[-2] else x


def _spd(rng, *shape):
    x = rng.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


def _first(out):
    return out[0] if isinstance(out, tuple) else out


CASES = [
    ("inv", lambda a: L.inv(a), _square, (4, 3, 3)),
    ("det", lambda a: L.det(a), _square, (4, 3, 3)),
    ("logdet", lambda a: flow.logdet(a), _square, (4, 3, 3)),
    ("solve", lambda a: L.solve(a, a.sum(-1)), _square, (4, 3, 3)),
    ("cholesky", lambda a: L.cholesky(a), _spd, (4, 3, 3)),
    ("cholesky_ex", lambda a: L.cholesky_ex(a).L, _spd, (4, 3, 3)),
    ("eigh", lambda a: L.eigh(a).eigenvectors, _spd, (4, 3, 3)),
    ("svd", lambda a: L.svd(a, full_matrices=False).S, _square, (4, 3, 2)),
    ("old svd without uv", lambda a: flow.svd(a, compute_uv=False)[0] + 1, _square, (4, 3, 2)),
    ("qr", lambda a: L.qr(a).R, _square, (4, 3, 3)),
    ("matrix_norm nuc", lambda a: L.matrix_norm(a, "nuc"), _square, (4, 3, 3)),
    ("matrix_norm inf", lambda a: L.matrix_norm(a, float("inf")), _square, (4, 3, 3)),
    ("norm", lambda a: L.norm(a, dim=(1, 2)), _square, (4, 3, 3)),
    ("pinv", lambda a: L.pinv(a), _square, (4, 3, 2)),
    ("matrix_rank", lambda a: L.matrix_rank(a), _square, (4, 3, 3)),
    ("lstsq gelsd", lambda a: L.lstsq(a, a.sum(-1, keepdim=True), driver="gelsd").solution,
     _square, (4, 3, 2)),
    ("lstsq gels rank", lambda a: L.lstsq(a, a.sum(-1, keepdim=True), driver="gels").rank,
     _square, (4, 3, 2)),
    ("solve_triangular unit", lambda a: L.solve_triangular(a, a, upper=True,
                                                           unitriangular=True), _square,
     (4, 3, 3)),
    ("matrix_power 0", lambda a: L.matrix_power(a, 0), _square, (4, 3, 3)),
    ("matrix_power -2", lambda a: L.matrix_power(a, -2), _square, (4, 3, 3)),
    ("matrix_exp", lambda a: L.matrix_exp(a * 0.3), _square, (4, 3, 3)),
    ("cholesky_solve", lambda a: flow.cholesky_solve(a, L.cholesky(a)), _spd, (4, 3, 3)),
    ("cross", lambda a: L.cross(a, a.flip(-1)), _square, (4, 3, 3)),
    ("cond", lambda a: L.cond(a, "fro"), _square, (4, 3, 3)),
    ("lu_factor", lambda a: L.lu_factor(a).LU, _square, (4, 3, 3)),
    ("lu P", lambda a: L.lu(a).P, _square, (4, 3, 3)),
    ("lu U", lambda a: L.lu(a).U, _square, (4, 3, 3)),
    ("lu_solve", lambda a: L.lu_solve(*L.lu_factor(a), a), _square, (4, 3, 3)),
    ("lu_solve adjoint", lambda a: L.lu_solve(*L.lu_factor(a), a, adjoint=True), _square,
     (4, 3, 3)),
]


def run(fn, a, placement, sbp):
    t = (flow.tensor(a, requires_grad=True) if placement is None
         else flow.tensor(a, placement=placement, sbp=sbp, requires_grad=True))
    out = _first(fn(t))
    value = out.detach().numpy()
    if out.requires_grad:
        out.sum().backward()
        return value, t.grad.numpy()
    return value, None


def main() -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    placement = flow.placement("cpu", list(range(world)))
    count = 0
    for name, fn, make, shape in CASES:
        a = make(np.random.default_rng(0), *shape)
        want = run(fn, a, None, None)
        for sbp in (S(0), B):
            try:
                got = run(fn, a, placement, sbp)
            except Exception as e:
                raise AssertionError(f"{name} with {sbp}: {e}") from e
            for w, g, what in zip(want, got, ("value", "gradient")):
                if w is None:
                    assert g is None, f"{name} {sbp}: {what}"
                    continue
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10,
                                           err_msg=f"{name} with {sbp}: {what}")
            count += 1
    print(f"rank {rank}: linalg global check passed ({count} cases)", flush=True)


if __name__ == "__main__":
    main()
