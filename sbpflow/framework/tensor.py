"""The Tensor.

A tensor is a device array (possibly a view) plus a `Storage` shared by every view of the same
memory.  The storage carries the version counter that in-place ops bump and that autograd
checks.  A view remembers its root `_base` and the chain of view ops that produced it from the
base, so an in-place write through a view can be replayed on gradients (see interpreter.py).

Methods and operators are installed from the functional modules; this file holds only what is
intrinsic to a tensor.
"""

from __future__ import annotations

import weakref

import numpy as np

from .._core import dtype as dt
from .._core.meta import TensorMeta
from ..autograd.node import AccumulateGrad
from ..device import Device
from ..vm import Blob, PooledStorage, Storage, get_vm


class Size(tuple):
    """torch.Size: a tuple of ints that prints as `sbpflow.Size([2, 3])`."""

    def __repr__(self):
        return f"sbpflow.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n

    def __getitem__(self, key):
        out = tuple.__getitem__(self, key)
        return Size(out) if isinstance(key, slice) else out


_CPU = Device("cpu")


_RARE_FIELDS = ("_grad_fn_version", "_leaf_hooks", "_grad_acc", "_retains_grad")


class memory_format:  # noqa: N801 - torch's name
    """torch.memory_format.  sbpflow keeps every tensor C-contiguous (row-major): the formats
    are accepted where torch accepts them and give the same values, not torch's strides."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"sbpflow.{self.name}"

    def __reduce__(self):
        return (_memory_format, (self.name,))


def _memory_format(name: str) -> memory_format:
    return _MEMORY_FORMATS[name]


contiguous_format = memory_format("contiguous_format")
preserve_format = memory_format("preserve_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
_MEMORY_FORMATS = {m.name: m for m in (contiguous_format, preserve_format, channels_last,
                                       channels_last_3d)}


class layout:  # noqa: N801 - torch's name
    """torch.layout: dense tensors are strided; sparse COO tensors (functional/sparse.py)
    are sparse_coo."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"sbpflow.{self.name}"

    def __reduce__(self):
        return self.name  # this module's global of that name


strided = layout("strided")
sparse_coo = layout("sparse_coo")


def check_memory_format(op: str, t: Tensor, fmt) -> None:
    """Validate a memory_format= argument as torch does (type, and the rank channels_last
    formats need)."""
    if fmt is None:
        return
    if not isinstance(fmt, memory_format):
        raise TypeError(f"{op}(): argument 'memory_format' must be sbpflow.memory_format, not "
                        f"{type(fmt).__name__}")
    need = {"channels_last": 4, "channels_last_3d": 5}.get(fmt.name)
    if need is not None and t.ndim != need:
        raise RuntimeError(f"required rank {need} tensor to use {fmt.name} format")


class Tensor:
    # What every op reads or sets is a slot; what only some tensors ever set (views, leaves
    # with hooks, retain_grad) is a class-level default, so a new op output stores 13 fields.
    __slots__ = (
        "_blob", "_storage", "_meta", "_strides", "_offset", "_device", "_requires_grad", "grad",
        "_grad_fn", "_output_nr", "_base", "_view_chain", "_gl", "__weakref__", "__dict__",
    )
    _grad_fn_version = 0
    _leaf_hooks = None
    _grad_acc = None
    _retains_grad = False

    # -- construction ---------------------------------------------------------------------
    def __init__(self, *args, **kwargs):
        from .functional.creation import _tensor_ctor  # the legacy constructor

        if len(args) == 1 and isinstance(args[0], Size):
            args = tuple(args[0])  # Tensor(Size([2, 3])): a shape, as torch (not data)
        if kwargs.get("placement") is not None or kwargs.get("sbp") is not None:
            t = _legacy_global(args, kwargs)
        else:
            t = _tensor_ctor(*args, **kwargs)
        Tensor._alias(self, t)

    @staticmethod
    def _alias(self, src: Tensor) -> None:
        """Make `self` another tensor object over src's memory (no autograd history)."""
        Tensor._init_from(self, src._blob, src._storage, src._meta, src._device, src._strides,
                          src._offset)
        self._gl = src._gl

    @staticmethod
    def _init_from(self, blob, storage, meta, device, strides=None, offset=0):
        """Point `self` (new, or an existing tensor being re-aliased) at blob/storage, with no
        autograd state."""
        Tensor._fresh(self, blob, storage, meta, device, strides, offset)
        for name in _RARE_FIELDS:
            self.__dict__.pop(name, None)  # back to the class-level default

    @staticmethod
    def _fresh(self, blob, storage, meta, device, strides=None, offset=0):
        """_init_from for an object just made by object.__new__ (the hot path)."""
        self._blob = blob
        self._storage = storage
        self._meta = meta
        self._strides = _contiguous_strides(meta.shape) if strides is None else strides
        self._offset = offset
        self._device = device
        self._requires_grad = False
        self.grad = None
        self._grad_fn = None
        self._output_nr = 0
        self._base = None
        self._view_chain = ()  # the view ops from _base to this tensor
        self._gl = None  # GlobalInfo of a global tensor (see global_tensor.py)

    @classmethod
    def _make(cls, blob, meta: TensorMeta, device: Device, storage: Storage | None = None,
              strides=None, offset: int = 0):
        """A tensor over `blob` (a Blob, or an array that already holds the data)."""
        t = object.__new__(cls)
        if not isinstance(blob, Blob):
            host = blob
            blob = Blob(blob)
            if strides is None and isinstance(host, np.ndarray) and host.itemsize:
                strides = tuple(st // host.itemsize for st in host.strides)
        if storage is None:
            storage = PooledStorage(device.prims)
            storage.root = blob
        Tensor._fresh(t, blob, storage, meta, device, strides, offset)
        return t

    @classmethod
    def _output(cls, blob: Blob, meta: TensorMeta, device: Device, strides, prims):
        """A new op output over `blob` with a storage of its own (the interpreter's hot path:
        no checks).  `strides`: contiguous ones, or None to compute them; `prims`: see
        Storage.prims."""
        t = object.__new__(cls)
        storage = Storage() if prims is None else PooledStorage(prims)
        storage.root = blob
        Tensor._fresh(t, blob, storage, meta, device, strides)
        return t

    def _data_ref(self):
        return self._blob, self._storage, self._strides, self._offset, self._gl

    @property
    def _data(self):
        """The device array, after waiting for the instructions that produce it."""
        vm = get_vm()
        return vm.access(self._blob, self._storage, vm.stream(self._device.type))

    # -- metadata -------------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._meta.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._meta.shape)
        from .._core.errors import normalize_dim

        return self._meta.shape[normalize_dim("size", dim, len(self._meta.shape))]

    @property
    def dtype(self) -> dt.DType:
        return self._meta.dtype

    @property
    def device(self) -> Device:
        if self._gl is not None:
            from .global_tensor import current_global_mode

            if not current_global_mode().is_enabled:  # OneFlow's rule and message
                raise RuntimeError("Only local tensors have 'device'. Please use '.placement' "
                                   "for global tensors.")
            return self._gl.placement.device
        return self._device

    @property
    def ndim(self) -> int:
        return len(self._meta.shape)

    def dim(self) -> int:
        return len(self._meta.shape)

    def numel(self) -> int:
        return self._meta.numel

    nelement = numel

    def element_size(self) -> int:
        return self._meta.dtype.itemsize

    def stride(self, dim: int | None = None):
        # Strides are metadata (no sync): non-view ops produce C-contiguous arrays, and view
        # ops' strides are derived when they are issued (interpreter._view_layout).
        # NumPy reports arbitrary strides for size-1 and size-0 axes; torch's are canonical.
        gl = self._gl
        if gl is not None:  # the logical layout (the same on every rank), not the piece's
            st = _canonical_strides(self._meta.shape, gl.strides) if gl.strides else None
            st = st or _contiguous_strides(self._meta.shape)
            return st if dim is None else st[dim]
        st = _canonical_strides(self._meta.shape, self._strides)
        if self._meta.numel == 0:
            # NumPy reports all-zero strides for empty arrays; torch's are contiguous ones.
            st = _contiguous_strides(self._meta.shape)
        return st if dim is None else st[dim]

    def is_view(self) -> bool:
        """OneFlow's Tensor.is_view(): whether this tensor shares another's memory as a view
        (its `_base` is that tensor)."""
        return self._base is not None

    def is_contiguous(self, memory_format=None) -> bool:
        fmt = memory_format
        if fmt is None or fmt is contiguous_format:
            return self.stride() == _contiguous_strides(self._meta.shape)
        check_memory_format("is_contiguous", self, fmt)
        # channels_last: the strides of the same shape laid out as N, spatial..., C
        shape = self._meta.shape
        order = (0, *range(2, len(shape)), 1)
        st = _canonical_strides(shape, self._strides)
        want, acc = [0] * len(shape), 1
        for ax in reversed(order):
            want[ax] = acc
            acc *= max(shape[ax], 1)
        return all(shape[i] <= 1 or st[i] == want[i] for i in range(len(shape)))

    def data_ptr(self) -> int:
        return self._host().__array_interface__["data"][0]

    def storage_offset(self) -> int:
        return self._offset

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def _version(self) -> int:
        return self._storage.version

    # Device and layout flags: sbpflow's tensors are dense, strided, unquantized CPU tensors.
    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def is_cpu(self) -> bool:
        return self._device.type == "cpu"

    @property
    def is_xpu(self) -> bool:
        return self._device.type == "xpu"

    @property
    def is_mps(self) -> bool:
        return self._device.type == "mps"

    @property
    def is_meta(self) -> bool:
        return self._device.type == "meta"

    layout = property(lambda self: strided, doc="sbpflow.strided: a dense tensor")
    is_sparse = property(lambda self: False, doc="False: a dense tensor (see SparseTensor)")
    is_sparse_csr = property(lambda self: False, doc="False: sbpflow has dense tensors only")
    is_quantized = property(lambda self: False, doc="False: sbpflow has no quantized tensors")
    is_mkldnn = property(lambda self: False, doc="False: no MKL-DNN layout")
    is_nested = property(lambda self: False, doc="False: no nested tensors")

    def is_floating_point(self) -> bool:
        return self._meta.dtype.is_floating_point

    def is_complex(self) -> bool:
        return False  # sbpflow has no complex dtypes

    def get_device(self) -> int:
        """-1 for a CPU tensor, as torch; else the device index."""
        return -1 if self._device.type == "cpu" else (self._device.index or 0)

    def is_pinned(self, device=None) -> bool:
        return False

    def pin_memory(self, device=None) -> Tensor:
        raise RuntimeError("Cannot access accelerator device when none is available.")

    def cuda(self, device=None, non_blocking: bool = False, memory_format=None) -> Tensor:
        """torch's Tensor.cuda(): on a machine without CUDA, torch's CPU build's error."""
        dev = Device("cuda") if device is None else (
            Device("cuda", device) if isinstance(device, int) else Device(device))
        dev.check_available()
        raise NotImplementedError(f"cuda(): moving tensors to {dev} is not implemented")

    # -- .data: the same memory, outside autograd ------------------------------------------
    @property
    def data(self) -> Tensor:
        """torch's `.data`: a tensor over this tensor's memory that does not require grad and
        has no history.  Unlike detach(), in-place writes through it (p.data.add_(...)) are
        invisible to autograd: they do not bump the version that saved tensors check."""
        t = object.__new__(_DataTensor)
        Tensor._alias(t, self)
        return t

    @data.setter
    def data(self, value: Tensor) -> None:
        """`p.data = other`: p now has other's memory, shape and dtype; p keeps its identity,
        requires_grad, grad and hooks."""
        if not isinstance(value, Tensor):
            raise TypeError(f"Tensor.data must be a Tensor, not {type(value).__name__}")
        if self._gl is not None and value._gl is None:
            raise RuntimeError(
                "data: cannot assign a local tensor to the .data of a global tensor; make it "
                "global first (value.to_global(placement, sbp))")
        if (value._blob is self._blob and value._meta == self._meta
                and value._strides == self._strides and value._offset == self._offset):
            return  # `t.data += 1` assigns t's own memory back
        if self._grad_fn is not None:
            raise RuntimeError("data: can only assign .data of a leaf tensor (this one has a "
                               "grad_fn); use detach() for a computed tensor")
        if self._requires_grad and not value.dtype.is_floating_point:
            raise RuntimeError("data set to a tensor that requires gradients must be floating "
                               "point or complex dtype")
        self._blob, self._storage, self._meta = value._blob, value._storage, value._meta
        self._strides, self._offset, self._device = value._strides, value._offset, value._device
        self._gl = value._gl
        self._base = None
        self._view_chain = ()

    # -- global tensors (OneFlow's API; see global_tensor.py) -----------------------------
    @property
    def is_global(self) -> bool:
        return self._gl is not None

    @property
    def is_local(self) -> bool:
        return self._gl is None

    @property
    def is_lazy(self) -> bool:
        """OneFlow's flag: True for a tensor traced inside nn.Graph.build() (graph/trace.py)."""
        return False

    @property
    def placement(self):
        if self._gl is None:
            raise RuntimeError("placement: only global tensors have a placement; this tensor "
                               "is local (use .device)")
        return self._gl.placement

    @property
    def sbp(self) -> tuple:
        if self._gl is None:
            raise RuntimeError("sbp: only global tensors have an sbp; this tensor is local")
        return self._gl.sbp

    def _where(self):
        """Where an op without tensor inputs (zeros for a gradient) puts a tensor made for
        this one: its device, or for a global tensor its placement, broadcast."""
        if self._gl is None:
            return self._device
        from .global_tensor import GlobalDevice

        return GlobalDevice(self._gl.placement)

    def to_global(self, placement=None, sbp=None, *, grad_sbp=None, check_meta=True,
                  copy=False) -> Tensor:
        from .global_tensor import to_global

        return to_global(self, placement, sbp, grad_sbp=grad_sbp, check_meta=check_meta,
                         copy=copy)

    def to_local(self, *, copy: bool = False) -> Tensor:
        from .global_tensor import to_local

        return to_local(self, copy=copy)

    def local_to_global(self, placement=None, sbp=None, *, check_meta: bool = True,
                        copy: bool = False) -> Tensor:
        """OneFlow's `local_to_global`: this local tensor is this rank's piece."""
        if self._gl is not None:
            raise RuntimeError("local_to_global(): expected a local tensor, but got a global "
                               "tensor; use global_to_global() or to_global()")
        if placement is None or sbp is None:
            raise ValueError("local_to_global(): both placement and sbp are required")
        return self.to_global(placement, sbp, check_meta=check_meta, copy=copy)

    def global_to_global(self, placement=None, sbp=None, *, grad_sbp=None,
                         check_meta: bool = False, copy: bool = False) -> Tensor:
        """OneFlow's `global_to_global`: the same logical value on another placement/SBP."""
        if self._gl is None:
            raise RuntimeError("global_to_global(): expected a global tensor, but got a local "
                               "tensor; use local_to_global() or to_global()")
        return self.to_global(placement, sbp, grad_sbp=grad_sbp, copy=copy)

    def _type_name(self) -> str:
        return "torch." + _TYPE_NAMES[self.dtype.name]

    def type(self, dtype=None, non_blocking: bool = False):
        """t.type(): the legacy type name; t.type(dtype, a legacy type such as
        sbpflow.LongTensor, or a name such as "torch.LongTensor"): t converted."""
        if dtype is None:
            return self._type_name().replace("torch", "sbpflow")
        if isinstance(dtype, type) and isinstance(getattr(dtype, "dtype", None), dt.DType):
            dtype = ("torch.cuda." if getattr(dtype, "is_cuda", False) else "torch.") + \
                dtype.__name__
        if isinstance(dtype, str):
            dtype = dtype_of_type_name(dtype)
        return self.to(dtype)

    # -- autograd -------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        if self._base is not None and not self._requires_grad and self._is_stale_view():
            self.grad_fn  # noqa: B018 - a view of a base that gained history in place now has it
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool):
        value = bool(value)
        if self._grad_fn is not None:
            if not value:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want to "
                    "use a computed variable in a subgraph that doesn't require differentiation "
                    "use var_no_grad = var.detach()."
                )
            return
        if value and not self.dtype.is_floating_point:
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        self._requires_grad = value

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    @property
    def grad_fn(self):
        if self._base is not None and self._is_stale_view():
            from .interpreter import _refresh_view_grad_fn

            _refresh_view_grad_fn(self)
        return self._grad_fn

    def _is_stale_view(self):
        # A view whose base was written in place since the view's grad_fn was set.
        return self._base._requires_grad and self._grad_fn_version != self._storage.version

    def _set_grad_fn(self, node, output_nr: int) -> None:
        # retain_grad follows the tensor to its new history (after an in-place op), as torch's.
        move_retain = self._retains_grad and self._grad_fn is not None and (
            self._grad_fn is not node or self._output_nr != output_nr)
        if move_retain:
            self._drop_retain_hook()
        self._grad_fn = node
        self._output_nr = output_nr
        self._requires_grad = True
        self._grad_fn_version = self._storage.version
        if move_retain:
            self._add_retain_hook()

    def _grad_accumulator(self):
        acc = self._grad_acc() if self._grad_acc is not None else None
        if acc is None:
            acc = AccumulateGrad(self)
            self._grad_acc = weakref.ref(acc)
        return acc

    def detach(self) -> Tensor:
        t = object.__new__(Tensor)
        Tensor._alias(t, self)  # a global tensor stays global
        return t

    def detach_(self) -> Tensor:
        self._grad_fn = None
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        if self.grad_fn is None:
            return
        if self._retains_grad:
            return
        self._retains_grad = True
        self._add_retain_hook()

    def _add_retain_hook(self) -> None:
        ref = weakref.ref(self)

        def hook(g):
            t = ref()
            if t is not None:
                t.grad = g.detach().clone() if t.grad is None else t.grad + g.detach()

        hook.retains_grad = True  # the engine runs it after the tensor's other hooks, as torch
        self._grad_fn.register_prehook(self._output_nr, hook)

    def _drop_retain_hook(self) -> None:
        hooks = (self._grad_fn.pre_hooks or {}).get(self._output_nr, [])
        hooks[:] = [h for h in hooks if not getattr(h, "retains_grad", False)]

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook):
        if not self._requires_grad:
            raise RuntimeError(
                "cannot register a hook on a tensor that doesn't require gradient"
            )
        if self.grad_fn is None:
            if self._leaf_hooks is None:
                self._leaf_hooks = []
            self._leaf_hooks.append(hook)
            hooks = self._leaf_hooks
        else:
            self._grad_fn.register_prehook(self._output_nr, hook)
            hooks = self._grad_fn.pre_hooks[self._output_nr]
        return _RemovableHandle(hooks, hook)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from .. import autograd

        autograd.backward(self, gradient, retain_graph, create_graph, inputs)

    # -- host access ----------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        # OneFlow's rule, not torch's: a tensor that requires grad gives its values too
        # (torch raises; torch programs never rely on that, OneFlow programs do).
        return self._host()

    def _host(self) -> np.ndarray:
        """The values as a NumPy array (a sync point: waits for this tensor's writers).
        For a global tensor, the logical value on every rank (a collective)."""
        if _host_check is not None:  # tracing nn.Graph.build(): refuse values not yet computed
            _host_check(self)
        if self._gl is not None:
            from .global_tensor import logical_host

            return logical_host(self)
        return self._device.prims.to_host(self._data)

    def item(self):
        if self._meta.numel != 1:
            raise RuntimeError(
                f"a Tensor with {self._meta.numel} elements cannot be converted to Scalar"
            )
        return self._host().reshape(()).item()

    def tolist(self):
        host = self._host()
        if self.dtype is dt.bfloat16 or self.dtype is dt.float16:
            host = host.astype(np.float64)
        return host.tolist()

    def __array__(self, dtype=None, copy=None):
        a = self._host()
        return a if dtype is None else a.astype(dtype)

    def __len__(self):
        if not self._meta.shape:
            raise TypeError("len() of a 0-d tensor")
        return self._meta.shape[0]

    def __iter__(self):
        if not self._meta.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._meta.shape[0]))

    def _scalar_check(self, what):
        if self._meta.numel != 1:
            raise RuntimeError(
                "Boolean value of Tensor with more than one value is ambiguous"
                if what == "bool" else
                "only one element tensors can be converted to Python scalars"
            )

    def __bool__(self):
        self._scalar_check("bool")
        return bool(self.item())

    def __float__(self):
        self._scalar_check("float")
        return float(self.item())

    def __int__(self):
        self._scalar_check("int")
        return int(self.item())

    def __index__(self):
        if self.dtype.is_floating_point or self._meta.numel != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __hash__(self):
        return id(self)

    def __repr__(self):
        from .tensor_str import tensor_repr

        return tensor_repr(self)

    __str__ = __repr__

    def __format__(self, spec):
        # torch: a 0-d tensor formats as its number (f"{loss}" prints 0.25); others as their
        # repr, and only with an empty spec.
        if self.dim() == 0:
            return format(self.item(), spec)
        if spec:
            raise TypeError("unsupported format string passed to Tensor.__format__")
        return repr(self)

    def __deepcopy__(self, memo):
        t = self.detach().clone()
        t._requires_grad = self._requires_grad
        return t

    def __reduce_ex__(self, proto):
        # Plain pickle (multiprocessing, copy of a module): the values travel as an array.
        # sbpflow.save stores tensors as safetensors entries instead (its own pickler).
        if self.is_global:
            raise TypeError("global tensors are not pickled; save them with sbpflow.save")
        return (_rebuild_tensor, (np.array(self.detach()._host()), self._requires_grad))


class _DataTensor(Tensor):
    """What `t.data` returns: an alias whose in-place methods leave the version counter as it
    was, as torch's `.data` has a version counter of its own (saved tensors of t still pass
    their check in backward, with the new values)."""

    __slots__ = ()

    def __getattribute__(self, name):
        attr = object.__getattribute__(self, name)
        if name[-1] == "_" and name[0] != "_" and callable(attr):
            storage = object.__getattribute__(self, "_storage")

            def inplace(*args, **kwargs):
                version = storage.version
                out = attr(*args, **kwargs)
                storage.version = version
                return out

            return inplace
        return attr

    def __setitem__(self, key, value):
        storage = object.__getattribute__(self, "_storage")
        version = storage.version
        Tensor.__setitem__(self, key, value)
        storage.version = version


def _data_inplace_operator(name: str):
    def op(self, other):
        storage = object.__getattribute__(self, "_storage")
        version = storage.version
        out = getattr(Tensor, name)(self, other)
        storage.version = version
        return out

    op.__name__ = name
    return op


def _legacy_global(args, kwargs) -> Tensor:
    """OneFlow's `Tensor(*shape, placement=, sbp=)` (a zero global tensor of that shape) and
    `Tensor(data, placement=, sbp=)` (the data as the logical float value)."""
    from .functional import creation

    kwargs = dict(kwargs)
    placement, sbp = kwargs.pop("placement", None), kwargs.pop("sbp", None)
    dtype = kwargs.pop("dtype", None) or dt.get_default_dtype()
    requires_grad = kwargs.pop("requires_grad", False)
    if kwargs:
        raise TypeError(f"Tensor(): unexpected keyword argument(s) {sorted(kwargs)}")
    if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        return creation.zeros(*args, dtype=dtype, placement=placement, sbp=sbp,
                              requires_grad=requires_grad)
    if len(args) == 1:
        return creation.tensor(args[0], dtype=dtype, placement=placement, sbp=sbp,
                               requires_grad=requires_grad)
    raise TypeError(f"Tensor(): expected a shape (ints) or one data argument, got {args!r}")


def _rebuild_tensor(array: np.ndarray, requires_grad: bool) -> Tensor:
    from .functional.creation import from_numpy

    return from_numpy(array).requires_grad_(requires_grad)


# In-place operators (p.data += 1) keep the version too; Tensor's own are installed later by
# the functional modules, so these look them up when called.
for _name in ("__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
              "__ipow__", "__iand__", "__ior__", "__ixor__"):
    setattr(_DataTensor, _name, _data_inplace_operator(_name))


_TYPE_NAMES = {
    "float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor",
    "bfloat16": "BFloat16Tensor", "int64": "LongTensor", "int32": "IntTensor",
    "int16": "ShortTensor", "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor",
}


def dtype_of_type_name(name: str) -> dt.DType:
    """The dtype of a legacy type name ("torch.FloatTensor", "sbpflow.LongTensor"); CUDA
    type names raise, as in torch's CPU build."""
    for prefix in ("torch.", "sbpflow."):
        if name.startswith(prefix + "cuda.") and name.endswith("Tensor"):
            raise RuntimeError("Cannot initialize CUDA without ATen_cuda library: CUDA tensor "
                               "types need a CUDA build (sbpflow runs on the CPU)")
        if name.startswith(prefix):
            for dname, tname in _TYPE_NAMES.items():
                if name[len(prefix):] == tname:
                    return dt.as_dtype(dname)
    raise ValueError(f"invalid type: '{name}'")


# Set while nn.Graph.build() is traced (graph/trace.py): fn(tensor) raises for an eager tensor
# that build() wrote in place, whose new value exists only when the graph runs.
_host_check = None

_STRIDES_CACHE: dict = {}


def _contiguous_strides(shape) -> tuple[int, ...]:
    shape = tuple(shape)
    hit = _STRIDES_CACHE.get(shape)
    if hit is None:
        hit = _compute_contiguous_strides(shape)
        if len(_STRIDES_CACHE) < 65536:
            _STRIDES_CACHE[shape] = hit
    return hit


def _compute_contiguous_strides(shape) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def _canonical_strides(shape, strides):
    if not any(s <= 1 for s in shape):
        return strides
    out = list(strides)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] <= 1:
            out[i] = acc
        else:
            acc = out[i] * shape[i]
        acc = out[i] * max(shape[i], 1)
    return tuple(out)


class _RemovableHandle:
    def __init__(self, hooks: list, hook):
        self._hooks = hooks
        self._hook = hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)
