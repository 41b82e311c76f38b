"""Data-parallel training step of the gpt example: sbpflow DDP against torch DDP (gloo).

Run: python benchmarks/ddp.py [--rounds 6] [--steps 5] [--threads 1]
(it starts itself under this environment's mpiexec with 2 processes; under an existing
`mpiexec -n 2` it runs as it is).

Weak scaling: every rank trains TinyGPT(block=13) on its own batch of 64 sequences (SGD,
momentum 0.9). The 1-rank rows run on rank 0 while rank 1 sleeps (it polls a non-blocking
barrier with time.sleep, so it leaves its core free instead of spinning in MPI); the 2-rank rows
run on both. Scaling efficiency = t(1 rank) / t(2 ranks), ideal 1.0.

sbpflow rows:
- DDP, bucket_cap_mb=25: the model (~0.1 M parameters) fits one bucket, so its all-reduce is
  issued when the last gradient arrives, i.e. after backward;
- DDP, bucket_cap_mb=0.05: many buckets, launched on the comm stream while backward goes on;
- no overlap: the backward runs inside `ddp.no_sync()` (no hooks fire), then every gradient is
  all-reduced with `flow.comm.all_reduce` (one blocking collective per parameter, after
  backward) and divided by the world size.
torch rows: plain module on 1 rank; torch DDP (default 25 MB buckets) over gloo on 2 ranks.

Timing: every model is built and warmed up, then the rows are timed in interleaved rounds
(load drift on the machine hits all rows alike); each step is timed separately (sbpflow
synchronized before the clock is read), a step's time is the slowest rank's, and the row shows
the median over all rounds' steps.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import after_import_pin, pin_threads, smoke  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--ranks", type=int, default=2)
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--steps", type=int, default=smoke(5, 1),
                    help="timed steps per row and round")
parser.add_argument("--rounds", type=int, default=smoke(6, 1))
parser.add_argument("--warmup", type=int, default=smoke(5, 1))
parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
args = parser.parse_args()
threads = pin_threads(args.threads)
os.environ["SBPFLOW_BLAS_THREADS"] = str(threads)

from sbpflow.comm import env as comm_env  # noqa: E402  (reads the environment only)

if not comm_env.is_multi_process():
    import subprocess

    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", str(args.ranks), sys.executable, "-m", "mpi4py", *sys.argv]
    try:
        sys.exit(subprocess.run(cmd, timeout=args.timeout).returncode)
    except subprocess.TimeoutExpired:
        sys.exit(f"ddp.py: the {args.ranks}-rank run passed {args.timeout:.0f} s; killed")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402
from mpi4py import MPI  # noqa: E402

import sbpflow as flow  # noqa: E402
import sbpflow.distributed  # noqa: E402, F401  (flow.comm's tensor functions)
from sbpflow.examples.gpt import VOCAB, TinyGPT, make_batch  # noqa: E402
from sbpflow.nn.parallel import DistributedDataParallel as FlowDDP  # noqa: E402

after_import_pin(threads)
raw = MPI.COMM_WORLD
rank, size = raw.Get_rank(), raw.Get_size()
BLOCK, BATCH, LENGTH = 13, 64, 6


def sleeping_barrier() -> None:
    """A barrier that waits with time.sleep, so an idle rank does not take a core."""
    req = raw.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def step_times(step, sync, n: int) -> list[float]:
    """Seconds of each of n steps, sync()ed before the clock is read."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def timed(step, sync, ranks: int, n: int) -> np.ndarray:
    """n per-step times on `ranks` ranks (the others sleep), each the slowest rank's."""
    sleeping_barrier()
    times = np.array(step_times(step, sync, n)) if rank < ranks else np.zeros(n)
    sleeping_barrier()
    raw.Allreduce(MPI.IN_PLACE, times, MPI.MAX)
    return times


# ---- data: every rank its own batch ------------------------------------------------------
xs, ys = make_batch(np.random.default_rng(rank), BATCH, LENGTH)


# ---- sbpflow -----------------------------------------------------------------------------
BUCKETS = {}  # bucket_cap_mb -> number of buckets DDP made


def flow_step(wrap=None, reduce_after=False):
    def make():
        flow.manual_seed(0)
        module = TinyGPT(block=BLOCK)
        model = wrap(module) if wrap else module
        if wrap:
            BUCKETS[model.bucket_bytes_cap / 2**20] = len(model._buckets)
        opt = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = flow.tensor(xs), flow.tensor(ys).reshape(-1)

        def loss():
            return flow.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y)

        def step():
            opt.zero_grad()
            if reduce_after:
                with model.no_sync():
                    loss().backward()
                with flow.no_grad():
                    for p in model.parameters():
                        if p.grad is not None:
                            flow.comm.all_reduce(p.grad)
                            p.grad.div_(size)
            else:
                loss().backward()
            opt.step()

        return step

    return make


# ---- torch -------------------------------------------------------------------------------
class TorchGPT(torch.nn.Module):
    """torch's twin of TinyGPT (same layers and sizes)."""

    def __init__(self, block: int, d_model: int = 64):
        super().__init__()
        tnn = torch.nn
        self.tok = tnn.Embedding(VOCAB, d_model)
        self.pos = tnn.Embedding(block, d_model)
        layer = tnn.TransformerEncoderLayer(d_model, 4, 4 * d_model, dropout=0.0,
                                            activation="gelu", batch_first=True,
                                            norm_first=True)
        self.blocks = tnn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = tnn.LayerNorm(d_model)
        self.head = tnn.Linear(d_model, VOCAB)
        self.register_buffer("causal", torch.ones(block, block, dtype=torch.bool).triu(1))

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t))
        return self.head(self.norm(self.blocks(h, mask=self.causal[:t, :t])))


def torch_step(ddp: bool):
    def make():
        torch.manual_seed(0)
        module = TorchGPT(BLOCK)
        model = torch.nn.parallel.DistributedDataParallel(module) if ddp else module
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = torch.tensor(xs), torch.tensor(ys).reshape(-1)

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y).backward()
            opt.step()

        return step

    return make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    port = raw.bcast(free_port() if rank == 0 else None, root=0)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                             world_size=size)

    def nothing():
        return None

    plan = [
        ("sbpflow, 1 rank (no DDP)", 1, flow_step(), flow.synchronize),
        ("sbpflow DDP, 2 ranks, bucket_cap_mb=25", size,
         flow_step(lambda m: FlowDDP(m)), flow.synchronize),
        ("sbpflow DDP, 2 ranks, bucket_cap_mb=0.05 (overlap)", size,
         flow_step(lambda m: FlowDDP(m, bucket_cap_mb=0.05)), flow.synchronize),
        ("sbpflow, 2 ranks, no overlap (no_sync + all_reduce per grad)", size,
         flow_step(lambda m: FlowDDP(m), reduce_after=True), flow.synchronize),
        ("torch, 1 rank (no DDP)", 1, torch_step(False), nothing),
        ("torch DDP (gloo), 2 ranks, bucket 25 MB", size, torch_step(True), nothing),
    ]
    # Build every model first (DDP wrapping broadcasts on all ranks), warm each up, then time
    # them in interleaved rounds so that load drift on the machine hits every row alike.
    steps = [make() if rank < ranks else None for _, ranks, make, _ in plan]
    for (_, ranks, _, sync), step in zip(plan, steps):
        timed(step, sync, ranks, args.warmup)
    times = [[] for _ in plan]
    for _ in range(args.rounds):
        for (_, ranks, _, sync), step, acc in zip(plan, steps, times):
            acc.extend(timed(step, sync, ranks, args.steps))
    rows = [(name, ranks, statistics.median(t)) for (name, ranks, _, _), t in zip(plan, times)]
    tdist.destroy_process_group()
    if rank != 0:
        return
    n_params = sum(p.numel() for p in TinyGPT(block=BLOCK).parameters())
    print(f"TinyGPT(block={BLOCK}), {n_params} parameters, batch {BATCH} per rank (weak "
          f"scaling), SGD momentum; {size} ranks on {os.cpu_count()} cores; {threads} "
          f"BLAS/OpenMP thread(s) per rank (OMP/OpenBLAS/MKL and SBPFLOW_BLAS_THREADS pinned, "
          f"torch.set_num_threads({threads})); median of {args.rounds} interleaved "
          f"rounds x {args.steps} steps after {args.warmup} warm-up, slowest rank per step")
    print("sbpflow DDP buckets: " + ", ".join(f"bucket_cap_mb={cap:.2g}: {n}"
                                              for cap, n in BUCKETS.items()))
    print()
    print("| run | ranks | ms/step | efficiency t1/t2 |")
    print("|---|---:|---:|---:|")
    base = {"sbpflow": rows[0][2], "torch": rows[4][2]}
    for name, ranks, t in rows:
        eff = "-" if ranks == 1 else f"{base[name.split()[0].rstrip(',')] / t:.2f}"
        print(f"| {name} | {ranks} | {t * 1e3:.1f} | {eff} |")


if __name__ == "__main__":
    main()
