"""The eager virtual machine: the Python thread issues instructions; per-stream workers run
them in dependence order.  See machine.py, stream.py and builder.py."""

import contextlib

from .builder import InstructionsBuilder
from .instruction import Call, Instruction, OpCall
from .machine import DEFAULT_INLINE_MAX, KernelError, Mode, VirtualMachine, get_vm
from .storage import Blob, PooledStorage, Storage


def synchronize() -> None:
    """Wait for all issued work; raise the first pending kernel error."""
    get_vm().synchronize()


def set_mode(mode) -> None:
    """"sync" runs every instruction inline on the Python thread; "async" uses the workers."""
    get_vm().set_mode(Mode(mode) if isinstance(mode, str) else mode)


def get_mode() -> Mode:
    return get_vm().mode


def set_inline_max(n: int) -> int:
    """Instructions with fewer than n output elements run inline when their stream is idle;
    0 hands every instruction to a stream worker.  Returns the previous value.  The default is
    DEFAULT_INLINE_MAX, or SBPFLOW_VM_INLINE_MAX when set."""
    return get_vm().set_inline_max(n)


def get_inline_max() -> int:
    return get_vm().inline_max


@contextlib.contextmanager
def inline_max(n: int):
    """`with flow.vm.inline_max(0):` every instruction issued inside goes to a worker.

    The setting is process-wide (every thread issues under it): enter it from one thread."""
    previous = set_inline_max(n)
    try:
        yield
    finally:
        get_vm().inline_max = previous


def handoffs() -> int:
    """Instructions handed to stream workers so far (the rest ran inline)."""
    return get_vm().handoffs()


__all__ = [
    "DEFAULT_INLINE_MAX", "Blob", "Call", "Instruction", "InstructionsBuilder", "KernelError",
    "Mode", "OpCall", "PooledStorage", "Storage", "VirtualMachine", "get_inline_max",
    "get_mode", "get_vm", "handoffs", "inline_max", "set_inline_max", "set_mode", "synchronize",
]
