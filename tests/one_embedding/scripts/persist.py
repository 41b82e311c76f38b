"""Train, save a snapshot, go on training, then die without any cleanup (SIGKILL); or, in a
fresh process, load the snapshot and repeat the steps after it. Dumps states to compare."""

import os
import signal
import sys

import numpy as np

import sbpflow as flow
import sbpflow.one_embedding as oe


def build(path):
    flow.manual_seed(11)
    tables = [oe.make_table_options(oe.make_uniform_initializer(-0.3, 0.3)),
              oe.make_table_options(oe.make_normal_initializer(0.0, 0.2))]
    store = oe.make_cached_ssd_store_options(1, path, capacity=4000, size_factor=3)
    emb = oe.MultiTableEmbedding("persist", 8, flow.float, flow.int64, tables, store)
    return emb, flow.optim.Adam(emb.parameters(), lr=0.05)


def train(emb, opt, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids = rng.integers(0, 2**45, (64, 2)) % 3000 * 1000003
        y = emb(flow.tensor(ids))
        (y * y).sum().backward()
        opt.step()
        opt.zero_grad()


def dump(emb, out):
    keys = np.sort(emb.store.key_of_slot[: emb.store.num_keys])
    rows = np.concatenate([emb.store.read_rows(keys[i:i + 1000])
                           for i in range(0, len(keys), 1000)])
    np.savez(out, keys=keys, rows=rows, step=emb.store.step)


mode, path, out = sys.argv[1:4]
emb, opt = build(path)
if mode == "save":
    train(emb, opt, 4, 0)
    emb.save_snapshot("s1")
    dump(emb, out + "-saved.npz")
    train(emb, opt, 2, 1)
    dump(emb, out + "-after.npz")
    if len(sys.argv) > 4:  # crash inside a second save of the same name
        def crash(put, rows):
            put(rows.tobytes()[:100])
            os.kill(os.getpid(), signal.SIGKILL)
        emb.store._write_snapshot_chunk = crash
        emb.save_snapshot("s1")
    os.kill(os.getpid(), signal.SIGKILL)
else:
    emb.load_snapshot("s1")
    dump(emb, out + "-loaded.npz")
    train(emb, opt, 2, 1)
    dump(emb, out + "-resumed.npz")
    print("reloaded ok")
