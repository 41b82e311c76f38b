"""Batch normalisation in training mode as one op (and its gradient as another).

`batch_norm(input, weight, bias, eps)` normalises x (N, C, ...) per channel with the batch's
own statistics and returns (y, mean, var), the variance biased, as F.batch_norm computes them
in training mode; the functional form updates the running statistics from mean and var.  The
kernel is one fused loop per channel where the device has it (`Primitives.batch_norm_train`),
else the composition of primitives below.  The gradient is the `batch_norm_grad` op, unless a
double backward is being built (grad mode on in backward), where it is composed of
differentiable ops.  Half-precision inputs, affine=False and eval mode stay with the composed
functional form.
"""

from __future__ import annotations

from .._core import dtype as dt
from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from .registry import Attr, OpDef, Sample, differentiating, op, register

_FLOATS = (dt.float32, dt.float64)


def _check(name, x, vectors):
    if x.ndim < 2:
        raise op_error(name, f"expected 2D or more input (got {x.ndim}D input)", ValueError)
    if x.dtype not in _FLOATS:
        raise op_error(name, f"argument 'input' must be float32 or float64, got {x.dtype.name}",
                       TypeError)
    c = x.shape[1]
    for arg, m in vectors:
        if m.shape != (c,):
            raise op_error(name, f"argument '{arg}' must have shape [{c}] (the channels of "
                                 f"input), got {list(m.shape)}")
        if m.dtype is not x.dtype:
            raise op_error(name, f"argument '{arg}' must have dtype {x.dtype.name} (input's), "
                                 f"got {m.dtype.name}", TypeError)
    return TensorMeta((c,), x.dtype)


def _reduced_axes(ndim):
    return (0,) + tuple(range(2, ndim))


def _bn_meta(x, weight, bias, eps):
    stat = _check("batch_norm", x, (("weight", weight), ("bias", bias)))
    return x, stat, stat


def _composed_forward(ctx, x, w, b, eps):
    """The fused loop's result from the other primitives (devices without the loop)."""
    p, d = ctx.prims, ctx.in_metas[0].dtype
    xm = ctx.in_metas[0]
    axes = _reduced_axes(xm.ndim)
    inv = p.full((), d, 1.0 / max(xm.numel // xm.shape[1], 1))
    shape = (xm.shape[1],) + (1,) * (xm.ndim - 2)
    mean = p.binary("mul", p.reduce("sum", x, axes, True), inv)
    xc = p.binary("sub", x, mean)
    var = p.binary("mul", p.reduce("sum", p.binary("mul", xc, xc), axes, True), inv)
    rstd = p.unary("rsqrt", p.binary("add", var, p.full((), d, eps)))
    y = p.binary("add", p.binary("mul", p.binary("mul", xc, rstd), p.reshape(w, shape)),
                 p.reshape(b, shape))
    c = (xm.shape[1],)
    return y, p.contiguous(p.reshape(mean, c)), p.contiguous(p.reshape(var, c))


def _bn_kernel(ctx, x, weight, bias, eps):
    out = ctx.prims.batch_norm_train(x, weight, bias, eps)
    return out if out is not None else _composed_forward(ctx, x, weight, bias, eps)


def _bn_grad(ctx, g, g_mean, g_var):
    x, w = ctx.input(0), ctx.input(1)
    mean, var = ctx.output(1), ctx.output(2)
    eps = ctx.attrs["eps"]
    need = ctx.needs_input_grad
    if not differentiating():  # a plain backward: one fused op
        dx, dw, db = op("batch_norm_grad", g, x, w, mean, var, g_mean, g_var, eps=eps)
    else:  # create_graph: differentiable ops, so the gradient has a gradient
        xm = ctx.in_metas[0]
        axes = _reduced_axes(xm.ndim)
        shape = (xm.shape[1],) + (1,) * (xm.ndim - 2)
        inv = 1.0 / max(xm.numel // xm.shape[1], 1)
        rstd = op("rsqrt", op("add_scalar", var, other=eps)).reshape(shape)
        xc = x - mean.reshape(shape)
        xhat = xc * rstd
        sg = op("sum", g, dim=axes, keepdim=True)
        sgx = op("sum", g * xhat, dim=axes, keepdim=True)
        dx = (w.reshape(shape) * rstd * (g - sg * inv - xhat * (sgx * inv))
              + g_mean.reshape(shape) * inv + xc * (g_var.reshape(shape) * (2.0 * inv)))
        dw, db = sgx.reshape(xm.shape[1]), sg.reshape(xm.shape[1])
    return (dx if need[0] else None, dw if need[1] else None, db if need[2] else None)


def _bn_sbp(x, weight, bias, eps):
    sigs = [Signature((B, B, B), (B, B, B))]
    if x.shape[1] > 1:  # channels are independent: split them, with their vectors
        sigs.append(Signature((Split(1), Split(0), Split(0)), (Split(1), Split(0), Split(0))))
    # y = xhat * weight + bias is linear in the (weight, bias) pair; the statistics are x's.
    sigs.append(Signature((B, P, P), (P, B, B)))
    return sigs


def _torch_bn(torch, x, w, b, eps=1e-5):
    dims = _reduced_axes(x.ndim)
    y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True, eps=eps)
    return y, x.mean(dims), x.var(dims, unbiased=False)


def _rand(rng, *shape, dtype="float64"):
    return rng.standard_normal(shape).astype(dtype)


def _bn_samples(rng):
    def case(shape, dtype="float64", **kw):
        c = shape[1]
        return Sample(_rand(rng, *shape, dtype=dtype) * 2 + 0.5, _rand(rng, c, dtype=dtype),
                      _rand(rng, c, dtype=dtype), **kw)

    return [case((4, 3, 5)), case((2, 3, 2, 2), eps=1e-3),
            case((3, 4, 6), dtype="float32", grad=False)]


register(OpDef(
    "batch_norm",
    inputs=("input", "weight", "bias"),
    outputs=("out", "mean", "var"),
    attrs={"eps": Attr("float", 1e-5)},
    infer_meta=_bn_meta,
    kernel=_bn_kernel,
    grad=_bn_grad,
    saves=("input", "weight", "mean", "var"),
    sbp=_bn_sbp,
    reference=_torch_bn,
    samples=_bn_samples,
    doc="Training-mode batch normalisation: (y, batch mean, biased batch variance).",
))


# -- the gradient ------------------------------------------------------------------------------
def _bn_grad_meta(g, x, weight, mean, var, grad_mean, grad_var, eps):
    stat = _check("batch_norm_grad", x, (("weight", weight), ("mean", mean), ("var", var),
                                        ("grad_mean", grad_mean), ("grad_var", grad_var)))
    if g != x:
        raise op_error("batch_norm_grad", f"argument 'grad' must match input "
                                          f"({list(x.shape)}, {x.dtype.name}), got "
                                          f"{list(g.shape)}, {g.dtype.name}")
    return x, stat, stat


def _composed_backward(ctx, g, x, w, mean, var, gm, gv, eps):
    p, d = ctx.prims, ctx.in_metas[1].dtype
    xm = ctx.in_metas[1]
    axes = _reduced_axes(xm.ndim)
    shape = (xm.shape[1],) + (1,) * (xm.ndim - 2)
    c = (xm.shape[1],)
    inv = p.full((), d, 1.0 / max(xm.numel // xm.shape[1], 1))

    def col(v):
        return p.reshape(v, shape)

    rstd = p.unary("rsqrt", p.binary("add", col(var), p.full((), d, eps)))
    xc = p.binary("sub", x, col(mean))
    xhat = p.binary("mul", xc, rstd)
    sg = p.reduce("sum", g, axes, True)
    sgx = p.reduce("sum", p.binary("mul", g, xhat), axes, True)
    inner = p.binary("sub", p.binary("sub", g, p.binary("mul", sg, inv)),
                     p.binary("mul", xhat, p.binary("mul", sgx, inv)))
    dx = p.binary("mul", p.binary("mul", col(w), rstd), inner)
    dx = p.binary("add", dx, p.binary("mul", col(gm), inv))
    two = p.full((), d, 2.0)
    dx = p.binary("add", dx, p.binary("mul", xc, p.binary("mul", col(gv),
                                                           p.binary("mul", two, inv))))
    return dx, p.contiguous(p.reshape(sgx, c)), p.contiguous(p.reshape(sg, c))


def _bn_grad_kernel(ctx, g, x, weight, mean, var, grad_mean, grad_var, eps):
    out = ctx.prims.batch_norm_grad(g, x, weight, mean, var, grad_mean, grad_var, eps)
    if out is None:
        out = _composed_backward(ctx, g, x, weight, mean, var, grad_mean, grad_var, eps)
    return out


def _bn_grad_sbp(g, x, weight, mean, var, grad_mean, grad_var, eps):
    sigs = [Signature((B,) * 7, (B, B, B))]
    if x.shape[1] > 1:
        s0 = Split(0)
        sigs.append(Signature((Split(1), Split(1), s0, s0, s0, s0, s0), (Split(1), s0, s0)))
    return sigs


def _torch_bn_grad(torch, g, x, w, mean, var, gm, gv, eps=1e-5):
    dims = _reduced_axes(x.ndim)
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    count = x.numel() // x.shape[1]
    rstd = torch.rsqrt(var + eps).reshape(shape)
    xc = x - mean.reshape(shape)
    xhat = xc * rstd
    sg, sgx = g.sum(dims, keepdim=True), (g * xhat).sum(dims, keepdim=True)
    dx = (w.reshape(shape) * rstd * (g - sg / count - xhat * sgx / count)
          + gm.reshape(shape) / count + xc * gv.reshape(shape) * 2 / count)
    return dx, sgx.reshape(-1), sg.reshape(-1)


def _bn_grad_samples(rng):
    def case(shape, dtype="float64"):
        c = shape[1]
        x = _rand(rng, *shape, dtype=dtype)
        axes = _reduced_axes(len(shape))
        return Sample(_rand(rng, *shape, dtype=dtype), x, _rand(rng, c, dtype=dtype),
                      x.mean(axis=axes), x.var(axis=axes), _rand(rng, c, dtype=dtype),
                      _rand(rng, c, dtype=dtype), grad=False)

    # One sample: seven inputs make thousands of SBP combinations for the global-ops check.
    return [case((2, 3, 2))]


register(OpDef(
    "batch_norm_grad",
    inputs=("grad", "input", "weight", "mean", "var", "grad_mean", "grad_var"),
    outputs=("grad_input", "grad_weight", "grad_bias"),
    attrs={"eps": Attr("float", 1e-5)},
    infer_meta=_bn_grad_meta,
    kernel=_bn_grad_kernel,
    sbp=_bn_grad_sbp,
    reference=_torch_bn_grad,
    samples=_bn_grad_samples,
    doc="The gradients of batch_norm's outputs with respect to input, weight and bias.",
))
