"""Plan agreement (sbpflow/graph/agreement.py): the Job's hash is the same for the same program
whatever its file, lines and temporary directories, and differs for another program; ranks
that traced different Jobs fail together, naming the first differing op on both sides.

On one process: the fingerprint, and `agree` over an in-process world of threads (the same
collectives, so the report's logic is checked without MPI). Under mpiexec -n 2 and -n 4:
scripts/agreement_check.py, where chosen ranks trace another build().
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import sys
import threading

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.graph import agreement
from sbpflow.graph.ir import Job
from sbpflow.sbp import B, S
from sbpflow.sbp.placement import Placement
from tests.mpijob import MPIEXEC, mpiexec_cmd, run_job, timeout_scale

SCRIPT = __file__.rsplit("/", 1)[0] + "/scripts/agreement_check.py"
# A job takes 2 to 4 s quiet (tests/comm/test_failures.py: 29 s was seen at load 8.6 on 2
# cores). A mismatch that hung would last until the 600 s collective timeout, or the launch
# timeout of 120 s here.
ENDS_WITHIN_S = 45 * timeout_scale()
LAUNCH_S = 120

# The program whose Jobs the one-process tests compare; loaded from a file, so that its path
# and line numbers can change between two loads.
PROGRAM = '''
import sbpflow as flow
from sbpflow import nn


def job(hidden=8, rows=3, dtype=flow.float32, swap=False, slope=0.01, fuse=None):
    flow.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, hidden), nn.LeakyReLU(slope), nn.Linear(hidden, 2))
    model = model.to(dtype)
    opt = flow.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            if fuse is not None:
                self.config.allow_fuse_cast_scale(fuse)

        def build(self, x):
            y = self.model(x)
            if swap:
                b = y.tanh()
                a = y.sigmoid()
            else:
                a = y.sigmoid()
                b = y.tanh()
            loss = (a * b).mean()
            loss.backward()
            return loss

    g = Step()
    g(flow.ones(rows, 4, dtype=dtype))
    return g._last.job
'''
_loads = itertools.count()


def _load(path, pad: int = 0):
    """The program's job() from a file at `path`, `pad` blank lines further down."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n" * pad + PROGRAM)
    name = f"_agreement_program_{next(_loads)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop(name, None)
    return module.job


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    job = _load(tmp_path_factory.mktemp("base") / "model.py")
    return job, agreement.fingerprint(job())


# -- the fingerprint --------------------------------------------------------------------------
def test_same_program_same_hash(base):
    job, fp = base
    assert agreement.fingerprint(job()) == fp
    assert isinstance(fp, int) and -2**63 <= fp < 2**63


def test_paths_lines_and_tmp_dirs_are_left_out(base, tmp_path):
    job, fp = base
    other = _load(tmp_path / "elsewhere" / "deeper" / "train_model.py", pad=7)()
    assert agreement.fingerprint(other) == fp
    locs = {op.loc[0] for op in other.ops if op.loc}
    assert locs == {str(tmp_path / "elsewhere" / "deeper" / "train_model.py")}  # they differ


@pytest.mark.parametrize("change", [
    {"hidden": 16}, {"rows": 5}, {"dtype": flow.float64}, {"swap": True}, {"slope": 0.2},
    {"fuse": True},
], ids=["shape-hidden", "shape-rows", "dtype", "op-order", "attr", "config-flag"])
def test_another_program_another_hash(base, change):
    job, fp = base
    assert agreement.fingerprint(job(**change)) != fp


@pytest.fixture
def four_ranks(monkeypatch):
    """Placements over ranks 0..3 on this one process (the hand-made Jobs below)."""
    monkeypatch.setattr(flow.comm, "get_world_size", lambda: 4)


def _tiny(placement=None, attrs=None, loc=("/a/model.py", 3), sbp=(B,),
          is_global=False) -> Job:
    """input -> relu -> output, by hand (every tensor on `placement`; local unless
    `is_global`)."""
    placement = placement or Placement("cpu", [0])
    job = Job("tiny")
    meta = flow.ones(2, 3)._meta
    x = job.add_tensor(meta, placement, sbp, name="input-0", is_global=is_global).name
    job.add_op("input", (), (x,), {"index": 0}, name="input_0")
    y = job.add_tensor(meta, placement, sbp, is_global=is_global).name
    job.add_op("relu", (x,), (y,), attrs or {}, loc=loc)
    job.add_op("output", (y,), (), {"index": 0})
    return job


def test_addresses_and_absolute_paths_in_attrs_are_left_out(tmp_path):
    class Handle:
        pass

    one = _tiny(attrs={"store": str(tmp_path / "a" / "rank-0"), "h": repr(Handle())})
    two = _tiny(attrs={"store": str(tmp_path / "b" / "rank-0"), "h": repr(Handle())},
                loc=("/b/c/model.py", 30))
    assert agreement.fingerprint(one) == agreement.fingerprint(two)
    assert agreement.fingerprint(_tiny(attrs={"store": "rank-0"})) != agreement.fingerprint(
        _tiny(attrs={"store": "rank-1"}))  # relative strings are compared as they are


def test_names_are_left_out_structure_is_not():
    one, two = _tiny(), _tiny()
    two.ops[1].name = "renamed-99"
    assert agreement.fingerprint(one) == agreement.fingerprint(two)
    # the relu reading its own input instead of the input op's output is another graph
    three = _tiny()
    z = three.add_tensor(three.tensors["input-0"].meta, Placement("cpu", [0]), (B,)).name
    three.add_op("relu", ("input-0",), (z,), index=1)
    assert agreement.fingerprint(three) != agreement.fingerprint(one)


def test_the_rank_enters_only_through_its_own_placement(four_ranks):
    # A Job of local tensors is stamped with its rank's cpu[r] but marked local: rank 0 and
    # rank 1 read the same, as written and in the spmd reading (a hand-built Job without the
    # marker: its own placement read as local) ...
    local0, local1 = _tiny(Placement("cpu", [0])), _tiny(Placement("cpu", [1]))
    lit0, spmd0 = agreement.fingerprints(local0, rank=0)
    lit1, spmd1 = agreement.fingerprints(local1, rank=1)
    assert spmd0 == spmd1 and lit0 == lit1
    # ... while a global Job (here: on cpu[1] alone, as a pipeline stage) reads the same as
    # written on every rank, and another SBP or placement is another Job.
    stage = _tiny(Placement("cpu", [1]), is_global=True)
    assert agreement.fingerprints(stage, rank=0)[0] == agreement.fingerprints(stage, rank=1)[0]
    assert agreement.fingerprint(stage) != agreement.fingerprint(
        _tiny(Placement("cpu", [0]), is_global=True))
    both = Placement("cpu", [0, 1])
    assert agreement.fingerprint(_tiny(both, sbp=(S(0),), is_global=True)) != \
        agreement.fingerprint(_tiny(both, sbp=(B,), is_global=True))
    assert agreement.fingerprint(_tiny(both, is_global=True)) != agreement.fingerprint(
        _tiny(Placement("cpu", [0, 1, 2]), is_global=True))


# -- agree() over a world of threads ----------------------------------------------------------
class _ThreadWorld:
    """One rank of an in-process world: all_gather over threads (rank order), as MPI's."""

    def __init__(self, rank, shared):
        self.rank, self.size, self._shared = rank, shared["size"], shared

    def all_gather(self, send, sizes=None):
        s = self._shared
        send = send.reshape(1) if send.ndim == 0 else send
        s["slots"][self.rank] = send.copy()
        s["barrier"].wait()
        out = np.concatenate(s["slots"])
        s["barrier"].wait()
        s["calls"][self.rank] += 1
        return out


def _as_rank(job, r):
    """A Job of local tensors as rank r traces it: every tensor on cpu[r]."""
    for t in job.tensors.values():
        t.placement = Placement("cpu", [r])
    return job


def _agree_on_threads(jobs):
    """agree(jobs[r]) on rank r of a world of len(jobs) threads: each rank's error (or None)
    and collective count."""
    n = len(jobs)
    shared = {"size": n, "slots": [None] * n, "barrier": threading.Barrier(n, timeout=30),
              "calls": [0] * n}
    errors = [None] * n

    def rank(r):
        try:
            agreement.agree(jobs[r], world=_ThreadWorld(r, shared))
        except RuntimeError as e:
            # Each rank names its own graph: in one process, each its own Step_<n>.
            errors[r] = re.sub(r"^nn\.Graph \w+_\d+: ", "nn.Graph Step: ", str(e))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return errors, shared["calls"]


def test_agreeing_ranks_make_one_collective(base, four_ranks):
    job, _ = base
    errors, calls = _agree_on_threads([job(), _as_rank(job(), 1)])
    assert errors == [None, None] and calls == [1, 1]


def test_local_jobs_of_two_ranks_agree(four_ranks):
    errors, calls = _agree_on_threads([_tiny(Placement("cpu", [r])) for r in range(2)])
    assert errors == [None, None] and calls == [1, 1]


def test_local_and_one_rank_global_tensors_in_one_job_agree_op_by_op(four_ranks):
    # Rank r's local chain is on cpu[r], the global chain on cpu[0] on both.
    def job(r):
        j = _as_rank(_tiny(), r)
        meta = j.tensors["input-0"].meta
        x = j.add_tensor(meta, Placement("cpu", [0]), (B,), name="input-1",
                         is_global=True).name
        j.add_op("input", (), (x,), {"index": 1}, name="input_1")
        y = j.add_tensor(meta, Placement("cpu", [0]), (B,), is_global=True).name
        j.add_op("relu", (x,), (y,))
        j.add_op("output", (y,), (), {"index": 1})
        return j

    # With the local/global marker the Job reads the same as written on both ranks: one
    # collective, no exchange of descriptions.
    (lit0, _), (lit1, _) = (agreement.fingerprints(job(r), rank=r) for r in (0, 1))
    assert lit0 == lit1
    errors, calls = _agree_on_threads([job(0), job(1)])
    assert errors == [None, None] and calls == [1, 1]


def test_differing_ranks_all_fail_naming_the_first_differing_op_on_both_sides(base, four_ranks):
    job, _ = base
    errors, calls = _agree_on_threads([job(), _as_rank(job(hidden=16), 1)])
    assert errors[0] is not None and errors[0] == errors[1], errors
    assert calls == [3, 3]  # the hashes; then lengths and bytes of the descriptions
    msg = errors[0]
    assert msg.startswith("nn.Graph Step: "), msg
    assert "the ranks traced different graphs" in msg
    # op 0 is the input; op 1 the first layer's weight, 8 rows on rank 0 and 16 on rank 1
    line = re.search(r"rank 0 op 1 \(model\.0-variable-\d+\) is variable\(; var='model\.0\."
                     r"weight'\) -> float32\[8, 4\] \(B\) at [^,]*model\.py:\d+, rank 1 op 1 "
                     r"\(model\.0-variable-\d+\) is variable\(; var='model\.0\.weight'\) -> "
                     r"float32\[16, 4\] \(B\) at [^,]*model\.py:\d+", msg)
    assert line, msg


def test_a_shorter_job_is_named(four_ranks):
    long, short = _tiny(), _tiny(Placement("cpu", [1]))
    short.ops.pop()  # no output op
    errors, _ = _agree_on_threads([long, short])
    assert errors[0] == errors[1] and errors[0] is not None
    assert "rank 0 op 2 (" in errors[0]
    assert "is output(%1 float32[?, ?] (local); index=0)" in errors[0]
    assert "rank 1 has no op 2 (its Job ends after 2 ops)" in errors[0], errors[0]


def test_a_config_flag_alone_is_named(four_ranks):
    one, two = _tiny(), _tiny(Placement("cpu", [1]))
    two.config["allow_fuse_cast_scale"] = True
    errors, _ = _agree_on_threads([one, two])
    assert errors[0] == errors[1] and errors[0] is not None
    assert "rank 1 has config allow_fuse_cast_scale = True" in errors[0], errors[0]


def test_four_ranks_name_only_the_one_that_differs(base, four_ranks):
    job, _ = base
    jobs = [_as_rank(j, r) for r, j in enumerate([job(), job(), job(), job(swap=True)])]
    errors, _ = _agree_on_threads(jobs)
    assert len(set(errors)) == 1 and errors[0] is not None
    msg = errors[0]
    assert re.search(r"rank 0 op \d+ \(\S+\) is sigmoid\(.*, rank 3 op \d+ \(\S+\) is tanh\(",
                     msg), msg
    assert "rank 1 " not in msg and "rank 2 " not in msg


# -- under MPI ----------------------------------------------------------------------------------
def _caught(job, rank) -> str:
    found = re.search(rf"^rank {rank}: caught: (.*?)(?=^rank \d+: |\Z)", job.stdout,
                      re.M | re.S)
    assert found, job.output
    return found.group(1)


def _mismatch_job(n, mode, differ="1", env=None):
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", SCRIPT, mode, differ), timeout=LAUNCH_S,
                  env=env)
    assert job.returncode != 0, job.output
    assert job.seconds < ENDS_WITHIN_S, job.output
    assert job.strays == 0
    assert "ran, loss" not in job.stdout, job.output
    return job


def test_mpi_ranks_that_differ_fail_on_both_ranks_naming_both_sides():
    job = _mismatch_job(2, "relu")
    msgs = [_caught(job, r) for r in range(2)]
    assert msgs[0] == msgs[1], job.output
    assert re.search(r"rank 0 op 5 \(model\.2-variable-\d+\) is variable\(; var='model\.2\."
                     r"weight'\) -> float32\[2, 8\] \(B\) at \S*agreement_check\.py:\d+, "
                     r"rank 1 op 5 \(model\.2-relu-\d+\) is relu\(%4 float32\[\?, \?\] "
                     r"\(local\)\) -> float32\[\?, \?\] \(local\) at \S*agreement_check\.py:\d+",
                     msgs[0]), msgs[0]


def test_mpi_uncaught_mismatch_ends_the_job():
    job = _mismatch_job(2, "hidden", env={"UNCAUGHT": "1"})
    assert "uncaught RuntimeError: nn.Graph Step_0: the ranks traced different graphs" in (
        job.stderr), job.output
    assert "float32[16, 4]" in job.stderr and "float32[8, 4]" in job.stderr


def test_mpi_four_ranks_only_rank_3_differs():
    job = _mismatch_job(4, "relu", "3")
    msgs = [_caught(job, r) for r in range(4)]
    assert len(set(msgs)) == 1, job.output
    assert re.search(r"rank 0 op 5 \(.*\) is variable\(.*, rank 3 op 5 \(model\.2-relu-\d+\) "
                     r"is relu\(", msgs[0]), msgs[0]
    assert "rank 1 op" not in msgs[0] and "rank 2 op" not in msgs[0]


def _two_copies(tmp_path):
    """The script at two paths, the second 6 lines further down: one per rank (MPMD)."""
    a, b = tmp_path / "a" / "agreement_check.py", tmp_path / "b" / "c" / "agreement_check.py"
    a.parent.mkdir(parents=True)
    b.parent.mkdir(parents=True)
    shutil.copy(SCRIPT, a)
    b.write_text("\n" * 5 + "# moved down\n" + open(SCRIPT).read())
    return a, b


def _mpmd(a_args, b_args):
    py = sys.executable
    return [MPIEXEC, "-n", "1", py, "-m", "mpi4py", *a_args, ":",
            "-n", "1", py, "-m", "mpi4py", *b_args]


def test_mpi_same_program_from_two_paths_agrees_and_runs(tmp_path):
    a, b = _two_copies(tmp_path)
    job = run_job(_mpmd([str(a), "same"], [str(b), "same"]), timeout=LAUNCH_S)
    assert job.returncode == 0, job.output
    losses = re.findall(r"^rank (\d): ran, loss (\S+)$", job.stdout, re.M)
    assert sorted(r for r, _ in losses) == ["0", "1"] and len({v for _, v in losses}) == 1, (
        job.output)


def test_mpi_two_paths_that_differ_name_each_ranks_line(tmp_path):
    # The control for the test above: the same launch with rank 1 adding the relu fails, and
    # each side of the message shows that rank's own file and line.
    a, b = _two_copies(tmp_path)
    job = run_job(_mpmd([str(a), "relu", "1"], [str(b), "relu", "1"]), timeout=LAUNCH_S)
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    msg = _caught(job, 0)
    sides = re.search(r"rank 0 op 5 .* at (\S+):(\d+), rank 1 op 5 .* at (\S+):(\d+)", msg)
    assert sides, msg
    assert sides.group(1).endswith("a/agreement_check.py"), msg
    assert sides.group(3).endswith("b/c/agreement_check.py"), msg
    assert int(sides.group(4)) == int(sides.group(2)) + 6, msg


def test_mpi_a_rank_that_compiles_no_graph_ends_the_job():
    # Rank 1 never reaches the graph (here: it is never built) and ends its script: rank 0,
    # waiting in the agreement's all-gather, is told in seconds instead of hanging.
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", SCRIPT, "skip"), timeout=LAUNCH_S)
    assert job.returncode != 0 and job.seconds < ENDS_WITHIN_S, job.output
    assert "rank 0: all_gather #1 on control can never complete: rank 1 has ended" in (
        job.output), job.output
