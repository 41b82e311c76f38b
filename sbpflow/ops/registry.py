"""The op registry: one `OpDef` per op.

An OpDef carries everything each layer above needs, so adding an op touches one place:
schema (inputs, outputs, typed attrs), `infer_meta`, candidate `sbp` signatures, `grad`
written with ops, a `kernel` that calls device primitives only, the torch `reference` name and
`samples` for the registry-driven tests.

Grad rules call other ops through `op(name, *inputs, **attrs)` and the Tensor methods of their
arguments; the framework layer installs the dispatcher, so this layer never imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._core.dtype import DType, as_dtype, bool_, get_default_dtype
from .._core.errors import op_error
from .._core.meta import SparseMeta, TensorMeta
from ..sbp import P

_REQUIRED = object()


class Attr:
    """A typed attribute with a default.  `kind` is one of the keys of `_CHECKS`."""

    __slots__ = ("kind", "default", "optional")

    def __init__(self, kind: str, default: Any = _REQUIRED, optional: bool = False):
        if kind not in _CHECKS:
            raise ValueError(f"unknown attr kind {kind!r}")
        self.kind = kind
        self.default = default
        self.optional = optional or default is None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) or type(v).__name__.startswith("int")


def _check_int(v):
    if _is_int(v):
        return int(v)
    raise TypeError


def _check_float(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise TypeError


def _check_bool(v):
    if isinstance(v, bool):
        return v
    raise TypeError


def _check_scalar(v):
    if isinstance(v, (bool, int, float)):
        return v
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # NumPy scalars
        return v.item()
    raise TypeError


def _check_str(v):
    if isinstance(v, str):
        return v
    raise TypeError


def _check_ints(v):
    if _is_int(v):
        return (int(v),)
    if isinstance(v, Sequence) and not isinstance(v, str) and all(_is_int(x) for x in v):
        return tuple(int(x) for x in v)
    raise TypeError


def _check_dtype(v):
    if isinstance(v, str):  # torch takes dtype objects only: x.sum(dtype="float") is an error
        raise TypeError
    return as_dtype(v)


def _check_any(v):
    return v


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "int": _check_int,
    "float": _check_float,
    "bool": _check_bool,
    "scalar": _check_scalar,
    "str": _check_str,
    "ints": _check_ints,  # an int or a sequence of ints, normalised to a tuple
    "dtype": _check_dtype,
    "any": _check_any,  # hashable payloads such as index keys; validated by infer_meta
}

_KIND_NAMES = {
    "int": "int", "float": "float", "bool": "bool", "scalar": "Number", "str": "str",
    "ints": "tuple of ints", "dtype": "dtype", "any": "object",
}


@dataclasses.dataclass(eq=False)
class Sample:
    """One test input for an op: NumPy arrays (a list for a variadic input) and attrs."""

    inputs: tuple
    attrs: dict
    grad: bool = True  # check gradients for floating inputs
    rtol: float | None = None
    atol: float | None = None

    def __init__(self, *inputs, grad=True, rtol=None, atol=None, **attrs):
        self.inputs = inputs
        self.attrs = attrs
        self.grad = grad
        self.rtol = rtol
        self.atol = atol

    def __repr__(self):
        ins = ", ".join(
            f"list[{len(x)}]" if isinstance(x, list) else f"{x.dtype}{list(x.shape)}"
            for x in self.inputs
        )
        return f"Sample({ins}, {self.attrs})"


class KernelContext:
    """What a kernel sees besides its arrays.

    For a local tensor the logical metas equal the local ones and every piece is the whole
    tensor.  For a piece of a global tensor, `out_pieces[i]` gives the slice per axis of the
    logical output that this piece covers, so position-dependent kernels (arange, random,
    a mean over a split axis) compute the right values.
    """

    __slots__ = ("prims", "op", "in_metas", "out_metas", "logical_in", "logical_out",
                 "out_pieces", "seed", "offset", "instance")

    def __init__(self, prims, op, in_metas, out_metas, logical_in=None, logical_out=None,
                 out_pieces=None, seed=0, offset=0):
        self.prims = prims
        self.op = op
        self.in_metas = in_metas
        self.out_metas = out_metas
        self.logical_in = in_metas if logical_in is None else logical_in
        self.logical_out = out_metas if logical_out is None else logical_out
        self.out_pieces = out_pieces
        self.seed = seed
        self.offset = offset
        # In a compiled graph, the job instance (the runtime's piece: the call number) the
        # kernel runs for; set per call for kernels that declare `uses_instance` (else 0).
        self.instance = 0

    def piece(self, i: int = 0) -> tuple[slice, ...]:
        """The slice per axis of logical output i held by this kernel call."""
        if self.out_pieces is None:
            return tuple(slice(0, n) for n in self.out_metas[i].shape)
        return self.out_pieces[i]


@dataclasses.dataclass(eq=False)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    infer_meta: Callable[..., Any]
    kernel: Callable[..., Any]
    outputs: tuple[str, ...] = ("out",)
    attrs: dict[str, Attr] = dataclasses.field(default_factory=dict)
    grad: Callable[..., Any] | None = None
    sbp: Callable[..., Any] | None = None
    reference: str | Callable | None = None
    samples: Callable[..., Any] | None = None
    view: bool = False  # output 0 shares storage with input 0
    random: bool = False  # the kernel draws from the generator (ctx.seed, ctx.offset)
    # What `grad` reads through ctx.input(i) / ctx.output(i): schema names of inputs and
    # outputs (metas, attrs and needs_input_grad are always there).  Autograd keeps only
    # these alive, and graph memory planning frees the rest early.  "other for input": saved
    # only when input's gradient is needed (mul reads other only for input's gradient).  A
    # variadic input saves all its tensors ("tensors") or a tail ("tensors[1:]").  None: not
    # declared (every op with a grad must declare; the registry test checks).
    saves: tuple[str, ...] | None = None
    doc: str = ""
    # Optional: specialize(ctx, attrs) -> fn(*arrays) or None.  Given one cached call's context
    # (metas, primitives) and bound attrs, a function that returns exactly what
    # kernel(ctx, *arrays, **attrs) returns, with the per-call dispatch (dtype checks,
    # constants, primitive lookup) done once.  Used for small outputs run inline; a test runs
    # every op's samples through both and compares bit for bit.
    specialize: Callable[..., Any] | None = None
    # Outputs that carry no gradient although they are floating point (torch's
    # mark_non_differentiable): a kernel's saved workspace for its grad rule.  They never
    # require grad, and backward passes them no gradient (not even zeros).
    nondiff: tuple[str, ...] = ()
    # Optional: keeps_sbp(*in_metas, **attrs) -> the indices of inputs the op updates in place
    # (an optimizer update's parameters).  Signature inference takes them as they are when
    # a declared signature allows it: a parameter is never moved to suit its update.
    keeps_sbp: Callable[..., Any] | None = None
    # Optional: node_name(*in_metas, **attrs) -> the name of the op's autograd nodes where
    # torch's depends on the call (x[0] is SelectBackward0, x[1:] SliceBackward0); without it
    # the name follows the op's (add -> AddBackward0).
    node_name: Callable[..., str] | None = None

    def __post_init__(self):
        self.variadic = bool(self.inputs) and self.inputs[0].startswith("*")
        for n in self.nondiff:
            if n not in self.outputs:
                raise ValueError(f"op {self.name!r}: nondiff output {n!r} is not one of "
                                 f"{self.outputs}")
        self._diff_out = tuple(n not in self.nondiff for n in self.outputs)
        self._meta_cache: dict = {}
        self._saved_for_cache: dict = {}
        # Cached local calls of the eager interpreter, by (default dtype, device, input
        # metas, attrs): see framework/interpreter.py.  Random ops draw per call and get none.
        self.local_calls: dict = {}
        # Cached global calls, by the same plus each input's GlobalInfo (placement, SBP,
        # piece): see framework/global_tensor.py.
        self.global_calls: dict = {}
        self.call_cacheable = not (self.variadic or self.random)
        in_names = tuple(n.lstrip("*") for n in self.inputs)
        if self.saves is None:
            self._saved_in, self._saved_out = None, None
            return
        if isinstance(self.saves, str):
            raise ValueError(f"op {self.name!r}: saves must be a tuple of names, not a str")
        self._variadic_from = None  # the first saved position of a variadic input
        self._save_when: dict = {}  # ("input"|"output", i) -> inputs whose grads need it
        names = []
        for n in self.saves:
            n, _, users = n.partition(" for ")
            head, _, tail = n.partition("[")
            if tail:
                if not (self.variadic and head == in_names[0] and tail.endswith(":]")
                        and tail[:-2].isdigit()):
                    raise ValueError(f"op {self.name!r} saves {n!r}: only a variadic input "
                                     "takes a tail, as 'tensors[1:]'")
                self._variadic_from = int(tail[:-2])
            elif self.variadic and head == in_names[0]:
                self._variadic_from = 0
            if head in in_names and head in self.outputs:
                raise ValueError(f"op {self.name!r}: saved name {n!r} is an input and an output")
            if head not in in_names and head not in self.outputs:
                raise ValueError(f"op {self.name!r} saves {n!r}, which is neither an input "
                                 f"{in_names} nor an output {self.outputs}")
            names.append(head)
            if users:
                need = tuple(in_names.index(u) if u in in_names else -1
                             for u in users.split(","))
                if self.variadic or -1 in need:
                    raise ValueError(f"op {self.name!r} saves {n!r} for {users!r}: name inputs "
                                     f"of {in_names} (not of a variadic op)")
                kind = "input" if head in in_names else "output"
                where = in_names if kind == "input" else self.outputs
                self._save_when[kind, where.index(head)] = need
        self._saved_in = tuple(i for i, n in enumerate(in_names) if n in names)
        self._saved_out = tuple(i for i, n in enumerate(self.outputs) if n in names)

    def differentiable(self, i: int, meta) -> bool:
        """Whether output i (of this meta) can carry a gradient: floating and not nondiff."""
        return meta.dtype.is_floating_point and self._diff_out[i]

    def saved_input_indices(self, n_inputs: int) -> tuple[int, ...]:
        """Positions of the inputs (of a call with n_inputs tensors) that `grad` reads; a
        variadic op saves a tail of its tensors.  Undeclared: all."""
        if self._saved_in is None:
            return tuple(range(n_inputs))
        if self.variadic:
            start = self._variadic_from
            return () if start is None else tuple(range(start, n_inputs))
        return self._saved_in

    def saved_output_indices(self, n_outputs: int) -> tuple[int, ...]:
        """Positions of the outputs that `grad` reads.  Undeclared: all."""
        if self._saved_out is None:
            return tuple(range(n_outputs))
        return self._saved_out

    def saved_when(self, kind: str, i: int) -> tuple[int, ...] | None:
        """The inputs whose gradient needs saved input/output i ("input"/"output"), or None
        where it is saved whenever any gradient is needed."""
        return self._save_when.get((kind, i))

    def saved_for(self, kind: str, n: int, needs_input_grad) -> tuple[int, ...]:
        """The saved positions of inputs/outputs (kind "input"/"output") of one call, given
        which inputs need a gradient: conditional saves whose users need none are dropped."""
        key = (kind, n, needs_input_grad)
        hit = self._saved_for_cache.get(key)
        if hit is not None:
            return hit
        idx = (self.saved_input_indices(n) if kind == "input"
               else self.saved_output_indices(n))
        when = self._save_when
        idx = tuple(i for i in idx
                    if (kind, i) not in when or any(needs_input_grad[u] for u in when[kind, i]))
        if len(self._saved_for_cache) < 256:
            self._saved_for_cache[key] = idx
        return idx

    # -- schema ---------------------------------------------------------------------------
    def bind_attrs(self, attrs: dict) -> dict:
        """Validate and normalise attrs, filling defaults; raise naming op and argument."""
        if not attrs and not self.attrs:
            return attrs
        out = {}
        for key in attrs:
            if key not in self.attrs:
                raise op_error(self.name, f"got an unexpected keyword argument '{key}'", TypeError)
        for key, spec in self.attrs.items():
            if key in attrs:
                v = attrs[key]
            elif spec.required:
                raise op_error(self.name, f"missing required argument '{key}'", TypeError)
            else:
                out[key] = spec.default
                continue
            if v is None and spec.optional:
                out[key] = None
                continue
            try:
                out[key] = _CHECKS[spec.kind](v)
            except (TypeError, ValueError):
                raise op_error(
                    self.name,
                    f"argument '{key}' must be {_KIND_NAMES[spec.kind]}, not "
                    f"{type(v).__name__} ({v!r})",
                    TypeError,
                ) from None
        return out

    def meta(self, in_metas: tuple[TensorMeta, ...], attrs: dict,
             local: bool = True) -> tuple[TensorMeta, ...]:
        """Output metas, cached by input metas and attrs.

        Outputs that cannot be allocated raise RuntimeError here, at the call, as torch does:
        a byte size past 2**63 always, and one past this machine's memory (RAM + swap) when
        `local` (a global tensor's logical size may exceed one machine).  Such results are
        never cached, so a cache hit needs no check."""
        try:
            values = tuple(attrs.values())
            # 1, 1.0 and True are equal dict keys but promote differently: key on types too.
            # An integer input of a floating op takes the default dtype: key on it as well.
            key = (in_metas, values, tuple(map(type, values)), get_default_dtype())
            hit = self._meta_cache.get(key)
        except TypeError:  # an unhashable attr value
            key, hit = None, None
        if hit is not None:
            return hit
        for m in in_metas:
            if type(m) is SparseMeta:
                raise NotImplementedError(
                    f"{self.name}: sparse COO tensors are not supported by this op in sbpflow "
                    "(they support to_dense, coalesce, indices, values, sparse.mm / spmm / @, "
                    "sparse.sum, addition, scalar multiplication, t and to); call "
                    ".to_dense() first")
        out = self.infer_meta(*in_metas, **attrs)
        if isinstance(out, TensorMeta):
            out = (out,)
        if not self.view and _oversized(self.name, out, local):
            return out  # logical metas of a global op: fine, but not cached
        if key is not None and len(self._meta_cache) < 4096:
            self._meta_cache[key] = out
        return out

    def signatures(self, in_metas, attrs):
        if self.sbp is None:
            return []
        # P on a bool input is never a real state: bools do not add.
        return [sig for sig in self.sbp(*in_metas, **attrs)
                if not any(x == P and m.dtype is bool_ for x, m in zip(sig.inputs, in_metas))]

    def __repr__(self):
        return f"OpDef({self.name!r}, inputs={self.inputs}, attrs={list(self.attrs)})"


_REGISTRY: dict[str, OpDef] = {}


def _machine_bytes() -> int:
    """RAM + swap: an allocation beyond it cannot succeed (Linux's overcommit heuristic)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


_MACHINE_BYTES = _machine_bytes()


def _oversized(name: str, metas, local: bool) -> bool:
    """Raise for outputs no machine can hold (or, `local`, this one); True if any output is
    larger than this machine's memory."""
    big = False
    for m in metas:
        n = m.numel * m.dtype.itemsize
        if n >= 2 ** 63:
            raise RuntimeError(f"{name}: Storage size calculation overflowed with "
                               f"sizes={list(m.shape)}")
        if n > _MACHINE_BYTES:
            if local:
                raise RuntimeError(
                    f"{name}: DefaultCPUAllocator: can't allocate memory: you tried to "
                    f"allocate {n} bytes (this machine has {_MACHINE_BYTES} bytes of memory "
                    "and swap)")
            big = True
    return big


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name!r} is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} is registered") from None


def list_ops() -> list[str]:
    return sorted(_REGISTRY)


# -- calling ops from grad rules ----------------------------------------------------------
_dispatch: Callable[..., Any] | None = None


def set_dispatcher(fn: Callable[..., Any]) -> None:
    """Installed by the framework: fn(opdef, inputs, attrs) -> tensor or tuple of tensors."""
    global _dispatch
    _dispatch = fn


def _never() -> bool:
    return False


_differentiating: Callable[[], bool] = _never


def set_grad_mode_query(fn: Callable[[], bool]) -> None:
    """Installed by the framework: fn() tells whether ops now record autograd (grad mode)."""
    global _differentiating
    _differentiating = fn


@contextlib.contextmanager
def plain_backward():
    """Within: grad rules build a first-order backward whatever the grad mode (the graph's
    autograd pass, which never builds a double backward), so they may use fused gradient ops."""
    global _differentiating
    previous, _differentiating = _differentiating, _never
    try:
        yield
    finally:
        _differentiating = previous


def differentiating() -> bool:
    """Whether op results are being recorded for autograd now.  A grad rule sees True only
    while a double backward is being built (`create_graph=True`): it may then compose
    differentiable ops instead of calling a fused, non-differentiable gradient op."""
    return _differentiating()


def op(name: str, *inputs, _device=None, **attrs):
    """Call a registered op on tensors; used by grad rules.  `_device` places ops that have
    no tensor inputs (creation ops)."""
    opdef = _REGISTRY[name]
    if _device is None:
        return _dispatch(opdef, inputs, attrs)
    return _dispatch(opdef, inputs, attrs, device=_device)


def meta_of(dtype: DType, shape) -> TensorMeta:
    return TensorMeta(tuple(shape), dtype)
