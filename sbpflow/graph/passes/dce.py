"""Dead-code elimination: drop ops whose outputs nothing needs.

Live roots are the ops with effects or results: `output`, `assign` (and any other op with no
outputs, which can only be there for an effect), plus the producers of `job.loss` and of the
gradients in `job.grads` (the caller may read them).  Everything those transitively read stays;
so does every `input` op (the call signature) and every `feed` op (the caller feeds it by key
whether or not it is read).  A `variable` op that an assign targets is read by that assign, so
it is live; an unused variable op goes, but its entry in `job.variables` stays (state).
"""

from __future__ import annotations

_ALWAYS_KEPT = ("input", "feed")


def run(job) -> None:
    live_tensors = set(job.loss) | set(job.grads.values())
    live_ops = set()
    # One backward sweep over the execution order: an op is live if an effect needs it or a
    # live op (later in the order, SSA) reads one of its outputs.
    for op in reversed(job.ops):
        if (not op.outputs or op.op_type in ("output", "assign") or op.op_type in _ALWAYS_KEPT
                or any(o in live_tensors for o in op.outputs)):
            live_ops.add(op.name)
            live_tensors.update(op.inputs)
    dead = [op.name for op in job.ops if op.name not in live_ops]
    if dead:
        job.remove_ops(dead)
    job.stats["dce_removed"] = job.stats.get("dce_removed", 0) + len(dead)
