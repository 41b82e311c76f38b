"""Two simulated machines on this one: Linux network namespaces joined by a veth pair.

`TwoMachines` creates namespaces `<PREFIX><pid>-<n>a` and `...b`, each with the loopback and
one end of a veth pair (named `IFACE` on both sides) addressed from the documentation range
192.0.2.0/24 (RFC 5737: never routed anywhere, so no address that exists elsewhere). A job
starts in the first namespace through the launcher's `--hostfile`; hydra reaches the second
"machine" through `launcher_exec.sh` (its "ssh": `ip netns exec <namespace> sh -c ...`).
MPICH is told every rank is remote (`MPIR_CVAR_NOLOCAL`), so ranks talk over the veth link as
they would between machines, not through shared memory.

Faults: `kill_rank` (SIGKILL to a rank in a namespace), `cut_link` (`ip link set ... down`),
`degrade_link` (`tc netem` delay and loss). `remove` kills whatever still runs in the
namespaces and deletes them; `remove_stale` deletes those left by an earlier run that died.
Every wait here is bounded in time.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "sbpfnt"
IFACE = "sbpfv0"
ADDRS = ("192.0.2.1", "192.0.2.2")  # RFC 5737 TEST-NET-1
TUN_IFACE = "sbpft0"  # the relayed link's devices, when the kernel has no netem
WRAPPER = Path(__file__).resolve().parent / "launcher_exec.sh"
IMPAIR = Path(__file__).resolve().parent / "impair.py"
REPO = Path(__file__).resolve().parents[3]
_count = itertools.count()


def _ip(*args: str, check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): "
                           f"{proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


def namespaces() -> list[str]:
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    proc = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def remove_namespace(ns: str, grace: float = 5.0) -> None:
    """Kill every process in `ns` (bounded wait), then delete it."""
    deadline = time.monotonic() + grace
    for _ in range(100):
        pids = pids_in(ns)
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    _ip("netns", "del", ns, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces of this harness whose test process is gone (a crashed run)."""
    removed = []
    for ns in namespaces():
        if not ns.startswith(PREFIX):
            continue
        pid = ns[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            remove_namespace(ns)
            removed.append(ns)
    return removed


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float  # from start to the end of the launcher

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Running:
    """A launcher started in the first namespace; its output is read as it comes."""

    def __init__(self, cmd: list[str], env: dict, machines: TwoMachines):
        self.machines = machines
        self.start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=env, cwd=REPO,
                                     start_new_session=True)
        self._lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (("stdout", self.proc.stdout),
                                              ("stderr", self.proc.stderr))]
        for t in self._readers:
            t.start()

    def _read(self, name, stream):
        for raw in iter(stream.readline, b""):
            with self._changed:
                self._lines[name].append(raw.decode(errors="replace"))
                self._changed.notify_all()
        stream.close()

    def text(self) -> str:
        with self._changed:
            return "".join(self._lines["stdout"]) + "".join(self._lines["stderr"])

    def wait_for(self, needle: str, timeout: float) -> None:
        """Wait until `needle` appears in the output; fail (ending the job) after timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(needle in line for lines in self._lines.values() for line in lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                self._changed.wait(min(left, 0.2))
            else:
                return
        result = self.finish(timeout=1)
        raise AssertionError(f"{needle!r} did not appear within {timeout} s (exit status "
                             f"{result.returncode})\n{result.output}")

    def finish(self, timeout: float) -> Result:
        """Wait for the launcher to end (at most `timeout` s, then kill the job)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - self.start
        if code is None:
            self.kill()
            code = self.proc.wait(timeout=10)
        for t in self._readers:
            t.join(timeout=5)
        result = Result(code, "".join(self._lines["stdout"]), "".join(self._lines["stderr"]),
                        seconds)
        if seconds >= timeout:
            raise AssertionError(f"the job did not end within {timeout} s; killed it\n"
                                 f"{result.output}")
        return result

    def kill(self) -> None:
        """End the launcher (its process group) and everything in the namespaces."""
        if self.proc.poll() is None:  # not yet reaped: its pid is still its own
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.machines.kill_all()


class TwoMachines:
    """Two network namespaces joined by a veth pair, with a hostfile for the launcher."""

    def __init__(self, workdir: Path):
        tag = f"{PREFIX}{os.getpid()}-{next(_count)}"
        self.ns = (f"{tag}a", f"{tag}b")
        self.hosts = ADDRS
        self.workdir = Path(workdir)
        self.hostfile = self.workdir / "hostfile"
        # Copied so that it is executable whatever the checkout did to file modes.
        self.wrapper = self.workdir / "launcher_exec.sh"
        self.iface = IFACE  # the link the job uses
        self._relay: subprocess.Popen | None = None

    # -- set up and tear down -----------------------------------------------------------------
    def create(self) -> TwoMachines:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            a, b = self.ns
            _ip("netns", "add", a)
            _ip("netns", "add", b)
            _ip("link", "add", IFACE, "netns", a, "type", "veth", "peer", "name", IFACE,
                "netns", b)
            for ns, addr in zip(self.ns, ADDRS):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
                _ip("-n", ns, "link", "set", IFACE, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            self.hostfile.write_text("".join(f"{h}\n" for h in self.hosts))
            shutil.copyfile(WRAPPER, self.wrapper)
            self.wrapper.chmod(0o755)
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        if self._relay is not None:
            self._relay.kill()
            self._relay.wait(timeout=10)
            self._relay = None
        for ns in self.ns:
            if ns in namespaces():
                remove_namespace(ns)

    def kill_all(self) -> None:
        for ns in self.ns:
            for pid in pids_in(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def processes(self, ns_index: int) -> list[int]:
        return pids_in(self.ns[ns_index])

    # -- jobs -----------------------------------------------------------------------------------
    def env(self, extra: dict | None = None) -> dict:
        drop = ("PMI_", "MPI_LOCAL", "OMPI_", "HYDRA_", "MV2_", "PMIX_", "MPIR_CVAR_", "UCX_",
                "FI_")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT"):
            env.pop(name, None)
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
            OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
            # hydra: start the other machine's proxy through the wrapper, not ssh, and
            # use the veth for the job's own connections.
            HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(self.wrapper),
            HYDRA_IFACE=self.iface,
            SBPFLOW_NETNS_HOSTS=" ".join(f"{h}={ns}" for h, ns in zip(self.hosts, self.ns)),
            # Both "machines" share this kernel: make MPICH treat every rank as remote, and
            # UCX (the wheel's network layer) use TCP over the veth, not shared memory.
            MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp,self", UCX_NET_DEVICES=self.iface,
        )
        env.update(extra or {})
        return env

    def launch(self, nproc_per_node: int, *program: str, env: dict | None = None) -> Running:
        cmd = ["ip", "netns", "exec", self.ns[0], sys.executable, "-m",
               "sbpflow.distributed.launch", "--nproc-per-node", str(nproc_per_node),
               "--hostfile", str(self.hostfile), *program]
        return Running(cmd, self.env(env), self)

    # -- faults ---------------------------------------------------------------------------------
    def kill_rank(self, ns_index: int, marker: str, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to the rank process in namespace `ns_index` whose command names
        `marker`; return its pid."""
        for pid in self.processes(ns_index):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mpi4py" in cmdline and any(marker.encode() in part for part in cmdline):
                os.kill(pid, sig)
                return pid
        raise AssertionError(f"no rank running {marker} in {self.ns[ns_index]}")

    @staticmethod
    def rank_of(pid: int) -> int:
        """The rank a process of the job is (from the RANK the launcher gave it)."""
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return int(next(v for v in environ if v.startswith(b"RANK="))[5:])

    def cut_link(self) -> None:
        _ip("-n", self.ns[0], "link", "set", IFACE, "down")

    def degrade_link(self, delay_ms: int, loss_pct: float) -> str:
        """Delay and drop packets both ways; return how ("netem" or "relay").

        With tc's netem where the kernel has it; else the veth gives way to a TUN device in
        each namespace and `impair.py` relays the packets between them, delaying and
        dropping them the same way (this kernel may lack sch_netem, as a container's may).
        """
        for ns in self.ns:
            proc = subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", IFACE, "root",
                                   "netem", "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%"],
                                  capture_output=True, text=True, timeout=10)
            if proc.returncode != 0:
                break
        else:
            return "netem"
        for ns in self.ns:  # no netem: detach the veth, relay through TUN devices
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", IFACE, "root"],
                           capture_output=True, timeout=10)
            _ip("-n", ns, "addr", "flush", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "down")
        self._relay = subprocess.Popen(
            [sys.executable, str(IMPAIR), *self.ns, TUN_IFACE, str(delay_ms), str(loss_pct),
             "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        ready = self._relay.stdout.readline()  # bounded: the relay prints it or exits
        if ready.strip() != b"ready":
            err = self._relay.stderr.read().decode(errors="replace")
            raise RuntimeError(f"impair.py did not start: {err}")
        for ns, addr in zip(self.ns, ADDRS):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", TUN_IFACE)
            _ip("-n", ns, "link", "set", TUN_IFACE, "up")
        self.iface = TUN_IFACE
        return "relay"

    def heal(self) -> None:
        """Link up, no delay or loss, nothing left running: ready for the next job."""
        self.kill_all()
        if self._relay is not None:
            self._relay.stdin.close()  # the relay ends; its TUN devices go with it
            try:
                self._relay.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._relay.kill()
                self._relay.wait(timeout=5)
            self._relay = None
        self.iface = IFACE
        for ns, addr in zip(self.ns, ADDRS):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", IFACE, "root"],
                           capture_output=True, timeout=10)
            _ip("-n", ns, "addr", "replace", f"{addr}/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", IFACE, "up")
