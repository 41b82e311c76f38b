"""The interpreter: every op call enters `apply`.

Eager local execution: bind attrs, infer output metas (cached per op by input metas and attrs),
run the kernel on the device's primitives, wrap the outputs, and record an autograd node when
grad mode is on and an input requires grad.  (The VM, global tensors and lazy tracing plug in
here in later layers.)

In-place ops are an out-of-place op followed by `assign`, which writes the result into the
target's memory, bumps the storage version and rewires autograd.  Writing through a view
rewires the base through a `CopySlices` node, as torch does, so gradients stay right.
"""

from __future__ import annotations

from threading import get_ident

import numpy as np

from .._core import dtype as _dtypes
from .._core.dtype import DType
from .._core.errors import op_error
from ..autograd.function import set_tensor_type as _set_function_tensor_type
from ..autograd.grad_mode import _state as _grad_state
from ..autograd.grad_mode import is_grad_enabled, no_grad
from ..autograd.node import Node, OpNode
from ..device import Device
from ..device.allocator import LARGE
from ..ops import registry
from ..ops.registry import KernelContext
from ..vm import Blob, InstructionsBuilder, Mode
from ..vm import machine as _machine
from .generator import default_generator
from .tensor import Tensor, _contiguous_strides

_CPU = Device("cpu")


def _edge(t: Tensor):
    fn = t.grad_fn
    if fn is not None:
        return fn, t._output_nr
    if t._requires_grad:
        return t._grad_accumulator(), 0
    return None


def _check_tensors(opdef, tensors):
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            name = opdef.inputs[0][1:] if opdef.variadic else opdef.inputs[i]
            raise op_error(
                opdef.name,
                f"argument '{name}' must be Tensor, not {_type_name(t)}",
                TypeError,
            )


def _type_name(x) -> str:
    """torch's way of naming a wrong argument's type: `float`, but `numpy.ndarray` and
    `torch.Tensor` (another library's tensor must not read as ours)."""
    t = type(x)
    if t.__module__ in ("builtins", __name__) or t.__module__.startswith("sbpflow"):
        return t.__name__
    return f"{t.__module__.split('.')[0]}.{t.__name__}"


def apply(opdef, inputs, attrs, device=None, generator=None, _profiled=False):
    """Run one op eagerly on local tensors.  Returns a Tensor or a tuple of them.

    This is the hot path of eager mode.  A call whose (op, input metas, attrs, device) was
    seen before reuses its cached `_LocalCall` (no attr binding, meta inference or context
    building) and, when the op is small and its stream idle, runs the kernel right here without
    building an instruction (`_run_local_call`).  A call on global tensors does the same with
    its cached `global_tensor._GlobalCall`, keyed also on each input's GlobalInfo (placement,
    SBP, piece).  Anything unusual (local and global tensors mixed, an explicit device, random
    or variadic ops, an unhashable attr) takes the general path below, which also raises every
    error about bad input.
    """
    if _op_hook is not None and not _profiled:
        # sbpflow.profiler is recording: it times this call, re-entering with _profiled=True
        return _op_hook(opdef, inputs, attrs, device, generator)
    if _apply_lazy is not None and get_ident() == _lazy_thread:
        # inside nn.Graph.build() on the tracing thread: record into the Job instead
        return _apply_lazy(opdef, inputs, attrs, device, generator)
    if device is None and opdef.call_cacheable:
        global_call = None
        try:
            t0 = inputs[0]
            dev = t0._device
            gl = t0._gl
            if gl is not None:
                # Unrolled for one and two inputs: a comprehension costs a frame per call.
                if len(inputs) == 1:
                    key = (t0._meta, gl, t0._strides) if opdef.view else (t0._meta, gl)
                elif len(inputs) == 2:
                    t1 = inputs[1]
                    key = (t0._meta, gl, t1._meta, t1._gl)
                else:
                    key = tuple([(t._meta, t._gl) for t in inputs])
                key = (key, id(dev), _dtypes._default_float)
                if attrs:
                    key = (key, tuple(attrs.items()), tuple(map(type, attrs.values())))
                global_call = opdef.global_calls.get(key)
                if global_call is None:
                    global_call = _new_global_call(opdef, inputs, attrs, key)
            else:
                ok = True
                if len(inputs) == 1:
                    key = (t0._meta, t0._strides) if opdef.view else t0._meta
                else:
                    key = tuple([t._meta for t in inputs])
                    for t in inputs:
                        if t._gl is not None or t._device is not dev:
                            ok = False
                if ok:
                    key = (key, id(dev), _dtypes._default_float)
                    if attrs:
                        key = (key, tuple(attrs.items()), tuple(map(type, attrs.values())))
                    call = opdef.local_calls.get(key)
                    if call is None:
                        call = _new_local_call(opdef, inputs, attrs, dev, key)
                    if call is not None:
                        return _run_local_call(call, inputs)
        except (AttributeError, TypeError, IndexError):
            pass  # not all tensors, or an unhashable attr: the general path explains
        if global_call is not None:  # run outside the try: its errors are the user's
            return global_call.run(inputs)
    return _apply_general(opdef, inputs, attrs, device, generator)


def _apply_general(opdef, inputs, attrs, device, generator):
    attrs = opdef.bind_attrs(attrs)
    tensors = list(inputs[0]) if opdef.variadic else inputs
    if len(inputs) != len(opdef.inputs):
        raise op_error(
            opdef.name,
            f"expected {len(opdef.inputs)} tensor inputs {opdef.inputs}, got {len(inputs)}",
            TypeError,
        )
    dev = None
    for t in tensors:
        if not isinstance(t, Tensor):
            _check_tensors(opdef, tensors)
        if t._gl is not None:
            return _apply_global(opdef, tensors, attrs, device, generator)
        d = t._device
        if dev is None:
            dev = d
        elif d is not dev and d != dev and not (d.type == dev.type == "cpu"):
            # CPU memory is one space: OneFlow's rank-local pieces (cpu:1) mix with cpu.
            raise op_error(
                opdef.name,
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {dev} and {d}!",
            )
    if dev is None:
        if device is None:
            dev = _CPU
        elif type(device) is not Device and hasattr(device, "placement"):
            return _apply_global(opdef, tensors, attrs, device, generator)
        else:
            dev = Device(device)
    in_metas = tuple([t._meta for t in tensors])
    out_metas = opdef.meta(in_metas, attrs)
    ctx = KernelContext(dev.prims, opdef.name, in_metas, out_metas)
    if opdef.random:
        gen = default_generator if generator is None else generator
        words = dev.prims.words_used("normal", sum(m.numel for m in out_metas))
        ctx.seed, ctx.offset = gen.take(words)
    outs = _issue(opdef, tensors, attrs, ctx, dev, _pooled(out_metas, dev))
    if opdef.grad is not None and is_grad_enabled():
        for t in tensors:
            # The property for views: a view of a base that gained history refreshes.
            if t._requires_grad or (t._base is not None and t.requires_grad):
                _record(opdef, attrs, tensors, outs, in_metas, out_metas, dev)
                break
    return outs[0] if len(outs) == 1 else tuple(outs)


def _issue(opdef, tensors, attrs, ctx, dev, prims):
    """Make the output tensors and hand the op to the VM as one instruction; `prims`: per
    output, the primitives whose allocator may own its memory (None: too small to recycle,
    so its storage needs no release instruction when it dies)."""
    out_metas = ctx.out_metas
    if opdef.view:
        src = tensors[0]
        blob = Blob()
        strides, offset = _view_layout(opdef, src, out_metas[0], attrs)
        outs = [Tensor._make(blob, out_metas[0], dev, src._storage, strides, offset)]
        _link_view(outs[0], src, opdef, attrs)
        out_blobs, out_storages = (blob,), ()
    else:
        out_blobs = [Blob() for _ in out_metas]
        outs = [Tensor._output(b, m, dev, None, p)
                for b, m, p in zip(out_blobs, out_metas, prims)]
        out_storages = [o._storage for o in outs]
    _builder.op_call(opdef.name, opdef.kernel, ctx, attrs, [t._blob for t in tensors],
                     [t._storage for t in tensors], out_blobs, out_storages,
                     variadic=opdef.variadic, view=opdef.view, device_type=dev.type)
    return outs


def _pooled(out_metas, dev):
    """Per output: dev's primitives if its buffer is large enough for the caching allocator to
    recycle (its storage then gets a release instruction when it dies), else None."""
    prims = dev.prims
    return tuple(prims if m.numel * m.dtype.np.itemsize >= _POOLED_BYTES else None
                 for m in out_metas)


# -- cached calls --------------------------------------------------------------------------
_POOLED_BYTES = LARGE
_LOCAL_CALL_LIMIT = 4096  # cached calls per op; beyond it calls still run, uncached
_PLAIN_ATTR_TYPES = frozenset({int, float, bool, str, type(None), DType})


def _plain(v) -> bool:
    """An attr value whose equality fixes its binding (not a tensor or mutable object)."""
    if type(v) is tuple:
        return all(_plain(x) for x in v)
    return type(v) in _PLAIN_ATTR_TYPES


class _LocalCall:
    """One local op call as computed once for its (input metas, attrs, device, default dtype):
    bound attrs, output metas and strides, the kernel context, whether outputs are recycled
    through the allocator, the view layout, and whether the op can record autograd."""

    __slots__ = ("opdef", "name", "kernel", "attrs", "ctx", "in_metas", "out_metas",
                 "out_strides", "prims", "numel", "dev", "stream", "view", "view_layout",
                 "grad", "single", "fix", "direct")

    def __init__(self, opdef, attrs, in_metas, out_metas, dev, view_layout, ctx=None):
        self.opdef = opdef
        self.name = opdef.name
        self.kernel = opdef.kernel
        self.attrs = attrs
        # `ctx`: a global call's (global_tensor._GlobalCall), with its pieces' metas; the
        # memory figures below are of what the kernel makes, the pieces.
        if ctx is None:
            ctx = KernelContext(dev.prims, opdef.name, in_metas, out_metas)
        self.ctx = ctx
        self.in_metas = in_metas
        self.out_metas = out_metas  # the outputs' metas (a global call's: logical)
        made = ctx.out_metas
        self.out_strides = tuple(_contiguous_strides(m.shape) for m in made)
        self.prims = _pooled(made, dev)
        self.view = opdef.view
        self.view_layout = view_layout  # (strides, offset from the source's offset)
        # A view allocates nothing: it counts as 0 elements (as the builder counts it).
        self.numel = 0 if opdef.view else sum(m.numel for m in made)
        self.dev = dev
        self.stream = dev.type
        self.grad = opdef.grad is not None
        self.single = len(out_metas) == 1
        self.fix = dev.prims.ensure_contiguous
        # The op's specialised function for this call (OpDef.specialize), for views and for
        # outputs small enough not to come from the caching allocator; None: the kernel runs.
        self.direct = None
        if opdef.specialize is not None and (opdef.view or not any(self.prims)):
            self.direct = opdef.specialize(self.ctx, attrs)


def _new_local_call(opdef, tensors, attrs, dev, key):
    """The `_LocalCall` of a call not seen before (cached when its attrs are plain values), or None
    where the general path must run it.  Bad attrs and impossible shapes raise here, exactly
    as the general path raises them; nothing is cached then."""
    if len(tensors) != len(opdef.inputs):
        return None
    bound = opdef.bind_attrs(attrs)
    in_metas = tuple([t._meta for t in tensors])
    out_metas = opdef.meta(in_metas, bound)
    layout = None
    if opdef.view:
        src = tensors[0]
        if out_metas[0].dtype != src._meta.dtype:
            return None  # view(dtype): the layout depends on the source's offset
        strides, offset = _view_layout(opdef, src, out_metas[0], bound)
        layout = (strides, offset - src._offset)
    call = _LocalCall(opdef, bound, in_metas, out_metas, dev, layout)
    if len(opdef.local_calls) < _LOCAL_CALL_LIMIT and all(_plain(v) for v in attrs.values()):
        opdef.local_calls[key] = call
    return call


def _run_local_call(call, tensors):
    """Run a cached call: inline when the op is small and its stream idle (no instruction
    object), else as one instruction handed to the VM.  Then record autograd."""
    outs = _run_inline(call, tensors)
    if outs is None:
        outs = _issue(call.opdef, tensors, call.attrs, call.ctx, call.dev, call.prims)
    if call.grad and _grad_state.enabled:
        for t in tensors:
            # The property for views: a view of a base that gained history refreshes.
            if t._requires_grad or (t._base is not None and t.requires_grad):
                _record(call.opdef, call.attrs, tensors, outs, call.in_metas, call.out_metas,
                        call.dev)
                break
    return outs[0] if call.single else tuple(outs)


def _run_inline(call, tensors):
    """The kernel run on this thread, in order on an idle stream, with the bookkeeping an
    instruction would get (a sequence number, the outputs' storage writes, errors raised as
    the VM raises an inline failure), when the op is small (or the VM is in SYNC mode) and
    no profiler traces instructions.  None, with nothing done, if it may not run inline or an
    input is still being produced or written on another stream: the instruction path then
    orders it.  The outputs are local tensors with `call.out_metas` (a global caller adds
    their GlobalInfo)."""
    vm = _machine._vm
    if vm is None or _machine._tracer is not None:
        return None
    stream = vm.streams.get(call.stream)
    if stream is None or not (call.numel < vm.inline_max or vm.mode is Mode.SYNC):
        return None
    if stream.completed != stream.issued:
        # A small op joins its busy stream rather than queue behind it: queued small ops cost
        # the worker a GIL hand-off each while this thread keeps the GIL busy (measured: the
        # MLP step took 1.2x as long queued as run inline).
        stream.wait(stream.issued)
    with vm._issue_lock:
        if len(vm._releases) >= vm.RELEASE_BATCH:
            vm._flush_releases_locked()
        seq = stream.issued + 1
        if stream.completed != seq - 1:
            return None
        arrays = []
        for t in tensors:
            b = t._blob
            a = b.array
            if a is None or b.error is not None:
                return None
            lw = t._storage.last_write
            if lw is not None and lw[0] is not stream and lw[0].completed < lw[1]:
                return None
            arrays.append(a)
        stream.issued = seq
        try:
            if call.direct is not None:
                res = call.direct(*arrays)
            else:
                res = call.kernel(call.ctx, *arrays, **call.attrs)
        except BaseException as e:  # noqa: BLE001 - raised as the VM raises inline failures
            stream.completed = seq
            vm.fail_inline(call.name, e)
        stream.completed = seq
    dev = call.dev
    if call.view:
        src = tensors[0]
        strides, delta = call.view_layout
        out = Tensor._make(Blob(res), call.out_metas[0], dev, src._storage, strides,
                           src._offset + delta)
        _link_view(out, src, call.opdef, call.attrs)
        return (out,)
    fix = call.fix
    if call.single:
        prims = call.prims[0]
        out = Tensor._output(Blob(fix(res)), call.out_metas[0], dev, call.out_strides[0], prims)
        if prims is not None:  # recycled when it dies: its release must follow this write
            out._storage.last_write = (stream, seq)
        return (out,)
    outs = []
    for arr, meta, strides, prims in zip(res, call.out_metas, call.out_strides, call.prims):
        out = Tensor._output(Blob(fix(arr)), meta, dev, strides, prims)
        if prims is not None:
            out._storage.last_write = (stream, seq)
        outs.append(out)
    return outs


def _make_saved_output(ref, meta, node, i):
    """A saved output rebuilt as a tensor whose grad_fn is `node` (see OpNode)."""
    blob, storage, strides, offset, gl = ref
    dev = node.device if gl is None else gl.placement.device
    t = Tensor._make(blob, meta, dev, storage, strides, offset)
    t._gl = gl
    if node.opdef.differentiable(i, meta):
        t._set_grad_fn(node, i)
    return t


def _record(opdef, attrs, tensors, outs, in_metas, out_metas, dev, saved=None):
    """Record the autograd node of one op call.  `saved`: the tensors the grad rule sees
    (for a global op, the inputs after boxing); `dev`: where zero gradients are made."""
    next_functions = [_edge(t) if t.requires_grad else None for t in tensors]
    node = OpNode(opdef, attrs, tensors if saved is None else saved, outs, in_metas, out_metas,
                  next_functions, _make_saved_output, dev)
    for i, o in enumerate(outs):
        if opdef.differentiable(i, o._meta):
            o._set_grad_fn(node, i)


# -- views -----------------------------------------------------------------------------------
_LAYOUT_CACHE: dict = {}
_DUMMY = np.zeros(1, np.uint8)
_CPU_PRIMS = _CPU.prims


def _view_layout(opdef, src: Tensor, out_meta, attrs):
    """(strides, offset) of a view op's output, known when the op is issued.

    The view kernel only rearranges strides, so running it on a one-byte dummy array with the
    source's strides (itemsize 1: byte strides are element strides) yields the output's
    layout without touching data, as torch derives strides from metadata.
    """
    if out_meta.dtype != src._meta.dtype:  # Tensor.view(dtype): the bytes are reinterpreted
        return _dtype_view_layout(src, out_meta)
    key = (opdef.name, src._meta.shape, src._strides, tuple(attrs.values()))
    try:
        hit = _LAYOUT_CACHE.get(key)
    except TypeError:
        key, hit = None, None
    if hit is None:
        dummy = np.lib.stride_tricks.as_strided(_DUMMY, src._meta.shape, src._strides)
        ctx = KernelContext(_CPU_PRIMS, opdef.name, (src._meta,), (out_meta,))
        out = opdef.kernel(ctx, dummy, **attrs)
        start = dummy.__array_interface__["data"][0]
        hit = (tuple(out.strides), out.__array_interface__["data"][0] - start)
        if key is not None and len(_LAYOUT_CACHE) < 65536:
            _LAYOUT_CACHE[key] = hit
    return hit[0], src._offset + hit[1]


def _dtype_view_layout(src: Tensor, out_meta):
    """(strides, offset) of a view of src's bytes as another dtype, in the new element size:
    the last axis (contiguous) absorbs a change of element size, as torch's view(dtype)."""
    old, new = src._meta.dtype.np.itemsize, out_meta.dtype.np.itemsize
    strides, offset = tuple(src._strides), src._offset
    if old == new or not strides:
        return strides, offset
    if old > new:
        r = old // new
        return tuple(s * r for s in strides[:-1]) + (1,), offset * r
    r = new // old
    return tuple(s // r for s in strides[:-1]) + (1,), offset // r


def write_values(t: Tensor, value: Tensor, name: str) -> None:
    """Copy value's array into t's memory (an instruction writing t's storage)."""
    if _assign_lazy is not None and get_ident() == _lazy_thread:
        _assign_lazy(t, value, name)  # inside nn.Graph.build(): an SSA rebind in the Job
        return
    prims = t._device.prims
    tb, vb = t._blob, value._blob
    _builder.call(name, lambda: prims.copy(tb.array, vb.array), ins=(tb, vb), outs=(tb,),
                  reads=(value._storage,), writes=(t._storage,), stream=t._device.type,
                  numel=t._meta.numel)
    t._storage.version += 1


def _link_view(out: Tensor, src: Tensor, opdef, attrs) -> None:
    """Remember the root base and the view chain from it, for writes through the view."""
    base = src if src._base is None else src._base
    out._base = base
    out._view_chain = src._view_chain + ((opdef, attrs, src._meta),)


def _replay(t: Tensor, chain) -> Tensor:
    """Apply a view chain (recorded from a base) to a tensor of the base's shape."""
    for opdef, attrs, _ in chain:
        t = apply(opdef, (t,), attrs)
    return t


class _ViewGradContext:
    """A grad context for view ops, which need only metas and attrs."""

    __slots__ = ("attrs", "in_metas", "out_metas", "needs_input_grad")

    def __init__(self, attrs, in_meta, out_meta):
        self.attrs = attrs
        self.in_metas = (in_meta,)
        self.out_metas = (out_meta,)
        self.needs_input_grad = (True,)


def _embed(g: Tensor, chain) -> Tensor:
    """The adjoint of `_replay`: scatter a view-shaped gradient back to the base's shape."""
    for opdef, attrs, in_meta in reversed(chain):
        out_meta = opdef.meta((in_meta,), attrs)[0]
        (g,) = opdef.grad(_ViewGradContext(attrs, in_meta, out_meta), g)[:1]
    return g


class CopySlices(Node):
    """The new history of a base after an in-place write through one of its views.

    The gradient of the base splits in two: the region the view covers goes to the value that
    was written, the rest goes to the base's history before the write.
    """

    __slots__ = ("chain", "in_metas", "out_metas")

    def __init__(self, base_edge, value_edge, chain, base_meta, view_meta):
        super().__init__((base_edge, value_edge))
        self.chain = chain
        self.in_metas = (base_meta, view_meta)
        self.out_metas = (base_meta,)

    def apply(self, grads):
        (g,) = grads
        region = _replay(g, self.chain)
        g_value = region.contiguous() if self.next_functions[1] is not None else None
        g_base = g - _embed(region, self.chain) if self.next_functions[0] is not None else None
        return [g_base, g_value]


class ViewOfBase(Node):
    """grad_fn of a view whose base was rewritten: route its gradient into the base."""

    __slots__ = ("chain", "in_metas", "out_metas")

    def __init__(self, base_edge, chain, base_meta, view_meta):
        super().__init__((base_edge,))
        self.chain = chain
        self.in_metas = (base_meta,)
        self.out_metas = (view_meta,)

    def apply(self, grads):
        return [_embed(grads[0], self.chain)]


class Overwritten(Node):
    """grad_fn of a tensor with history overwritten by values that need no gradient
    (`h.fill_(0)`, `h.copy_(constant)`): the history before the write gets zeros."""

    __slots__ = ("in_metas", "out_metas", "_name")

    def __init__(self, old_edge, meta, op: str):
        super().__init__((old_edge,))
        self.in_metas = (meta,)
        self.out_metas = (meta,)
        self._name = "CopyBackwards" if op == "copy_" else op.strip("_").title() + "Backward0"

    def name(self) -> str:
        return self._name

    def apply(self, grads):
        meta = self.in_metas[0]
        return [registry.op("full", shape=meta.shape, fill_value=0.0, dtype=meta.dtype)]


def _refresh_view_grad_fn(view: Tensor) -> None:
    base = view._base
    edge = _edge(base)
    view._set_grad_fn(ViewOfBase(edge, view._view_chain, base._meta, view._meta), 0)


# -- in-place ------------------------------------------------------------------------------
def check_inplace(op: str, t: Tensor) -> None:
    """torch's rules for writing into a tensor that autograd may need."""
    if not is_grad_enabled():
        return
    if t._base is None:
        if t._requires_grad and t._grad_fn is None:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation."
            )
    elif t._base._requires_grad and t._base._grad_fn is None:
        raise RuntimeError(
            "a view of a leaf Variable that requires grad is being used in an in-place operation."
        )


def _check_no_overlap(op: str, t: Tensor) -> None:
    for n, s in zip(t._meta.shape, t.stride()):
        if n > 1 and s == 0:
            raise op_error(
                op,
                "unsupported operation: more than one element of the written-to tensor refers "
                "to a single memory location. Please clone() the tensor before performing the "
                "operation.",
            )


def _match_global(op: str, t: Tensor, value: Tensor) -> Tensor:
    """An in-place write into a global tensor keeps its placement and SBP: the value is boxed
    to them first (a P result written into a B parameter is all-reduced)."""
    if t._gl is None and value._gl is None:
        return value
    base = t if t._base is None else t._base
    if t._gl is not None and getattr(base, "_boxed_copy_of", None) is not None:
        raise op_error(op, "cannot write in place through this view of a global tensor: its "
                           f"SBP {_sbp_text(base._boxed_copy_of)} had to be boxed to "
                           f"{_sbp_text(base)} to take the view, so the view is of a copy and "
                           "the write would not reach the tensor; write out of place, or "
                           "convert the tensor to broadcast first")
    if t._gl is None or value._gl is None:
        which = "global" if t._gl is not None else "local"
        raise op_error(op, f"cannot write a {'local' if which == 'global' else 'global'} "
                           f"value into a {which} tensor; convert it with .to_global() or "
                           ".to_local() first")
    if value._gl.placement == t._gl.placement and value._gl.sbp == t._gl.sbp:
        return value
    return value.to_global(t._gl.placement, t._gl.sbp)


def _sbp_text(t: Tensor) -> str:
    return "(" + ", ".join(map(repr, t._gl.sbp)) + ")"


def assign(t: Tensor, value: Tensor, op: str = "copy_") -> Tensor:
    """Write `value` (same shape and dtype as t) into t's memory, with autograd."""
    value = _match_global(op, t, value)  # traced as a boxing node inside build()
    if _assign_lazy is not None and get_ident() == _lazy_thread:
        return _assign_lazy(t, value, op)  # inside nn.Graph.build(): an SSA rebind in the Job
    if value._meta != t._meta:
        raise op_error(op, f"internal: value meta {value._meta} != target meta {t._meta}")
    check_inplace(op, t)
    _check_no_overlap(op, t)
    write_values(t, value, op)
    if not is_grad_enabled():
        return t
    base = t._base
    if base is None:
        if value._requires_grad:
            t._set_grad_fn(*_edge(value)) if value.grad_fn is not None else _alias_leaf(t, value)
        elif t._grad_fn is not None:
            # torch keeps an overwritten tensor in the graph: its old history gets zeros.
            t._set_grad_fn(Overwritten(_edge(t), t._meta, op), 0)
        return t
    if not (value._requires_grad or base._requires_grad):
        return t
    base_edge = _edge(base) if base._requires_grad else None
    value_edge = _edge(value) if value._requires_grad else None
    node = CopySlices(base_edge, value_edge, t._view_chain, base._meta, t._meta)
    base._set_grad_fn(node, 0)
    _refresh_view_grad_fn(t)
    return t


def _alias_leaf(t: Tensor, value: Tensor) -> None:
    """t now holds a leaf's values: route gradient through an identity op."""
    ident = apply(registry.get("clone"), (value,), {})
    t._set_grad_fn(ident._grad_fn, ident._output_nr)


def inplace(name: str, target: Tensor, fn, args=(), kwargs=None) -> Tensor:
    """`target.<name>(...)`: compute fn(target, *args) out of place, then assign it to target.

    Torch's checks apply: the result must keep target's shape (no broadcasting of target) and
    its dtype must cast to target's without lowering the category.
    """
    recording = is_grad_enabled() and (
        target._requires_grad
        or any(isinstance(x, Tensor) and x.requires_grad for x in args)
        or (target._base is not None and target._base._requires_grad)
    )
    src = target
    if recording:
        check_inplace(name, target)
        # The op may save its input for backward; hand it a snapshot, since target is about
        # to be overwritten.
        src = apply(registry.get("clone"), (target,), {})
    out = fn(src, *args, **(kwargs or {}))
    if out._meta.shape != target._meta.shape:
        raise op_error(
            name,
            f"output with shape {list(target.shape)} doesn't match the broadcast shape "
            f"{list(out.shape)}",
        )
    if out._meta.dtype is not target._meta.dtype:
        from .._core.dtype import can_cast

        if not can_cast(out._meta.dtype, target._meta.dtype):
            raise op_error(
                name,
                f"result type {_torch_type(out.dtype)} can't be cast to the desired output "
                f"type {_torch_type(target.dtype)}",
            )
        out = apply(registry.get("to_dtype"), (out,), {"dtype": target._meta.dtype})
    if not recording:
        # Nothing to rewire: write the values, bump the version.
        check_inplace(name, target)
        _check_no_overlap(name, target)
        write_values(target, _match_global(name, target, out), name)
        return target
    assign(target, out, name)
    _save_target_instead(out, target)
    return target


def _save_target_instead(value: Tensor, target: Tensor) -> None:
    """An in-place op's node saved its private result; torch saves `self` instead, so a later
    in-place write to target (or its base) fails the version check as it does in torch."""
    node = value._grad_fn
    if not isinstance(node, OpNode) or not node.saved_outputs:
        return
    node.saved_outputs = [
        None if entry is None
        else (target._data_ref(), target._storage.version)
        if entry[0][1] is value._storage else entry
        for entry in node.saved_outputs
    ]


def _torch_type(d) -> str:
    return {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
            "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
            "bool": "Bool"}[d.name]


def _no_global(opdef, tensors, attrs, device, generator):
    raise RuntimeError("global tensors need sbpflow.framework.global_tensor")


_apply_global = _no_global
_apply_lazy = None
_op_hook = None  # set by sbpflow.profiler while it records (one `if` when not)
_assign_lazy = None
_convert_lazy = None  # fn(kind, tensor, placement, sbp, grad_sbp): to_global/to_local traced
_lazy_thread = None  # the thread tracing build(); eager ops of other threads stay eager


def set_lazy_apply(fn) -> None:
    """Installed by graph tracing while `nn.Graph.build()` runs (None afterwards): the lazy
    interpreter, which records the tracing thread's ops into a Job instead of running them.
    Other threads keep running eagerly meanwhile (torch users train models on threads)."""
    global _apply_lazy, _lazy_thread
    _apply_lazy = fn
    _lazy_thread = get_ident() if fn is not None else None


def set_lazy_assign(fn) -> None:
    """Installed with set_lazy_apply: fn(target, value, op) records an in-place write
    (`assign`, `write_values`) into the Job instead of writing memory."""
    global _assign_lazy
    _assign_lazy = fn


def set_lazy_convert(fn) -> None:
    """Installed with set_lazy_apply: fn("to_global" | "to_local", tensor, placement, sbp,
    grad_sbp) records a conversion into the Job as a boxing node instead of running it."""
    global _convert_lazy
    _convert_lazy = fn


def lazy_convert(kind: str, t, placement=None, sbp=None, grad_sbp=None):
    """The traced form of to_global/to_local when called on the tracing thread, else None."""
    if _convert_lazy is not None and get_ident() == _lazy_thread:
        return _convert_lazy(kind, t, placement, sbp, grad_sbp)
    return None


def _no_global_call(opdef, inputs, attrs, key):
    return None


_new_global_call = _no_global_call


def set_global_apply(fn, new_call=_no_global_call) -> None:
    """Installed by global_tensor.py: the eager global interpreter, and `new_call(opdef,
    inputs, attrs, key)`, which makes (and caches in opdef.global_calls under key) the
    cached call of a call on global inputs not seen before, or returns None where the
    general path must run it."""
    global _apply_global, _new_global_call
    _apply_global = fn
    _new_global_call = new_call


_builder = InstructionsBuilder()
registry.set_dispatcher(apply)
registry.set_grad_mode_query(is_grad_enabled)
# autograd.Function.apply tells tensor arguments apart by this type (autograd can't import it).
_set_function_tensor_type(Tensor)

__all__ = ["apply", "assign", "check_inplace", "inplace", "no_grad"]
