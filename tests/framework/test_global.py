"""Global tensors: OneFlow's semantics on one rank (placement [0]) and under MPI.

The single-process tests check that a global tensor on placement [0] behaves exactly as the
local tensor with the same data, whatever its SBP (NumPy and the local result are the
oracles). The multi-rank semantics live in global_check.py, run here under `mpiexec -n 2`
and `-n 4`; the consistency check (a rank that diverges fails, with both sides named, instead
of deadlocking) runs in jobs of its own.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow.framework import global_tensor
from tests.mpijob import mpiexec_cmd, run_job

CHECK = str(Path(__file__).resolve().parent / "global_check.py")
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
SBPS = [B, S(0), S(1), P]


@pytest.fixture
def one():
    return flow.placement("cpu", [0])


def arr(shape, seed, dtype=np.float64):
    return np.random.default_rng(seed).integers(-5, 6, shape).astype(dtype)


# -- one rank: the global tensor is the local one --------------------------------------------
def test_sbp_values_print_as_oneflow():
    assert [repr(x) for x in (flow.sbp.split(0), S(3), B, P)] == ["S(0)", "S(3)", "B", "P"]
    assert flow.sbp.broadcast == B and flow.sbp.partial_sum == P and S(1) == flow.sbp.split(1)
    assert hash(S(2)) == hash(flow.sbp.split(2)) and S(0) != S(1) and B != P
    assert repr((S(0), B)) == "(S(0), B)"


def test_placement_of_one_rank(one):
    assert one.ranks == [0] and one.hierarchy == (1,) and one.type == "cpu"
    assert flow.placement.all("cpu") == one and hash(flow.placement.all("cpu")) == hash(one)
    assert flow.placement("cpu", [[0]]).hierarchy == (1, 1)
    assert flow.placement("cpu", [[0]]) != one
    with pytest.raises(ValueError, match=r"placement\(\): rank 1 is out of range: the job has "
                                         r"1 rank \(0\.\.0\)"):
        flow.placement("cpu", [0, 1])
    with pytest.raises(ValueError, match=r"rank 3 is out of range"):
        flow.placement("cpu", [[0, 1], [2, 3]])


@pytest.mark.parametrize("sbp", SBPS, ids=repr)
def test_one_rank_global_equals_local(one, sbp):
    a, w = arr((4, 3), 0), arr((3, 5), 1)
    x = flow.tensor(a, placement=one, sbp=sbp)
    assert x.is_global and x.placement == one and x.sbp == (sbp,) and x.shape == (4, 3)
    np.testing.assert_array_equal(x.to_local().numpy(), a)  # one rank: its piece is all of it
    assert x.tolist() == a.tolist() and x[1, 2].item() == a[1, 2]
    wg = flow.tensor(w, placement=one, sbp=B)
    want = flow.softmax(flow.tensor(a) @ flow.tensor(w), dim=1).numpy()
    np.testing.assert_allclose(flow.softmax(x @ wg, dim=1).numpy(), want, rtol=1e-12)
    np.testing.assert_array_equal((x * 2 - 1).relu().sum(dim=0).numpy(),
                                  np.maximum(a * 2 - 1, 0).sum(0))
    assert "placement=sbpflow.placement(type=\"cpu\", ranks=[0])" in repr(x)
    assert f"sbp=({sbp!r},)" in repr(x)


@pytest.mark.parametrize("sbp", SBPS, ids=repr)
def test_one_rank_local_to_global_and_back(one, sbp):
    local = flow.tensor(arr((3, 2), 2))
    x = local.to_global(one, sbp)
    assert x.sbp == (sbp,) and x.shape == (3, 2)
    np.testing.assert_array_equal(x.numpy(), local.numpy())
    back = x.to_local()
    assert back.is_local and not back.is_global
    np.testing.assert_array_equal(back.numpy(), local.numpy())
    for dst in SBPS:
        np.testing.assert_array_equal(x.to_global(one, dst).numpy(), local.numpy())
    y = x.to_global(copy=True)  # the same layout: a copy only when asked for
    assert y is not x and x.to_global() is x


FACTORIES = {
    "zeros": lambda **kw: flow.zeros(3, 4, **kw),
    "ones": lambda **kw: flow.ones(3, 4, **kw),
    "full": lambda **kw: flow.full((3, 4), 7, **kw),
    "arange": lambda **kw: flow.arange(1, 9, 2, **kw),
    "linspace": lambda **kw: flow.linspace(0, 1, 5, **kw),
    "eye": lambda **kw: flow.eye(3, **kw),
    "rand": lambda **kw: flow.rand(3, 4, **kw),
    "randn": lambda **kw: flow.randn(3, 4, **kw),
    "randint": lambda **kw: flow.randint(10, (3, 4), **kw),
    "randperm": lambda **kw: flow.randperm(6, **kw),
    "normal": lambda **kw: flow.normal(1.0, 2.0, (3, 4), **kw),
    "tensor": lambda **kw: flow.tensor([[1.5, 2.0], [3.0, -4.0]], **kw),
}


@pytest.mark.parametrize("name", list(FACTORIES))
@pytest.mark.parametrize("sbp", [B, S(0), P], ids=repr)
def test_one_rank_factories_equal_the_local_ones(one, name, sbp):
    flow.manual_seed(9)
    want = FACTORIES[name]()
    flow.manual_seed(9)
    x = FACTORIES[name](placement=one, sbp=sbp)
    assert x.placement == one and x.sbp == (sbp,) and x.dtype == want.dtype
    np.testing.assert_array_equal(x.numpy(), want.numpy())
    like = flow.randn_like(x) if x.dtype.is_floating_point else flow.zeros_like(x)
    assert like.placement == one and like.sbp == (sbp,) and like.shape == x.shape


def test_one_rank_autograd_matches_local(one):
    a, w = arr((4, 3), 3), arr((3, 2), 4)
    x = flow.tensor(a, placement=one, sbp=S(0), requires_grad=True)
    wg = flow.tensor(w, placement=one, sbp=B, requires_grad=True)
    mid = x * 1
    seen = []
    mid.register_hook(lambda g: seen.append(g.sbp))
    (mid.to_global(one, B) @ wg).tanh().sum().backward()
    xl = flow.tensor(a, requires_grad=True)
    wl = flow.tensor(w, requires_grad=True)
    (xl @ wl).tanh().sum().backward()
    assert seen == [(S(0),)]  # to_global's backward: the dual of S(0) is S(0)
    assert x.grad.sbp == (S(0),) and wg.grad.sbp == (B,)
    np.testing.assert_allclose(x.grad.numpy(), xl.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(wg.grad.numpy(), wl.grad.numpy(), rtol=1e-12)
    b = flow.tensor(a, placement=one, sbp=B, requires_grad=True)
    (g,) = flow.autograd.grad(b.to_global(one, S(1)).sum(), b)
    assert g.sbp == (P,)  # autograd.grad: the dual of B, as it arrives (no accumulation)
    np.testing.assert_array_equal(g.numpy(), np.ones((4, 3)))
    b.to_global(one, S(1)).sum().backward()
    assert b.grad.sbp == (B,)  # accumulated: boxed to the leaf's own SBP
    np.testing.assert_array_equal(b.grad.numpy(), np.ones((4, 3)))


def test_one_rank_inplace_and_optimizer_keep_the_layout(one):
    flow.manual_seed(2)
    local = nn.Linear(3, 2)
    model = nn.Linear(3, 2)
    model.load_state_dict(local.state_dict())
    params = list(model.parameters())
    model.to_global(one, B)
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    for name, v in model.state_dict().items():
        assert v.is_global and v.sbp == (B,)
        np.testing.assert_array_equal(v.numpy(), local.state_dict()[name].numpy())
    a = arr((5, 3), 5, np.float32)
    for net, x in [(local, flow.tensor(a)), (model, flow.tensor(a, placement=one, sbp=S(0)))]:
        opt = flow.optim.Adam(net.parameters(), lr=0.01)
        for _ in range(2):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for name, p in model.named_parameters():
        assert p.sbp == (B,) and p.placement == one
        np.testing.assert_allclose(p.detach().numpy(),
                                   dict(local.named_parameters())[name].detach().numpy(),
                                   rtol=1e-6)
    t = flow.tensor(arr((2, 2), 6), placement=one, sbp=S(1))
    t.add_(flow.tensor(arr((2, 2), 7), placement=one, sbp=P)).mul_(3)
    assert t.sbp == (S(1),)
    np.testing.assert_array_equal(t.numpy(), (arr((2, 2), 6) + arr((2, 2), 7)) * 3)
    t.zero_()
    assert t.sbp == (S(1),) and not t.numpy().any()


def test_one_rank_errors_name_function_argument_and_values(one):
    x = flow.tensor(arr((2, 3), 8), placement=one, sbp=B)
    with pytest.raises(ValueError, match=r"split\(\): axis must be a non-negative int, got -1"):
        flow.sbp.split(-1)
    with pytest.raises(IndexError, match=r"to_global\(\): argument 'sbp' splits axis 5 of a "
                                         r"2-d tensor \(expected an axis in \[0, 1\]\)"):
        x.to_global(one, S(5))
    with pytest.raises(IndexError, match=r"splits axis 2 of a 2-d tensor"):
        flow.ones(2, 3).to_global(one, S(2))
    with pytest.raises(IndexError, match=r"tensor\(\): argument 'sbp' splits axis 1 of a 1-d"):
        flow.tensor([1.0, 2.0], placement=one, sbp=S(1))
    with pytest.raises(RuntimeError, match=r"to_local\(\): expected a global tensor, but got a "
                                           r"local tensor"):
        flow.ones(3).to_local()
    with pytest.raises(ValueError, match=r"to_global\(\): argument 'sbp' has 2 entries "
                                         r"\(S\(0\), B\) but the placement's hierarchy \[1\] "
                                         r"has 1 axis"):
        x.to_global(one, (S(0), B))
    with pytest.raises(TypeError, match=r"to_global\(\): a local tensor needs a placement"):
        flow.ones(2).to_global(sbp=B)
    with pytest.raises(TypeError, match=r"to_global\(\): argument 'placement' must be "
                                        r"sbpflow.placement, got list"):
        x.to_global([0], B)
    with pytest.raises(TypeError, match=r"to_global\(\): argument 'sbp' must be an SBP"):
        x.to_global(one, "B")
    with pytest.raises(TypeError, match=r"randn\(\): placement= needs an sbp="):
        flow.randn(2, placement=one)
    with pytest.raises(TypeError, match=r"(ones|full)\(\): sbp= needs a placement= as well"):
        flow.ones(2, sbp=B)
    with pytest.raises(RuntimeError, match=r"add.*expected all tensors to be global, but got "
                                           r"a local tensor"):
        x + flow.ones(2, 3)


def test_one_rank_consistency_check_lets_agreeing_programs_run(one, monkeypatch):
    monkeypatch.setattr(global_tensor, "_CHECK", False)
    global_tensor.set_consistency_check(True)
    assert global_tensor.consistency_check_enabled()
    x = flow.tensor(arr((3, 4), 9), placement=one, sbp=S(0))
    y = (x @ x.to_global(one, B).T).sum(dim=1)
    np.testing.assert_array_equal(y.numpy(), (arr((3, 4), 9) @ arr((3, 4), 9).T).sum(1))
    global_tensor.set_consistency_check(False)
    assert not global_tensor.consistency_check_enabled()
    flow.env.check_global_consistency(True)
    assert flow.env.global_consistency_checked() and global_tensor.consistency_check_enabled()
    flow.env.check_global_consistency(False)
    assert not flow.env.global_consistency_checked()


# -- under MPI ---------------------------------------------------------------------------------
def _pytest_job(n, timeout):
    return run_job(mpiexec_cmd(n, "-m", "mpi4py", "-m", "pytest", "-q", "-p",
                               "no:cacheprovider", CHECK), timeout=timeout)


@pytest.mark.parametrize("n", [2, 4])
def test_global_semantics_under_mpi(n):
    job = _pytest_job(n, timeout=120)
    assert job.returncode == 0, job.output
    # One summary per rank, all alike, and nothing but passes.
    counts = re.findall(r"(\d+) passed in", job.stdout)
    assert len(counts) == n and len(set(counts)) == 1, job.output
    assert int(counts[0]) >= 85, job.output
    assert not re.search(r"\b(failed|errors?|skipped|xpassed|xfailed)\b", job.stdout), \
        job.output
    assert job.strays == 0


# Each rank runs a different global op (or the same op on different shapes, or a host read
# against an op); with the consistency check on, every rank must fail at that op, naming both.
DIVERGE = {
    "op": ("x = flow.ones(4, 3, placement=p, sbp=flow.sbp.split(0))\n"
           "y = x * 2 if rank == 1 else x + 1",
           [r"add_scalar\(float32\[4, 3\] \(S\(0\),\)", r"mul_scalar\(float32\[4, 3\]"]),
    "shape": ("x = flow.tensor(np.ones((4, 3 + rank)), placement=p, sbp=flow.sbp.broadcast)\n"
              "y = x.exp()",
              [r"exp\(float64\[4, 3\] \(B,\)", r"exp\(float64\[4, 4\] \(B,\)"]),
    "numpy": ("x = flow.ones(4, 3, placement=p, sbp=flow.sbp.split(0))\n"
              "y = x.numpy() if rank == 0 else x.relu()",
              [r"boxing\(float32\[4, 3\] \(S\(0\),\); to='\(B,\) on ranks \[0, 1\]'\)",
               r"relu\(float32\[4, 3\] \(S\(0\),\)"]),
}
_PROGRAM = """
import os, numpy as np
import sbpflow as flow
from sbpflow.framework.global_tensor import set_consistency_check
set_consistency_check(True)
rank = flow.env.get_rank()
p = flow.placement.all("cpu")
x0 = flow.ones(2, placement=p, sbp=flow.sbp.broadcast) + 1  # an agreeing op first
try:
{body}
    said = "no error"
except RuntimeError as e:
    said = f"caught: {{e}}"
# One file per rank: the ranks' lines on a shared stdout may interleave.
with open(os.path.join(os.environ["GLOBAL_CHECK_OUT"], f"rank{{rank}}.txt"), "w") as f:
    f.write(said)
"""


@pytest.mark.parametrize("case", list(DIVERGE))
def test_consistency_check_names_both_ranks_instead_of_deadlocking(case, tmp_path):
    body, patterns = DIVERGE[case]
    code = _PROGRAM.format(body=textwrap.indent(body, "    "))
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", "-c", code), timeout=45,
                  env={"GLOBAL_CHECK_OUT": str(tmp_path)})
    assert job.returncode == 0, job.output
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.txt").read_text()
        assert text.startswith("caught: global consistency check failed"), (text, job.output)
        assert f"rank {rank} runs" in text and f"rank {1 - rank} runs" in text, text
        for pattern in patterns:
            assert re.search(pattern, text), (pattern, text)
    assert job.seconds < 30, f"the job took {job.seconds:.1f} s: the check is not fast"
    assert job.strays == 0


def test_consistency_check_uncaught_ends_the_whole_job():
    code = ("import sbpflow as flow\n"
            "flow.env.check_global_consistency(True)\n"  # the public switch
            "p = flow.placement.all('cpu')\n"
            "x = flow.randn(8, 4, placement=p, sbp=flow.sbp.split(1))\n"
            "y = x.sum(dim=0) if flow.env.get_rank() == 0 else x.sum(dim=1)\n"
            "print(y.numpy())\n")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", "-c", code), timeout=45)
    assert job.returncode != 0, job.output
    assert "global consistency check failed" in job.output, job.output
    # (the ranks' lines share one pipe and may interleave: look for the pieces)
    assert "runs sum(float32[8, 4] (S(1),); dim=(0,)" in job.output, job.output
    assert "runs sum(float32[8, 4] (S(1),); dim=(1,)" in job.output, job.output
    assert job.seconds < 30 and job.strays == 0
