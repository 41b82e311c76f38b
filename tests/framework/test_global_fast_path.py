"""The eager global fast path: cached global calls run inline as local ones do.

A call on global tensors whose (op, input metas, SBPs and pieces, placement, attrs, device,
default dtype) was seen before reuses its cached `global_tensor._GlobalCall` (no attr
binding, meta or signature inference, no context building) and, when the op is small and
its stream idle, runs its kernel on this rank's pieces with no instruction object, as a cached
local call does (tests/framework/test_call_cache.py). None of that may change a result, an
SBP, a stride, an error, autograd, a random draw or the checks across ranks.

On one rank (placement [0]) here, against the uncached instruction path and local tensors;
on two ranks in global_fast_path_check.py, run below under `mpiexec -n 2` with the
consistency check off (the test suite's default for MPI jobs, SBPFLOW_CHECK_GLOBAL=1, turns
every call into a check first).
"""

from __future__ import annotations

import contextlib
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.framework import global_tensor, interpreter
from sbpflow.ops import registry
from sbpflow.sbp import infer
from sbpflow.vm import OpCall, get_vm
from tests.framework import global_programs as G
from tests.mpijob import mpiexec_cmd, run_job

S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
CHECK = str(Path(__file__).resolve().parent / "global_fast_path_check.py")


@pytest.fixture
def one():
    return flow.placement("cpu", [0])


def _counting(monkeypatch, obj, attr):
    calls = []
    original = getattr(obj, attr)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, attr, counted)
    return calls


@contextlib.contextmanager
def slow_path(monkeypatch):
    """Global ops as before the fast path: nothing cached, every kernel an instruction run by
    the stream's worker."""
    with monkeypatch.context() as m:
        m.setattr(interpreter, "_new_global_call", lambda *args: None)
        m.setattr(global_tensor, "_GLOBAL_CALL_LIMIT", 0)
        global_tensor.clear_call_caches()
        with flow.vm.inline_max(0):
            yield
    flow.synchronize()


def _same(got, want, what, strides=True):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        where = f"{what}, output {k}"
        assert g[1:3] == w[1:3], where  # dtype, shape
        assert g[0].dtype == w[0].dtype and g[0].shape == w[0].shape, where
        assert g[0].tobytes() == w[0].tobytes(), f"{where}: {g[0]} != {w[0]}"
        if strides:
            assert g[3:] == w[3:], where  # stride, sbp


CASES = [pytest.param(name, sbps, id=f"{name}-{'-'.join(map(repr, sbps))}")
         for name, (shapes, dtypes, _, _) in G.PROGRAMS.items()
         for sbps in G.sbp_choices(shapes, dtypes)]


@pytest.mark.parametrize(("name", "sbps"), CASES)
def test_cached_calls_equal_the_instruction_path_and_local_bitwise(name, sbps, one,
                                                                   monkeypatch):
    """Values, dtypes, shapes, strides and SBPs of views, in-place writes, non-contiguous
    inputs, 0-d and empty tensors, factories, position-dependent kernels, integer ops,
    autograd and seeded random ops: the first run makes the cached calls, the second runs on
    them (making none), the slow run makes a call per op and hands every kernel over."""
    local = G.run(name)
    first = G.run(name, one, sbps)
    made = _counting(monkeypatch, global_tensor._GlobalCall, "__init__")
    again = G.run(name, one, sbps)
    assert not made, f"{name}: the second run made {len(made)} new calls"
    monkeypatch.undo()
    with slow_path(monkeypatch):
        slow = G.run(name, one, sbps)
    _same(first, slow, f"{name} {sbps}, first run")
    _same(again, slow, f"{name} {sbps}, cached run")
    _same(again, local, f"{name} {sbps} against local", strides=False)


def test_a_cache_hit_infers_nothing_and_runs_inline(one, monkeypatch):
    a, b = G.logical((4, 6), 0), G.logical((4, 6), 1)
    x, y = flow.tensor(a, placement=one, sbp=S(0)), flow.tensor(b, placement=one, sbp=S(0))
    x + y, x * 2.5, x.sum(dim=1)  # noqa: B018 - make the cached calls
    assert len(registry.get("add").global_calls) >= 1
    flow.synchronize()
    news = _counting(monkeypatch, interpreter, "_new_global_call")
    made = _counting(monkeypatch, global_tensor._GlobalCall, "__init__")
    signatures = _counting(monkeypatch, infer, "choose_signature")
    binds = _counting(monkeypatch, registry.get("mul_scalar"), "bind_attrs")
    metas = _counting(monkeypatch, registry.get("sum"), "meta")
    instructions = _counting(monkeypatch, OpCall, "__init__")
    vm = get_vm()
    stream = vm.streams["cpu"]
    issued, handoffs = stream.issued, vm.handoffs()
    for _ in range(5):
        z, u, s = x + y, x * 2.5, x.sum(dim=1)
    assert (len(news), len(made), len(signatures), len(binds), len(metas)) == (0,) * 5
    assert len(instructions) == 0
    assert stream.issued - issued == 15  # each op still gets its sequence number
    assert vm.handoffs() == handoffs
    assert (z.sbp, u.sbp, s.sbp) == ((S(0),), (S(0),), (S(0),))
    assert z.placement == one and z.is_global
    np.testing.assert_array_equal(z.numpy(), a + b)
    np.testing.assert_array_equal(u.numpy(), a * 2.5)
    np.testing.assert_array_equal(s.numpy(), a.sum(1))


def test_large_or_forced_ops_still_go_to_the_worker(one):
    vm = get_vm()
    x = flow.tensor(G.logical((8, 8), 0), placement=one, sbp=S(1))
    x * 2  # noqa: B018 - cached
    with flow.vm.inline_max(0):
        before = vm.handoffs()
        y = x * 2 + 1
        assert vm.handoffs() - before == 2
    np.testing.assert_array_equal(y.numpy(), G.logical((8, 8), 0) * 2 + 1)


def test_sync_mode_runs_cached_calls_inline(one, monkeypatch):
    vm = get_vm()
    x = flow.tensor(G.logical((8, 8), 0), placement=one, sbp=B)
    x - 1  # noqa: B018 - cached
    previous = vm.mode
    flow.vm.set_mode("sync")
    try:
        instructions = _counting(monkeypatch, OpCall, "__init__")
        with flow.vm.inline_max(0):  # too big to inline in async mode: SYNC runs it anyway
            before = vm.handoffs()
            y = x - 1
            assert vm.handoffs() == before and not instructions
    finally:
        flow.vm.set_mode(previous)
    np.testing.assert_array_equal(y.numpy(), G.logical((8, 8), 0) - 1)


def test_an_input_still_being_produced_takes_the_ordered_path(one):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)
    x = flow.tensor(a, placement=one, sbp=B)
    want = None
    for _ in range(20):
        with flow.vm.inline_max(0):
            h = flow.matmul(x, x).tanh()
        out = h * 2  # cached, issued while the worker may still run the matmul
        got = out.numpy()
        want = got if want is None else want
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, (flow.matmul(flow.tensor(a), flow.tensor(a)).tanh()
                                         * 2).numpy())


def test_boxing_on_a_cached_call(one, monkeypatch):
    """SBPs that match no signature are boxed first, on hits as on misses."""
    a = G.logical((4, 6), 0)
    x, y = flow.tensor(a, placement=one, sbp=P), flow.tensor(a, placement=one, sbp=S(0))
    outs = []
    for _ in range(3):
        outs.append((x + y).numpy())
    call = next(c for c in registry.get("add").global_calls.values()
                if c.entry[3] == ((P,), (S(0),)))
    assert call.boxes
    made = _counting(monkeypatch, global_tensor._GlobalCall, "__init__")
    boxes = _counting(monkeypatch, global_tensor, "box")
    z = x + y
    assert not made and len(boxes) == sum(s != w for s, w in zip(((P,), (S(0),)), call.want))
    assert len(boxes) >= 1
    for got in outs + [z.numpy()]:
        np.testing.assert_array_equal(got, a + a)


def test_a_view_of_a_boxed_copy_refuses_writes_on_cached_calls(one):
    x = flow.tensor(G.logical((3, 4), 0), placement=one, sbp=S(1))
    for _ in range(2):
        v = x.reshape(12)  # the split axis merges: x is boxed to B first
        with pytest.raises(RuntimeError, match="cannot write in place through this view"):
            v.mul_(2)


@pytest.mark.parametrize("sbp", [B, S(1)], ids=repr)  # (a view across a split boxes first)
def test_views_keep_logical_strides_and_write_through(one, sbp):
    import torch

    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x, ref = flow.tensor(a, placement=one, sbp=sbp), torch.tensor(a)
    for _ in range(2):
        v = x.transpose(0, 2)[1:, :, 1]
        tv = ref.transpose(0, 2)[1:, :, 1]
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        assert v.stride() == tv.stride() and v.is_contiguous() == tv.is_contiguous()
        v.mul_(10)
        tv.mul_(10)
    np.testing.assert_array_equal(x.numpy(), ref.numpy())


def test_random_cached_calls_draw_fresh_and_advance_the_generator_alike(one):
    flow.manual_seed(5)
    gen = flow.default_generator
    x = flow.tensor(G.logical((4, 6), 0), placement=one, sbp=S(0))
    draws, offsets = [], []
    for _ in range(3):
        draws.append(flow.rand(4, 6, placement=one, sbp=S(0)).numpy())
        offsets.append(gen._offset)
        draws.append(flow.nn.functional.dropout(x, 0.5).numpy())
        offsets.append(gen._offset)
    assert len({d.tobytes() for d in draws}) == len(draws)  # every call drew anew
    flow.manual_seed(5)
    local = flow.tensor(G.logical((4, 6), 0))
    local_offsets = []
    for k in range(3):
        np.testing.assert_array_equal(draws[2 * k], flow.rand(4, 6).numpy())
        local_offsets.append(gen._offset)
        np.testing.assert_array_equal(draws[2 * k + 1],
                                      flow.nn.functional.dropout(local, 0.5).numpy())
        local_offsets.append(gen._offset)
    # By the logical draw, on every call, cached or not: as the local ops advance it.
    assert offsets == local_offsets


def test_autograd_on_cached_calls_equals_local(one):
    a, w = G.logical((4, 6), 0), G.logical((6, 4), 1)
    grads = []
    for _ in range(3):  # the first round makes the cached calls, forward and backward
        x = flow.tensor(a, placement=one, sbp=S(0)).requires_grad_()
        y = flow.tensor(w, placement=one, sbp=B).requires_grad_()
        loss = ((x @ y).relu() * 2.0).sum()
        loss.backward()
        assert loss.grad_fn is not None and x.grad.sbp == (S(0),) and y.grad.sbp == (B,)
        grads.append((x.grad.numpy(), y.grad.numpy()))
    lx, ly = flow.tensor(a).requires_grad_(), flow.tensor(w).requires_grad_()
    ((lx @ ly).relu() * 2.0).sum().backward()
    for gx, gy in grads:
        assert gx.tobytes() == lx.grad.numpy().tobytes()
        assert gy.tobytes() == ly.grad.numpy().tobytes()


def test_a_change_of_default_dtype_is_seen_by_cached_global_calls(one):
    """Integer inputs of floating ops take the default dtype: both caches key on it."""
    x = flow.tensor([1, 4], placement=one, sbp=B)
    sqrt = registry.get("sqrt")
    assert x.sqrt().dtype == flow.float32 and (x * 0.5).dtype == flow.float32
    assert global_tensor.apply_global(sqrt, [x], {}).dtype == flow.float32  # the general path
    previous = flow.get_default_dtype()
    flow.set_default_dtype(flow.float64)
    try:
        assert x.sqrt().dtype == flow.float64
        assert (x * 0.5).dtype == flow.float64
        y = global_tensor.apply_global(sqrt, [x], {})
        assert y.dtype == flow.float64 and y.numpy().dtype == np.float64
        np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])
    finally:
        flow.set_default_dtype(previous)
    assert x.sqrt().dtype == flow.float32
    assert global_tensor.apply_global(sqrt, [x], {}).dtype == flow.float32


def test_bad_input_raises_the_same_error_on_a_cached_call(one):
    x, y = (flow.tensor(G.logical((2, 3), k), placement=one, sbp=S(0)) for k in range(2))
    x + y  # noqa: B018 - cached
    wrong = flow.tensor(G.logical((4,), 2), placement=one, sbp=B)
    with pytest.raises(RuntimeError, match="must match the size") as cached:
        x + wrong
    global_tensor.clear_call_caches()
    with pytest.raises(RuntimeError, match="must match the size") as fresh:
        x + wrong
    assert str(cached.value) == str(fresh.value)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="expected all tensors to be global"):
            x + flow.ones(2, 3)
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            interpreter.apply(registry.get("add_scalar"), (x,), {"other": 1, "bogus": 2})


def test_kernel_errors_raise_at_the_call_every_time(one):
    x = flow.tensor([4, 5, 6], placement=one, sbp=B)
    zero = flow.tensor([1, 0, 2], placement=one, sbp=B)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            x // zero


def test_the_consistency_check_runs_once_per_call(one, monkeypatch):
    x = flow.tensor(G.logical((2, 3), 0), placement=one, sbp=S(0))
    x + x, x.relu()  # noqa: B018 - cached calls, made with the check off
    monkeypatch.setattr(global_tensor, "_CHECK", False)
    checks = _counting(monkeypatch, global_tensor, "_check_consistent")
    x + x  # noqa: B018
    assert not checks
    monkeypatch.setattr(global_tensor, "_CHECK", True)
    x + x, x.relu()  # noqa: B018 - cached calls
    assert len(checks) == 2
    x - x, x * 3  # noqa: B018 - new calls: the general path checks before inferring metas
    assert len(checks) == 4
    x - x  # noqa: B018 - cached by the general path
    assert len(checks) == 5
    flow.ones(2, placement=one, sbp=B)  # a factory
    assert len(checks) == 6


class _RecordingWorld:
    def __init__(self):
        self.seen = []

    def check_global_ops(self, fingerprint, entry, describe):
        self.seen.append((fingerprint, describe(entry)))


def test_the_divergence_check_sees_every_cached_call(one, monkeypatch):
    """Under MPI each global op folds its fingerprint into the ranks' running hash: on cached
    calls too, with the fingerprint of the same description as the full check compares."""
    world = _RecordingWorld()
    monkeypatch.setattr(global_tensor, "_MULTI", True)  # fingerprints are made with the call
    monkeypatch.setattr(global_tensor, "_CHECK", False)
    monkeypatch.setattr(global_tensor, "_world", lambda: world)
    global_tensor.clear_call_caches()
    x = flow.tensor(G.logical((2, 3), 0), placement=one, sbp=S(0))
    for _ in range(3):
        x + x, x * 2.0, flow.zeros(2, placement=one, sbp=B)  # noqa: B018
    texts = [text for _, text in world.seen]
    assert texts == [
        "add(float32[2, 3] (S(0),), float32[2, 3] (S(0),)) on ranks [0]",
        "mul_scalar(float32[2, 3] (S(0),); other=2.0, reverse=False) on ranks [0]",
        "full(shape=(2,), fill_value=0, dtype=sbpflow.float32) on ranks [0]",
    ] * 3, texts[:3]
    for fingerprint, text in world.seen:
        assert fingerprint == global_tensor._fingerprint(text)
    monkeypatch.setattr(global_tensor._DIVERGENCE, "on", False)
    x + x  # noqa: B018
    assert len(world.seen) == 9
    global_tensor.clear_call_caches()  # forget the fingerprints made for a world of many


def test_a_local_op_is_untouched_by_global_calls():
    x = flow.ones(2, 3)
    assert (x + x)._gl is None and not registry.get("add").global_calls.get(
        ((x._meta, None, x._meta, None), id(x._device), flow.get_default_dtype()))


# -- two ranks, the check off ---------------------------------------------------------------
def test_the_fast_path_under_mpi():
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", CHECK),
                  timeout=120, env={"SBPFLOW_CHECK_GLOBAL": "0"})
    assert job.returncode == 0, job.output
    counts = re.findall(r"(\d+) passed in", job.stdout)
    assert len(counts) == 2 and len(set(counts)) == 1, job.output
    assert int(counts[0]) >= 8, job.output
    assert not re.search(r"\b(failed|errors?|skipped|xpassed|xfailed)\b", job.stdout), \
        job.output
    assert job.strays == 0


_DIVERGING = """
import sbpflow as flow
rank = flow.env.get_rank()
p = flow.placement.all("cpu")
a = flow.ones(2, 2, placement=p, sbp=flow.sbp.broadcast)
for _ in range(3):  # both calls cached on both ranks
    a @ a, a + a
c = a @ a if rank == 0 else a + a
print(f"result {c.numpy().tolist()}", flush=True)
"""


def test_ranks_diverging_on_cached_calls_end_the_job():
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", "-c", textwrap.dedent(_DIVERGING)),
                  timeout=45, env={"SBPFLOW_CHECK_GLOBAL": "0"})
    assert job.returncode != 0, job.output
    err = job.stderr
    assert "the ranks of world ran different global ops" in err, job.output
    assert "rank 0: matmul(float32[2, 2] (B,), float32[2, 2] (B,)) on ranks [0, 1]" in err
    assert "rank 1: add(float32[2, 2] (B,), float32[2, 2] (B,)) on ranks [0, 1]" in err
    assert "result" not in job.stdout, job.output
    assert job.strays == 0
