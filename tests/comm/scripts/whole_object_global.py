"""A whole-object checkpoint of a module with global parameters, on 2 ranks: every rank
saves (rank 0 writes the logical values), every rank loads them back as global tensors.
Prints "rank R: whole-object global ok"."""

import sys

import numpy as np

import sbpflow as flow
from sbpflow import comm, nn
from sbpflow.sbp import B, Placement, S

path = sys.argv[1]
ALL = Placement.all("cpu")
flow.manual_seed(1)
m = nn.Linear(4, 3)
want = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
m.weight = nn.Parameter(m.weight.detach().to_global(ALL, B).to_global(ALL, S(0)))
m.bias = nn.Parameter(m.bias.detach().to_global(ALL, B))
flow.save({"model": m, "step": 3}, path, global_dst_rank=0)
comm.world().barrier()
got = flow.load(path, global_src_rank=0, weights_only=False)
assert got["step"] == 3 and type(got["model"]) is nn.Linear
for k, v in got["model"].named_parameters():
    assert v.is_global and isinstance(v, nn.Parameter), k
    np.testing.assert_array_equal(v.detach().numpy(), want[k])
if comm.get_rank() == 0:  # the file holds logical values: a plain local load reads it
    local = flow.load(path, weights_only=False)["model"]
    np.testing.assert_array_equal(local.weight.detach().numpy(), want["weight"])
sys.stdout.write(f"rank {comm.get_rank()}: whole-object global ok\n")
