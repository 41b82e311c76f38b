"""End the whole job when one rank fails, instead of leaving the others blocked forever.

Measured with the mpich wheel's hydra launcher (see tests/comm/test_failures.py):
- a rank that dies by a signal, or exits without finalizing MPI after starting it, makes
  hydra kill every rank at once (non-zero exit status);
- a rank that raises, or calls sys.exit(n), and then *finalizes* MPI at exit blocks in
  MPI_Finalize while the others wait in a collective: the job hangs;
- a rank that exits before starting MPI leaves the others in MPI start-up forever.

So under a multi-process launch `install` (called when `sbpflow.comm` is imported, which
also starts MPI at once: a crash after `import sbpflow` is then always seen by hydra) sets
- `sys.excepthook`: print "rank R: <traceback>" and `MPI_Abort`;
- a recording `sys.exit` and an atexit handler: a non-zero status aborts the job; a clean end
  waits at an exit barrier, so a rank that ended while others still wait in a collective is
  reported by their watchdog as "at the exit barrier", not as an unexplained hang.
`abort_job` works with MPI started or not (without MPI it kills this process by SIGKILL,
which hydra also turns into a job-wide kill). `raise SystemExit(n)` written directly, not
through `sys.exit`, is not seen: that rank waits at the exit barrier like a clean end.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback

_rank = 0
_size = 1
_exit_status = None
_real_exit = sys.exit
_on_clean_exit = None
_installed = False
_pid = None  # the rank's own process: a forked child (a DataLoader worker) is not a rank
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


def _recording_exit(status=None):
    global _exit_status
    if threading.current_thread() is threading.main_thread():
        _exit_status = status
    _real_exit(status)


def _at_exit():
    if os.getpid() != _pid:
        return
    code = _exit_code(_exit_status)
    if code != 0:
        abort_job(f"sys.exit({_exit_status!r}) (rank {_rank} of {_size}); ending the job", code)
    if _on_clean_exit is not None:
        _on_clean_exit()


def install(rank: int, size: int, on_clean_exit) -> None:
    """Install the handlers for a process of a multi-process job (once)."""
    global _rank, _size, _on_clean_exit, _installed, _pid
    _rank, _size, _on_clean_exit, _pid = rank, size, on_clean_exit, os.getpid()
    if _installed:
        return
    _installed = True
    sys.excepthook = _excepthook
    sys.exit = _recording_exit
    atexit.register(_at_exit)
