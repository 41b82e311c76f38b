"""Run under `mpiexec -n 4` by test_global_nd.py: ops on a 2x2 hierarchy.

For every nd-SBP of the inputs over {S(0), S(1), B, P}^2 (per input), a few ops give the
single-device result, forward and backward; a small MLP trains on the 2-D placement exactly as
on one device.  Shapes do not divide evenly, so some pieces are uneven.
"""

import itertools

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.sbp import B, P, S

GRID = flow.placement("cpu", [[0, 1], [2, 3]])
RANK = flow.env.get_rank()
ONE_D = [S(0), S(1), B, P]
ND = list(itertools.product(ONE_D, repeat=2))


def _global(arr: np.ndarray, sbp, seed: int):
    """A global tensor with logical value `arr`.  On a P grid axis the rank at coordinate 0
    holds the value, and the two ranks add plus and minus the same whole-number noise, so
    the sum is exact in float64."""
    made = tuple(B if x == P else x for x in sbp)
    t = flow.tensor(arr, placement=GRID, sbp=made)
    if P not in sbp:
        return t
    rng = np.random.default_rng(seed)
    local = t.to_local().numpy()
    coords = GRID.coords(RANK)
    if any(coords[k] for k, x in enumerate(sbp) if x == P):
        local = np.zeros_like(local)  # one rank per P group holds the value
    for k, x in enumerate(sbp):
        if x == P:
            noise = rng.integers(-3, 4, size=local.shape).astype(arr.dtype)
            local = local + (noise if coords[k] == 0 else -noise)
    # local -> global keeps each piece as it is (no axis is B-made-from-rank-0 here)
    return flow.tensor(local).to_global(GRID, sbp)


CASES = {
    "add": (lambda a, b: a + b, [(5, 6), (5, 6)]),
    "mul": (lambda a, b: a * b, [(5, 6), (1, 6)]),
    "matmul": (lambda a, b: a @ b, [(5, 6), (6, 7)]),
    "sum": (lambda a: a.sum(dim=1), [(5, 6)]),
    "softmax": (lambda a: flow.softmax(a, dim=1), [(5, 6)]),
    "relu_mean": (lambda a: flow.relu(a).mean(), [(5, 6)]),
    "transpose": (lambda a: a.t() * 2.0, [(5, 6)]),
}


def _cases():
    for name, (fn, shapes) in CASES.items():
        for sbps in itertools.product(ND, repeat=len(shapes)):
            yield name, fn, shapes, sbps


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_on_2x2_every_nd_sbp(name):
    fn, shapes = CASES[name]
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    local = [flow.tensor(a, requires_grad=True) for a in arrays]
    want = fn(*local)
    g = np.random.default_rng(1).standard_normal(tuple(want.shape))
    want.backward(flow.tensor(g))
    checked = 0
    for sbps in itertools.product(ND, repeat=len(shapes)):
        xs = [_global(a, s, i).detach().requires_grad_() for i, (a, s) in
              enumerate(zip(arrays, sbps))]
        out = fn(*xs)
        np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-10,
                                   atol=1e-10, err_msg=f"{name} {sbps}")
        out.backward(flow.tensor(g, placement=GRID, sbp=(B, B)))
        for x, lx in zip(xs, local):
            assert x.grad.sbp == x.sbp and x.grad.placement == GRID
            np.testing.assert_allclose(x.grad.numpy(), lx.grad.numpy(), rtol=1e-10,
                                       atol=1e-10, err_msg=f"{name} grad {sbps}")
        checked += 1
    assert checked == len(ND) ** len(shapes)


def test_mlp_trains_on_2x2_as_on_one_device():
    """Data parallel on grid axis 0, tensor parallel on axis 1 (Megatron in 2-D)."""
    def build():
        flow.manual_seed(3)
        return (flow.nn.Linear(6, 8).double(), flow.nn.Linear(8, 3).double())

    rng = np.random.default_rng(5)
    X, Y = rng.standard_normal((10, 6)), rng.standard_normal((10, 3))
    l1, l2 = build()
    g1, g2 = build()
    # nn.Linear's weight is [out, in]: column-parallel splits out (axis 0), row-parallel in.
    def shard(t, sbp):  # a local value -> B on the grid (the same on every rank) -> sbp
        return flow.nn.Parameter(t.detach().to_global(GRID, (B, B)).to_global(GRID, sbp))

    g1.weight, g1.bias = shard(g1.weight, (B, S(0))), shard(g1.bias, (B, S(0)))
    g2.weight, g2.bias = shard(g2.weight, (B, S(1))), shard(g2.bias, (B, B))
    opt_l = flow.optim.SGD([*l1.parameters(), *l2.parameters()], lr=0.1)
    opt_g = flow.optim.SGD([*g1.parameters(), *g2.parameters()], lr=0.1)
    x_l, y_l = flow.tensor(X), flow.tensor(Y)
    x_g = flow.tensor(X, placement=GRID, sbp=(S(0), B))
    y_g = flow.tensor(Y, placement=GRID, sbp=(S(0), B))
    for _ in range(4):
        loss_l = ((l2(flow.relu(l1(x_l))) - y_l) ** 2).mean()
        loss_g = ((g2(flow.relu(g1(x_g))) - y_g) ** 2).mean()
        for opt, loss in ((opt_l, loss_l), (opt_g, loss_g)):
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert abs(loss_l.item() - loss_g.item()) < 1e-12
    for a, b in zip([*l1.parameters(), *l2.parameters()], [*g1.parameters(),
                                                           *g2.parameters()]):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-12)
