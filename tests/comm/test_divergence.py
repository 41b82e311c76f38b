"""The divergence check: ranks that run different collectives or global ops end the job fast,
with a non-zero status and a message naming what each rank ran (never garbage with status
0, never a hang until the watchdog). 2-rank jobs under mpiexec run
scripts/divergence.py with the default settings (the sampled check; SBPFLOW_CHECK_GLOBAL=0),
plus in-process tests of the sequence comparison itself.
"""

import re

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.comm import communicator as cc

from .conftest import mpiexec_cmd, run_job, script

ENDS_WITHIN_S = 30  # a run takes a few seconds; generous for a loaded 2-core machine
DEFAULTS = {"SBPFLOW_CHECK_GLOBAL": "0"}  # the test suite's default is the full check


def _diverged(mode, env=None):
    job = run_job(mpiexec_cmd(2, script("divergence.py"), mode), timeout=90,
                  env={**DEFAULTS, **(env or {})})
    assert job.returncode != 0, job.output
    assert job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "sbpflow divergence check" in job.stderr, job.output
    return job


def test_dtype_mismatch_in_all_reduce_ends_the_job():
    job = _diverged("dtype")
    err = job.stderr
    assert "the ranks of world ran different collectives" in err, job.output
    assert "rank 0: all_reduce (float32 [4], op sum)" in err, job.output
    assert "rank 1: all_reduce (int32 [4], op sum)" in err, job.output
    assert "all_reduce gave" not in job.stdout  # nobody went on with the garbage


def test_dtype_mismatch_through_torch_distributed_ends_the_job():
    job = _diverged("c10d_dtype")
    err = job.stderr
    assert "rank 0: all_reduce (float64 [2, 3], op sum)" in err, job.output
    assert "rank 1: all_reduce (float32 [2, 3], op sum)" in err, job.output
    assert "all_reduce gave" not in job.stdout


@pytest.mark.parametrize("after", [0, 127])  # the first call; a sampled call later on
def test_all_reduce_shape_mismatch_names_both_shapes(after):
    job = _diverged("shape", {"SHAPE_AFTER": str(after)})
    err = job.stderr
    assert f"First difference, at call #{after + 1}:" in err, job.output
    assert "rank 0: all_reduce (float32 [4], op sum)" in err, job.output
    assert "rank 1: all_reduce (float32 [5], op sum)" in err, job.output
    assert "truncated" not in job.output  # not MPICH's message naming one side


def test_rank_skipping_one_steps_all_reduces_ends_the_job_when_it_ends():
    # 4 all-reduces a step; rank 1 skips those of step 30, and every step has the same
    # shapes: until rank 1 ends, its collectives are the others' with the same arguments, and
    # local work (its backward passes) is no divergence. Once rank 1's script has ended,
    # rank 0 waits in the 237th all-reduce, which rank 1 never issued: the job ends at once.
    job = run_job(mpiexec_cmd(2, script("divergence.py"), "skip_step"), timeout=90,
                  env=DEFAULTS)
    assert job.returncode != 0, job.output
    assert job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert ("rank 0: all_reduce #237 on world can never complete: rank 1 has ended (its "
            "script ended, status 0) after issuing 236 collectives on world") in job.stderr
    assert "rank 0: step 58 done" in job.stdout and "rank 0: step 59 done" not in job.stdout


def test_ddp_rank_skipping_one_steps_reduction_is_caught():
    # DDP's all-reduces run on the comm stream's worker: the check there ends the job itself.
    # They carry the number of the backward pass through the model that they reduce (rank
    # 1's no_sync pass of step 70 counts too), which every rank must agree on.
    job = _diverged("ddp_no_sync")
    err = job.stderr
    assert "found when comparing call #128" in err, job.output
    assert "First difference, at call #73:" in err, job.output  # the wrap's broadcasts: 2
    assert re.search(r"rank 0: all_reduce \(float32 \[10\], op sum\) in backward pass 71 "
                     r"through its DDP model", err), job.output
    assert re.search(r"rank 1: all_reduce \(float32 \[10\], op sum\) in backward pass 72 "
                     r"through its DDP model", err), job.output
    assert "every rank must run the same backward passes through the model, no_sync" in err
    assert "step 199 done" not in job.stdout, job.output


@pytest.mark.parametrize("full", ["0", "1"])
def test_ranks_doing_different_local_work_between_collectives_run_to_the_end(full):
    # Backward passes, optimizer steps, evaluation and gradients through a DDP model's bare
    # module on one rank only, between the same collectives (flow.comm, torch.distributed,
    # DDP wrapped after rank 0 trained alone, as benchmarks/ddp.py does, boxing): correct. So
    # is a DDP branch used on one rank only (find_unused_parameters): that rank's all-reduce
    # of the branch is issued at forward, the other's during backward, for the same pass.
    job = run_job(mpiexec_cmd(2, script("divergence.py"), "local_work_ok"), timeout=120,
                  env={"SBPFLOW_CHECK_GLOBAL": full})
    assert job.returncode == 0, job.output
    assert "rank 0: ok" in job.stdout and "rank 1: ok" in job.stdout, job.output
    assert "divergence" not in job.stderr, job.output


def test_ranks_running_different_global_ops_end_the_job():
    job = _diverged("global_ops")
    err = job.stderr
    assert "the ranks of world ran different global ops" in err, job.output
    assert "rank 0: matmul(float32[2, 2] (B,), float32[2, 2] (B,)) on ranks [0, 1]" in err
    assert "rank 1: add(float32[2, 2] (B,), float32[2, 2] (B,)) on ranks [0, 1]" in err
    assert "result" not in job.stdout, job.output


@pytest.mark.parametrize("full", ["0", "1"])
def test_check_stays_quiet_for_a_correct_long_job(full):
    # Hundreds of sampled comparisons of collectives (even and uneven) and global ops.
    job = run_job(mpiexec_cmd(2, script("divergence.py"), "long_ok"), timeout=120,
                  env={"SBPFLOW_CHECK_GLOBAL": full})
    assert job.returncode == 0, job.output
    assert "rank 0: ok" in job.stdout and "rank 1: ok" in job.stdout, job.output
    assert "divergence" not in job.stderr, job.output


def test_the_check_can_be_turned_off():
    job = run_job(mpiexec_cmd(2, script("divergence.py"), "global_ops"), timeout=90,
                  env={**DEFAULTS, "SBPFLOW_CHECK_DIVERGENCE": "0"})
    assert "divergence" not in job.stderr, job.output
    assert job.stdout.count("result") == 2, job.output  # each rank its own (wrong) value


# -- in process ----------------------------------------------------------------------------
def _compare(seqs, describe=str):
    """SequenceCheck.compare on simulated ranks, one sequence each; what each rank raised."""
    # What every rank contributes to each all-gather, taken before any rank compares.
    table = np.stack([np.array([s.count, s.hash], np.int64) for s in seqs])
    history = np.stack([cc._DivergenceTexts(s, describe)._mine() for s in seqs])

    def allgather(a):
        return table if a.shape == (2,) else history

    results = []
    for seq in seqs:
        try:
            seq.compare(allgather, describe, list(range(len(seqs))), "test")
            results.append(None)
        except cc.DivergenceError as exc:
            results.append(str(exc))
    return results


def test_sequence_compare_names_the_first_difference():
    a, b = cc.SequenceCheck("collectives"), cc.SequenceCheck("collectives")
    for i in range(10):
        a.note(hash(("x", i)), f"op{i}")
        b.note(hash(("x", i)) if i != 6 else hash("y"), f"op{i}" if i != 6 else "other")
    errors = _compare([a, b])
    assert errors[0] == errors[1] and errors[0] is not None
    assert "First difference, at call #7:" in errors[0]
    assert "rank 0: op6" in errors[0] and "rank 1: other" in errors[0]
    # All ranks restart from one state: the next comparison passes.
    for seq in (a, b):
        seq.note(1, "next")
    assert _compare([a, b]) == [None, None]


def test_sequence_compare_is_quiet_when_ranks_agree():
    seqs = [cc.SequenceCheck("global ops") for _ in range(3)]
    for seq in seqs:
        for i in range(300):
            seq.note(i * 7, f"op{i}")
    assert _compare(seqs) == [None, None, None]


def test_schedule_and_setter():
    saved = (cc.DIVERGENCE.on, cc.DIVERGENCE.first, cc.DIVERGENCE.every, cc.DIVERGENCE.full)
    try:
        flow.env.check_divergence(True, first=3, every=5)
        assert flow.env.divergence_checked()
        cc.DIVERGENCE.full = False
        due = [n for n in range(1, 21) if cc.DIVERGENCE.due(n)]
        assert due == [1, 2, 3, 5, 10, 15, 20]
        flow.env.check_divergence(False)
        assert not flow.env.divergence_checked()
        with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
            flow.env.check_divergence(True, every=0)
        # The full (debug) check compares every collective too.
        flow.env.check_global_consistency(True)
        assert cc.DIVERGENCE.full and all(cc.DIVERGENCE.due(n) for n in range(1, 200))
        flow.env.check_global_consistency(False)
        assert not cc.DIVERGENCE.full
    finally:
        cc.DIVERGENCE.on, cc.DIVERGENCE.first, cc.DIVERGENCE.every, cc.DIVERGENCE.full = saved
        flow.env.check_global_consistency(saved[3])
