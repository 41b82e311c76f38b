"""Job passes, one module each, run in the named order below.

Each module defines `run(job) -> None`, which rewrites the Job in place; a pass that a graph
config flag turns off reads the flag from `job.config` and returns early.  `nn.Graph.debug(v)`
prints the Job after each pass (`run_passes(job, dump=print)`).
"""

from __future__ import annotations

import importlib
import time

# (name, module): the order matters.  grad_accumulation (n > 1 micro-batches) copies the traced
# forward per micro-batch and differentiates each copy in turn; otherwise autograd turns
# `loss.backward()` into gradient ops; optimizer adds the update ops; the cleanups then see the
# whole step; fusion runs on the cleaned Job; reshapes of contiguous results become views;
# memory planning runs last, on the final tensors and order.
ORDER = (
    "grad_accumulation",
    "autograd",
    "optimizer",
    "constant_fold",
    "cse",
    "dce",
    "fuse_elementwise",
    "reshape_view",
    "memory_plan",
)


def get(name: str):
    """The pass module `name` (imported on first use)."""
    if name not in ORDER:
        raise KeyError(f"no graph pass named {name!r}; passes: {', '.join(ORDER)}")
    return importlib.import_module(f"{__name__}.{name}")


def run_passes(job, dump=None, skip=()) -> dict[str, float]:
    """Run every pass in ORDER (except those in `skip`) on `job`.  `dump(name, job)` is
    called after each pass.  Returns the seconds each pass took."""
    times = {}
    for name in ORDER:
        if name in skip:
            continue
        t0 = time.perf_counter()
        get(name).run(job)
        times[name] = time.perf_counter() - t0
        if dump is not None:
            dump(name, job)
    return times
