"""DistributedDataParallel for local tensors: torch's API, OneFlow's comm stream.

Every rank holds a full replica of the module and runs it on its own part of the batch. At
wrap time parameters and buffers are broadcast from rank 0. During backward each parameter's
gradient hook marks the parameter ready; gradients are grouped in buckets (reverse
registration order, about `bucket_cap_mb` each, one dtype per bucket) and a full bucket's
gradients are all-reduced and divided by the world size as ONE instruction on the VM's comm
stream, without waiting: backward goes on issuing kernels while the all-reduce runs, and
whoever reads `.grad` next (the optimizer) is ordered after it by the VM's storage
dependences.

A leaf's hook sees its gradient *before* autograd accumulates it into `.grad`, and the engine
accumulates right after the hook returns. So a parameter is counted ready when the next hook
fires (its `.grad` is written by then); the last parameter of a backward has no next hook, so
its hook accumulates into `.grad` itself and hands autograd a zero gradient to add. Buckets
are launched strictly in bucket order (as torch's reducer does), so every rank issues the
same collectives in the same order whatever order its graph produces gradients in.

All of DDP's collectives (the wrap-time and per-forward broadcasts too) are instructions on
the comm stream, never run on the calling thread, so their order is the issue order.  The
calling-thread collectives of `flow.comm` wait for the comm stream to drain before they start,
so mixing them with DDP keeps one order on every rank.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ... import comm as _comm
from ...autograd import no_grad
from ...autograd.grad_mode import is_grad_enabled
from ...autograd.node import AccumulateGrad
from ...framework.functional.creation import zeros_like
from ...framework.tensor import Tensor
from ...vm import InstructionsBuilder
from ..modules.module import Module

_builder = InstructionsBuilder()


def _whole(t: Tensor) -> bool:
    """Whether t's blob array is exactly t (so a collective can work on the blob)."""
    arr = t._blob.array
    return (t._base is None and t._offset == 0 and getattr(arr, "shape", None) == tuple(t.shape)
            and t.is_contiguous())


def _issue(name: str, tensors: list, fn, step: int | None = None) -> None:
    """Run fn(list of arrays) -- which writes them in place -- as one collective instruction
    on the comm stream, ordered after the tensors' writers and readers and before their
    later users. Returns at once (unlike `distributed.collectives._on_comm_stream`). `step`:
    a count every rank must agree on here, which the divergence check compares too."""
    blobs = tuple(t._blob for t in tensors)

    def run():
        if step is None:
            fn([b.array for b in blobs])
        else:
            _comm.run_at_step(step, fn, [b.array for b in blobs])

    _builder.collective(name, run, ins=blobs, outs=blobs,
                        writes=tuple(t._storage for t in tensors))
    for t in tensors:
        t._storage.version += 1


def _broadcast(tensors: list, comm, src: int = 0) -> None:
    tensors = [t for t in tensors if t.numel() > 0]
    for t in tensors:
        if not _whole(t):
            raise RuntimeError(f"DistributedDataParallel: cannot broadcast a view "
                               f"{list(t.shape)}; parameters and buffers must own their memory")
    if not tensors:
        return

    def run(arrays):
        for a in arrays:  # one broadcast per tensor: no packing copies
            buf = a if a.flags.c_contiguous else np.ascontiguousarray(a)
            comm.broadcast(buf, src)
            if buf is not a:
                np.copyto(a, buf)

    _issue("ddp_broadcast", tensors, run)


class _Bucket:
    __slots__ = ("index", "params", "pending", "nbytes")

    def __init__(self, index: int):
        self.index = index
        self.params: list = []
        self.pending = 0
        self.nbytes = 0


class DistributedDataParallel(Module):
    """torch.nn.parallel.DistributedDataParallel over the ranks of `process_group` (a
    `sbpflow.comm.Communicator`; default all ranks), for local tensors."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, *, bucket_size: int | None = None,
                 use_bucket: bool = True):
        """torch's arguments, and OneFlow's keyword arguments `bucket_size` (the most
        parameters per bucket; OneFlow's default is 10) and `use_bucket` (False: one
        all-reduce per parameter). `bucket_size` and `bucket_cap_mb` may be combined: a bucket
        closes at whichever limit comes first. torch's `check_reduction` (deprecated, unused
        by torch), `gradient_as_bucket_view` and `static_graph` (memory and speed hints: the
        gradients are the same) are accepted; the arguments for features DDP does not have
        here raise NotImplementedError when given."""
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an nn.Module, got "
                            f"{type(module).__name__}")
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("mixed_precision", mixed_precision), ("device_mesh", device_mesh)):
            if value is not None:
                raise NotImplementedError(
                    f"DistributedDataParallel: {name} is not supported by sbpflow's DDP (it "
                    "has no delayed all-reduce, mixed precision or device meshes); leave it "
                    "None")
        if type(use_bucket) is not bool:
            raise TypeError(f"DistributedDataParallel: use_bucket must be bool, got "
                            f"{type(use_bucket).__name__}")
        if bucket_size is not None and (type(bucket_size) is not int or bucket_size < 1):
            raise ValueError(f"DistributedDataParallel: bucket_size (parameters per bucket) "
                             f"must be a positive int, got {bucket_size!r}")
        if not use_bucket:
            if bucket_size not in (None, 1):
                raise ValueError("DistributedDataParallel: bucket_size has no meaning with "
                                 "use_bucket=False (one parameter per all-reduce)")
            bucket_size = 1
        # torch.distributed's ProcessGroup (new_group) wraps a communicator
        process_group = getattr(process_group, "communicator", process_group)
        if process_group is not None and not isinstance(process_group, _comm.Communicator):
            raise TypeError("DistributedDataParallel: process_group must be a "
                            f"sbpflow.comm.Communicator, got {type(process_group).__name__}")
        if bucket_cap_mb is None:
            bucket_cap_mb = 25
        if bucket_cap_mb <= 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got "
                             f"{bucket_cap_mb}")
        self.module = module
        self.device_ids = device_ids
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        self.bucket_size = bucket_size  # OneFlow's: parameters per bucket (None: no limit)
        self.use_bucket = use_bucket
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        object.__setattr__(self, "process_group",
                           process_group if process_group is not None else _comm.world())
        self._world_size = self.process_group.size

        # Unique parameters that take gradients, in registration order.
        seen, params = set(), []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        object.__setattr__(self, "_params", params)
        object.__setattr__(self, "_buckets", self._build_buckets(params))
        object.__setattr__(self, "_bucket_of", {id(p): b for b in self._buckets
                                                for p in b.params})
        object.__setattr__(self, "_hooks", [])
        self._reset_backward_state()
        self._sync_this_backward = False
        # Backward passes through this model (no_sync ones too), which every rank must run
        # alike: its all-reduces pin the number of the pass they reduce for the divergence
        # check, so a rank that runs one step under no_sync alone is caught. A pass counts at
        # the first hook after a forward with grad enabled (backward through `.module` alone
        # does not); the number is taken at forward, where unused parameters' buckets may
        # already launch.
        self._backward_passes = 0
        self._count_next_backward = False
        self._pass_number = 0

        # Parameters and buffers start equal on every rank: rank 0's.
        with no_grad():
            _broadcast(list(module.parameters()) + self._buffers_to_sync(), self.process_group)
        if self._world_size > 1:
            for p in params:
                self._hooks.append(p.register_hook(self._make_hook(p)))

    # -- buckets ---------------------------------------------------------------------------
    def _build_buckets(self, params: list) -> list:
        buckets, open_by_dtype = [], {}
        for p in reversed(params):  # gradients arrive roughly in reverse registration order
            b = open_by_dtype.get(p.dtype)
            if b is None:
                b = open_by_dtype[p.dtype] = _Bucket(len(buckets))
                buckets.append(b)
            b.params.append(p)
            b.nbytes += p.numel() * p.element_size()
            if b.nbytes >= self.bucket_bytes_cap or (self.bucket_size is not None
                                                     and len(b.params) >= self.bucket_size):
                del open_by_dtype[p.dtype]
        return buckets

    def _buffers_to_sync(self) -> list:
        return [b for b in self.module.buffers() if b is not None] if self.broadcast_buffers \
            else []

    def _reset_backward_state(self) -> None:
        for b in self._buckets:
            b.pending = len(b.params)
        self._ready_count = 0
        self._next_bucket = 0
        self._deferred = None  # the parameter whose hook fired last (accumulated since)
        self._expected = len(self._params)

    # -- torch's API ----------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside skip the all-reduce: gradients accumulate locally in
        `.grad`, and the first synced backward after reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        if self._sync_this_backward and self._ready_count:
            raise RuntimeError(
                "Expected to have finished reduction in the prior iteration before starting "
                "a new one. This error indicates that your module has parameters that were "
                "not used in producing loss. You can enable unused parameter detection by "
                "passing the keyword argument `find_unused_parameters=True` to "
                "`torch.nn.parallel.DistributedDataParallel`."
            )
        if self._world_size > 1 and self.broadcast_buffers:
            buffers = self._buffers_to_sync()
            if buffers:
                with no_grad():
                    _broadcast(buffers, self.process_group)
        out = self.module(*inputs, **kwargs)
        self._reset_backward_state()
        grad = is_grad_enabled()
        self._count_next_backward = grad
        self._pass_number = self._backward_passes + 1
        self._sync_this_backward = (self._world_size > 1 and self.require_backward_grad_sync
                                    and grad and bool(self._params))
        if self._sync_this_backward and self.find_unused_parameters:
            used = _reachable_leaves(out)
            unused = [p for p in self._params if id(p) not in used]
            self._expected = len(self._params) - len(unused)
            for p in unused:  # contributes zeros; may be used on another rank
                if p.grad is None:
                    with no_grad():
                        p.grad = zeros_like(p.detach())
                self._mark_ready(p)
            if self._expected == 0:
                self._launch_ready()
        return out

    # -- backward ---------------------------------------------------------------------------
    def _make_hook(self, p):
        def hook(grad):
            if self._count_next_backward:
                self._count_next_backward = False
                self._backward_passes += 1
            if not self._sync_this_backward:
                return None
            if self._deferred is not None:  # its .grad has been accumulated by now
                self._mark_ready(self._deferred)
                self._deferred = None
            self._ready_count += 1
            if self._ready_count < self._expected:
                self._deferred = p
                return None
            # The last gradient of this backward: accumulate it here, launch what is left,
            # and let autograd add zeros (ordered after the all-reduce by the VM).
            with no_grad():
                g = grad.detach()
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.add_(g)
                zero = zeros_like(g)
            self._mark_ready(p)
            self._sync_this_backward = False
            self._ready_count = 0
            return zero

        return hook

    def _mark_ready(self, p) -> None:
        b = self._bucket_of[id(p)]
        b.pending -= 1
        if b.pending == 0:
            self._launch_ready()

    def _launch_ready(self) -> None:
        buckets = self._buckets
        while self._next_bucket < len(buckets) and buckets[self._next_bucket].pending == 0:
            self._all_reduce(buckets[self._next_bucket])
            self._next_bucket += 1

    def _all_reduce(self, bucket: _Bucket) -> None:
        grads = []
        for p in bucket.params:
            g = p.grad
            if g is None:  # only with find_unused_parameters on every rank's graph
                with no_grad():
                    g = p.grad = zeros_like(p.detach())
            elif not _whole(g):
                with no_grad():
                    g = p.grad = g.contiguous().clone()
            grads.append(g)
        comm, n = self.process_group, self._world_size

        def run(arrays):
            flat = np.concatenate([a.reshape(-1) for a in arrays])
            comm.all_reduce(flat, "sum")
            np.divide(flat, n, out=flat, casting="unsafe")
            start = 0
            for a in arrays:
                np.copyto(a, flat[start:start + a.size].reshape(a.shape))
                start += a.size

        _issue(f"ddp_all_reduce[bucket {bucket.index}]", grads, run, self._pass_number)

    # -- passthrough ----------------------------------------------------------------------
    def __getstate__(self):
        raise TypeError("DistributedDataParallel cannot be pickled; pickle .module")


def _reachable_leaves(out) -> set:
    """ids of the leaves whose AccumulateGrad nodes the outputs' graph reaches."""
    roots, stack, seen, leaves = [], [], set(), set()

    def collect(x):
        if isinstance(x, Tensor):
            roots.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                collect(y)
        elif isinstance(x, dict):
            for y in x.values():
                collect(y)

    collect(out)
    for t in roots:
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            leaves.add(id(t))
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, AccumulateGrad):
            leaves.add(id(n.variable))
            continue
        for e in n.next_functions:
            if e is not None:
                stack.append(e[0])
    return leaves


__all__ = ["DistributedDataParallel"]
