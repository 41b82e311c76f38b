"""The one-rank store: hashed index, block file, LRU cache with write-back, snapshots."""

import os

import numpy as np
import pytest

from sbpflow.one_embedding._hash import KeyIndex, initial_values, owner_of
from sbpflow.one_embedding.store import EmbeddingStore, SnapshotError

UNIFORM = {"type": "uniform", "low": -1.0, "high": 1.0}
NORMAL = {"type": "normal", "mean": 0.5, "std": 2.0}


def _store(path, lines=8, dim=4, storage=8, block=512, tables=None):
    tables = tables or [[(0, dim, UNIFORM)], [(0, dim, NORMAL)]]
    return EmbeddingStore(str(path), dim, storage, lines, tables, seed=7,
                          physical_block_size=block)


def test_index_any_magnitude_and_growth():
    idx = KeyIndex()
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**63 - 1, 5000, dtype=np.int64))
    keys = np.concatenate([keys, [0, 1, 2**63 - 1]])
    slots, new = idx.insert(keys[:3000])
    assert new.all() and np.array_equal(slots, np.arange(3000))
    slots2, new2 = idx.insert(keys)  # grows past 1024 buckets twice; old slots kept
    assert np.array_equal(slots2[:3000], slots) and not new2[:3000].any()
    assert np.array_equal(slots2[3000:], np.arange(3000, len(keys)))
    assert np.array_equal(idx.find(keys), slots2)
    absent = np.setdiff1d(np.arange(100, dtype=np.int64), keys)
    assert (idx.find(absent) == -1).all()


def test_initial_values_are_a_function_of_seed_and_key():
    keys = np.array([5, 2**50, 9], np.int64)
    a = initial_values(UNIFORM, 3, keys, 0, 1000)
    b = initial_values(UNIFORM, 3, keys[::-1], 0, 1000)[::-1]
    assert np.array_equal(a, b)  # order-independent
    assert not np.array_equal(a, initial_values(UNIFORM, 4, keys, 0, 1000))  # seeded
    assert a.min() >= -1 and a.max() < 1 and abs(a.mean()) < 0.1
    n = initial_values(NORMAL, 3, np.arange(200), 0, 500)
    assert abs(n.mean() - 0.5) < 0.05 and abs(n.std() - 2.0) < 0.05
    own = owner_of(np.arange(10000), 4)
    assert set(own.tolist()) == {0, 1, 2, 3} and np.bincount(own).min() > 2300


def test_cache_eviction_writeback_and_file_round_trip(tmp_path):
    s = _store(tmp_path, lines=8)
    keys = np.arange(100, 130, dtype=np.int64) * 1000003
    tids = np.arange(30) % 2
    first = np.concatenate([s.lookup(keys[i:i + 6], tids[i:i + 6]) for i in range(0, 30, 6)])
    assert s.evictions > 0 and s.writebacks == s.evictions  # new rows are dirty
    again = np.concatenate([s.lookup(keys[i:i + 6], tids[i:i + 6])
                            for i in range(0, 30, 6)])
    assert np.array_equal(first, again)
    expect_u = initial_values(UNIFORM, 7, keys[tids == 0], 0, 4)
    assert np.array_equal(first[tids == 0], expect_u)
    assert np.array_equal(first[tids == 1], initial_values(NORMAL, 7, keys[tids == 1], 0, 4))
    wb = s.writebacks
    s.lookup(keys[:6], tids[:6])  # clean rows are evicted without a write
    assert s.writebacks == wb
    many = np.arange(7, 7 + 20, dtype=np.int64)  # more keys than the 8 lines: in pieces
    got = s.lookup(many, np.zeros(20, np.int64))
    assert np.array_equal(got, initial_values(UNIFORM, 7, many, 0, 4))
    assert np.array_equal(s.read_rows(many)[:, :4], got)


def test_rows_never_straddle_blocks(tmp_path):
    s = _store(tmp_path, lines=4, dim=5, storage=15, block=512)  # 60 B rows: 8 per block
    off = s._offsets(np.arange(20))
    assert (off[:, 0] // 128 == off[:, -1] // 128).all()
    assert off[8, 0] == 128 and off[7, -1] < 128
    big = _store(tmp_path / "b", lines=2, dim=100, storage=300, block=512)  # 1200 B rows
    o = big._offsets(np.arange(3))
    assert o[1, 0] == 3 * 128 and o[2, 0] == 6 * 128  # three blocks per row


def test_update_marks_dirty_and_snapshot_round_trip(tmp_path):
    s = _store(tmp_path, lines=4)
    keys = np.arange(12, dtype=np.int64)
    for i in range(0, 12, 4):
        s.lookup(keys[i:i + 4], np.zeros(4, np.int64))

    def rule(rows, g, step):
        rows[:, :4] -= g
        rows[:, 4:] += 1

    s.apply_update(keys[:4], np.ones((4, 4), np.float32), rule)
    full = np.concatenate([s.read_rows(keys[i:i + 4]) for i in range(0, 12, 4)])
    s.save_snapshot("a")
    s.apply_update(keys[4:8], np.ones((4, 4), np.float32), rule)
    s.lookup(np.arange(50, 53), np.zeros(3, np.int64))
    s.load_snapshot("a")
    assert s.num_keys == 12 and s.step == 1
    back = np.concatenate([s.read_rows(keys[i:i + 4]) for i in range(0, 12, 4)])
    assert np.array_equal(back, full)


def test_snapshot_crash_keeps_previous_and_corruption_is_reported(tmp_path):
    s = _store(tmp_path, lines=16)
    keys = np.arange(10, dtype=np.int64)
    s.lookup(keys, np.zeros(10, np.int64))
    s.save_snapshot("snap")
    before = s.read_rows(keys)
    s.apply_update(keys, np.ones((10, 4), np.float32),
                   lambda rows, g, step: rows.__isub__(np.pad(g, ((0, 0), (0, 4)))))

    def crash(put, rows):
        raise KeyboardInterrupt("power cut")

    s._write_snapshot_chunk = crash
    with pytest.raises(KeyboardInterrupt):
        s.save_snapshot("snap")
    assert os.listdir(tmp_path / "snapshots") == ["snap"]  # no temporary left behind
    del s._write_snapshot_chunk
    s.load_snapshot("snap")
    assert np.array_equal(s.read_rows(keys), before)

    path = tmp_path / "snapshots" / "snap"
    data = bytearray(path.read_bytes())
    data[-30] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="checksum"):
        s.load_snapshot("snap")
    path.write_bytes(bytes(data[:-9]))
    with pytest.raises(SnapshotError, match="truncated"):
        s.load_snapshot("snap")
    path.write_bytes(b"garbage")
    with pytest.raises(SnapshotError, match="not a one-embedding snapshot"):
        s.load_snapshot("snap")
    with pytest.raises(SnapshotError, match="no snapshot named"):
        s.load_snapshot("nope")
    assert np.array_equal(s.read_rows(keys), before)  # failed loads changed nothing


def test_dedup_against_numpy():
    from sbpflow.one_embedding._hash import dedup

    rng = np.random.default_rng(2)
    keys = rng.integers(0, 2**62, 50)[rng.integers(0, 50, 3000)]
    uniq, first, inverse = dedup(keys)
    assert np.array_equal(np.sort(uniq), np.unique(keys))
    assert np.array_equal(keys[first], uniq) and np.array_equal(uniq[inverse], keys)
    assert np.array_equal(first, np.sort(first))  # first-seen order
    assert [len(a) for a in dedup(np.empty(0, np.int64))] == [0, 0, 0]


def test_mapped_file_pages_are_handed_back(tmp_path, monkeypatch):
    """Random row reads map whole neighbourhoods of the value file into RSS: past the limit
    the store releases them (MADV_DONTNEED), and the rows read afterwards are intact."""
    from sbpflow.one_embedding import store as store_mod

    monkeypatch.setattr(store_mod, "_RELEASE_BYTES", 1 << 20)
    s = EmbeddingStore(str(tmp_path), 16, 16, 4096, [[(0, 16, UNIFORM)]], seed=3,
                       physical_block_size=4096)
    keys = np.arange(200_000, dtype=np.int64) * 13 + 1  # 12.8 MB of rows in the file
    for start in range(0, len(keys), 4096):
        s.lookup(keys[start:start + 4096], np.zeros(4096, np.int64))
    rng = np.random.default_rng(0)
    for _ in range(20):
        s.lookup(rng.choice(keys, 4000, replace=False), np.zeros(4000, np.int64))
    assert s.releases > 0
    some = rng.choice(keys, 5000, replace=False)
    np.testing.assert_array_equal(s.read_rows(some), initial_values(UNIFORM, 3, some, 0, 16))
