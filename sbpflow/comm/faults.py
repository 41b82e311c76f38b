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
`raise SystemExit(n)` written directly (not through `sys.exit`, `exit` or `quit`) never
reaches Python code before exit on CPython 3.11, so its status is not seen: that rank waits at
the exit barrier like a clean end. Run scripts through the launcher or `python -m mpi4py`.
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


def _at_exit():
    if os.getpid() != _pid:
        return
    code = 0 if _program_ran_to_its_end() else _exit_code(_exit_status)
    if code != 0:
        abort_job(f"{_exit_how}({_exit_status!r}) (rank {_rank} of {_size}); ending the job",
                  code)
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
