"""No error is lost: impossible allocations raise at the call, and a kernel error nobody read
is printed at exit with a non-zero exit status."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sbpflow as flow


def _run(code: str):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("make", [
    lambda: flow.empty(10 ** 12), lambda: flow.zeros(10 ** 6, 10 ** 6),
    lambda: flow.ones(10 ** 12, dtype=flow.int8), lambda: flow.full((10 ** 7, 10 ** 6), 2.0),
    lambda: flow.randn(10 ** 12),
], ids=["empty", "zeros", "ones_int8", "full", "randn"])
def test_an_allocation_larger_than_the_machine_raises_at_the_call(make):
    before = flow.vm.handoffs()
    with pytest.raises(RuntimeError, match="can't allocate memory: you tried to allocate"):
        make()
    assert flow.vm.handoffs() == before  # refused before any instruction was issued


def test_an_op_whose_output_cannot_fit_raises_at_the_call():
    a, b = flow.ones(10 ** 6, 1), flow.ones(1, 10 ** 6)
    flow.synchronize()
    before = flow.vm.handoffs()
    with pytest.raises(RuntimeError, match="mul: DefaultCPUAllocator: can't allocate memory"):
        a * b
    assert flow.vm.handoffs() == before


def test_a_size_past_2_to_the_63_bytes_raises_overflow():
    with pytest.raises(RuntimeError, match=r"Storage size calculation overflowed with "
                                           r"sizes=\[4611686018427387904, 4"):
        flow.empty(2 ** 62, 2 ** 62)


def test_a_view_allocates_nothing_and_is_not_refused():
    big = flow.ones(1, 1).expand(10 ** 6, 10 ** 6)  # as in torch: a stride-0 view
    assert tuple(big.shape) == (10 ** 6, 10 ** 6)
    assert float(big[123, 456]) == 1.0


def test_an_unread_kernel_error_at_exit_is_printed_and_the_exit_status_is_nonzero():
    proc = _run("import sbpflow as flow\n"
                "with flow.vm.inline_max(0):\n"
                "    q = flow.tensor([1, 2]) // flow.tensor([0, 1])\n"
                "print('the script ends')\n")
    assert proc.stdout.strip() == "the script ends"
    assert proc.returncode == 1
    assert "never read" in proc.stderr and "floor_divide: ZeroDivisionError" in proc.stderr


def test_an_error_that_was_raised_is_not_reported_again_at_exit():
    proc = _run("import sbpflow as flow\n"
                "with flow.vm.inline_max(0):\n"
                "    q = flow.tensor([1, 2]) // flow.tensor([0, 1])\n"
                "try:\n"
                "    q.numpy()\n"
                "except RuntimeError:\n"
                "    print('caught')\n")
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "caught", "")
