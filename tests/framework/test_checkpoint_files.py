"""Checkpoint files under hostile conditions: kill -9 mid-save, read-only targets, symlinks,
non-regular files, headers that promise more than the file holds, and load's peak memory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework import serialization

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(code: str, *args, timeout: float = 120, prefix=(), **kwargs):
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=_env(), **kwargs)


def _extras(directory, keep):
    return sorted(set(os.listdir(directory)) - set(keep))


# -- kill -9 mid-save ------------------------------------------------------------------------
_SAVER = """
import sys
import numpy as np
from sbpflow.framework import serialization
import sbpflow as flow
sd = {"w": flow.from_numpy(np.ones((16, 1 << 20), np.float32))}  # 64 MiB
while True:
    serialization.save(sd, sys.argv[1])
"""


def test_kill_9_mid_save_leaves_no_stale_temp_after_the_next_save(tmp_path):
    target = tmp_path / "ckpt.safetensors"
    serialization.save({"w": flow.tensor([1.0, 2.0])}, target)
    kills = 0
    for _ in range(4):  # bounded: four saver processes, each killed mid-save
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(target)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and proc.poll() is None:
                if _extras(tmp_path, [target.name]):  # a save is under way: its temp file
                    time.sleep(0.005)
                    os.kill(proc.pid, signal.SIGKILL)
                    kills += 1
                    break
                time.sleep(0.001)
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert kills == 4
    stranded = _extras(tmp_path, [target.name])
    assert stranded, "each kill mid-save strands a temp file until the next save"
    # The checkpoint is still whole (the old one or a finished one).
    assert serialization.load(target)["w"].shape[0] in (2, 16)
    serialization.save({"w": flow.tensor([5.0])}, target)
    assert _extras(tmp_path, [target.name]) == []
    np.testing.assert_array_equal(serialization.load(target)["w"].numpy(), [5.0])


def test_stale_temp_cleanup_spares_live_processes_and_other_hosts(tmp_path):
    target = tmp_path / "m.safetensors"
    prefix = serialization._temp_prefix(target.name)
    host = serialization._host_tag()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        live_start = serialization._process_start(live.pid)
        me, my_start = os.getpid(), serialization._process_start(os.getpid())
        names = {
            "live": f"{prefix}{live.pid}.{live_start}.{host}.0a0a0a0a",
            "mine": f"{prefix}{me}.{my_start}.{host}.0b0b0b0b",  # a save in another thread
            "other_host": f"{prefix}{dead.pid}.1.{'f' * 8 if host != 'f' * 8 else '0' * 8}.0c",
            "dead": f"{prefix}{dead.pid}.1.{host}.0d0d0d0d",
            "reused_pid": f"{prefix}{me}.{my_start + 1}.{host}.0e0e0e0e",
            "not_ours": f".{target.name}.abc123.tmp",
        }
        for name in names.values():
            (tmp_path / name).write_bytes(b"x" * 100)
        serialization.save({"a": 1}, target)
        left = set(os.listdir(tmp_path))
        for kind in ("live", "mine", "other_host", "not_ours"):
            assert names[kind] in left, kind
        for kind in ("dead", "reused_pid"):
            assert names[kind] not in left, kind
    finally:
        live.kill()
        live.wait()


# -- read-only targets -------------------------------------------------------------------------
def _without_root_override():
    """A command prefix under which permission bits bind (root ignores them otherwise)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return (setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}")


def test_saving_over_a_read_only_file_is_refused_like_torch(tmp_path):
    directory = tempfile.mkdtemp(dir=tmp_path)
    path = os.path.join(directory, "ro.safetensors")
    serialization.save({"w": flow.tensor([1.0, 2.0])}, path)
    os.chmod(path, 0o444)
    before = open(path, "rb").read()
    code = """
    import sys, torch
    from sbpflow.framework import serialization
    import sbpflow as flow
    path, new = sys.argv[1], sys.argv[2]
    for who, save in (("torch", lambda p: torch.save({"w": torch.ones(3)}, p)),
                      ("sbpflow", lambda p: serialization.save({"w": flow.ones(3)}, p))):
        for target in (path, new):
            try:
                save(target)
                print(who, "saved", flush=True)
            except Exception as e:
                print(who, type(e).__name__, isinstance(e, PermissionError),
                      isinstance(e, RuntimeError), target in str(e), flush=True)
    """
    ro_dir = os.path.join(directory, "ro_dir")
    os.mkdir(ro_dir)
    os.chmod(ro_dir, 0o555)
    out = _run(code, path, os.path.join(ro_dir, "new.safetensors"),
               prefix=_without_root_override())
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("torch RuntimeError") and lines[1].startswith("torch RuntimeError")
    # Ours: PermissionError naming the path, and a RuntimeError as torch's.
    assert lines[2:] == ["sbpflow _WriteRefused True True True"] * 2, out.stdout
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(directory)) == ["ro.safetensors", "ro_dir"]
    assert os.listdir(ro_dir) == []


def test_directory_or_missing_parent_targets_fail_like_torch(tmp_path):
    sd = {"w": flow.ones(2)}
    missing = tmp_path / "absent" / "x.safetensors"
    for target, cls in ((tmp_path, IsADirectoryError), (missing, FileNotFoundError)):
        with pytest.raises(RuntimeError) as want:
            torch.save({"w": torch.ones(2)}, target)
        with pytest.raises(cls) as got:  # Python's error for open(target, "wb") ...
            flow.save(sd, target)
        assert isinstance(got.value, RuntimeError), want.value  # ... and torch's type
        assert str(target) in str(got.value) and ".sbpflow-tmp" not in str(got.value)
    assert "Parent directory" in str(want.value)
    assert os.listdir(tmp_path) == []


# -- symlinks ----------------------------------------------------------------------------------
def test_saving_through_a_symlink_keeps_the_link_and_updates_its_target(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    real = tmp_path / "real" / "ckpt.safetensors"
    link = tmp_path / "links" / "latest.safetensors"
    serialization.save({"w": flow.tensor([1.0])}, real)
    os.symlink(os.path.relpath(real, link.parent), link)
    os.chmod(real, 0o640)
    serialization.save({"w": flow.tensor([2.0, 3.0])}, link)
    assert link.is_symlink() and os.path.samefile(link, real)
    assert os.stat(real).st_mode & 0o777 == 0o640
    np.testing.assert_array_equal(serialization.load(real)["w"].numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(serialization.load(link)["w"].numpy(), [2.0, 3.0])
    assert os.listdir(tmp_path / "links") == ["latest.safetensors"]
    assert os.listdir(tmp_path / "real") == ["ckpt.safetensors"]
    # A dangling link: the save creates its target, as open(link, "wb") does.
    dangling = tmp_path / "links" / "next.safetensors"
    os.symlink("../real/next.safetensors", dangling)
    serialization.save({"x": 4}, dangling)
    assert dangling.is_symlink() and (tmp_path / "real" / "next.safetensors").is_file()
    assert serialization.load(tmp_path / "real" / "next.safetensors") == {"x": 4}


# -- non-regular files and lying headers ----------------------------------------------------------
def test_dev_zero_and_fifos_are_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = """
    import resource, sys
    # Reading /dev/zero must not be what stops this: cap the heap at 2 GiB all the same.
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))
    from sbpflow.framework import serialization
    for path in sys.argv[1:]:
        try:
            serialization.load(path)
            print(path, "loaded")
        except Exception as e:
            print(type(e).__name__, str(e).replace(chr(10), " "))
    """
    out = _run(code, "/dev/zero", fifo, timeout=90)  # a blocked FIFO read would time out
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ValueError load(): /dev/zero is a character device, not a "
                               "regular file"), lines
    assert lines[1].startswith(f"ValueError load(): {fifo} is a FIFO, not a regular file"), lines


def test_directory_raises_is_a_directory_error_like_torch(tmp_path):
    with pytest.raises(IsADirectoryError) as want:
        torch.load(tmp_path)
    with pytest.raises(IsADirectoryError) as got:
        flow.load(tmp_path)
    assert got.value.errno == want.value.errno and str(tmp_path) in str(got.value)


def test_header_promising_more_than_the_file_holds(tmp_path):
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 40],
                               "data_offsets": [0, 4 << 40]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "liar.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(ValueError, match=r"liar\.safetensors.*promises 4398046511104 bytes of "
                                         r"tensor data but only 16 follow"):
        flow.load(path)
    # The same through a file object, and a header-length field past the end of the file.
    with open(path, "rb") as fh, pytest.raises(ValueError, match="promises"):
        flow.load(fh)
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="header needs 1000 bytes but only 2 follow"):
        flow.load(path)


def test_file_objects_with_and_without_seek_round_trip(tmp_path):
    sd = {"a": flow.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)),
          "b": flow.tensor(np.array(3, dtype=np.int64)), "n": [1, "x"]}
    path = tmp_path / "f.safetensors"
    with open(path, "wb") as fh:
        flow.save(sd, fh)

    class OnlyRead:  # no seek, no readinto
        def __init__(self, data):
            self.data, self.pos = data, 0

        def read(self, n=-1):
            n = len(self.data) - self.pos if n is None or n < 0 else n
            out = self.data[self.pos:self.pos + n]
            self.pos += len(out)
            return out

    for src in (open(path, "rb"), OnlyRead(path.read_bytes())):
        got = flow.load(src)
        np.testing.assert_array_equal(got["a"].numpy(), sd["a"].numpy())
        assert got["b"].shape == () and got["b"].item() == 3 and got["n"] == [1, "x"]
    # Readable by safetensors itself (torch side), aligned entries included.
    import safetensors.torch
    theirs = safetensors.torch.load_file(path)
    assert theirs["a"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and theirs["b"].item() == 3


# -- peak memory of load ---------------------------------------------------------------------------
def test_load_peak_memory_is_about_the_file_size(tmp_path):
    path = tmp_path / "big.safetensors"
    small = tmp_path / "small.safetensors"
    rng = np.random.default_rng(0)
    sd = {f"w{i}": flow.from_numpy(rng.standard_normal((2, 1 << 22)).astype(np.float32))
          for i in range(3)}  # 3 x 32 MiB
    serialization.save(sd, path)
    serialization.save({"w": flow.ones(4)}, small)
    size = os.path.getsize(path)
    code = """
    import json, sys
    from sbpflow.framework import serialization

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    serialization.load(sys.argv[2])  # lazy imports out of the way
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak RSS (VmHWM) to the current RSS
    base = status("VmRSS")
    sd = serialization.load(sys.argv[1])
    peak = status("VmHWM")
    total = sum(float(t.double().sum().item()) for t in sd.values())
    print(json.dumps({"extra": peak - base, "total": total}))
    """
    out = _run(code, path, small)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    want_total = sum(float(t.numpy().astype(np.float64).sum()) for t in sd.values())
    assert got["total"] == pytest.approx(want_total, rel=1e-9)
    assert 0.9 * size < got["extra"] < 1.3 * size, (got["extra"] / size, size)
