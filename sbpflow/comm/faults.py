"""End the whole job when one rank fails, instead of leaving the others blocked forever.

Measured with the mpich wheel's hydra launcher (see tests/comm/test_failures.py and
tests/comm/test_job_lifecycle.py):
- a rank that dies by a signal, or exits without finalizing MPI after starting it, makes
  hydra kill every rank at once (non-zero exit status);
- a rank that raises, or ends by SystemExit(n), and then *finalizes* MPI at exit blocks in
  MPI_Finalize while the others wait in a collective: the job hangs;
- a rank that exits before starting MPI leaves the others in MPI start-up forever.

So under a multi-process launch `install` (called when `sbpflow.comm` is imported, which
also starts MPI at once: a crash after `import sbpflow` is then always seen by hydra) sets
- `sys.excepthook`: print "rank R: <traceback>" and `MPI_Abort`;
- one record of how the script ended, fed by every way a script can end with a status:
  `sys.exit(n)`, the builtins `exit(n)` and `quit(n)`, and (under `python -m mpi4py`, which
  the launcher uses) any uncaught `SystemExit(n)`, however raised, as mpi4py's runner sees
  it. A program that ran to its end (its outermost __main__ frame returned) ended with 0,
  whatever SystemExit it caught on the way;
- an atexit handler that takes one path for all of them: a non-zero status aborts the job
  with that status, naming the rank; a clean end (status 0 or None) waits at an exit
  barrier, so a rank that ended while others still wait in a collective is reported by
  their watchdog as "at the exit barrier", not as an unexplained hang.
`abort_job` works with MPI started or not (without MPI it kills this process by SIGKILL,
which hydra also turns into a job-wide kill). Under a plain `mpiexec python script.py` a
`raise SystemExit(n)` written directly (not through `sys.exit`, `exit` or `quit`) reaches no
Python code before exit on CPython 3.11 (the status lives in a C variable while atexit
handlers run). The atexit handler still sees where the main program stopped: at a `raise` of
SystemExit with a constant, a module-level name or nothing, it reads the status from there
and takes the path above. Otherwise (raised in a function the script called, a computed
status) the status is unknown: the rank waits at the exit barrier as after a clean end (so
when every rank gets there, each exits with its own status), and tells the other ranks it
has ended (`watchdog.announce_end`), so one blocked in a collective it never issued ends the
job within a second, naming it, instead of after the collective timeout.
"""

from __future__ import annotations

import atexit
import builtins
import dis
import os
import signal
import sys
import threading
import time
import traceback

_rank = 0
_size = 1
_exit_status = None
_exit_how = None  # what ended the script with _exit_status ("sys.exit", ...), for messages
_final = False  # _exit_status came from the runner's last word on the script: keep it
_real_exit = sys.exit
_on_clean_exit = None
_installed = False
_pid = None  # the rank's own process: a forked child (a DataLoader worker) is not a rank
_main_frame = None  # the program's outermost __main__ frame, to tell how it ended
_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
FLUSH_GRACE_S = 0.3


def abort_job(message: str, code: int = 1, prefix: bool = True):
    """Print `message` (each line prefixed by this rank), then end every rank's process."""
    try:
        sys.stdout.flush()
        lines = message.rstrip("\n").splitlines()
        sys.stderr.write("".join((f"rank {_rank}: " if prefix else "") + f"{line}\n"
                                 for line in lines))
        sys.stderr.flush()
        # hydra forwards a rank's output through a pipe and stops reading when the job is
        # aborted: give it a moment, or the message that explains the abort can be lost.
        time.sleep(FLUSH_GRACE_S)
    finally:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Abort(code if code else 1)
        os.kill(os.getpid(), signal.SIGKILL)


def _excepthook(exc_type, exc, tb):
    if os.getpid() != _pid:
        sys.__excepthook__(exc_type, exc, tb)
        return
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    code = 130 if issubclass(exc_type, KeyboardInterrupt) else 1
    abort_job(f"uncaught {exc_type.__name__}: {exc} (rank {_rank} of {_size}); ending the job\n"
              f"{text}", code)


def _exit_code(status) -> int:
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    return 1  # sys.exit("message") prints the message and exits with 1


def _record(status, how: str, final: bool = False) -> None:
    global _exit_status, _exit_how, _final
    if _final or threading.current_thread() is not threading.main_thread():
        return
    _exit_status, _exit_how, _final = status, how, final


def _recording_exit(status=None):
    _record(status, "sys.exit")
    _real_exit(status)


class _RecordingQuitter:
    """The builtins `exit` and `quit` (site's Quitter), recording the status first."""

    def __init__(self, quitter):
        self._quitter = quitter
        self._name = getattr(quitter, "name", "exit")

    def __repr__(self):
        return repr(self._quitter)

    def __call__(self, code=None):
        _record(code, self._name)
        self._quitter(code)


def _hook_mpi4py_runner() -> None:
    """Under `python -m mpi4py`, learn how the script ended from mpi4py's own runner.

    Its `main()` hands every uncaught SystemExit and KeyboardInterrupt (before re-raising
    it) to its module's `set_abort_status`, which it looks up when it calls it: wrapping that
    function gives the status of a `raise SystemExit(n)` that no Python hook sees otherwise.
    """
    run = sys.modules.get("mpi4py.run")
    original = getattr(run, "set_abort_status", None)
    if original is None or getattr(original, "_sbpflow", False):
        return

    def set_abort_status(status):
        if isinstance(status, SystemExit):
            # The same status recorded by sys.exit/exit/quit: keep that name for the message.
            same = _exit_how is not None and _exit_status == status.code
            _record(status.code, _exit_how if same else "SystemExit", final=True)
        elif isinstance(status, KeyboardInterrupt):
            pass  # goes on to sys.excepthook, which aborts with 130
        elif isinstance(status, int) and status:
            pass  # another exception: sys.excepthook reports it
        return original(status)

    set_abort_status._sbpflow = True
    run.set_abort_status = set_abort_status


def _outermost_main_frame():
    """The outermost `<module>` frame run as __main__ (the script, or `-m`'s runner)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    found = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            found = frame
        frame = frame.f_back
    return found


def _program_ran_to_its_end() -> bool:
    """True when the main program returned normally (its last instruction was a return).

    Then any SystemExit recorded on the way was caught, and the status is 0. Otherwise the
    program ended by an exception (the excepthook has seen all but SystemExit).
    """
    frame = _main_frame
    if frame is None:
        return False
    try:
        return frame.f_code.co_code[frame.f_lasti] in _RETURNS
    except (IndexError, AttributeError):
        return False


_UNSEEN = object()  # how a script ended, when sbpflow's hooks saw none of it


def _raise_site_status(frame):
    """The status of the `raise SystemExit...` statement `frame` stopped at, or _UNSEEN.

    CPython (3.11) runs no Python code between an uncaught SystemExit and the interpreter's
    exit, so under a plain `mpiexec python script.py` a literal `raise SystemExit(n)` in the
    script reaches no hook. The main program's frame still says where it stopped: when that
    is a `raise` of the builtin SystemExit called with nothing, a constant or a module-level
    name (`raise SystemExit`, `raise SystemExit(3)`, `raise SystemExit(code)`), the status
    is read from the code and the frame's globals. Anything else (a SystemExit raised in a
    function the script called, a computed status) is _UNSEEN.
    """
    try:
        names = frame.f_globals
        if names.get("SystemExit", frame.f_builtins.get("SystemExit")) is not builtins.SystemExit:
            return _UNSEEN
        ins = [i for i in dis.get_instructions(frame.f_code) if i.offset <= frame.f_lasti
               and i.opname not in ("CACHE", "PUSH_NULL", "PRECALL")]
    except (AttributeError, TypeError, ValueError):
        return _UNSEEN
    if len(ins) < 2 or ins[-1].opname != "RAISE_VARARGS" or ins[-1].arg != 1:
        return _UNSEEN
    body = ins[:-1]
    args: list = []
    if body[-1].opname == "CALL" and body[-1].arg in (0, 1):
        nargs = body[-1].arg
        if len(body) < nargs + 2:
            return _UNSEEN
        for load in body[-1 - nargs:-1]:
            if load.is_jump_target:
                return _UNSEEN
            if load.opname == "LOAD_CONST":
                args.append(load.argval)
            elif load.opname in ("LOAD_NAME", "LOAD_GLOBAL") and load.argval in names:
                args.append(names[load.argval])
            else:
                return _UNSEEN
        body = body[:-1 - nargs]
    if body[-1].opname not in ("LOAD_NAME", "LOAD_GLOBAL") or body[-1].argval != "SystemExit":
        return _UNSEEN
    return args[0] if args else None


def _main_program_stopped_unseen():
    """How the main program ended when it stopped at a `raise` no hook saw (an uncaught
    SystemExit under a plain runner): ("SystemExit", status); (None, _UNSEEN) when it ended
    by an exception nothing recorded and the status cannot be read; None otherwise.

    A raise statement where the main program stopped is what ended it, even after a
    `sys.exit(n)` the script caught; the mpi4py runner's last word (`_final`) stands.
    """
    if _main_frame is None or _final or _program_ran_to_its_end():
        return None
    status = _raise_site_status(_main_frame)
    if status is not _UNSEEN:
        return "SystemExit", status
    return (None, _UNSEEN) if _exit_how is None else None


def _at_exit():
    if os.getpid() != _pid:
        return
    unseen = _main_program_stopped_unseen()
    if unseen is not None and unseen[1] is not _UNSEEN:
        _record(unseen[1], unseen[0])
    code = 0 if _program_ran_to_its_end() else _exit_code(_exit_status)
    if code != 0:
        abort_job(f"{_exit_how}({_exit_status!r}) (rank {_rank} of {_size}); ending the job",
                  code)
    # Tell the other ranks at the exit barrier (see watchdog.announce_end): one blocked in a
    # collective this rank never issued then ends the job at once, naming this rank. An
    # unreadable SystemExit may be a clean end (status 0): it waits at the barrier as one.
    watchdog = sys.modules.get(__name__.rpartition(".")[0] + ".watchdog")
    if watchdog is not None:
        watchdog.announce_end(
            "its script ended by an exception that no sbpflow hook saw, most likely a "
            "SystemExit raised where its status cannot be read: status unknown"
            if unseen is not None and unseen[1] is _UNSEEN else "its script ended, status 0")
    if _on_clean_exit is not None:
        _on_clean_exit()


def install(rank: int, size: int, on_clean_exit) -> None:
    """Install the handlers for a process of a multi-process job (once)."""
    global _rank, _size, _on_clean_exit, _installed, _pid, _main_frame
    _rank, _size, _on_clean_exit, _pid = rank, size, on_clean_exit, os.getpid()
    if _installed:
        return
    _main_frame = _outermost_main_frame()
    _installed = True
    sys.excepthook = _excepthook
    sys.exit = _recording_exit
    for name in ("exit", "quit"):
        quitter = getattr(builtins, name, None)
        if quitter is not None and not isinstance(quitter, _RecordingQuitter):
            setattr(builtins, name, _RecordingQuitter(quitter))
    _hook_mpi4py_runner()
    atexit.register(_at_exit)
