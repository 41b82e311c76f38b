"""numba's on-disk cache for sbpflow's jitted kernels: an optimisation, never a point of failure.

`njit(**options)` is `numba.njit(cache=True, **options)` with two differences:

- Location: `cache_dir()`, that is `$SBPFLOW_NUMBA_CACHE`, else `$NUMBA_CACHE_DIR/sbpflow`,
  else the per-user cache directory (`$XDG_CACHE_HOME/sbpflow/numba`, by default
  `~/.cache/sbpflow/numba`), read when a kernel is first compiled; never the package's
  `__pycache__`, which numba picks by default and which belongs to the installation.  Each
  source folder gets its own subfolder (named as numba names them), so two checkouts don't
  overwrite each other's entries.
- Failures: numba raises into the kernel's caller when the cache folder cannot be created
  (at import time: "no locator available"), when a write fails (disk full, file size limit)
  and when an index or data file is truncated or corrupt (`UnpicklingError`, `EOFError`, an
  LLVM parse error, or with some bytes flipped silently wrong machine code).  Here each file
  carries a SHA-256 digest of its contents, checked before unpickling; any failure to read
  an entry counts as a miss (the kernel compiles in memory and the entry is rewritten); the
  first failure to write turns saving off for the rest of the process.  The first problem
  of a process is reported by one `NumbaCacheWarning`; later ones are silent.  A failed write
  removes its temporary file.

Nothing touches the disk at import: the cache of a kernel is built at its first compile
(numba's `cache=True` creates the folder and a probe file per function at decoration).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import threading
import uuid
import warnings

import numba
from numba.core import caching as _nc
from numba.core.serialize import dumps as _dumps
from numba.misc.appdirs import AppDirs


class NumbaCacheWarning(UserWarning):
    """numba's disk cache failed; the kernels concerned were compiled in memory.  (Not a
    RuntimeWarning: device/primitives.py silences those from sbpflow modules, NumPy's.)"""


def cache_dir() -> str | None:
    """The folder of sbpflow's numba cache files, or None when no per-user folder exists."""
    d = os.environ.get("SBPFLOW_NUMBA_CACHE")
    if not d and os.environ.get("NUMBA_CACHE_DIR"):
        d = os.path.join(os.environ["NUMBA_CACHE_DIR"], "sbpflow")
    if d:
        return os.path.abspath(d)
    d = os.path.join(AppDirs(appname="sbpflow", appauthor=False).user_cache_dir, "numba")
    # Without a home folder `~` stays unexpanded: a relative path would land in the cwd.
    return d if os.path.isabs(d) else None


_state_lock = threading.Lock()
_warned = False
_saves_off = False


def warn_once(problem: str) -> None:
    """Report `problem` with a NumbaCacheWarning if it is the process's first cache problem."""
    global _warned
    with _state_lock:
        if _warned:
            return
        _warned = True
    warnings.warn(f"sbpflow's numba disk cache: {problem}. Kernels it cannot serve are "
                  "compiled in memory; later cache problems of this process are not reported.",
                  NumbaCacheWarning, stacklevel=3)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, renamed into place
    (readers see the old file or the new one, never a part); the temporary file is removed when
    the write fails."""
    tmp = f"{path}.{uuid.uuid4().hex[:16]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- cache files -------------------------------------------------------------------------------
# Each file: _MAGIC, numba's version and a newline, the SHA-256 of the payload, the payload (a
# pickle).  The version comes first, in clear: another numba's pickles may not even unpickle, so
# a version change is a plain miss, not a corrupt file.
_MAGIC = b"sbpflow-numba-cache-1\n"
_DIGEST = 32


class _CorruptFile(Exception):
    pass


def _pack(payload: bytes) -> bytes:
    return b"".join((_MAGIC, numba.__version__.encode(), b"\n",
                     hashlib.sha256(payload).digest(), payload))


def _unpack(path: str, blob: bytes):
    """The payload of a file's bytes; None if another numba version wrote it."""
    if not blob.startswith(_MAGIC):
        raise _CorruptFile(f"{path}: not a cache file (bad header)")
    end = blob.find(b"\n", len(_MAGIC))
    if end < 0:
        raise _CorruptFile(f"{path}: truncated header")
    if blob[len(_MAGIC):end] != numba.__version__.encode():
        return None
    digest, payload = blob[end + 1:end + 1 + _DIGEST], blob[end + 1 + _DIGEST:]
    if len(digest) < _DIGEST or hashlib.sha256(payload).digest() != digest:
        raise _CorruptFile(f"{path}: contents do not match their digest (truncated or damaged)")
    return payload


class _CacheFile:
    """One function's index (`<base>.nbi`: source stamp and key -> data file) and data files
    (`<base>.<n>.nbc`), the interface numba's `Cache` uses (`save`, `load`, `flush`)."""

    def __init__(self, cache_path, filename_base, source_stamp):
        self._cache_path = cache_path
        self._base = filename_base
        self._index_path = os.path.join(cache_path, f"{filename_base}.nbi")
        self._stamp = source_stamp

    def _read(self, path):
        """The unpickled payload of `path`; None if it is missing or from another numba."""
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except (FileNotFoundError, NotADirectoryError):  # not written yet; a folder that
            return None  # cannot be made is reported by the save
        payload = _unpack(path, blob)
        return None if payload is None else pickle.loads(payload)

    def _index(self) -> dict:
        entry = self._read(self._index_path)
        if entry is None:
            return {}
        stamp, overloads = entry
        # A changed source file: its entries are stale (their data files get reused).
        return overloads if stamp == self._stamp else {}

    def load(self, key):
        name = self._index().get(key)
        return None if name is None else self._read(os.path.join(self._cache_path, name))

    def save(self, key, data):
        try:
            overloads = self._index()
        except Exception:  # a corrupt index (reported by the load before): start a new one
            overloads = {}
        name = overloads.get(key)
        if name is None:
            used = set(overloads.values())
            n = 1
            while f"{self._base}.{n}.nbc" in used:
                n += 1
            name = overloads[key] = f"{self._base}.{n}.nbc"
        # Data first: an index never names a data file that was not written.
        write_atomic(os.path.join(self._cache_path, name), _pack(_dumps(data)))
        write_atomic(self._index_path, _pack(_dumps((self._stamp, overloads))))

    def flush(self):
        write_atomic(self._index_path, _pack(_dumps((self._stamp, {}))))


class _Locator(_nc._SourceFileBackedLocatorMixin, _nc._CacheLocator):
    """Files of a function defined in `py_file` go to `<cache_dir()>/<folder>_<hash>/`."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(cache_dir(), self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self):
        return self._cache_path

    def ensure_cache_path(self):
        # numba's version also writes a probe file; the save itself is the probe here.
        os.makedirs(self._cache_path, exist_ok=True)

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func, py_file)  # touches no file: numba's probes the folder here


class _Impl(_nc.CompileResultCacheImpl):
    _locator_classes = [_Locator]


class _DiskCache(_nc.FunctionCache):
    _impl_class = _Impl

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _CacheFile(self._cache_path, self._impl.filename_base,
                                      self._impl.locator.get_source_stamp())


class _GuardedCache(_nc._Cache):
    """The dispatcher's cache: a `_DiskCache` built at the first compile, whose failures become
    misses (loads) or turn saving off (writes), with one warning per process."""

    def __init__(self, py_func):
        self._py_func = py_func
        self._disk = None
        self._enabled = True

    def _cache(self):
        if self._disk is None:
            self._disk = _nc.NullCache()
            py_file = self._py_func.__code__.co_filename
            if cache_dir() is None:
                warn_once("no per-user cache folder (HOME is not set); set NUMBA_CACHE_DIR")
            elif os.path.exists(py_file):  # else source made in memory: nothing to key it by
                try:
                    self._disk = _DiskCache(self._py_func)
                except Exception as e:
                    warn_once(f"cannot cache {self._py_func.__qualname__} ({_describe(e)})")
        return self._disk

    @property
    def cache_path(self):
        return self._cache().cache_path

    def load_overload(self, sig, target_context):
        if not self._enabled:
            return None
        try:
            return self._cache().load_overload(sig, target_context)
        except Exception as e:
            warn_once(f"could not load {self._py_func.__qualname__} ({_describe(e)})")
            return None

    def save_overload(self, sig, data):
        global _saves_off
        if not self._enabled or _saves_off:
            return
        try:
            self._cache().save_overload(sig, data)
        except OSError as e:
            _saves_off = True  # the folder or the disk is the problem: stop writing to it
            warn_once(f"could not save {self._py_func.__qualname__} ({_describe(e)})")
        except Exception as e:
            warn_once(f"could not save {self._py_func.__qualname__} ({_describe(e)})")

    def enable(self):
        self._enabled = True

    def disable(self):
        self._enabled = False

    def flush(self):
        try:
            self._cache().flush()
        except Exception as e:
            warn_once(f"could not flush {self._py_func.__qualname__} ({_describe(e)})")


def njit(**options):
    """`numba.njit(**options)` with sbpflow's disk cache (see the module docstring)."""
    if "cache" in options:
        raise TypeError("sbpflow.device._numba_cache.njit() got an unexpected keyword argument "
                        "'cache' (its kernels are always cached, see cache_dir())")

    def wrap(fn):
        disp = numba.njit(**options)(fn)
        # What `cache=True` does (Dispatcher.enable_caching), with this module's cache.
        disp._cache = _GuardedCache(disp.py_func)
        return disp

    return wrap
