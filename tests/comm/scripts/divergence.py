"""Ranks that run different collectives or global ops, for tests/comm/test_divergence.py.

Run on 2 ranks with the mode as argv[1]. Every mode but `long_ok` makes rank 1 diverge; the
job must then end with a non-zero status and a message naming both ranks' calls:
- dtype: rank 0 all-reduces float32, rank 1 int32 (the first collective); c10d_dtype: float64
  against float32 through torch.distributed's API;
- skip_step: a data-parallel loop (backward, then one all_reduce per gradient) where rank 1
  skips the all-reduces of step SKIP_STEP, after the first 64 collectives (same shapes every
  step: only rank 0's last all-reduces, which rank 1 never issues, tell);
- ddp_no_sync: DistributedDataParallel, where rank 1 runs one step's backward under
  no_sync (its gradients are not all-reduced that step), after the first 64 all-reduces;
- global_ops: rank 0 runs matmul where rank 1 runs add, on broadcast global tensors;
- shape: all_reduce of 4 elements on rank 0, 5 on rank 1 (the first collective); with
  SHAPE_AFTER set, after that many matching all-reduces (a sampled call must be hit).
Mode long_ok runs a correct job long enough for many sampled comparisons and prints "ok";
mode local_work_ok is a correct job whose ranks do different amounts of local work (backward
passes, local ops, evaluation) between the same collectives, and prints "ok" too.
"""

import os
import sys

import numpy as np

import sbpflow as flow
import sbpflow.distributed  # noqa: F401  (flow.comm's tensor functions)

mode = sys.argv[1]
rank = flow.env.get_rank()
STEPS, SKIP_STEP = 60, 30


def say(text):
    sys.stdout.write(f"rank {rank}: {text}\n")  # one write: the ranks share stdout
    sys.stdout.flush()


if mode == "dtype":
    t = flow.ones(4, dtype=flow.float32 if rank == 0 else flow.int32)
    flow.comm.all_reduce(t)
    say(f"all_reduce gave {t.numpy().tolist()}")
elif mode == "c10d_dtype":  # the same through the torch.distributed API
    import sbpflow.distributed as dist

    dist.init_process_group("gloo")
    t = flow.ones(2, 3, dtype=flow.float64 if rank == 0 else flow.float32)
    dist.all_reduce(t)
    say(f"all_reduce gave {t.numpy().tolist()}")
elif mode == "shape":
    for _ in range(int(os.environ.get("SHAPE_AFTER", "0"))):
        flow.comm.all_reduce(flow.ones(3))
    t = flow.ones(4 + rank)
    flow.comm.all_reduce(t)
    say(f"all_reduce gave {t.numpy().tolist()}")
elif mode == "skip_step":
    flow.manual_seed(0)
    model = flow.nn.Sequential(flow.nn.Linear(4, 3), flow.nn.Tanh(), flow.nn.Linear(3, 1))
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    x = flow.randn(8, 4) + rank
    for step in range(STEPS):
        opt.zero_grad()
        model(x).square().mean().backward()
        if not (rank == 1 and step == SKIP_STEP):
            for p in model.parameters():  # 4 all-reduces a step
                flow.comm.all_reduce(p.grad)
                p.grad /= 2
        opt.step()
        say(f"step {step} done")
elif mode == "ddp_no_sync":
    # DDP's bucket all-reduces run on the VM's comm stream; rank 1 leaves out one step's
    # (no_sync) while still running its backward, past the first 64 all-reduces.
    flow.manual_seed(0)
    model = flow.nn.parallel.DistributedDataParallel(flow.nn.Linear(4, 2))
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    x = flow.randn(8, 4) + rank
    for step in range(200):
        opt.zero_grad()
        if rank == 1 and step == 70:
            with model.no_sync():
                model(x).square().mean().backward()
        else:
            model(x).square().mean().backward()
        opt.step()
        say(f"step {step} done")
elif mode == "global_ops":
    placement = flow.placement("cpu", [0, 1])
    a = flow.tensor([[1.0, 2.0], [3.0, 4.0]]).to_global(placement, flow.sbp.broadcast)
    b = flow.tensor([[5.0, 6.0], [7.0, 8.0]]).to_global(placement, flow.sbp.broadcast)
    c = flow.matmul(a, b) if rank == 0 else flow.add(a, b)
    say(f"result {c.numpy().tolist()}")
elif mode == "long_ok":
    flow.manual_seed(0)
    model = flow.nn.Linear(3, 2)
    opt = flow.optim.SGD(model.parameters(), lr=0.05)
    placement = flow.placement("cpu", [0, 1])
    g = flow.arange(6.0).reshape(3, 2).to_global(placement, flow.sbp.broadcast)
    for step in range(150):
        opt.zero_grad()
        model(flow.ones(5, 3) * (rank + 1)).sum().backward()
        for p in model.parameters():
            flow.comm.all_reduce(p.grad)
        opt.step()
        if step % 10 == 0:  # uneven all_gathers and another shape now and then
            parts = [flow.empty(k + 1) for k in range(2)]
            flow.comm.all_gather(parts, flow.full((rank + 1,), float(rank)))
            assert parts[1].numpy().tolist() == [1.0, 1.0]
        g = (g * 1.0 + 1.0).to_global(placement, flow.sbp.broadcast if step % 2 else
                                      flow.sbp.split(0))
    total = g.to_global(placement, flow.sbp.broadcast).numpy()
    assert np.array_equal(total, np.arange(6.0).reshape(3, 2) + 150), total
    # Both ranks all-reduced the same gradients: the weights agree everywhere.
    w = model.weight.detach().clone()
    flow.comm.broadcast(w, 0)
    assert np.array_equal(w.numpy(), model.weight.detach().numpy())
    say("ok")
elif mode == "local_work_ok":
    def local_training(n):  # backward passes and optimizer steps that issue no collective
        m = flow.nn.Linear(4, 2)
        opt = flow.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(n):
            opt.zero_grad()
            m(flow.randn(3, 4)).square().sum().backward()
            opt.step()

    class Branchy(flow.nn.Module):  # branch b is used on rank 1 only
        def __init__(self):
            super().__init__()
            self.a, self.b = flow.nn.Linear(4, 2), flow.nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x) + self.b(x) if rank == 1 else self.a(x)

    flow.manual_seed(rank)
    local_training(5 if rank == 0 else 0)  # as benchmarks/ddp.py: rank 0 trains alone first
    # One all-reduce per parameter, b's first: rank 0 (b unused) issues b's at forward, rank 1
    # during backward; both are the reduction of the same backward pass through the model.
    flow.manual_seed(0)
    branchy = flow.nn.parallel.DistributedDataParallel(
        Branchy(), find_unused_parameters=True, use_bucket=False)
    opt = flow.optim.SGD(branchy.parameters(), lr=0.1)
    for _ in range(10):  # within the first 64 calls: every one compared
        opt.zero_grad()
        branchy(flow.ones(3, 4) * (rank + 1)).sum().backward()
        opt.step()
    weight = branchy.module.b.weight.detach().clone()
    flow.comm.broadcast(weight, 0)
    assert np.array_equal(weight.numpy(), branchy.module.b.weight.detach().numpy())
    t = flow.ones(3)
    for step in range(70):  # past the 64 calls that are all compared: sampled calls too
        local_training(step % 3 if rank == 0 else 2 * (step % 2))
        flow.comm.all_reduce(t)
        t /= 2
    w = flow.full((2,), float(rank))
    flow.comm.broadcast(w, 0)
    assert w.numpy().tolist() == [0.0, 0.0], w
    import sbpflow.distributed as dist

    dist.init_process_group("gloo")
    u = flow.ones(2, 3)
    local_training(3 * rank)
    dist.all_reduce(u)
    assert np.array_equal(u.numpy(), np.full((2, 3), 2.0)), u
    # DDP wrapped after unequal local training; between its steps rank 1 evaluates the model,
    # takes gradients through the bare module (a saliency map) and trains another model.
    flow.manual_seed(0)
    model = flow.nn.parallel.DistributedDataParallel(flow.nn.Linear(4, 2))
    opt = flow.optim.SGD(model.parameters(), lr=0.1)
    x = flow.randn(8, 4) + rank
    for step in range(70):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if rank == 1:
            with flow.no_grad():
                model(x)
            probe = x.clone().requires_grad_()
            model.module(probe).sum().backward()
            local_training(step % 3)
    weight = model.module.weight.detach().clone()
    flow.comm.broadcast(weight, 0)  # rank 0's weights: every rank's must be the same
    assert np.array_equal(weight.numpy(), model.module.weight.detach().numpy())
    # Global ops, with local backward passes on one rank between them.
    placement = flow.placement("cpu", [0, 1])
    g = flow.arange(6.0).reshape(3, 2).to_global(placement, flow.sbp.broadcast)
    for step in range(70):
        g = (g + 1.0).to_global(placement, flow.sbp.split(0) if step % 2 else
                                flow.sbp.broadcast)
        local_training(rank * (step % 2))
    total = g.to_global(placement, flow.sbp.broadcast).numpy()
    assert np.array_equal(total, np.arange(6.0).reshape(3, 2) + 70), total
    say("ok")
else:
    raise SystemExit(f"unknown mode {mode!r}")
