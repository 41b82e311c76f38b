"""Start one rank of a launched job, with a watcher that records when the rank's process ends.

The launcher runs every rank as `python -I -S rank_start.py PROGRAM ARGS...` (run as a file,
not as a module, so that nothing of sbpflow is imported here). This file starts the watcher
and then execs PROGRAM in its own process: the rank keeps the pid, the parent and the signals
hydra gave it, and its command line is PROGRAM's.

Why a watcher: when ranks fail, the launcher names the one that ended first as the cause.
hydra's proxy reacts to a rank's death when the rank's end of its PMI socket (PMI_FD), and its
stdout and stderr, close: it then SIGKILLs the other ranks. A process closes its files in the
kernel before its exit is signalled (to a pidfd, or to waitpid), so a rank that dies first
could be seen ending after a bystander that hydra killed in between. The watcher, a
grandchild of this process reparented away from the rank, keeps its own copies of those
files open, so hydra sees nothing until the watcher closes them: it waits on a pidfd of the
rank, appends `end RANK MONOTONIC_NS BOOT_ID` to the job's record file, and only then exits.
Whatever hydra does next happens after the record exists. The first line it writes,
`watch RANK BOOT_ID`, says that the rank is watched (a rank on another machine, whose record
file is not reachable, is not).

The record file is `$SBPFLOW_RANK_RECORD` (made by the launcher); without it, or where its
folder does not exist (another machine), or without pidfds, the rank just runs.
"""

import os
import signal
import sys

RECORD_ENV = "SBPFLOW_RANK_RECORD"


def _boot_id() -> str:
    """Monotonic clocks of one boot of one machine can be compared; this names it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def _append(path: str, line: str) -> None:
    """One write of one line (O_APPEND: lines of several watchers never mix)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def watch(pidfd: int, path: str, rank: str) -> None:
    """The watcher: record when the rank's process ends, then exit (closing hydra's files)."""
    import select

    os.setsid()  # out of the rank's session and process group: signals to those pass us by
    # Hold only what tells hydra about this rank: its stdout, stderr and PMI socket. The rank
    # may have inherited other files from hydra (another rank's PMI socket, made before this
    # rank was started): held here, they would hide that rank's end from hydra.
    keep = {1, 2, pidfd}
    try:
        keep.add(int(os.environ["PMI_FD"]))
    except (KeyError, ValueError):
        pass
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    for fd in _open_fds():
        if fd not in keep and fd != 0:
            try:
                os.close(fd)
            except OSError:
                pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the rank's end ends us, nothing else
    boot = _boot_id()
    try:
        _append(path, f"watch {rank} {boot}\n")
    except OSError:
        pass
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while not poller.poll():
        pass
    now = _clock_ns()
    try:
        _append(path, f"end {rank} {now} {boot}\n")
    except OSError:
        pass


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _clock_ns() -> int:
    import time

    return time.monotonic_ns()


def start_watcher(path: str, rank: str) -> None:
    """Fork the watcher (as a grandchild: the rank never has it as a child to reap)."""
    pidfd = os.pidfd_open(os.getpid())
    try:
        child = os.fork()
        if child == 0:
            try:
                if os.fork() == 0:
                    os.set_inheritable(pidfd, True)
                    os.execv(sys.executable, [sys.executable, "-I", "-S", os.path.abspath(
                        __file__), "--watch", str(pidfd), path, rank])
            finally:
                os._exit(0)
        os.waitpid(child, 0)
    finally:
        os.close(pidfd)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--watch"]:
        watch(int(argv[1]), argv[2], argv[3])
        return
    if not argv:
        sys.exit("usage: rank_start.py PROGRAM [ARGS...]")
    path, rank = os.environ.get(RECORD_ENV), os.environ.get("PMI_RANK")
    if path and rank is not None and os.path.isdir(os.path.dirname(path)) and hasattr(
            os, "pidfd_open"):
        try:
            start_watcher(path, rank)
        except OSError:
            pass  # no pidfds, no fork: the rank runs unwatched
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.exit(f"sbpflow.distributed.launch: cannot run {argv[0]}: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
