"""nn.Graph over global tensors, against eager global mode: run on every rank under
`mpiexec -n 2` and `-n 4` (tests/graph/test_graph_global.py launches it; not collected by
pytest on its own: the name does not start with test_).

The oracle for every case is the same program in eager global mode (whose logical values the
global tests check against single-device results): a graph's outputs must carry the placement
and SBP eager gives, and equal its values; training must leave the same parameters.  Cases
with a 2-D grid run on 4 ranks only.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import numpy as np
import pytest

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow import comm
from sbpflow.framework import global_tensor
from sbpflow.graph.ir import boxing_text

RANK = flow.env.get_rank()
WORLD = flow.env.get_world_size()
P = flow.placement("cpu", list(range(WORLD)))
B, S, PS = flow.sbp.broadcast, flow.sbp.split, flow.sbp.partial_sum
TOL = dict(rtol=1e-5, atol=1e-6)

four = pytest.mark.skipif(WORLD != 4, reason="a 2x2 grid needs 4 ranks")


def _data(shape, seed, sbp=(B,), placement=P, dtype=np.float32):
    a = np.random.RandomState(seed).randn(*shape).astype(dtype)
    return flow.tensor(a).to_global(placement, [B] * placement.ndim).to_global(placement, sbp)


def _mlp(placement=P, tp=False, grid=False, dtype=flow.float32):
    flow.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)
    m = m.to_global(placement, [B] * placement.ndim)
    if tp or grid:  # Megatron's MLP: column-parallel, then row-parallel
        col, row = (S(0), S(1)) if not grid else ((B, S(0)), (B, S(1)))
        col = col if grid else (col,)
        row = row if grid else (row,)
        bias0 = (B, S(0)) if grid else (S(0),)
        m[0].weight = nn.Parameter(m[0].weight.to_global(placement, col))
        m[0].bias = nn.Parameter(m[0].bias.to_global(placement, bias0))
        m[2].weight = nn.Parameter(m[2].weight.to_global(placement, row))
    return m


def _optimizer(kind, params):
    if kind == "sgd":
        return flow.optim.SGD(params, lr=0.1, momentum=0.9)
    return flow.optim.Adam(params, lr=0.01)


class TrainGraph(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = ((self.model(x) - y) ** 2).mean()
        loss.backward()
        return loss


class EvalGraph(nn.Graph):
    def __init__(self, fn, model=None):
        super().__init__()
        if model is not None:
            self.model = model
        self.fn = fn

    def build(self, *args):
        return self.fn(self, *args)


def _same_global(got, want):
    assert got.is_global and got.placement == want.placement, (got.placement, want.placement)
    assert got.sbp == want.sbp, (got.sbp, want.sbp)
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)


def _train(kind, make, x_sbp, grid=False, steps=4, rows=10, fuse=False):
    placement = P if not grid else flow.placement("cpu", [[0, 1], [2, 3]])
    me, mg = make(placement), make(placement)
    oe, og = _optimizer(kind, me.parameters()), _optimizer(kind, mg.parameters())
    x = _data((rows, 6), 1, x_sbp, placement)
    y = _data((rows, 3), 2, x_sbp, placement)
    g = TrainGraph(mg, og)
    g.config.allow_fuse_model_update_ops(fuse)
    for _ in range(steps):
        loss_e = ((me(x) - y) ** 2).mean()
        oe.zero_grad()
        loss_e.backward()
        oe.step()
        _same_global(g(x, y), loss_e)
    for (name, pe), pg in zip(me.named_parameters(), mg.parameters()):
        assert pg.sbp == pe.sbp, name
        np.testing.assert_allclose(pg.numpy(), pe.numpy(), err_msg=name, **TOL)
    return g


# -- training equals eager global ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_data_parallel_training_equals_eager(kind):
    g = _train(kind, lambda p: _mlp(p), (S(0),))
    # the gradients of the B parameters are P: the Job all-reduces them before the update
    text = str(g._last.job)
    assert f"P -> B: all_reduce over ranks {list(range(WORLD))}, 192 B" in text, text


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("fuse", [False, True])
def test_tensor_parallel_mlp_training_equals_eager(kind, fuse):
    g = _train(kind, lambda p: _mlp(p, tp=True), (B,), fuse=fuse)
    job = g._last.job
    # each parameter is updated where it lies: no split parameter, gradient or state is
    # gathered for its update (the fused form: one multi-tensor op per parameter layout)
    updates = [op for op in job.ops if op.op_type.endswith("_update")]
    assert len(updates) == (3 if fuse else 4), str(job)
    assert not [op for op in job.ops if op.op_type == "boxing" and op.scope == "optimizer"
                and "all_gather" in boxing_text(op, job)], str(job)


@pytest.mark.parametrize("rows", [5, 7])
def test_data_parallel_uneven_batch_equals_eager(rows):
    # 5 rows on 4 ranks are 2, 1, 1, 1; on 2 ranks 3, 2
    _train("sgd", lambda p: _mlp(p), (S(0),), rows=rows)


@four
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_2d_grid_data_times_tensor_parallel_training_equals_eager(kind):
    _train(kind, lambda p: _mlp(p, grid=True), (S(0), B), grid=True)


# -- gradient accumulation: micro-batches of each rank's piece ---------------------------
class AccGraph(TrainGraph):
    def __init__(self, model, opt, n):
        super().__init__(model, opt)
        self.config.set_gradient_accumulation_steps(n)


def _micro(t, k, n):
    """Micro-batch k of n of a global batch as each rank cuts it (the k-th n-th of its piece
    along axis 0; OneFlow's unpack, eager DDP's recipe), in eager global mode."""
    local = t.to_local()
    m = local.shape[0] // n
    return local[k * m:(k + 1) * m].to_global(t.placement, t.sbp)


def _train_acc(kind, make, x_sbp, n, grid=False, steps=3):
    """The graph with n micro-batches against eager global's recipe: per micro-batch
    forward and (loss / n).backward(), one step per call; the graph returns the n losses."""
    placement = P if not grid else flow.placement("cpu", [[0, 1], [2, 3]])
    me, mg = make(placement), make(placement)
    oe, og = _optimizer(kind, me.parameters()), _optimizer(kind, mg.parameters())
    g = AccGraph(mg, og, n)
    rows = 4 * WORLD  # every rank's piece splits into 2 and 4 micro-batches
    for step in range(steps):
        x = _data((rows, 6), 20 + step, x_sbp, placement)
        y = _data((rows, 3), 30 + step, x_sbp, placement)
        oe.zero_grad()
        losses = []
        for k in range(n):
            loss = ((me(_micro(x, k, n)) - _micro(y, k, n)) ** 2).mean()
            (loss / n).backward()
            losses.append(loss.detach())
        oe.step()
        got = g(x, y)
        _same_global(got, flow.stack(losses))
    for (name, pe), pg in zip(me.named_parameters(), mg.parameters()):
        assert pg.sbp == pe.sbp, name
        np.testing.assert_allclose(pg.numpy(), pe.numpy(), err_msg=name, **TOL)
    return g


@pytest.mark.parametrize("kind, n", [("sgd", 2), ("adam", 4)])
def test_data_parallel_gradient_accumulation_equals_the_eager_recipe(kind, n):
    g = _train_acc(kind, lambda p: _mlp(p), (S(0),), n)
    job = g._last.job
    # the micro-batches are slices of the pieces: no boxing before the forward, and the
    # P gradients of the B parameters are summed as P and all-reduced once per step
    sends = [op for op in job.ops if op.op_type == "boxing"
             and ": slice on" not in boxing_text(op, job)]  # B -> S is a local slice
    assert len(sends) == len(list(g.model.parameters())), str(job)
    assert all(op.micro_batch is None and "P -> B: all_reduce" in boxing_text(op, job)
               for op in sends), str(job)
    assert [op.op_type for op in job.ops].count("micro_batch") == 2 * n


def test_tensor_parallel_gradient_accumulation_equals_the_eager_recipe():
    _train_acc("adam", lambda p: _mlp(p, tp=True), (B,), 2)


@four
def test_2d_grid_gradient_accumulation_equals_the_eager_recipe():
    _train_acc("sgd", lambda p: _mlp(p, grid=True), (S(0), B), 2, grid=True)


def test_gradient_accumulation_refuses_pieces_it_cannot_cut_on_every_rank():
    m = _mlp()
    g = AccGraph(m, _optimizer("sgd", m.parameters()), 2)
    rows = 2 * WORLD + 2  # even, but rank 0's piece has 3 rows
    x, y = _data((rows, 6), 1, (S(0),)), _data((rows, 3), 2, (S(0),))
    with pytest.raises(ValueError, match=r"rank 0's piece of tensor argument 0 .* has 3 rows"):
        g(x, y)


# -- forward: boxing nodes, conversions, pieces -------------------------------------------
def test_p_to_b_inside_a_graph():
    a = _data((4, 2 * WORLD), 3, (S(1),))
    b = _data((2 * WORLD, 5), 4, (S(0),))

    def fn(self, a, b):
        y = flow.matmul(a, b)  # S(1) @ S(0) -> P: no communication
        return y, y.to_global(P, B)

    g = EvalGraph(fn)
    out = io.StringIO()
    g.debug(1)
    with redirect_stdout(out):
        partial, full = g(a, b)
    want = flow.matmul(a, b)
    _same_global(partial, want)
    _same_global(full, want.to_global(P, B))
    assert partial.sbp == (PS,)
    text = out.getvalue()
    # the explicit node, in flow.boxing.explain's words (4 x 5 float32: 80 bytes)
    assert f"P -> B: all_reduce over ranks {list(range(WORLD))}, 80 B" in text, text
    assert flow.boxing.explain(want, P, B) in text
    assert f"(P) on ranks {list(range(WORLD))}" in text, text


@pytest.mark.parametrize("rows", [5, 9])
def test_to_global_inside_build_with_uneven_splits_and_to_local_pieces(rows):
    x = _data((rows, 3), 5, (B,))

    def fn(self, x):
        s = x.to_global(P, S(0))
        piece = s.to_local()
        return s * 2, piece + 1, s.to_global(P, B)

    g = EvalGraph(fn)
    s, piece, back = g(x)
    want = x.to_global(P, S(0))
    _same_global(s, want * 2)
    _same_global(back, x)
    assert piece.is_local
    lo, hi = global_tensor.layout.piece((rows, 3), P, (S(0),), RANK)[0].indices(rows)[:2]
    assert tuple(piece.shape) == (hi - lo, 3)
    np.testing.assert_allclose(piece.numpy(), want.to_local().numpy() + 1, **TOL)


def test_local_to_global_inside_build():
    # each rank's local tensor is its piece of the S(0) tensor, as eager to_global
    local = flow.tensor(np.full((2, 3), RANK + 1.0, np.float32))

    def fn(self, t):
        return t.to_global(P, S(0)).sum(0)

    g = EvalGraph(fn)
    want = local.to_global(P, S(0)).sum(0)
    got = g(local)
    _same_global(got, want)


def test_random_arange_and_mean_over_a_split_axis_equal_eager():
    def fn(self, x):
        r = flow.rand(7, 4, placement=P, sbp=S(0))
        a = flow.arange(7 * 4, placement=P, sbp=S(0)).reshape(7, 4)
        return r, a, x.mean(0), x.mean()

    x = _data((7, 4), 6, (S(0),))
    g = EvalGraph(fn)
    flow.manual_seed(11)
    got = g(x)
    flow.manual_seed(11)
    want = fn(None, x)
    for a, b in zip(got, want):
        _same_global(a, b)


def test_graph_output_sbps_are_eager_sbps_for_mixed_programs():
    model = _mlp(tp=True)

    def fn(self, x):
        h = self.model[0](x)
        return h, self.model(x), h.sum(), flow.relu(h).t()

    x = _data((4, 6), 7, (B,))
    g = EvalGraph(fn, model)
    with flow.no_grad():
        want = fn(g, x)
    for a, b in zip(g(x), want):
        _same_global(a, b)


def test_the_plan_holds_this_ranks_pieces():
    x = _data((5, 3), 8, (S(0),))
    g = EvalGraph(lambda self, x: (x * 3).to_global(P, B))
    g(x)
    plan = g._last.runner.plan
    mine = global_tensor.layout.local_shape((5, 3), P, (S(0),), RANK)
    descs = [t for t in plan.tensors.values() if t.logical == (5, 3)]
    assert any(t.shape == mine for t in descs), plan
    assert f"{list(mine)} of [5, 3]" in str(plan), plan
    assert any(op.op_type == "boxing" for task in plan.tasks for op in task.ops)


def test_point_to_point_messages_are_tagged_per_register_and_piece(monkeypatch):
    from sbpflow.sbp import boxing

    q = flow.placement("cpu", list(reversed(range(WORLD))))  # the same ranks, reordered
    x = _data((4 * WORLD, 3), 12, (S(0),))
    g = EvalGraph(lambda self, x: (x.to_global(q, S(0)) * 2, (x + 1).to_global(q, S(0))))
    g(x)  # compile
    world = comm.world()
    sent = []

    def send(buf, dest, tag=0, _send=type(world).send):
        sent.append(tag)
        return _send(world, buf, dest, tag)

    monkeypatch.setattr(world, "send", send)  # the routes call world.send: a redistribution
    rt = g._last.runner
    registers = [t.produced[0] for t in rt.plan.tasks if t.kind == "boxing"]
    assert len(registers) == 2, rt.plan
    for _ in range(3):
        piece = rt._pieces
        sent.clear()
        got = g(x)
        want = {boxing.graph_tag(r, piece) for r in registers}
        # every message tagged with its boxing task's register and this call's instance
        assert sent and set(sent) == want and len(want) == 2, (sent, want)
        _same_global(got[0], x.to_global(q, S(0)) * 2)
        _same_global(got[1], (x + 1).to_global(q, S(0)))
    assert boxing.graph_tag(registers[0], 0) != boxing.graph_tag(registers[0], 1)


def test_delays_on_some_ranks_change_nothing():
    import time

    model = _mlp()
    g = EvalGraph(lambda self, x: self.model(x).sum().to_global(P, B), model)
    x = _data((8, 6), 9, (S(0),))
    with flow.no_grad():
        want = model(x).sum().to_global(P, B)
    for k in range(3):
        if (RANK + k) % 2:
            time.sleep(0.05 * (RANK + 1))
        _same_global(g(x), want)


def _same_on_every_rank(text: str) -> bool:
    """Whether `text` is the same on every rank (an all-gather of its hash)."""
    import hashlib

    h = np.frombuffer(hashlib.blake2b(text.encode(), digest_size=8).digest(), np.int64)
    everyone = comm.world().all_gather(h.copy()[None, :])
    return len({int(x) for x in everyone.ravel()}) == 1


def test_the_step_is_cut_at_boxing_nodes_with_the_same_ids_on_every_rank():
    g = _train("sgd", lambda p: _mlp(p), (S(0),), steps=1)
    plan = g._last.runner.plan
    boxing = [t for t in plan.tasks if t.kind == "boxing"]
    # one task per all-reduce of a gradient (4 parameters), on the comm stream, each running
    # one boxing node; compute tasks between them
    assert len(boxing) == 4, plan
    assert all(t.stream == "comm" and [op.op_type for op in t.ops] == ["boxing"]
               for t in boxing)
    kinds = [t.kind for t in plan.tasks]
    assert kinds[:3] == ["source", "copy_in", "compute"] and kinds[-3:] == [
        "copy_out", "tick", "sink"], kinds
    # ids, names, edges and the order of the collectives are derived from the Job: the same
    # on every rank
    shape = repr([(t.id, t.name, t.kind, t.consumed, t.produced, [o.name for o in t.ops])
                  for t in plan.tasks] + [(r.id, r.producer, r.consumers, r.blobs)
                                          for r in plan.registers])
    assert _same_on_every_rank(shape)
    order = [op.name for t in plan.tasks for op in t.ops if op.op_type == "boxing"]
    assert _same_on_every_rank(repr(order))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_a_cut_step_hands_variables_on_by_reference_and_updates_them_in_place(kind):
    """The tasks of a cut step hand variables and inputs on by reference (no snapshot, no
    copy of a batch), and each update writes its parameter and states in place, in the task
    that computes it; training still equals eager."""
    g = _train(kind, lambda p: _mlp(p), (S(0),), steps=3)
    rt = g._last.runner
    assert len(rt.chains) > 2, rt.plan  # cut at the all-reduces
    assert all(not c.copied for c in rt.chains.values()), {
        name: c.copied for name, c in rt.chains.items() if c.copied}
    written = set().union(*(c.inplace_assigns for c in rt.chains.values()))
    assigned = {var for t in rt.plan.tasks for var, _, _ in t.assigns}
    states = ("momentum",) if kind == "sgd" else ("m", "v")
    tensors = {f"model.{name}{suffix}" for name, _ in g.model.named_parameters()
               for suffix in ("",) + tuple(f"-{s}" for s in states)}
    assert tensors <= assigned and tensors <= written, (sorted(assigned), sorted(written))
    # left: the SGD first-step flag, Adam's step counts (scalars a small op computes)
    assert all(v.endswith(("-first", "-step")) for v in assigned - written), assigned - written


class StateGraph(TrainGraph):
    def build(self, x, y):
        w = self.model[0].weight
        loss = ((self.model(x) - y) ** 2).mean()
        loss.backward()
        return loss, w, w.t(), x, x[1:]


def test_a_cut_step_returns_old_values_of_variables_and_copies_of_its_inputs():
    """Outputs that alias a variable or an input of a cut step (a parameter, a view of it,
    the batch and a slice of it, handed through the tasks by reference) are the values at
    the read: the step's update and a later change of the caller's batch leave them."""
    me, mg = _mlp(), _mlp()
    oe, og = _optimizer("sgd", me.parameters()), _optimizer("sgd", mg.parameters())
    g = StateGraph(mg, og)
    for step in range(3):
        x = _data((8, 6), 40 + step, (S(0),))
        y = _data((8, 3), 50 + step, (S(0),))
        w_old = me[0].weight.detach().clone()
        x_old = x.numpy().copy()
        loss_e = ((me(x) - y) ** 2).mean()
        oe.zero_grad()
        loss_e.backward()
        oe.step()
        loss, w, wt, xo, xs = g(x, y)
        x.mul_(0)  # the caller reuses its batch
        _same_global(loss, loss_e)
        np.testing.assert_allclose(w.numpy(), w_old.numpy(), **TOL)
        np.testing.assert_allclose(wt.numpy(), w_old.numpy().T, **TOL)
        np.testing.assert_array_equal(xo.numpy(), x_old)
        np.testing.assert_array_equal(xs.numpy(), x_old[1:])
        np.testing.assert_allclose(mg[0].weight.numpy(), me[0].weight.numpy(), **TOL)
    assert len(g._last.runner.chains) > 2


def test_threaded_actors_with_injected_delays_equal_eager():
    """Compute, copy and comm tasks on their own threads (threads='stream'), with a delay
    injected into one rank's boxing tasks: readiness differs between the ranks, the
    collectives still run in the Plan's order, and the result equals eager."""
    import time

    from sbpflow.graph.compiler import build_runtime, compile_job

    model = _mlp(tp=True)
    g = EvalGraph(lambda self, x: self.model(x).to_global(P, B), model)
    x = _data((4, 6), 10, (B,))
    g(x)
    job = g._last.job
    plan = compile_job(job, threads="stream")
    assert len({t.thread for t in plan.tasks}) > 1
    rt = build_runtime(job, plan=plan)
    if RANK == 1:
        for c in rt.chains.values():
            if c.task.kind == "boxing":
                fn = c.fn

                def slow(*a, _fn=fn):
                    time.sleep(0.05)
                    return _fn(*a)

                c.fn = slow
                for actor in rt.actors.values():
                    if getattr(actor, "chain", None) is c:
                        actor._fn = slow
    try:
        with flow.no_grad():
            want = model(x).to_global(P, B)
        for _ in range(3):
            (out,) = rt.run([global_tensor._local_alias(x)])
            np.testing.assert_allclose(out.numpy(), want.to_local().numpy(), **TOL)
    finally:
        rt.stop()
