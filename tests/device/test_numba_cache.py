"""numba's disk cache is an optimisation, never a point of failure (sbpflow/device/_numba_cache.py).

Each case runs in a fresh process, so the cache is really read from disk: one of sbpflow's own
kernels (`_jit.sgd_momentum`, in float64 and float32: two entries) or a fused graph kernel, with
the cache folder under pytest's tmp_path.  Results are checked against NumPy (sgd_momentum and
the fused loop are documented bitwise equal to NumPy's passes); warnings are counted in the
child, which records every warning whose message mentions the cache (sbpflow's own filters,
set at its import, apply).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

import sbpflow  # noqa: E402

PACKAGE = Path(sbpflow.__file__).resolve().parent

_PRELUDE = """
import json, sys, warnings
warnings.simplefilter("always")
records = []

def _keep(message, category, filename, lineno, file=None, line=None):
    records.append([category.__name__, str(message)])

warnings.showwarning = _keep
import numpy as np
"""

_SGD = _PRELUDE + """
from sbpflow.device import _jit
{setup}
out = {{}}
for name, t in (("f64", np.float64), ("f32", np.float32)):
    p = np.linspace(-1, 1, 7).astype(t)
    g = np.arange(7).astype(t)
    buf = np.full(7, 0.5, t)
    _jit.sgd_momentum(p, g, buf, t(0.9), t(-0.1))
    out[name] = [p.tolist(), buf.tolist()]
st = _jit.sgd_momentum.stats
print(json.dumps(dict(out=out, hits=sum(st.cache_hits.values()),
                      misses=sum(st.cache_misses.values()), cache_path=st.cache_path,
                      warnings=[r for r in records if "cache" in r[1].lower()])))
"""

_FUSED = _PRELUDE + """
import sbpflow as flow
from sbpflow.graph.passes import fuse_elementwise

class G(flow.nn.Graph):
    def build(self, x):
        return (x * 0.5 + 1.5) * -3.0

a = np.linspace(-2, 2, 64 * 64).reshape(64, 64)
y = G()(flow.tensor(a)).numpy()
(fn,) = fuse_elementwise._COMPILED.values()  # jitted: 4096 elements reach the threshold
st = fn.stats
print(json.dumps(dict(ok=bool(np.array_equal(y, (a * 0.5 + 1.5) * -3.0)),
                      hits=sum(st.cache_hits.values()), misses=sum(st.cache_misses.values()),
                      warnings=[r for r in records if "cache" in r[1].lower()])))
"""


def _env(**overrides):
    env = dict(os.environ)
    for k in ("SBPFLOW_NUMBA_CACHE", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def _run(tmp_path, script, env, setup=""):
    """Runs `script` in a fresh interpreter (cwd tmp_path); returns its JSON report."""
    text = script.format(setup=textwrap.dedent(setup)) if script is _SGD else script
    # A quiet run takes ~5 s (import and compiling); 4x headroom and more for a loaded machine.
    r = subprocess.run([sys.executable, "-c", text], env=env, cwd=tmp_path, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _numpy_sgd():
    """The oracle: NumPy's passes, buf = buf * m + g; p = p + neg_lr * buf."""
    out = {}
    for name, t in (("f64", np.float64), ("f32", np.float32)):
        p = np.linspace(-1, 1, 7).astype(t)
        g = np.arange(7).astype(t)
        buf = np.full(7, 0.5, t) * t(0.9) + g
        out[name] = [(p + t(-0.1) * buf).tolist(), buf.tolist()]
    return out


def _check_results(report):
    for name, (p, buf) in _numpy_sgd().items():
        np.testing.assert_array_equal(report["out"][name][0], p)
        np.testing.assert_array_equal(report["out"][name][1], buf)


def _check_one_warning(report):
    ws = report["warnings"]
    assert len(ws) == 1, ws
    assert ws[0][0] == "NumbaCacheWarning", ws


def _tmp_files(root):
    return [p for p in Path(root).rglob("*") if ".tmp" in p.name]


def _inside(path, folder):
    return os.path.commonpath([os.path.abspath(path), os.path.abspath(folder)]) == \
        os.path.abspath(folder)


# -- location ------------------------------------------------------------------------------------
def test_cache_follows_numba_cache_dir_and_serves_the_next_process(tmp_path):
    env = _env(NUMBA_CACHE_DIR=tmp_path / "nc")
    first = _run(tmp_path, _SGD, env)
    second = _run(tmp_path, _SGD, env)
    for r in (first, second):
        _check_results(r)
        assert r["warnings"] == []
        assert _inside(r["cache_path"], tmp_path / "nc" / "sbpflow"), r["cache_path"]
    assert (first["misses"], first["hits"]) == (2, 0)  # compiled and saved
    assert (second["misses"], second["hits"]) == (0, 2)  # loaded from disk
    assert list((tmp_path / "nc").rglob("*.nbi")) and not _tmp_files(tmp_path)


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_CACHE_HOME", "HOME"])
def test_default_cache_is_per_user_never_in_the_package(tmp_path, xdg):
    home = tmp_path / "home"
    env = _env(HOME=home, **({"XDG_CACHE_HOME": tmp_path / "xdg"} if xdg else {}))
    r = _run(tmp_path, _SGD, env)
    _check_results(r)
    base = tmp_path / "xdg" if xdg else home / ".cache"
    assert _inside(r["cache_path"], base / "sbpflow" / "numba"), r["cache_path"]
    assert not _inside(r["cache_path"], PACKAGE)
    assert list(base.rglob("*.nbc"))


# -- writes that fail ----------------------------------------------------------------------------
def test_unwritable_cache_dir_compiles_in_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    r = _run(tmp_path, _SGD, _env(NUMBA_CACHE_DIR=blocker))  # the folder cannot be created
    _check_results(r)
    _check_one_warning(r)
    assert r["misses"] == 2
    assert r["cache_path"] is None or not _inside(r["cache_path"], PACKAGE)
    assert not _tmp_files(tmp_path)


# Disk full: every write under the cache folder stores part of its data, then fails (ENOSPC).
_ENOSPC = """
import builtins, errno, os
_real_open, _root = builtins.open, os.environ["NUMBA_CACHE_DIR"]

class _Full:
    def __init__(self, f):
        self._f = f
    def write(self, data):
        self._f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()
    def __getattr__(self, name):
        return getattr(self._f, name)

def _open(file, mode="r", *args, **kwargs):
    f = _real_open(file, mode, *args, **kwargs)
    if any(c in mode for c in "wax") and str(file).startswith(_root):
        return _Full(f)
    return f

builtins.open = _open
"""

# A file size limit (RLIMIT_FSIZE): writes past 1 KiB fail with EFBIG (Python ignores SIGXFSZ).
_EFBIG = """
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
"""


@pytest.mark.parametrize("setup", [_ENOSPC, _EFBIG], ids=["ENOSPC", "EFBIG"])
def test_failed_writes_leave_no_tmp_files_and_warn_once(tmp_path, setup):
    cache = tmp_path / "nc"
    r = _run(tmp_path, _SGD, _env(NUMBA_CACHE_DIR=cache), setup=setup)
    _check_results(r)
    _check_one_warning(r)
    assert r["misses"] == 2
    assert not _tmp_files(tmp_path)
    assert not list(cache.rglob("*.nbi"))  # no index naming a data file that was not written


# -- files that are damaged ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory):
    """A cache folder holding sgd_momentum's index and its two data files."""
    root = tmp_path_factory.mktemp("filled")
    r = _run(root, _SGD, _env(NUMBA_CACHE_DIR=root / "nc"))
    assert r["misses"] == 2
    return root / "nc"


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_middle_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _garbage(path):
    path.write_bytes(np.random.default_rng(0).bytes(300))


@pytest.mark.parametrize("which, damage", [
    ("index", _truncate), ("index", _garbage), ("index", lambda p: p.write_bytes(b"")),
    ("data", _truncate), ("data", _flip_middle_byte),
], ids=["index-truncated", "index-garbage", "index-empty", "data-truncated", "data-flipped"])
def test_damaged_cache_file_is_a_miss_with_one_warning_and_is_rewritten(
        tmp_path, filled_cache, which, damage):
    import shutil

    cache = tmp_path / "nc"
    shutil.copytree(filled_cache, cache)
    pattern = "*sgd_momentum*.nbi" if which == "index" else "*sgd_momentum*.1.nbc"
    (target,) = cache.rglob(pattern)
    damage(target)
    env = _env(NUMBA_CACHE_DIR=cache)
    r = _run(tmp_path, _SGD, env)
    _check_results(r)
    _check_one_warning(r)
    assert r["misses"] == (2 if which == "index" else 1)
    again = _run(tmp_path, _SGD, env)  # the entry was rewritten: loaded, silently
    _check_results(again)
    assert again["warnings"] == [] and again["hits"] == 2
    assert not _tmp_files(tmp_path)


# -- fused graph kernels (source files generated into the cache folder) --------------------------
def test_fused_kernel_compiles_in_memory_when_the_cache_dir_is_unwritable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    r = _run(tmp_path, _FUSED, _env(NUMBA_CACHE_DIR=blocker))
    assert r["ok"] and r["misses"] == 1
    _check_one_warning(r)
    assert not _tmp_files(tmp_path)


def test_damaged_fused_source_file_is_rewritten(tmp_path):
    env = _env(NUMBA_CACHE_DIR=tmp_path / "nc")
    first = _run(tmp_path, _FUSED, env)
    assert first["ok"] and first["warnings"] == []
    (src,) = (tmp_path / "nc" / "sbpflow").glob("fused_*.py")
    _truncate(src)
    r = _run(tmp_path, _FUSED, env)
    assert r["ok"]
    _check_one_warning(r)
    again = _run(tmp_path, _FUSED, env)
    assert again["ok"] and again["warnings"] == [] and again["hits"] == 1
    assert not _tmp_files(tmp_path)
