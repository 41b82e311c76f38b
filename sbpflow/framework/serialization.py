"""`save` / `load`: one safetensors file per checkpoint.

The tensors go in the safetensors body, written with `safetensors.numpy`.  For state-dict-like
objects everything else, the nesting of dicts/lists/tuples and the numbers, strings, bools and
Nones among the tensors, goes as a JSON tree in the header's metadata under the key "sbpflow".
Loading parses that tree with a small, strict decoder: such a file can only ever produce data
(tensors, numbers, strings and containers), never run code.  Whole objects (modules,
optimizers) are a pickle stream beside the tensors; see the end of this docstring.

Interop:
* A flat dict of str -> Tensor (a state dict) stores each tensor under its own key, so
  `safetensors.torch.load_file` reads our file as that dict.
* A plain safetensors file (no "sbpflow" metadata, e.g. `safetensors.torch.save_file` of a torch
  state dict) loads as a flat dict of tensors, in file order.

Saving is atomic: the file is written to a temporary name in the target directory, fsynced and
renamed over the target, so a crash mid-save leaves the previous file intact.  The container is
streamed by our own writer (never safetensors' `save_file`, whose temp files we could not
clean), and a temporary file stranded by a killed process is removed by the next save of the
same target.  Like torch's `open(path, "wb")`, a save follows symlinks (the link stays and its
target is replaced) and refuses a target it may not write with PermissionError.  Loading reads
each tensor straight into its own buffer (about the file's size in memory) and checks the
header against the file's size first; non-regular files (/dev/zero, FIFOs) are refused.

The tree format (version 1): JSON null/true/false/strings/finite numbers stand for themselves, a
JSON list is a Python list, and an object with one tag is anything else:
  {"T": name}           a tensor (optional "rg": true: requires_grad; "np": true: NumPy array)
  {"F": "nan"|"inf"|"-inf"}  a non-finite float
  {"U": [...]}          a tuple
  {"D": [[key, value], ...]}  a dict (keys: str, int, float, bool, None); "o": true for
                        OrderedDict
  {"dtype": "float32"}  an sbpflow dtype
  {"P": name}           (root only) a whole-object checkpoint: the uint8 entry `name` holds a
                        pickle stream whose tensors are persistent ids of safetensors entries

Whole objects (`save(model)`, `save({"model": model, "opt": opt})`): anything the tree above
cannot hold is written as a pickle stream in which every tensor, Parameter and NumPy array is a
persistent id ("sbpflow", 1, kind, entry name, requires_grad) naming a safetensors entry, so
tensor bytes never go through pickle.  State-dict-like objects keep the pure tree format.
`load` defaults to `weights_only=True` (torch >= 2.6): the stream is read by a restricted
unpickler that resolves only allowlisted globals (containers, primitives, dtypes, devices,
`sbpflow.Size`, and what `sbpflow.serialization.add_safe_globals` adds) and our own persistent
ids, and refuses anything else with `pickle.UnpicklingError` before any of it runs. What the
stream's calls of allowlisted constructors may build is bounded by the stream's size (see
`_WeightsUnpickler`), so a small file cannot make `load` allocate much more than its size.
`weights_only=False` is the explicit opt-in to a full unpickle (only for trusted files).
A torch checkpoint (zip or legacy pickle) is refused with a message saying how to convert it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import json
import math
import os
import pickle
import secrets
import socket
import stat
import struct
import threading
import zlib
from collections import Counter, OrderedDict
from typing import Any

import ml_dtypes
import numpy as np

from .. import comm
from .._core import dtype as dt
from ..device import Device
from .tensor import Tensor

_META_KEY = "sbpflow"
_VERSION = 1
_MAX_DEPTH = 256
# safetensors' own limit on the header; a larger length field means a corrupt file.
_MAX_HEADER = 100_000_000

# safetensors dtype codes <-> NumPy dtypes we can hold as sbpflow tensors.
_FROM_CODE = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_TO_CODE = {v: k for k, v in _FROM_CODE.items()}


# -- save -----------------------------------------------------------------------------------
class _NotPlain(TypeError):
    """The object holds something the JSON tree cannot: it is saved as a pickle stream."""


class _Encoder:
    """Turns an object into a JSON tree plus a dict of named NumPy arrays."""

    def __init__(self, global_dst_rank=None):
        self.global_dst_rank = global_dst_rank
        self.arrays: dict[str, np.ndarray] = {}
        # id(tensor) -> name: a tensor reached twice is stored once and loads as one object.
        # (The ids stay valid: every tensor is referenced by `obj` for the whole encoding.)
        self._name_of: dict[int, str] = {}

    def _name(self, path: list) -> str:
        base = ".".join(str(p) for p in path) or "tensor"
        name, k = base, 1
        while name in self.arrays or name == "__metadata__":
            name, k = f"{base}#{k}", k + 1
        return name

    def _array(self, obj, path, kind: str) -> dict:
        known = self._name_of.get(id(obj))
        node: dict[str, Any]
        if known is None:
            if kind == "np":
                arr = obj
                dt.from_numpy(arr.dtype)  # raises a clear TypeError for unsupported dtypes
            else:
                if obj._device.type != "cpu":  # a global tensor has no .device
                    raise NotImplementedError("save(): only CPU tensors can be saved for now")
                if obj.is_global and self.global_dst_rank is None:
                    raise ValueError(
                        f"save(): {'.'.join(map(str, path)) or 'the object'} is a global "
                        "tensor: pass global_dst_rank=<rank> (the rank that writes the file; "
                        "every rank must call save, as the logical values are gathered)"
                    )
                arr = obj.detach()._host()  # of a global tensor: its logical value
            name = self._name(path)
            self.arrays[name] = np.require(arr, requirements="C")  # keeps 0-d
            self._name_of[id(obj)] = name
            known = name
        node = {"T": known}
        if kind == "np":
            node["np"] = True
        elif obj.requires_grad:
            node["rg"] = True
        return node

    def encode(self, obj, path: list, depth: int = 0):
        if depth > _MAX_DEPTH:
            raise ValueError(f"save(): object nested deeper than {_MAX_DEPTH} levels at "
                             f"{_where(path)}")
        if isinstance(obj, Tensor):
            return self._array(obj, path, "tensor")
        if isinstance(obj, np.ndarray):
            return self._array(obj, path, "np")
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, np.generic):
            obj = obj.item()
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            if math.isfinite(obj):
                return float(obj)
            return {"F": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
        if isinstance(obj, dt.DType):
            return {"dtype": obj.name}
        if isinstance(obj, dict):
            items = []
            for k, v in obj.items():
                if isinstance(k, np.generic):
                    k = k.item()
                if not (k is None or isinstance(k, (str, int, float, bool))):
                    raise _NotPlain(
                        f"save(): dict key {k!r} of type {type(k).__name__} at {_where(path)} "
                        "is not supported (keys must be str, int, float, bool or None)"
                    )
                items.append([self.encode(k, path, depth + 1),
                              self.encode(v, path + [k], depth + 1)])
            node = {"D": items}
            if isinstance(obj, OrderedDict):
                node["o"] = True
            return node
        if isinstance(obj, tuple):
            return {"U": [self.encode(v, path + [i], depth + 1) for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, path + [i], depth + 1) for i, v in enumerate(obj)]
        raise _NotPlain(
            f"save(): cannot save an object of type {type(obj).__module__}."
            f"{type(obj).__qualname__} at {_where(path)}: only tensors, NumPy arrays, numbers, "
            "strings, bools, None, dtypes, and dicts/lists/tuples of them are supported "
            "(sbpflow never pickles)"
        )


def _where(path: list) -> str:
    return "obj" + "".join(f"[{p!r}]" for p in path)


def _header_metadata(root) -> dict[str, str]:
    tree = json.dumps({"version": _VERSION, "root": root}, allow_nan=False,
                      separators=(",", ":"))
    # "format": "pt" is what safetensors.torch writes; other tools look for it.
    return {_META_KEY: tree, "format": "pt"}


DEFAULT_PROTOCOL = 2  # torch.serialization's default pickle protocol for whole objects
_PICKLE_ENTRY = "__sbpflow_pickle__"
_PID_KINDS = ("tensor", "parameter", "ndarray")


def save(obj, f, pickle_module=pickle, pickle_protocol: int = DEFAULT_PROTOCOL,
         _use_new_zipfile_serialization: bool = True, _disable_byteorder_record: bool = False,
         *, global_dst_rank: int | None = None) -> None:
    """Save `obj` to `f` (a path, written atomically, or a binary file object).

    State-dict-like objects (tensors, NumPy arrays, numbers, strings, None, bools, dtypes,
    nested in dicts/lists/tuples) are stored as pure safetensors plus a JSON tree.  Anything
    else (a whole module, an optimizer, a dict holding them) is stored as a pickle stream made
    with `pickle_module`'s Pickler at `pickle_protocol` (>= 2), in which every tensor is a
    reference to a safetensors entry.  The zipfile/byteorder flags are accepted for torch
    compatibility and ignored (the container is always safetensors).

    Global tensors (OneFlow's rule) need `global_dst_rank`: every rank calls save, the logical
    values are gathered, and only that rank writes the file.
    """
    if global_dst_rank is not None:
        size = comm.get_world_size()
        if not isinstance(global_dst_rank, int) or not 0 <= global_dst_rank < size:
            raise ValueError(f"save(): global_dst_rank must be a rank in [0, {size}), got "
                             f"{global_dst_rank!r}")
    enc = _Encoder(global_dst_rank)
    try:
        root = enc.encode(obj, [])
    except _NotPlain:
        enc = _Encoder(global_dst_rank)
        root = _pickle_root(obj, enc, pickle_module, pickle_protocol)
    if global_dst_rank is not None and comm.get_rank() != global_dst_rank:
        return
    metadata = _header_metadata(root)
    if hasattr(f, "write"):
        _write_container(f, enc.arrays, metadata)
        return
    _save_to_path(os.fspath(f), lambda fh: _write_container(fh, enc.arrays, metadata))


def _reduce_value_types(pickler, obj):
    """Pickler.reducer_override: devices pickle by name (their primitives hold locks)."""
    from ..device import Device

    if type(obj) is Device:
        return (Device, (obj.type, obj.index))
    return NotImplemented


def _rebuild_tensor(array: np.ndarray, requires_grad: bool) -> Tensor:
    from .functional.creation import from_numpy

    return from_numpy(array).requires_grad_(requires_grad)


def _reduce_with_tensors(pickler, obj):
    """Pickler.reducer_override for messages between a job's own ranks
    (torch.distributed's object collectives): tensors travel as NumPy arrays."""
    from .parameter import Parameter

    if isinstance(obj, Tensor):
        if obj.is_global:
            raise TypeError("global tensors cannot be pickled; send their local shards")
        t = obj.detach()
        rebuilt = (_rebuild_tensor, (np.array(t._host()), bool(obj.requires_grad)))
        if isinstance(obj, Parameter):
            return (Parameter, (t, bool(obj.requires_grad)))
        return rebuilt
    return _reduce_value_types(pickler, obj)


def dumps_with_tensors(obj) -> bytes:
    """pickle.dumps for objects that may hold sbpflow tensors (plain pickle refuses them)."""
    buf = io.BytesIO()
    _TensorValuePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


class _TensorValuePickler(pickle.Pickler):
    reducer_override = _reduce_with_tensors


def _pickle_root(obj, enc: _Encoder, pickle_module, protocol: int) -> dict:
    """Pickle `obj` with every tensor/array replaced by a persistent id naming an entry of
    `enc.arrays`; the stream itself becomes the uint8 entry `_PICKLE_ENTRY`."""
    from .parameter import Parameter

    if not isinstance(protocol, int) or protocol < 2:
        raise ValueError(f"save(): pickle_protocol must be an int >= 2, got {protocol!r}")
    counter = [0]

    def persistent_id(o):
        if isinstance(o, Tensor):
            kind = "parameter" if isinstance(o, Parameter) else "tensor"
        elif isinstance(o, np.ndarray) and o.dtype != object:
            kind = "ndarray"
        else:
            return None
        counter[0] += 1
        node = enc._array(o, [f"obj{counter[0]}"], "np" if kind == "ndarray" else "tensor")
        return ("sbpflow", 1, kind, node["T"], bool(node.get("rg", False)))

    class TensorPickler(pickle_module.Pickler):
        pass

    TensorPickler.persistent_id = staticmethod(persistent_id)
    TensorPickler.reducer_override = _reduce_value_types
    buf = io.BytesIO()
    try:
        TensorPickler(buf, protocol=protocol).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise type(e)(f"save(): cannot pickle the object: {e}") from e
    enc.arrays[_PICKLE_ENTRY] = np.frombuffer(buf.getvalue(), np.uint8)
    return {"P": _PICKLE_ENTRY}


def _write_container(fh, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    """Write the safetensors container to the binary file object `fh`, streaming each array's
    bytes (no copy of the whole checkpoint is ever built in memory).

    Entries go in order of decreasing element size (stable), so each starts at an offset
    aligned to its element size, as safetensors' own writer arranges."""
    order = sorted(arrays, key=lambda k: -arrays[k].dtype.itemsize)
    header: dict[str, Any] = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in order:
        arr = arrays[name]
        if arr.dtype.byteorder == ">":  # safetensors is little-endian
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        code = _TO_CODE.get(arr.dtype)
        if code is None:
            raise TypeError(f"save(): entry {name!r} has dtype {arr.dtype}, which the "
                            f"checkpoint format cannot hold")
        arr = np.require(arr, requirements="C")  # keeps 0-d
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        blobs.append(arr)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # the body starts 8-byte aligned
    fh.write(len(text).to_bytes(8, "little"))
    fh.write(text)
    for arr in blobs:
        if arr.nbytes:
            fh.write(memoryview(arr.reshape(-1).view(np.uint8)))


def _save_to_path(path: str, write) -> None:
    """Save to a path as torch's `open(path, "wb")` would reach it, but atomically.

    A symlink is written through (the link stays, its target gets the new file); a target
    that may not be opened for writing is refused with that PermissionError, as torch does; a
    non-regular target (a device such as /dev/null, a FIFO) is written in place."""
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _TargetIsDirectory(errno.EISDIR, os.strerror(errno.EISDIR), path)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise _NoParentDirectory(errno.ENOENT, f"Parent directory {parent} does not exist.",
                                 path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "wb") as fh:
            write(fh)
        return
    if st is not None:
        try:  # the permission check open(path, "wb") makes, without truncating anything
            os.close(os.open(target, os.O_WRONLY | _O_CLOEXEC))
        except PermissionError as e:
            raise _WriteRefused(e.errno, e.strerror, path) from None
    _atomic_write(target, write, path)


# save() errors for a target it cannot write: the OSError subclass Python's open(path, "wb")
# raises, naming the path, and also a RuntimeError, which is what torch.save raises there (its
# zip writer's "open file failed with strerror: ...", or "Parent directory ... does not exist.").
class _WriteRefused(PermissionError, RuntimeError):
    """The target (or its directory) may not be written."""


class _TargetIsDirectory(IsADirectoryError, RuntimeError):
    """The target is a directory."""


class _NoParentDirectory(FileNotFoundError, RuntimeError):
    """The target's directory does not exist."""


# Temporary files are named `.<target name>.sbpflow-tmp.<pid>.<pid start time>.<host>.<random>`,
# so the next save of the same target can tell its own stale ones (their process is gone)
# from those of a save still running, here or on another host sharing the directory.
_TMP_TAG = "sbpflow-tmp"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _host_tag() -> str:
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def _process_start(pid: int) -> int | None:
    """The start time of a live process (Linux /proc), None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped: it will never write again
        return None
    return int(fields[19])


def _process_alive(pid: int, start: int) -> bool:
    if pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        return _process_start(pid) == start  # a different start time: the pid was reused
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _temp_prefix(base: str) -> str:
    return f".{base[:120]}.{_TMP_TAG}."


def _remove_stale_temps(directory: str, base: str) -> None:
    """Delete the temporary files that earlier saves of `base` left behind when their process
    died mid-save (kill -9, power loss); never one whose process still runs."""
    prefix, host = _temp_prefix(base), _host_tag()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix):].split(".")
        if len(parts) != 4 or parts[2] != host or not (parts[0].isdigit() and parts[1].isdigit()):
            continue
        if not _process_alive(int(parts[0]), int(parts[1])):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _atomic_write(path: str, write, shown: str | None = None) -> None:
    """write(file object) into a temporary file beside `path`, fsync, rename over `path`: the
    old file survives any failure before the rename, and the temporary file is removed on any
    failure we live through (or by the next save of `path`, if the process was killed).
    Errors name `shown` (the path the caller gave, e.g. a symlink) when given."""
    directory, base = os.path.split(os.path.abspath(path))
    _remove_stale_temps(directory, base)
    pid = os.getpid()
    tmp = os.path.join(directory, f"{_temp_prefix(base)}{pid}.{_process_start(pid) or 0}."
                                  f"{_host_tag()}.{secrets.token_hex(4)}")
    mode = _file_mode(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
    except PermissionError as e:  # a directory we may not write: the target can't be created
        raise _WriteRefused(e.errno, e.strerror, shown or path) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable (POSIX; not possible on every platform).
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _file_mode(path: str) -> int:
    """Keep an existing file's permissions; a new file gets the usual 0o666 & ~umask."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# -- load -----------------------------------------------------------------------------------
class _Corrupt(ValueError):
    pass


def load(f, map_location=None, pickle_module=None, *, weights_only: bool | None = None,
         mmap=None, global_src_rank: int | None = None, **pickle_load_args) -> Any:
    """Load what `save` wrote, or any safetensors file (as a flat dict of tensors).

    `f` is a path or a binary file object with `read`.  State-dict files never run code.  A
    whole-object file (a pickle stream inside the container) is read, by default
    (`weights_only=None` means True unless `pickle_module` is given, as torch >= 2.6), by a
    restricted unpickler: only tensors,
    Parameters, containers, primitives, `sbpflow.Size`, dtypes, devices and the globals
    allowlisted with `sbpflow.serialization.add_safe_globals` / `safe_globals` load; anything
    else raises `pickle.UnpicklingError` ("Weights only load failed...") before it runs.
    `weights_only=False` unpickles fully (with `pickle_module`, default `pickle`, and
    `pickle_load_args` such as `encoding`): only for files you trust.  `mmap` is accepted for
    torch compatibility: each tensor is read straight into its own buffer, so loading takes
    about the file's size in memory, never twice that.  A truncated, corrupted or hostile
    container (one whose header promises more than the file holds) raises ValueError naming
    the file, before anything that large is allocated; a path that is not a regular file
    (/dev/zero, a FIFO) is refused with ValueError before anything is read.

    With `global_src_rank` (OneFlow's), only that rank reads the file; every rank calls load
    and gets the tensors as global tensors broadcast over all ranks, ready for
    `load_state_dict` of a global module (copying into a parameter boxes to its SBP).
    OneFlow's positional form `load(path, global_src_rank, map_location)` works too: an int
    in torch's `map_location` place is the source rank (torch takes no int there).
    """
    if isinstance(map_location, int) and not isinstance(map_location, bool):
        if global_src_rank is not None:
            raise TypeError("load() got multiple values for argument 'global_src_rank' (an int "
                            "second argument is OneFlow's global_src_rank)")
        global_src_rank, map_location = map_location, None
        if pickle_module is not None and not hasattr(pickle_module, "Unpickler"):
            map_location, pickle_module = pickle_module, None  # OneFlow's third: map_location
    relocate = _relocation(map_location)
    if weights_only is None:  # torch's rule: a pickle_module given means a full unpickle
        weights_only = pickle_module is None
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is "
                           "specified")
    make_tensor = _to_tensor
    name = getattr(f, "name", "<file object>") if hasattr(f, "read") else os.fspath(f)
    try:
        if global_src_rank is not None:
            data, name = _read_on_one_rank(f, global_src_rank)
            make_tensor = _to_global_tensor
            header, arrays = _read_container(io.BytesIO(data), len(data))
        elif hasattr(f, "read"):
            header, arrays = _read_container(f, _stream_size(f))
        else:
            with _open_regular(name) as fh:
                header, arrays = _read_container(fh, os.fstat(fh.fileno()).st_size)
        if relocate is not None:
            make_tensor = functools.partial(_relocated, make_tensor, relocate)
        metadata = header.get("__metadata__") or {}
        if _META_KEY not in metadata:
            order = [k for k in header if k != "__metadata__"]
            return {k: make_tensor(arrays[k]) for k in order}
        tree = _parse_json(metadata[_META_KEY], "the sbpflow structure metadata")
        if not isinstance(tree, dict) or tree.get("version") != _VERSION or "root" not in tree:
            raise _Corrupt(
                f"unsupported sbpflow structure (expected version {_VERSION}, got "
                f"{tree.get('version') if isinstance(tree, dict) else type(tree).__name__})"
            )
        root = tree["root"]
        if isinstance(root, dict) and set(root) == {"P"}:
            stream = root["P"]
            if stream not in arrays or arrays[stream].dtype != np.uint8 or arrays[stream].ndim != 1:
                raise _Corrupt(f"the pickle stream entry {_short(stream)} is missing or not "
                               "a 1-d uint8 array")
            tensors = _Decoder(arrays, make_tensor)
            return _unpickle(arrays[stream].tobytes(), tensors, stream, weights_only,
                             pickle_module or pickle, pickle_load_args)
        return _Decoder(arrays, make_tensor).decode(root, 0)
    except _Corrupt as e:
        raise ValueError(f"load(): {name!s} is not a valid sbpflow/safetensors file: {e}") from None


_NO_CUDA = ("Attempting to deserialize object on a CUDA device but torch.cuda.is_available() "
            "is False. If you are running on a CPU-only machine, please use torch.load with "
            "map_location=torch.device('cpu') to map your storages to the CPU.")


def _relocation(map_location):
    """torch's map_location: None/'cpu'/a CPU device (or a dict mapping every location to
    the CPU) keeps tensors where they load; a callable(tensor, 'cpu') may return another
    tensor for each; a CUDA target raises torch's CPU-build error."""
    if map_location is None:
        return None
    if callable(map_location) and not isinstance(map_location, (str, Device)):
        return map_location
    targets = map_location.values() if isinstance(map_location, dict) else (map_location,)
    for target in targets:
        kind = str(target).partition(":")[0]
        if kind == "cpu":
            continue
        if kind == "cuda":
            raise RuntimeError(_NO_CUDA)
        raise NotImplementedError(f"load(): map_location={map_location!r}: sbpflow loads "
                                  "tensors on the CPU only")
    return None


def _relocated(make_tensor, relocate, *args):
    out = relocate(make_tensor(*args), "cpu")
    if not isinstance(out, Tensor):
        raise TypeError(f"load(): map_location must return a tensor, got {type(out).__name__}")
    return out


def _open_regular(path: str):
    """Open `path` for reading if it is a regular file; refuse anything else before reading
    (a device such as /dev/zero would be read until memory runs out; a FIFO would block)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            kind = ("a character device" if stat.S_ISCHR(mode) else "a block device"
                    if stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                    "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
            raise ValueError(f"load(): {path} is {kind}, not a regular file: only checkpoint "
                             "files can be loaded")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _stream_size(f) -> int | None:
    """Bytes left in a file object, or None when it cannot seek."""
    try:
        if hasattr(f, "seekable") and not f.seekable():
            return None
        pos = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(pos)
    except (AttributeError, OSError, ValueError):
        return None
    return end - pos


def _read_exact(fh, n: int, what: str) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Corrupt(f"truncated: {what} needs {n} bytes but only {len(data)} follow")
    return data


def _read_into(fh, arr: np.ndarray, key: str) -> None:
    view = memoryview(arr.reshape(-1).view(np.uint8))
    got, n = 0, len(view)
    readinto = getattr(fh, "readinto", None)
    while got < n:
        if readinto is not None:
            k = readinto(view[got:])
        else:
            chunk = fh.read(min(n - got, 1 << 24))
            k = len(chunk)
            view[got:got + k] = chunk
        if not k:
            raise _Corrupt(f"truncated: tensor {key!r} needs {n} bytes but only {got} follow")
        got += k


def _read_container(fh, size: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """Parse and check the header, then read each tensor straight into its own array.

    `size` is the number of bytes left in `fh` (None if unknown: the rest is read first).
    Everything the header says is checked against the file before any tensor is allocated."""
    if size is None:
        data = fh.read()
        fh, size = io.BytesIO(data), len(data)
    head = fh.read(8)
    n = int.from_bytes(head, "little")
    if len(head) < 8 or n > _MAX_HEADER or 8 + n > size:
        # not a safetensors length: perhaps another library's checkpoint (a plausible length
        # is never second-guessed, whatever its bytes look like)
        foreign = _foreign_format(head)
        if foreign is not None:
            raise _Corrupt(foreign)
    if len(head) < 8:
        raise _Corrupt(f"truncated: {len(head)} bytes, shorter than the 8-byte header length")
    if n > _MAX_HEADER:
        raise _Corrupt(f"header length field says {n} bytes, more than the {_MAX_HEADER} limit")
    if 8 + n > size:
        raise _Corrupt(f"truncated: the header needs {n} bytes but only {size - 8} follow")
    header = _parse_header(_read_exact(fh, n, "the header"))
    entries = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not (isinstance(info, dict) and set(info) == {"dtype", "shape", "data_offsets"}):
            raise _Corrupt(f"tensor {_short(key)}: the entry {_short(info)} is not "
                           "{dtype, shape, data_offsets}")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise _Corrupt(f"tensor {key!r}: bad shape {_short(shape)}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise _Corrupt(f"tensor {key!r}: bad data_offsets {_short(offsets)}")
        np_dtype = _FROM_CODE.get(code) if isinstance(code, str) else None
        if np_dtype is None:
            raise _Corrupt(f"tensor {key!r} has dtype {code}, which sbpflow can't hold "
                           f"(supported: {', '.join(_FROM_CODE)})")
        if offsets[1] - offsets[0] != math.prod(shape) * np_dtype.itemsize:
            raise _Corrupt(f"tensor {key!r}: {offsets[1] - offsets[0]} bytes do not make "
                           f"shape {shape} of {code}")
        entries.append((offsets[0], offsets[1], key, tuple(shape), np_dtype))
    entries.sort(key=lambda e: (e[0], e[1]))
    end = 0
    for begin, stop, key, _, _ in entries:
        if begin != end:
            raise _Corrupt(f"corrupted: tensor {key!r} starts at byte {begin} of the data, "
                           f"expected {end} (entries must tile the data without gaps/overlap)")
        end = stop
    body = size - 8 - n
    if end > body:
        raise _Corrupt(f"truncated: the header promises {end} bytes of tensor data but only "
                       f"{body} follow")
    if end < body:
        raise _Corrupt(f"corrupted: {body - end} bytes follow the {end} bytes of tensor data")
    arrays = {}
    for _, _, key, shape, np_dtype in entries:
        arr = np.empty(shape, np_dtype)
        if arr.nbytes:
            _read_into(fh, arr, key)
        arrays[key] = arr
    return header, {k: arrays[k] for k in header if k != "__metadata__"}


_CONVERT_HINT = (
    "Convert it with torch, where it loads: `sd = torch.load(path, map_location='cpu', "
    "weights_only=True)`, then for a state dict of tensors `safetensors.torch.save_file("
    "{k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')` (sbpflow.load reads "
    "that file as the same dict), or `sbpflow.save({k: sbpflow.tensor(v.numpy()) for k, v in "
    "sd.items()}, 'model.sbpflow')`")


def _foreign_format(head: bytes) -> str | None:
    """What another library's checkpoint is, from its first bytes, and how to convert it:
    otherwise its first bytes read as an absurd safetensors header length."""
    if head.startswith(b"PK\x03\x04"):
        return ("it is a torch checkpoint (a zip archive, as torch.save writes), which "
                f"sbpflow does not read: it is a pickle that could run code. {_CONVERT_HINT}")
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return ("it is a pickle file (torch.save's legacy format, or pickle.dump), which "
                f"sbpflow does not read: it could run code. {_CONVERT_HINT}")
    return None


def _parse_header(data: bytes) -> dict:
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Corrupt(f"the header is not UTF-8 ({e})") from None
    header = _parse_json(text, "the header")
    if not isinstance(header, dict):
        raise _Corrupt(f"the header is a JSON {type(header).__name__}, not an object")
    meta = header.get("__metadata__")
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())
    ):
        raise _Corrupt("__metadata__ must map strings to strings")
    return header


def _parse_json(text: str, what: str):
    def no_constants(token):
        raise _Corrupt(f"{what} contains the non-JSON constant {token}")

    try:
        return json.loads(text, parse_constant=no_constants)
    except _Corrupt:
        raise
    except RecursionError:
        raise _Corrupt(f"{what} is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and int-too-long both derive from it
        raise _Corrupt(f"{what} is not valid JSON ({e})") from None


def _to_tensor(arr: np.ndarray, requires_grad: bool = False) -> Tensor:
    from .functional.creation import from_numpy

    # The array was read into its own fresh buffer, so the tensor may own it (no copy).
    t = from_numpy(arr if arr.flags.writeable else arr.copy())
    if requires_grad:
        t.requires_grad_(True)
    return t


def _to_global_tensor(arr: np.ndarray, requires_grad: bool = False) -> Tensor:
    """The same array on every rank as a global tensor broadcast over all ranks."""
    from ..sbp import B, Placement
    from .global_tensor import GlobalDevice, from_logical

    where = GlobalDevice(Placement.all("cpu"), (B,))
    t = from_logical(arr, dt.from_numpy(arr.dtype), where)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _read_on_one_rank(f, src: int) -> tuple[bytes, str]:
    """The file's bytes on every rank: `src` reads them and broadcasts (a collective)."""
    from .global_tensor import _drain_comm_stream

    size = comm.get_world_size()
    if not isinstance(src, int) or not 0 <= src < size:
        raise ValueError(f"load(): global_src_rank must be a rank in [0, {size}), got {src!r}")
    name = getattr(f, "name", "<file object>") if hasattr(f, "read") else os.fspath(f)
    world = comm.world()
    data = b""
    error = ""
    if world.rank == src:
        try:
            if hasattr(f, "read"):
                data = f.read()
            else:
                with _open_regular(name) as fh:
                    data = fh.read()
        except (OSError, ValueError) as e:  # every rank must hear of it, or the others would
            # wait forever
            error = f"{type(e).__name__}: {e}"
    _drain_comm_stream()  # collectives keep one order with those queued on the comm stream
    head = np.array([len(data), len(error.encode())], np.int64)
    world.broadcast(head, root=src)
    if head[1]:
        msg = np.frombuffer(error.encode(), np.uint8).copy() if world.rank == src else \
            np.empty(int(head[1]), np.uint8)
        world.broadcast(msg, root=src)
        raise OSError(f"load(): rank {src} could not read {name}: {msg.tobytes().decode()}")
    buf = np.frombuffer(data, np.uint8).copy() if world.rank == src else \
        np.empty(int(head[0]), np.uint8)
    world.broadcast(buf, root=src)
    return buf.tobytes(), name


class _Decoder:
    """Rebuilds the saved object from the JSON tree, accepting nothing but the format above."""

    # Each tag and the optional flags it may carry.
    _TAGS = {"T": {"rg", "np"}, "F": set(), "U": set(), "D": {"o"}, "dtype": set()}

    def __init__(self, arrays: dict[str, np.ndarray], make_tensor=None):
        self.arrays = arrays
        self._make_tensor = make_tensor or _to_tensor
        self._tensors: dict[str, Tensor] = {}
        self._numpy: dict[str, np.ndarray] = {}

    def decode(self, node, depth: int):
        if depth > _MAX_DEPTH:
            raise _Corrupt(f"the structure is nested deeper than {_MAX_DEPTH} levels")
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [self.decode(v, depth + 1) for v in node]
        if not isinstance(node, dict):
            raise _Corrupt(f"unexpected structure node of type {type(node).__name__}")
        tags = self._TAGS.keys() & node.keys()
        if len(tags) != 1:
            raise _Corrupt(f"structure node {_short(node)} has no single known tag")
        tag = tags.pop()
        extra = set(node) - {tag} - self._TAGS[tag]
        if extra:
            raise _Corrupt(f"structure node {_short(node)} has unknown keys {sorted(extra)}")
        value = node[tag]
        if tag == "T":
            return self._tensor(value, node.get("rg") is True, node.get("np") is True)
        if tag == "F":
            if value not in ("nan", "inf", "-inf"):
                raise _Corrupt(f"bad float node {_short(node)}")
            return float(value)
        if tag == "dtype":
            if not isinstance(value, str) or value not in dt._NAMES:
                raise _Corrupt(f"unknown dtype {_short(value)}")
            return dt.as_dtype(value)
        if not isinstance(value, list):
            raise _Corrupt(f"structure node {_short(node)} must hold a list")
        if tag == "U":
            return tuple(self.decode(v, depth + 1) for v in value)
        out = OrderedDict() if node.get("o") is True else {}
        for item in value:
            if not (isinstance(item, list) and len(item) == 2):
                raise _Corrupt(f"dict item {_short(item)} is not a [key, value] pair")
            key = self.decode(item[0], depth + 1)
            if not (key is None or isinstance(key, (str, int, float, bool))):
                raise _Corrupt(f"dict key {_short(item[0])} is not a str/number/bool/None")
            out[key] = self.decode(item[1], depth + 1)
        return out

    def _tensor(self, name, requires_grad: bool, as_numpy: bool):
        if not isinstance(name, str) or name not in self.arrays:
            raise _Corrupt(f"the structure refers to a missing tensor {_short(name)}")
        if as_numpy:
            # one copy per entry, however often the stream names it (a name repeated from a
            # few bytes of stream must not copy the entry again each time)
            arr = self._numpy.get(name)
            if arr is None:
                arr = self._numpy[name] = self.arrays[name].copy()
            return arr
        t = self._tensors.get(name)
        if t is None:
            t = self._tensors[name] = self._make_tensor(self.arrays[name], requires_grad)
        return t


# -- whole objects: the allowlist and the restricted unpickler -------------------------------
_safe_lock = threading.Lock()
_user_safe_globals: list = []  # objects, or (object, "module.name") pairs
_DEFAULT_SAFE: dict[str, Any] | None = None


def _global_name(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _default_safe_globals() -> dict[str, Any]:
    """What a weights-only load resolves without being told: containers, primitives, the
    pickling helpers of sbpflow's own value types.  Nothing here runs user code."""
    global _DEFAULT_SAFE
    if _DEFAULT_SAFE is None:
        import _codecs
        import builtins

        from ..device import Device
        from .tensor import Size

        safe = {f"builtins.{n}": getattr(builtins, n) for n in (
            "dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "bool",
            "str", "bytes", "bytearray", "slice")}
        # Protocol 2 writes bytes as _codecs.encode(latin-1 text, "latin1"), as torch's does.
        safe["_codecs.encode"] = _codecs.encode
        safe["collections.OrderedDict"] = OrderedDict
        safe["collections.Counter"] = Counter
        safe["sbpflow._core.dtype._by_name"] = dt._by_name
        safe[_global_name(Size)] = Size
        safe[_global_name(Device)] = Device
        _DEFAULT_SAFE = safe
    return _DEFAULT_SAFE


def add_safe_globals(safe_globals: list) -> None:
    """Allow these classes/functions in weights-only loads (torch.serialization's).

    Entries are objects, or `(object, "module.qualname")` pairs for an object pickled under
    another name.  Only allowlist what you trust: a weights-only load may call them."""
    entries = list(safe_globals)
    for e in entries:
        if isinstance(e, tuple) and not (len(e) == 2 and isinstance(e[1], str)):
            raise TypeError(f"add_safe_globals: a tuple entry must be (object, 'module.name'), "
                            f"got {e!r}")
    with _safe_lock:
        _user_safe_globals.extend(entries)


def get_safe_globals() -> list:
    """The user-allowlisted globals (not the built-in defaults)."""
    with _safe_lock:
        return list(_user_safe_globals)


def clear_safe_globals() -> None:
    with _safe_lock:
        _user_safe_globals.clear()


class safe_globals:  # noqa: N801 - torch.serialization's name
    """`with safe_globals([Cls]): load(f)` allowlists `Cls` inside the block only."""

    def __init__(self, safe_globals: list):
        self.safe_globals = list(safe_globals)

    def __enter__(self):
        with _safe_lock:
            self._before = list(_user_safe_globals)
        add_safe_globals(self.safe_globals)
        return self

    def __exit__(self, *exc):
        with _safe_lock:
            _user_safe_globals[:] = self._before
        return False


def _resolve_safe(module: str, name: str):
    key = f"{module}.{name}"
    with _safe_lock:
        user = list(_user_safe_globals)
    for e in user:
        obj, qual = e if isinstance(e, tuple) else (e, _global_name(e))
        if qual == key:
            return obj
    return _default_safe_globals().get(key)


def _weights_only_error(detail: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(
        "Weights only load failed. This file can still be loaded, to do so you have two "
        "options, do those steps only if you trust the source of the checkpoint. \n"
        "\t(1) `sbpflow.load` defaults to `weights_only=True`, as torch.load does since "
        "PyTorch 2.6. Re-running `sbpflow.load` with `weights_only` set to `False` will likely "
        "succeed, but it can result in arbitrary code execution. Do it only if you got the "
        "file from a trusted source.\n"
        "\t(2) Alternatively, to load with `weights_only=True` please check the recommended "
        "steps in the following error message.\n"
        f"\tWeightsUnpickler error: {detail}"
    )


def _unpickle(stream: bytes, tensors: _Decoder, entry: str, weights_only: bool, pickle_module,
              load_args: dict):
    """Rebuild a whole object from its pickle stream; tensors come from `tensors`' arrays."""
    from .parameter import Parameter

    params: dict[str, Parameter] = {}

    def persistent_load(pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[:2] == ("sbpflow", 1)
                and pid[2] in _PID_KINDS and isinstance(pid[3], str)
                and isinstance(pid[4], bool) and pid[3] != entry):
            detail = f"Unsupported persistent id {_short(pid)}: not an sbpflow tensor reference"
            if weights_only:
                raise _weights_only_error(detail)
            raise pickle.UnpicklingError(f"load(): {detail}")
        _, _, kind, name, requires_grad = pid
        if kind == "ndarray":
            return tensors._tensor(name, False, True)
        if kind == "tensor":
            return tensors._tensor(name, requires_grad, False)
        p = params.get(name)
        if p is None:
            p = params[name] = Parameter(tensors._tensor(name, False, False).detach(),
                                         requires_grad=requires_grad)
        return p

    if not weights_only:
        class TensorUnpickler(pickle_module.Unpickler):
            pass

        TensorUnpickler.persistent_load = staticmethod(persistent_load)
        return TensorUnpickler(io.BytesIO(stream), **load_args).load()
    unpickler = _WeightsUnpickler(stream, **load_args)
    unpickler.persistent_load = persistent_load
    try:
        return unpickler.load()
    except _Corrupt:
        raise
    except pickle.UnpicklingError as e:
        if str(e).startswith("Weights only load failed."):
            raise
        raise _weights_only_error(f"{type(e).__name__}: {e}") from None
    except Exception as e:  # an allowlisted constructor refusing its arguments, a bad stream
        raise _weights_only_error(f"{type(e).__name__}: {e}") from None


# What the calls in a weights-only pickle stream may build, beyond the stream's own size: the
# README promises that loading takes about the file's size.
_CALL_SLACK = 64 * 1024


class _ExactReader:
    """The stream for the pure-Python unpickler: a read past the end raises (BytesIO returns
    what is left, never allocating more, and the unpickler would go on with short data)."""

    def __init__(self, data: bytes):
        bio = io.BytesIO(data)
        self._read = bio.read
        self.readline = bio.readline

    def read(self, n: int = -1) -> bytes:
        out = self._read(n)
        if len(out) < n:
            raise pickle.UnpicklingError(f"pickle data was truncated: {n} bytes asked for, "
                                         f"{len(out)} left")
        return out


class _WeightsUnpickler(pickle._Unpickler):
    """The restricted unpickler of weights-only loads: allowlisted globals only, and what the
    stream's calls may build bounded by the stream's own size.

    The opcodes themselves build at most a few dozen bytes per byte of stream; only calls
    (REDUCE, NEWOBJ, OBJ, INST) of allowlisted constructors can make more from little:
    `bytearray(2**31)` is seven bytes of stream, and a constructor applied again and again to
    one memoised list rebuilds it each time. So every call is charged, before it runs, the
    elements it will make (the length of each sized argument, the count given to
    bytes/bytearray, the digits of str(int)), and the stream is refused once the charges pass
    its length plus _CALL_SLACK. Calls whose output has no such bound (str() of a container
    repeats every element's text) are refused, as are slice assignments through SETITEM.
    It is the pure-Python unpickler so that each opcode can be checked: the C one also sizes
    its memo from the stream's indexes and allocates a BYTEARRAY8's length before reading.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, stream: bytes, **load_args):
        super().__init__(_ExactReader(stream), **load_args)
        self._size = len(stream)
        self._budget = len(stream) + _CALL_SLACK
        self._spent = 0

    def find_class(self, module, name):
        if module == "__builtin__":  # protocol 2 writes Python 2's name for builtins
            module = "builtins"
        found = _resolve_safe(module, name)
        if found is None:
            g = f"{module}.{name}"
            raise _weights_only_error(
                f"Unsupported global: GLOBAL {g} was not an allowed global by default. "
                f"Please use `sbpflow.serialization.add_safe_globals([{g}])` or the "
                f"`sbpflow.serialization.safe_globals([{g}])` context manager to allowlist "
                "this global if you trust this class/function."
            )
        return found

    def _charge(self, what: str, units: int) -> None:
        self._spent += units
        if self._spent > self._budget:
            raise pickle.UnpicklingError(
                f"{what} would make {units} more elements, past what a {self._size}-byte pickle "
                f"stream may build in a weights-only load ({self._budget}: its size plus "
                f"{_CALL_SLACK}); the file is corrupt or hostile")

    def _check_call(self, func, args, kwargs=None) -> None:
        name = getattr(func, "__name__", type(func).__name__)
        if not isinstance(args, tuple) or (kwargs is not None and not isinstance(kwargs, dict)):
            raise pickle.UnpicklingError(f"the arguments of {name}() are a "
                                         f"{type(args).__name__}, not a tuple")
        values = args + tuple(kwargs.values()) if kwargs else args
        self._charge(f"{name}()", _call_units(func, values, name))

    def load_reduce(self):
        self._check_call(self.stack[-2], self.stack[-1])
        super().load_reduce()

    def load_newobj(self):
        self._check_call(self.stack[-2], self.stack[-1])
        super().load_newobj()

    def load_newobj_ex(self):
        self._check_call(self.stack[-3], self.stack[-2], self.stack[-1])
        super().load_newobj_ex()

    def _instantiate(self, klass, args):  # OBJ and INST
        self._check_call(klass, tuple(args))
        super()._instantiate(klass, args)

    def load_bytearray8(self):
        (n,) = struct.unpack("<Q", self.read(8))
        self._charge("BYTEARRAY8", n)  # and only then allocate it
        buf = bytearray(n)
        if self.readinto(buf) != n:
            raise pickle.UnpicklingError("pickle data was truncated in a BYTEARRAY8")
        self.append(buf)

    def _refuse_slice(self, key):
        if type(key) is slice:  # lst[0:0] = big, again and again: unbounded from little
            raise pickle.UnpicklingError("SETITEM with a slice key (a slice assignment) is not "
                                         "built by a weights-only load")

    def load_setitem(self):
        self._refuse_slice(self.stack[-2])
        super().load_setitem()

    def load_setitems(self):
        for key in self.stack[0::2]:  # the items since the MARK: keys at even positions
            self._refuse_slice(key)
        super().load_setitems()

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems


def _call_units(func, values: tuple, name: str) -> int:
    """The elements a call of an allowlisted func on these arguments makes, at most: the
    length of its sized arguments (what a container or text conversion copies), bytes(n)'s
    n. A call whose output is not bounded so is refused."""
    if isinstance(func, type) and issubclass(func, (bytes, bytearray)) and values \
            and isinstance(values[0], int):
        return max(int(values[0]), 0)  # n zero bytes
    if isinstance(func, type) and issubclass(func, str) and values:
        x = values[0]
        if isinstance(x, (str, bytes, bytearray)):
            return len(x)
        if isinstance(x, int):  # bool too
            return x.bit_length() // 3 + 2  # its decimal digits
        if isinstance(x, float):
            return 32
        raise pickle.UnpicklingError(
            f"{name}() of a {type(x).__name__} is not built by a weights-only load (its text "
            "repeats every element's, unbounded by the stream)")
    units = 1
    for v in values:
        try:
            units += len(v)
        except TypeError:  # a number, None: no elements to copy
            pass
    return units


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = ["add_safe_globals", "clear_safe_globals", "get_safe_globals", "load",
           "safe_globals", "save"]
