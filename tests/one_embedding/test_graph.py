"""One-embedding inside nn.Graph: the lookup, the gradient shuffle and the in-store update
are ops of the Job, and a graph training loop equals the eager one (losses, stored rows with
their optimizer state, dense weights). Eager itself equals torch's dense embedding
(test_embedding.py); 2 ranks: scripts/graph_check.py."""

import re
import sys

import numpy as np
import pytest

import sbpflow as flow

from . import graph_common as C
from .conftest import mpiexec_cmd, run_job, script

STEPS = 6


def _pair(tmp_path, rule):
    flow.manual_seed(5)
    eager = C.Model(str(tmp_path / "eager"), rule)
    flow.manual_seed(5)
    lazy = C.Model(str(tmp_path / "graph"), rule)
    return eager, C.optimizers(eager, rule), lazy, C.optimizers(lazy, rule)


def _close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=what)


@pytest.mark.parametrize("rule", list(C.RULES))
def test_graph_training_equals_eager(tmp_path, rule):
    eager, eopts, lazy, gopts = _pair(tmp_path, rule)
    graph = C.TrainGraph(lazy, gopts)
    updates = []
    handle = lazy.emb._handle
    handle.update = (lambda f: lambda *a: (updates.append(len(a[0])), f(*a)))(handle.update)
    for ids, y in C.batches(STEPS, seed=1):
        want = C.eager_step(eager, eopts, ids, y)
        got = graph(flow.tensor(ids), flow.tensor(y)).item()
        _close(got, want, "loss")
    assert len(updates) == STEPS  # the graph's update op ran once per step, in the store
    ek, erows, ehead = C.state(eager)
    gk, grows, ghead = C.state(lazy)
    np.testing.assert_array_equal(gk, ek)
    _close(grows, erows, "stored rows and optimizer state")
    _close(ghead, ehead, "dense head")
    assert lazy.emb.store.step == eager.emb.store.step == STEPS
    # the rows moved away from their initial values (a graph that skipped the update fails)
    flow.manual_seed(5)
    fresh = C.Model(str(tmp_path / "fresh"), rule).emb.store
    assert fresh.seed == lazy.emb.store.seed
    moved = np.abs(grows[:, :C.D] - fresh.lookup(gk, gk // 10**9)).max(axis=1)
    assert (moved > 1e-4).all()


RULE_OP = {"sgd": "one_embedding_sgd_update", "momentum": "one_embedding_momentum_update",
           "adam": "one_embedding_adam_update", "adagrad": "one_embedding_adagrad_update",
           "ftrl": "one_embedding_ftrl_update"}


@pytest.mark.parametrize("rule", list(C.RULES))
def test_job_holds_lookup_shuffle_and_update_ops(tmp_path, rule):
    _, _, lazy, gopts = _pair(tmp_path, rule)
    graph = C.TrainGraph(lazy, gopts)
    ids, y = next(C.batches(1, seed=0))
    graph(flow.tensor(ids), flow.tensor(y))
    job = graph._job()
    kinds = [op.op_type for op in job.ops]
    assert kinds.count("one_embedding_lookup") == 1
    assert kinds.count("one_embedding_gradient_shuffle") == 1
    assert kinds.count(RULE_OP[rule]) == 1
    assert sum(k.startswith("one_embedding_") and k.endswith("_update") for k in kinds) == 1
    lookup = next(job.ops_of("one_embedding_lookup"))
    shuffle = next(job.ops_of("one_embedding_gradient_shuffle"))
    update = next(job.ops_of(RULE_OP[rule]))
    assert lookup.attrs["handle"] == lazy.emb._handle.key == update.attrs["handle"]
    shadow = lookup.inputs[0]
    assert job.producer(shadow).op_type == "variable"
    # the update reads the owned ids and the shuffled gradient rows
    assert update.inputs[:3] == (lookup.outputs[4], lookup.outputs[3], shuffle.outputs[0])
    assert shuffle.inputs[1] == lookup.outputs[1]
    # the placeholder parameter gets no dense update (no assign writes it)
    assigned = [op.inputs[0] for op in job.ops_of("assign")]
    assert shadow not in assigned
    if rule in C.SHARED:  # the head's dense update is there
        assert any(v.startswith("model.head") for v in assigned)
    # the order: lookup, then backward, then the update
    pos = {op.name: i for i, op in enumerate(job.ops)}
    assert pos[lookup.name] < pos[shuffle.name] < pos[update.name]


def test_switching_between_eager_and_graph_steps(tmp_path):
    """Graph and eager steps share the store: alternating them equals eager only."""
    eager, eopts, mixed, mopts = _pair(tmp_path, "adam")
    graph = C.TrainGraph(mixed, mopts)
    for k, (ids, y) in enumerate(C.batches(STEPS, seed=2)):
        want = C.eager_step(eager, eopts, ids, y)
        got = (graph(flow.tensor(ids), flow.tensor(y)).item() if k % 2 else
               C.eager_step(mixed, mopts, ids, y))
        _close(got, want, f"loss at step {k}")
    _close(C.state(mixed)[1], C.state(eager)[1], "stored rows")


def test_two_lookups_of_one_table_update_once(tmp_path):
    """Two lookups in one build(): their gradients meet in one update of the distinct ids
    (one optimizer step), as eager sums the pending gradients of one step."""
    eager, eopts, lazy, gopts = _pair(tmp_path, "adagrad")

    def loss_of(model, ids, y):
        a = model.emb(ids)
        b = model.emb(ids.flip(0))
        return flow.nn.functional.binary_cross_entropy_with_logits(
            model.head((a * b).sum(1)).squeeze(-1), y)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = lazy
            for opt in gopts:
                self.add_optimizer(opt)

        def build(self, ids, y):
            loss = loss_of(self.model, ids, y)
            loss.backward()
            return loss

    g = G()
    for ids, y in C.batches(3, seed=3):
        loss = loss_of(eager, flow.tensor(ids), flow.tensor(y))
        loss.backward()
        for opt in eopts:
            opt.step()
            opt.zero_grad()
        _close(g(flow.tensor(ids), flow.tensor(y)).item(), loss.item(), "loss")
    job = g._job()
    assert len(list(job.ops_of("one_embedding_lookup"))) == 2
    assert len(list(job.ops_of("one_embedding_adagrad_update"))) == 1
    assert lazy.emb.store.step == eager.emb.store.step == 3
    _close(C.state(lazy)[1], C.state(eager)[1], "stored rows")


def test_bad_ids_inside_graph(tmp_path):
    _, _, lazy, _ = _pair(tmp_path, "sgd")

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.emb = lazy.emb

        def build(self, ids, *rest):
            return self.emb(ids, *rest)

    with pytest.raises(TypeError, match="key_type"):
        G()(flow.tensor([[1, 2]], dtype=flow.int32))
    with pytest.raises(ValueError, match="non-negative"):
        G()(flow.tensor([[1, -2]]))
    with pytest.raises(IndexError, match=r"table_ids must be in \[0, 2\)"):
        G()(flow.tensor([1, 2]), flow.tensor([0, 2]))
    with pytest.raises(ValueError, match="table_ids or ids of shape"):
        G()(flow.tensor([1, 2]))


def test_adagrad_on_dense_parameters_in_graph_says_why(tmp_path):
    model = C.Model(str(tmp_path / "m"), "adagrad")
    graph = C.TrainGraph(model, [flow.optim.Adagrad(model.parameters(), lr=0.1)])
    ids, y = next(C.batches(1, seed=0))
    with pytest.raises(NotImplementedError, match="one-embedding tables only"):
        graph(flow.tensor(ids), flow.tensor(y))


def test_two_ranks_sharded_graph_equals_eager():
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", script("graph_check.py")), timeout=400)
    assert job.returncode == 0, job.output
    ranks = sorted(int(r) for r in re.findall(r"rank (\d+): graph ok", job.stdout))
    assert ranks == [0, 1], job.output
    assert job.strays == 0


def test_one_rank_script():
    job = run_job([sys.executable, script("graph_check.py")], timeout=300)
    assert job.returncode == 0, job.output
    assert "rank 0: graph ok" in job.stdout, job.output
