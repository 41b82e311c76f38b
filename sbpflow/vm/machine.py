"""The virtual machine: issues instructions to streams and surfaces their errors.

The Python thread calls the builder, which records each instruction's dependences from the
storages it reads and writes and pushes it to its stream's worker.  Two exceptions run an
instruction inline instead: a small one whose stream is idle (a thread hand-off would cost
more than the kernel; it runs exactly where the worker would, in order), and every
instruction in SYNC mode, for debugging.  Results are bitwise equal in all cases.
A kernel that raises poisons its outputs; the error, naming the op and the user's line that
issued it, is raised at the next sync point, and the VM stays usable.
"""

from __future__ import annotations

import atexit
import collections
import enum
import os
import sys
import threading
from threading import get_ident

from . import threads
from .instruction import Call, Instruction, _Poisoned
from .storage import Blob, Storage, set_release_hook
from .stream import Stream

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An instruction producing fewer elements than this is "small": when its stream is idle it runs
# inline on the issuing thread.  Handing an instruction to a worker costs two GIL hand-offs,
# and while Python code runs on the issuing thread the worker waits for the GIL after every
# NumPy call; below 256K output elements (1 MB of float32) that costs more than the overlap it
# buys (measured in BENCHMARKS.md).  SBPFLOW_VM_INLINE_MAX overrides it; 0 hands everything to
# the workers (tests use that to exercise the async path with small shapes).
DEFAULT_INLINE_MAX = 1 << 18


def _check_inline_max(n) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"inline_max must be an int >= 0 (an element count), got {n!r}")
    return n


def _inline_max_from_env() -> int:
    env = os.environ.get("SBPFLOW_VM_INLINE_MAX", "").strip()
    if not env:
        return DEFAULT_INLINE_MAX
    try:
        return _check_inline_max(int(env))
    except ValueError:
        raise ValueError(f"SBPFLOW_VM_INLINE_MAX must be an int >= 0 (an element count), got "
                         f"{env!r}") from None


class Mode(enum.Enum):
    ASYNC = "async"
    SYNC = "sync"


class KernelError(RuntimeError):
    """Base for errors re-raised from a worker; the concrete class also derives from the
    kernel's own exception type, so `except IndexError` still catches an IndexError."""


_INSIDE: dict = {}  # code object -> whether it belongs to the sbpflow package


def _user_site():
    """(filename, lineno) of the innermost frame outside the sbpflow package."""
    f = sys._getframe(1)
    inside = _INSIDE
    while f is not None:
        code = f.f_code
        flag = inside.get(code)
        if flag is None:
            flag = inside[code] = code.co_filename.startswith(_PKG_DIR)
        if not flag:
            return code.co_filename, f.f_lineno
        f = f.f_back
    return "<unknown>", 0


def _wrap_error(name: str, site, err: BaseException) -> BaseException:
    """err as raised to the user: its message prefixed with the op's name (and the user's line
    that issued it, for work that failed on a worker)."""
    if site is None:  # run inline: the traceback already shows the user's line
        msg = f"{name}: {err}"
    else:
        msg = f"{name}: {err} (issued at {site[0]}:{site[1]})"
    cls = type(err)
    try:
        wrapped = type(cls.__name__, (cls, KernelError), {"__module__": cls.__module__})(msg)
    except Exception:
        wrapped = KernelError(msg)
    wrapped.__cause__ = err
    return wrapped


class VirtualMachine:
    HIGH_WATER = 4096  # instructions in flight before the Python thread waits
    LOW_WATER = 1024  # ... until this few remain
    RELEASE_BATCH = 64  # dead storages released by one instruction

    def __init__(self, mode: Mode | None = None):
        env = os.environ.get("SBPFLOW_VM_MODE", "async").lower()
        self.mode = mode or (Mode.SYNC if env == "sync" else Mode.ASYNC)
        # Instructions with fewer output elements may run inline (see DEFAULT_INLINE_MAX); the
        # builder compares against this attribute, so changing it takes effect at once.
        self.inline_max = _inline_max_from_env()
        self.streams: dict[str, Stream] = {}
        # (issuing thread, error): an error is raised in the thread whose work failed.
        self._errors: collections.deque = collections.deque()
        self._releases: collections.deque = collections.deque()
        self._lock = threading.Lock()
        # Issuing is one critical section: sequence numbers, dependences, the inline run and
        # the hand-off must not interleave between Python threads.  Re-entrant: issuing may
        # flush releases, which issues.
        self._issue_lock = threading.RLock()
        self.blas_threads = None
        set_release_hook(self._releases.append)

    # -- streams ------------------------------------------------------------------------------
    def stream(self, name: str) -> Stream:
        s = self.streams.get(name)
        if s is None:
            with self._lock:
                s = self.streams.get(name)
                if s is None:
                    if not self.streams:
                        self.blas_threads = threads.apply_policy()
                    s = self.streams[name] = Stream(name, self)
        return s

    def set_mode(self, mode: Mode | str) -> None:
        """Switch between ASYNC and SYNC; everything in flight finishes first."""
        self.synchronize()
        self.mode = Mode(mode) if not isinstance(mode, Mode) else mode

    def set_inline_max(self, n: int) -> int:
        """Instructions with fewer than n output elements may run inline (0: none); returns
        the previous value.  Affects only where work runs, never its results."""
        previous = self.inline_max
        self.inline_max = _check_inline_max(n)
        return previous

    def handoffs(self) -> int:
        """Instructions handed to stream workers so far (not run inline), over all streams."""
        return sum(s.handed_off for s in list(self.streams.values()))

    # -- issuing --------------------------------------------------------------------------------
    def issue(self, instr: Instruction, stream: Stream, reads=(), writes=()) -> None:
        """Record instr's dependences on the storages it reads and writes, then hand it over.
        Safe from any thread: the whole issue is one critical section."""
        with self._issue_lock:
            self._issue(instr, stream, reads, writes)

    def _issue(self, instr: Instruction, stream: Stream, reads, writes) -> None:
        if len(self._releases) >= self.RELEASE_BATCH:
            self._flush_releases_locked()
        seq = stream.issued + 1
        stream.issued = seq
        instr.stream = stream
        instr.seq = seq
        deps = None
        for b in instr.ins:  # a blob (e.g. a view) may come from another stream
            p = b.producer
            if p is not None and p[0] is not stream:
                deps = [p] if deps is None else deps + [p]
        for b in instr.outputs():
            if b.producer is None or b.array is None:
                b.producer = (stream, seq)
        for st in reads:
            lw = st.last_write
            if lw is not None and lw[0] is not stream:
                deps = [lw] if deps is None else deps + [lw]
            if st.reads is None:
                st.reads = {stream: seq}
            else:
                st.reads[stream] = seq
        for st in writes:
            lw = st.last_write
            if lw is not None and lw[0] is not stream:
                deps = [lw] if deps is None else deps + [lw]
            if st.reads:
                for s2, q in st.reads.items():
                    if s2 is not stream:
                        deps = [(s2, q)] if deps is None else deps + [(s2, q)]
            st.last_write = (stream, seq)
            st.reads = None
        instr.deps = deps
        if self.mode is Mode.SYNC:
            self._run(instr)
            stream.completed = seq
            if self._errors:
                self.raise_pending()
            return
        if instr.small and stream.completed == seq - 1:
            # The stream is idle and the work is smaller than a hand-off to its worker costs
            # (two GIL switches): run it here, exactly where the worker would have, in order.
            # An error then raises at once, with the user's line in its traceback.
            self._run(instr)
            stream.completed = seq
            if self._errors:
                self.raise_pending()
            return
        if instr.site is None:
            instr.site = _user_site()  # named in the error if the worker's kernel fails
        instr.owner = get_ident()
        if seq - stream.completed > self.HIGH_WATER:
            stream.wait(seq - self.LOW_WATER)  # throttle: let the worker catch up
        stream.push(instr)

    def _run(self, instr: Instruction) -> None:
        """Run one instruction (worker thread, or inline in SYNC mode)."""
        if instr.deps:
            for s, q in instr.deps:
                s.wait(q)
        try:
            if _tracer is None:
                instr.run()
            else:
                _tracer(instr)  # sbpflow.profiler is recording: instr.run(), timed
        except _Poisoned as p:
            for b in instr.outputs():
                b.error = p.cause
        except BaseException as e:  # noqa: BLE001 - every failure must reach the user
            err = _wrap_error(instr.name, instr.site, e)
            for b in instr.outputs():
                b.error = err
            # Inline (and SYNC) runs happen on the issuing thread itself.
            self._errors.append((instr.owner or get_ident(), err))

    def fail_inline(self, name: str, err: BaseException):
        """A kernel run inline without an instruction (the interpreter's cached calls) raised
        err: raise it as a failed inline instruction raises (after any older error of this
        thread's work)."""
        self._errors.append((get_ident(), _wrap_error(name, None, err)))
        self.raise_pending()
        raise AssertionError("unreachable: the error just queued is this thread's")

    # -- sync points ------------------------------------------------------------------------------
    def raise_pending(self) -> None:
        """Raise the first error of this thread's work (and drop its others)."""
        if self._errors:
            mine = self._take_errors()
            if mine:
                raise mine[0]

    def _take_errors(self, seen: BaseException | None = None) -> list:
        """Remove and return the errors of the calling thread's work, oldest first (and the
        error `seen`, whoever's it was: it is being raised)."""
        me = get_ident()
        with self._lock:
            mine = [e for owner, e in self._errors if owner == me]
            if mine or seen is not None:
                rest = [(owner, e) for owner, e in self._errors
                        if owner != me and e is not seen]
                self._errors.clear()
                self._errors.extend(rest)
        return mine

    def report_unobserved(self) -> int:
        """At exit: finish all work, print every error nobody observed; return their count."""
        for s in list(self.streams.values()):
            s.wait(s.issued)
        with self._lock:
            errors = [e for _, e in self._errors]
            self._errors.clear()
        for e in errors:
            print(f"sbpflow: error in work whose result was never read: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
        return len(errors)

    def wait_for(self, where) -> None:
        if where is not None:
            where[0].wait(where[1])

    def access(self, blob: Blob, storage: Storage, stream: Stream, callback=None):
        """Host access (numpy(), item(), print): wait for exactly the instructions this blob
        needs — its producer and its storage's last writer — not for everything in flight;
        then return the array (or callback(array)) on the Python thread."""
        if self._releases:
            self._flush_releases()
        for where in (blob.producer, storage.last_write):
            if where is not None and where[0].completed < where[1]:
                where[0].wait(where[1])
        if blob.error is not None:
            self._take_errors(blob.error)
            raise blob.error
        self.raise_pending()
        return blob.array if callback is None else callback(blob.array)

    def synchronize(self) -> None:
        """Wait for everything issued so far; raise the first pending error."""
        if self._releases:
            self._flush_releases()
        for s in list(self.streams.values()):
            s.wait(s.issued)
        self.raise_pending()

    def in_flight(self) -> int:
        return sum(s.issued - s.completed for s in self.streams.values())

    # -- release ----------------------------------------------------------------------------------
    def _flush_releases(self) -> None:
        """One release instruction per stream frees a batch of dead storages after their last
        use: it writes each of them, so it waits for every earlier reader and writer."""
        with self._issue_lock:
            self._flush_releases_locked()

    def _flush_releases_locked(self) -> None:
        releases = self._releases
        batch: dict = {}
        while releases:
            st = releases.popleft()
            stream = st.last_write[0] if st.last_write else self.stream("cpu")
            batch.setdefault(stream, []).append(st)
        for stream, storages in batch.items():
            roots = [(st.root, st.prims) for st in storages]
            for st in storages:
                st.root = None

            def free(roots=roots):
                while roots:
                    root, prims = roots.pop()
                    if root is None or root.array is None:
                        continue
                    arrays = [root.array]
                    root.array = None
                    if prims is not None:
                        prims.release(arrays)  # back to the allocator if nobody holds it

            instr = Call("release", ("<release>", 0), free, kind="release",
                         small=self.inline_max > 0)
            self._issue(instr, stream, (), storages)


# Set by sbpflow.profiler while it records: runs and times one instruction.
_tracer = None
_vm: VirtualMachine | None = None


def get_vm() -> VirtualMachine:
    global _vm
    if _vm is None:
        _vm = VirtualMachine()
    return _vm


def _before_fork() -> None:
    # A forked child (DataLoader workers) gets no worker threads: finish all work first, so
    # every blob it may read is filled in.
    if _vm is not None:
        for s in list(_vm.streams.values()):
            s.wait(s.issued)


def _after_fork_in_child() -> None:
    # The parent's streams, locks and threads are meaningless here: start a fresh VM.
    global _vm
    if _vm is not None:
        mode, inline_max = _vm.mode, _vm.inline_max
        _vm = VirtualMachine(mode)
        _vm.inline_max = inline_max


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _exit_with_unobserved_errors() -> None:
    """A kernel error still pending at interpreter exit must not end in exit status 0."""
    if _vm is not None and _vm.report_unobserved():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


atexit.register(_exit_with_unobserved_errors)
