"""Run under `mpiexec -n 2`: profile global ops whose inputs need boxing, export each rank's
trace into argv[1], and merge them on rank 0.  Prints `rank R: profiler check passed`."""

from __future__ import annotations

import sys

import numpy as np

import sbpflow as flow
import sbpflow.profiler as profiler
from sbpflow import comm as sbp_comm
from sbpflow.sbp import B, P, S


def main(out_dir: str) -> None:
    rank = sbp_comm.get_rank()
    placement = flow.placement("cpu", [0, 1])
    data = np.arange(24, dtype=np.float32).reshape(6, 4)
    x = flow.tensor(data).to_global(placement, B).to_global(placement, S(0))
    with profiler.profile(record_shapes=True) as prof:
        gathered = x.to_global(placement, B)  # S(0) -> B: all_gather
        part = (x * 1).to_global(placement, P)  # S(0) -> P: a local reshuffle
        summed = part.to_global(placement, B)  # P -> B: all_reduce
    np.testing.assert_array_equal(gathered.to_local().numpy(), data)
    np.testing.assert_array_equal(summed.to_local().numpy(), data)
    path = prof.export_chrome_trace(f"{out_dir}/trace.json")
    assert path == f"{out_dir}/trace.rank{rank}.json", path
    sbp_comm.world().barrier()  # rank 1's file is written before rank 0 merges
    if rank == 0:
        profiler.merge_chrome_traces([f"{out_dir}/trace.rank{r}.json" for r in (0, 1)],
                                     f"{out_dir}/merged.json")
    print(f"rank {rank}: profiler check passed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
