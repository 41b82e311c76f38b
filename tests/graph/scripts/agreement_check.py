"""Plan agreement under MPI (tests/graph/test_plan_agreement.py): every rank trains one step of
the same small nn.Graph, except where MODE makes the ranks in DIFFER trace another build().

usage: agreement_check.py MODE [DIFFER]   (DIFFER: comma-separated ranks, default "1")
  same       every rank the same program: the ranks agree and run
  relu       the DIFFER ranks add a relu after the first layer
  hidden     the DIFFER ranks use a hidden size of 16 instead of 8
  skip       the DIFFER ranks never call the graph (they end their script at once)
Each rank prints "rank R: ran, loss L" or "rank R: caught: <message>"; a rank that caught the
mismatch waits at a barrier (so that every rank has printed) and exits with status 3.
UNCAUGHT=1 in the environment leaves the error to end the job as a user's script would.
"""

import os
import sys

import sbpflow as flow
from sbpflow import comm, nn

rank = comm.get_rank()
mode = sys.argv[1]
differ = rank in {int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1").split(",")}

flow.manual_seed(0)
hidden = 16 if mode == "hidden" and differ else 8
layers = [nn.Linear(4, hidden), nn.Tanh()]
if mode == "relu" and differ:
    layers.append(nn.ReLU())
model = nn.Sequential(*layers, nn.Linear(hidden, 2))
opt = flow.optim.SGD(model.parameters(), lr=0.1)


class Step(nn.Graph):
    def __init__(self):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x):
        y = self.model(x)
        loss = (y * y).mean()
        loss.backward()
        return loss


x = flow.tensor([[0.5, -1.0, 2.0, 0.25]] * 3)
if mode == "skip" and differ:
    sys.stdout.write(f"rank {rank}: skipped the graph\n")  # one write: ranks share the pipe
    sys.stdout.flush()
    sys.exit(0)
try:
    loss = Step()(x)
except RuntimeError as e:
    if os.environ.get("UNCAUGHT") == "1":
        raise
    sys.stdout.write(f"rank {rank}: caught: {e}\n")  # one write: ranks share the pipe
    sys.stdout.flush()
    comm.world().barrier()
    sys.exit(3)
sys.stdout.write(f"rank {rank}: ran, loss {float(loss.numpy()):.6f}\n")  # one write
sys.stdout.flush()
