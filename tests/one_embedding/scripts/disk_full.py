"""On a small filesystem (argv[1], e.g. a 1 MiB tmpfs): fill a store until the disk is full,
then check that nothing was lost: the lookup that found no room raised OSError(ENOSPC)
naming the store, every row inserted before reads back as the lookups returned it, and a
snapshot that does not fit fails the same way, leaving no temporary file. Before blocks were
reserved the process died of SIGBUS writing through the map."""

import errno
import os
import sys

import numpy as np

from sbpflow.one_embedding.store import EmbeddingStore

root = sys.argv[1]
UNIFORM = {"type": "uniform", "low": -1.0, "high": 1.0}
store = EmbeddingStore(root, 16, 16, 64, [[(0, 16, UNIFORM)]], seed=5)  # 64 B rows
keys = np.arange(40_000, dtype=np.int64) * 3 + 1  # 2.5 MB of rows: more than the disk
seen, error = [], None
for i in range(0, len(keys), 64):
    try:
        seen.append(store.lookup(keys[i:i + 64], np.zeros(64, np.int64)))
    except OSError as e:
        error, done = e, i
        break
assert error is not None, "the disk never filled"
assert error.errno == errno.ENOSPC and root in str(error), repr(error)
assert store.num_keys == done, (store.num_keys, done)  # the failed batch inserted nothing
seen = np.concatenate(seen)
back = np.concatenate([store.read_rows(keys[i:i + 64])[:, :16] for i in range(0, done, 64)])
assert np.array_equal(back.view(np.uint32), seen.view(np.uint32)), "rows changed"
print(f"lookup full ok after {done} keys: {error}", flush=True)
try:
    store.save_snapshot("s")
except OSError as e:
    assert e.errno == errno.ENOSPC and root in str(e), repr(e)
    assert os.listdir(os.path.join(root, "snapshots")) == [], "a temporary file was left"
    print(f"snapshot full ok: {e}", flush=True)
else:
    print("snapshot fitted", flush=True)
