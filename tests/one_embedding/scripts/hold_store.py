"""Open a store at argv[1] and fill it past its cache (rows written back to the value file),
print "ready", wait for a line on stdin, then read every row back: "intact" if each equals
what the lookup returned. A second store emptying the value file meanwhile would make the
read fault (SIGBUS) or return zeros."""

import sys

import numpy as np

from sbpflow.one_embedding.store import EmbeddingStore

UNIFORM = {"type": "uniform", "low": -1.0, "high": 1.0}
store = EmbeddingStore(sys.argv[1], 4, 8, 16, [[(0, 4, UNIFORM)]], seed=5,
                       physical_block_size=512)
keys = np.arange(2000, dtype=np.int64) * 7 + 1
seen = np.concatenate([store.lookup(keys[i:i + 16], np.zeros(16, np.int64))
                       for i in range(0, len(keys), 16)])
store.flush()
print("ready", flush=True)
sys.stdin.readline()
back = np.concatenate([store.read_rows(keys[i:i + 16])[:, :4]
                       for i in range(0, len(keys), 16)])
print("intact" if np.array_equal(back.view(np.uint32), seen.view(np.uint32)) else "CHANGED",
      flush=True)
