"""Data-parallel training with a checkpoint after every step, for the multi-machine tests.

    python train_resume.py --dir DIR [--steps N] [--resume] [--step-delay S]

One process trains on the whole batch of each step; under the launcher each of the W ranks
trains a DDP replica on its 1/W slice (the loss is a mean, so averaged gradients equal the
whole batch's). After every step rank 0 saves model, optimizer (SGD with momentum: its state
matters) and step to DIR/checkpoint.safetensors; `--resume` continues from there. At the end
rank 0 writes the parameters to DIR/final.npz. Prints "rank R: step K" as it goes.
"""

import argparse
import os
import time

import numpy as np

import sbpflow as flow
from sbpflow import comm
from sbpflow.nn.parallel import DistributedDataParallel

BATCH = 16
nn = flow.nn


def make_model():
    flow.manual_seed(7)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step):
    rng = np.random.default_rng(1000 + step)
    return (rng.standard_normal((BATCH, 8)).astype(np.float32),
            rng.standard_normal((BATCH, 4)).astype(np.float32))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--step-delay", type=float, default=0.0)
    args = p.parse_args()
    rank, world = comm.get_rank(), comm.get_world_size()
    ckpt = os.path.join(args.dir, "checkpoint.safetensors")
    print(f"rank {rank}: on {os.environ.get('PMI_HOSTNAME', 'this machine')}", flush=True)

    model = make_model()
    opt = flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    start = 0
    if args.resume:
        state = flow.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed at step {start}", flush=True)
    train_model = DistributedDataParallel(model) if world > 1 else model
    per = BATCH // world
    for step in range(start, args.steps):
        x, y = batch(step)
        x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
        opt.zero_grad()
        loss = ((train_model(flow.from_numpy(x)) - flow.from_numpy(y)) ** 2).mean()
        loss.backward()
        opt.step()
        if rank == 0:
            flow.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                       "step": step + 1}, ckpt)
        print(f"rank {rank}: step {step + 1}", flush=True)
        time.sleep(args.step_delay)
    if rank == 0:
        np.savez(os.path.join(args.dir, "final.npz"),
                 **{k: v.detach().numpy() for k, v in model.state_dict().items()})
        print("rank 0: done", flush=True)


if __name__ == "__main__":
    main()
