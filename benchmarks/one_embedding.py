"""One-embedding training steps against torch's embeddings, side by side in one run.

Run: python benchmarks/one_embedding.py [--keys 1000000] [--dim 16] [--batch 16384]
     python benchmarks/one_embedding.py --ranks 2      (2 ranks under the project's mpiexec)
     python benchmarks/one_embedding.py --keys 1e8 --cache-mb 1024 --steps 300 [--graph]
                                                       (a table bigger than RAM: see below)

A step is: look up a batch of Zipf-distributed ids, backward of sum(rows * c), SGD step
(lr 0.1). Rows per second = batch ids / step time. Measured, in one process:

- one-embedding with a cache that holds the whole table (RAM only after warm-up);
- torch.nn.Embedding dense + torch.optim.SGD (the update writes every row of the table);
- torch.nn.Embedding(sparse=True) and torch.nn.EmbeddingBag(sparse=True, mode="sum") +
  torch.optim.SGD (sparse updates: only the rows in the batch);
- sbpflow.nn.Embedding dense + sbpflow.optim.SGD;
- one-embedding with caches of 50%, 20% and 5% of the table: throughput against hit rate;
- RAM per key of the store (index, slot maps, cache) after every key was touched.

With --ranks N each rank runs the one-embedding step on its own batch (keys sharded over the
ranks, ids and gradients exchanged by all-to-all) and the aggregate rate is printed.

With --cache-mb M: the large-table run. All `--keys` keys (10^8: a 6.4 GB value file at dim
16) are inserted first, in chunks, so the table really holds them (each row initialised and
written back to the file as the LRU cache of M MB evicts it); then `--steps` training steps
of Zipf ids spread over the whole key space (an id's rank r becomes key r * 7919 + 3, so
hot keys are scattered over the file), through the eager step or, with --graph, through an
nn.Graph whose Job holds the lookup, gradient shuffle and update ops. Printed: insert rate,
ids/s of training, hit rate, evictions, write-backs, RAM per key of the index and slot maps
and with the cache, and the process's peak RSS (VmHWM) and anonymous RSS. The value files
are deleted at the end. `--path DIR` puts them on a chosen disk.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, run_under_mpiexec, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--keys", type=lambda x: int(float(x)), default=smoke(10**6, 10**4))
parser.add_argument("--dim", type=int, default=16)
parser.add_argument("--batch", type=int, default=smoke(16384, 256))
parser.add_argument("--steps", type=int, default=smoke(20, 2))
parser.add_argument("--ranks", type=int, default=1)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--cache-mb", type=float, default=None,
                    help="the large-table run with an LRU cache of this many MB")
parser.add_argument("--zipf", type=float, default=1.2)
parser.add_argument("--graph", action="store_true", help="large-table run: train in nn.Graph")
parser.add_argument("--path", default=None, help="large-table run: where the value file goes")
args = parser.parse_args()
threads = pin_threads(args.threads)
if args.ranks > 1:
    run_under_mpiexec(args.ranks)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402
import sbpflow.one_embedding as oe  # noqa: E402
from sbpflow import comm  # noqa: E402

after_import_pin(threads)
rank, world = comm.get_rank(), comm.get_world_size()
V, D, B = args.keys, args.dim, args.batch
ROW_BYTES = 4 * D + 17  # a cached row: values (size_factor 1), slot, tick, dirty flag


def batches(seed: int):
    rng = np.random.default_rng(seed)
    while True:
        ids = (rng.zipf(args.zipf, B) - 1) % V
        yield ids.astype(np.int64), rng.standard_normal((B, D)).astype(np.float32)


def rate(step, seed=0) -> float:
    """ids per second of `step(ids, c)` over args.steps steps after 3 warm-up steps."""
    gen = batches(seed)
    for _ in range(3):
        step(*next(gen))
    data = [next(gen) for _ in range(args.steps)]
    flow.synchronize()
    t0 = time.perf_counter()
    for ids, c in data:
        step(ids, c)
    flow.synchronize()  # sbpflow's VM runs ops asynchronously: count all of the work
    return B * args.steps / (time.perf_counter() - t0)


def one_embedding_step(budget_mb: float, path: str):
    store = oe.make_cached_ssd_store_options(budget_mb, path, capacity=V, size_factor=1)
    emb = oe.MultiTableEmbedding("bench", D, flow.float, flow.int64, None, store)
    opt = flow.optim.SGD(emb.parameters(), lr=0.1)

    def step(ids, c):
        (emb(flow.tensor(ids)) * flow.tensor(c)).sum().backward()
        opt.step()
        opt.zero_grad()
    return emb, step


def torch_step(module):
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    bag = isinstance(module, torch.nn.EmbeddingBag)

    def step(ids, c):
        t = torch.from_numpy(ids)
        out = module(t.view(-1, 1)) if bag else module(t)
        (out * torch.from_numpy(c)).sum().backward()
        opt.step()
        opt.zero_grad()
    return step


def flow_dense_step():
    emb = flow.nn.Embedding(V, D)
    opt = flow.optim.SGD(emb.parameters(), lr=0.1)

    def step(ids, c):
        (emb(flow.tensor(ids)) * flow.tensor(c)).sum().backward()
        opt.step()
        opt.zero_grad()
    return step


def touch_all(emb) -> None:
    """Look up every key once (in chunks): all keys exist, as in a trained table."""
    for start in range(0, V, 1 << 18):
        keys = np.arange(start, min(V, start + (1 << 18)), dtype=np.int64)
        with flow.no_grad():
            emb(flow.tensor(keys))


def main():
    root = tempfile.mkdtemp(prefix="sbpflow-bench-oe-")
    if world > 1:  # one directory for all ranks (rank-N below it)
        buf = np.frombuffer(root.ljust(256).encode(), np.uint8).copy()
        comm.world().broadcast(buf, root=0)
        root = buf.tobytes().decode().strip()
    full_mb = V / world * ROW_BYTES / 2**20 * 1.05
    out = {}
    try:
        emb, step = one_embedding_step(full_mb, f"{root}/full")
        touch_all(emb)
        s = emb.store
        out["one_embedding (whole table cached)"] = rate(step, seed=rank)
        ram_per_key = s.ram_bytes() / max(1, s.num_keys)
        index_per_key = (s.index.nbytes + s.key_of_slot.nbytes + s.line_of_slot.nbytes) / max(
            1, s.num_keys)
        if world > 1:
            total = np.array([out["one_embedding (whole table cached)"]])
            comm.world().all_reduce(total)
            if rank == 0:
                print(f"{world} ranks, {V} keys, dim {D}, batch {B} ids per rank: "
                      f"{total[0]:,.0f} ids/s in all ({total[0] / world:,.0f} per rank)")
            return
        print(f"{V} keys, dim {D}, batch {B} Zipf ids, SGD, {threads} thread(s)")
        torch.manual_seed(0)
        out["torch nn.Embedding dense + SGD"] = rate(torch_step(torch.nn.Embedding(V, D)))
        out["torch nn.Embedding sparse + SGD"] = rate(
            torch_step(torch.nn.Embedding(V, D, sparse=True)))
        out["torch nn.EmbeddingBag sparse + SGD"] = rate(
            torch_step(torch.nn.EmbeddingBag(V, D, mode="sum", sparse=True)))
        out["sbpflow nn.Embedding dense + SGD"] = rate(flow_dense_step())
        base = out["torch nn.Embedding dense + SGD"]
        for name, r in out.items():
            print(f"  {name:40s} {r:12,.0f} ids/s   {r / base:6.2f}x torch dense")
        print(f"  RAM per key: {ram_per_key:.0f} B with the whole table cached "
              f"({4 * D} B of values); index and slot maps alone {index_per_key:.0f} B")
        for frac in (0.5, 0.2, 0.05):
            emb, step = one_embedding_step(full_mb * frac, f"{root}/f{frac}")
            s = emb.store
            touch_all(emb)  # every key exists; the cache holds the last ones touched
            h0, m0 = s.hits, s.misses
            r = rate(step, seed=1)
            hit = (s.hits - h0) / max(1, s.hits - h0 + s.misses - m0)
            print(f"  cache {frac:4.0%} of the table: hit rate {hit:6.1%}  {r:12,.0f} ids/s  "
                  f"({s.evictions} evictions, {s.writebacks} write-backs)")
    finally:
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)


def memory() -> dict:
    """The process's VmHWM (peak RSS), VmRSS, RssAnon and RssFile, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def large_table():
    """The large-table run (--cache-mb): insert every key, then train (module docstring)."""
    root = tempfile.mkdtemp(prefix="sbpflow-bench-oe-big-", dir=args.path)
    spread = np.int64(7919)
    try:
        store = oe.make_cached_ssd_store_options(args.cache_mb, root, capacity=V, size_factor=1)
        emb = oe.MultiTableEmbedding("big", D, flow.float, flow.int64, None, store)
        s = emb.store
        print(f"{V:,} keys, dim {D}, SGD (size_factor 1), LRU cache {args.cache_mb:g} MB "
              f"({s.cache_lines:,} rows), batch {B} Zipf({args.zipf}) ids, {threads} thread(s)")
        chunk = min(1 << 20, s.cache_lines)
        t0 = time.perf_counter()
        for start in range(0, V, chunk):
            keys = np.arange(start, min(V, start + chunk), dtype=np.int64) * spread + 3
            s.lookup(keys, np.zeros(len(keys), np.int64))
        s.flush()
        dt = time.perf_counter() - t0
        mem = memory()
        index_b = s.index.nbytes + s.key_of_slot.nbytes + s.line_of_slot.nbytes
        print(f"  inserted {s.num_keys:,} keys in {dt:.0f} s ({s.num_keys / dt:,.0f} keys/s); "
              f"value file {gib(os.path.getsize(os.path.join(s.path, 'values')))}")
        print(f"  RAM per key: index and slot maps {index_b / s.num_keys:.1f} B "
              f"({gib(index_b)}), with the cache {s.ram_bytes() / s.num_keys:.1f} B "
              f"({gib(s.ram_bytes())}); RSS now {gib(mem['VmRSS'])} "
              f"(anonymous {gib(mem['RssAnon'])}, file pages {gib(mem['RssFile'])}), "
              f"peak so far {gib(mem['VmHWM'])}")
        opt = flow.optim.SGD(emb.parameters(), lr=0.1)

        def eager_step(ids, c):
            (emb(flow.tensor(ids)) * flow.tensor(c)).sum().backward()
            opt.step()
            opt.zero_grad()

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.emb = emb
                self.add_optimizer(opt)

            def build(self, ids, c):
                loss = (self.emb(ids) * c).sum()
                loss.backward()
                return loss

        runs = [("eager", eager_step)]
        if args.graph:  # then the same number of steps in nn.Graph, on the trained table
            graph = Train()
            runs.append(("nn.Graph", lambda ids, c: graph(flow.tensor(ids), flow.tensor(c))))
        gen = batches(1)
        for mode, step in runs:
            ids, c = next(gen)
            step(ids * spread + 3, c)  # warm-up (the graph compiles at its first call)
            print(f"  after a warm-up step ({mode}): peak so far {gib(memory()['VmHWM'])}")
            h0, m0, e0, w0 = s.hits, s.misses, s.evictions, s.writebacks
            t0 = time.perf_counter()
            half = None
            for k in range(args.steps):
                ids, c = next(gen)
                step(ids * spread + 3, c)
                if k == args.steps // 2:
                    half = (s.hits, s.misses)
            flow.synchronize()
            dt = time.perf_counter() - t0
            hits, misses = s.hits - h0, s.misses - m0
            late = (s.hits - half[0]) / max(1, s.hits - half[0] + s.misses - half[1])
            mem = memory()
            print(f"  training ({mode}): {args.steps} steps, {B * args.steps / dt:,.0f} ids/s; "
                  f"hit rate {hits / max(1, hits + misses):.1%} (second half {late:.1%}); "
                  f"{s.evictions - e0:,} evictions, {s.writebacks - w0:,} write-backs; RSS "
                  f"{gib(mem['VmRSS'])} (anonymous {gib(mem['RssAnon'])}, file pages "
                  f"{gib(mem['RssFile'])}), peak so far {gib(mem['VmHWM'])}")
        s.flush()
        mem = memory()
        disk = os.stat(os.path.join(s.path, "values")).st_blocks * 512
        print(f"  peak RSS (VmHWM) {gib(mem['VmHWM'])}; value file on disk {gib(disk)}; the "
              f"file's mapped pages were handed back {s.releases} times")
        s.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if args.cache_mb is not None:
    import os  # noqa: E402

    large_table()
else:
    main()
