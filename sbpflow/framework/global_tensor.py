"""Global tensors and the eager global interpreter (OneFlow's EagerGlobalInterpreter).

A global tensor is a `Tensor` whose `_meta` is the logical meta and whose `_gl` is a
`GlobalInfo`: the placement, the nd-SBP and the meta of this rank's piece. Its blob, storage
and strides are those of the local piece, so instructions, in-place writes and version
counters work on pieces exactly as on local tensors. A rank outside the placement holds an
empty piece and runs no kernel, but follows the same program (SPMD), so metadata, generator
offsets and collectives stay in step on every rank.

An op on global inputs: infer the logical output metas, choose an SBP signature among the
op's candidates (`sbp.infer.choose_signature`, the chooser graph tracing uses too: inputs that
already match win, then the least cost), box the inputs that differ (a collective
instruction on the comm stream), then run the op's kernel on the local pieces with the
logical metas and each output piece's position in the kernel context. Autograd records the
node as for local ops; gradients are global ops.

All of that but the boxing and the kernel depends only on the call's metadata, so it is
computed once per (op, input metas, SBPs and pieces, placement, attrs, device, default dtype)
and cached as a `_GlobalCall`, a kind of the interpreter's cached local call: a hit runs the
checks across ranks, boxes where needed, and runs the kernel inline when the local path would
(a small op, an idle stream), with no instruction object.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import NamedTuple

import numpy as np

from .. import comm
from .._core import dtype as _dtypes
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..autograd.grad_mode import _state as _grad_state
from ..autograd.grad_mode import is_grad_enabled
from ..autograd.node import Node
from ..device import Device
from ..ops import registry
from ..ops.registry import KernelContext
from ..sbp import boxing, infer, layout
from ..sbp.placement import Placement
from ..sbp.sbp import B, P
from ..vm import Blob
from . import interpreter
from .generator import default_generator
from .tensor import Tensor, _contiguous_strides


class GlobalInfo(NamedTuple):
    placement: Placement
    sbp: tuple  # one Sbp per grid axis
    local_meta: TensorMeta  # this rank's piece
    # Logical strides (None: contiguous).  Layout decisions (is_contiguous, view or copy)
    # read these, never the piece's, so every rank takes the same branch: pieces may differ
    # (an empty one is "contiguous" on one rank and not on another).
    strides: tuple | None = None


class _LogicalLayout:
    """Stands in for a tensor when a view's logical layout is derived (`_view_layout`)."""

    __slots__ = ("_meta", "_strides", "_offset")

    def __init__(self, meta: TensorMeta, strides: tuple, offset: int):
        self._meta, self._strides, self._offset = meta, strides, offset


class GlobalDevice(NamedTuple):
    """Where an op without tensor inputs puts its output: a placement and an nd-SBP."""

    placement: Placement
    sbp: tuple | None = None  # None: broadcast


_builder = interpreter._builder
_box_hook = None  # set by sbpflow.profiler while it records


# -- global mode (OneFlow's flow.utils.global_view.global_mode) ---------------------------
class GlobalMode(NamedTuple):
    """The global mode in force: inside it, factories without placement= make global tensors
    on `placement` with `sbp`, and a global tensor's `.device` is its placement's device."""

    is_enabled: bool = False
    placement: Placement | None = None
    sbp: tuple | None = None


_MODE = GlobalMode()


def current_global_mode() -> GlobalMode:
    return _MODE


def set_global_mode(mode: GlobalMode) -> GlobalMode:
    """Install `mode`; returns the previous one (global_view.global_mode restores it)."""
    global _MODE
    old, _MODE = _MODE, mode
    return old


def global_mode_device(device):
    """The GlobalDevice a factory without placement= uses in global mode (None outside it)."""
    if not _MODE.is_enabled:
        return None
    return GlobalDevice(_MODE.placement, _MODE.sbp)


# -- making global tensors ---------------------------------------------------------------
def _local_meta(meta: TensorMeta, placement: Placement, sbp, rank: int) -> TensorMeta:
    return TensorMeta(layout.local_shape(meta.shape, placement, sbp, rank), meta.dtype)


def _empty_piece(local_meta: TensorMeta, prims):
    return prims.empty(local_meta.shape, local_meta.dtype)


def make(blob, meta: TensorMeta, device, gl: GlobalInfo, storage=None, strides=None,
         offset: int = 0) -> Tensor:
    """A global tensor over a piece's blob (filled now or by a pending instruction)."""
    if strides is None:
        strides = _contiguous_strides(gl.local_meta.shape)
    t = Tensor._make(blob, meta, device, storage, strides, offset)
    t._gl = gl
    return t


def _new_output(meta: TensorMeta, device, placement, sbp, rank) -> tuple[Tensor, Blob]:
    gl = GlobalInfo(placement, sbp, _local_meta(meta, placement, sbp, rank))
    blob = Blob()
    if not placement.has(rank):
        blob.array = _empty_piece(gl.local_meta, device.prims)
    return make(blob, meta, device, gl), blob


def _local_alias(t: Tensor) -> Tensor:
    """This rank's piece as a local tensor sharing memory (no autograd)."""
    return Tensor._make(t._blob, t._gl.local_meta, t._device, t._storage, t._strides, t._offset)


# -- boxing as an instruction ---------------------------------------------------------------
def box(t: Tensor, placement: Placement, sbp: tuple) -> Tensor:
    """t moved to (placement, sbp); the same logical value.  Not recorded by autograd."""
    src = t._gl
    if src.placement == placement and src.sbp == sbp:
        return t
    if _CHECK:  # a collective too: numpy() on one rank against an op on another must fail
        _check_consistent("boxing", src.placement, (t._meta,), (src.sbp,),
                          {"to": f"{layout.fmt_sbp(sbp)} on ranks {placement.ranks}"})
    elif _MULTI and _DIVERGENCE.on:
        key = (t._meta, src.placement, src.sbp, placement, sbp)
        _world().check_global_ops(_box_fingerprint(key), ("boxing",) + key, _describe_entry)
    route = boxing.route(t._meta, src.placement, src.sbp, placement, sbp)
    rank = _rank()
    out, out_blob = _new_output(t._meta, t._device, placement, sbp, rank)
    if rank not in route.participants():
        return out
    in_blob = t._blob
    in_src, in_dst = src.placement.has(rank), placement.has(rank)
    world = comm.world()

    def run():
        local = np.require(in_blob.array, requirements="C") if in_src else None  # keeps 0-d
        res = route.run(local, world)
        if in_dst:
            out_blob.array = res

    if _box_hook is not None:  # sbpflow.profiler is recording: name the steps and bytes
        run = _box_hook(run, route, rank)
    _builder.collective("boxing", run, ins=(in_blob,), outs=(out_blob,) if in_dst else (),
                        reads=(t._storage,), writes=(out._storage,) if in_dst else (),
                        numel=t._meta.numel)
    return out


# -- the interpreter ---------------------------------------------------------------------------
_CHECK = os.environ.get("SBPFLOW_CHECK_GLOBAL", "") not in ("", "0")


def set_consistency_check(on: bool) -> None:
    """Make every rank compare each global op (name, metas, SBPs, placement) before running
    it: a rank whose program diverges fails with both sides named instead of deadlocking.
    Collectives are then compared on every call too (`sbpflow.comm.set_full_check`)."""
    global _CHECK
    _CHECK = bool(on)
    comm.set_full_check(_CHECK)


def consistency_check_enabled() -> bool:
    return _CHECK


class _GlobalCall(interpreter._LocalCall):
    """One global op call as computed once for its metadata (input metas, SBPs and piece
    layouts, placement, attrs, device, default dtype): a `_LocalCall` whose context holds this
    rank's input and output piece metas, the logical metas and the output pieces' positions,
    and whose `out_metas` are the logical ones; plus the SBPs the kernel wants, the outputs'
    GlobalInfos and the call's description for the cross-rank checks.  `run` runs the call as
    `apply_global` always has, inline as a local op where the local path would be.

    Cached twice: in `_GLOBAL_CALLS` by bound attrs (`apply_global`, every global call) and in
    `opdef.global_calls` by the attrs as given (`interpreter.apply`'s fast path)."""

    __slots__ = ("placement", "want", "boxes", "out_gls", "member", "random", "words",
                 "creation_sbp", "entry", "fingerprint", "gdev", "inline")

    def __init__(self, opdef, tensors, in_metas, in_sbps, placement, attrs, dev, creation_sbp):
        out_metas = opdef.meta(in_metas, attrs, local=False)
        want, out_sbps = infer.choose_signature(opdef, in_metas, in_sbps, out_metas, placement,
                                                attrs, creation_sbp)
        rank = _rank()
        member = placement.has(rank)
        out_gls = [GlobalInfo(placement, s, _local_meta(m, placement, s, rank))
                   for m, s in zip(out_metas, out_sbps)]
        in_local = tuple(_local_meta(m, placement, s, rank) for m, s in zip(in_metas, want))
        view_layout = None
        if opdef.view:
            view_layout = _view_of(opdef, tensors[0], in_sbps[0] != want[0], in_local[0],
                                   out_metas[0], out_gls, attrs, member)
        pieces = (tuple(layout.piece(m.shape, placement, s, rank)
                        for m, s in zip(out_metas, out_sbps)) if member else ())
        ctx = KernelContext(dev.prims, opdef.name, in_local,
                            tuple([gl.local_meta for gl in out_gls]), in_metas, out_metas,
                            pieces)
        super().__init__(opdef, attrs, in_metas, out_metas, dev, view_layout, ctx)
        self.placement = placement
        self.want = want
        self.boxes = in_sbps != want
        self.out_gls = tuple(out_gls)
        self.member = member
        self.random = opdef.random
        # Every rank advances the generator by the logical draw, so streams stay in step.
        self.words = (dev.prims.words_used("normal", sum(m.numel for m in out_metas))
                      if opdef.random else 0)
        self.creation_sbp = creation_sbp
        self.entry = (opdef.name, placement, in_metas, in_sbps, attrs)  # the checks' record
        self.fingerprint = _fingerprint(_describe(*self.entry)) if _MULTI else 0
        self.gdev = GlobalDevice(placement)  # where autograd makes zero gradients
        # Run inline where the local path would: a random op draws a fresh seed per call (a
        # context of its own), a variadic kernel takes a list, a view needs a cached layout.
        self.inline = (member and not opdef.random and not opdef.variadic
                       and (view_layout is not None or not opdef.view))

    def run(self, tensors, generator=None, checked=False):
        """Run the call on `tensors` (on its placement; SBPs as in the key): the checks
        across ranks, boxing to the wanted SBPs, the kernel on this rank's pieces (none
        outside the placement), autograd.  `checked`: the consistency check already ran."""
        if _CHECK:
            if not checked:
                _check_consistent(*self.entry)
        elif _MULTI and _DIVERGENCE.on:
            _world().check_global_ops(self.fingerprint, self.entry, _describe_entry)
        boxed = tensors
        if self.boxes:
            placement = self.placement
            boxed = [t if t._gl.sbp == s else box(t, placement, s)
                     for t, s in zip(tensors, self.want)]
            if self.view and boxed[0] is not tensors[0]:
                # A view of a boxed copy: reading it is right, writing through it would miss
                # the tensor, so in-place writes refuse it (interpreter._match_global).
                boxed[0]._boxed_copy_of = tensors[0]
        outs = interpreter._run_inline(self, boxed) if self.inline else None
        if outs is not None:
            if self.single:
                outs[0]._gl = self.out_gls[0]
            else:
                for o, gl in zip(outs, self.out_gls):
                    o._gl = gl
        else:
            outs = self._issue(boxed, generator)
        if self.creation_sbp is not None:  # a creation op (no tensors)
            outs = [box(o, self.placement, self.creation_sbp) for o in outs]
        elif self.grad and _grad_state.enabled:
            for t in tensors:
                # The property for views: a view of a base that gained history refreshes.
                if t._requires_grad or (t._base is not None and t.requires_grad):
                    interpreter._record(self.opdef, self.attrs, tensors, outs, self.in_metas,
                                        self.out_metas, self.gdev, saved=boxed)
                    break
        return outs[0] if self.single else tuple(outs)

    def _issue(self, boxed, generator):
        """The outputs, and the kernel handed to the VM as one instruction (members only)."""
        dev, member = self.dev, self.member
        outs, out_blobs = [], []
        if self.view:
            src, out_gl = boxed[0], self.out_gls[0]
            blob = Blob()
            if not member:
                strides, offset = _contiguous_strides(out_gl.local_meta.shape), 0
                blob.array = _empty_piece(out_gl.local_meta, dev.prims)
            elif self.view_layout is not None:
                strides, delta = self.view_layout
                offset = src._offset + delta
            else:  # view(dtype): the layout depends on the source's offset
                strides, offset = interpreter._view_layout(self.opdef, _local_alias(src),
                                                           out_gl.local_meta, self.attrs)
            outs.append(make(blob, self.out_metas[0], dev, out_gl, src._storage, strides,
                             offset))
            interpreter._link_view(outs[0], src, self.opdef, self.attrs)
            out_blobs.append(blob)
        else:
            for m, gl, strides, prims in zip(self.out_metas, self.out_gls, self.out_strides,
                                             self.prims):
                blob = Blob()
                if not member:
                    blob.array = _empty_piece(gl.local_meta, dev.prims)
                out = Tensor._output(blob, m, dev, strides, prims)
                out._gl = gl
                outs.append(out)
                out_blobs.append(blob)
        ctx = self.ctx
        if self.random:
            gen = default_generator if generator is None else generator
            seed, offset = gen.take(self.words)
            ctx = KernelContext(ctx.prims, ctx.op, ctx.in_metas, ctx.out_metas, ctx.logical_in,
                                ctx.logical_out, ctx.out_pieces, seed, offset)
        if member:
            _builder.op_call(self.name, self.kernel, ctx, self.attrs, [t._blob for t in boxed],
                             [t._storage for t in boxed], out_blobs,
                             () if self.view else [o._storage for o in outs],
                             variadic=self.opdef.variadic, view=self.view,
                             device_type=dev.type)
        return outs


def _view_of(opdef, src, boxed, src_piece, out_meta, out_gls, attrs, member):
    """A view call's layouts: out_gls[0] gets the logical strides (when not contiguous);
    returns this rank's (piece strides, offset from the source's offset), or None where it
    depends on the offset (view(dtype)) or this rank holds no piece.  `boxed`: the source is
    boxed first, to a fresh contiguous piece `src_piece`."""
    contiguous = _contiguous_strides
    logical = _LogicalLayout(src._meta, contiguous(src._meta.shape) if boxed else
                             (src._gl.strides or contiguous(src._meta.shape)), 0)
    lstrides = interpreter._view_layout(opdef, logical, out_meta, attrs)[0]
    if lstrides != contiguous(out_meta.shape):
        out_gls[0] = out_gls[0]._replace(strides=lstrides)
    if not member or out_meta.dtype != src._meta.dtype:
        return None
    piece = _LogicalLayout(src_piece, contiguous(src_piece.shape) if boxed else src._strides, 0)
    return interpreter._view_layout(opdef, piece, out_gls[0].local_meta, attrs)


_GLOBAL_CALLS: dict = {}
_GLOBAL_CALL_LIMIT = 65536


def _global_call(opdef, tensors, in_metas, in_sbps, placement, attrs, dev,
                 creation_sbp) -> _GlobalCall:
    """The cached call of `apply_global` (by bound attrs); made, and cached when its attrs are
    plain values, on a miss."""
    try:
        values = tuple(attrs.values())
        key = (opdef.name, in_metas, in_sbps, placement, values, tuple(map(type, values)),
               creation_sbp, id(dev), _dtypes._default_float)
        if opdef.view:  # the layouts depend on the source's (logical and piece) strides
            key = (key, tensors[0]._gl.strides, tensors[0]._strides)
        hit = _GLOBAL_CALLS.get(key)
    except TypeError:
        key, hit = None, None
    if hit is not None:
        return hit
    hit = _GlobalCall(opdef, tensors, in_metas, in_sbps, placement, attrs, dev, creation_sbp)
    if (key is not None and len(_GLOBAL_CALLS) < _GLOBAL_CALL_LIMIT
            and all(interpreter._plain(v) for v in values)):
        _GLOBAL_CALLS[key] = hit
    return hit


def _new_fast_call(opdef, inputs, attrs, key):
    """`interpreter.apply`'s miss on a call whose first input is global: the `_GlobalCall`
    (cached in opdef.global_calls under `key` when its attrs are plain values), or None where
    the general path must run it: a local input among global ones, inputs on several
    placements (0-d tensors are moved), the consistency check on (it runs before meta
    inference, which raises the errors about bad shapes)."""
    if _CHECK or len(inputs) != len(opdef.inputs):
        return None
    t0 = inputs[0]
    placement = t0._gl.placement
    for t in inputs:
        gl = t._gl
        if gl is None or (gl.placement is not placement and gl.placement != placement):
            return None
    attrs_given = attrs
    attrs = opdef.bind_attrs(attrs)
    in_metas = tuple([t._meta for t in inputs])
    in_sbps = tuple([t._gl.sbp for t in inputs])
    call = _global_call(opdef, inputs, in_metas, in_sbps, placement, attrs, t0._device, None)
    if (len(opdef.global_calls) < interpreter._LOCAL_CALL_LIMIT
            and all(interpreter._plain(v) for v in attrs_given.values())):
        opdef.global_calls[key] = call
    return call


def clear_call_caches() -> None:
    """Forget every cached global call (tests that count what a miss does)."""
    _GLOBAL_CALLS.clear()
    for name in registry.list_ops():
        registry.get(name).global_calls.clear()


_RANK: int | None = None


def _rank() -> int:
    global _RANK
    if _RANK is None:
        _RANK = comm.get_rank()
    return _RANK


def _common_placement(opdef, tensors):
    """(placement, tensors): the placement the op runs on (that of its tensors with axes), and
    the inputs with 0-d tensors from other placements moved to it as broadcast (OneFlow does
    the same); tensors with axes on different placements are an error."""
    placement = None
    for t in tensors:
        gl = t._gl
        if gl is None:
            raise op_error(
                opdef.name,
                "expected all tensors to be global, but got a local tensor among global ones "
                f"(local {t._type_name()} {list(t.shape)}); convert it with .to_global("
                "placement, sbp)",
            )
        if not t._meta.shape:
            continue
        if placement is None:
            placement = gl.placement
        elif gl.placement is not placement and gl.placement != placement:
            raise op_error(
                opdef.name,
                "expected all tensors to be on the same placement, but found at least two "
                f"placements, {placement} and {gl.placement}; move one with .to_global()",
            )
    if placement is None:  # only 0-d tensors: the first one's placement
        placement = tensors[0]._gl.placement
    if any(t._gl.placement is not placement and t._gl.placement != placement for t in tensors):
        tensors = [t if t._gl.placement == placement else
                   to_global(t, placement, (B,) * placement.ndim) for t in tensors]
    return placement, tensors


def apply_global(opdef, tensors, attrs, device=None, generator=None):
    """Run one op eagerly on global tensors (or create one on `device`, a GlobalDevice).

    The general path of global eager mode (the cached calls of `interpreter.apply` skip the
    placement and attr handling): keep it lean (see benchmarks/global_overhead.py).
    """
    if tensors:
        placement, tensors = _common_placement(opdef, tensors)
        dev = tensors[0]._device
        creation_sbp = None
    else:
        placement = device.placement
        dev = placement.device
        creation_sbp = device.sbp
    in_metas = tuple([t._meta for t in tensors])
    in_sbps = tuple([t._gl.sbp for t in tensors])
    if _CHECK:
        _check_consistent(opdef.name, placement, in_metas, in_sbps, attrs)
    call = _global_call(opdef, tensors, in_metas, in_sbps, placement, attrs, dev, creation_sbp)
    return call.run(tensors, generator, checked=True)


# -- consistency check ------------------------------------------------------------------------
_CHECK_BYTES = 512


def _describe(name, placement, in_metas, in_sbps, attrs) -> str:
    ins = ", ".join(
        f"{m.dtype.name}{list(m.shape)} {layout.fmt_sbp(s)}" for m, s in zip(in_metas, in_sbps)
    )
    attr_text = ", ".join(f"{k}={v!r}" for k, v in attrs.items())
    return f"{name}({ins}{'; ' if attr_text and ins else ''}{attr_text}) on ranks " \
           f"{placement.ranks}"


def _check_consistent(name, placement, in_metas, in_sbps, attrs) -> None:
    """All ranks exchange a fixed-size description of the op they are about to run."""
    text = _describe(name, placement, in_metas, in_sbps, attrs)
    raw = text.encode()[:_CHECK_BYTES]
    buf = np.zeros(_CHECK_BYTES, np.uint8)
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
    _drain_comm_stream()
    world = comm.world()
    everyone = world.all_gather(buf[None, :])
    mine = everyone[world.rank].tobytes()
    for r in range(world.size):
        theirs = everyone[r].tobytes()
        if theirs != mine:
            raise RuntimeError(
                "global consistency check failed: the ranks are not running the same global "
                f"op.\n  rank {world.rank} runs {text}\n  rank {r} runs "
                f"{theirs.rstrip(bytes(1)).decode(errors='replace')}"
            )


# The cheap check, on by default (`sbpflow.comm.set_divergence_check`): each global op and
# boxing folds a fingerprint of its description into a running hash that the ranks compare on
# the first calls and then on a sample (`sbpflow.comm.communicator.SequenceCheck`), on a
# private communicator, without draining the comm stream. The fingerprint hashes the text
# that the full check compares, computed once per cached `_GlobalCall`.
_MULTI = comm.is_multi_process()
_DIVERGENCE = comm.communicator.DIVERGENCE
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # reprs of objects differ between processes
_BOX_FPS: dict = {}
_WORLD = None


def _world():
    global _WORLD
    if _WORLD is None:
        _WORLD = comm.world()
    return _WORLD


def _fingerprint(text: str) -> int:
    digest = hashlib.blake2b(_ADDRESS.sub("", text).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _box_fingerprint(key) -> int:
    fp = _BOX_FPS.get(key)
    if fp is None:
        fp = _fingerprint(_describe_entry(("boxing",) + key))
        if len(_BOX_FPS) < 65536:
            _BOX_FPS[key] = fp
    return fp


def _describe_entry(entry) -> str:
    if entry[0] == "boxing":
        _, meta, src_placement, src_sbp, placement, sbp = entry
        return _describe("boxing", src_placement, (meta,), (src_sbp,),
                         {"to": f"{layout.fmt_sbp(sbp)} on ranks {placement.ranks}"})
    return _describe(*entry)


def _drain_comm_stream() -> None:
    vm = _builder.vm
    stream = vm.streams.get("comm")
    if stream is not None:
        stream.wait(stream.issued)
        vm.raise_pending()


# -- conversions (differentiable) ---------------------------------------------------------
def _normalize(op, placement, sbp, like: GlobalInfo | None):
    if placement is None:
        if like is None:
            raise TypeError(f"{op}(): a local tensor needs a placement")
        placement = like.placement
    if not isinstance(placement, Placement):
        raise TypeError(f"{op}(): argument 'placement' must be sbpflow.placement, got "
                        f"{type(placement).__name__}")
    if sbp is None:
        if like is None:
            raise TypeError(f"{op}(): a local tensor needs an sbp")
        if placement.ndim != like.placement.ndim:
            raise ValueError(f"{op}(): give an sbp for placement {placement} (the tensor's "
                             f"sbp {layout.fmt_sbp(like.sbp)} is for another hierarchy)")
        sbp = like.sbp
    return placement, layout.normalize_sbp(sbp, placement, op)


def to_global(t: Tensor, placement=None, sbp=None, *, grad_sbp=None, check_meta=True,
              copy=False) -> Tensor:
    """OneFlow's `Tensor.to_global`: local -> global treats t as this rank's piece (B: rank
    0's data wins; S: the logical tensor is the concatenation); global -> global boxes."""
    if interpreter._convert_lazy is not None:  # inside nn.Graph.build(): a boxing node
        traced = interpreter.lazy_convert("to_global", t, placement, sbp, grad_sbp)
        if traced is not None:
            return traced
    placement, sbp = _normalize("to_global", placement, sbp, t._gl)
    layout.check_split_axes(sbp, len(t._meta.shape))
    if grad_sbp is not None:
        grad_sbp = layout.normalize_sbp(grad_sbp, placement if t._gl is None else
                                        t._gl.placement, "to_global", "grad_sbp")
    if t._gl is None:
        return _local_to_global(t, placement, sbp, grad_sbp, check_meta)
    out = box(t, placement, sbp)
    if out is t and copy:
        out = _copy(t)
    if out is not t and is_grad_enabled() and t.requires_grad:
        src = t._gl
        node = _ToGlobalBackward(interpreter._edge(t), src.placement,
                                 grad_sbp or layout.dual(src.sbp), t._meta)
        out._set_grad_fn(node, 0)
    return out


def _copy(t: Tensor) -> Tensor:
    return apply_global(registry.get("clone"), [t], {})


def to_local(t: Tensor, *, copy: bool = False) -> Tensor:
    """This rank's piece as a local tensor sharing memory (OneFlow's `to_local`)."""
    if interpreter._convert_lazy is not None:  # inside nn.Graph.build(): a boxing node
        traced = interpreter.lazy_convert("to_local", t)
        if traced is not None:
            return traced if not copy else traced.clone()
    gl = t._gl
    if gl is None:
        raise RuntimeError("to_local(): expected a global tensor, but got a local tensor; "
                           "only global tensors have a local piece")
    # As OneFlow: this rank's piece lives on `<type>:<local rank>` (cpu:1 on local rank 1).
    out = Tensor._make(t._blob, gl.local_meta, _piece_device(t._device), t._storage, t._strides,
                       t._offset)
    if copy:
        out = interpreter.apply(registry.get("clone"), (out,), {})
    if is_grad_enabled() and t.requires_grad:
        out._set_grad_fn(_ToLocalBackward(interpreter._edge(t), gl, t._meta), 0)
    return out


def _piece_device(dev: Device) -> Device:
    """The device OneFlow gives this rank's local piece: the type with the local rank."""
    return Device(dev.type, comm.get_local_rank())


def _local_to_global(t, placement, sbp, grad_sbp, check_meta) -> Tensor:
    rank = _rank()
    meta = _logical_meta(t, placement, sbp, check_meta)
    local_meta = _local_meta(meta, placement, sbp, rank)
    gl = GlobalInfo(placement, sbp, local_meta)
    dev = Device(t._device.type)  # a piece from to_local() is on cpu:<local rank>: drop it
    bcast_axes = [k for k, x in enumerate(sbp) if x == B and placement.hierarchy[k] > 1]
    if not placement.has(rank):
        blob = Blob(_empty_piece(local_meta, dev.prims))
        out = make(blob, meta, dev, gl)
    elif bcast_axes:
        out = make(Blob(), meta, dev, gl)
        _broadcast_piece(t, out, placement, bcast_axes, rank)
    else:
        if not t.is_contiguous():  # the logical layout is contiguous: so is every piece
            t = t.contiguous()
        out = make(t._blob, meta, dev, gl, t._storage, t._strides, t._offset)
    if is_grad_enabled() and t.requires_grad:
        out._set_grad_fn(_LocalToGlobalBackward(interpreter._edge(t), gl,
                                                grad_sbp or layout.dual(sbp), meta), 0)
    return out


def _broadcast_piece(t, out, placement, axes, rank):
    """B axes of a local -> global conversion: the rank at coordinate 0 of each wins."""
    in_blob, out_blob = t._blob, out._blob
    world = comm.world()
    groups = [placement.axis_ranks(rank, k) for k in axes]

    def run():
        buf = np.array(in_blob.array, order="C", copy=True)
        for ranks in groups:
            world.group(ranks).broadcast(buf, root=0)
        out_blob.array = buf

    _builder.collective("to_global(broadcast)", run, ins=(in_blob,), outs=(out_blob,),
                        reads=(t._storage,), writes=(out._storage,))


_META_INTS = 2 + 16


def _logical_meta(t, placement, sbp, check_meta) -> TensorMeta:
    local = t._meta
    if len(local.shape) > 16:
        raise ValueError("to_global(): tensors of more than 16 dimensions are not supported")
    if not check_meta or placement.size == 1:
        shape = list(local.shape)
        for k, x in enumerate(sbp):
            if x != B and x != P:
                shape[x.axis] *= placement.hierarchy[k]
        return TensorMeta(tuple(shape), local.dtype) if placement.size > 1 or not check_meta \
            else local
    return _exchange_metas(t, placement, sbp)


def _exchange_metas(t, placement, sbp) -> TensorMeta:
    """check_meta: every rank shares its piece's meta; the pieces must fit one logical tensor
    under a balanced split, with one dtype."""
    from .._core import dtype as dt

    names = [d.name for d in dt.ALL]
    world = comm.world()
    rank = world.rank
    mine = np.zeros(_META_INTS, np.int64)
    mine[0] = 1 if placement.has(rank) else 0
    mine[1] = names.index(t._meta.dtype.name)
    mine[2] = len(t._meta.shape)
    mine[3:3 + len(t._meta.shape)] = t._meta.shape
    _drain_comm_stream()
    table = world.all_gather(mine[None, :])
    members = placement.rank_list
    first = table[members[0]]
    dtype = dt.as_dtype(names[int(first[1])])
    ndim = int(first[2])
    for r in members:
        row = table[r]
        if int(row[1]) != int(first[1]) or int(row[2]) != ndim:
            raise RuntimeError(
                f"to_global(): check_meta failed: rank {members[0]} has a {names[int(first[1])]}"
                f" tensor of {ndim} dims but rank {r} has a {names[int(row[1])]} tensor of "
                f"{int(row[2])} dims"
            )
    layout.check_split_axes(sbp, ndim)
    shape = [int(x) for x in first[3:3 + ndim]]
    # The logical extent of a split axis: the pieces of the ranks that differ from the first
    # member only on the grid axes splitting it (one line, or a sub-grid for nested splits).
    c0 = placement.coords(members[0])
    for a in {x.axis for x in sbp if x != B and x != P}:
        cutting = {k for k, x in enumerate(sbp) if x != B and x != P and x.axis == a}
        shape[a] = sum(int(table[r][3 + a]) for r in members
                       if all(c == c0[k] for k, c in enumerate(placement.coords(r))
                              if k not in cutting))
    meta = TensorMeta(tuple(shape), dtype)
    for r in members:
        want = layout.local_shape(meta.shape, placement, sbp, r)
        got = tuple(int(x) for x in table[r][3:3 + ndim])
        if got != want:
            raise RuntimeError(
                f"to_global(): check_meta failed: rank {r}'s local tensor has shape "
                f"{list(got)}, but the logical shape {list(meta.shape)} with sbp "
                f"{layout.fmt_sbp(sbp)} gives rank {r} a piece of shape {list(want)} (pieces "
                "of a split are balanced: the first ranks get one more row)"
            )
    return meta


class _ToGlobalBackward(Node):
    """Backward of global -> global: the gradient boxes back to the source placement, with
    the dual SBP (B <-> P, S stays) unless `grad_sbp` was given."""

    __slots__ = ("placement", "sbp", "in_metas", "out_metas")

    def __init__(self, edge, placement, sbp, meta):
        super().__init__((edge,))
        self.placement, self.sbp = placement, sbp
        self.in_metas = self.out_metas = (meta,)

    def name(self) -> str:
        return "ToGlobalBackward"

    def apply(self, grads):
        return [to_global(grads[0], self.placement, self.sbp)]


class _LocalToGlobalBackward(Node):
    __slots__ = ("gl", "sbp", "in_metas", "out_metas")

    def __init__(self, edge, gl, grad_sbp, meta):
        super().__init__((edge,))
        self.gl, self.sbp = gl, grad_sbp
        self.in_metas = (gl.local_meta,)
        self.out_metas = (meta,)

    def name(self) -> str:
        return "LocalToGlobalBackward"

    def apply(self, grads):
        return [to_local(to_global(grads[0], self.gl.placement, self.sbp))]


class _ToLocalBackward(Node):
    """Backward of to_local: the local gradient is the piece of a global one, same SBP."""

    __slots__ = ("gl", "in_metas", "out_metas")

    def __init__(self, edge, gl, meta):
        super().__init__((edge,))
        self.gl = gl
        self.in_metas = (meta,)
        self.out_metas = (gl.local_meta,)

    def name(self) -> str:
        return "ToLocalBackward"

    def apply(self, grads):
        g = grads[0].contiguous()
        gl = self.gl
        piece = gl._replace(local_meta=g._meta, strides=None)
        out = make(g._blob, self.in_metas[0], g._device, piece,
                   g._storage, g._strides, g._offset)
        if is_grad_enabled() and g.requires_grad:
            out._set_grad_fn(_LocalToGlobalBackward(interpreter._edge(g), gl, gl.sbp,
                                                    self.in_metas[0]), 0)
        return [out]


def tensor_to_global(input, placement=None, sbp=None, *, grad_sbp=None,  # noqa: A002
                     check_meta=True, copy=False) -> Tensor:
    """`flow.to_global(input, placement, sbp)`: OneFlow's function form of Tensor.to_global."""
    if not isinstance(input, Tensor):
        raise TypeError(f"to_global(): argument 'input' must be Tensor, not "
                        f"{type(input).__name__}")
    return to_global(input, placement, sbp, grad_sbp=grad_sbp, check_meta=check_meta,
                     copy=copy)


def tensor_to_local(input, *, copy: bool = False) -> Tensor:  # noqa: A002
    """`flow.to_local(input)`: OneFlow's function form of Tensor.to_local."""
    if not isinstance(input, Tensor):
        raise TypeError(f"to_local(): argument 'input' must be Tensor, not "
                        f"{type(input).__name__}")
    return to_local(input, copy=copy)


# -- host values -------------------------------------------------------------------------------
def logical_host(t: Tensor) -> np.ndarray:
    """The logical value on every rank: box to B over all ranks, then read the piece.
    A collective: every rank must call it."""
    everyone = Placement.all(t._gl.placement.type)
    full = box(t, everyone, (B,))
    return full._device.prims.to_host(_local_alias(full)._data)



def from_logical(host: np.ndarray, dtype, where: GlobalDevice) -> Tensor:
    """A global tensor whose logical value is `host` (every rank passes the same array and
    keeps its own piece; no communication)."""
    placement = where.placement
    sbp = where.sbp if where.sbp is not None else (B,) * placement.ndim
    layout.check_split_axes(sbp, host.ndim, "tensor")
    dev = placement.device
    meta = TensorMeta(tuple(int(n) for n in host.shape), dtype)
    rank = _rank()
    made = tuple(B if x == P else x for x in sbp)  # P: made as B, then boxed (no comm)
    gl = GlobalInfo(placement, made, _local_meta(meta, placement, made, rank))
    if placement.has(rank):
        part = host[layout.piece(meta.shape, placement, made, rank)]
        blob = Blob(dev.prims.from_host(np.require(part, requirements="C"), dtype))  # 0-d too
    else:
        blob = Blob(_empty_piece(gl.local_meta, dev.prims))
    t = make(blob, meta, dev, gl)
    return box(t, placement, sbp)


interpreter.set_global_apply(apply_global, _new_fast_call)
