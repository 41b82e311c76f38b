"""Start a multi-process job: `python -m sbpflow.distributed.launch --nproc-per-node N
[--hostfile F | --nnodes M --node_rank K --master_addr A --master_port P] [--no_python]
[--logdir DIR] script.py args` (or `-m module args`). Options are accepted with `-` or `_`
between words (`--nproc_per_node`, `--node-rank`), as torchrun's and OneFlow's launchers.

Runs this Python environment's own `mpiexec` (from the `mpich` wheel, installed next to the
interpreter) as `mpiexec [-f F -ppn N] -n 1 -env RANK 0 ... python -m mpi4py script.py args
: -n 1 -env RANK 1 ...`: one launch segment per rank, so every rank starts with RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the machine's index), MASTER_ADDR and
MASTER_PORT set as torchrun and OneFlow's launcher set them (MASTER_* name the first machine
and port 29500 unless already set; MPI does the rendezvous, they are for scripts that read
them, and `init_process_group(init_method="env://")` checks RANK and WORLD_SIZE).
`python -m mpi4py` aborts the whole job when a rank's script raises (sbpflow's own handlers do
the same under a plain `mpiexec -n N python script.py`). When the job fails the launcher adds
which ranks failed and how (read from hydra's `-print-all-exitcodes`), which also names a rank
that crashed without a Python error. The exit status is mpiexec's, except that a job whose
first failure is a rank exiting with status n (`os._exit(n)`, say) ends with n.

With `--hostfile` (one machine per line, hydra's format `host[:slots]`; slots are ignored),
N ranks run on each machine, ranks 0..N-1 on the first line's machine, and so on. mpiexec
reaches the other machines by ssh, so each needs password-less ssh from this one and the same
environment at the same path. The launcher itself stays on this machine.

The job never outlives the launcher: SIGINT, SIGTERM and SIGHUP to the launcher are passed
to mpiexec, which ends every rank; mpiexec is started with a parent-death signal (SIGTERM,
`prctl(PR_SET_PDEATHSIG)`), so a SIGKILLed launcher (the OOM killer, `timeout -s KILL`)
ends the job the same way. When ranks fail, the summary names the first failure as the
cause, and the ranks ended after it as stopped because of it. hydra's own report cannot tell
them apart (it kills the others by the same SIGKILL, and may name one of them), so each rank
starts through `rank_start.py`, whose watcher process records when the rank's process ended
before hydra can react to it (see that file); the launcher takes the MPI_Abort caller hydra
names, else the failed rank recorded ending first when every rank ran on this machine.

One launcher per machine (OneFlow's and torchrun's form): `--nnodes M --node_rank K
--master_addr A --master_port P` run on each of M machines forms one job of M * N ranks,
ranks K*N..K*N+N-1 on machine K. It is hydra's own multi-machine startup with its "manual"
launcher, so no rendezvous is written here: the launcher of node 0 (which must run on A) runs
`mpiexec -launcher manual -hosts node0,...` with its control port fixed to P
(`MPIEXEC_PORT_RANGE=P:P`) and starts node 0's `hydra_pmi_proxy` as mpiexec asks; the launcher
of node K runs only `hydra_pmi_proxy --control-port A:P --proxy-id K`, which connects to that
mpiexec (retrying while it is not up yet, for `PROXY_RETRIES` seconds) and starts this
machine's ranks when mpiexec sends them. So node 0's launcher prints every rank's output and
reports the job's failures and exit status; the others end with their proxy. No ssh is
needed, only TCP from every machine to A:P and between the machines' ranks. Node 0 waits
for every node's proxy before any rank starts (there is no join timeout: a node that never
comes holds the job until the launcher is stopped).

`--no_python` runs the program itself on each rank (an executable, not a Python script).
`--logdir DIR` sends each rank's stdout and stderr to `DIR/rank-N.log` on the rank's own
machine (made if needed; an existing log is overwritten) instead of the launcher's output.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .rank_start import RECORD_ENV, _boot_id

DEFAULT_MASTER_PORT = "29500"  # torchrun's default
PROXY_RETRIES = 120  # seconds node K waits for node 0's mpiexec to listen
# Every rank starts through it (see its docstring); run as a file, so it imports no sbpflow.
RANK_START = str(Path(__file__).resolve().with_name("rank_start.py"))
USAGE = (
    "usage: python -m sbpflow.distributed.launch --nproc-per-node N [--hostfile FILE | "
    "--nnodes M --node_rank K --master_addr A --master_port P] [--no_python] [--logdir DIR] "
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
    """The machines of a hydra hostfile, in order: `host[:slots]` per line (later words on
    the line are hydra's options), `#` comments and blank lines skipped. A line hydra would
    misread, or refuse only after ssh to every machine, is refused here, naming it."""
    hosts = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                entry = line.split("#", 1)[0].strip()
                if entry:
                    hosts.append(_hostfile_host(path, number, line, entry.split()[0]))
    except OSError as exc:
        raise SystemExit(f"sbpflow.distributed.launch: cannot read hostfile: {exc}") from None
    if not hosts:
        raise SystemExit(f"sbpflow.distributed.launch: hostfile {path} lists no machines")
    return hosts


def _hostfile_host(path: str, number: int, line: str, word: str) -> str:
    host, sep, slots = word.partition(":")
    problem = None
    if not host:
        problem = "the host name is empty"
    elif sep and not slots:
        problem = "the slot count after ':' is empty"
    elif ":" in slots:
        problem = "more than one ':' (expected host or host:slots)"
    elif sep and not (slots.isascii() and slots.isdigit() and int(slots) > 0):
        problem = f"the slot count {slots!r} is not a positive integer"
    if problem is not None:
        raise SystemExit(f"sbpflow.distributed.launch: hostfile {path}, line {number}: "
                         f"{line.rstrip(chr(10))!r}: {problem} (each line is host[:slots])")
    return host


@dataclasses.dataclass
class Options:
    nproc: int
    program: list[str]
    hostfile: str | None = None
    dry_run: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None  # None: $MASTER_ADDR, else the first machine
    master_port: str | None = None  # None: $MASTER_PORT, else 29500
    no_python: bool = False
    logdir: str | None = None


# option (with "_" for "-") -> (field, kind)
_VALUED = {
    "--nproc_per_node": ("nproc", int), "--hostfile": ("hostfile", str),
    "--nnodes": ("nnodes", int), "--node_rank": ("node_rank", int),
    "--master_addr": ("master_addr", str), "--master_port": ("master_port", int),
    "--logdir": ("logdir", str), "--log_dir": ("logdir", str),
}
_FLAGS = {"--dry_run": "dry_run", "--no_python": "no_python"}


def parse_options(argv: list[str]) -> Options:
    """Every option of the launcher; the program is the first argument that is not one."""
    values: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        key = "--" + name[2:].replace("-", "_") if name.startswith("--") else name
        if key in _VALUED:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"{name} needs a value\n{USAGE}")
                value = argv[i + 1]
                i += 1
            field, kind = _VALUED[key]
            if kind is int:
                try:
                    value = int(value)
                except ValueError:
                    raise SystemExit(f"{name} must be an integer, got {value!r}") from None
                if key == "--master_port":
                    value = str(value)
            values[field] = value
            i += 1
        elif key in _FLAGS and not eq:
            values[_FLAGS[key]] = True
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
    nproc = values.pop("nproc", None)
    if nproc is None or nproc < 1:
        raise SystemExit(f"--nproc-per-node must be a positive integer\n{USAGE}")
    if not program or (program[0] == "-m" and len(program) < 2):
        raise SystemExit(f"no script to run\n{USAGE}")
    opts = Options(nproc, program, **values)
    if opts.nnodes < 1:
        raise SystemExit(f"--nnodes must be a positive integer, got {opts.nnodes}\n{USAGE}")
    if not 0 <= opts.node_rank < opts.nnodes:
        raise SystemExit(f"--node_rank must be in [0, {opts.nnodes}) for --nnodes "
                         f"{opts.nnodes}, got {opts.node_rank}\n{USAGE}")
    if opts.nnodes > 1 and opts.hostfile:
        raise SystemExit("--hostfile and --nnodes > 1 are two ways to name the machines: "
                         f"give one\n{USAGE}")
    if opts.master_port is not None and not 0 < int(opts.master_port) < 65536:
        raise SystemExit(f"--master_port must be a TCP port, got {opts.master_port}")
    if opts.no_python and program[0] == "-m":
        raise SystemExit(f"--no_python runs a program, not a module (-m)\n{USAGE}")
    return opts


def parse_args(argv: list[str]) -> tuple[int, str | None, bool, list[str]]:
    """(ranks per machine, hostfile, dry run, the program: [script, args] or [-m, mod, args])."""
    opts = parse_options(argv)
    return opts.nproc, opts.hostfile, opts.dry_run, opts.program


def rendezvous(hosts: list[str], master_addr: str | None = None,
               master_port: str | None = None) -> tuple[str, str]:
    """torchrun's MASTER_ADDR and MASTER_PORT: the options, else the environment's, else the
    first machine and 29500. For scripts that read them (MPI does the rendezvous); with
    --nnodes, also where node 0's mpiexec listens."""
    return (master_addr or os.environ.get("MASTER_ADDR", hosts[0]),
            str(master_port or os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)))


def node_names(nnodes: int) -> list[str]:
    """The names hydra gives the machines of a --nnodes job (manual launch resolves none)."""
    return [f"node{k}" for k in range(nnodes)]


def build_command(nproc_per_node: int, hostfile: str | None, program: list[str],
                  mpiexec: str | None = None, *, nnodes: int = 1,
                  master_addr: str | None = None, master_port: str | None = None,
                  no_python: bool = False, logdir: str | None = None) -> list[str]:
    """node 0's mpiexec command line: one launch segment per rank."""
    mpiexec = mpiexec or venv_mpiexec()
    if nnodes > 1:
        hosts = node_names(nnodes)
        master_addr, master_port = rendezvous(["127.0.0.1"], master_addr, master_port)
    else:
        hosts = read_hostfile(hostfile) if hostfile else ["127.0.0.1"]
        master_addr, master_port = rendezvous(hosts, master_addr, master_port)
    world_size = nproc_per_node * len(hosts)
    cmd = [mpiexec, "-print-all-exitcodes"]
    if hostfile:
        cmd += ["-f", hostfile, "-ppn", str(nproc_per_node)]
    elif nnodes > 1:
        # hydra's own multi-machine startup: it prints the proxy command lines (HYDRA_LAUNCH)
        # instead of running them by ssh; each machine's launcher starts its proxy.
        cmd += ["-launcher", "manual", "-localhost", master_addr, "-hosts", ",".join(hosts),
                "-ppn", str(nproc_per_node)]
    run = list(program) if no_python else [sys.executable, "-m", "mpi4py", *program]
    start = [sys.executable, "-I", "-S", RANK_START]
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
                "-env", "MASTER_PORT", master_port]
        if logdir:
            # Made and opened by the rank's own shell, so on the rank's machine.
            log = os.path.join(os.path.abspath(logdir), f"rank-{rank}.log")
            cmd += [*start, "/bin/sh", "-c", 'mkdir -p "${0%/*}" && exec "$@" > "$0" 2>&1', log]
        else:
            cmd += start
        cmd += run
    return cmd


def proxy_command(node_rank: int, master_addr: str, master_port: str,
                  retries: int = 10) -> list[str]:
    """The hydra proxy that node `node_rank` runs to join node 0's `mpiexec -launcher manual`:
    the command line that mpiexec prints for it (HYDRA_LAUNCH), built here from the master's
    address and port instead of being sent over."""
    proxy = str(Path(venv_mpiexec()).parent / "hydra_pmi_proxy")
    return [proxy, "--control-port", f"{master_addr}:{master_port}", "--rmk", "user",
            "--launcher", "manual", "--demux", "poll", "--pgid", "0", "--retries", str(retries),
            "--usize", "-1", "--pmi-port", "0", "--gpus-per-proc", "-2",
            "--gpu-subdevs-per-proc", "-2", "--proxy-id", str(node_rank)]


_MARK = b"[mpiexec@"
_MORE_EXIT_CODES = re.compile(rb"\[[^\]]+\]\s*[\d,]+")  # hydra: one line per further machine


_LAUNCH_MARK = b"HYDRA_LAUNCH"  # `-launcher manual`: a proxy command line to run


def _ours(hold: bytes) -> bool:
    """A partial line that may become one of the lines the relay keeps back."""
    return any(hold.startswith(m) or m.startswith(hold) for m in (_MARK, _LAUNCH_MARK))


def _relay(fd: int, out, hydra_lines: bytearray | None = None,
           on_launch=None) -> str | None:
    """Copy mpiexec's stdout to ours as it comes; return its "Exit codes:" line, held back.

    Lines that name an MPI_Abort caller, or a failed rank's host and code (hydra's "BAD
    TERMINATION" report), are also kept in `hydra_lines`. With `on_launch`, hydra's
    HYDRA_LAUNCH lines (`-launcher manual`) go to it instead of the output.
    """
    exit_line, hold, in_exit = None, b"", False
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, hold = (hold + chunk).split(b"\n")
        for line in lines:
            if on_launch is not None and line.startswith(_LAUNCH_MARK):
                on_launch(line.decode(errors="replace"))
            elif line.startswith(_MARK) and b"Exit codes:" in line:
                exit_line, in_exit = line.decode(errors="replace"), True
            elif in_exit and _MORE_EXIT_CODES.fullmatch(line.strip()):
                exit_line += " " + line.decode(errors="replace")  # the next machine's codes
            else:
                in_exit = False
                out.write(line + b"\n")
                if hydra_lines is not None and (b"MPI_Abort" in line or b"RUNNING AT " in line
                                                or b"EXIT CODE: " in line):
                    hydra_lines += line[-512:] + b"\n"
                    del hydra_lines[:-8192]
        # A partial line goes out at once (progress bars, prompts), unless it may be ours.
        if hold and not (in_exit or _ours(hold)):
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


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return f"was killed by signal {sig} ({name})"
    return f"exited with status {os.WEXITSTATUS(status)}"


def first_failure(statuses: list[int], culprit: int | None = None) -> int | None:
    """The rank whose failure ended the job.

    `culprit`, when known, is the rank seen to end first (or the MPI_Abort caller hydra
    names). Otherwise the first rank with a non-zero exit status (bystanders are killed by a
    signal, never exit by themselves), else the first rank that failed at all.
    """
    failed = [r for r, s in enumerate(statuses) if s != 0]
    if culprit is not None and 0 <= culprit < len(statuses):
        return culprit
    exited = [r for r in failed if os.WIFEXITED(statuses[r])]
    return (exited or failed or [None])[0]


def describe_failures(statuses: list[int], culprit: int | None = None) -> list[str]:
    """One line for the first failure, one for the ranks stopped because of it."""
    cause = first_failure(statuses, culprit)
    if cause is None:
        return []
    if statuses[cause] == 0:  # named by hydra, but reported as a clean exit (MPI_Abort)
        lines = [f"rank {cause} failed first (it ended the job)"]
    else:
        lines = [f"rank {cause} {_how(statuses[cause])} (the first failure)"]
    stopped: dict[str, list[int]] = {}
    for rank, status in enumerate(statuses):
        if status != 0 and rank != cause:
            stopped.setdefault(_how(status), []).append(rank)
    for how, ranks in stopped.items():
        names = ", ".join(map(str, ranks))
        lines.append(f"rank{'s' if len(ranks) > 1 else ''} {names} "
                     f"{'were' if len(ranks) > 1 else 'was'} stopped because of it "
                     f"({how.removeprefix('was ')})")
    return lines


_BAD_TERMINATION = re.compile(rb"PID \d+ RUNNING AT (\S+)\s*\n=\s*EXIT CODE: (-?\d+)")


def describe_remote_failure(output: bytes, hosts: list[str], nproc: int) -> list[str]:
    """When hydra printed no exit codes (it does not when a rank on another machine fails),
    its "BAD TERMINATION" report still names the host: the ranks placed there, and its code
    (a killed process's code is its signal)."""
    m = _BAD_TERMINATION.search(output)
    if m is None:
        return []
    host, code = m.group(1).decode(errors="replace"), int(m.group(2))
    who = "a rank"
    if host in hosts:
        first = hosts.index(host) * nproc
        who = f"rank {first}" if nproc == 1 else f"one of ranks {first}-{first + nproc - 1}"
    how = f"ended with code {code}"
    try:
        how += f" (or was killed by signal {code}, {signal.Signals(code).name})"
    except ValueError:
        pass
    return [f"{who} on host {host} {how} (the first failure)"]


_ABORT_RANK = re.compile(rb"MPI_Abort\(\S+, -?\d+\) - process (\d+)")
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGTERM when the launcher dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


@dataclasses.dataclass
class RankRecords:
    """What the ranks' watchers (rank_start.py) recorded: the order the ranks' processes
    ended in, batch by batch (ranks that ended in the same nanosecond share a batch), and
    whether every rank of the job was watched on this machine (this boot of it: monotonic
    times of one boot compare). A rank on another machine is not: then the first rank seen
    ending here need not be the first to end."""

    ended: list[list[int]]
    all_watched: bool

    @classmethod
    def read(cls, path: str, world_size: int, boot: str | None = None) -> RankRecords:
        boot = _boot_id() if boot is None else boot
        watched, ends = set(), {}
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in lines:
            parts = line.split()
            try:
                if parts[0] == "watch" and parts[2] == boot:
                    watched.add(int(parts[1]))
                elif parts[0] == "end" and parts[3] == boot:
                    ends.setdefault(int(parts[1]), int(parts[2]))
            except (IndexError, ValueError):
                continue  # a line cut short: ignored
        batches: dict[int, list[int]] = {}
        for rank, t in ends.items():
            batches.setdefault(t, []).append(rank)
        return cls([sorted(batches[t]) for t in sorted(batches)],
                   watched >= set(range(world_size)))


def _culprit(output: bytes, records: RankRecords, statuses: list[int]) -> int | None:
    """The rank that failed first, when it can be told; None otherwise.

    A rank that called MPI_Abort (hydra names it) ended the job on purpose: it is the cause,
    whichever process hydra's kill then ended first. Otherwise the first failed rank whose
    process ended, when every rank was watched (its watcher's record precedes whatever hydra
    did about its end, so no rank hydra killed because of it can be recorded before it).
    """
    m = _ABORT_RANK.search(output)
    if m:
        return int(m.group(1))
    if records.all_watched:
        for batch in records.ended:
            if any(r >= len(statuses) for r in batch):
                return None  # a rank whose status hydra did not report here ended first
            failed = [r for r in batch if statuses[r] != 0]
            if len(failed) == 1:
                return failed[0]
            if failed:  # several in the same instant: cannot tell which was first
                return None
    return None


def _start_proxy(line: str, env: dict, procs: list) -> None:
    """mpiexec -launcher manual asks for node 0's proxy: start it here (the other nodes'
    launchers start theirs)."""
    if not line.startswith("HYDRA_LAUNCH:"):
        return
    argv = line.split(":", 1)[1].split()
    if argv[-2:] != ["--proxy-id", "0"]:
        return
    procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                  preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent)))


def _forward_signals(procs: list) -> None:
    """Every signal that ends a job ends it through mpiexec (or this node's proxy)."""

    def forward(signum, frame):
        for proc in procs:
            try:
                proc.send_signal(signum)
            except OSError:
                pass

    # A Ctrl-C at a terminal reaches mpiexec directly too (same process group); hydra takes
    # a repeated SIGINT as one.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)


_NO_SERVER = b"unable to connect to server"


def _run_proxy(cmd: list[str], procs: list) -> tuple[int, bool]:
    """Run one proxy; copy its stderr to ours. (exit status, whether it never reached the
    server: hydra's proxy tries once when the port is closed, so the caller tries again)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent))
    procs[:] = [proc]
    err, unreached = b"", False
    try:
        while True:
            chunk = os.read(proc.stderr.fileno(), 1 << 16)
            if not chunk:
                break
            if _NO_SERVER in err + chunk:
                unreached = True
            if unreached:  # held back: only the last try's complaint is shown
                err = (err + chunk)[-8192:]
            else:
                sys.stderr.buffer.write(chunk)
                sys.stderr.flush()
                err = chunk[-256:]
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
    if unreached and code != 0:
        return code, True
    if unreached:
        sys.stderr.buffer.write(err)
    return code, False


def _join(opts: Options) -> None:
    """Node K > 0 of a --nnodes job: run this machine's hydra proxy, which connects to node
    0's mpiexec and runs the ranks it is sent. While node 0's mpiexec is not listening yet,
    the proxy is started again once a second, for PROXY_RETRIES seconds."""
    addr, port = rendezvous(["127.0.0.1"], opts.master_addr, opts.master_port)
    cmd = proxy_command(opts.node_rank, addr, port)
    if opts.dry_run:
        print(" ".join(cmd))
        return
    sys.stdout.flush()
    procs: list = []
    _forward_signals(procs)
    deadline = time.monotonic() + PROXY_RETRIES
    while True:
        code, unreached = _run_proxy(cmd, procs)
        if not unreached:
            break
        if time.monotonic() >= deadline:
            sys.stderr.write(
                f"sbpflow.distributed.launch: node {opts.node_rank} could not reach node 0's "
                f"mpiexec at {addr}:{port} for {PROXY_RETRIES} s: start the launcher with "
                "--node_rank 0 on that machine, with the same --master_addr/--master_port\n")
            raise SystemExit(code if code > 0 else 1)
        time.sleep(1.0)
    if code != 0:
        sys.stderr.write(
            f"sbpflow.distributed.launch: node {opts.node_rank}'s part of the job failed "
            f"(hydra_pmi_proxy exit status {code}); node 0's launcher ({addr}:{port}) reports "
            "which rank failed\n")
    raise SystemExit(code if code >= 0 else 128 - code)


def main(argv: list[str] | None = None) -> None:
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    if opts.node_rank > 0:
        _join(opts)
        return
    nproc, hostfile, multi = opts.nproc, opts.hostfile, opts.nnodes > 1
    cmd = build_command(nproc, hostfile, opts.program, nnodes=opts.nnodes,
                        master_addr=opts.master_addr, master_port=opts.master_port,
                        no_python=opts.no_python, logdir=opts.logdir)
    if opts.dry_run:
        print(" ".join(cmd))
        return
    sys.stdout.flush()
    world_size = nproc * (len(read_hostfile(hostfile)) if hostfile else opts.nnodes)
    record_dir = tempfile.mkdtemp(prefix="sbpflow-launch-")
    record = os.path.join(record_dir, "ranks")
    env = {**os.environ, RECORD_ENV: record}  # where the ranks' watchers record their ends
    mpiexec_env = dict(env)
    # node 0's mpiexec listens on the master port, where the proxies connect (only hydra reads
    # MPIEXEC_PORT_RANGE; the MPI library in the ranks reads MPIR_CVAR_/MPICH_PORT_RANGE).
    if multi:
        mpiexec_env["MPIEXEC_PORT_RANGE"] = "{0}:{0}".format(
            rendezvous(["127.0.0.1"], opts.master_addr, opts.master_port)[1])
    try:
        # mpiexec's stdout is relayed (to read which rank failed from its exit-code line);
        # stdin and stderr are shared as they are.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=mpiexec_env,
                                preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent))
        procs = [proc]
        _forward_signals(procs)
        on_launch = (lambda line: _start_proxy(line, env, procs)) if multi else None
        tail = bytearray()
        try:
            exit_line = _relay(proc.stdout.fileno(), sys.stdout.buffer, tail, on_launch)
            code = proc.wait()
            for proxy in procs[1:]:
                proxy.wait()
        finally:
            for p in procs:
                if p.poll() is None:  # the launcher itself failed: never leave the job behind
                    p.terminate()
        records = RankRecords.read(record, world_size)
    finally:
        shutil.rmtree(record_dir, ignore_errors=True)
    status = code if code >= 0 else 128 - code
    if code != 0:
        statuses = rank_statuses(exit_line) if exit_line else []
        culprit = _culprit(bytes(tail), records, statuses)
        failures = describe_failures(statuses, culprit)
        if (hostfile or multi) and (not failures or culprit is None):
            # Several machines and no known first failure: hydra's report of the first bad
            # termination (host and exit code) beats this machine's exit codes, which also
            # count the ranks hydra killed here after a failure elsewhere.
            hosts = read_hostfile(hostfile) if hostfile else node_names(opts.nnodes)
            failures = describe_remote_failure(bytes(tail), hosts, nproc) or failures
        sys.stderr.write(
            f"sbpflow.distributed.launch: the job failed (mpiexec exit status {code})"
            + (": " + "; ".join(failures) if failures else "") + "\n"
        )
        cause = first_failure(statuses, culprit)
        if cause is not None and os.WIFEXITED(statuses[cause]) and statuses[cause]:
            # The job ends with the status the failing rank's script ended with, as a single
            # process would (hydra may report the signal it then sent the others instead).
            status = os.WEXITSTATUS(statuses[cause])
    raise SystemExit(status)


if __name__ == "__main__":
    main()
