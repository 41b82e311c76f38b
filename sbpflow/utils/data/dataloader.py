"""DataLoader: batches from a dataset, in the main process or in worker processes.

Order: the main process alone draws indices from the sampler and hands index batches to the
workers round-robin, then yields results in the order it sent them.  So the batches (and
their order) are the same for any num_workers, given the same generator.

Workers never pickle tensors (sbpflow tensors refuse to be pickled): a worker fetches and
collates a batch, swaps every tensor in it for its NumPy array, and the main process rebuilds
the tensors from the arrays.

Seeds: each epoch draws a base seed from the loader's generator (or sbpflow's default
generator), in every mode, before the sampler draws its permutation.  Worker `i` seeds
sbpflow's default generator and Python's `random` with base_seed + i when it starts (persistent
workers keep that seeding across epochs, as torch's do).

Workers never outlive the main process: each asks the kernel for SIGKILL when its parent
dies (`prctl(PR_SET_PDEATHSIG)`, when the iterator was made on the main thread) and also
checks its parent's PID every second while idle, which covers a parent killed under a
subreaper (where the orphan's parent PID becomes the subreaper's, not 1). A worker that dies
is reported with its signal or exit code, as torch words it.
"""

from __future__ import annotations

import collections
import copy
import ctypes
import itertools
import multiprocessing
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...framework import functional as F
from ...framework import generator as _generator
from ...framework.tensor import Tensor
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler, _draw_seed

__all__ = ["DataLoader", "WorkerInfo", "default_collate", "default_convert", "get_worker_info"]

_COLLATE_ERROR = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)


def _is_text_array(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "SaUO"


# -- collation --------------------------------------------------------------------------------
def _rebuild_mapping(elem: Mapping, values: dict):
    """A mapping of elem's type holding `values` (a plain dict if the type won't allow it)."""
    try:
        if isinstance(elem, collections.abc.MutableMapping):
            out = copy.copy(elem)
            out.update(values)
            return out
        return type(elem)(values)
    except TypeError:
        return values


def _rebuild_sequence(elem: Sequence, values: list):
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            out = copy.copy(elem)
            for i, v in enumerate(values):
                out[i] = v
            return out
        return type(elem)(values)
    except TypeError:
        return values


def default_convert(data):
    """Turn NumPy arrays and scalars into tensors, inside dicts/lists/tuples (no batching)."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if _is_text_array(data) else F.as_tensor(data)
    if isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_)):
        return F.as_tensor(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: default_convert(data[k]) for k in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]  # torch returns a list here too
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


def default_collate(batch):
    """Stack a list of samples into a batch, recursively (torch's rules):

    tensors -> stacked along a new dim 0; NumPy arrays -> stacked tensor; NumPy scalars ->
    1-d tensor of their dtype; floats -> float64, ints -> int64 (bools -> bool); strings ->
    left as is; dicts -> dict of collated values; namedtuples -> namedtuple of collated fields;
    other sequences -> list (or the sequence's type) of collated columns.
    """
    elem = batch[0]
    if isinstance(elem, Tensor):
        return F.stack(list(batch), 0)
    if isinstance(elem, np.ndarray):
        if _is_text_array(elem):
            raise TypeError(_COLLATE_ERROR.format(elem.dtype))
        if any(b.shape != elem.shape for b in batch):
            raise RuntimeError(
                "stack expects each tensor to be equal size, but got "
                f"{list(elem.shape)} at entry 0 and "
                f"{list(next(b.shape for b in batch if b.shape != elem.shape))} at another entry"
            )
        return F.from_numpy(np.stack(batch))
    if isinstance(elem, (np.bool_, np.number, np.object_)):
        return F.as_tensor(np.asarray(batch))
    if isinstance(elem, float):
        return F.tensor(batch, dtype="float64")
    if isinstance(elem, int):  # bools too: torch.tensor of bools is a bool tensor
        return F.tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, Mapping):
        return _rebuild_mapping(elem, {k: default_collate([d[k] for d in batch]) for k in elem})
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(list(col)) for col in zip(*batch, strict=True)))
    if isinstance(elem, Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        columns = [default_collate(list(col)) for col in zip(*batch, strict=True)]
        if isinstance(elem, tuple):
            return columns
        return _rebuild_sequence(elem, columns)
    raise TypeError(_COLLATE_ERROR.format(type(elem)))


# -- worker side --------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerInfo:
    """What `get_worker_info()` returns inside a DataLoader worker."""

    id: int
    num_workers: int
    seed: int
    dataset: object


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """The current worker's WorkerInfo, or None in the main process."""
    return _worker_info


class _TensorPayload:
    """A tensor on its way from a worker: its array and requires_grad flag."""

    __slots__ = ("array", "requires_grad")

    def __init__(self, array: np.ndarray, requires_grad: bool):
        self.array = array
        self.requires_grad = requires_grad

    def __reduce__(self):
        return (_TensorPayload, (self.array, self.requires_grad))


class _WorkerError:
    """An exception raised in a worker, re-raised in the main process with its traceback."""

    def __init__(self, worker_id: int, exc: BaseException):
        self.exc_type = type(exc)
        try:
            pickle.dumps(self.exc_type)
        except Exception:
            self.exc_type = RuntimeError  # a class defined in a function: can't travel
        self.message = (
            f"Caught {type(exc).__name__} in DataLoader worker process {worker_id}.\n"
            f"Original {''.join(traceback.format_exception(exc))}"
        )

    def reraise(self):
        try:
            err = self.exc_type(self.message)
        except Exception:
            err = RuntimeError(self.message)
        raise err


class _Exhausted:
    """A worker's iterable dataset has no more data this epoch."""


def _to_transport(obj):
    """Replace every tensor in a batch by a _TensorPayload (tensors are never pickled)."""
    if isinstance(obj, Tensor):
        return _TensorPayload(np.require(obj.detach()._host(), requirements="C"), obj.requires_grad)
    if isinstance(obj, Mapping):
        return _rebuild_mapping(obj, {k: _to_transport(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to_transport(v) for v in obj))
    if isinstance(obj, tuple):
        return tuple(_to_transport(v) for v in obj)
    if isinstance(obj, list):
        return [_to_transport(v) for v in obj]
    return obj


def _from_transport(obj):
    if isinstance(obj, _TensorPayload):
        t = F.from_numpy(obj.array)
        if obj.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(obj, Mapping):
        return _rebuild_mapping(obj, {k: _from_transport(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_from_transport(v) for v in obj))
    if isinstance(obj, tuple):
        return tuple(_from_transport(v) for v in obj)
    if isinstance(obj, list):
        return [_from_transport(v) for v in obj]
    return obj


class _Fetcher:
    """Turns an index batch (or, for iterable datasets, a request) into a collated batch."""

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool,
                 batch_size: int | None):
        self.dataset = dataset
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.iterable = isinstance(dataset, IterableDataset)
        self._it = None
        self.ended = False

    def restart(self) -> None:
        self._it = None
        self.ended = False

    def fetch(self, index):
        """The batch for `index`; raises StopIteration when an iterable dataset runs out."""
        if self.iterable:
            if self.ended:
                raise StopIteration
            if self._it is None:
                self._it = iter(self.dataset)
            if not self.auto_collation:
                try:
                    return self.collate_fn(next(self._it))
                except StopIteration:
                    self.ended = True
                    raise
            data = list(itertools.islice(self._it, self.batch_size))
            if not data or (self.drop_last and len(data) < self.batch_size):
                self.ended = True
                raise StopIteration
            if len(data) < self.batch_size:
                self.ended = True
            return self.collate_fn(data)
        if self.auto_collation:
            get_many = getattr(self.dataset, "__getitems__", None)
            data = get_many(index) if callable(get_many) else [self.dataset[i] for i in index]
            return self.collate_fn(data)
        return self.collate_fn(self.dataset[index])


_PR_SET_PDEATHSIG = 1
_PARENT_CHECK_S = 1.0  # how often an idle worker checks that its parent is alive


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this worker when the thread that started it ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the idle check below still ends the worker
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _worker_loop(fetcher: _Fetcher, index_queue, result_queue, seed: int, init_fn,
                 worker_id: int, num_workers: int, parent_pid: int | None = None,
                 die_with_parent: bool = False) -> None:
    global _worker_info
    if parent_pid is None:
        parent_pid = os.getppid()
    if die_with_parent:
        _die_with_parent(parent_pid)
    random.seed(seed)
    _generator.default_generator.manual_seed(seed)
    _worker_info = WorkerInfo(worker_id, num_workers, seed, fetcher.dataset)
    init_error = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
    except Exception as e:
        init_error = _WorkerError(worker_id, e)
    epoch = None
    reported_end = False
    while True:
        try:
            task = index_queue.get(timeout=_PARENT_CHECK_S)
        except queue.Empty:
            # The main process is gone: this worker was re-parented (to init, or to a
            # subreaper, so the check is "not our parent", not "parent is 1").
            if os.getppid() != parent_pid:
                return
            continue
        if task is None:
            return
        task_epoch, send_idx, index = task
        if task_epoch != epoch:
            epoch = task_epoch
            reported_end = False
            fetcher.restart()
        elif reported_end:
            # This worker's iterable data is over for the epoch: the main process knows (it
            # got _Exhausted) and skips the tasks it had already sent here.
            continue
        if init_error is not None:
            payload = init_error
        else:
            try:
                payload = _to_transport(fetcher.fetch(index))
            except StopIteration:
                payload = _Exhausted()
                reported_end = True
            except Exception as e:
                payload = _WorkerError(worker_id, e)
        try:
            blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            # Report it rather than let the queue's feeder thread drop the batch silently.
            blob = pickle.dumps(_WorkerError(worker_id, TypeError(
                f"the batch for indices {index!r} can't be sent to the main process: {e}")))
        result_queue.put((task_epoch, send_idx, blob))


# -- main side ----------------------------------------------------------------------------------
class _InfiniteConstantSampler(Sampler):
    """The sampler of an iterable dataset: the dataset decides when to stop."""

    def __iter__(self):
        while True:
            yield None


class _SingleProcessIter:
    def __init__(self, loader: DataLoader):
        self._loader = loader
        self._fetcher = loader._make_fetcher()
        self._reset()

    def _reset(self) -> None:
        loader = self._loader
        # Unused without workers, but drawn all the same: the generator then advances exactly
        # as it does with workers, so the sampler draws the same permutation.
        self._base_seed = _draw_seed(loader.generator)
        self._sampler_iter = iter(loader._index_sampler)
        self._fetcher.restart()

    def __iter__(self):
        return self

    def __next__(self):
        index = next(self._sampler_iter)
        return self._fetcher.fetch(index)

    def __len__(self):
        return len(self._loader)


class _MultiProcessIter:
    """Round-robin dispatch of index batches to workers; results yielded in send order."""

    _POLL_S = 1.0

    def __init__(self, loader: DataLoader):
        self._loader = loader
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor
        self._timeout = loader.timeout
        self._persistent = loader.persistent_workers
        self._epoch = 0
        self._base_seed = _draw_seed(loader.generator)
        ctx = loader.multiprocessing_context
        if ctx is None:
            methods = multiprocessing.get_all_start_methods()
            # fork hands the dataset to the workers without pickling it (a TensorDataset of
            # sbpflow tensors can't be pickled); elsewhere use the platform default.
            ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        elif isinstance(ctx, str):
            ctx = multiprocessing.get_context(ctx)
        self._result_queue = ctx.Queue()
        self._index_queues = []
        self._workers = []
        fetcher = loader._make_fetcher()
        # PR_SET_PDEATHSIG fires when the *thread* that started the worker ends: ask for it
        # only from the main thread, whose end is the process's end.
        on_main = threading.current_thread() is threading.main_thread()
        for i in range(self._num_workers):
            q = ctx.Queue()
            w = ctx.Process(
                target=_worker_loop,
                args=(fetcher, q, self._result_queue, self._base_seed + i,
                      loader.worker_init_fn, i, self._num_workers, os.getpid(), on_main),
                daemon=True,
            )
            w.start()
            self._index_queues.append(q)
            self._workers.append(w)
        self._finalizer = weakref.finalize(self, _shutdown, os.getpid(), self._workers,
                                           self._index_queues, self._result_queue)
        self._start_epoch(draw_seed=False)

    def _start_epoch(self, draw_seed: bool = True) -> None:
        if draw_seed:
            self._base_seed = _draw_seed(self._loader.generator)
        self._epoch += 1
        self._sampler_iter = iter(self._loader._index_sampler)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}  # idx -> (worker,) pending or (worker, data)
        self._active = [True] * self._num_workers
        self._cycle = itertools.cycle(range(self._num_workers))
        for _ in range(self._prefetch * self._num_workers):
            self._put_next()

    _reset = _start_epoch

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._loader)

    def _put_next(self) -> None:
        if not any(self._active):
            return
        try:
            index = next(self._sampler_iter)
        except StopIteration:
            return
        for _ in range(self._num_workers):
            worker = next(self._cycle)
            if self._active[worker]:
                break
        self._index_queues[worker].put((self._epoch, self._send_idx, index))
        self._task_info[self._send_idx] = (worker,)
        self._send_idx += 1

    def _get_result(self):
        """The next (epoch, idx, payload) from any worker; watches for dead workers."""
        start = time.monotonic()
        while True:
            try:
                epoch, idx, blob = self._result_queue.get(timeout=self._POLL_S)
                return epoch, idx, pickle.loads(blob)  # our own workers' bytes
            except queue.Empty:
                dead = [(i, w) for i, w in enumerate(self._workers) if not w.is_alive()]
                if dead:
                    how = "; ".join(_how_worker_ended(i, w) for i, w in dead)
                    pids = ", ".join(str(w.pid) for _, w in dead)
                    self._shutdown_workers()
                    raise RuntimeError(
                        f"DataLoader worker (pid(s) {pids}) exited unexpectedly: {how}"
                    ) from None
                if self._timeout > 0 and time.monotonic() - start > self._timeout:
                    raise RuntimeError(
                        f"DataLoader timed out after {self._timeout} seconds"
                    ) from None

    def __next__(self):
        while True:
            # Skip tasks that went to workers whose iterable dataset has run out.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info[self._rcvd_idx]
                if len(info) == 2 or self._active[info[0]]:
                    break
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(info[1])
            epoch, idx, payload = self._get_result()
            if epoch != self._epoch:
                continue  # left over from an epoch that was abandoned
            if isinstance(payload, _Exhausted):
                self._active[self._task_info[idx][0]] = False
                continue
            if idx != self._rcvd_idx:
                self._task_info[idx] += (payload,)  # early: keep it until its turn
                continue
            del self._task_info[idx]
            self._rcvd_idx += 1
            return self._process(payload)

    def _process(self, payload):
        self._put_next()
        if isinstance(payload, _WorkerError):
            payload.reraise()
        return _from_transport(payload)

    def _shutdown_workers(self) -> None:
        self._finalizer()


def _how_worker_ended(worker_id: int, w) -> str:
    code = w.exitcode
    if code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"DataLoader worker {worker_id} (pid {w.pid}) is killed by signal: {name}."
    return f"DataLoader worker {worker_id} (pid {w.pid}) exited with exit code {code}."


def _shutdown(owner_pid: int, workers, index_queues, result_queue) -> None:
    """Stop the workers: a None task each, then join (terminate stragglers), close queues.

    Run by a weakref.finalize that holds the workers and queues itself, so it works even when
    the iterator dies in a reference cycle (the queues would otherwise be finalized first and
    never deliver the None).
    """
    if os.getpid() != owner_pid:
        return  # a forked child collecting an inherited iterator: not its workers
    for q in index_queues:
        try:
            q.put(None)
        except (OSError, ValueError):
            pass
    for w in workers:
        w.join(timeout=5.0)
        if w.is_alive():
            w.terminate()
            w.join(timeout=1.0)
    for q in [*index_queues, result_queue]:
        q.cancel_join_thread()
        q.close()


class DataLoader:
    """Iterate over a dataset in batches (torch.utils.data.DataLoader's API).

    dataset: map-style (`__getitem__`/`__len__`) or an IterableDataset.
    batch_size (1; None disables batching), shuffle, sampler, batch_sampler, drop_last,
    collate_fn (default_collate when batching, default_convert otherwise), generator (for
    shuffling and worker seeds), num_workers (> 0: worker processes), worker_init_fn,
    prefetch_factor (2 per worker), persistent_workers, timeout, multiprocessing_context.
    pin_memory, pin_memory_device and in_order are accepted for torch compatibility; batches
    always come in sampler order and are never pinned (no accelerator yet).
    """

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler=None, batch_sampler=None, num_workers: int = 0, collate_fn=None,
                 pin_memory: bool = False, drop_last: bool = False, timeout: float = 0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True) -> None:
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable "
                "multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing.let "
                "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to "
                "None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.in_order = in_order

        if isinstance(dataset, IterableDataset):
            if shuffle not in (None, False):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, but "
                    f"got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified sampler option, but "
                    f"got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                    f"but got batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive with "
                "drop_last"
            )
        if sampler is None:
            if isinstance(dataset, IterableDataset):
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self._iterator = None

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def _make_fetcher(self) -> _Fetcher:
        return _Fetcher(self.dataset, self._auto_collation, self.collate_fn, self.drop_last,
                        self.batch_size)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if self.persistent_workers:
            if self._iterator is None:
                self._iterator = _MultiProcessIter(self)
            else:
                self._iterator._reset()
            return self._iterator
        return _MultiProcessIter(self)

    def __len__(self) -> int:
        if isinstance(self.dataset, IterableDataset):
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)
