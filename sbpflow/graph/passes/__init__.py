"""Job passes, one module each, run in the named order below.

Each module defines `run(job) -> None`, which rewrites the Job in place; a pass that a graph
config flag turns off reads the flag from `job.config` and returns early.  `nn.Graph.debug(v)`
prints the Job after each pass (`run_passes(job, dump=print)`).
"""

from __future__ import annotations

import importlib
import os
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


# The verifier (`Job.check(placements=True)`) runs after every pass when asked (`check=True`,
# as `nn.Graph` does under `debug()`), or always when SBPFLOW_CHECK_JOBS is set (the tests).
CHECK_JOBS = os.environ.get("SBPFLOW_CHECK_JOBS", "") not in ("", "0")


def run_passes(job, dump=None, skip=(), check: bool = False) -> dict[str, float]:
    """Run every pass in ORDER (except those in `skip`) on `job`.  `dump(name, job)` is
    called after each pass; with `check` (or SBPFLOW_CHECK_JOBS=1) the verifier checks the
    Job before the first pass and after each one, naming the pass that broke it.  Returns
    the seconds each pass took."""
    check = check or CHECK_JOBS
    if check:
        _verify(job, "tracing")
    times = {}
    for name in ORDER:
        if name in skip:
            continue
        t0 = time.perf_counter()
        get(name).run(job)
        times[name] = time.perf_counter() - t0
        if check:
            _verify(job, f"pass {name}")
        if dump is not None:
            dump(name, job)
    return times


def _verify(job, after: str) -> None:
    try:
        job.check(placements=True)
    except ValueError as e:
        raise ValueError(f"the Job is inconsistent after {after}: {e}") from e
