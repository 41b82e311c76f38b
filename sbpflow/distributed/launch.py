"""Start a multi-process job: `python -m sbpflow.distributed.launch --nproc-per-node N
[--hostfile F] script.py args` (or `-m module args`).

Runs this Python environment's own `mpiexec` (from the `mpich` wheel, installed next to the
interpreter) as `mpiexec [-f F -ppn N] -n 1 -env RANK 0 ... python -m mpi4py script.py args
: -n 1 -env RANK 1 ...`: one launch segment per rank, so every rank starts with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the machine's index), MASTER_ADDR and
MASTER_PORT set as torchrun and OneFlow's launcher set them (MASTER_* name the first machine
and port 29500 unless already set; MPI does the rendezvous, they are for scripts that read
them, and `init_process_group(init_method="env://")` checks RANK and WORLD_SIZE).
`python -m mpi4py` aborts the whole job when a rank's script raises (sbpflow's own handlers do
the same under a plain `mpiexec -n N python script.py`). The exit status is mpiexec's; when it
is not 0 the launcher adds which ranks failed and how (read from hydra's
`-print-all-exitcodes`), which also names a rank that crashed without a Python error.

With `--hostfile` (one machine per line, hydra's format `host[:slots]`; slots are ignored),
N ranks run on each machine, ranks 0..N-1 on the first line's machine, and so on. mpiexec
reaches the other machines by ssh, so each needs password-less ssh from this one and the same
environment at the same path. The launcher itself stays on this machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

DEFAULT_MASTER_PORT = "29500"  # torchrun's default
USAGE = (
    "usage: python -m sbpflow.distributed.launch --nproc-per-node N [--hostfile FILE] "
    "[--dry-run] (script.py | -m module) [args ...]"
)


def venv_mpiexec() -> str:
    """The `mpiexec` of this interpreter's environment (the mpich wheel puts it there)."""
    path = Path(sys.executable).parent / "mpiexec"
    if not path.exists():
        raise SystemExit(
            f"sbpflow.distributed.launch: no mpiexec next to {sys.executable}; "
            "install the MPI runtime with `pip install mpich mpi4py`"
        )
    return str(path)


def read_hostfile(path: str) -> list[str]:
    hosts = []
    try:
        with open(path) as f:
            for line in f:
                entry = line.split("#", 1)[0].strip()
                if entry:
                    hosts.append(entry.split()[0].split(":")[0])
    except OSError as exc:
        raise SystemExit(f"sbpflow.distributed.launch: cannot read hostfile: {exc}") from None
    if not hosts:
        raise SystemExit(f"sbpflow.distributed.launch: hostfile {path} lists no machines")
    return hosts


def parse_args(argv: list[str]) -> tuple[int, str | None, bool, list[str]]:
    """(ranks per machine, hostfile, dry run, the program: [script, args] or [-m, mod, args])."""
    nproc, hostfile, dry_run = None, None, False
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node", "--hostfile"):
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{name} needs a value\n{USAGE}")
                value = argv[i + 1]
                i += 1
            if name == "--hostfile":
                hostfile = value
            else:
                try:
                    nproc = int(value)
                except ValueError:
                    raise SystemExit(f"{name} must be an integer, got {value!r}") from None
            i += 1
        elif arg == "--dry-run":
            dry_run = True
            i += 1
        elif arg in ("-h", "--help"):
            print(USAGE)
            print(__doc__)
            raise SystemExit(0)
        elif arg.startswith("--"):
            raise SystemExit(f"unknown option {arg}\n{USAGE}")
        else:
            break
    program = argv[i:]
    if nproc is None or nproc < 1:
        raise SystemExit(f"--nproc-per-node must be a positive integer\n{USAGE}")
    if not program or (program[0] == "-m" and len(program) < 2):
        raise SystemExit(f"no script to run\n{USAGE}")
    return nproc, hostfile, dry_run, program


def build_command(nproc_per_node: int, hostfile: str | None, program: list[str],
                  mpiexec: str | None = None) -> list[str]:
    mpiexec = mpiexec or venv_mpiexec()
    hosts = read_hostfile(hostfile) if hostfile else ["127.0.0.1"]
    world_size = nproc_per_node * len(hosts)
    # torchrun's rendezvous address: informational here (MPI does the rendezvous), for
    # scripts that read it. The first machine holds rank 0.
    master_addr = os.environ.get("MASTER_ADDR", hosts[0])
    master_port = os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)
    cmd = [mpiexec, "-print-all-exitcodes"]
    if hostfile:
        cmd += ["-f", hostfile, "-ppn", str(nproc_per_node)]
    for rank in range(world_size):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1",
                "-env", "RANK", str(rank),
                "-env", "WORLD_SIZE", str(world_size),
                "-env", "LOCAL_RANK", str(rank % nproc_per_node),
                "-env", "LOCAL_WORLD_SIZE", str(nproc_per_node),
                "-env", "GROUP_RANK", str(rank // nproc_per_node),
                "-env", "MASTER_ADDR", master_addr,
                "-env", "MASTER_PORT", master_port,
                sys.executable, "-m", "mpi4py", *program]
    return cmd


_MARK = b"[mpiexec@"


def _relay(fd: int, out) -> str | None:
    """Copy mpiexec's stdout to ours as it comes; return its "Exit codes:" line, held back."""
    exit_line, hold = None, b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, hold = (hold + chunk).split(b"\n")
        for line in lines:
            if line.startswith(_MARK) and b"Exit codes:" in line:
                exit_line = line.decode(errors="replace")
            else:
                out.write(line + b"\n")
        # A partial line goes out at once (progress bars, prompts), unless it may be ours.
        if hold and not (hold.startswith(_MARK) or _MARK.startswith(hold)):
            out.write(hold)
            hold = b""
        out.flush()
    if hold:
        out.write(hold)
        out.flush()
    return exit_line


def rank_statuses(exit_line: str) -> list[int]:
    """hydra's `-print-all-exitcodes` line: wait statuses per machine, in rank order."""
    statuses = []
    for _, codes in re.findall(r"\[([^\]]+)\]\s*([\d,]+)", exit_line.split("Exit codes:", 1)[1]):
        statuses += [int(c) for c in codes.split(",") if c]
    return statuses


def describe_failures(statuses: list[int]) -> list[str]:
    lines = []
    for rank, status in enumerate(statuses):
        if status == 0:
            continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            lines.append(f"rank {rank} was killed by signal {sig} ({name})")
        elif os.WIFEXITED(status):
            lines.append(f"rank {rank} exited with status {os.WEXITSTATUS(status)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    nproc, hostfile, dry_run, program = parse_args(sys.argv[1:] if argv is None else argv)
    cmd = build_command(nproc, hostfile, program)
    if dry_run:
        print(" ".join(cmd))
        return
    sys.stdout.flush()
    # mpiexec's stdout is relayed (to read which rank failed from its exit-code line);
    # stdin and stderr are shared as they are.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)

    def forward(signum, frame):
        proc.send_signal(signum)  # mpiexec forwards it to every rank and cleans up

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGHUP, forward)
    # Ctrl-C reaches mpiexec directly (same process group); the launcher just waits for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_line = _relay(proc.stdout.fileno(), sys.stdout.buffer)
    code = proc.wait()
    if code != 0:
        failures = describe_failures(rank_statuses(exit_line)) if exit_line else []
        sys.stderr.write(
            f"sbpflow.distributed.launch: the job failed (mpiexec exit status {code})"
            + (": " + "; ".join(failures) if failures else "") + "\n"
        )
    raise SystemExit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
