"""Resampling: nearest / linear / bicubic upsampling and im2col / col2im (unfold / fold).

Every interpolation mode torch offers is separable: output position o along a spatial axis
reads a few input positions idx[t, o] with weights w[t, o] (one tap for nearest, two for
linear, four for bicubic), and the axes are resampled one after another.  The taps are built
on the host from the sizes alone, with torch's coordinate rules (`_plan`), and cached.  No
loop runs per pixel: nearest gathers every axis at once; linear and bicubic multiply a small
axis by its dense (out, in) map in one GEMM, and a large axis gathers once per tap and sums
the weighted gathers.  The gradient is the adjoint, axis by axis (`upsample_*_grad`): the
transposed map, or, on a large axis, differences of prefix sums (a tap's indices never
decrease, so the outputs feeding one input are a run).  Its own gradient is the forward op.

torch computes the source coordinates in the op's accumulation type (float32 for float32
and half inputs, float64 for float64) and the nearest indices always in float32; the plans
do the same so the chosen pixels and weights agree bit for bit on the boundaries.

`im2col` lays out every sliding block of a batched 2-D input as columns (torch's unfold) and
`col2im` sums columns back into an image (torch's fold); each is the other's adjoint, so each
is the other's gradient.

The ops take batched input (N, C, *spatial); the functional layer adds and removes the batch
axis, computes output sizes from scale factors and picks the op for the mode.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from .registry import Attr, OpDef, Sample, op, register

_AXES = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}
_CUBIC_A = -0.75  # torch's (and OpenCV's) bicubic convolution constant


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _compute_dtype(d: dt.DType) -> dt.DType:
    # Halves resample in float32, which is also torch's accumulation type for them.
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


def _to(ctx, a, have: dt.DType, want: dt.DType):
    return a if have is want else ctx.prims.cast(a, want)


# -- host-side plans: torch's coordinate rules --------------------------------------------------
def _scale_value(scale, in_size: int, out_size: int, ftype):
    """torch's compute_scales_value: 1/scale where a positive scale was given, else in/out."""
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(in_size) / ftype(out_size)


def _area_scale(scale, in_size, out_size, align_corners, ftype):
    """torch's area_pixel_compute_scale."""
    if align_corners:
        return ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
    return _scale_value(scale, in_size, out_size, ftype)


def _source_coords(scale, out_size, align_corners, cubic, ftype):
    """torch's area_pixel_compute_source_index for every output position, in ftype."""
    dst = np.arange(out_size, dtype=ftype)
    if align_corners:
        return scale * dst
    src = scale * (dst + ftype(0.5)) - ftype(0.5)
    return src if cubic else np.maximum(src, ftype(0))


def _guard(src, in_size):
    """torch's guard_index_and_lambda: floor index (at most in-1) and its fraction in [0, 1]."""
    index = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.clip(src - index.astype(src.dtype), 0, 1).astype(src.dtype)
    return index, lam


def _cubic_weights(t, a=_CUBIC_A):
    """torch's get_cubic_upsample_coefficients for fractions t: (4, len(t))."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    one = t.dtype.type(1)
    return np.stack([far(t + one), near(t), near(one - t), far(2 * one - t)]).astype(t.dtype)


@functools.lru_cache(maxsize=512)
def _plan(kind: str, in_size: int, out_size: int, scale, align_corners: bool, np_dtype,
          shortcuts: bool = False):
    """(idx (T, out) int64, weights (T, out) or None) for one axis; None for an identity.

    `shortcuts`: torch's legacy nearest rule for equal and doubled sizes (whatever the
    scale).  Trap: torch's 2-D nearest forward and every nearest backward apply it, its 1-D
    and 3-D forwards do not, so with an explicit scale torch's 1-D/3-D gradient is not the
    adjoint of its forward; these ops copy torch on both sides.
    """
    ftype = np.dtype(np_dtype).type
    if kind in ("nearest", "nearest-exact"):
        s = _scale_value(scale, in_size, out_size, np.float32)  # always float, as torch
        dst = np.arange(out_size)
        if kind == "nearest" and shortcuts and out_size in (in_size, 2 * in_size):
            if out_size == in_size:
                return None
            idx = dst >> 1
        elif kind == "nearest":
            idx = np.floor(dst.astype(np.float32) * s).astype(np.int64)
        else:  # (dst + 0.5) is a double in torch, rounded to float by floorf
            idx = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32)).astype(np.int64)
        idx = np.minimum(idx, in_size - 1)
        if np.array_equal(idx, np.arange(in_size)):
            return None
        idx = idx[None]
        idx.setflags(write=False)
        return idx, None
    s = _area_scale(scale, in_size, out_size, align_corners, ftype)
    if kind == "linear":
        if out_size == in_size:  # torch's shortcut, whatever the scale
            return None
        i0, lam = _guard(_source_coords(s, out_size, align_corners, False, ftype), in_size)
        i1 = i0 + (i0 < in_size - 1)
        idx = np.stack([i0, i1])
        w = np.stack([ftype(1) - lam, lam])
    else:  # cubic
        base, t = _guard(_source_coords(s, out_size, align_corners, True, ftype), in_size)
        idx = np.clip(base[None] + np.arange(-1, 3)[:, None], 0, in_size - 1)
        w = _cubic_weights(t)
    idx.setflags(write=False)
    w.setflags(write=False)
    return idx, w


def _plans(kind, in_spatial, out_spatial, scales, align_corners, cdt, shortcuts):
    """[(plan key, plan)] per axis; the key also names the axis' dense map (_matrix)."""
    scales = scales if scales is not None else (None,) * len(in_spatial)
    keys = [(kind, i, o, s, bool(align_corners), cdt.np, shortcuts)
            for i, o, s in zip(in_spatial, out_spatial, scales, strict=True)]
    return [(key, _plan(*key)) for key in keys]


@functools.lru_cache(maxsize=512)
def _run_bounds(idx: bytes, in_size: int):
    """For a nondecreasing index row: (starts, ends) with output positions
    [starts[i], ends[i]) reading input i."""
    row = np.frombuffer(idx, dtype=np.int64)
    if np.any(np.diff(row) < 0):
        raise AssertionError("resample plan indices must be nondecreasing")
    targets = np.arange(in_size)
    return (np.searchsorted(row, targets, "left").astype(np.int64),
            np.searchsorted(row, targets, "right").astype(np.int64))


# An axis whose (out, in) map has at most this many entries is resampled by one matmul with
# the dense map: BLAS runs the few extra multiply-adds by zero faster than NumPy runs the
# per-tap gathers, weighting and sums (or, for the adjoint, the prefix sums).
_DENSE_MAX = 1 << 17


def _dense_ok(in_size: int, out_size: int) -> bool:
    return in_size * out_size <= _DENSE_MAX


@functools.lru_cache(maxsize=256)
def _matrix(key: tuple, transpose: bool = False) -> np.ndarray:
    """The (out, in) map of the axis with plan key `key` (float64 holding the plan's
    weights), or its transpose."""
    idx, w = _plan(*key)
    in_size, out = key[1], idx.shape[1]
    m = np.zeros((out, in_size))
    rows = np.arange(out)
    for t in range(idx.shape[0]):
        np.add.at(m, (rows, idx[t]), 1.0 if w is None else w[t].astype(np.float64))
    m = np.ascontiguousarray(m.T if transpose else m)
    m.setflags(write=False)
    return m


def _matmul_axis(ctx, x, shape, axis, m, cdt):
    """Multiply axis `axis` of x (shape `shape`) by host matrix m (new, size)."""
    lead, size, rest = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if axis == len(shape) - 1:  # (lead, size) @ (size, new)
        y = ctx.prims.matmul(ctx.prims.reshape(x, (lead, size)),
                             ctx.prims.from_host(np.ascontiguousarray(m.T), cdt))
    else:
        # (new, size) @ (size, lead * rest) as one GEMM, the axis moved to the front and back:
        # NumPy runs a matrix broadcast against a stack of matrices without BLAS, ~20x slower
        # than the two copies.
        xt = ctx.prims.permute(ctx.prims.reshape(x, (lead, size, rest)), (1, 0, 2))
        xt = ctx.prims.reshape(ctx.prims.contiguous(xt), (size, lead * rest))
        y = ctx.prims.matmul(ctx.prims.from_host(m, cdt), xt)
        y = ctx.prims.permute(ctx.prims.reshape(y, (m.shape[0], lead, rest)), (1, 0, 2))
        y = ctx.prims.contiguous(y)
    return ctx.prims.reshape(y, tuple(shape[:axis]) + (m.shape[0],) + tuple(shape[axis + 1:]))


def _along(axis, index):
    return (slice(None),) * axis + (index,)


def _gather_all(ctx, x, plans):
    """Nearest resampling of every axis at once: one gather with an outer-product index
    (an axis left alone is indexed by arange: advanced indices split by a slice would move
    to the front)."""
    n = len(plans)
    key = [slice(None), slice(None)]
    for i, plan in enumerate(plans):
        row = np.arange(ctx.in_metas[0].shape[2 + i]) if plan is None else plan[0][0]
        shape = [1] * n
        shape[i] = row.shape[0]
        key.append(ctx.prims.from_host(row.reshape(shape), dt.int64))
    return ctx.prims.index(x, tuple(key))


def _gather_axis(ctx, x, axis, plan, cdt):
    """Resample axis `axis` of x: the weighted sum of one gather per tap."""
    idx, w = plan
    out = idx.shape[1]
    bshape = (out,) + (1,) * (len(ctx.in_metas[0].shape) - 1 - axis)
    acc = None
    for t in range(idx.shape[0]):
        v = ctx.prims.index(x, _along(axis, ctx.prims.from_host(idx[t], dt.int64)))
        if w is not None:
            v = ctx.prims.binary("mul", v, ctx.prims.from_host(w[t].reshape(bshape), cdt))
        acc = v if acc is None else ctx.prims.binary("add", acc, v)
    return acc


def _adjoint_axis(ctx, g, axis, plan, in_size, adt):
    """The adjoint of _gather_axis, in accumulation dtype adt.

    Each tap's indices are nondecreasing, so the output positions feeding one input are a
    run: its sum is the difference of two prefix sums at the run's ends.  Two gathers per
    tap, no scatter and no per-element index array; adt is float64 so the differences of
    prefix sums lose nothing that matters.
    """
    idx, w = plan
    ndim = len(ctx.in_metas[0].shape)
    bshape = (idx.shape[1],) + (1,) * (ndim - 1 - axis)
    widths = ((0, 0),) * axis + ((1, 0),) + ((0, 0),) * (ndim - 1 - axis)
    acc = None
    for t in range(idx.shape[0]):
        v = g
        if w is not None:
            v = ctx.prims.binary("mul", g, ctx.prims.from_host(w[t].reshape(bshape), adt))
        prefix = ctx.prims.pad(ctx.prims.scan("cumsum", v, axis, adt), widths, "constant", 0)
        starts, ends = _run_bounds(np.ascontiguousarray(idx[t], dtype=np.int64).tobytes(),
                                   in_size)
        hi = ctx.prims.index(prefix, _along(axis, ctx.prims.from_host(ends, dt.int64)))
        lo = ctx.prims.index(prefix, _along(axis, ctx.prims.from_host(starts, dt.int64)))
        part = ctx.prims.binary("sub", hi, lo)
        acc = part if acc is None else ctx.prims.binary("add", acc, part)
    return acc


# -- upsampling ops -------------------------------------------------------------------------
_KIND = {"upsample_nearest": None, "upsample_linear": "linear",
         "upsample_bicubic2d": "cubic"}


def _kind_of(name, attrs):
    k = _KIND[name]
    if k is None:
        return "nearest-exact" if attrs.get("exact") else "nearest"
    return k


def _aten_name(name, n, exact=False):
    if name == "upsample_nearest":
        return f"_upsample_nearest_exact{n}d" if exact else f"upsample_nearest{n}d"
    if name == "upsample_linear":
        return {1: "upsample_linear1d", 2: "upsample_bilinear2d", 3: "upsample_trilinear3d"}[n]
    return "upsample_bicubic2d"


def _check_scales(name, scales, n):
    if scales is None:
        return
    if not isinstance(scales, tuple) or len(scales) != n or not all(
            s is None or isinstance(s, (int, float)) and not isinstance(s, bool) for s in scales):
        raise op_error(name, f"scales must be None or a tuple of {n} floats (or None), got "
                       f"{scales!r}", TypeError)


def _sizes_str(n, sizes):
    return ", ".join(f"{a}: {s}" for a, s in zip(_AXES[n], sizes, strict=True))


def _check_upsample(name, x: TensorMeta, n, in_spatial, out_spatial, attrs, ranks):
    aten = _aten_name(name, n, attrs.get("exact", False))
    if n not in ranks:
        raise op_error(name, f"expected {', '.join(str(r + 2) for r in ranks)}-D input, got "
                       f"input of size {list(x.shape)}")
    if len(out_spatial) != n:
        raise op_error(aten, f"It is expected output_size equals to {n}, but got size "
                       f"{len(out_spatial)}")
    if any(s == 0 for s in x.shape[1:]) and x.ndim == n + 2:
        raise op_error(aten, f"Non-empty {n + 2}D data tensor expected but got a tensor with "
                       f"sizes {list(x.shape)}")
    if any(s <= 0 for s in in_spatial) or any(s <= 0 for s in out_spatial):
        raise op_error(aten, "Input and output sizes should be greater than 0, but got input "
                       f"({_sizes_str(n, in_spatial)}) output ({_sizes_str(n, out_spatial)})")
    _check_scales(name, attrs.get("scales"), n)
    allowed = x.dtype.is_floating_point or (name == "upsample_nearest" and x.dtype is dt.uint8)
    if not allowed:
        raise op_error(aten, f"\"{aten}\" not implemented for '{x.dtype.name}'",
                       NotImplementedError)


def _upsample_meta(name, ranks):
    def meta(x, output_size, scales=None, **attrs):
        n = x.ndim - 2
        _check_upsample(name, x, n, tuple(x.shape[2:]), tuple(output_size),
                        dict(attrs, scales=scales), ranks)
        return TensorMeta(tuple(x.shape[:2]) + tuple(output_size), x.dtype)

    return meta


def _upsample_grad_meta(name, ranks):
    fwd = name[: -len("_grad")]

    def meta(g, input_size, scales=None, **attrs):
        n = g.ndim - 2
        if len(input_size) != n:
            raise op_error(name, f"input_size {list(input_size)} has {len(input_size)} entries "
                           f"for a grad_output of {n} spatial dims {list(g.shape)}")
        _check_upsample(fwd, g, n, tuple(input_size), tuple(g.shape[2:]),
                        dict(attrs, scales=scales), ranks)
        if not g.dtype.is_floating_point:
            raise op_error(name, f"expected a floating grad_output, got {g.dtype.name}",
                           TypeError)
        return TensorMeta(tuple(g.shape[:2]) + tuple(input_size), g.dtype)

    return meta


def _upsample_kernel(name):
    def kernel(ctx, x, output_size, scales=None, align_corners=False, exact=False):
        xm = ctx.in_metas[0]
        want = ctx.out_metas[0].dtype
        kind = _kind_of(name, {"exact": exact})
        cdt = want if kind.startswith("nearest") else _compute_dtype(want)
        keyed = _plans(kind, xm.shape[2:], tuple(output_size), scales, align_corners, cdt,
                       shortcuts=xm.ndim == 4)
        plans = [plan for _, plan in keyed]
        if all(plan is None for plan in plans):
            return ctx.prims.contiguous(x)
        if kind.startswith("nearest"):
            return _gather_all(ctx, x, plans)
        y = _to(ctx, x, xm.dtype, cdt)
        shape = tuple(xm.shape)
        for i, (key, plan) in enumerate(keyed):
            if plan is None:
                continue
            if _dense_ok(shape[2 + i], output_size[i]):
                y = _matmul_axis(ctx, y, shape, 2 + i, _matrix(key), cdt)
            else:
                y = _gather_axis(ctx, y, 2 + i, plan, cdt)
            shape = shape[:2 + i] + (output_size[i],) + shape[3 + i:]
        return _to(ctx, y, cdt, want)

    return kernel


def _upsample_grad_kernel(name):
    fwd = name[: -len("_grad")]

    def kernel(ctx, g, input_size, scales=None, align_corners=False, exact=False):
        gm = ctx.in_metas[0]
        want = ctx.out_metas[0].dtype
        cdt = _compute_dtype(want)
        kind = _kind_of(fwd, {"exact": exact})
        keyed = _plans(kind, tuple(input_size), gm.shape[2:], scales, align_corners, cdt,
                       shortcuts=True)
        plans = [plan for _, plan in keyed]
        if kind == "cubic" and tuple(input_size) == tuple(gm.shape[2:]):
            # torch's bicubic backward copies when the sizes agree, whatever the scales
            # (its forward still resamples): copy torch.
            plans = [None] * len(plans)
        if all(plan is None for plan in plans):
            return ctx.prims.contiguous(g)
        out = tuple(gm.shape[2:])
        dense = [plan is None or _dense_ok(n, o)
                 for plan, n, o in zip(plans, input_size, out, strict=True)]
        adt = cdt if all(dense) else dt.float64  # prefix sums run in float64
        y = _to(ctx, g, gm.dtype, adt)
        shape = tuple(gm.shape)
        for i, plan in enumerate(plans):
            if plan is None:
                continue
            if dense[i]:
                y = _matmul_axis(ctx, y, shape, 2 + i, _matrix(keyed[i][0], True), adt)
            else:
                y = _adjoint_axis(ctx, y, 2 + i, plan, input_size[i], adt)
            shape = shape[:2 + i] + (input_size[i],) + shape[3 + i:]
        return _to(ctx, y, adt, want)

    return kernel


def _mode_attrs(attrs):
    return {k: attrs[k] for k in ("scales", "align_corners", "exact") if k in attrs}


def _upsample_grad_rule(name):
    def grad(ctx, g):
        return (op(f"{name}_grad", g, input_size=ctx.in_metas[0].shape[2:],
                   **_mode_attrs(ctx.attrs)),)

    return grad


def _upsample_grad_grad_rule(fwd):
    def grad(ctx, gg):
        attrs = _mode_attrs(ctx.attrs)
        out = ctx.in_metas[0].shape[2:]
        size = ctx.attrs["input_size"]
        scales = attrs.get("scales")
        # The grad ops copy torch's backward shortcuts (nearest: equal and doubled sizes;
        # bicubic: all sizes equal).  Their adjoint is the forward op without a scale on those
        # axes, which maps the same pixels the shortcut does (torch's double backward uses
        # its scaled forward there instead, which is not the adjoint).
        if scales is not None and fwd == "upsample_nearest" and not attrs.get("exact"):
            attrs["scales"] = tuple(None if o in (i, 2 * i) else s
                                    for i, o, s in zip(size, out, scales, strict=True))
        elif scales is not None and fwd == "upsample_bicubic2d" and tuple(size) == tuple(out):
            attrs["scales"] = None
        return (op(fwd, gg, output_size=out, **attrs),)

    return grad


def _upsample_sbp(x, *args, **kwargs):
    sigs = [Signature((B,), (B,))]
    for axis in (0, 1):
        if x.shape[axis] > 1:  # (Si)->Si: samples and channels resample independently
            sigs.append(Signature((Split(axis),), (Split(axis),)))
    if x.dtype.is_floating_point:
        sigs.append(Signature((P,), (P,)))  # (P)->P: a linear map of the input
    return sigs


def _aten_args(torch, name, n, output_size, scales, align_corners, exact):
    scales = tuple(scales) if scales is not None else (None,) * n
    fn = getattr(torch.ops.aten, _aten_name(name, n, exact))
    args = (list(output_size),) + (() if name == "upsample_nearest" else (align_corners,))
    return fn, args + scales


def _torch_upsample(name):
    def ref(torch, x, output_size, scales=None, align_corners=False, exact=False):
        fn, args = _aten_args(torch, name, x.ndim - 2, output_size, scales, align_corners, exact)
        return fn(x, *args)

    return ref


def _torch_upsample_grad(name):
    fwd = name[: -len("_grad")]

    def ref(torch, g, input_size, scales=None, align_corners=False, exact=False):
        fn, args = _aten_args(torch, fwd, g.ndim - 2, g.shape[2:], scales, align_corners, exact)
        x = torch.zeros(tuple(g.shape[:2]) + tuple(input_size), dtype=g.dtype,
                        requires_grad=True)
        with torch.enable_grad():
            (gx,) = torch.autograd.grad(fn(x, *args), x, g, create_graph=True)
        return gx

    return ref


def _nearest_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 5), output_size=(9,)),
        Sample(r(2, 2, 3, 4), output_size=(6, 8)),
        Sample(r(2, 2, 5, 4), output_size=(3, 7), exact=True),
        Sample(r(2, 2, 4, 5), output_size=(6, 12), scales=(1.7, 2.5)),
        Sample(r(2, 2, 7, 5), output_size=(3, 5), scales=(0.45, 1.0), exact=True),
        Sample(r(1, 2, 3, 2, 4), output_size=(5, 4, 3)),
        Sample(r(2, 2, 3, 4, dtype=np.float32), output_size=(7, 5)),
        Sample((np.abs(r(2, 2, 3, 3)) * 50).astype(np.uint8), output_size=(5, 4), grad=False),
    ]


def _linear_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 5), output_size=(9,)),
        Sample(r(2, 2, 6), output_size=(4,), align_corners=True),
        Sample(r(2, 2, 3, 4), output_size=(7, 8)),
        Sample(r(2, 2, 5, 4), output_size=(3, 9), align_corners=True),
        Sample(r(2, 2, 4, 5), output_size=(6, 12), scales=(1.7, 2.5)),
        Sample(r(2, 2, 3, 4), output_size=(1, 4), align_corners=True),
        Sample(r(1, 2, 3, 2, 4), output_size=(5, 4, 3)),
        Sample(r(1, 2, 3, 4, 2), output_size=(4, 2, 5), align_corners=True),
        Sample(r(2, 2, 3, 4, dtype=np.float32), output_size=(7, 5)),
    ]


def _bicubic_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 2, 3, 4), output_size=(7, 8)),
        Sample(r(2, 2, 5, 4), output_size=(3, 9), align_corners=True),
        Sample(r(2, 2, 4, 5), output_size=(6, 12), scales=(1.7, 2.5)),
        Sample(r(2, 3, 5, 6), output_size=(2, 3)),
        Sample(r(2, 2, 3, 4, dtype=np.float32), output_size=(7, 5)),
    ]


def _grad_samples(samples):
    """Grad-op samples from the forward samples: cotangents of the output's shape.  (No
    samples on torch's backward shortcuts: there torch's double backward is not the adjoint
    of its backward, so no rule passes both the torch and the finite-difference checks.)"""
    def make(rng):
        out = []
        for s in samples(rng):
            x = s.inputs[0]
            if x.dtype.kind != "f":
                continue
            attrs = dict(s.attrs)
            size = attrs.pop("output_size")
            g = rng.standard_normal(x.shape[:2] + tuple(size)).astype(x.dtype)
            out.append(Sample(g, input_size=x.shape[2:], **attrs))
        return out

    return make


_UPSAMPLE = {
    "upsample_nearest": ((1, 2, 3), {"exact": Attr("bool", False)}, _nearest_samples,
                         "nearest (or, with exact=True, nearest-exact) upsampling, 1-D to 3-D"),
    "upsample_linear": ((1, 2, 3), {"align_corners": Attr("bool", False)}, _linear_samples,
                        "linear, bilinear or trilinear upsampling (separable), 1-D to 3-D"),
    "upsample_bicubic2d": ((2,), {"align_corners": Attr("bool", False)}, _bicubic_samples,
                           "bicubic upsampling (A = -0.75, clamped borders), 2-D"),
}

for _name, (_ranks, _extra, _samples, _doc) in _UPSAMPLE.items():
    _scales = {"scales": Attr("any", None)}
    register(OpDef(
        _name,
        inputs=("input",),
        attrs={"output_size": Attr("ints"), **_scales, **_extra},
        infer_meta=_upsample_meta(_name, _ranks),
        kernel=_upsample_kernel(_name),
        saves=(),
        grad=_upsample_grad_rule(_name),
        sbp=_upsample_sbp,
        reference=_torch_upsample(_name),
        samples=_samples,
        doc=f"{_doc}: per-axis gathers with host-built indices and weights.",
    ))
    register(OpDef(
        f"{_name}_grad",
        inputs=("grad_output",),
        attrs={"input_size": Attr("ints"), **_scales, **_extra},
        infer_meta=_upsample_grad_meta(f"{_name}_grad", _ranks),
        kernel=_upsample_grad_kernel(f"{_name}_grad"),
        saves=(),
        grad=_upsample_grad_grad_rule(_name),
        sbp=_upsample_sbp,
        reference=_torch_upsample_grad(f"{_name}_grad"),
        samples=_grad_samples(_samples),
        doc=f"Gradient of {_name}: per-axis scatter-adds of the weighted cotangent.",
    ))


# -- im2col / col2im (unfold / fold) -------------------------------------------------------------
def _pair(name, arg, v):
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) == 1:
        return v * 2
    if len(v) != 2:
        raise op_error(name, f"It is expected {arg} equals to 2, but got size {len(v)}")
    return v


def _check_block_args(name, kernel_size, dilation, padding, stride):
    k, d, p, s = (_pair(name, a, v) for a, v in (("kernel_size", kernel_size),
                                                  ("dilation", dilation),
                                                  ("padding", padding), ("stride", stride)))
    if min(k) <= 0:
        raise op_error(name, f"kernel size should be greater than zero, but got kernel_height: "
                       f"{k[0]} kernel_width: {k[1]}")
    if min(s) <= 0:
        raise op_error(name, f"stride should be greater than zero, but got stride_height: "
                       f"{s[0]} stride_width: {s[1]}")
    if min(d) <= 0:
        raise op_error(name, f"dilation should be greater than zero, but got dilation_height: "
                       f"{d[0]} dilation_width: {d[1]}")
    if min(p) < 0:
        raise op_error(name, f"padding should be non-negative, but got pad_height: {p[0]} "
                       f"pad_width: {p[1]}")
    return k, d, p, s


def _blocks(name, spatial, k, d, p, s, what):
    """The number of sliding blocks per axis; torch's error when one is below one."""
    blocks = tuple((n + 2 * pi - di * (ki - 1) - 1) // si + 1
                   for n, ki, di, pi, si in zip(spatial, k, d, p, s, strict=True))
    if min(blocks) < 1:
        raise op_error(name, f"Given {what}=({spatial[0]}, {spatial[1]}), kernel_size=({k[0]}, "
                       f"{k[1]}), dilation=({d[0]}, {d[1]}), padding=({p[0]}, {p[1]}), "
                       f"calculated shape of the array of sliding blocks as ({blocks[0]}, "
                       f"{blocks[1]}), but its components must be at least one.")
    return blocks


def _check_float(name, m: TensorMeta, aten):
    if not m.dtype.is_floating_point:
        raise op_error(name, f"\"{aten}\" not implemented for '{m.dtype.name}'",
                       NotImplementedError)


def _im2col_meta(x, kernel_size, dilation=1, padding=0, stride=1):
    name = "im2col"
    k, d, p, s = _check_block_args(name, kernel_size, dilation, padding, stride)
    if x.ndim != 4 or any(n == 0 for n in x.shape[1:]):
        raise op_error(name, "Expected 4D (batch mode) tensor with possibly 0 batch size and "
                       f"other non-zero dimensions for input, but got: {list(x.shape)}")
    _check_float(name, x, "im2col_out_cpu")
    blocks = _blocks(name, x.shape[2:], k, d, p, s, "input with spatial size")
    return TensorMeta((x.shape[0], x.shape[1] * k[0] * k[1], blocks[0] * blocks[1]), x.dtype)


def _im2col_kernel(ctx, x, kernel_size, dilation=1, padding=0, stride=1):
    xm = ctx.in_metas[0]
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    k, d, p, s = _check_block_args(ctx.op, kernel_size, dilation, padding, stride)
    x = _to(ctx, x, xm.dtype, cdt)
    if any(p):
        x = ctx.prims.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), "constant", 0)
    view = ctx.prims.windows(x, k, s, d)  # (N, C, oh, ow, kh, kw)
    cols = ctx.prims.contiguous(ctx.prims.permute(view, (0, 1, 4, 5, 2, 3)))
    return _to(ctx, ctx.prims.reshape(cols, ctx.out_metas[0].shape), cdt, want)


def _col2im_meta(x, output_size, kernel_size, dilation=1, padding=0, stride=1):
    name = "col2im"
    out = _pair(name, "output_size", output_size)
    k, d, p, s = _check_block_args(name, kernel_size, dilation, padding, stride)
    if x.ndim != 3 or any(n == 0 for n in x.shape[1:]):
        raise op_error(name, "Expected 3D (batch mode) tensor for input with possibly 0 batch "
                       f"size and non-zero dimensions for input, but got: {list(x.shape)}")
    _check_float(name, x, "col2im_out_cpu")
    taps = k[0] * k[1]
    if x.shape[1] % taps:
        raise op_error(name, "Expected size of input's dimension 1 to be divisible by the "
                       f"product of kernel_size, but got input.size(1)={x.shape[1]} and "
                       f"kernel_size=({k[0]}, {k[1]}).")
    blocks = _blocks(name, out, k, d, p, s, "output_size")
    if x.shape[2] != blocks[0] * blocks[1]:
        raise op_error(name, f"Given output_size=({out[0]}, {out[1]}), kernel_size=({k[0]}, "
                       f"{k[1]}), dilation=({d[0]}, {d[1]}), padding=({p[0]}, {p[1]}), "
                       f"stride=({s[0]}, {s[1]}), expected size of input's dimension 2 to "
                       f"match the calculated number of sliding blocks {blocks[0]} * "
                       f"{blocks[1]} = {blocks[0] * blocks[1]}, but got "
                       f"input.size(2)={x.shape[2]}.")
    return TensorMeta((x.shape[0], x.shape[1] // taps) + out, x.dtype)


def _col2im_kernel(ctx, x, output_size, kernel_size, dilation=1, padding=0, stride=1):
    xm = ctx.in_metas[0]
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    k, d, p, s = _check_block_args(ctx.op, kernel_size, dilation, padding, stride)
    out = _pair(ctx.op, "output_size", output_size)
    blocks = _blocks(ctx.op, out, k, d, p, s, "output_size")
    nb, c = ctx.out_metas[0].shape[:2]
    x = _to(ctx, x, xm.dtype, cdt)
    cols = ctx.prims.reshape(ctx.prims.contiguous(x), (nb, c) + k + blocks)
    cols = ctx.prims.permute(cols, (0, 1, 4, 5, 2, 3))  # (N, C, bh, bw, kh, kw)
    padded = (out[0] + 2 * p[0], out[1] + 2 * p[1])
    dst = ctx.prims.full((nb, c) + padded, cdt, 0)
    dst = ctx.prims.windows_add(dst, cols, k, s, d)
    if any(p):
        dst = ctx.prims.slice(dst, (slice(None), slice(None), slice(p[0], p[0] + out[0]),
                                    slice(p[1], p[1] + out[1])))
    return _to(ctx, ctx.prims.contiguous(dst), cdt, want)


def _block_attrs(attrs):
    return {k: attrs[k] for k in ("kernel_size", "dilation", "padding", "stride")}


def _block_sbp(x, *args, **kwargs):
    sigs = [Signature((B,), (B,))]
    if x.shape[0] > 1:
        sigs.append(Signature((Split(0),), (Split(0),)))  # (S0)->S0: samples independent
    sigs.append(Signature((P,), (P,)))  # (P)->P: a linear map of the input
    return sigs


_BLOCK_ATTRS = {"kernel_size": Attr("ints"), "dilation": Attr("ints", 1),
                "padding": Attr("ints", 0), "stride": Attr("ints", 1)}


def _im2col_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 4, 5), kernel_size=2),
        Sample(r(2, 2, 6, 5), kernel_size=(3, 2), dilation=(1, 2), padding=1, stride=(2, 1)),
        Sample(r(2, 2, 5, 5), kernel_size=2, padding=(0, 2), stride=3),
        Sample(r(2, 2, 4, 4, dtype=np.float32), kernel_size=3, padding=1),
    ]


def _col2im_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 12, 12), output_size=(4, 5), kernel_size=2),
        Sample(r(2, 12, 15), output_size=(6, 5), kernel_size=(3, 2), dilation=(1, 2),
               padding=1, stride=(2, 1)),
        Sample(r(2, 8, 6), output_size=(5, 5), kernel_size=2, padding=(0, 2), stride=3),
        Sample(r(2, 18, 16, dtype=np.float32), output_size=(4, 4), kernel_size=3, padding=1),
    ]


register(OpDef(
    "im2col",
    inputs=("input",),
    attrs=dict(_BLOCK_ATTRS),
    infer_meta=_im2col_meta,
    kernel=_im2col_kernel,
    saves=(),
    grad=lambda ctx, g: (op("col2im", g, output_size=ctx.in_metas[0].shape[2:],
                            **_block_attrs(ctx.attrs)),),
    sbp=_block_sbp,
    reference="nn.functional.unfold",
    samples=_im2col_samples,
    doc="torch's unfold: every sliding block of (N, C, H, W) as a column of (N, C*kh*kw, L).",
))

register(OpDef(
    "col2im",
    inputs=("input",),
    attrs={"output_size": Attr("ints"), **_BLOCK_ATTRS},
    infer_meta=_col2im_meta,
    kernel=_col2im_kernel,
    saves=(),
    grad=lambda ctx, g: (op("im2col", g, **_block_attrs(ctx.attrs)),),
    sbp=_block_sbp,
    reference="nn.functional.fold",
    samples=_col2im_samples,
    doc="torch's fold: columns (N, C*kh*kw, L) summed back into (N, C, *output_size).",
))
