"""MultiTableEmbedding eager: lookups and in-store updates against a dense torch
nn.Embedding with the same optimizer, cache budgets, persistence, and bad input."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.one_embedding as oe

from .conftest import script

V, D = 24, 4


def _embedding(path, size_factor=3, budget=64, tables=None, dim=D, key_type=flow.int64,
               name="e"):
    tables = tables or [oe.make_table_options(oe.make_uniform_initializer(-0.5, 0.5))]
    store = oe.make_cached_ssd_store_options(budget, str(path), capacity=V,
                                             size_factor=size_factor)
    return oe.MultiTableEmbedding(name, dim, flow.float, key_type, tables, store)


OPTIMIZERS = {
    "sgd": (lambda p: flow.optim.SGD(p, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3), 1),
    "sgd_wd": (lambda p: flow.optim.SGD(p, lr=0.3, weight_decay=0.1),
               lambda p: torch.optim.SGD(p, lr=0.3, weight_decay=0.1), 1),
    "momentum": (lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 2),
    "nesterov": (lambda p: flow.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), 2),
    "adam": (lambda p: flow.optim.Adam(p, lr=0.05, weight_decay=0.01),
             lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.01), 3),
    "adamw": (lambda p: flow.optim.AdamW(p, lr=0.05),
              lambda p: torch.optim.AdamW(p, lr=0.05), 3),
    "adagrad": (lambda p: flow.optim.Adagrad(p, lr=0.2, lr_decay=0.01,
                                             initial_accumulator_value=0.1),
                lambda p: torch.optim.Adagrad(p, lr=0.2, lr_decay=0.01,
                                              initial_accumulator_value=0.1), 2),
}


def _batches(steps, cover_all, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        extra = rng.integers(0, V, 36)  # duplicates within the batch
        ids = np.concatenate([np.arange(V), extra]) if cover_all else extra
        yield rng.permutation(ids).reshape(-1, 6)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_matches_dense_embedding(tmp_path, name):
    make, make_torch, factor = OPTIMIZERS[name]
    # Dense updates touch every row each step (momentum, Adam's moments decay even where
    # the gradient is zero), so every batch holds every id; plain SGD and Adagrad leave
    # untouched rows alone and are also checked on partial batches below.
    keys = (np.arange(V, dtype=np.int64) * 7919 + 3) * 2**40  # any magnitude
    emb = _embedding(tmp_path, factor)
    w0 = emb(flow.tensor(keys)).detach().numpy()
    dense = torch.nn.Embedding(V, D)
    dense.weight.data = torch.tensor(w0)
    opt, topt = make(emb.parameters()), make_torch(dense.parameters())
    rng = np.random.default_rng(1)
    for ids in _batches(4, cover_all=True):
        c = rng.standard_normal(ids.shape + (D,)).astype(np.float32)
        y, ty = emb(flow.tensor(keys[ids])), dense(torch.tensor(ids))
        np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
        (y * flow.tensor(c)).sum().backward()
        (ty * torch.tensor(c)).sum().backward()
        opt.step()
        topt.step()
        opt.zero_grad()
        topt.zero_grad()
    np.testing.assert_allclose(emb(flow.tensor(keys)).detach().numpy(),
                               dense.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert emb.store.step == 4


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
def test_sparse_batches_and_duplicates_accumulate(tmp_path, name):
    make, make_torch, factor = OPTIMIZERS[name]
    emb = _embedding(tmp_path, factor)
    w0 = emb(flow.tensor(np.arange(V))).detach().numpy()
    dense = torch.nn.Embedding(V, D)
    dense.weight.data = torch.tensor(w0)
    opt, topt = make(emb.parameters()), make_torch(dense.parameters())
    for ids in _batches(5, cover_all=False, seed=3):
        emb(flow.tensor(ids)).pow(2).sum().backward()
        dense(torch.tensor(ids)).pow(2).sum().backward()
        opt.step()
        topt.step()
        opt.zero_grad()
        topt.zero_grad()
    np.testing.assert_allclose(emb(flow.tensor(np.arange(V))).detach().numpy(),
                               dense.weight.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_duplicate_ids_gradient_sum_and_accumulation_over_backwards(tmp_path):
    emb = _embedding(tmp_path, 1)
    opt = flow.optim.SGD(emb.parameters(), lr=1.0)
    ids = flow.tensor([[3, 3, 5], [3, 7, 5]])
    before = emb(flow.tensor([3, 5, 7, 9])).detach().numpy()
    emb(ids).sum().backward()
    emb(flow.tensor([3])).sum().backward()  # a second backward before the step adds up
    opt.step()
    after = emb(flow.tensor([3, 5, 7, 9])).detach().numpy()
    np.testing.assert_allclose(before - after, np.array([4, 2, 1, 0])[:, None]
                               * np.ones((1, D)), atol=1e-6)
    opt.zero_grad()
    emb(ids).sum().backward()
    opt.zero_grad()  # zero_grad(set_to_none) drops the pending rows too
    opt.step()
    np.testing.assert_array_equal(emb(flow.tensor([3, 5, 7, 9])).detach().numpy(), after)


def test_ftrl_matches_numpy_reference(tmp_path):
    emb = _embedding(tmp_path, 3)
    keys = np.arange(V)
    w = emb(flow.tensor(keys)).detach().numpy().astype(np.float64)
    opt = oe.Ftrl(emb.parameters(), lr=0.1, lambda1=0.01, lambda2=0.02, beta=0.5)
    n = np.full_like(w, 0.1)
    z = np.zeros_like(w)
    for ids in _batches(3, cover_all=True, seed=5):
        y = emb(flow.tensor(ids))
        y.pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        g = np.zeros_like(w)
        np.add.at(g, ids.reshape(-1), 2 * w[ids.reshape(-1)])
        n_new = n + g * g
        z += g - (np.sqrt(n_new) - np.sqrt(n)) / 0.1 * w
        n = n_new
        w = np.where(np.abs(z) > 0.01,
                     -(z - np.sign(z) * 0.01) / ((0.5 + np.sqrt(n)) / 0.1 + 0.02), 0)
    np.testing.assert_allclose(emb(flow.tensor(keys)).detach().numpy(), w, rtol=1e-4,
                               atol=1e-6)
    # ordinary parameters under Ftrl follow the same rule
    p = flow.nn.Parameter(flow.tensor([0.5, -0.2]))
    o = oe.Ftrl([p], lr=0.1)
    (p * p).sum().backward()
    o.step()
    g = np.array([1.0, -0.4])
    n2 = 0.1 + g * g
    zz = g - (np.sqrt(n2) - np.sqrt(0.1)) / 0.1 * np.array([0.5, -0.2])
    np.testing.assert_allclose(p.detach().numpy(), -zz / (np.sqrt(n2) / 0.1), rtol=1e-5)


def test_same_result_with_1mb_and_1gb_cache(tmp_path):
    big_v, dim = 20000, 16
    results = {}
    for budget in (1, 1024):
        flow.manual_seed(0)
        store = oe.make_cached_ssd_store_options(budget, str(tmp_path / str(budget)),
                                                 capacity=big_v, size_factor=3)
        emb = oe.MultiTableEmbedding("c", dim, flow.float, flow.int64, None, store)
        opt = flow.optim.Adam(emb.parameters(), lr=0.01)
        rng = np.random.default_rng(0)
        for _ in range(6):
            ids = rng.integers(0, big_v, (512, 4)) * 31337
            emb(flow.tensor(ids)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        keys = np.sort(emb.store.key_of_slot[: emb.store.num_keys])
        rows = np.concatenate([emb.store.read_rows(keys[i:i + 1000])
                               for i in range(0, len(keys), 1000)])
        results[budget] = (rows, emb.store.evictions, emb.store.writebacks, keys)
    assert results[1][1] > 5000 and results[1][2] > 5000  # the disk tier was used
    assert results[1024][1] == 0 and results[1024][2] == 0
    assert len(results[1][3]) > 5000  # far more rows than the 1 MB cache holds
    np.testing.assert_array_equal(results[1][3], results[1024][3])
    np.testing.assert_array_equal(results[1][0], results[1024][0])


def test_multi_table_initializers_and_multi_column(tmp_path):
    tables = [oe.make_table_options(oe.make_uniform_initializer(0.0, 0.001)),
              oe.make_table_options(oe.make_uniform_initializer(10.0, 10.001))]
    emb = _embedding(tmp_path, 1, tables=tables)
    y = emb(flow.tensor([[1, 2], [3, 4]])).detach().numpy()  # column j: table j
    assert (y[:, 0] < 1).all() and (y[:, 1] > 9).all()
    y2 = emb(flow.tensor([5, 6]), flow.tensor([1, 0])).detach().numpy()
    assert (y2[0] > 9).all() and (y2[1] < 1).all()
    cols = [oe.make_table_options([
        oe.make_column_options(oe.make_uniform_initializer(-0.01, 0.0)),
        oe.make_column_options(oe.make_normal_initializer(5.0, 0.01))])]
    store = oe.make_cached_ssd_store_options(8, str(tmp_path / "mc"), size_factor=1)
    mc = oe.MultiTableMultiColumnEmbedding("mc", [3, 2], flow.float, flow.int64, cols, store)
    out = mc(flow.tensor([1, 2, 3])).detach().numpy()
    assert out.shape == (3, 5)
    assert (out[:, :3] <= 0).all() and (np.abs(out[:, 3:] - 5) < 0.1).all()


def test_initial_rows_depend_on_seed_not_order(tmp_path):
    flow.manual_seed(5)
    a = _embedding(tmp_path / "a")(flow.tensor([10, 20, 30])).detach().numpy()
    flow.manual_seed(5)
    b = _embedding(tmp_path / "b")(flow.tensor([30, 10, 20])).detach().numpy()
    np.testing.assert_array_equal(a, b[[1, 2, 0]])
    flow.manual_seed(6)
    c = _embedding(tmp_path / "c")(flow.tensor([10, 20, 30])).detach().numpy()
    assert not np.array_equal(a, c)


def test_bad_input(tmp_path):
    tables = [oe.make_table_options(oe.make_uniform_initializer(0, 1))] * 2
    emb = _embedding(tmp_path, 1, tables=tables)
    with pytest.raises(ValueError, match="non-negative"):
        emb(flow.tensor([[1, -3]]))
    with pytest.raises(IndexError, match=r"table_ids must be in \[0, 2\), got 2"):
        emb(flow.tensor([1, 2]), flow.tensor([0, 2]))
    with pytest.raises(TypeError, match="key_type"):
        emb(flow.tensor([[1, 2]], dtype=flow.int32))
    with pytest.raises(TypeError, match="key_type"):
        emb(flow.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="pass table_ids"):
        emb(flow.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="shape"):
        emb(flow.tensor([1, 2]), flow.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="initializer"):
        oe.MultiTableEmbedding("x", 4, flow.float, flow.int64, [{"initializer": {}}],
                               oe.make_cached_ssd_store_options(1, str(tmp_path / "x")))
    with pytest.raises(ValueError, match="cache_budget_mb"):
        oe.make_cached_ssd_store_options(0, str(tmp_path))
    # an optimizer whose state does not fit the store
    emb1 = _embedding(tmp_path / "sf", 1)
    opt = flow.optim.Adam(emb1.parameters())
    emb1(flow.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="size_factor >= 3"):
        opt.step()
    emb2 = _embedding(tmp_path / "rms", 2)
    opt = flow.optim.RMSprop(emb2.parameters())
    emb2(flow.tensor([1])).sum().backward()
    with pytest.raises(NotImplementedError, match="RMSprop"):
        opt.step()
    i32 = _embedding(tmp_path / "i32", 1, key_type=flow.int32)
    assert i32(flow.tensor([1, 2], dtype=flow.int32)).shape == (2, D)


def _run(*args):
    return subprocess.run([sys.executable, script("persist.py"), *args], capture_output=True,
                          text=True, timeout=120)


def test_persistence_across_kill_and_reload(tmp_path):
    out = str(tmp_path / "dump")
    saver = _run("save", str(tmp_path / "store"), out)
    assert saver.returncode == -9, saver.stderr  # killed, no cleanup ran
    loader = _run("load", str(tmp_path / "store"), out)
    assert loader.returncode == 0 and "reloaded ok" in loader.stdout, loader.stderr
    saved, loaded = np.load(out + "-saved.npz"), np.load(out + "-loaded.npz")
    assert int(loaded["step"]) == int(saved["step"]) == 4
    np.testing.assert_array_equal(loaded["keys"], saved["keys"])
    np.testing.assert_array_equal(loaded["rows"], saved["rows"])  # rows and Adam state
    after, resumed = np.load(out + "-after.npz"), np.load(out + "-resumed.npz")
    np.testing.assert_array_equal(resumed["keys"], after["keys"])
    np.testing.assert_array_equal(resumed["rows"], after["rows"])


def test_crash_during_snapshot_keeps_the_previous_one(tmp_path):
    out = str(tmp_path / "dump")
    saver = _run("save", str(tmp_path / "store"), out, "crash")
    assert saver.returncode == -9, saver.stderr
    snaps = sorted((tmp_path / "store" / "rank-0" / "snapshots").iterdir())
    assert [p.name for p in snaps][-1] == "s1" and len(snaps) == 2  # s1 and the torn temp
    loader = _run("load", str(tmp_path / "store"), out)
    assert loader.returncode == 0, loader.stderr
    saved, loaded = np.load(out + "-saved.npz"), np.load(out + "-loaded.npz")
    np.testing.assert_array_equal(loaded["rows"], saved["rows"])


def test_store_option_builders(tmp_path):
    dev = oe.make_device_mem_store_options(str(tmp_path / "d"), capacity=100, size_factor=2)
    assert dev["kv_store"]["caches"][0]["policy"] == "full" and dev["size_factor"] == 2
    host = oe.make_cached_host_mem_store_options(1, [str(tmp_path / "h0")], capacity=100)
    assert [c["policy"] for c in host["kv_store"]["caches"]] == ["lru", "full"]
    ssd = oe.make_cached_ssd_store_options(2, str(tmp_path), capacity=100,
                                           host_cache_budget_mb=3, physical_block_size=512)
    assert [c["cache_memory_budget_mb"] for c in ssd["kv_store"]["caches"]] == [2, 3]
    e_dev = oe.MultiTableEmbedding("d", D, flow.float, flow.int64, None, dev)
    assert e_dev.store.cache_lines == 100 and e_dev.store.storage_dim == 2 * D
    e_host = oe.MultiTableEmbedding("h", D, flow.float, flow.int64, None, host)
    assert e_host.store.path == str(tmp_path / "h0")  # a list names each rank's path
    assert e_host.store.cache_lines == 2**20 // (4 * D + 17) + 100
    assert oe.make_table({"type": "normal", "mean": 0, "std": 1}) == {
        "initializer": {"type": "normal", "mean": 0, "std": 1}}
    with pytest.raises(ValueError, match="physical_block_size"):
        oe.make_cached_ssd_store_options(1, str(tmp_path), physical_block_size=1000)
    with pytest.raises(ValueError, match="1 ranks"):
        oe.MultiTableEmbedding("x", D, flow.float, flow.int64, None,
                               oe.make_device_mem_store_options(["a", "b"], 10))
    with pytest.raises(NotImplementedError, match="float32"):
        oe.MultiTableEmbedding("x", D, flow.float64, flow.int64, None, dev)
    with pytest.raises(TypeError, match="int"):
        oe.MultiTableEmbedding("x", [2, 2], flow.float, flow.int64, None, dev)


def test_lookup_inside_eval_graph_equals_eager(tmp_path):
    """An eval graph's lookup (the op one_embedding_lookup in the Job) returns the eager rows,
    new keys included; training graphs: test_graph.py."""
    emb = _embedding(tmp_path, 1)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def build(self, ids):
            return self.emb(ids)

    g = G()
    ids = np.array([[1, 2, 1], [7, 2, 9]], np.int64)
    got = g(flow.tensor(ids)).numpy()
    assert [op.op_type for op in g._job().ops].count("one_embedding_lookup") == 1
    np.testing.assert_array_equal(got, emb(flow.tensor(ids)).detach().numpy())
    assert emb.store.num_keys == 4
