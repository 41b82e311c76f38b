"""Convolution and pooling, 1-D to 3-D, with torch.nn.functional semantics.

Convolution is im2col: the `windows` primitive gives a strided view of every receptive field,
one copy lays it out as columns (groups, C/groups * K, N * L), and one matmul (batched over
groups only) contracts them with the weight.  Its adjoints are ops too, so higher-order
gradients compose from them:

    conv_input_grad(g, w)   the input gradient (a transposed convolution, col2im through the
                            `windows_add` primitive); also serves conv_transpose{1,2,3}d
    conv_weight_grad(g, x)  the weight gradient (im2col of x, one matmul with g)

With B(g, x, w) = <g, conv(x, w)>, all three ops are partial derivatives of the same
trilinear form, so each one's gradient is another of the three.

Pooling: max pooling returns values and flat input indices (torch's return_indices layout),
scanning the window taps in torch's order; its gradient scatters into those indices
(`max_pool_grad`), whose own gradient gathers from them (`max_pool_gather`).  Average pooling
divides window sums by a divisor map built on the host from shapes alone; its adjoint
`avg_pool_grad` spreads with `windows_add`.  Adaptive
average pooling is separable: one host-built averaging matrix per spatial axis, one matmul per
axis.  Adaptive max pooling gathers each (uneven) window through a host-built index map and
scans it like max pooling; its gradient is max pooling's scatter (`max_pool_grad`).

The ops take batched input (N, C, *spatial); the functional layer adds and removes the batch
axis of unbatched calls, as torch does.
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

_COUNT = {1: "one", 2: "two", 3: "three"}


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _prod(xs) -> int:
    return math.prod(xs)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _shape_str(shape, sep="x") -> str:
    return sep.join(str(s) for s in shape)


# -- argument normalisation ------------------------------------------------------------------
def conv_tuple(name: str, arg: str, value, n: int) -> tuple[int, ...]:
    """torch's expand_param_if_needed: an int, or a sequence of 1 or n ints."""
    if _is_int(value):
        return (int(value),) * n
    if isinstance(value, (tuple, list)) and all(_is_int(v) for v in value):
        if len(value) == 1:
            return (int(value[0]),) * n
        if len(value) == n:
            return tuple(int(v) for v in value)
        raise op_error(
            name,
            f"expected {arg} to be a single integer value or a list of {n} values to match the "
            f"convolution dimensions, but got {arg}={list(value)}",
        )
    raise op_error(name, f"argument '{arg}' must be int or tuple of ints, not "
                   f"{type(value).__name__} ({value!r})", TypeError)


def _pool_tuple(name: str, arg: str, value, n: int) -> tuple[int, ...]:
    if _is_int(value):
        return (int(value),) * n
    if isinstance(value, (tuple, list)) and all(_is_int(v) for v in value):
        if len(value) == 1:
            return (int(value[0]),) * n
        if len(value) == n:
            return tuple(int(v) for v in value)
    raise op_error(name, f"{arg} must either be a single int, or a tuple of {_COUNT[n]} ints, "
                   f"but got {arg}={value!r}")


def conv_geometry(name, spatial, kernel, stride, padding, dilation):
    """(stride, dilation, pads, out): pads holds (before, after) per spatial axis."""
    n = len(kernel)
    stride = conv_tuple(name, "stride", stride, n)
    dilation = conv_tuple(name, "dilation", dilation, n)
    if any(s <= 0 for s in stride):
        raise op_error(name, f"non-positive stride is not supported, got stride={list(stride)}")
    if any(d <= 0 for d in dilation):
        raise op_error(name, "non-positive dilation is not supported, got "
                       f"dilation={list(dilation)}")
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * n
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise op_error(name, "padding='same' is not supported for strided convolutions")
            # torch puts the odd element of an uneven total padding after the input.
            pads = tuple((d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                         for k, d in zip(kernel, dilation, strict=True))
        else:
            raise op_error(name, f"Invalid padding string: {padding!r}")
    else:
        pad = conv_tuple(name, "padding", padding, n)
        if any(p < 0 for p in pad):
            raise op_error(name, f"negative padding is not supported, got padding={list(pad)}")
        pads = tuple((p, p) for p in pad)
    effective = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads, strict=True))
    if any(p < e for p, e in zip(padded, effective, strict=True)):
        raise op_error(
            name,
            f"Calculated padded input size per channel: ({_shape_str(padded, ' x ')}). Kernel "
            f"size: ({_shape_str(effective, ' x ')}). Kernel size can't be greater than actual "
            "input size",
        )
    out = tuple((p - e) // s + 1 for p, e, s in zip(padded, effective, stride, strict=True))
    return stride, dilation, pads, out


def _check_conv_operands(name, x: TensorMeta, w: TensorMeta, groups: int, n: int,
                         x_arg="input"):
    if x.ndim != n + 2:
        raise op_error(name, f"Expected {n + 2}D (batched) {x_arg} to {name}, but got {x_arg} "
                       f"of size: {list(x.shape)}")
    if w.ndim != n + 2:
        raise op_error(name, f"expected weight to be {n + 2}-dimensional ([out_channels, "
                       f"in_channels / groups, *kernel_size]), but got weight of size "
                       f"{list(w.shape)}")
    if x.dtype is not w.dtype:
        raise op_error(name, f"{x_arg.capitalize()} type ({x.dtype.name}) and weight type "
                       f"({w.dtype.name}) should be the same")
    if x.dtype is dt.bool_:
        raise op_error(name, f"\"{name}\" not implemented for 'Bool'")
    if groups <= 0:
        raise op_error(name, f"non-positive groups is not supported, got groups={groups}")
    if w.shape[0] < groups:
        raise op_error(name, f"Given groups={groups}, expected weight to be at least {groups} "
                       f"at dimension 0, but got weight of size {list(w.shape)} instead")
    if w.shape[0] % groups:
        raise op_error(name, f"Given groups={groups}, expected weight to be divisible by "
                       f"{groups} at dimension 0, but got weight of size {list(w.shape)} "
                       "instead")


def _compute_dtype(d: dt.DType) -> dt.DType:
    # NumPy has no fast half-precision matmul or accumulation: compute halves in float32,
    # which is also what torch accumulates them in.
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


def _to(ctx, a, have: dt.DType, want: dt.DType):
    return a if have is want else ctx.prims.cast(a, want)


def _pad_spatial(ctx, x, pads, value):
    """Pad (or, for a negative `after`, crop) the trailing spatial axes of x."""
    n = len(pads)
    if any(hi < 0 for _, hi in pads):
        key = (Ellipsis,) + tuple(slice(0, s + hi) if hi < 0 else slice(None)
                                  for s, (_, hi) in zip(x.shape[-n:], pads, strict=True))
        x = ctx.prims.slice(x, key)
    widths = tuple((lo, max(hi, 0)) for lo, hi in pads)
    if any(lo or hi for lo, hi in widths):
        x = ctx.prims.pad(x, ((0, 0),) * (x.ndim - n) + widths, "constant", value)
    return x


def _unpad_spatial(ctx, dst, pads, spatial):
    """The adjoint of _pad_spatial: the input-shaped region of a padded gradient buffer."""
    n = len(pads)
    if not any(lo or hi for lo, hi in pads):
        return dst
    key = (Ellipsis,) + tuple(slice(lo, lo + s + min(hi, 0))
                              for s, (lo, hi) in zip(spatial, pads, strict=True))
    region = ctx.prims.slice(dst, key)
    tail = tuple((0, -min(hi, 0)) for _, hi in pads)
    if any(t for _, t in tail):  # input elements no window reached get zero gradient
        return ctx.prims.pad(region, ((0, 0),) * (dst.ndim - n) + tail, "constant", 0)
    return ctx.prims.contiguous(region)


# -- convolution kernels -----------------------------------------------------------------------
def _im2col(ctx, x, x_shape, kernel, stride, dilation, pads, groups):
    """x (N, C, *spatial) as columns (G, C/G * K, N * L): one copy through `windows`.

    Rows are (channel, tap), columns (sample, output position), so each group's convolution
    is a single plain GEMM; batching the GEMM over samples instead would broadcast the weight,
    which NumPy cannot hand to BLAS.
    """
    xp = ctx.prims.ensure_contiguous(_pad_spatial(ctx, x, pads, 0))
    nb, c = x_shape[:2]
    # (G, Cg, *k, N, *out): the copy streams along output rows.
    cols = ctx.prims.unfold(xp, tuple(kernel), tuple(stride), tuple(dilation), groups)
    return ctx.prims.reshape(cols, (groups, (c // groups) * _prod(kernel),
                                    nb * _prod(cols.shape[3 + len(kernel):])))


def _grad_columns(ctx, g, g_shape, groups):
    """grad_output (N, O, *out) as (G, O/G, N * L), matching _im2col's column order."""
    nb, o = g_shape[:2]
    length = _prod(g_shape[2:])
    gmat = ctx.prims.reshape(g, (nb, groups, o // groups, length))
    gmat = ctx.prims.contiguous(ctx.prims.permute(gmat, (1, 2, 0, 3)))
    return ctx.prims.reshape(gmat, (groups, o // groups, nb * length))


def _conv_kernel(ctx, x, w, stride=1, padding=0, dilation=1, groups=1):
    xm, wm = ctx.in_metas
    kernel = wm.shape[2:]
    stride, dilation, pads, out = conv_geometry(ctx.op, xm.shape[2:], kernel, stride, padding,
                                                dilation)
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    x = _to(ctx, x, xm.dtype, cdt)
    w = _to(ctx, w, wm.dtype, cdt)
    nb, o = xm.shape[0], wm.shape[0]
    cols = _im2col(ctx, x, xm.shape, kernel, stride, dilation, pads, groups)
    wmat = ctx.prims.reshape(w, (groups, o // groups, wm.shape[1] * _prod(kernel)))
    y = ctx.prims.matmul(wmat, cols)  # (G, O/G, N * L)
    y = ctx.prims.reshape(y, (groups, o // groups, nb, _prod(out)))
    y = ctx.prims.contiguous(ctx.prims.permute(y, (2, 0, 1, 3)))
    y = ctx.prims.reshape(y, (nb, o) + out)
    return _to(ctx, y, cdt, want)


def _conv_input_grad_kernel(ctx, g, w, input_size, stride=1, padding=0, dilation=1, groups=1):
    gm, wm = ctx.in_metas
    n = gm.ndim - 2
    kernel = tuple(wm.shape[2:])
    spatial = tuple(input_size)
    stride, dilation, pads, out = conv_geometry(ctx.op, spatial, kernel, stride, padding,
                                                dilation)
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    g = _to(ctx, g, gm.dtype, cdt)
    w = _to(ctx, w, wm.dtype, cdt)
    nb, o = gm.shape[:2]
    cg = wm.shape[1]
    # Columns ordered (output position, sample): each tap's columns then add into the
    # padded gradient as rows of out_w * N contiguous elements (in the (N, ..., *out) order
    # the rows were out_w long, and NumPy's loop overhead per row dominated the col2im).
    length = _prod(out)
    gmat = ctx.prims.reshape(g, (nb, groups, o // groups, length))
    gmat = ctx.prims.contiguous(ctx.prims.permute(gmat, (1, 2, 3, 0)))
    gmat = ctx.prims.reshape(gmat, (groups, o // groups, length * nb))
    wmat = ctx.prims.reshape(w, (groups, o // groups, cg * _prod(kernel)))
    cols = ctx.prims.matmul(ctx.prims.permute(wmat, (0, 2, 1)), gmat)  # (G, Cg*K, L*N)
    res = ctx.prims.fold(ctx.prims.reshape(cols, (groups * cg,) + kernel + out + (nb,)),
                         spatial, kernel, stride, dilation, pads)  # one loop, where it exists
    if res is not None:
        return _to(ctx, res, cdt, want)
    cols = ctx.prims.reshape(cols, (groups, cg) + kernel + out + (nb,))
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(spatial, pads, strict=True))
    dst = ctx.prims.full((groups, cg) + padded + (nb,), cdt, 0)
    for tap in np.ndindex(*kernel):  # col2im: the adjoint of `windows`, tap by tap
        key = (slice(None), slice(None)) + tuple(
            slice(tap[i] * dilation[i], tap[i] * dilation[i] + stride[i] * out[i], stride[i])
            for i in range(n)) + (slice(None),)
        region = ctx.prims.slice(dst, key)
        ctx.prims.binary("add", region, ctx.prims.slice(cols, (slice(None), slice(None)) + tap),
                         out=region)
    # (G, Cg, *padded, N) -> (N, G * Cg, *padded), then the input's region
    dst = ctx.prims.permute(dst, (2 + n, 0, 1) + tuple(range(2, 2 + n)))
    dst = ctx.prims.reshape(dst, (nb, groups * cg) + padded)
    res = _unpad_spatial(ctx, dst, pads, spatial)
    if res is dst:
        res = ctx.prims.contiguous(dst)
    return _to(ctx, res, cdt, want)


def _conv_weight_grad_kernel(ctx, g, x, weight_size, stride=1, padding=0, dilation=1,
                             groups=1):
    gm, xm = ctx.in_metas
    kernel = tuple(weight_size[2:])
    stride, dilation, pads, out = conv_geometry(ctx.op, xm.shape[2:], kernel, stride, padding,
                                                dilation)
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    g = _to(ctx, g, gm.dtype, cdt)
    x = _to(ctx, x, xm.dtype, cdt)
    o = gm.shape[1]
    cg = xm.shape[1] // groups
    gmat = _grad_columns(ctx, g, gm.shape, groups)
    cols = _im2col(ctx, x, xm.shape, kernel, stride, dilation, pads, groups)
    # (cols @ gmat^T)^T rather than gmat @ cols^T: the same sums, and OpenBLAS runs the GEMM
    # with the long columns' operand untransposed ~1.4x faster (the result is small).
    gw = ctx.prims.matmul(cols, ctx.prims.permute(gmat, (0, 2, 1)))  # (G, Cg*K, O/G)
    gw = ctx.prims.contiguous(ctx.prims.permute(gw, (0, 2, 1)))
    gw = ctx.prims.reshape(gw, (o, cg) + kernel)
    return _to(ctx, gw, cdt, want)


# -- convolution metas, grads, SBP --------------------------------------------------------------
def _conv_name(n: int) -> str:
    return f"conv{n}d"


def _conv_meta(n):
    name = _conv_name(n)

    def meta(x, w, stride=1, padding=0, dilation=1, groups=1):
        _check_conv_operands(name, x, w, groups, n)
        if x.shape[1] != w.shape[1] * groups:
            raise op_error(
                name,
                f"Given groups={groups}, weight of size {list(w.shape)}, expected "
                f"input{list(x.shape)} to have {w.shape[1] * groups} channels, but got "
                f"{x.shape[1]} channels instead",
            )
        _, _, _, out = conv_geometry(name, x.shape[2:], w.shape[2:], stride, padding, dilation)
        return TensorMeta((x.shape[0], w.shape[0]) + out, x.dtype)

    return meta


def _conv_params(attrs):
    return {k: attrs[k] for k in ("stride", "padding", "dilation", "groups")}


def _conv_grad(ctx, g):
    xm, wm = ctx.in_metas
    params = _conv_params(ctx.attrs)
    gx = gw = None
    if ctx.needs_input_grad[0]:
        gx = op("conv_input_grad", g, ctx.input(1), input_size=xm.shape[2:], **params)
    if ctx.needs_input_grad[1]:
        gw = op("conv_weight_grad", g, ctx.input(0), weight_size=wm.shape, **params)
    return gx, gw


def _conv_input_grad_grad(ctx, gg):
    gm, wm = ctx.in_metas
    n = gm.ndim - 2
    params = _conv_params(ctx.attrs)
    d_g = d_w = None
    if ctx.needs_input_grad[0]:  # conv_input_grad is the adjoint of conv in x
        d_g = op(_conv_name(n), gg, ctx.input(1), **params)
    if ctx.needs_input_grad[1]:
        d_w = op("conv_weight_grad", ctx.input(0), gg, weight_size=wm.shape, **params)
    return d_g, d_w


def _conv_weight_grad_grad(ctx, gg):
    gm, xm = ctx.in_metas
    n = gm.ndim - 2
    params = _conv_params(ctx.attrs)
    d_g = d_x = None
    if ctx.needs_input_grad[0]:
        d_g = op(_conv_name(n), ctx.input(1), gg, **params)
    if ctx.needs_input_grad[1]:
        d_x = op("conv_input_grad", ctx.input(0), gg, input_size=xm.shape[2:], **params)
    return d_g, d_x


def _conv_sbp(x, w, stride=1, padding=0, dilation=1, groups=1):
    sigs = [Signature((B, B), (B,))]
    if x.shape[0] > 1:
        sigs.append(Signature((Split(0), B), (Split(0),)))  # (S0,B)->S0: samples independent
    if groups == 1:
        if w.shape[0] > 1:
            sigs.append(Signature((B, Split(0)), (Split(1),)))  # (B,S0)->S1: filters split
        if x.shape[1] > 1:
            sigs.append(Signature((Split(1), Split(1)), (P,)))  # (S1,S1)->P: sum over C_in
    sigs.append(Signature((P, B), (P,)))  # (P,B)->P: linear in the input
    sigs.append(Signature((B, P), (P,)))  # (B,P)->P: linear in the weight
    return sigs


def _conv_input_grad_meta(g, w, input_size, stride=1, padding=0, dilation=1, groups=1):
    name = "conv_input_grad"
    n = len(input_size)
    _check_conv_operands(name, g, w, groups, n, x_arg="grad_output")
    if g.shape[1] != w.shape[0]:
        raise op_error(name, f"Given weight of size {list(w.shape)}, expected "
                       f"grad_output{list(g.shape)} to have {w.shape[0]} channels, but got "
                       f"{g.shape[1]} channels instead")
    if any(s < 0 for s in input_size):
        raise op_error(name, f"input_size must be non-negative, got {list(input_size)}")
    _, _, _, out = conv_geometry(name, tuple(input_size), w.shape[2:], stride, padding,
                                 dilation)
    if out != g.shape[2:]:
        raise op_error(name, f"an input of spatial size {list(input_size)} gives a convolution "
                       f"output of size {list(out)}, but grad_output has spatial size "
                       f"{list(g.shape[2:])}")
    return TensorMeta((g.shape[0], w.shape[1] * groups) + tuple(input_size), g.dtype)


def _conv_weight_grad_meta(g, x, weight_size, stride=1, padding=0, dilation=1, groups=1):
    name = "conv_weight_grad"
    n = len(weight_size) - 2
    w = TensorMeta(tuple(weight_size), x.dtype)
    if n < 1:
        raise op_error(name, f"weight_size must have at least 3 entries, got {list(weight_size)}")
    _check_conv_operands(name, x, w, groups, n)
    if g.dtype is not x.dtype:
        raise op_error(name, f"grad_output type ({g.dtype.name}) and input type "
                       f"({x.dtype.name}) should be the same")
    if x.shape[1] != weight_size[1] * groups:
        raise op_error(name, f"Given groups={groups}, weight of size {list(weight_size)}, "
                       f"expected input{list(x.shape)} to have {weight_size[1] * groups} "
                       f"channels, but got {x.shape[1]} channels instead")
    _, _, _, out = conv_geometry(name, x.shape[2:], w.shape[2:], stride, padding, dilation)
    want = (x.shape[0], weight_size[0]) + out
    if g.shape != want:
        raise op_error(name, f"expected grad_output of size {list(want)} for input "
                       f"{list(x.shape)} and weight {list(weight_size)}, but got "
                       f"{list(g.shape)}")
    return w


def _conv_input_grad_sbp(g, w, input_size, stride=1, padding=0, dilation=1, groups=1):
    sigs = [Signature((B, B), (B,))]
    if g.shape[0] > 1:
        sigs.append(Signature((Split(0), B), (Split(0),)))  # (S0,B)->S0: samples independent
    if groups == 1:
        if g.shape[1] > 1:
            sigs.append(Signature((Split(1), Split(0)), (P,)))  # (S1,S0)->P: sum over C_out
        if w.shape[1] > 1:
            sigs.append(Signature((B, Split(1)), (Split(1),)))  # (B,S1)->S1: C_in split
    sigs.append(Signature((P, B), (P,)))  # (P,B)->P: linear in grad_output
    sigs.append(Signature((B, P), (P,)))  # (B,P)->P: linear in the weight
    return sigs


def _conv_weight_grad_sbp(g, x, weight_size, stride=1, padding=0, dilation=1, groups=1):
    sigs = [Signature((B, B), (B,))]
    if g.shape[0] > 1:
        sigs.append(Signature((Split(0), Split(0)), (P,)))  # (S0,S0)->P: sum over samples
    if groups == 1:
        if g.shape[1] > 1:
            sigs.append(Signature((Split(1), B), (Split(0),)))  # (S1,B)->S0: C_out split
        if x.shape[1] > 1:
            sigs.append(Signature((B, Split(1)), (Split(1),)))  # (B,S1)->S1: C_in split
    sigs.append(Signature((P, B), (P,)))  # (P,B)->P: linear in grad_output
    sigs.append(Signature((B, P), (P,)))  # (B,P)->P: linear in the input
    return sigs


def _torch_conv_input_grad(torch, g, w, input_size, stride=1, padding=0, dilation=1,
                           groups=1):
    """The reference: torch's own input gradient, differentiable (create_graph)."""
    conv = getattr(torch.nn.functional, f"conv{len(input_size)}d")
    x = torch.zeros((g.shape[0], w.shape[1] * groups) + tuple(input_size), dtype=g.dtype,
                    requires_grad=True)
    with torch.enable_grad():
        y = conv(x, w, None, stride, padding, dilation, groups)
        (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    return gx


def _torch_conv_weight_grad(torch, g, x, weight_size, stride=1, padding=0, dilation=1,
                            groups=1):
    conv = getattr(torch.nn.functional, f"conv{len(weight_size) - 2}d")
    w = torch.zeros(tuple(weight_size), dtype=g.dtype, requires_grad=True)
    with torch.enable_grad():
        y = conv(x, w, None, stride, padding, dilation, groups)
        (gw,) = torch.autograd.grad(y, w, g, create_graph=True)
    return gw


_CONV_ATTRS = {"stride": Attr("ints", 1), "padding": Attr("any", 0),
               "dilation": Attr("ints", 1), "groups": Attr("int", 1)}


def _conv2d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 6, 6), r(4, 3, 3, 3)),
        Sample(r(2, 4, 7, 5), r(4, 2, 3, 2), stride=2, padding=1, groups=2),
        Sample(r(2, 2, 7, 7), r(3, 2, 3, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
        Sample(r(2, 3, 5, 6), r(2, 3, 2, 3), padding="same"),
        Sample(r(2, 2, 6, 5), r(2, 2, 3, 2), padding="same", dilation=2),
        Sample(r(2, 2, 7, 6), r(3, 2, 3, 3), padding="valid", dilation=2, stride=3),
        Sample(r(2, 4, 6, 6), r(4, 1, 3, 3), padding=1, groups=4),
        Sample(r(1, 3, 5, 5), r(2, 3, 1, 1)),
        Sample(r(2, 3, 6, 7, dtype=np.float32), r(4, 3, 3, 3, dtype=np.float32), stride=2,
               padding=(0, 1)),
        Sample((r(2, 2, 5, 5) * 4).astype(np.int64), (r(3, 2, 2, 2) * 4).astype(np.int64),
               stride=2, grad=False),
    ]


def _conv1d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 7), r(4, 3, 3)),
        Sample(r(2, 4, 7), r(6, 2, 2), stride=2, padding=1, groups=2),
        Sample(r(2, 2, 6), r(3, 2, 2), padding="same", dilation=3),
        Sample(r(2, 3, 7), r(2, 3, 3), stride=3, dilation=2, padding=(2,)),
        Sample(r(2, 3, 6, dtype=np.float32), r(4, 3, 3, dtype=np.float32), padding=1),
    ]


def _conv3d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 2, 4, 5, 4), r(3, 2, 2, 3, 2), padding=(1, 0, 1)),
        Sample(r(2, 4, 5, 4, 5), r(4, 2, 3, 2, 3), stride=(2, 1, 2), groups=2,
               dilation=(1, 2, 1)),
    ]


_CONV_SAMPLES = {1: _conv1d_samples, 2: _conv2d_samples, 3: _conv3d_samples}

for _n in (1, 2, 3):
    register(OpDef(
        _conv_name(_n),
        inputs=("input", "weight"),
        attrs=dict(_CONV_ATTRS),
        infer_meta=_conv_meta(_n),
        kernel=_conv_kernel,
        saves=("input for weight", "weight for input"),
        grad=_conv_grad,
        sbp=_conv_sbp,
        reference=f"nn.functional.conv{_n}d",
        samples=_CONV_SAMPLES[_n],
        doc=f"{_n}-D convolution (no bias: the functional layer adds it) via im2col.",
    ))


def _conv_input_grad_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 4, 4, 4), r(4, 3, 3, 3), input_size=(6, 6)),
        Sample(r(2, 4, 4, 4), r(4, 3, 3, 3), input_size=(8, 8), stride=2, padding=1),
        Sample(r(2, 4, 4, 3), r(4, 2, 3, 2), input_size=(7, 5), stride=2, padding=1,
               groups=2),
        Sample(r(2, 2, 5, 6), r(2, 3, 2, 3), input_size=(5, 6), padding="same"),
        Sample(r(2, 3, 3), r(3, 2, 3), input_size=(7,), stride=2, dilation=2, padding=1),
        Sample(r(2, 3, 2, 3, 2, dtype=np.float32), r(3, 2, 2, 2, 2, dtype=np.float32),
               input_size=(3, 4, 3)),
    ]


def _conv_weight_grad_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 4, 4, 4), r(2, 3, 6, 6), weight_size=(4, 3, 3, 3)),
        Sample(r(2, 4, 4, 4), r(2, 3, 8, 8), weight_size=(4, 3, 3, 3), stride=2, padding=1),
        Sample(r(2, 4, 4, 3), r(2, 4, 7, 5), weight_size=(4, 2, 3, 2), stride=2, padding=1,
               groups=2),
        Sample(r(2, 2, 5, 6), r(2, 3, 5, 6), weight_size=(2, 3, 2, 3), padding="same"),
        Sample(r(2, 3, 3), r(2, 2, 7), weight_size=(3, 2, 3), stride=2, dilation=2,
               padding=1),
        Sample(r(2, 3, 2, 3, 2, dtype=np.float32), r(2, 2, 3, 4, 3, dtype=np.float32),
               weight_size=(3, 2, 2, 2, 2)),
    ]


register(OpDef(
    "conv_input_grad",
    inputs=("grad_output", "weight"),
    attrs={"input_size": Attr("ints"), **_CONV_ATTRS},
    infer_meta=_conv_input_grad_meta,
    kernel=_conv_input_grad_kernel,
    saves=("grad_output for weight", "weight for grad_output"),
    grad=_conv_input_grad_grad,
    sbp=_conv_input_grad_sbp,
    reference=_torch_conv_input_grad,
    samples=_conv_input_grad_samples,
    doc="Gradient of convN(x, w) in x (spatial size input_size): col2im of w^T g.",
))

register(OpDef(
    "conv_weight_grad",
    inputs=("grad_output", "input"),
    attrs={"weight_size": Attr("ints"), **_CONV_ATTRS},
    infer_meta=_conv_weight_grad_meta,
    kernel=_conv_weight_grad_kernel,
    saves=("grad_output for input", "input for grad_output"),
    grad=_conv_weight_grad_grad,
    sbp=_conv_weight_grad_sbp,
    reference=_torch_conv_weight_grad,
    samples=_conv_weight_grad_samples,
    doc="Gradient of convN(x, w) in w (shape weight_size): g times im2col(x)^T.",
))


# -- pooling geometry ---------------------------------------------------------------------------
def _check_pool_input(name, x: TensorMeta, n: int):
    if x.ndim != n + 2:
        raise op_error(name, f"Expected {n + 2}D (batched) input to {name}, but got input of "
                       f"size: {list(x.shape)}")
    for i in range(1, x.ndim):
        if x.shape[i] == 0:
            raise op_error(name, f"Expected input to have non-zero size for non-batch "
                           f"dimensions, but input has sizes {list(x.shape)} with dimension "
                           f"{i} being empty")
    if x.dtype is dt.bool_:
        raise op_error(name, f"\"{name}\" not implemented for 'Bool'")


def pool_geometry(name, spatial, kernel_size, stride, padding, dilation, ceil_mode,
                  max_pool: bool):
    """(kernel, stride, dilation, pads, out) with torch's pooling_output_shape.

    pads holds (before, after) per axis such that `windows` yields exactly `out` windows: the
    after part grows for ceil_mode and may be negative (input rows no window reaches).
    """
    n = len(spatial)
    k = _pool_tuple(name, "kernel_size", kernel_size, n)
    s = k if stride is None or stride == () else _pool_tuple(name, "stride", stride, n)
    p = _pool_tuple(name, "padding", padding, n)
    d = _pool_tuple(name, "dilation", dilation, n)
    if any(v <= 0 for v in k):
        raise op_error(name, f"kernel_size should be greater than zero, but got "
                       f"kernel_size={list(k)}")
    if any(v <= 0 for v in s):
        raise op_error(name, f"stride should be greater than zero, but got stride={list(s)}")
    if any(v <= 0 for v in d):
        raise op_error(name, f"dilation should be greater than zero, but got "
                       f"dilation={list(d)}")
    if any(v < 0 for v in p):
        raise op_error(name, f"pad must be non-negative, but got pad: {list(p)}")
    for pi, ki, di in zip(p, k, d, strict=True):
        if max_pool and pi > ((ki - 1) * di + 1) // 2:
            raise op_error(name, f"pad should be at most half of effective kernel size, but "
                           f"got pad={pi}, kernel_size={ki} and dilation={di}")
        if pi > ki // 2:  # torch's kernels bound the pad by the bare kernel for both kinds
            raise op_error(name, f"pad should be at most half of kernel size, but got "
                           f"pad={pi} and kernel_size={ki}")
    out = []
    for si, ki, sti, pi, di in zip(spatial, k, s, p, d, strict=True):
        o = (si + 2 * pi - di * (ki - 1) - 1 + (sti - 1 if ceil_mode else 0)) // sti + 1
        if ceil_mode and (o - 1) * sti >= si + pi:  # the last window must start inside
            o -= 1
        out.append(o)
    out = tuple(out)
    if any(o <= 0 for o in out):
        raise op_error(name, f"Given input size: ({_shape_str(spatial)}). Calculated output "
                       f"size: ({_shape_str(out)}). Output size is too small")
    pads = tuple((pi, (o - 1) * sti + di * (ki - 1) + 1 - si - pi)
                 for si, ki, sti, pi, di, o in zip(spatial, k, s, p, d, out, strict=True))
    return k, s, d, pads, out


@functools.lru_cache(maxsize=256)
def _flat_index_map(spatial, kernel, stride, dilation, pads, out) -> np.ndarray:
    """For each window and tap, the flat index of the input element it reads: (*out, *k).

    Taps in the padding are clamped to the nearest input position, which is where torch's
    loop starts its scan, so a window whose values are all -inf reports the same index.
    """
    n = len(spatial)
    flat = np.zeros(out + kernel, dtype=np.int64)
    step = 1
    for i in reversed(range(n)):
        pos = (np.arange(out[i])[:, None] * stride[i] - pads[i][0]
               + np.arange(kernel[i])[None, :] * dilation[i])
        pos = np.clip(pos, 0, spatial[i] - 1)
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = out[i], kernel[i]
        flat += pos.reshape(shape) * step
        step *= spatial[i]
    return flat


@functools.lru_cache(maxsize=256)
def _avg_divisors(spatial, kernel, stride, padding, out, count_include_pad) -> np.ndarray:
    """torch's divide factor per output position (separable over axes)."""
    div = np.ones((), dtype=np.float64)
    for si, ki, sti, pi, oi in zip(spatial, kernel, stride, padding, out, strict=True):
        start = np.arange(oi) * sti - pi
        end = np.minimum(start + ki, si + pi)
        size = end - start
        if not count_include_pad:
            size = np.minimum(end, si) - np.maximum(start, 0)
        div = np.multiply.outer(div, size.astype(np.float64))
    return div


def _lowest(d: dt.DType):
    return -np.inf if d.is_floating_point else int(np.iinfo(d.np).min)


# -- max pooling --------------------------------------------------------------------------------
def _max_pool_name(n):
    return f"max_pool{n}d"


def _max_pool_meta(n):
    name = _max_pool_name(n)

    def meta(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        _check_pool_input(name, x, n)
        out = pool_geometry(name, x.shape[2:], kernel_size, stride, padding, dilation,
                            ceil_mode, True)[-1]
        shape = x.shape[:2] + out
        return TensorMeta(shape, x.dtype), TensorMeta(shape, dt.int64)

    return meta


def _max_pool_kernel(ctx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    xm = ctx.in_metas[0]
    spatial = xm.shape[2:]
    k, s, d, pads, out = pool_geometry(ctx.op, spatial, kernel_size, stride, padding, dilation,
                                       ceil_mode, True)
    shape = xm.shape[:2] + out
    xp = _pad_spatial(ctx, x, pads, _lowest(xm.dtype))
    index_map = ctx.prims.from_host(_flat_index_map(spatial, k, s, d, pads, out), dt.int64)
    fused = ctx.prims.window_max(xp, index_map, k, s, d)  # one loop, where the device has it
    if fused is not None:
        return fused
    cols = ctx.prims.windows(xp, k, s, d)
    # A running maximum over the taps, in torch's scan order: a later tap wins only when
    # strictly greater (first maximum on ties) or NaN (NaN propagates, last NaN's index).
    # Each step is a few vectorised passes over strided slices of the window view; reducing
    # over the short trailing window axes, or selecting with `where`, is several times slower
    # in NumPy, so the index is updated arithmetically: idx += wins * (tap_index - idx).
    best = indices = None
    for tap in np.ndindex(*k):
        key = (Ellipsis,) + tap
        value = ctx.prims.slice(cols, key)
        where = ctx.prims.slice(index_map, key)
        if best is None:
            best = ctx.prims.contiguous(value)
            indices = ctx.prims.contiguous(ctx.prims.broadcast_to(where, shape))
            continue
        wins = ctx.prims.binary("gt", value, best)
        if xm.dtype.is_floating_point:
            wins = ctx.prims.binary("logical_or", wins, ctx.prims.unary("isnan", value))
        best = ctx.prims.binary("maximum", best, value)  # NaN-propagating, like the scan
        step = ctx.prims.binary("mul", wins, ctx.prims.binary("sub", where, indices))
        indices = ctx.prims.binary("add", indices, step)
    return best, indices


def _max_pool_grad_rule(ctx, g, g_indices=None):
    return (op("max_pool_grad", g, ctx.output(1), input_size=ctx.in_metas[0].shape[2:]),)


def _pool_sbp(x, *args, linear=False, n_outputs=1, **kwargs):
    outs = n_outputs
    sigs = [Signature((B,), (B,) * outs)]
    for axis in (0, 1):
        if x.shape[axis] > 1:  # (Si)->Si: batch items and channels pool independently
            sigs.append(Signature((Split(axis),), (Split(axis),) * outs))
    if linear and x.dtype.is_floating_point:
        sigs.append(Signature((P,), (P,) * outs))  # (P)->P: a linear map of the input
    return sigs


def _torch_max_pool(n):
    def ref(torch, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        f = getattr(torch.nn.functional, f"max_pool{n}d")
        return f(x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                 return_indices=True)

    return ref


def _max_pool2d_samples(rng):
    r = functools.partial(_rand, rng)
    ties = np.round(r(2, 2, 6, 6) * 1.5)  # many equal values: checks the first-max rule
    return [
        Sample(r(2, 3, 6, 6), kernel_size=2),
        Sample(r(2, 2, 7, 7), kernel_size=3, stride=2, padding=1),
        Sample(r(2, 2, 7, 6), kernel_size=(3, 2), stride=(2, 1), dilation=(2, 1),
               ceil_mode=True),
        Sample(r(2, 2, 5, 5), kernel_size=2, padding=1, ceil_mode=True),
        Sample(r(2, 3, 6, 5), kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)),
        Sample(r(2, 3, 7, 7, dtype=np.float32), kernel_size=3, stride=2, ceil_mode=True),
        Sample(ties, kernel_size=3, stride=1, padding=1, grad=False),
        Sample((r(2, 2, 5, 5) * 10).astype(np.int32), kernel_size=2, grad=False),
    ]


def _max_pool1d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 7), kernel_size=2),
        Sample(r(2, 2, 7), kernel_size=3, stride=2, padding=1, ceil_mode=True),
        Sample(r(2, 2, 9), kernel_size=2, dilation=3, stride=1),
        Sample(r(2, 3, 6, dtype=np.float32), kernel_size=3, stride=2),
    ]


def _max_pool3d_samples(rng):
    r = functools.partial(_rand, rng)
    return [Sample(r(2, 2, 5, 4, 5), kernel_size=(2, 2, 3), stride=(2, 1, 2), padding=(1, 0, 1),
                   ceil_mode=True)]


_MAX_POOL_SAMPLES = {1: _max_pool1d_samples, 2: _max_pool2d_samples, 3: _max_pool3d_samples}
_MAX_POOL_ATTRS = {"kernel_size": Attr("ints"), "stride": Attr("ints", None),
                   "padding": Attr("ints", 0), "dilation": Attr("ints", 1),
                   "ceil_mode": Attr("bool", False)}

for _n in (1, 2, 3):
    register(OpDef(
        _max_pool_name(_n),
        inputs=("input",),
        outputs=("out", "indices"),
        attrs=dict(_MAX_POOL_ATTRS),
        infer_meta=_max_pool_meta(_n),
        kernel=_max_pool_kernel,
        saves=("indices",),
        grad=_max_pool_grad_rule,
        sbp=functools.partial(_pool_sbp, n_outputs=2),
        reference=_torch_max_pool(_n),
        samples=_MAX_POOL_SAMPLES[_n],
        doc=f"{_n}-D max pooling: values and flat input indices (return_indices layout).",
    ))


def _check_indices(name, arg, m: TensorMeta):
    if m.dtype is not dt.int64:
        raise op_error(name, f"expected {arg} to be an int64 tensor, got {m.dtype.name}",
                       TypeError)


def _max_pool_grad_meta(g, indices, input_size):
    name = "max_pool_grad"
    _check_indices(name, "indices", indices)
    if not g.dtype.is_floating_point:
        raise op_error(name, f"expected a floating grad_output, got {g.dtype.name}", TypeError)
    if g.shape != indices.shape or g.ndim != len(input_size) + 2:
        raise op_error(name, f"expected grad_output and indices of the same shape with "
                       f"{len(input_size) + 2} dims, got {list(g.shape)} and "
                       f"{list(indices.shape)}")
    return TensorMeta(g.shape[:2] + tuple(input_size), g.dtype)


def _max_pool_grad_kernel(ctx, g, indices, input_size):
    gm = ctx.in_metas[0]
    lead = gm.shape[:2]
    spatial = ctx.out_metas[0].shape[2:]
    length = _prod(gm.shape[2:])
    dst = ctx.prims.full(lead + (_prod(spatial),), gm.dtype, 0)
    ctx.prims.scatter(dst, 2, ctx.prims.reshape(indices, lead + (length,)),
                      ctx.prims.reshape(g, lead + (length,)), "add")
    return ctx.prims.reshape(dst, lead + spatial)


def _max_pool_gather_meta(x, indices):
    name = "max_pool_gather"
    _check_indices(name, "indices", indices)
    if x.ndim != indices.ndim or x.ndim < 3 or x.shape[:2] != indices.shape[:2]:
        raise op_error(name, f"expected input (N, C, *spatial) and indices (N, C, *out) with "
                       f"the same N, C and rank, got {list(x.shape)} and "
                       f"{list(indices.shape)}")
    return TensorMeta(indices.shape, x.dtype)


def _max_pool_gather_kernel(ctx, x, indices):
    xm, im = ctx.in_metas
    lead = xm.shape[:2]
    flat = ctx.prims.reshape(x, lead + (_prod(xm.shape[2:]),))
    idx = ctx.prims.reshape(indices, lead + (_prod(im.shape[2:]),))
    return ctx.prims.reshape(ctx.prims.gather(flat, 2, idx), im.shape)


def _index_pair_sbp(a, indices, *args, **kwargs):
    sigs = [Signature((B, B), (B,))]
    for axis in (0, 1):
        if a.shape[axis] > 1:  # (Si,Si)->Si: indices address within one (sample, channel)
            sigs.append(Signature((Split(axis), Split(axis)), (Split(axis),)))
    sigs.append(Signature((P, B), (P,)))  # (P,B)->P: linear in the values
    return sigs


def _max_pool_grad_sbp(g, indices, input_size):
    sigs = _index_pair_sbp(g, indices)
    for axis in range(2, g.ndim):
        if g.shape[axis] > 1:  # (Si,Si)->P: each window adds into the input on its own
            sigs.append(Signature((Split(axis), Split(axis)), (P,)))
    return sigs


def _max_pool_gather_sbp(x, indices):
    sigs = _index_pair_sbp(x, indices)
    for axis in range(2, indices.ndim):
        if indices.shape[axis] > 1:  # (B,Si)->Si: each output position reads on its own
            sigs.append(Signature((B, Split(axis)), (Split(axis),)))
    return sigs


def _torch_max_pool_grad(torch, g, indices, input_size):
    lead = tuple(g.shape[:2])
    dst = torch.zeros(lead + (math.prod(input_size),), dtype=g.dtype)
    return dst.scatter_add(2, indices.flatten(2), g.flatten(2)).view(lead + tuple(input_size))


def _torch_max_pool_gather(torch, x, indices):
    return torch.gather(x.flatten(2), 2, indices.flatten(2)).view(indices.shape)


def _max_pool_grad_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 3, 3), rng.integers(0, 36, (2, 3, 3, 3)), input_size=(6, 6)),
        Sample(r(2, 2, 4), rng.integers(0, 7, (2, 2, 4)), input_size=(7,)),
        Sample(r(2, 2, 3, 2, dtype=np.float32), rng.integers(0, 20, (2, 2, 3, 2)),
               input_size=(5, 4)),
    ]


def _max_pool_gather_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 6, 6), rng.integers(0, 36, (2, 3, 3, 3))),
        Sample(r(2, 2, 7), rng.integers(0, 7, (2, 2, 4))),
    ]


register(OpDef(
    "max_pool_grad",
    inputs=("grad_output", "indices"),
    attrs={"input_size": Attr("ints")},
    infer_meta=_max_pool_grad_meta,
    kernel=_max_pool_grad_kernel,
    saves=("indices",),
    grad=lambda ctx, gg: (op("max_pool_gather", gg, ctx.input(1)), None),
    sbp=_max_pool_grad_sbp,
    reference=_torch_max_pool_grad,
    samples=_max_pool_grad_samples,
    doc="Gradient of max pooling: grad_output added at the flat input indices.",
))

register(OpDef(
    "max_pool_gather",
    inputs=("input", "indices"),
    infer_meta=_max_pool_gather_meta,
    kernel=_max_pool_gather_kernel,
    saves=("indices",),
    grad=lambda ctx, gg: (op("max_pool_grad", gg, ctx.input(1),
                             input_size=ctx.in_metas[0].shape[2:]), None),
    sbp=_max_pool_gather_sbp,
    reference=_torch_max_pool_gather,
    samples=_max_pool_gather_samples,
    doc="input[n, c].flatten()[indices[n, c]]: the adjoint of max_pool_grad.",
))


# -- average pooling ----------------------------------------------------------------------------
def _avg_pool_name(n):
    return f"avg_pool{n}d"


def _avg_geometry(name, spatial, kernel_size, stride, padding, ceil_mode):
    return pool_geometry(name, spatial, kernel_size, stride, padding, 1, ceil_mode, False)


def _check_divisor(name, divisor_override):
    if divisor_override is not None and divisor_override == 0:
        raise op_error(name, "divisor must be not zero")


def _avg_pool_meta(n):
    name = _avg_pool_name(n)

    def meta(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
        _check_pool_input(name, x, n)
        _check_divisor(name, divisor_override)
        k, *_, out = _avg_geometry(name, x.shape[2:], kernel_size, stride, padding, ceil_mode)
        if n == 3 and any(si < ki for si, ki in zip(x.shape[2:], k, strict=True)):
            # torch's avg_pool3d alone compares the unpadded input with the kernel.
            t, h, w = x.shape[2:]
            raise op_error(name, f"input image (T: {t} H: {h} W: {w}) smaller than kernel size "
                           f"(kT: {k[0]} kH: {k[1]} kW: {k[2]})")
        return TensorMeta(x.shape[:2] + out, x.dtype)

    return meta


def _divisor_array(ctx, spatial, k, s, pads, out, count_include_pad, divisor_override, cdt):
    if divisor_override is not None:
        host = np.full(out, float(divisor_override))
    else:
        host = _avg_divisors(spatial, k, s, tuple(lo for lo, _ in pads), out, count_include_pad)
    return ctx.prims.from_host(host, cdt)


def _avg_compute_dtype(d: dt.DType) -> dt.DType:
    # Integers average in float64 then truncate toward zero, as torch's integer division does.
    return _compute_dtype(d) if d.is_floating_point else dt.float64


def _avg_pool_kernel(ctx, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                     count_include_pad=True, divisor_override=None):
    xm = ctx.in_metas[0]
    spatial = xm.shape[2:]
    k, s, d, pads, out = _avg_geometry(ctx.op, spatial, kernel_size, stride, padding,
                                       ceil_mode)
    want = ctx.out_metas[0].dtype
    cdt = _avg_compute_dtype(want)
    x = _to(ctx, x, xm.dtype, cdt)
    cols = ctx.prims.windows(_pad_spatial(ctx, x, pads, 0), k, s, d)
    # Window sums tap by tap: each step adds one strided slice of the window view, which
    # NumPy vectorises far better than a reduction over the short trailing window axes.
    sums = None
    for tap in np.ndindex(*k):
        value = ctx.prims.slice(cols, (Ellipsis,) + tap)
        sums = ctx.prims.contiguous(value) if sums is None else ctx.prims.binary(
            "add", sums, value)
    div = _divisor_array(ctx, spatial, k, s, pads, out, count_include_pad, divisor_override,
                         cdt)
    y = ctx.prims.binary("div", sums, div)
    if not want.is_floating_point:
        y = ctx.prims.unary("trunc", y)
    return _to(ctx, y, cdt, want)


def _avg_pool_params(attrs):
    return {k: attrs[k] for k in ("kernel_size", "stride", "padding", "ceil_mode",
                                  "count_include_pad", "divisor_override")}


def _avg_pool_grad_rule(ctx, g):
    return (op("avg_pool_grad", g, input_size=ctx.in_metas[0].shape[2:],
               **_avg_pool_params(ctx.attrs)),)


def _avg_pool_grad_meta(g, input_size, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None):
    name = "avg_pool_grad"
    n = len(input_size)
    if g.ndim != n + 2:
        raise op_error(name, f"expected grad_output with {n + 2} dims for input_size "
                       f"{list(input_size)}, got {list(g.shape)}")
    if not g.dtype.is_floating_point:
        raise op_error(name, f"expected a floating grad_output, got {g.dtype.name}", TypeError)
    _check_divisor(name, divisor_override)
    out = _avg_geometry(name, tuple(input_size), kernel_size, stride, padding, ceil_mode)[-1]
    if out != g.shape[2:]:
        raise op_error(name, f"an input of spatial size {list(input_size)} pools to "
                       f"{list(out)}, but grad_output has spatial size {list(g.shape[2:])}")
    return TensorMeta(g.shape[:2] + tuple(input_size), g.dtype)


def _avg_pool_grad_kernel(ctx, g, input_size, kernel_size, stride=None, padding=0,
                          ceil_mode=False, count_include_pad=True, divisor_override=None):
    gm = ctx.in_metas[0]
    spatial = tuple(input_size)
    n = len(spatial)
    k, s, d, pads, out = _avg_geometry(ctx.op, spatial, kernel_size, stride, padding,
                                       ceil_mode)
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    g = _to(ctx, g, gm.dtype, cdt)
    div = _divisor_array(ctx, spatial, k, s, pads, out, count_include_pad, divisor_override,
                         cdt)
    share = ctx.prims.binary("div", g, div)  # each tap's share of its window's gradient
    lead = gm.shape[:2]
    share = ctx.prims.reshape(share, lead + out + (1,) * n)
    cols = ctx.prims.broadcast_to(share, lead + out + k)
    padded = tuple(si + lo + hi for si, (lo, hi) in zip(spatial, pads, strict=True))
    dst = ctx.prims.full(lead + padded, cdt, 0)
    dst = ctx.prims.windows_add(dst, cols, k, s, d)
    return _to(ctx, _unpad_spatial(ctx, dst, pads, spatial), cdt, want)


def _avg_pool_grad_grad(ctx, gg):
    n = len(ctx.attrs["input_size"])
    return (op(_avg_pool_name(n), gg, **_avg_pool_params(ctx.attrs)),)


def _torch_avg_pool_grad(torch, g, input_size, kernel_size, stride=None, padding=0,
                         ceil_mode=False, count_include_pad=True, divisor_override=None):
    n = len(input_size)
    f = getattr(torch.nn.functional, f"avg_pool{n}d")
    extra = {} if n == 1 else {"divisor_override": divisor_override}
    x = torch.zeros(tuple(g.shape[:2]) + tuple(input_size), dtype=g.dtype, requires_grad=True)
    with torch.enable_grad():
        y = f(x, kernel_size, stride, padding, ceil_mode, count_include_pad, **extra)
        (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    return gx


def _avg_pool2d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 6, 6), kernel_size=2),
        Sample(r(2, 2, 7, 7), kernel_size=3, stride=2, padding=1),
        Sample(r(2, 2, 7, 6), kernel_size=3, stride=2, padding=1, ceil_mode=True,
               count_include_pad=False),
        Sample(r(2, 2, 5, 7), kernel_size=(2, 3), stride=(1, 2), padding=(1, 1),
               ceil_mode=True),
        Sample(r(2, 3, 6, 5), kernel_size=(3, 2), stride=2, padding=1, divisor_override=3),
        Sample(r(2, 3, 7, 7, dtype=np.float32), kernel_size=3, stride=2, ceil_mode=True,
               padding=1, count_include_pad=False),
        Sample((r(2, 2, 5, 5) * 10).astype(np.int64), kernel_size=2, padding=1, grad=False),
    ]


def _avg_pool1d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 7), kernel_size=2),
        Sample(r(2, 2, 7), kernel_size=3, stride=2, padding=1, ceil_mode=True,
               count_include_pad=False),
        Sample(r(2, 2, 6), kernel_size=3, stride=2, padding=1, ceil_mode=True),
        Sample(r(2, 3, 6, dtype=np.float32), kernel_size=3, stride=1, padding=1),
    ]


def _avg_pool3d_samples(rng):
    r = functools.partial(_rand, rng)
    return [Sample(r(2, 2, 5, 4, 5), kernel_size=(2, 2, 3), stride=(2, 1, 2),
                   padding=(1, 0, 1), ceil_mode=True, count_include_pad=False),
            Sample(r(2, 2, 4, 4, 4), kernel_size=2, divisor_override=5)]


_AVG_POOL_ATTRS = {"kernel_size": Attr("ints"), "stride": Attr("ints", None),
                   "padding": Attr("ints", 0), "ceil_mode": Attr("bool", False),
                   "count_include_pad": Attr("bool", True),
                   "divisor_override": Attr("int", None)}
_AVG_POOL_SAMPLES = {1: _avg_pool1d_samples, 2: _avg_pool2d_samples, 3: _avg_pool3d_samples}

for _n in (1, 2, 3):
    register(OpDef(
        _avg_pool_name(_n),
        inputs=("input",),
        # torch's avg_pool1d has no divisor_override; the op keeps one (default None) so the
        # gradient of avg_pool_grad is one op call for every rank.
        attrs=dict(_AVG_POOL_ATTRS),
        infer_meta=_avg_pool_meta(_n),
        kernel=_avg_pool_kernel,
        saves=(),
        grad=_avg_pool_grad_rule,
        sbp=functools.partial(_pool_sbp, linear=True),
        reference=f"nn.functional.avg_pool{_n}d",
        samples=_AVG_POOL_SAMPLES[_n],
        doc=f"{_n}-D average pooling.",
    ))


def _avg_pool_grad_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 3, 3), input_size=(6, 6), kernel_size=2),
        Sample(r(2, 2, 4, 4), input_size=(7, 6), kernel_size=3, stride=2, padding=1,
               ceil_mode=True, count_include_pad=False),
        Sample(r(2, 2, 3, 3), input_size=(5, 5), kernel_size=(3, 2), stride=2, padding=1,
               divisor_override=4),
        Sample(r(2, 2, 4), input_size=(7,), kernel_size=3, stride=2, padding=1, ceil_mode=True),
        Sample(r(2, 2, 3, 3, 3, dtype=np.float32), input_size=(5, 4, 4), kernel_size=2,
               padding=1, count_include_pad=False),
    ]


register(OpDef(
    "avg_pool_grad",
    inputs=("grad_output",),
    attrs={"input_size": Attr("ints"), **_AVG_POOL_ATTRS},
    infer_meta=_avg_pool_grad_meta,
    kernel=_avg_pool_grad_kernel,
    saves=(),
    grad=_avg_pool_grad_grad,
    sbp=functools.partial(_pool_sbp, linear=True),
    reference=_torch_avg_pool_grad,
    samples=_avg_pool_grad_samples,
    doc="Gradient of average pooling: each window's gradient spread over its taps.",
))


# -- adaptive average pooling -------------------------------------------------------------------
def _adaptive_name(n):
    return f"adaptive_avg_pool{n}d"


def adaptive_output_size(name, spatial, output_size) -> tuple[int, ...]:
    """An int, or one entry per spatial axis where None keeps the input size."""
    n = len(spatial)
    if output_size is None or _is_int(output_size):
        sizes = (output_size,) * n
    elif isinstance(output_size, (tuple, list)):
        sizes = tuple(output_size)
        if len(sizes) == 1 and n > 1:
            sizes = sizes * n
        if len(sizes) != n:
            raise op_error(name, f"output_size must be {n}, got {list(sizes)}")
    else:
        raise op_error(name, f"argument 'output_size' must be int or tuple of ints, not "
                       f"{type(output_size).__name__}", TypeError)
    out = []
    for s, o in zip(spatial, sizes, strict=True):
        if o is None and n == 1:  # torch's adaptive_avg_pool1d takes ints only
            raise op_error(name, "argument 'output_size' must be tuple of ints, but found "
                           "element of type NoneType", TypeError)
        if o is None:
            out.append(int(s))
        elif _is_int(o):
            out.append(int(o))
        else:
            raise op_error(name, f"output_size entries must be int or None, got {o!r}",
                           TypeError)
    if any(o < 0 for o in out):
        raise op_error(name, "elements of output_size must be greater than or equal to 0 but "
                       f"received {tuple(out)}")
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(out, size): row i averages input [floor(i*size/out), ceil((i+1)*size/out))."""
    m = np.zeros((out, size))
    for i in range(out):
        start = (i * size) // out
        end = -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _apply_per_axis(ctx, x, shape, matrices, cdt):
    """Multiply each spatial axis i of x (N, C, *spatial) by host matrix i (new, old)."""
    n = len(matrices)
    shape = tuple(shape)
    done = False
    for i, m in enumerate(matrices):
        if m.shape[0] == m.shape[1] and np.array_equal(m, np.eye(m.shape[0])):
            continue  # identity on this axis
        axis = 2 + i
        lead, size, rest = _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:])
        if i == n - 1:  # last axis: (lead, size) @ (size, new)
            mt = ctx.prims.from_host(np.ascontiguousarray(m.T), cdt)
            x = ctx.prims.matmul(ctx.prims.reshape(x, (lead, size)), mt)
        else:  # (new, size) @ (size, lead * rest): one BLAS call (a broadcast matmul over
            # lead would run lead small products outside BLAS, ~20x slower)
            xt = ctx.prims.permute(ctx.prims.reshape(x, (lead, size, rest)), (1, 0, 2))
            xt = ctx.prims.reshape(ctx.prims.contiguous(xt), (size, lead * rest))
            y = ctx.prims.matmul(ctx.prims.from_host(m, cdt), xt)
            x = ctx.prims.contiguous(ctx.prims.permute(
                ctx.prims.reshape(y, (m.shape[0], lead, rest)), (1, 0, 2)))
        shape = shape[:axis] + (m.shape[0],) + shape[axis + 1:]
        x = ctx.prims.reshape(x, shape)
        done = True
    return x if done else ctx.prims.contiguous(x)


def _adaptive_meta(n):
    name = _adaptive_name(n)

    def meta(x, output_size):
        _check_pool_input(name, x, n)
        if not x.dtype.is_floating_point:
            raise op_error(name, f"\"{name}\" not implemented for '{x.dtype.name}'",
                           NotImplementedError)
        return TensorMeta(x.shape[:2] + adaptive_output_size(name, x.shape[2:], output_size),
                          x.dtype)

    return meta


def _adaptive_sbp(x, output_size):
    sigs = _pool_sbp(x, linear=True)
    out = adaptive_output_size("adaptive_avg_pool", x.shape[2:], output_size)
    for i, (s, o) in enumerate(zip(x.shape[2:], out, strict=True)):
        if s == o and s > 1:  # (Si)->Si: an axis kept at its size is not mixed
            sigs.append(Signature((Split(2 + i),), (Split(2 + i),)))
    return sigs


def _adaptive_kernel(ctx, x, output_size):
    xm = ctx.in_metas[0]
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    out = ctx.out_metas[0].shape[2:]
    mats = [_adaptive_matrix(s, o) for s, o in zip(xm.shape[2:], out, strict=True)]
    y = _apply_per_axis(ctx, _to(ctx, x, xm.dtype, cdt), xm.shape, mats, cdt)
    return _to(ctx, y, cdt, want)


def _adaptive_grad_meta(g, input_size):
    name = "adaptive_avg_pool_grad"
    if g.ndim != len(input_size) + 2:
        raise op_error(name, f"expected grad_output with {len(input_size) + 2} dims for "
                       f"input_size {list(input_size)}, got {list(g.shape)}")
    if not g.dtype.is_floating_point:
        raise op_error(name, f"expected a floating grad_output, got {g.dtype.name}", TypeError)
    if any(s <= 0 for s in input_size):
        raise op_error(name, f"input_size must be positive, got {list(input_size)}")
    return TensorMeta(g.shape[:2] + tuple(input_size), g.dtype)


def _adaptive_grad_kernel(ctx, g, input_size):
    gm = ctx.in_metas[0]
    want = ctx.out_metas[0].dtype
    cdt = _compute_dtype(want)
    mats = [_adaptive_matrix(s, o).T for s, o in zip(input_size, gm.shape[2:], strict=True)]
    y = _apply_per_axis(ctx, _to(ctx, g, gm.dtype, cdt), gm.shape, mats, cdt)
    return _to(ctx, y, cdt, want)


def _torch_adaptive_grad(torch, g, input_size):
    f = getattr(torch.nn.functional, f"adaptive_avg_pool{len(input_size)}d")
    x = torch.zeros(tuple(g.shape[:2]) + tuple(input_size), dtype=g.dtype, requires_grad=True)
    with torch.enable_grad():
        y = f(x, tuple(g.shape[2:]))
        (gx,) = torch.autograd.grad(y, x, g, create_graph=True)
    return gx


def _adaptive2d_samples(rng):
    r = functools.partial(_rand, rng)
    return [
        Sample(r(2, 3, 7, 5), output_size=(3, 2)),
        Sample(r(2, 2, 6, 6), output_size=3),
        Sample(r(2, 2, 5, 7), output_size=(None, 3)),
        Sample(r(2, 4, 5, 6), output_size=1),
        Sample(r(2, 2, 4, 5), output_size=(6, 7)),
        Sample(r(2, 3, 7, 6, dtype=np.float32), output_size=(4, 4)),
    ]


def _adaptive1d_samples(rng):
    r = functools.partial(_rand, rng)
    return [Sample(r(2, 3, 7), output_size=3), Sample(r(2, 2, 5), output_size=(1,)),
            Sample(r(2, 2, 6, dtype=np.float32), output_size=4)]


def _adaptive3d_samples(rng):
    return [Sample(_rand(rng, 2, 2, 5, 4, 6), output_size=(2, None, 4))]


_ADAPTIVE_SAMPLES = {1: _adaptive1d_samples, 2: _adaptive2d_samples, 3: _adaptive3d_samples}

for _n in (1, 2, 3):
    register(OpDef(
        _adaptive_name(_n),
        inputs=("input",),
        attrs={"output_size": Attr("any")},
        infer_meta=_adaptive_meta(_n),
        kernel=_adaptive_kernel,
        saves=(),
        grad=lambda ctx, g: (op("adaptive_avg_pool_grad", g,
                                input_size=ctx.in_metas[0].shape[2:]),),
        sbp=_adaptive_sbp,
        reference=f"nn.functional.adaptive_avg_pool{_n}d",
        samples=_ADAPTIVE_SAMPLES[_n],
        doc=f"{_n}-D adaptive average pooling: one averaging matmul per spatial axis.",
    ))


register(OpDef(
    "adaptive_avg_pool_grad",
    inputs=("grad_output",),
    attrs={"input_size": Attr("ints")},
    infer_meta=_adaptive_grad_meta,
    kernel=_adaptive_grad_kernel,
    saves=(),
    grad=lambda ctx, gg: (op(_adaptive_name(len(ctx.attrs["input_size"])), gg,
                             output_size=ctx.in_metas[0].shape[2:]),),
    sbp=functools.partial(_pool_sbp, linear=True),
    reference=_torch_adaptive_grad,
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3, 3, 2), input_size=(7, 5)),
        Sample(_rand(rng, 2, 2, 1, 1), input_size=(5, 6)),
        Sample(_rand(rng, 2, 2, 4), input_size=(6,)),
        Sample(_rand(rng, 2, 2, 2, 3, 2, dtype=np.float32), input_size=(3, 5, 4)),
    ],
    doc="Gradient of adaptive average pooling: the transposed averaging matrices.",
))


# -- adaptive max pooling -----------------------------------------------------------------------
def _adaptive_max_name(n):
    return f"adaptive_max_pool{n}d"


@functools.lru_cache(maxsize=256)
def _adaptive_index_map(spatial: tuple, out: tuple) -> np.ndarray:
    """(prod(out), K) flat input indices: window i of an axis spans
    [floor(i*size/out), ceil((i+1)*size/out)); windows differ in length, so each axis pads its
    taps to the longest one by repeating the window's last position.

    A repeated tap neither changes a maximum nor, scanned in order, its index: an element's
    first and last visits keep torch's row-major scan order (first maximum wins, last NaN)."""
    n = len(spatial)
    per_axis = []
    for size, o in zip(spatial, out, strict=True):
        start = (np.arange(o) * size) // o
        end = -((-(np.arange(o) + 1) * size) // o)
        k = int((end - start).max())
        pos = np.minimum(start[:, None] + np.arange(k)[None, :], end[:, None] - 1)
        per_axis.append(pos)
    kernel = tuple(p.shape[1] for p in per_axis)
    flat = np.zeros(tuple(out) + kernel, dtype=np.int64)
    step = 1
    for i in reversed(range(n)):
        shape = [1] * (2 * n)
        shape[i], shape[n + i] = out[i], kernel[i]
        flat += per_axis[i].reshape(shape) * step
        step *= spatial[i]
    return flat.reshape(math.prod(out), math.prod(kernel))


def _adaptive_max_meta(n):
    name = _adaptive_max_name(n)

    def meta(x, output_size):
        _check_pool_input(name, x, n)
        if not x.dtype.is_floating_point:
            raise op_error(name, f"\"{name}\" not implemented for '{x.dtype.name}'",
                           NotImplementedError)
        out = adaptive_output_size(name, x.shape[2:], output_size)
        if any(o == 0 for o in out):
            raise op_error(name, f"output_size must be positive, got {list(out)}")
        shape = x.shape[:2] + out
        return TensorMeta(shape, x.dtype), TensorMeta(shape, dt.int64)

    return meta


def _adaptive_max_kernel(ctx, x, output_size):
    xm = ctx.in_metas[0]
    spatial = tuple(xm.shape[2:])
    out = tuple(ctx.out_metas[0].shape[2:])
    lead = xm.shape[:2]
    host = _adaptive_index_map(spatial, out)
    index_map = ctx.prims.from_host(host, dt.int64)  # (L_out, K)
    flat = ctx.prims.reshape(x, lead + (_prod(spatial),))
    vals = ctx.prims.index(flat, (slice(None), slice(None), index_map))  # (N, C, L_out, K)
    shape = lead + (host.shape[0],)
    # The running maximum of max pooling (see _max_pool_kernel): strictly greater or NaN wins.
    best = indices = None
    for t in range(host.shape[1]):
        value = ctx.prims.slice(vals, (Ellipsis, t))
        where = ctx.prims.slice(index_map, (slice(None), t))
        if best is None:
            best = ctx.prims.contiguous(value)
            indices = ctx.prims.contiguous(ctx.prims.broadcast_to(where, shape))
            continue
        wins = ctx.prims.binary("logical_or", ctx.prims.binary("gt", value, best),
                                ctx.prims.unary("isnan", value))
        best = ctx.prims.binary("maximum", best, value)
        step = ctx.prims.binary("mul", wins, ctx.prims.binary("sub", where, indices))
        indices = ctx.prims.binary("add", indices, step)
    return (ctx.prims.reshape(best, lead + out),
            ctx.prims.reshape(ctx.prims.contiguous(indices), lead + out))


def _torch_adaptive_max(n):
    def ref(torch, x, output_size):
        f = getattr(torch.nn.functional, f"adaptive_max_pool{n}d")
        return f(x, output_size, return_indices=True)

    return ref


def _adaptive_max2d_samples(rng):
    r = functools.partial(_rand, rng)
    ties = np.round(r(2, 2, 7, 6) * 1.5)  # many equal values: the first maximum wins
    nans = r(2, 2, 5, 5)
    nans[0, 0, 1, 1] = nans[1, 1, 4, 3] = nans[1, 1, 4, 4] = np.nan
    return [
        Sample(r(2, 3, 7, 5), output_size=(3, 2)),
        Sample(r(2, 2, 6, 6), output_size=3),
        Sample(r(2, 2, 5, 7), output_size=(None, 3)),
        Sample(r(2, 2, 4, 5), output_size=(6, 7)),
        Sample(r(2, 3, 7, 6, dtype=np.float32), output_size=(4, 1)),
        Sample(ties, output_size=(3, 4), grad=False),
        Sample(nans, output_size=(2, 2), grad=False),
    ]


def _adaptive_max1d_samples(rng):
    r = functools.partial(_rand, rng)
    return [Sample(r(2, 3, 7), output_size=3), Sample(r(2, 2, 5), output_size=(1,)),
            Sample(r(2, 2, 6, dtype=np.float32), output_size=4)]


def _adaptive_max3d_samples(rng):
    return [Sample(_rand(rng, 2, 2, 5, 4, 6), output_size=(2, None, 4))]


_ADAPTIVE_MAX_SAMPLES = {1: _adaptive_max1d_samples, 2: _adaptive_max2d_samples,
                         3: _adaptive_max3d_samples}

for _n in (1, 2, 3):
    register(OpDef(
        _adaptive_max_name(_n),
        inputs=("input",),
        outputs=("out", "indices"),
        attrs={"output_size": Attr("any")},
        infer_meta=_adaptive_max_meta(_n),
        kernel=_adaptive_max_kernel,
        saves=("indices",),
        grad=_max_pool_grad_rule,
        sbp=functools.partial(_pool_sbp, n_outputs=2),
        reference=_torch_adaptive_max(_n),
        samples=_ADAPTIVE_MAX_SAMPLES[_n],
        doc=f"{_n}-D adaptive max pooling: values and flat input indices; the gradient is "
            "max_pool_grad's scatter.",
    ))
