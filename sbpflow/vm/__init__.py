"""The eager virtual machine: the Python thread issues instructions; per-stream workers run
them in dependence order.  See machine.py, stream.py and builder.py."""

from .builder import InstructionsBuilder
from .instruction import Call, Instruction, OpCall
from .machine import KernelError, Mode, VirtualMachine, get_vm
from .storage import Blob, Storage


def synchronize() -> None:
    """Wait for all issued work; raise the first pending kernel error."""
    get_vm().synchronize()


def set_mode(mode) -> None:
    """"sync" runs every instruction inline on the Python thread; "async" uses the workers."""
    get_vm().set_mode(Mode(mode) if isinstance(mode, str) else mode)


def get_mode() -> Mode:
    return get_vm().mode


__all__ = [
    "Blob", "Call", "Instruction", "InstructionsBuilder", "KernelError", "Mode", "OpCall",
    "Storage", "VirtualMachine", "get_mode", "get_vm", "set_mode", "synchronize",
]
