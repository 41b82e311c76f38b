"""InstructionsBuilder: the one way the framework hands work to the VM.

Every method names the storages an instruction reads and writes; the VM derives dependences
from them.  Kinds: op call, release (issued by the VM itself when a storage dies), host access,
copy between devices, collective (on the comm stream) and barrier.
"""

from __future__ import annotations

from .instruction import Call, OpCall
from .machine import DEFAULT_INLINE_MAX, Mode, VirtualMachine, get_vm

# The default bound on "small" (inline-able) instructions; the live value is vm.inline_max.
SMALL_NUMEL = DEFAULT_INLINE_MAX


class InstructionsBuilder:
    def __init__(self, vm: VirtualMachine | None = None):
        self._vm = vm

    @property
    def vm(self) -> VirtualMachine:
        # The process-wide VM unless one was given (a forked child gets a fresh one).
        return self._vm or get_vm()

    def op_call(self, name, kernel, ctx, attrs, ins, in_storages, outs, out_storages, *,
                variadic=False, view=False, device_type="cpu"):
        """Run `kernel` on the arrays of blobs `ins`, producing blobs `outs`."""
        vm = self._vm or get_vm()
        # A view allocates nothing: it counts as 0 elements (inline unless inline_max is 0).
        small = (0 if view else sum(m.numel for m in ctx.out_metas)) < vm.inline_max
        # The user's line is looked up only if the instruction goes to a worker (VM.issue).
        instr = OpCall(name, None, kernel, ctx, attrs, ins, outs, variadic, not view, small)
        stream = vm.streams.get(device_type) or vm.stream(device_type)
        vm.issue(instr, stream, reads=in_storages, writes=() if view else out_storages)
        return instr

    def call(self, name, fn, *, ins=(), outs=(), reads=(), writes=(), stream="cpu",
             kind="call", numel=None):
        """Run fn() for effect, ordered after the writers (and, for writes, the readers) of
        the given storages: in-place writes, collectives, copies."""
        vm = self.vm
        small = numel is not None and numel < vm.inline_max  # e.g. an in-place copy
        instr = Call(name, None, fn, ins=ins, outs=outs, kind=kind, small=small)
        vm.issue(instr, vm.stream(stream), reads=reads, writes=writes)
        return instr

    def collective(self, name, fn, *, ins=(), outs=(), reads=(), writes=(), numel=None):
        """A collective on the comm stream: kept in issue order on every rank.  A small one
        (`numel` elements) runs inline when the comm stream is idle, as a small op does."""
        return self.call(name, fn, ins=ins, outs=outs, reads=reads, writes=writes,
                         stream="comm", kind="collective", numel=numel)

    def copy(self, name, fn, *, ins=(), outs=(), reads=(), writes=(), stream="copy"):
        """A copy between devices, on a copy stream."""
        return self.call(name, fn, ins=ins, outs=outs, reads=reads, writes=writes,
                         stream=stream, kind="copy")

    def access(self, blob, storage, device_type="cpu", callback=None):
        """Host access: the blob's array (or callback(array)) once its writers are done."""
        vm = self.vm
        return vm.access(blob, storage, vm.stream(device_type), callback)

    def barrier(self):
        """Wait for every instruction issued so far, on every stream."""
        self.vm.synchronize()


__all__ = ["InstructionsBuilder", "Mode"]
