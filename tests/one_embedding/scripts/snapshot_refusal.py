"""A refused load_snapshot leaves the live table as it was, on every rank.

  save PATH               (any rank count) train, save snapshot "s"
  refuse PATH WHY         train other ids, read the whole table, load "s" and expect a
                          SnapshotError matching WHY, then check the table bit for bit
  corrupt-one PATH        (2 ranks) train, save "s", train on, rank 1 flips a byte of its
                          snapshot; every rank's load must be refused and leave its table
"""

import sys

import numpy as np

import sbpflow as flow
import sbpflow.one_embedding as oe
from sbpflow import comm

rank = comm.get_rank()


def build(path):
    flow.manual_seed(3)
    store = oe.make_cached_ssd_store_options(0.05, path, capacity=3000, size_factor=3)
    emb = oe.MultiTableEmbedding("refusal", 8, flow.float, flow.int64,
                                 [oe.make_table_options(oe.make_uniform_initializer(-1, 1))],
                                 store)
    return emb, flow.optim.Adam(emb.parameters(), lr=0.05)


def train(emb, opt, steps, seed):
    rng = np.random.default_rng(seed + 100 * rank)
    for _ in range(steps):
        y = emb(flow.tensor(rng.integers(0, 2000, 256) * 7919))
        (y * y).sum().backward()
        opt.step()
        opt.zero_grad()


def table(emb):
    """Every key and its whole row (embedding and Adam state), as bits, and the step."""
    store = emb.store
    keys = np.sort(store.key_of_slot[: store.num_keys])
    rows = np.concatenate([store.read_rows(keys[i:i + 100]) for i in range(0, len(keys), 100)])
    return keys, rows.view(np.uint32), store.step


def refused_unchanged(emb, why):
    before = table(emb)
    try:
        emb.load_snapshot("s")
    except oe.SnapshotError as e:
        assert why in str(e), f"rank {rank}: {e}"
        print(f"rank {rank}: refused: {e}", flush=True)
    else:
        raise AssertionError(f"rank {rank}: the load was not refused")
    after = table(emb)
    assert np.array_equal(before[0], after[0]), f"rank {rank}: keys changed"
    changed = int((before[1] != after[1]).any(axis=1).sum())
    assert changed == 0, f"rank {rank}: {changed} of {len(before[1])} rows changed"
    assert before[2] == after[2], f"rank {rank}: step changed"
    print(f"rank {rank}: {len(before[0])} rows unchanged", flush=True)


mode, path = sys.argv[1:3]
emb, opt = build(path)
if mode == "save":
    train(emb, opt, 3, 0)
    emb.save_snapshot("s")
    print(f"rank {rank}: saved {emb.store.num_keys} keys", flush=True)
elif mode == "refuse":
    train(emb, opt, 5, 1)
    refused_unchanged(emb, sys.argv[3])
elif mode == "corrupt-one":
    train(emb, opt, 3, 0)
    emb.save_snapshot("s")
    train(emb, opt, 3, 1)
    if rank == 1:
        snap = f"{emb.store.path}/snapshots/s"
        data = bytearray(open(snap, "rb").read())
        data[-100] ^= 0x10
        open(snap, "wb").write(bytes(data))
    comm.world().barrier()
    refused_unchanged(emb, "checksum" if rank == 1 else "refused on rank(s) [1]")
