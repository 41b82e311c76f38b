"""One-embedding never loses a table: one store per directory (flock), a full disk is an
OSError and never a SIGBUS, a refused load_snapshot changes nothing, and the next save
removes the temporary files of saves that died."""

import errno
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zlib

import numpy as np
import pytest

import sbpflow as flow
import sbpflow.one_embedding as oe
from sbpflow.one_embedding.store import EmbeddingStore, SnapshotError

from .conftest import mpiexec_cmd, run_job, script

UNIFORM = {"type": "uniform", "low": -1.0, "high": 1.0}
SIGBUS = -signal.SIGBUS
MAGIC = b"SBPFLOW-ONE-EMBEDDING-SNAPSHOT-1\n"  # the snapshot format (store.py's docstring)


def _store(path, lines=16, dim=4, storage=8):
    return EmbeddingStore(str(path), dim, storage, lines, [[(0, dim, UNIFORM)]], seed=5,
                          physical_block_size=512)


def _fill(store, keys, step=16):
    return np.concatenate([store.lookup(keys[i:i + step], np.zeros(len(keys[i:i + step]),
                                                                    np.int64))
                           for i in range(0, len(keys), step)])


def _bits(store, keys, step=16):
    """Every full row of `keys` (embedding and optimizer state), as bits."""
    return np.concatenate([store.read_rows(keys[i:i + step])
                           for i in range(0, len(keys), step)]).view(np.uint32)


def _holder(path):
    """A process holding a store at `path` (scripts/hold_store.py), once it is ready."""
    proc = subprocess.Popen([sys.executable, script("hold_store.py"), str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()  # blocks until the child is ready or dead
    if line.strip() != "ready":
        proc.kill()
        pytest.fail(f"the holder did not start: {line!r} {proc.communicate(timeout=60)}")
    return proc


# -- exclusive stores --------------------------------------------------------------------------
def test_second_store_in_this_process_is_refused_and_the_first_is_untouched(tmp_path):
    first = _store(tmp_path)
    keys = np.arange(300, dtype=np.int64) * 11  # 300 keys, 16 cache lines: most in the file
    _fill(first, keys)
    first.flush()
    before = _bits(first, keys)
    values = (tmp_path / "values").read_bytes()
    with pytest.raises(RuntimeError, match=rf"in use by this process \(pid {os.getpid()}"):
        _store(tmp_path)
    assert (tmp_path / "values").read_bytes() == values  # not emptied
    np.testing.assert_array_equal(_bits(first, keys), before)
    # the embeddings on top: the same persistent_path twice
    options = oe.make_cached_ssd_store_options(1, str(tmp_path / "emb"))
    emb = oe.MultiTableEmbedding("a", 4, flow.float, flow.int64, None, options)
    with pytest.raises(RuntimeError, match=re.escape(str(tmp_path / "emb" / "rank-0"))):
        oe.MultiTableEmbedding("b", 4, flow.float, flow.int64, None, options)
    assert emb(flow.tensor([1, 2])).shape == (2, 4)


def test_the_lock_goes_with_close_and_with_the_store(tmp_path):
    _store(tmp_path).close()
    second = _store(tmp_path)  # close() released it
    keys = np.arange(40, dtype=np.int64)
    _fill(second, keys)
    del second
    gc.collect()
    third = _store(tmp_path)  # collected: released
    assert third.num_keys == 0  # a new store starts empty
    options = oe.make_cached_ssd_store_options(1, str(tmp_path / "emb"))
    emb = oe.MultiTableEmbedding("a", 4, flow.float, flow.int64, None, options)
    emb(flow.tensor([1, 2])).sum().backward()
    del emb
    gc.collect()
    oe.MultiTableEmbedding("a", 4, flow.float, flow.int64, None, options)


def test_second_store_in_another_process_is_refused_naming_the_holder(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(RuntimeError, match=rf"in use by process {holder.pid}\b"):
            _store(tmp_path, lines=4)
        out, err = holder.communicate("go\n", timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert holder.returncode == 0 and out.split() == ["intact"], (holder.returncode, out, err)


def test_a_killed_holder_releases_the_store(tmp_path):
    """The kernel drops the lock with its process: no stale lock file blocks a restart."""
    holder = _holder(tmp_path)
    holder.kill()
    holder.communicate(timeout=60)
    assert holder.returncode == -signal.SIGKILL
    store = _store(tmp_path)
    keys = np.arange(50, dtype=np.int64)
    assert np.array_equal(_fill(store, keys), _fill(_store(tmp_path / "fresh"), keys))


# -- disk full ---------------------------------------------------------------------------------
def _no_room(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_fails_the_lookup_that_needs_room_and_changes_nothing(tmp_path, monkeypatch):
    """posix_fallocate finding no room (it may have extended the file part way, as glibc's
    emulation does) fails the lookup with ENOSPC naming the store; the table is as before,
    and once there is room the same lookup returns what a store that never failed does."""
    store = _store(tmp_path / "s")
    keys = np.arange(2000, dtype=np.int64) * 13
    seen = _fill(store, keys[:1000])  # the value file has room for 1024 rows
    size = os.path.getsize(tmp_path / "s" / "values")
    before = _bits(store, keys[:1000])

    def partial(fd, offset, length):
        os.ftruncate(fd, offset + length // 2)
        _no_room()

    monkeypatch.setattr(os, "posix_fallocate", partial)
    with pytest.raises(OSError, match=re.escape(str(tmp_path / "s"))) as info:
        _fill(store, keys[1000:], step=100)
    assert info.value.errno == errno.ENOSPC
    assert store.num_keys == 1000 and os.path.getsize(tmp_path / "s" / "values") == size
    np.testing.assert_array_equal(_bits(store, keys[:1000]), before)
    monkeypatch.undo()
    fresh = _store(tmp_path / "fresh")
    np.testing.assert_array_equal(_fill(store, keys), _fill(fresh, keys))
    np.testing.assert_array_equal(seen, _fill(fresh, keys[:1000]))


def test_full_disk_fails_a_snapshot_naming_the_store(tmp_path, monkeypatch):
    store = _store(tmp_path)
    keys = np.arange(100, dtype=np.int64)
    _fill(store, keys)
    store.save_snapshot("s")
    saved = (tmp_path / "snapshots" / "s").read_bytes()
    _fill(store, keys[:10] + 1000)

    # A delayed-allocation filesystem reports a full disk at fsync, after the writes
    monkeypatch.setattr(os, "fsync", _no_room)
    with pytest.raises(OSError, match=rf"{re.escape(str(tmp_path))}.*snapshot 's'") as info:
        store.save_snapshot("s")
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path / "snapshots") == ["s"]  # the temporary file is gone
    assert (tmp_path / "snapshots" / "s").read_bytes() == saved


def test_no_room_for_a_snapshot_refuses_the_load_and_changes_nothing(tmp_path, monkeypatch):
    """A snapshot bigger than the value file, with no disk left to grow it: the load fails
    with ENOSPC before a row is replaced."""
    big = _store(tmp_path / "big")
    _fill(big, np.arange(3000, dtype=np.int64) + 10**6)
    big.save_snapshot("s")
    store = _store(tmp_path / "live")
    keys = np.arange(500, dtype=np.int64) * 3  # room for 1024 rows
    _fill(store, keys)
    shutil.copy(tmp_path / "big" / "snapshots" / "s", tmp_path / "live" / "snapshots" / "s")
    before = _bits(store, keys)
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    with pytest.raises(OSError, match=re.escape(str(tmp_path / "live"))) as info:
        store.load_snapshot("s")
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert store.num_keys == 500
    np.testing.assert_array_equal(_bits(store, keys), before)


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB filesystem (tmpfs), where mounting is allowed (root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=60)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


def test_a_real_full_disk_is_an_oserror_not_a_sigbus(tiny_disk):
    job = subprocess.run([sys.executable, script("disk_full.py"), str(tiny_disk)],
                         capture_output=True, text=True, timeout=240)
    assert job.returncode != SIGBUS, "the store died of SIGBUS on a full disk"
    assert job.returncode == 0, job.stdout + job.stderr
    assert "lookup full ok" in job.stdout and "snapshot full ok" in job.stdout, job.stdout


# -- a refused load changes nothing ------------------------------------------------------------
def _snapshot_bytes(header: dict, keys: np.ndarray, rows: np.ndarray,
                    itemsize: int = 4) -> bytes:
    """A snapshot written from its documented format: magic, u64 header length, JSON
    header, int64 keys, rows, CRC32 of everything before it."""
    head = json.dumps(header).encode()
    body = (MAGIC + np.uint64(len(head)).tobytes() + head + keys.astype(np.int64).tobytes()
            + (rows.astype(np.float32).tobytes() if itemsize == 4
               else rows.astype(np.float16).tobytes()))
    return body + np.uint32(zlib.crc32(body)).tobytes()


def _header(**change):
    header = {"embedding_dim": 4, "storage_dim": 12, "dtype": "float32", "num_keys": 5,
              "step": 9, "seed": 1, "rank": 0, "world_size": 1}
    header.update(change)
    return header


KEYS = np.array([3, 10**12, 77, 5, 2**40], np.int64)  # 3 of them in the live table
ROWS = np.arange(60, dtype=np.float32).reshape(5, 12) / 7


def _crc_flipped(_):
    data = bytearray(_snapshot_bytes(_header(), KEYS, ROWS))
    data[-40] ^= 0x01
    return bytes(data)


BAD = {  # a refused snapshot -> what the error says
    "world_size": (lambda _: _snapshot_bytes(_header(world_size=2), KEYS, ROWS),
                   "saved by 2 ranks"),
    "rank": (lambda _: _snapshot_bytes(_header(rank=1), KEYS, ROWS), "saved by rank 1"),
    "dim": (lambda _: _snapshot_bytes(_header(embedding_dim=6, storage_dim=18), KEYS,
                                      np.zeros((5, 18))), "embedding_dim 6"),
    "dtype": (lambda _: _snapshot_bytes(_header(dtype="float16"), KEYS, ROWS, itemsize=2),
              "dtype 'float16'"),
    "crc": (_crc_flipped, "checksum"),
    "repeated_keys": (lambda _: _snapshot_bytes(_header(), KEYS[[0, 1, 2, 0, 4]], ROWS),
                      "repeated keys"),
    "step": (lambda _: _snapshot_bytes(_header(step="nine"), KEYS, ROWS), "unreadable header"),
    "truncated": (lambda _: _snapshot_bytes(_header(), KEYS, ROWS)[:-8], "truncated"),
}


def _live(tmp_path):
    """A trained one-rank embedding (Adam: rows hold m and v too) and its table."""
    store = oe.make_cached_ssd_store_options(0.001, str(tmp_path), size_factor=3)  # 16 rows
    emb = oe.MultiTableEmbedding("live", 4, flow.float, flow.int64, None, store)
    opt = flow.optim.Adam(emb.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    for _ in range(4):
        y = emb(flow.tensor(np.concatenate([[3, 77, 5], rng.integers(100, 160, 30)])))
        (y * y).sum().backward()
        opt.step()
        opt.zero_grad()
    return emb


def _table(emb):
    s = emb.store
    keys = np.sort(s.key_of_slot[: s.num_keys])
    return keys, _bits(s, keys), s.step


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_refused_load_leaves_every_row_as_it_was(tmp_path, case):
    make, why = BAD[case]
    emb = _live(tmp_path)
    (tmp_path / "rank-0" / "snapshots" / "bad").write_bytes(make(emb))
    keys, rows, step = _table(emb)
    with pytest.raises(SnapshotError, match=re.escape(why)):
        emb.load_snapshot("bad")
    after = _table(emb)
    np.testing.assert_array_equal(after[0], keys)
    assert (after[1] != rows).any(axis=1).sum() == 0, "rows were replaced"
    assert after[2] == step


def test_a_snapshot_written_from_the_format_loads(tmp_path):
    """The writer the refusal cases use is right: its valid snapshot loads exactly."""
    emb = _live(tmp_path)
    (tmp_path / "rank-0" / "snapshots" / "good").write_bytes(
        _snapshot_bytes(_header(), KEYS, ROWS))
    emb.load_snapshot("good")
    order = np.argsort(KEYS)
    keys, rows, step = _table(emb)
    np.testing.assert_array_equal(keys, KEYS[order])
    np.testing.assert_array_equal(rows, ROWS[order].view(np.uint32))
    assert step == 9


def _mpi(*args):
    return mpiexec_cmd(2, "-m", "mpi4py", script("snapshot_refusal.py"), *args)


def test_a_two_rank_snapshot_refused_by_one_rank_changes_nothing(tmp_path):
    path = str(tmp_path / "store")
    saver = run_job(_mpi("save", path), timeout=300)
    assert saver.returncode == 0, saver.output
    assert sorted(re.findall(r"rank (\d): saved", saver.stdout)) == ["0", "1"], saver.output
    loader = run_job([sys.executable, script("snapshot_refusal.py"), "refuse", path,
                      "saved by 2 ranks, this job has 1"], timeout=240)
    assert loader.returncode == 0, loader.output
    assert re.search(r"rank 0: \d+ rows unchanged", loader.stdout), loader.output


def test_a_snapshot_refused_on_one_rank_is_loaded_on_none(tmp_path):
    """Rank 1's snapshot is corrupt: rank 0's is fine, yet rank 0 must not load it either
    (half the sharded table replaced), and says which rank refused."""
    job = run_job(_mpi("corrupt-one", str(tmp_path / "store")), timeout=300)
    assert job.returncode == 0, job.output
    assert sorted(re.findall(r"rank (\d): \d+ rows unchanged", job.stdout)) == ["0", "1"], \
        job.output


# -- stale temporary files ---------------------------------------------------------------------
def _start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat (proc(5)): the process's start time in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_the_next_save_removes_the_temporaries_of_dead_saves_only(tmp_path):
    store_dir = tmp_path / "store"
    crashed = subprocess.run([sys.executable, script("persist.py"), "save", str(store_dir),
                              str(tmp_path / "dump"), "crash"], capture_output=True, text=True,
                             timeout=240)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr  # killed mid-save
    snaps = store_dir / "rank-0" / "snapshots"
    (torn,) = [p.name for p in snaps.iterdir() if p.name != "s1"]
    dead_pid = int(re.search(r"\.(\d+)\.\d+\.[0-9a-f]{8}\.", torn)[1])
    me = os.getpid()
    live = re.sub(r"\.\d+\.\d+\.([0-9a-f]{8})\.", rf".{me}.{_start_time(me)}.\1.", torn)
    (snaps / live).write_bytes(b"a save in progress")  # this process's: it is alive
    (snaps / f".s1.tmp-{dead_pid}").write_bytes(b"torn")  # the format before (pid only)
    (snaps / f".s1.tmp-{me}").write_bytes(b"a save in progress")
    (snaps / f".other.tmp-{dead_pid}").write_bytes(b"another name's")
    flow.manual_seed(11)
    store = oe.make_cached_ssd_store_options(1, str(store_dir), capacity=4000, size_factor=3)
    emb = oe.MultiTableEmbedding("persist", 8, flow.float, flow.int64, None, store)
    emb.load_snapshot("s1")  # the torn temporary never hid the snapshot
    emb.save_snapshot("s1")
    assert sorted(p.name for p in snaps.iterdir()) == sorted(
        ["s1", live, f".s1.tmp-{me}", f".other.tmp-{dead_pid}"])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_keep_the_store_locked(tmp_path):
    """A child forked while a store is open (a DataLoader worker) holds no copy of its lock:
    closing the store in the parent frees the directory while the child still runs."""
    store = _store(tmp_path)
    read, write = os.pipe()
    started_r, started_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say it runs (fork's hooks are done), wait for the parent
        os.close(write)
        os.write(started_w, b"1")
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    os.close(started_w)
    try:
        assert os.read(started_r, 1) == b"1"
        os.close(started_r)
        store.close()
        _store(tmp_path).close()
    finally:
        os.close(write)  # the child exits
        os.waitpid(pid, 0)
