"""The eager VM is safe to drive from several Python threads at once, as torch is.

Each thread trains its own small model; with a 1 µs switch interval the threads interleave
inside `VirtualMachine.issue` thousands of times. Every thread's weights must equal, bit for
bit, the weights of the same training run alone on one thread.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import sbpflow as flow


def _train(seed: int, steps: int = 30) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    w1 = flow.tensor(rng.standard_normal((8, 16)) * 0.3, requires_grad=True)
    w2 = flow.tensor(rng.standard_normal((16, 1)) * 0.3, requires_grad=True)
    x = flow.tensor(rng.standard_normal((32, 8)))
    y = flow.tensor(rng.standard_normal((32, 1)))
    opt = flow.optim.Adam([w1, w2], lr=1e-2)
    for _ in range(steps):
        loss = ((flow.tanh(x @ w1) @ w2 - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [w1.detach().numpy(), w2.detach().numpy()]


def _in_threads(seeds, inline_max=None):
    results, errors = {}, []

    def run(seed):
        try:
            results[seed] = _train(seed)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in seeds]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    # inline_max is process-wide: set it once here, not from each thread (nested
    # enter/exit from several threads would restore each other's values out of order)
    knob = flow.vm.inline_max(flow.vm.get_inline_max() if inline_max is None else inline_max)
    try:
        with knob:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "a training thread hung"
    assert not errors, errors
    return results


@pytest.mark.parametrize("inline_max", [None, 0], ids=["default", "handoff"])
def test_threads_training_their_own_models_match_single_thread_bit_for_bit(inline_max):
    seeds = [11, 12, 13, 14]
    alone = {s: _train(s) for s in seeds}
    handoffs = flow.vm.handoffs()
    together = _in_threads(seeds, inline_max)
    if inline_max == 0:
        assert flow.vm.handoffs() - handoffs > 1000  # the workers really ran them
    for s in seeds:
        for a, b in zip(alone[s], together[s]):
            np.testing.assert_array_equal(a, b)


def test_an_error_reaches_the_thread_that_caused_it():
    """A kernel error from one thread's work is raised in that thread, not in another's."""
    outcomes = {}

    def bad():
        with flow.vm.inline_max(0):
            q = flow.tensor([1, 2]) // flow.tensor([0, 1])
        try:
            q.numpy()
            outcomes["bad"] = "no error"
        except RuntimeError as e:
            outcomes["bad"] = str(e)

    def good():
        try:
            outcomes["good"] = float(_train(5, steps=5)[0].sum())
        except BaseException as e:  # noqa: BLE001
            outcomes["good"] = e

    threads = [threading.Thread(target=bad), threading.Thread(target=good)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert "ZeroDivisionError" in outcomes["bad"]
    assert isinstance(outcomes["good"], float), outcomes["good"]
