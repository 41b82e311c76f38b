"""The eager VM: async equals SYNC bit for bit, dependences under stress, errors, memory.

Small instructions run inline on the issuing thread when their stream is idle, so tests that
mean to exercise the workers force hand-off (`flow.vm.inline_max(0)`) and check with
`vm.handoffs()` that their instructions really went to a worker."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import sbpflow as flow
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry
from sbpflow.ops.registry import OpDef
from sbpflow.vm import Mode, get_vm

from ..ops import harness as H


@pytest.fixture
def mode():
    """Run the test body, restoring ASYNC and the inline bound afterwards."""
    vm = get_vm()
    inline_max = vm.inline_max
    yield vm
    vm.set_mode(Mode.ASYNC)
    vm.inline_max = inline_max


def _issued(vm) -> int:
    return sum(s.issued for s in list(vm.streams.values()))


def _run_sample(opdef, sample):
    inputs = H.to_flow(opdef, sample, requires_grad=sample.grad)
    out = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
    roots = [o for o in out if o.requires_grad]
    if roots and opdef.grad is not None:
        flow.autograd.backward(roots, [flow.ones(*o.shape, dtype=o.dtype) for o in roots])
    flat = list(inputs[0]) if opdef.variadic else list(inputs)
    return [H.host(o) for o in out] + [H.host(t.grad) for t in flat if t.grad is not None]


@pytest.mark.parametrize("name", [n for n in registry.list_ops() if not registry.get(n).random])
def test_async_and_sync_are_bitwise_identical(name, mode):
    """The op suite in both modes: every sample's outputs and gradients, bit for bit."""
    opdef = registry.get(name)
    for sample in H.op_samples(name):
        mode.set_mode(Mode.SYNC)
        flow.manual_seed(0)
        expected = _run_sample(opdef, sample)
        mode.set_mode(Mode.ASYNC)
        flow.manual_seed(0)
        issued, handed = _issued(mode), mode.handoffs()
        with flow.vm.inline_max(0):  # every instruction goes to a worker, however small
            got = _run_sample(opdef, sample)
        # Nothing ran inline: the comparison is worker against SYNC, not inline against it.
        n = _issued(mode) - issued
        assert n > 0 and mode.handoffs() - handed == n, (name, n, mode.handoffs() - handed)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            assert g.tobytes() == e.tobytes(), f"{name} {sample}"


def _random_program(n_ops: int, seed: int):
    """A random DAG of ops with in-place updates and writes through views; returns the pool."""
    rng = np.random.default_rng(seed)
    shapes = [(4, 4), (96, 96)]  # with inline_max 1000: 16 elements inline, 9216 handed off
    pool = [flow.tensor(rng.standard_normal(shapes[i % 2]).astype(np.float32))
            for i in range(8)]
    for _ in range(n_ops):
        k = int(rng.integers(0, 8))
        i, j = int(rng.integers(0, len(pool))), int(rng.integers(0, len(pool)))
        a, b = pool[i], pool[j]
        if a.shape != b.shape:
            b = pool[(j + 1) % len(pool)] if pool[(j + 1) % len(pool)].shape == a.shape else a
        if k == 0:
            pool[i] = a + b * 0.5
        elif k == 1:
            a.mul_(0.9).add_(b, alpha=0.1)  # in place on a pooled tensor
        elif k == 2:
            v = a.t()  # a view; write through it
            v.add_(0.01)
        elif k == 3:
            a[: a.shape[0] // 2].copy_(b[a.shape[0] // 2 :])  # slice views on both sides
        elif k == 4:
            pool[i] = (a @ b).tanh()
        elif k == 5:
            pool[j if pool[j].shape == a.shape else i] = a - a.mean()
        elif k == 6:
            pool[i] = a.clamp(-3, 3)
        else:
            a.sub_(a.sum(dim=0, keepdim=True) * 0.001)
        if len(pool) > 8:
            pool.pop(0)
    return [t.numpy().copy() for t in pool]


def test_random_dag_stress_matches_sync(mode):
    """Over 10^5 instructions from a random DAG with in-place updates and writes through
    views: ASYNC gives exactly the SYNC result."""
    steps = 40_000
    mode.set_mode(Mode.SYNC)
    expected = _random_program(steps, seed=1)
    mode.set_mode(Mode.ASYNC)
    stream = mode.stream("cpu")
    before, handed = stream.issued, stream.handed_off
    with flow.vm.inline_max(1000):  # small pool tensors inline (when idle), large ones not
        got = _random_program(steps, seed=1)
    issued, handed = stream.issued - before, stream.handed_off - handed
    assert issued >= 100_000
    # Mostly the worker: a small one runs inline only when the stream has drained.
    assert 3 * handed >= issued, (issued, handed)
    for g, e in zip(got, expected):
        assert np.array_equal(g, e)


def _failing_opdef():
    def kernel(ctx, x):
        raise ValueError("boom from the kernel")

    return OpDef("test_failing", inputs=("input",), infer_meta=lambda x: x, kernel=kernel)


def test_kernel_error_surfaces_at_next_sync_with_op_and_site(mode):
    big = flow.ones(600, 600)  # large: runs on the worker
    bad = apply(_failing_opdef(), (big,), {})  # issued here: this line is named
    line = sys._getframe().f_lineno - 1
    downstream = bad * 2  # depends on the failed result
    with pytest.raises(ValueError) as info:
        downstream.numpy()
    msg = str(info.value)
    assert "test_failing" in msg and "boom from the kernel" in msg
    assert f"test_vm.py:{line}" in msg
    # The VM stays usable; unrelated work is right; the error is not raised twice.
    ok = (flow.ones(3) * 3).numpy()
    assert ok.tolist() == [3.0, 3.0, 3.0]
    flow.synchronize()


def test_pending_error_raised_by_synchronize(mode):
    apply(_failing_opdef(), (flow.ones(600, 600),), {})
    with pytest.raises(ValueError, match="boom"):
        flow.synchronize()
    flow.synchronize()  # cleared


def test_small_instruction_run_inline_raises_at_once(mode):
    """A small op on an idle stream runs on the issuing thread: its error raises right there,
    naming the op, with the user's line in the traceback."""
    flow.synchronize()  # idle: nothing queued from earlier tests (e.g. releases)
    with pytest.raises(ValueError, match="test_failing: boom") as info:
        apply(_failing_opdef(), (flow.ones(3),), {})
    assert any(entry.name == "test_small_instruction_run_inline_raises_at_once"
               for entry in info.traceback)
    assert (flow.ones(2) + 1).tolist() == [2.0, 2.0]


def test_sync_mode_raises_in_place(mode):
    mode.set_mode(Mode.SYNC)
    with pytest.raises(ValueError, match="boom"):
        apply(_failing_opdef(), (flow.ones(2),), {})


def test_sync_mode_from_environment():
    code = "import sbpflow as f; print(f.vm.get_mode().value)"
    env = dict(os.environ, SBPFLOW_VM_MODE="sync")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "sync", out.stderr


def test_blas_threads_are_the_same_in_both_modes():
    """SYNC must give async's numbers, and a GEMM's bits can depend on BLAS's thread count, so
    switching modes leaves the count alone (one core less than the machine, at least one)."""
    code = ("import os, numpy as np, sbpflow as f; from threadpoolctl import threadpool_info\n"
            "def blas(): return sorted({i['num_threads'] for i in threadpool_info() "
            "if i['user_api'] == 'blas'})\n"
            "f.ones(2).numpy(); a = blas(); f.vm.set_mode('sync'); s = blas()\n"
            "f.vm.set_mode('async'); b = blas()\n"
            "print(a == s == b == [max(1, len(os.sched_getaffinity(0)) - 1)], a, s, b)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                        "SBPFLOW_BLAS_THREADS", "SBPFLOW_VM_MODE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.startswith("True"), (out.stdout, out.stderr)


def test_inline_max_from_environment_hands_small_ops_to_the_worker():
    code = ("import sbpflow as f; x = f.ones(3) + 1; x.numpy(); "
            "print(f.vm.get_inline_max(), f.vm.handoffs() >= 2)")
    env = dict(os.environ, SBPFLOW_VM_INLINE_MAX="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "0 True", out.stderr


def test_inline_max_knob_switches_at_runtime_and_restores(mode):
    default = flow.vm.get_inline_max()
    x = flow.ones(3)
    flow.synchronize()
    handed = mode.handoffs()
    y = x + 1  # small, stream idle: inline
    assert mode.handoffs() == handed
    with flow.vm.inline_max(0):
        assert flow.vm.get_inline_max() == 0
        z = y * 2
        assert mode.handoffs() > handed
    assert flow.vm.get_inline_max() == default
    assert z.tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="inline_max"):
        flow.vm.set_inline_max(-1)
    assert flow.vm.get_inline_max() == default


def test_host_access_waits_only_for_its_writers(mode):
    small = flow.ones(4) * 2
    a = flow.ones(700, 700)  # large enough to be handed to the worker
    for _ in range(6):
        a = a @ a * 0.001  # long-running work issued after `small`
    vm = mode
    got = small.numpy()
    in_flight = vm.in_flight()
    assert got.tolist() == [2.0] * 4
    assert in_flight > 0, "numpy() waited for unrelated work"
    flow.synchronize()


def _slow_add_one():
    def kernel(ctx, x):
        time.sleep(0.0005)  # the worker is slower than the issuing thread: the queue grows
        return ctx.prims.binary("add", x, ctx.prims.full((), ctx.in_metas[0].dtype, 1))

    return OpDef("test_slow_add_one", inputs=("input",), infer_meta=lambda x: x,
                 kernel=kernel)


def test_throttle_bounds_instructions_in_flight(mode, monkeypatch):
    """The issuing thread runs ahead of a slow worker up to HIGH_WATER instructions, then
    waits until LOW_WATER remain.  Lowered marks keep it quick; without the throttle the
    in-flight count would reach the number of instructions issued."""
    vm = mode
    monkeypatch.setattr(vm, "HIGH_WATER", 64)
    monkeypatch.setattr(vm, "LOW_WATER", 16)
    slow = _slow_add_one()
    x = flow.ones(8, 8)
    flow.synchronize()
    handed = vm.handoffs()
    peak, trough_after_peak = 0, None
    n = 4 * vm.HIGH_WATER
    with flow.vm.inline_max(0):
        for _ in range(n):
            x = apply(slow, (x,), {})
            now = vm.in_flight()
            peak = max(peak, now)
            if peak >= vm.HIGH_WATER and (trough_after_peak is None or now < trough_after_peak):
                trough_after_peak = now
    assert vm.handoffs() - handed >= n  # and a few releases
    assert peak > vm.LOW_WATER, f"the worker kept up (peak {peak}): the throttle was not tested"
    assert peak <= vm.HIGH_WATER + 1, f"{peak} instructions in flight"
    # Once the throttle kicked in, the issuing thread waited for the queue to drain.
    assert peak >= vm.HIGH_WATER and trough_after_peak <= vm.LOW_WATER + 1, (
        peak, trough_after_peak)
    flow.synchronize()
    assert x[0, 0].item() == n + 1


_MEMORY_SCRIPT = """
import gc, os, sys
import numpy as np
import sbpflow as flow
from sbpflow.vm import Storage

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

flow.manual_seed(0)
model = flow.nn.Sequential(flow.nn.Linear(16, 32), flow.nn.ReLU(), flow.nn.Linear(32, 4))
opt = flow.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = flow.randn(32, 16)
y = flow.randint(0, 4, (32,))
for step in range(1, 10_001):
    loss = flow.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step in (1000, 10_000):
        flow.synchronize()
        gc.collect()
        live = sum(1 for o in gc.get_objects() if isinstance(o, Storage))
        print(step, rss_mb(), live, flush=True)
assert np.isfinite(loss.item())
"""


def test_training_memory_is_stable_over_10000_steps():
    """Steps 1,000 to 10,000 of a training loop keep live storages and RSS flat.

    It runs in a fresh interpreter: in a pytest worker that has already run thousands of tests,
    the allocator's fragmentation moves RSS by megabytes unrelated to this loop."""
    job = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True,
                         text=True, timeout=300)
    assert job.returncode == 0, job.stderr
    (_, rss0, live0), (_, rss1, live1) = [map(float, line.split())
                                          for line in job.stdout.split("\n") if line]
    assert live1 <= live0 + 4, f"live storages grew: {live0} -> {live1}"
    assert rss1 - rss0 < 8, f"RSS grew by {rss1 - rss0:.1f} MB"


def test_release_during_backward_is_thread_safe(mode, monkeypatch):
    """Intermediates die (and are released) while the worker runs the backward kernels."""
    def run():
        flow.manual_seed(1)
        w = flow.randn(128, 128, requires_grad=True)
        x = flow.randn(48, 128)
        dropped = []

        def hook(g):
            dropped.clear()  # drop references mid-backward
            gc.collect()
            return g

        h = x
        for i in range(30):
            h = (h @ w).tanh() * 0.9 + h * 0.1
            if i % 8 == 0:
                h.register_hook(hook)
                dropped.append(h.detach() * 1)
        h.sum().backward()
        return w.grad.numpy().copy()

    mode.set_mode(Mode.SYNC)
    expected = run()
    mode.set_mode(Mode.ASYNC)
    flushes = _count_release_flushes(mode, monkeypatch, batch=4)
    for _ in range(2):
        issued, handed = _issued(mode), mode.handoffs()
        with flow.vm.inline_max(0):  # backward kernels and releases all on the worker
            got = run()
        assert np.array_equal(got, expected)
        assert mode.handoffs() - handed == _issued(mode) - issued > 200
    assert flushes[0] > 0, "no release instruction was issued"


def _count_release_flushes(vm, monkeypatch, batch: int) -> list[int]:
    """Release dead storages in batches of `batch` (so releases are issued while the work that
    last used them is still queued) and count the batches issued."""
    count = [0]
    flush = type(vm)._flush_releases

    def counted():
        count[0] += 1
        flush(vm)

    monkeypatch.setattr(vm, "RELEASE_BATCH", batch)
    monkeypatch.setattr(vm, "_flush_releases", counted)
    return count


def test_overlap_python_issue_with_worker_kernels(mode):
    """Issuing returns before big kernels finish: the Python thread runs ahead."""
    a = flow.ones(600, 600)
    t0 = time.perf_counter()
    outs = [a @ a for _ in range(4)]
    issued = time.perf_counter() - t0
    flow.synchronize()
    total = time.perf_counter() - t0
    assert issued < total / 2
    assert outs[-1][0, 0].item() == 600.0


def test_caching_allocator_reuses_released_buffers_safely(mode):
    prims = flow.device("cpu").prims
    alloc = prims.allocator
    x = flow.randn(256, 256)
    flow.synchronize()
    hits = alloc.hits
    held = (x * 3).numpy()  # the user holds this buffer: it must never be recycled
    expected = held.copy()
    for _ in range(200):
        y = (x * 2 + 1) @ x  # 256 KB temporaries die every iteration
    flow.synchronize()
    assert alloc.hits > hits + 100, "released buffers were not reused"
    np.testing.assert_array_equal(held, expected)
    ref = (x.numpy() * 2 + 1) @ x.numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-4)


def test_release_instruction_runs_after_last_use(mode, monkeypatch):
    """A tensor dropped right after issuing work on it is freed only after that work."""
    x = flow.randn(300, 300)
    results = []
    flushes = _count_release_flushes(mode, monkeypatch, batch=1)
    issued, handed = _issued(mode), mode.handoffs()
    with flow.vm.inline_max(0):  # the matmuls and the releases are queued on the worker
        for _ in range(20):
            t = x * 1.0
            results.append((t @ t).sum())  # t's last use is queued; then t dies
            del t
        flow.synchronize()
    assert mode.handoffs() - handed == _issued(mode) - issued >= 60
    assert flushes[0] > 0, "no release instruction was issued"
    xn = x.numpy().astype(np.float64)
    want = float((xn @ xn).sum())
    for r in results:
        assert abs(r.item() - want) <= 1e-3 * abs(want) + 1e-2
