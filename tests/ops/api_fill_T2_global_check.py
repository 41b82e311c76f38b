"""The shape/index compositions of tests/ops/test_api_fill_T2.py on global tensors equal the
local run (run under `mpiexec -n N`): values and gradients, for inputs broadcast and split
along either axis.  They build helper tensors (index vectors, masks, identity fills) that must
follow the input's placement, and the *_scatter functions write through views that a split
axis cannot give.  Each rank prints `rank R: api fill T2 global check passed (N cases)`.
"""

from __future__ import annotations

import numpy as np

import sbpflow as flow
from sbpflow.sbp import B, S

X = np.random.default_rng(3).standard_normal((4, 6))


def _idx(x, values):
    """An int64 index tensor placed like x."""
    t = flow.tensor(values)
    return t.to_global(x.placement, (B,) * len(x.sbp)) if x.is_global else t


CASES = [
    ("broadcast_to", lambda x: flow.broadcast_to(x, (2, 4, 6))),
    ("broadcast_tensors", lambda x: flow.broadcast_tensors(x, x[:1])[1]),
    ("meshgrid", lambda x: flow.meshgrid(x[0], x[:, 0], indexing="xy")[0]),
    ("hstack", lambda x: flow.hstack([x, x * 2])),
    ("vstack", lambda x: flow.vstack([x, x[0]])),
    ("column_stack", lambda x: flow.column_stack([x, x[:, 0]])),
    ("atleast_3d", lambda x: flow.atleast_3d(x)),
    ("diag_embed", lambda x: flow.diag_embed(x, 1)),
    ("diag", lambda x: flow.diag(x, -1)),
    ("trace", lambda x: flow.trace(x)),
    ("block_diag", lambda x: flow.block_diag(x, x[:2, :3])),
    ("rot90", lambda x: flow.rot90(x, 1)),
    ("diff", lambda x: flow.diff(x, 2, 0)),
    ("tile", lambda x: x.tile(2, 1)),
    ("unfold", lambda x: x.unfold(1, 2, 2)),
    ("cartesian_prod", lambda x: flow.cartesian_prod(x[0, :3], x[1, :2])),
    ("combinations", lambda x: flow.combinations(x[0], 2)),
    ("scatter_reduce", lambda x: x.scatter_reduce(0, _idx(x, [[1, 0, 1, 2, 3, 1]]), x[:1] * 3,
                                                  "amax", include_self=False)),
    ("index_reduce", lambda x: x.index_reduce(0, _idx(x, [1, 1]), x[:2] * 2, "mean")),
    ("index_copy", lambda x: x.index_copy(1, _idx(x, [4, 0]), x[:, :2] * 5)),
    ("index_fill", lambda x: x.index_fill(1, _idx(x, [0, 2]), -1.0)),
    ("put", lambda x: x.put(_idx(x, [3, 20]), x[0, :2] * 2)),
    ("masked_scatter", lambda x: x.masked_scatter(x > 0, x * 10)),
    ("select_scatter", lambda x: flow.select_scatter(x, x[0] * 2, 0, 1)),
    ("slice_scatter", lambda x: flow.slice_scatter(x, x[:, :2] * 3, 1, 2, 4)),
    ("diagonal_scatter", lambda x: flow.diagonal_scatter(x, x[0, :4] * 0 + 7)),
    ("t_", lambda x: (x * 1).t_()),
    ("unsqueeze_", lambda x: (x * 1).unsqueeze_(1)),
]


def run(fn, placement, sbp):
    x = flow.tensor(X)
    if placement is not None:
        x = x.to_global(placement, B).to_global(placement, sbp)
    x.requires_grad_()
    out = fn(x)
    w = flow.tensor(np.random.default_rng(1).standard_normal(tuple(out.shape)))
    if placement is not None:
        w = w.to_global(placement, B)
    (out * w).sum().backward()
    if placement is not None:
        out, grad = out.detach().to_global(placement, B).to_local(), x.grad.to_global(
            placement, B).to_local()
    else:
        out, grad = out.detach(), x.grad
    return out.numpy(), grad.numpy()


def main() -> None:
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    placement = flow.placement("cpu", list(range(world)))
    count = 0
    for name, fn in CASES:
        want = run(fn, None, None)
        for sbp in (B, S(0), S(1)):
            try:
                got = run(fn, placement, sbp)
            except Exception as e:
                raise AssertionError(f"{name} with {sbp}: {type(e).__name__}: {e}") from e
            for w, g, what in zip(want, got, ("value", "gradient"), strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-10,
                                           err_msg=f"{name} with {sbp}: {what}")
            count += 1
    print(f"rank {rank}: api fill T2 global check passed ({count} cases)", flush=True)


if __name__ == "__main__":
    main()
