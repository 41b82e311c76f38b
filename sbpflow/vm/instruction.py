"""Instructions: what the Python thread hands to the VM.

Each has a stream, a sequence number on it, the (stream, seq) pairs on *other* streams it must
wait for, and a `run` that does the work.  Same-stream order needs no record: streams are FIFO.
"""

from __future__ import annotations


class _Poisoned(Exception):
    """An input was never produced because an earlier instruction failed."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class Instruction:
    __slots__ = ("stream", "seq", "deps", "name", "site", "small", "owner")
    kind = "instruction"

    def __init__(self, name: str, site, small: bool = False):
        self.name = name
        self.site = site  # (filename, lineno) of the user's call, for error messages
        self.deps = None
        self.small = small  # cheaper to run inline than to hand to an idle worker
        self.owner = None  # the issuing thread, set when handed to a worker

    def outputs(self):
        return ()

    def run(self):
        raise NotImplementedError


class OpCall(Instruction):
    """Run a kernel on input blobs; fill the output blobs."""

    __slots__ = ("kernel", "ctx", "attrs", "ins", "outs", "variadic", "fix_layout")
    kind = "op call"

    def __init__(self, name, site, kernel, ctx, attrs, ins, outs, variadic, fix_layout,
                 small=False):
        super().__init__(name, site, small)
        self.kernel = kernel
        self.ctx = ctx
        self.attrs = attrs
        self.ins = ins
        self.outs = outs
        self.variadic = variadic
        self.fix_layout = fix_layout  # make non-view outputs C-contiguous (metadata strides)

    def outputs(self):
        return self.outs

    def run(self):
        arrays = []
        for b in self.ins:
            if b.error is not None:
                raise _Poisoned(b.error)
            arrays.append(b.array)
        if self.variadic:
            res = self.kernel(self.ctx, arrays, **self.attrs)
        else:
            res = self.kernel(self.ctx, *arrays, **self.attrs)
        outs = self.outs
        if len(outs) == 1:
            res = (res,)
        if self.fix_layout:
            fix = self.ctx.prims.ensure_contiguous
            for blob, arr in zip(outs, res):
                blob.array = fix(arr)
        else:
            for blob, arr in zip(outs, res):
                blob.array = arr
        # Drop references as soon as the work is done: the arrays may be large.
        self.ins = self.ctx = None


class Call(Instruction):
    """Run fn(*blob arrays) for effect: in-place writes, host access, collectives."""

    __slots__ = ("fn", "ins", "outs", "kind")

    def __init__(self, name, site, fn, ins=(), outs=(), kind="call", small=False):
        super().__init__(name, site, small)
        self.kind = kind  # call, release, collective, copy, ... (named in profiles)
        self.fn = fn
        self.ins = ins
        self.outs = outs

    def outputs(self):
        return self.outs

    def run(self):
        for b in self.ins:
            if b.error is not None:
                raise _Poisoned(b.error)
        self.fn()
        self.fn = None
