"""Time per training step (forward, backward, optimizer) side by side in one run.

Models: an MLP 784-256-10 (batch 64), the digits CNN (batch 64) and the small GPT of
`sbpflow.examples.gpt` (batch 64); in sbpflow eager (async and SYNC VM), sbpflow `nn.Graph`,
torch eager, torch.compile (the whole step; its compile time is printed too), and for the MLP
also hand-written NumPy (the floor for our kernels).  Peak memory of one step (tracemalloc,
which sees NumPy's allocations, with the caching allocator emptied first; for the graph plus
its planned blocks) is printed for sbpflow eager and graph.

Run: python benchmarks/train_step.py [--threads N] [--no-compile]
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke, time_us  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--min-time", type=float, default=smoke(1.0, 0.005))
# A smoke run skips torch.compile: its compile of the three steps takes minutes.
parser.add_argument("--no-compile", action="store_true", default=smoke(False, True),
                    help="skip torch.compile")
args = parser.parse_args()
threads = pin_threads(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sbpflow as flow  # noqa: E402
from sbpflow.examples.digits import DigitsCNN  # noqa: E402
from sbpflow.examples.gpt import VOCAB, TinyGPT, make_batch  # noqa: E402

after_import_pin(threads)


def mlp(nn):
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def torch_digits():
    tnn = torch.nn
    m = tnn.Module()
    m.features = tnn.Sequential(
        tnn.Conv2d(1, 16, 3, padding=1), tnn.BatchNorm2d(16), tnn.ReLU(),
        tnn.Conv2d(16, 32, 3, padding=1), tnn.BatchNorm2d(32), tnn.ReLU(), tnn.MaxPool2d(2))
    m.classifier = tnn.Sequential(tnn.Flatten(), tnn.Dropout(0.2), tnn.Linear(32 * 16, 10))
    m.forward = lambda x: m.classifier(m.features(x))
    return m


def torch_gpt(block):
    tnn = torch.nn

    class T(tnn.Module):
        def __init__(self):
            super().__init__()
            self.tok = tnn.Embedding(VOCAB, 64)
            self.pos = tnn.Embedding(block, 64)
            layer = tnn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation="gelu",
                                                batch_first=True, norm_first=True)
            self.blocks = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = tnn.LayerNorm(64)
            self.head = tnn.Linear(64, VOCAB)
            self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).triu(1))

        def forward(self, idx):
            t = idx.shape[1]
            h = self.tok(idx) + self.pos(torch.arange(t))
            return self.head(self.norm(self.blocks(h, mask=self.causal[:t, :t])))

    return T()


def step_fn(lib, model, x, y, loss_fn):
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def graph_step_fn(model, x, y, loss_fn):
    """The same step as one compiled nn.Graph: forward, backward and the SGD update."""
    opt = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    class TrainGraph(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = loss_fn(self.model(x), y)
            loss.backward()
            return loss

    graph = TrainGraph()

    def step():
        return graph(x, y)

    step.graph = graph
    return step


def compiled_step_fn(model, x, y, loss_fn):
    """torch.compile of the whole step; returns (step, compile seconds)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    @torch.compile
    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    step()
    return step, time.perf_counter() - t0


def peak_bytes(fn, sync, held=lambda: 0) -> int:
    """Peak bytes one step needs (after a warm-up step): tracemalloc's peak above the start
    while the step runs, with the device's caching allocator emptied first (else eager's
    reuse of cached buffers hides its working memory from tracemalloc), plus `held()`: memory
    set aside before the step for its use (nn.Graph's planned blocks and input slots)."""
    fn()
    sync()
    flow.device("cpu").prims.allocator.clear()
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    sync()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak + held()


def graph_held_bytes(gstep) -> int:
    """Memory the graph's runtime set aside for a step: its input register slots, and the
    pages of its planned blocks that kernels write (the block is `np.empty`, so the OS backs
    only the pages touched: the ranges of the tensors a kernel writes in place there)."""
    rt = gstep.graph._last.runner
    page = 4096
    n = 0
    for name, chain in rt.chains.items():
        if name not in rt.blocks:
            continue
        pages = set()
        for t in chain.planned:
            off, size = rt.plan.tensors[t].mem
            pages.update(range(off // page, (off + size + page - 1) // page))
        n += len(pages) * page
    for reg in rt.registers.values():
        for slot in reg.slots:
            if slot.persistent:
                n += sum(a.nbytes for a in slot.arrays)
    return n


def numpy_mlp_step(x, y_onehot):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((784, 256)) * 0.03).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    w2 = (rng.standard_normal((256, 10)) * 0.06).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    vel = [np.zeros_like(p) for p in (w1, b1, w2, b2)]

    def step():
        h = x @ w1 + b1
        a = np.maximum(h, 0)
        z = a @ w2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        dz = (p - y_onehot) / len(x)
        gw2, gb2 = a.T @ dz, dz.sum(0)
        dh = (dz @ w2.T) * (h > 0)
        gw1, gb1 = x.T @ dh, dh.sum(0)
        for v, g, prm in zip(vel, (gw1, gb1, gw2, gb2), (w1, b1, w2, b2)):
            v *= 0.9
            v += g
            prm -= 0.01 * v

    return step


def _both_modes(fn):
    """(async µs, SYNC µs) per call of fn: the same code under both VM modes."""
    vm = flow.vm
    vm.set_mode("async")
    a = time_us(fn, args.min_time, sync=flow.synchronize)
    vm.set_mode("sync")
    s = time_us(fn, args.min_time)
    vm.set_mode("async")
    return a, s


def measure(name, make_flow, make_torch, loss_fns, numpy_step=None):
    """One row: every implementation of the same step, timed side by side."""
    torch.manual_seed(0)
    flow.manual_seed(0)
    f = make_flow()
    fa, fs = _both_modes(step_fn(flow, f[0], f[1], f[2], loss_fns[0]))
    mem_eager = peak_bytes(step_fn(flow, f[0], f[1], f[2], loss_fns[0]), flow.synchronize)
    g = make_flow()
    t0 = time.perf_counter()
    gstep = graph_step_fn(g[0], g[1], g[2], loss_fns[0])
    gstep()
    flow.synchronize()
    graph_compile = time.perf_counter() - t0
    fg = time_us(gstep, args.min_time, sync=flow.synchronize)
    mem_graph = peak_bytes(gstep, flow.synchronize, lambda: graph_held_bytes(gstep))
    t = make_torch()
    te = time_us(step_fn(torch, t[0], t[1], t[2], loss_fns[1]), args.min_time)
    tc = compile_s = None
    if not args.no_compile:
        t = make_torch()
        cstep, compile_s = compiled_step_fn(t[0], t[1], t[2], loss_fns[1])
        tc = time_us(cstep, args.min_time)
    ns = time_us(numpy_step, args.min_time) if numpy_step else None
    return dict(name=name, eager=fa, sync=fs, graph=fg, torch=te, compiled=tc, numpy=ns,
                compile_s=compile_s, graph_compile_s=graph_compile, mem_eager=mem_eager,
                mem_graph=mem_graph)


def _ms(v):
    return f"{v / 1e3:>9.2f}" if v is not None else f"{'-':>9}"


def _ratio(a, b):
    return f"{a / b:>9.2f}x" if a is not None and b is not None else f"{'-':>10}"


def main():
    print(f"threads: {threads} (OMP/OpenBLAS/MKL pinned; torch.set_num_threads({threads}))")
    rng = np.random.default_rng(0)
    rows = []

    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    ce = (flow.nn.functional.cross_entropy, torch.nn.functional.cross_entropy)
    rows.append(measure(
        "MLP 784-256-10",
        lambda: (mlp(flow.nn), flow.tensor(x), flow.tensor(y)),
        lambda: (mlp(torch.nn), torch.tensor(x), torch.tensor(y)),
        ce, numpy_mlp_step(x, np.eye(10, dtype=np.float32)[y])))

    xi = rng.standard_normal((64, 1, 8, 8)).astype(np.float32)
    rows.append(measure(
        "digits CNN",
        lambda: (DigitsCNN(), flow.tensor(xi), flow.tensor(y)),
        lambda: (torch_digits(), torch.tensor(xi), torch.tensor(y)), ce))

    xs, ys = make_batch(rng, 64, 6)

    def seq_ce(lib):
        return lambda logits, tgt: lib.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), tgt.reshape(-1))

    rows.append(measure(
        "small GPT",
        lambda: (TinyGPT(block=13), flow.tensor(xs), flow.tensor(ys)),
        lambda: (torch_gpt(13), torch.tensor(xs), torch.tensor(ys)),
        (seq_ce(flow), seq_ce(torch))))

    print("ms per step")
    print(f"{'model':<16}{'eager':>9}{'sync':>9}{'graph':>9}{'torch':>9}{'compile':>9}"
          f"{'numpy':>9}{'graph/torch':>12}{'graph/comp':>11}{'graph/numpy':>12}"
          f"{'eager/torch':>12}{'graph/eager':>12}")
    for r in rows:
        print(f"{r['name']:<16}{_ms(r['eager'])}{_ms(r['sync'])}{_ms(r['graph'])}"
              f"{_ms(r['torch'])}{_ms(r['compiled'])}{_ms(r['numpy'])}"
              f"{_ratio(r['graph'], r['torch']):>12}{_ratio(r['graph'], r['compiled']):>11}"
              f"{_ratio(r['graph'], r['numpy']):>12}{_ratio(r['eager'], r['torch']):>12}"
              f"{_ratio(r['graph'], r['eager']):>12}")
    print("\npeak memory of one step (tracemalloc) and first-call times")
    print(f"{'model':<16}{'eager KB':>10}{'graph KB':>10}{'graph/eager':>12}"
          f"{'nn.Graph 1st call s':>21}{'torch.compile s':>17}")
    for r in rows:
        cs = f"{r['compile_s']:>17.2f}" if r["compile_s"] is not None else f"{'-':>17}"
        print(f"{r['name']:<16}{r['mem_eager'] / 1024:>10.0f}{r['mem_graph'] / 1024:>10.0f}"
              f"{r['mem_graph'] / r['mem_eager']:>11.2f}x{r['graph_compile_s']:>21.2f}{cs}")


if __name__ == "__main__":
    main()
