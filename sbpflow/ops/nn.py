"""NN ops: activations, the softmax family, layer norm, dropout, linear, embedding,
embedding_bag, one_hot and the loss cores (nll_loss, binary_cross_entropy, ctc_loss).

The hot ops (relu, gelu, softmax, log_softmax, layer_norm, nll_loss) run as one kernel each;
their grads are written with ops so double backward works.  Where a backward is itself hot or
needs a scatter it is an op of its own, as OneFlow's `*_grad` ops: `gelu_grad`,
`softmax_grad`, `log_softmax_grad`, `nll_loss_grad`, `embedding_grad` (whose grads are again
written with ops), and `layer_norm_grad`, used by a plain backward only (a double backward
composes differentiable ops instead).  Composite functions (losses, attention, group norm)
live in `framework/functional/nn.py`; training-mode batch norm is `ops/batch_norm.py`.

Half-precision inputs are computed in float32 and rounded once at the end, as torch's CPU
kernels accumulate in float32.
"""

from __future__ import annotations

import math

import numpy as np

from .._core import dtype as dt
from .._core.errors import normalize_dim, op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split, einsum_signatures, elementwise_signatures
from ._util import cast_array, require_float, unbroadcast
from .registry import Attr, OpDef, Sample, differentiating, op, register

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_BETA = math.sqrt(2.0 / math.pi)  # tanh approximation: tanh(beta * (x + kappa x^3))
_GELU_KAPPA = 0.044715


def _compute_dtype(d: dt.DType) -> dt.DType:
    return dt.float32 if d in (dt.float16, dt.bfloat16) else d


class _Prims:
    """Shorthand for kernels: primitive calls in one compute dtype; Python numbers become 0-d
    device constants of that dtype (so results keep the dtype)."""

    __slots__ = ("p", "dtype")

    def __init__(self, ctx, dtype: dt.DType):
        self.p = ctx.prims
        self.dtype = dtype

    def c(self, v):
        return self.p.full((), self.dtype, v) if isinstance(v, (int, float)) else v

    def bin(self, name, a, b):
        return self.p.binary(name, self.c(a), self.c(b))

    def add(self, a, b):
        return self.bin("add", a, b)

    def sub(self, a, b):
        return self.bin("sub", a, b)

    def mul(self, a, b):
        return self.bin("mul", a, b)

    def div(self, a, b):
        return self.bin("div", a, b)

    def u(self, name, x, out=None):
        return self.p.unary(name, x, out=out)

    def to(self, name, a, b, out):
        """a (op) b written into `out` (a fresh array of the kernel's, or an operand's memory
        it may overwrite); returns out."""
        return self.p.binary(name, self.c(a), self.c(b), out=out)

    def where(self, cond, a, b):
        return self.p.where(cond, self.c(a), self.c(b))

    def sum(self, x, axes, keepdims=False):
        return self.p.reduce("sum", x, tuple(axes), keepdims)


def _in_compute(ctx, arrays, metas=None):
    """Cast kernel inputs to the compute dtype of output 0; returns (prims helper, arrays)."""
    out = ctx.out_metas[0].dtype
    cd = _compute_dtype(out)
    metas = ctx.in_metas[: len(arrays)] if metas is None else metas
    return _Prims(ctx, cd), [cast_array(ctx, a, m.dtype, cd)
                             for a, m in zip(arrays, metas, strict=True)]


def _finish(ctx, y, i=0):
    """Round a compute-dtype result to the inferred output dtype."""
    want = ctx.out_metas[i].dtype
    return y if _compute_dtype(want) is want else ctx.prims.cast(y, want)


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _away(x, kinks, gap=0.05):
    """Push sample points off the kinks of a piecewise function (finite differences)."""
    x = np.array(x)
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, gap, -gap) * 2
    return x


def _unary_sbp(x, **attrs):
    return elementwise_signatures([x.shape], x.shape)


# =========================================================================================
# Activations
# =========================================================================================
def _float_meta(name):
    def meta(x, **attrs):
        require_float(name, "input", x)
        return x

    return meta


def _activation_kernel(forward):
    def kernel(ctx, x, **attrs):
        k, (x,) = _in_compute(ctx, (x,))
        return _finish(ctx, forward(k, x, **attrs))

    return kernel


def _activation_samples(kinks=(), scale=2.0, extra=()):
    def samples(rng):
        return [
            Sample(_away(_rand(rng, 3, 4) * scale, kinks)),
            Sample(_away(_rand(rng, 2, 3, 5) * scale, kinks)),
            Sample(_away(np.asarray(rng.standard_normal() * scale + 0.5), kinks)),
            Sample(_away(_rand(rng, 4, 3, dtype=np.float32) * scale, kinks), grad=False),
            *(extra(rng) if callable(extra) else extra),
        ]

    return samples


def _register_activation(name, forward, grad, attrs=None, kinks=(), reference=None,
                         scale=2.0, meta=None, extra_samples=(), saves=("input",),
                         specialize=None):
    register(OpDef(
        name,
        inputs=("input",),
        attrs=attrs or {},
        infer_meta=meta or _float_meta(name),
        kernel=_activation_kernel(forward),
        specialize=specialize,
        grad=grad,
        saves=saves,
        # Pointwise and nonlinear: any split or B passes through, never P.
        sbp=_unary_sbp,
        reference=reference or f"nn.functional.{name}",
        samples=_activation_samples(kinks, scale, extra_samples),
    ))


# -- relu -----------------------------------------------------------------------------------
def _relu_meta(x):
    if x.dtype is dt.bool_:
        raise op_error("relu", "Boolean inputs not supported for relu", TypeError)
    return x


def _relu_grad(ctx, g):
    # From the output, as torch's threshold_backward: y > 0 exactly where x > 0.
    return (g * (ctx.output(0) > 0),)


def _relu_direct(ctx, attrs):
    """specialize: maximum(x, zeros) with the zeros made once, where x is in its compute dtype.
    The zeros have x's whole shape: NumPy's maximum against a broadcast 0-d zero is 1.3x
    slower than against an array of the same shape (the cached call only covers small outputs)."""
    out = ctx.out_metas[0]
    if not out.shape or _compute_dtype(out.dtype) is not out.dtype:
        return None
    maximum = ctx.prims.direct_elementwise("maximum")
    zeros = ctx.prims.full(out.shape, out.dtype, 0)
    return lambda x: maximum(x, zeros)


_register_activation(
    "relu", lambda k, x: k.bin("maximum", x, 0), _relu_grad, kinks=(0,), meta=_relu_meta,
    saves=("out",), specialize=_relu_direct,
    extra_samples=(Sample(np.array([[-3, 0, 2], [5, -1, 7]], np.int64), grad=False),),
)


# -- leaky_relu -----------------------------------------------------------------------------
def _leaky_relu_fwd(k, x, negative_slope):
    return k.where(k.bin("gt", x, 0), x, k.mul(x, negative_slope))


def _leaky_relu_grad(ctx, g):
    x = ctx.input(0)
    return (op("where", x > 0, g, g * ctx.attrs["negative_slope"]),)


_register_activation(
    "leaky_relu", _leaky_relu_fwd, _leaky_relu_grad,
    attrs={"negative_slope": Attr("float", 0.01)}, kinks=(0,),
    extra_samples=(Sample(np.array([-2.0, -0.5, 0.7, 3.0]), negative_slope=0.2),),
)


# -- elu (also selu and celu: torch's elu(alpha, scale, input_scale)) ---------------------------
def _elu_fwd(k, x, alpha, scale, input_scale):
    # exp of min(x, 0) only: the positive branch would overflow and is discarded anyway.
    neg = k.mul(k.u("expm1", k.mul(k.bin("minimum", x, 0), input_scale)), alpha * scale)
    return k.where(k.bin("gt", x, 0), k.mul(x, scale), neg)


def _elu_grad(ctx, g):
    x = ctx.input(0)
    a = ctx.attrs
    # Clamped like the forward so the unselected branch stays finite (0 * inf is nan).
    neg = g * (op("exp", x.clamp(max=0) * a["input_scale"]) * (a["alpha"] * a["scale"]
                                                                * a["input_scale"]))
    return (op("where", x > 0, g * a["scale"], neg),)


_register_activation(
    "elu", _elu_fwd, _elu_grad,
    attrs={"alpha": Attr("float", 1.0), "scale": Attr("float", 1.0),
           "input_scale": Attr("float", 1.0)},
    kinks=(0,),
    reference=lambda torch, x, alpha=1.0, scale=1.0, input_scale=1.0: torch.ops.aten.elu(
        x, alpha, scale, input_scale),
    extra_samples=(
        Sample(_away(np.linspace(-4, 3, 12), (0,)), alpha=1.6732632423543772,
               scale=1.0507009873554805),
        Sample(_away(np.linspace(-4, 3, 12), (0,)), alpha=2.0, input_scale=0.5),
    ),
)


# -- silu, mish, softplus, logsigmoid -------------------------------------------------------
def _silu_grad(ctx, g):
    x = ctx.input(0)
    s = op("sigmoid", x)
    return (g * (s * (1 + x * (1 - s))),)


_register_activation("silu", lambda k, x: k.mul(x, k.u("sigmoid", x)), _silu_grad)


def _softplus_fwd(k, x, beta=1.0, threshold=20.0):
    # log1p(exp(z)) computed as max(z, 0) + log1p(exp(-|z|)): no overflow for any z.
    z = k.mul(x, beta)
    soft = k.div(k.add(k.bin("maximum", z, 0), k.u("log1p", k.u("exp", k.u("neg",
                                                                           k.u("abs", z))))),
                 beta)
    return k.where(k.bin("gt", z, threshold), x, soft)


def _softplus_grad(ctx, g):
    x = ctx.input(0)
    beta, threshold = ctx.attrs["beta"], ctx.attrs["threshold"]
    z = x * beta
    return (op("where", z > threshold, g, g * op("sigmoid", z)),)


_register_activation(
    "softplus", _softplus_fwd, _softplus_grad,
    attrs={"beta": Attr("float", 1.0), "threshold": Attr("float", 20.0)},
    extra_samples=(
        Sample(np.array([-30.0, -2.0, 0.3, 4.0, 25.0]), beta=2.0, threshold=10.0),
        Sample(np.array([-1.0, 0.5, 9.0, 11.0]), beta=0.5, threshold=5.0),
    ),
)


def _mish_fwd(k, x):
    return k.mul(x, k.u("tanh", _softplus_fwd(k, x)))


def _mish_grad(ctx, g):
    x = ctx.input(0)
    t = op("tanh", op("softplus", x))
    s = op("sigmoid", x)
    return (g * (t + x * s * (1 - t * t)),)


_register_activation("mish", _mish_fwd, _mish_grad)


def _logsigmoid_fwd(k, x):
    # log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), stable for both signs.
    return k.sub(k.bin("minimum", x, 0), k.u("log1p", k.u("exp", k.u("neg", k.u("abs", x)))))


def _logsigmoid_grad(ctx, g):
    return (g * op("sigmoid", op("neg", ctx.input(0))),)


_register_activation("logsigmoid", _logsigmoid_fwd, _logsigmoid_grad, scale=5.0)


# -- hardtanh, hardsigmoid, hardswish -------------------------------------------------------
def _hardtanh_meta(x, min_val, max_val):
    require_float("hardtanh", "input", x)
    if min_val > max_val:
        raise op_error("hardtanh", f"min_val ({min_val}) cannot be greater than max_val "
                       f"({max_val})", ValueError)
    return x


def _hardtanh_grad(ctx, g):
    x = ctx.input(0)
    lo, hi = ctx.attrs["min_val"], ctx.attrs["max_val"]
    return ((g * (x > lo)) * (x < hi),)


_register_activation(
    "hardtanh",
    lambda k, x, min_val, max_val: k.bin("minimum", k.bin("maximum", x, min_val), max_val),
    _hardtanh_grad, attrs={"min_val": Attr("float", -1.0), "max_val": Attr("float", 1.0)},
    kinks=(-1, 1), meta=_hardtanh_meta,
    extra_samples=(Sample(_away(np.linspace(-2, 8, 11), (0, 6)), min_val=0.0, max_val=6.0),),
)


def _hardsigmoid_fwd(k, x):
    return k.div(k.bin("minimum", k.bin("maximum", k.add(x, 3.0), 0), 6.0), 6.0)


def _hardsigmoid_grad(ctx, g):
    x = ctx.input(0)
    return ((g * (x > -3)) * (x < 3) * (1.0 / 6.0),)


_register_activation("hardsigmoid", _hardsigmoid_fwd, _hardsigmoid_grad, kinks=(-3, 3),
                     scale=4.0)


def _hardswish_fwd(k, x):
    return k.mul(x, _hardsigmoid_fwd(k, x))


def _hardswish_grad(ctx, g):
    x = ctx.input(0)
    # torch: 0 below -3, g * (x/3 + 1/2) on [-3, 3], g above.
    inner = op("where", x <= 3, g * (x * (1.0 / 3.0) + 0.5), g)
    return (inner * (x >= -3),)


_register_activation("hardswish", _hardswish_fwd, _hardswish_grad, kinks=(-3, 3), scale=4.0)


# -- gelu -----------------------------------------------------------------------------------
def _check_approximate(name, approximate):
    if approximate not in ("none", "tanh"):
        raise op_error(name, "approximate argument must be either none or tanh.")


def _gelu_meta(x, approximate):
    require_float("gelu", "input", x)
    _check_approximate("gelu", approximate)
    return x


def _gelu_fwd(k, x, approximate):
    y = k.p.gelu(x, approximate)  # one loop, where the device has it
    if y is not None:
        return y
    if approximate == "tanh":
        inner = k.mul(k.add(x, k.mul(k.mul(k.mul(x, x), x), _GELU_KAPPA)), _GELU_BETA)
        return k.mul(k.mul(x, 0.5), k.add(k.u("tanh", inner), 1.0))
    # (x * 0.5) * (erf(x * sqrt(1/2)) + 1), each step into a buffer of its own (fresh
    # arrays per step cost page faults on large activations)
    xc = k.mul(x, _SQRT1_2)
    r = k.u("erf", xc)  # a fresh array
    r = k.to("add", r, 1.0, r)
    r = k.to("mul", k.to("mul", x, 0.5, xc), r, r)
    scratch = [xc]
    del xc
    k.p.release(scratch)  # back to the cache (when it came from there)
    return r


_register_activation(
    "gelu", _gelu_fwd,
    lambda ctx, g: (op("gelu_grad", g, ctx.input(0), approximate=ctx.attrs["approximate"]),),
    attrs={"approximate": Attr("str", "none")}, meta=_gelu_meta,
    extra_samples=lambda rng: (
        Sample(_rand(rng, 3, 4) * 3, approximate="tanh"),
        Sample(np.array([-9.0, -1.0, 0.0, 2.0], np.float32), approximate="tanh", grad=False),
    ),
)


def _gelu_grad_meta(dy, x, approximate):
    _check_approximate("gelu_backward", approximate)
    if dy.shape != x.shape or dy.dtype is not x.dtype:
        raise op_error("gelu_backward", f"grad_output {list(dy.shape)} {dy.dtype.name} must "
                       f"match input {list(x.shape)} {x.dtype.name}")
    require_float("gelu_backward", "input", x)
    return x


def _gelu_grad_kernel(ctx, dy, x, approximate):
    k, (dy, x) = _in_compute(ctx, (dy, x))
    r = k.p.gelu_grad(dy, x, approximate)  # one loop, where the device has it
    if r is not None:
        return _finish(ctx, r)
    if approximate == "tanh":
        x_sq = k.mul(x, x)
        inner = k.mul(k.add(x, k.mul(k.mul(x_sq, x), _GELU_KAPPA)), _GELU_BETA)
        t = k.u("tanh", inner)
        left = k.mul(k.add(t, 1.0), 0.5)
        d_inner = k.mul(k.add(k.mul(x_sq, 3.0 * _GELU_KAPPA), 1.0), _GELU_BETA)
        right = k.mul(k.mul(k.mul(x, 0.5), k.sub(1.0, k.mul(t, t))), d_inner)
        return _finish(ctx, k.mul(dy, k.add(left, right)))
    # dy * (cdf + x * pdf), cdf = (erf(x sqrt(1/2)) + 1) * 0.5, pdf = exp(x x * -0.5) / sqrt(2
    # pi); in two buffers (see _gelu_fwd)
    buf = k.mul(x, _SQRT1_2)
    cdf = k.u("erf", buf)  # a fresh array
    cdf = k.to("mul", k.to("add", cdf, 1.0, cdf), 0.5, cdf)
    pdf = k.to("mul", k.to("mul", x, x, buf), -0.5, buf)
    pdf = k.to("mul", k.u("exp", pdf, out=pdf), _INV_SQRT_2PI, pdf)
    r = k.to("add", cdf, k.to("mul", x, pdf, pdf), cdf)
    scratch = [buf]
    del buf, pdf
    k.p.release(scratch)  # back to the cache (when it came from there)
    return _finish(ctx, k.to("mul", dy, r, r))


def _gelu_second_derivative(x, approximate):
    if approximate == "tanh":
        x_sq = x * x
        t = op("tanh", (x + x_sq * x * _GELU_KAPPA) * _GELU_BETA)
        d_inner = (x_sq * (3.0 * _GELU_KAPPA) + 1.0) * _GELU_BETA
        dd_inner = x * (6.0 * _GELU_KAPPA * _GELU_BETA)
        return (1 - t * t) * (d_inner - x * t * d_inner * d_inner + x * dd_inner * 0.5)
    pdf = op("exp", x * x * -0.5) * _INV_SQRT_2PI
    return pdf * (2 - x * x)


def _gelu_grad_grad(ctx, gg):
    approximate = ctx.attrs["approximate"]
    g_dy = g_x = None
    if ctx.needs_input_grad[0]:
        # gelu_grad is linear in dy.
        g_dy = op("gelu_grad", gg, ctx.input(1), approximate=approximate)
    if ctx.needs_input_grad[1]:
        g_x = gg * ctx.input(0) * _gelu_second_derivative(ctx.input(1), approximate)
    return g_dy, g_x


register(OpDef(
    "gelu_grad",
    inputs=("grad_output", "input"),
    attrs={"approximate": Attr("str", "none")},
    infer_meta=_gelu_grad_meta,
    kernel=_gelu_grad_kernel,
    grad=_gelu_grad_grad,
    saves=("grad_output for input", "input"),
    # Pointwise; linear in grad_output, so (P, B) -> P.
    sbp=lambda dy, x, approximate: elementwise_signatures([dy.shape, x.shape], x.shape,
                                                          partial=[("P", "B")]),
    reference=lambda torch, dy, x, approximate="none": torch.ops.aten.gelu_backward(
        dy, x, approximate=approximate),
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), _rand(rng, 3, 4) * 2),
        Sample(_rand(rng, 2, 5), _rand(rng, 2, 5) * 2, approximate="tanh"),
        Sample(_rand(rng, 4, dtype=np.float32), _rand(rng, 4, dtype=np.float32), grad=False),
    ],
))


# =========================================================================================
# softmax, log_softmax
# =========================================================================================
def _softmax_meta(name):
    def meta(x, dim, dtype=None):
        normalize_dim(name, dim, x.ndim)
        out = x.dtype if dtype is None else dtype
        if not out.is_floating_point:
            raise op_error(name, f"expected a floating point input or dtype, got "
                           f"{out.name}", TypeError)
        return TensorMeta(x.shape, out)

    return meta


def _softmax_kernel(prim_name):
    log = prim_name == "log_softmax"

    def kernel(ctx, x, dim, dtype=None):
        xm = ctx.in_metas[0]
        k, (x,) = _in_compute(ctx, (x,))
        if xm.ndim == 0:  # a single element is its own softmax axis
            y = getattr(ctx.prims, prim_name)(ctx.prims.reshape(x, (1,)), 0)
            return _finish(ctx, ctx.prims.reshape(y, ()))
        axis = normalize_dim("", dim, xm.ndim)
        if axis == xm.ndim - 1:  # over the last axis: one loop per row, where the device has it
            y = ctx.prims.softmax_rows(x, log)
            if y is not None:
                return _finish(ctx, y)
        if 0 in xm.shape:  # NumPy's max over an empty axis has no identity; the result is empty
            return ctx.prims.full(xm.shape, ctx.out_metas[0].dtype, 0)
        return _finish(ctx, getattr(ctx.prims, prim_name)(x, axis))

    return kernel


def _to_input_dtype(ctx, g):
    want = ctx.in_metas[0].dtype
    return g if g.dtype is want else op("to_dtype", g, dtype=want)


def _softmax_grad(ctx, g):
    y = ctx.output(0)
    dim = ctx.attrs["dim"]
    if ctx.in_metas[0].ndim == 0:
        gy = g * y
        return (_to_input_dtype(ctx, gy - y * gy),)
    return (_to_input_dtype(ctx, op("softmax_grad", g, y, dim=dim)),)


def _log_softmax_grad(ctx, g):
    y = ctx.output(0)
    dim = ctx.attrs["dim"]
    if ctx.in_metas[0].ndim == 0:
        return (_to_input_dtype(ctx, g - op("exp", y) * g),)
    return (_to_input_dtype(ctx, op("log_softmax_grad", g, y, dim=dim)),)


def _softmax_sbp(x, dim, dtype=None):
    d = normalize_dim("softmax", dim, x.ndim)
    sigs = [Signature((B,), (B,))]
    for i, n in enumerate(x.shape):
        if i != d and n > 1:
            sigs.append(Signature((Split(i),), (Split(i),)))  # rows normalise independently
    return sigs


def _softmax_samples(rng):
    return [
        Sample(_rand(rng, 3, 5), dim=1),
        Sample(_rand(rng, 2, 3, 4), dim=0),
        Sample(_rand(rng, 2, 3, 4), dim=-1),
        Sample(_rand(rng, 2, 1, 4), dim=1),
        Sample(np.asarray(0.7), dim=0),
        Sample(_rand(rng, 4, 3, dtype=np.float32), dim=-1, dtype=dt.float64),
        Sample(_rand(rng, 4, 3, dtype=np.float32) * 30, dim=0, grad=False),
        Sample((_rand(rng, 3, 4) * 3).astype(np.int64), dim=1, dtype=dt.float32, grad=False),
    ]


def _softmax_reference(name):
    def ref(torch, x, dim, dtype=None):
        # The harness hands dtype attrs over as torch dtypes.
        return getattr(torch.nn.functional, name)(x, dim=dim, dtype=dtype)

    return ref


for _name, _grad in (("softmax", _softmax_grad), ("log_softmax", _log_softmax_grad)):
    register(OpDef(
        _name,
        inputs=("input",),
        attrs={"dim": Attr("int"), "dtype": Attr("dtype", None)},
        infer_meta=_softmax_meta(_name),
        kernel=_softmax_kernel(_name),
        grad=_grad,
        saves=("out",),
        sbp=_softmax_sbp,
        reference=_softmax_reference(_name),
        samples=_softmax_samples,
    ))


# softmax_grad, log_softmax_grad (OneFlow's ops of the same names): the input gradient from
# the output y and its gradient g, one loop per row over the last axis where the device has
# it.  softmax: g y - y sum(g y); log_softmax: g - exp(y) sum(g) (sums over dim).
def _softmax_grad_meta(name):
    def meta(g, y, dim):
        normalize_dim(name, dim, y.ndim)
        if g.shape != y.shape or g.dtype is not y.dtype:
            raise op_error(name, f"grad_output {list(g.shape)} {g.dtype.name} must match "
                           f"output {list(y.shape)} {y.dtype.name}")
        require_float(name, "output", y)
        return y

    return meta


def _softmax_grad_kernel(log):
    def kernel(ctx, g, y, dim):
        ym = ctx.in_metas[1]
        k, (g, y) = _in_compute(ctx, (g, y))
        axis = normalize_dim("", dim, ym.ndim)
        if axis == ym.ndim - 1:
            gx = k.p.softmax_grad_rows(y, g, log)  # one loop, where the device has it
            if gx is not None:
                return _finish(ctx, gx)
        if log:
            return _finish(ctx, k.sub(g, k.mul(k.u("exp", y), k.sum(g, (axis,), True))))
        gy = k.mul(g, y)
        return _finish(ctx, k.sub(gy, k.mul(y, k.sum(gy, (axis,), True))))

    return kernel


def _softmax_grad_grad(ctx, gg):
    # softmax_grad(g, y) = y (g - s), s = sum(g y): linear in g, and self-adjoint there;
    # d/dy <gg, .> = gg (g - s) - g sum(gg y)
    y = ctx.input(1)
    dim = ctx.attrs["dim"]
    d_g = op("softmax_grad", gg, y, dim=dim) if ctx.needs_input_grad[0] else None
    d_y = None
    if ctx.needs_input_grad[1]:
        g = ctx.input(0)  # (saved only for this gradient)
        s = op("sum", g * y, dim=dim, keepdim=True)
        d_y = gg * (g - s) - g * op("sum", gg * y, dim=dim, keepdim=True)
    return d_g, d_y


def _log_softmax_grad_grad(ctx, gg):
    # log_softmax_grad(g, y) = g - exp(y) sum(g): d/dg <gg, .> = gg - sum(gg exp(y)),
    # d/dy <gg, .> = -gg exp(y) sum(g)
    dim = ctx.attrs["dim"]
    e = op("exp", ctx.input(1))
    d_g = d_y = None
    if ctx.needs_input_grad[0]:
        d_g = gg - op("sum", gg * e, dim=dim, keepdim=True)
    if ctx.needs_input_grad[1]:
        g = ctx.input(0)  # (saved only for this gradient)
        d_y = -(gg * e * op("sum", g, dim=dim, keepdim=True))
    return d_g, d_y


def _softmax_grad_sbp(g, y, dim):
    d = normalize_dim("softmax_grad", dim, y.ndim)
    sigs = [Signature((B, B), (B,))]
    for i, n in enumerate(y.shape):
        if i != d and n > 1:
            sigs.append(Signature((Split(i), Split(i)), (Split(i),)))  # rows are independent
    sigs.append(Signature((P, B), (P,)))  # linear in grad_output
    return sigs


def _softmax_grad_samples(log):
    def samples(rng):
        def case(shape, dim, dtype=np.float64, **kw):
            x = _rand(rng, *shape, dtype=dtype)
            m = x.max(axis=dim, keepdims=True)
            ls = x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))
            y = (ls if log else np.exp(ls)).astype(dtype)
            return Sample(_rand(rng, *shape, dtype=dtype), y, dim=dim, **kw)

        return [case((3, 5), 1), case((2, 3, 4), 0), case((2, 3, 13), -1),
                case((4, 7), -1, np.float32, grad=False)]

    return samples


def _softmax_grad_reference(aten_name):
    def ref(torch, g, y, dim):
        return getattr(torch.ops.aten, aten_name)(g, y, dim, g.dtype)

    return ref


for _name, _log, _gg in (("softmax_grad", False, _softmax_grad_grad),
                         ("log_softmax_grad", True, _log_softmax_grad_grad)):
    register(OpDef(
        _name,
        inputs=("grad_output", "output"),
        attrs={"dim": Attr("int")},
        infer_meta=_softmax_grad_meta(_name),
        kernel=_softmax_grad_kernel(_log),
        grad=_gg,
        saves=("grad_output for output", "output"),
        sbp=_softmax_grad_sbp,
        reference=_softmax_grad_reference(
            "_log_softmax_backward_data" if _log else "_softmax_backward_data"),
        samples=_softmax_grad_samples(_log),
    ))


# =========================================================================================
# layer_norm
# =========================================================================================
def _norm_axes(ndim, normalized_shape):
    return tuple(range(ndim - len(normalized_shape), ndim))


def _layer_norm_meta(x, weight, bias, normalized_shape, eps):
    ns = tuple(normalized_shape)
    if not ns:
        raise op_error("layer_norm", "Expected normalized_shape to be at least 1-dimensional, "
                       "i.e., containing at least one element, but got normalized_shape = []")
    for arg, m in (("weight", weight), ("bias", bias)):
        if m.shape != ns:
            raise op_error("layer_norm", f"Expected {arg} to be of same shape as "
                           f"normalized_shape, but got {arg} of shape {list(m.shape)} and "
                           f"normalized_shape = {list(ns)}")
    if x.ndim < len(ns) or x.shape[x.ndim - len(ns):] != ns:
        raise op_error("layer_norm", f"Given normalized_shape={list(ns)}, expected input with "
                       f"shape [*, {', '.join(map(str, ns))}], but got input of size"
                       f"{list(x.shape)}")
    require_float("layer_norm", "input", x)
    for arg, m in (("weight", weight), ("bias", bias)):
        if m.dtype is not x.dtype:
            raise op_error("layer_norm", f"expected {arg} to have dtype {x.dtype.name}, but "
                           f"got {m.dtype.name}", TypeError)
    return x


def _layer_norm_kernel(ctx, x, weight, bias, normalized_shape, eps):
    xm = ctx.in_metas[0]
    k, (x, weight, bias) = _in_compute(ctx, (x, weight, bias))
    y = k.p.layer_norm_rows(x, weight, bias, eps)  # one loop, where the device has it
    if y is not None:
        return _finish(ctx, y)
    axes = _norm_axes(xm.ndim, normalized_shape)
    n = math.prod(xm.shape[a] for a in axes)
    inv_n = 1.0 / n if n else 0.0
    mean = k.mul(k.sum(x, axes, True), inv_n)
    xc = k.sub(x, mean)
    var = k.mul(k.sum(k.mul(xc, xc), axes, True), inv_n)
    xhat = k.mul(xc, k.u("rsqrt", k.add(var, eps)))
    return _finish(ctx, k.add(k.mul(xhat, weight), bias))


def _layer_norm_grad(ctx, g):
    """Recomputes the statistics from the saved input (one fused forward, no extra outputs):
    dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = g * weight.
    A plain backward runs it as one `layer_norm_grad` op; a double backward (grad mode on)
    composes differentiable ops."""
    xm = ctx.in_metas[0]
    ns, eps = ctx.attrs["normalized_shape"], ctx.attrs["eps"]
    if not differentiating():
        gx, gw, gb = op("layer_norm_grad", g, ctx.input(0), ctx.input(1),
                        normalized_shape=ns, eps=eps)
        need = ctx.needs_input_grad
        return gx if need[0] else None, gw if need[1] else None, gb if need[2] else None
    axes = _norm_axes(xm.ndim, ns)
    batch = tuple(range(xm.ndim - len(ns)))
    inv_n = 1.0 / max(math.prod(ns), 1)
    x = ctx.input(0)
    xc = x - op("sum", x, dim=axes, keepdim=True) * inv_n
    rstd = op("rsqrt", op("sum", xc * xc, dim=axes, keepdim=True) * inv_n + eps)
    xhat = xc * rstd
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:
        dxhat = g * ctx.input(1)
        m1 = op("sum", dxhat, dim=axes, keepdim=True) * inv_n
        m2 = op("sum", dxhat * xhat, dim=axes, keepdim=True) * inv_n
        gx = rstd * (dxhat - m1 - xhat * m2)
    if ctx.needs_input_grad[1]:
        gw = g * xhat
        gw = op("sum", gw, dim=batch) if batch else gw
    if ctx.needs_input_grad[2]:
        gb = op("sum", g, dim=batch) if batch else g
    return gx, gw, gb


def _layer_norm_sbp(x, weight, bias, normalized_shape, eps):
    sigs = [Signature((B, B, B), (B,))]
    for i in range(x.ndim - len(normalized_shape)):
        if x.shape[i] > 1:
            # Rows normalise independently; weight and bias are whole on every rank.
            sigs.append(Signature((Split(i), B, B), (Split(i),)))
    # y = xhat * weight + bias is linear in the (weight, bias) pair.
    sigs.append(Signature((B, P, P), (P,)))
    return sigs


def _layer_norm_samples(rng):
    def case(shape, ns, dtype=np.float64, **kw):
        return Sample(_rand(rng, *shape, dtype=dtype) * 2 + 0.5,
                      _rand(rng, *ns, dtype=dtype), _rand(rng, *ns, dtype=dtype),
                      normalized_shape=ns, **kw)

    return [
        case((3, 5), (5,)),
        case((2, 3, 4), (3, 4)),
        case((4,), (4,), eps=1e-3),
        case((2, 1, 3), (3,)),
        case((4, 6), (6,), dtype=np.float32, grad=False),
    ]


register(OpDef(
    "layer_norm",
    inputs=("input", "weight", "bias"),
    attrs={"normalized_shape": Attr("ints"), "eps": Attr("float", 1e-5)},
    infer_meta=_layer_norm_meta,
    kernel=_layer_norm_kernel,
    grad=_layer_norm_grad,
    saves=("input", "weight"),
    sbp=_layer_norm_sbp,
    reference=lambda torch, x, w, b, normalized_shape, eps=1e-5: torch.nn.functional.layer_norm(
        x, normalized_shape, w, b, eps),
    samples=_layer_norm_samples,
))


def _layer_norm_grad_meta(g, x, weight, normalized_shape, eps):
    _layer_norm_meta(x, weight, weight, normalized_shape, eps)
    if g != x:
        raise op_error("layer_norm_grad", f"argument 'grad' must match input "
                                          f"({list(x.shape)}, {x.dtype.name}), got "
                                          f"{list(g.shape)}, {g.dtype.name}")
    return x, weight, weight


def _layer_norm_grad_kernel(ctx, g, x, weight, normalized_shape, eps):
    xm = ctx.in_metas[1]
    out = ctx.prims.layer_norm_grad_rows(g, x, weight, eps)  # one loop, where it exists
    if out is not None:
        return out
    k, (g, x, weight) = _in_compute(ctx, (g, x, weight), ctx.in_metas)
    axes = _norm_axes(xm.ndim, normalized_shape)
    batch = tuple(range(xm.ndim - len(normalized_shape)))
    inv_n = 1.0 / max(math.prod(normalized_shape), 1)
    xc = k.sub(x, k.mul(k.sum(x, axes, True), inv_n))
    rstd = k.u("rsqrt", k.add(k.mul(k.sum(k.mul(xc, xc), axes, True), inv_n), eps))
    xhat = k.mul(xc, rstd)
    dxhat = k.mul(g, weight)
    m1 = k.mul(k.sum(dxhat, axes, True), inv_n)
    m2 = k.mul(k.sum(k.mul(dxhat, xhat), axes, True), inv_n)
    gx = k.mul(rstd, k.sub(k.sub(dxhat, m1), k.mul(xhat, m2)))
    gw = k.sum(k.mul(g, xhat), batch) if batch else k.mul(g, xhat)
    gb = k.sum(g, batch) if batch else g
    return _finish(ctx, gx, 0), _finish(ctx, gw, 1), _finish(ctx, ctx.prims.contiguous(gb), 2)


def _layer_norm_grad_sbp(g, x, weight, normalized_shape, eps):
    sigs = [Signature((B, B, B), (B, B, B))]
    for i in range(x.ndim - len(normalized_shape)):
        if x.shape[i] > 1:
            # Rows are independent; the weight and bias gradients sum over rows: partial.
            sigs.append(Signature((Split(i), Split(i), B), (Split(i), P, P)))
    sigs.append(Signature((P, B, B), (P, P, P)))  # linear in the output gradient
    return sigs


def _torch_layer_norm_grad(torch, g, x, w, normalized_shape, eps=1e-5):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = torch.zeros_like(w, requires_grad=True)
    y = torch.nn.functional.layer_norm(x, normalized_shape, w, b, eps)
    return torch.autograd.grad(y, (x, w, b), g)


def _layer_norm_grad_samples(rng):
    def case(shape, ns, dtype=np.float64, **kw):
        return Sample(_rand(rng, *shape, dtype=dtype), _rand(rng, *shape, dtype=dtype) * 2 + 0.5,
                      _rand(rng, *ns, dtype=dtype), normalized_shape=ns, grad=False, **kw)

    return [case((3, 5), (5,)), case((2, 3, 4), (3, 4), eps=1e-3),
            case((4, 6), (6,), dtype=np.float32)]


register(OpDef(
    "layer_norm_grad",
    inputs=("grad", "input", "weight"),
    outputs=("grad_input", "grad_weight", "grad_bias"),
    attrs={"normalized_shape": Attr("ints"), "eps": Attr("float", 1e-5)},
    infer_meta=_layer_norm_grad_meta,
    kernel=_layer_norm_grad_kernel,
    sbp=_layer_norm_grad_sbp,
    reference=_torch_layer_norm_grad,
    samples=_layer_norm_grad_samples,
    doc="layer_norm's gradients for input, weight and bias (statistics recomputed from input).",
))


# =========================================================================================
# dropout
# =========================================================================================
def _dropout_meta(x, p):
    if not 0.0 <= p <= 1.0:
        raise op_error("dropout", f"dropout probability has to be between 0 and 1, but got {p}",
                       ValueError)
    require_float("dropout", "input", x)
    return x, TensorMeta(x.shape, dt.bool_)


def _dropout_kernel(ctx, x, p):
    """out = x * keep / (1 - p), keep ~ Bernoulli(1 - p), drawn for this piece of the logical
    tensor only, so every SBP of the same tensor sees the same mask."""
    keep = ctx.prims.random("bernoulli", dt.bool_, ctx.seed, ctx.offset,
                            ctx.logical_out[1].shape, ctx.piece(1), p=1.0 - p)
    k, (x,) = _in_compute(ctx, (x,))
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    y = k.mul(k.mul(x, ctx.prims.cast(keep, k.dtype)), scale)
    return _finish(ctx, y), keep


def _dropout_grad(ctx, g, _g_mask=None):
    p = ctx.attrs["p"]
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return (g * ctx.output(1) * scale,)


def _dropout_sbp(x, p):
    sigs = [Signature((B,), (B, B))]
    for i, n in enumerate(x.shape):
        if n > 1:
            sigs.append(Signature((Split(i),), (Split(i), Split(i))))
    # Linear in x for a fixed mask, and every rank draws the same mask: (P) -> (P, B).
    sigs.append(Signature((P,), (P, B)))
    return sigs


def _dropout_reference(torch, x, p):
    # Only the deterministic edge cases p = 0 (keep all) and p = 1 (drop all) are samples.
    assert p in (0.0, 1.0), "dropout samples must be deterministic"
    keep = torch.full(x.shape, p == 0.0, dtype=torch.bool)
    return torch.nn.functional.dropout(x, p, training=True), keep


register(OpDef(
    "dropout",
    inputs=("input",),
    outputs=("out", "mask"),
    attrs={"p": Attr("float", 0.5)},
    infer_meta=_dropout_meta,
    kernel=_dropout_kernel,
    grad=_dropout_grad,
    saves=("mask",),
    sbp=_dropout_sbp,
    reference=_dropout_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 3, 4), p=0.0),
        Sample(_rand(rng, 3, 4), p=1.0),
        Sample(_rand(rng, 2, 3, 2, dtype=np.float32), p=0.0, grad=False),
        Sample(np.asarray(1.5), p=1.0),
    ],
    random=True,
))


# =========================================================================================
# linear
# =========================================================================================
def _linear_meta(x, weight, bias):
    if x.ndim == 0:
        raise op_error("linear", "input must have at least 1 dimension, got a 0-d tensor")
    if weight.ndim != 2:
        raise op_error("linear", f"weight must be 2-D [out_features, in_features], got shape "
                       f"{list(weight.shape)}")
    n, k = weight.shape
    if x.shape[-1] != k:
        rows = math.prod(x.shape[:-1])
        raise op_error("linear", f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                       f"{x.shape[-1]} and {k}x{n})")
    if x.dtype is not weight.dtype or x.dtype is not bias.dtype:
        raise op_error("linear", f"expected input, weight and bias to have the same dtype, but "
                       f"got: {x.dtype.name}, {weight.dtype.name}, {bias.dtype.name}")
    if bias.ndim > 1 or (bias.ndim == 1 and bias.shape[0] not in (1, n)):
        raise op_error("linear", f"bias must have shape [{n}], got {list(bias.shape)}")
    require_float("linear", "input", x)
    return TensorMeta(x.shape[:-1] + (n,), x.dtype)


def _linear_kernel(ctx, x, weight, bias):
    y = ctx.prims.matmul(x, ctx.prims.permute(weight, (1, 0)))
    if y.shape == ctx.out_metas[0].shape and y.dtype == ctx.out_metas[0].dtype.np:
        return ctx.prims.binary("add", y, bias, out=y)  # y is the GEMM's fresh result
    return ctx.prims.binary("add", y, bias)


def _linear_grad(ctx, g):
    xm, wm, bm = ctx.in_metas
    n, k = wm.shape
    gx = gw = gb = None
    if ctx.needs_input_grad[0]:
        gx = op("matmul", g, ctx.input(1))
    if ctx.needs_input_grad[1]:
        # (The reshape op always copies: skip it where the operands are matrices already.)
        g2 = g if g.ndim == 2 else op("reshape", g, shape=(-1, n))
        x = ctx.input(0)
        x2 = x if xm.ndim == 2 else op("reshape", x, shape=(-1, k))
        gw = op("matmul", op("transpose", g2, dim0=0, dim1=1), x2)
    if ctx.needs_input_grad[2]:
        gb = unbroadcast(g, bm)
    return gx, gw, gb


def _linear_sbp(x, weight, bias):
    batch = "abcdefgh"[: x.ndim - 1]
    spec = f"{batch}k,nk->{batch}n"
    sigs = []
    for s in einsum_signatures(spec, [x.shape, weight.shape]):
        (out,) = s.outputs
        if out == P:
            b_sbp = P  # the partial pieces of x @ w.T carry partial pieces of the bias
        elif out == Split(x.ndim - 1):
            if bias.ndim == 0 or bias.shape[0] == 1:
                continue  # a broadcast bias cannot follow a split of out_features
            b_sbp = Split(0)  # columns of the output take their slice of the bias
        else:
            b_sbp = B
        sigs.append(Signature(s.inputs + (b_sbp,), s.outputs))
    return sigs


register(OpDef(
    "linear",
    inputs=("input", "weight", "bias"),
    infer_meta=_linear_meta,
    kernel=_linear_kernel,
    grad=_linear_grad,
    saves=("input for weight", "weight for input"),
    sbp=_linear_sbp,
    reference="nn.functional.linear",
    samples=lambda rng: [
        Sample(_rand(rng, 4, 3), _rand(rng, 5, 3), _rand(rng, 5)),
        Sample(_rand(rng, 2, 3, 4), _rand(rng, 2, 4), _rand(rng, 2)),
        Sample(_rand(rng, 3), _rand(rng, 4, 3), _rand(rng, 4)),
        Sample(_rand(rng, 3, 2), _rand(rng, 3, 2), np.asarray(0.5)),
        Sample(_rand(rng, 5, 3, dtype=np.float32), _rand(rng, 2, 3, dtype=np.float32),
               _rand(rng, 2, dtype=np.float32), grad=False),
    ],
))


# =========================================================================================
# embedding
# =========================================================================================
def _check_indices(name, arg, m):
    if m.dtype not in (dt.int64, dt.int32):
        raise op_error(name, f"Expected tensor for argument '{arg}' to have one of the "
                       f"following scalar types: Long, Int; but got {m.dtype.name} instead",
                       TypeError)


def _out_of_range(ctx, idx, n):
    """An index of the int64 array `idx` outside [0, n): the minimum if it is negative, else
    the maximum; None when all are in range.

    Data-dependent, so the kernel checks it, as torch's CPU kernels do before reading: two
    scalars read on the host by whichever thread runs the kernel, never a sync of the Python
    thread.  On a worker the error surfaces at the next sync point, like a CUDA device-side
    assert; inline or in SYNC mode it raises at once.  A global op checks each rank's piece,
    so only the ranks holding a bad index raise."""
    if 0 in idx.shape:
        return None
    p = ctx.prims
    axes = tuple(range(idx.ndim))
    lo = int(p.to_host(p.reduce("min", idx, axes)))
    if lo < 0:
        return lo
    hi = int(p.to_host(p.reduce("max", idx, axes)))
    return hi if hi >= n else None


def _checked_indices(ctx, idx, idx_meta, n):
    """Indices as int64, every one a row of a table of n rows (else torch's IndexError)."""
    idx = cast_array(ctx, idx, idx_meta.dtype, dt.int64)
    bad = _out_of_range(ctx, idx, n)
    if bad is not None:
        raise IndexError(f"embedding(): index out of range in self (index {bad}, table of {n} "
                         "rows)")
    return idx


def _embedding_meta(indices, weight, padding_idx=None, scale_grad_by_freq=False):
    _check_indices("embedding", "indices", indices)
    if weight.ndim != 2:
        raise op_error("embedding", "'weight' must be 2-D")
    if padding_idx is not None and not 0 <= padding_idx < weight.shape[0]:
        raise op_error("embedding", f"padding_idx must be within [0, {weight.shape[0]}), got "
                       f"{padding_idx}", ValueError)
    return TensorMeta(indices.shape + (weight.shape[1],), weight.dtype)


def _embedding_kernel(ctx, indices, weight, padding_idx=None, scale_grad_by_freq=False):
    idx = _checked_indices(ctx, indices, ctx.in_metas[0], ctx.in_metas[1].shape[0])
    return ctx.prims.index(weight, (idx,))


def _embedding_grad(ctx, g):
    if not ctx.needs_input_grad[1]:
        return None, None
    return None, op("embedding_grad", g, ctx.input(0), num_weights=ctx.in_metas[1].shape[0],
                    padding_idx=ctx.attrs["padding_idx"],
                    scale_grad_by_freq=ctx.attrs["scale_grad_by_freq"])


def _embedding_sbp(indices, weight, padding_idx=None, scale_grad_by_freq=False):
    nd = indices.ndim
    sigs = [Signature((B, B), (B,))]
    for i, n in enumerate(indices.shape):
        if n > 1:
            sigs.append(Signature((Split(i), B), (Split(i),)))  # each rank looks up its rows
    if weight.shape[1] > 1:
        sigs.append(Signature((B, Split(1)), (Split(nd),)))  # columns of the table
    sigs.append(Signature((B, P), (P,)))  # a lookup is linear in the table
    return sigs


def _embedding_samples(rng):
    return [
        Sample(np.array([[0, 2, 4], [4, 3, 0]]), _rand(rng, 5, 3)),
        # The padding row gets no gradient by definition, which finite differences disagree
        # with: grads are compared with torch in tests/ops/test_nn_extra.py instead.
        Sample(np.array([1, 1, 3]), _rand(rng, 4, 2), padding_idx=1, grad=False),
        Sample(np.array(2), _rand(rng, 3, 4)),
        Sample(np.array([[2, 0]], np.int32), _rand(rng, 3, 2, dtype=np.float32), grad=False),
    ]


def _embedding_reference(torch, indices, weight, padding_idx=None, scale_grad_by_freq=False):
    return torch.nn.functional.embedding(indices, weight, padding_idx,
                                         scale_grad_by_freq=scale_grad_by_freq)


register(OpDef(
    "embedding",
    inputs=("input", "weight"),
    attrs={"padding_idx": Attr("int", None), "scale_grad_by_freq": Attr("bool", False)},
    infer_meta=_embedding_meta,
    kernel=_embedding_kernel,
    grad=_embedding_grad,
    saves=("input",),  # the indices
    sbp=_embedding_sbp,
    reference=_embedding_reference,
    samples=_embedding_samples,
))


def _embedding_grad_meta(g, indices, num_weights, padding_idx=None, scale_grad_by_freq=False):
    _check_indices("embedding_backward", "indices", indices)
    if g.ndim != indices.ndim + 1 or g.shape[:-1] != indices.shape:
        raise op_error("embedding_backward", f"grad_output of shape {list(g.shape)} does not "
                       f"match indices of shape {list(indices.shape)} + [embedding_dim]")
    require_float("embedding_backward", "grad_output", g)
    return TensorMeta((num_weights, g.shape[-1]), g.dtype)


def _embedding_grad_kernel(ctx, g, indices, num_weights, padding_idx=None,
                           scale_grad_by_freq=False):
    p = ctx.prims
    gm = ctx.in_metas[0]
    dim = gm.shape[-1]
    count = math.prod(gm.shape[:-1])
    out_dtype = ctx.out_metas[0].dtype
    k = _Prims(ctx, _compute_dtype(out_dtype))
    idx = p.reshape(_checked_indices(ctx, indices, ctx.in_metas[1], num_weights), (count,))
    rows = p.reshape(p.contiguous(cast_array(ctx, g, gm.dtype, k.dtype)), (count, dim))
    if padding_idx is not None:
        # Lookups of the padding row contribute nothing.
        keep = p.binary("ne", idx, p.full((), dt.int64, padding_idx))
        rows = k.mul(rows, p.reshape(p.cast(keep, k.dtype), (count, 1)))
    if scale_grad_by_freq:
        freq = p.index_put(p.full((num_weights,), k.dtype, 0), (idx,),
                           p.full((count,), k.dtype, 1), accumulate=True)
        rows = k.div(rows, p.reshape(p.index(freq, (idx,)), (count, 1)))
    out = p.index_put(p.full((num_weights, dim), k.dtype, 0), (idx,), rows, accumulate=True)
    return _finish(ctx, out)


def _embedding_grad_grad(ctx, gg):
    if not ctx.needs_input_grad[0]:
        return None, None
    indices = ctx.input(1)
    a = ctx.attrs
    # embedding_grad is linear in grad_output; its adjoint is a lookup, masked and scaled
    # exactly like the forward.
    out = op("embedding", indices, gg)
    if a["padding_idx"] is not None:
        out = out * op("reshape", indices != a["padding_idx"],
                       shape=tuple(indices.shape) + (1,))
    if a["scale_grad_by_freq"]:
        ones = op("full", shape=tuple(indices.shape) + (1,), fill_value=1.0, dtype=gg.dtype,
                  _device=gg._where())  # where gg lives (a placement for a global op)
        freq = op("embedding_grad", ones, indices, num_weights=a["num_weights"])
        out = out / op("embedding", indices, freq)
    return out, None


def _embedding_grad_sbp(g, indices, num_weights, padding_idx=None, scale_grad_by_freq=False):
    sigs = [Signature((B, B), (B,))]
    if not scale_grad_by_freq:  # counts must be global: only whole batches are allowed then
        for i, n in enumerate(indices.shape):
            if n > 1:
                # Each rank scatters its part of the batch: partial sums of the table's grad.
                sigs.append(Signature((Split(i), Split(i)), (P,)))
    if g.shape[-1] > 1:
        sigs.append(Signature((Split(g.ndim - 1), B), (Split(1),)))  # columns independently
    sigs.append(Signature((P, B), (P,)))  # linear in grad_output
    return sigs


def _embedding_grad_reference(torch, g, indices, num_weights, padding_idx=None,
                              scale_grad_by_freq=False):
    return torch.ops.aten.embedding_dense_backward(
        g, indices, num_weights, -1 if padding_idx is None else padding_idx, scale_grad_by_freq)


register(OpDef(
    "embedding_grad",
    inputs=("grad_output", "indices"),
    attrs={"num_weights": Attr("int"), "padding_idx": Attr("int", None),
           "scale_grad_by_freq": Attr("bool", False)},
    infer_meta=_embedding_grad_meta,
    kernel=_embedding_grad_kernel,
    grad=_embedding_grad_grad,
    saves=("indices",),
    sbp=_embedding_grad_sbp,
    reference=_embedding_grad_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 2, 3, 4), np.array([[0, 2, 4], [4, 3, 0]]), num_weights=5),
        Sample(_rand(rng, 4, 2), np.array([1, 1, 3, 0]), num_weights=4, padding_idx=1),
        Sample(_rand(rng, 4, 2), np.array([1, 1, 3, 0]), num_weights=4,
               scale_grad_by_freq=True, grad=False),
        Sample(_rand(rng, 3), np.array(2), num_weights=3),
    ],
))


# =========================================================================================
# one_hot
# =========================================================================================
def _one_hot_meta(x, num_classes):
    if x.dtype is not dt.int64:
        raise op_error("one_hot", "one_hot is only applicable to index tensor of type "
                       f"LongTensor, got {x.dtype.name}", TypeError)
    if num_classes < 0:
        raise op_error("one_hot", f"num_classes must be non-negative, got {num_classes} (the "
                       "functional one_hot infers -1 from the data)", ValueError)
    return TensorMeta(x.shape + (num_classes,), dt.int64)


def _one_hot_kernel(ctx, x, num_classes):
    # Checked here, not by the caller: a data-dependent check would sync the Python thread.
    if 0 not in x.shape:
        axes = tuple(range(x.ndim))
        if int(ctx.prims.to_host(ctx.prims.reduce("min", x, axes))) < 0:
            raise RuntimeError("Class values must be non-negative.")
        if int(ctx.prims.to_host(ctx.prims.reduce("max", x, axes))) >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    # The classes this piece covers: a split of the class axis gets its own range.
    cls = ctx.piece(0)[-1]
    start = cls.start or 0
    stop = num_classes if cls.stop is None else cls.stop
    classes = ctx.prims.from_host(np.arange(start, stop, dtype=np.int64), dt.int64)
    hit = ctx.prims.binary("eq", ctx.prims.slice(x, (Ellipsis, None)), classes)
    return ctx.prims.cast(hit, dt.int64)


def _one_hot_sbp(x, num_classes):
    sigs = [Signature((B,), (B,))]
    for i, n in enumerate(x.shape):
        if n > 1:
            sigs.append(Signature((Split(i),), (Split(i),)))
    if num_classes > 1:
        sigs.append(Signature((B,), (Split(x.ndim),)))  # each rank owns a range of classes
    return sigs


register(OpDef(
    "one_hot",
    inputs=("input",),
    attrs={"num_classes": Attr("int")},
    infer_meta=_one_hot_meta,
    kernel=_one_hot_kernel,
    sbp=_one_hot_sbp,
    reference=lambda torch, x, num_classes: torch.nn.functional.one_hot(x, num_classes),
    samples=lambda rng: [
        Sample(np.array([0, 3, 1, 3]), num_classes=4),
        Sample(np.array([[0, 2], [1, 1], [2, 0]]), num_classes=5),
        Sample(np.array(1), num_classes=2),
        Sample(np.zeros((0,), np.int64), num_classes=3),
    ],
))


# =========================================================================================
# nll_loss (the core of cross_entropy)
# =========================================================================================
_NLL_REDUCTIONS = ("none", "sum")


def _check_nll_target_shape(name, x, t):
    """torch's errors: ValueError for a batch mismatch, RuntimeError for spatial sizes."""
    if x.ndim == 1:
        if t.ndim != 0:
            raise op_error(name, f"For 1D input, target must be 0-D, but got target size: "
                           f"{list(t.shape)}", ValueError)
        return
    if t.ndim == 0 or t.shape[0] != x.shape[0]:
        raise op_error(name, f"Expected input batch_size ({x.shape[0]}) to match target "
                       f"batch_size ({t.shape[0] if t.ndim else 0}).", ValueError)
    if t.shape[1:] != x.shape[2:]:
        raise op_error(name, f"Expected target size {list(x.shape[:1] + x.shape[2:])}, got "
                       f"{list(t.shape)}")


def _nll_meta(x, target, weight, reduction="none", ignore_index=-100):
    name = "nll_loss"
    if reduction not in _NLL_REDUCTIONS:
        raise op_error(name, f"reduction must be one of {_NLL_REDUCTIONS} (the functional "
                       f"nll_loss divides by total_weight for 'mean'), got {reduction!r}",
                       ValueError)
    if x.ndim == 0:
        raise op_error(name, "Expected 1 or more dimensions (got 0)", ValueError)
    require_float(name, "input", x)
    if target.dtype not in (dt.int64, dt.uint8):
        raise op_error(name, f"expected target dtype to be Long or Byte, but got "
                       f"{target.dtype.name}", TypeError)
    _check_nll_target_shape(name, x, target)
    c = x.shape[1] if x.ndim >= 2 else x.shape[0]
    if weight.shape != (c,):
        raise op_error(name, f"weight tensor should be defined either for all {c} classes or "
                       f"no classes but got weight tensor of shape: {list(weight.shape)}")
    if weight.dtype is not x.dtype:
        raise op_error(name, f"expected weight of dtype {x.dtype.name}, got "
                       f"{weight.dtype.name}", TypeError)
    out = target.shape if reduction == "none" else ()
    return TensorMeta(out, x.dtype), TensorMeta((), x.dtype)


def _class_last_perm(nd):
    """(N, C, d1, ...) -> (N, d1, ..., C): targets then index the last axis."""
    return (0,) + tuple(range(2, nd)) + (1,) if nd > 2 else tuple(range(nd))


def _nll_targets(ctx, k, target, target_meta, weight, num_classes, ignore_index):
    """(valid, safe) shaped target.shape + (1,): which targets count, and targets safe to
    index with (ignored ones point at class 0), plus the weight of each target (0 if ignored).
    A counted target outside [0, num_classes) raises torch's IndexError (see _out_of_range)."""
    p = ctx.prims
    t = cast_array(ctx, target, target_meta.dtype, dt.int64)
    t = p.slice(t, (Ellipsis, None))
    valid = p.binary("ne", t, p.full((), dt.int64, ignore_index))
    safe = p.where(valid, t, p.full((), dt.int64, 0))
    bad = _out_of_range(ctx, safe, num_classes)
    if bad is not None:
        raise IndexError(f"Target {bad} is out of bounds.")
    w_t = k.where(valid, p.index(weight, (safe,)), 0.0)
    return valid, safe, w_t


def _nll_kernel(ctx, x, target, weight, reduction="none", ignore_index=-100):
    xm, tm, _ = ctx.in_metas
    k, (x, weight) = _in_compute(ctx, (x, weight), (xm, ctx.in_metas[2]))
    p = ctx.prims
    c = ctx.in_metas[2].shape[0]
    rows = (p.nll_rows(x, target, weight, ignore_index)  # one loop, where the device has it
            if xm.ndim == 2 and tm.dtype is dt.int64 else None)
    if rows is not None:
        loss, w_t, lo, hi = rows
        if lo < 0 or hi >= c:
            raise IndexError(f"Target {lo if lo < 0 else hi} is out of bounds.")
    else:
        valid, safe, w_t = _nll_targets(ctx, k, target, tm, weight, c, ignore_index)
        x_last = p.permute(x, _class_last_perm(xm.ndim))
        picked = p.gather(x_last, xm.ndim - 1, safe)
        loss = k.where(valid, k.u("neg", k.mul(picked, w_t)), 0.0)
    all_axes = tuple(range(tm.ndim + 1))
    total_weight = k.sum(w_t, all_axes)
    if reduction == "none":
        out = p.reshape(loss, tm.shape)
    else:
        out = k.sum(loss, all_axes)
    return _finish(ctx, out, 0), _finish(ctx, total_weight, 1)


def _nll_grad(ctx, g, _g_total_weight=None):
    if not ctx.needs_input_grad[0]:
        return None, None, None
    # The total weight does not depend on the input; the weight gets no gradient (as torch).
    gx = op("nll_loss_grad", g, ctx.input(1), ctx.input(2), **ctx.attrs)
    return gx, None, None


def _nll_sbp(x, target, weight, reduction="none", ignore_index=-100):
    sigs = [Signature((B, B, B), (B, B))]
    if x.ndim >= 2:
        for t_axis, n in enumerate(target.shape):
            if n <= 1:
                continue
            x_axis = 0 if t_axis == 0 else t_axis + 1
            # Samples are independent: losses split with them, sums and weights become partial.
            out = Split(t_axis) if reduction == "none" else P
            sigs.append(Signature((Split(x_axis), Split(t_axis), B), (out, P)))
    # The loss is linear in the input; the total weight does not depend on it.
    sigs.append(Signature((P, B, B), (P, B)))
    # Loss and total weight are both linear in the class weights.
    sigs.append(Signature((B, B, P), (P, P)))
    return sigs


def _nll_reference(torch, x, target, weight, reduction="none", ignore_index=-100):
    # torch's nll_loss is not differentiable in weight: detach it (we return no grad either).
    weight = weight.detach()
    out = torch.nn.functional.nll_loss(x, target, weight, ignore_index=ignore_index,
                                       reduction=reduction)
    valid = target != ignore_index
    total = (weight[torch.where(valid, target.long(), 0)] * valid).sum()
    return out, total


def _nll_samples(rng):
    def w(c, dtype=np.float64):
        return rng.uniform(0.5, 2.0, c).astype(dtype)

    return [
        Sample(_rand(rng, 4, 3), np.array([0, 2, 1, 2]), np.ones(3)),
        Sample(_rand(rng, 4, 3), np.array([0, 2, -100, 2]), w(3), reduction="sum"),
        Sample(_rand(rng, 2, 4, 3), np.array([[0, 3, 1], [2, 2, 1]]), w(4), ignore_index=3),
        Sample(_rand(rng, 2, 3, 2, 2), np.array([[[0, 1], [2, 0]], [[1, 1], [0, 2]]]), w(3),
               reduction="sum"),
        Sample(_rand(rng, 5), np.array(3), w(5)),
        Sample(_rand(rng, 3, 4, dtype=np.float32), np.array([1, 0, 3], np.uint8),
               w(4, np.float32), reduction="sum", grad=False),
    ]


register(OpDef(
    "nll_loss",
    inputs=("input", "target", "weight"),
    outputs=("out", "total_weight"),
    attrs={"reduction": Attr("str", "none"), "ignore_index": Attr("int", -100)},
    infer_meta=_nll_meta,
    kernel=_nll_kernel,
    grad=_nll_grad,
    saves=("target", "weight"),
    sbp=_nll_sbp,
    reference=_nll_reference,
    samples=_nll_samples,
))


def _nll_grad_meta(g, target, weight, reduction="none", ignore_index=-100):
    want = target.shape if reduction == "none" else ()
    if reduction not in _NLL_REDUCTIONS:
        raise op_error("nll_loss_backward", f"reduction must be one of {_NLL_REDUCTIONS}, got "
                       f"{reduction!r}", ValueError)
    if g.shape != want:
        raise op_error("nll_loss_backward", f"grad_output must have shape {list(want)}, got "
                       f"{list(g.shape)}")
    require_float("nll_loss_backward", "grad_output", g)
    if weight.ndim != 1 or weight.dtype is not g.dtype:
        raise op_error("nll_loss_backward", f"weight must be 1-D of dtype {g.dtype.name}, got "
                       f"{list(weight.shape)} {weight.dtype.name}", TypeError)
    c = weight.shape[0]
    shape = (c,) if target.ndim == 0 else (target.shape[0], c) + target.shape[1:]
    return TensorMeta(shape, g.dtype)


def _nll_grad_kernel(ctx, g, target, weight, reduction="none", ignore_index=-100):
    gm, tm, wm = ctx.in_metas
    k, (g, weight) = _in_compute(ctx, (g, weight), (gm, wm))
    p = ctx.prims
    c = wm.shape[0]
    rows = (p.nll_grad_rows(g, target, weight, ignore_index)  # one loop, where it exists
            if tm.ndim == 1 and tm.dtype is dt.int64 else None)
    if rows is not None:
        dx, lo, hi = rows
        if lo < 0 or hi >= c:
            raise IndexError(f"Target {lo if lo < 0 else hi} is out of bounds.")
        return _finish(ctx, dx)
    _, safe, w_t = _nll_targets(ctx, k, target, tm, weight, c, ignore_index)
    g_e = g if gm.ndim == 0 else p.slice(g, (Ellipsis, None))
    coef = k.u("neg", k.mul(w_t, g_e))
    nd = tm.ndim + 1
    dx = p.scatter(k.p.full(tm.shape + (c,), k.dtype, 0), nd - 1, safe, coef)
    if nd > 2:  # back to (N, C, d1, ...)
        dx = p.contiguous(p.permute(dx, (0, nd - 1) + tuple(range(1, nd - 1))))
    return _finish(ctx, dx)


def _nll_grad_grad(ctx, gg):
    if not ctx.needs_input_grad[0]:
        return None, None, None
    # nll_loss_grad is the adjoint of nll_loss, which is linear in its input: the adjoint of
    # the adjoint is nll_loss itself.
    out, _ = op("nll_loss", gg, ctx.input(1), ctx.input(2), **ctx.attrs)
    return out, None, None


def _nll_grad_sbp(g, target, weight, reduction="none", ignore_index=-100):
    sigs = [Signature((B, B, B), (B,))]
    for t_axis, n in enumerate(target.shape):
        if n <= 1:
            continue
        x_axis = 0 if t_axis == 0 else t_axis + 1
        g_sbp = Split(t_axis) if reduction == "none" else B
        sigs.append(Signature((g_sbp, Split(t_axis), B), (Split(x_axis),)))  # per sample
    sigs.append(Signature((P, B, B), (P,)))  # linear in grad_output
    sigs.append(Signature((B, B, P), (P,)))  # and in the class weights
    return sigs


def _nll_grad_reference(torch, g, target, weight, reduction="none", ignore_index=-100):
    c = weight.shape[0]
    shape = (c,) if target.ndim == 0 else (target.shape[0], c) + tuple(target.shape[1:])
    x = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
    out = torch.nn.functional.nll_loss(x, target, weight.detach(), ignore_index=ignore_index,
                                       reduction=reduction)
    (dx,) = torch.autograd.grad(out, x, g, create_graph=True)
    return dx


register(OpDef(
    "nll_loss_grad",
    inputs=("grad_output", "target", "weight"),
    attrs={"reduction": Attr("str", "none"), "ignore_index": Attr("int", -100)},
    infer_meta=_nll_grad_meta,
    kernel=_nll_grad_kernel,
    grad=_nll_grad_grad,
    saves=("target", "weight"),
    sbp=_nll_grad_sbp,
    reference=_nll_grad_reference,
    samples=lambda rng: [
        Sample(_rand(rng, 4), np.array([0, 2, 1, 2]), np.ones(3)),
        Sample(np.asarray(1.3), np.array([0, -100, 1]), rng.uniform(0.5, 2, 3),
               reduction="sum"),
        Sample(_rand(rng, 2, 3), np.array([[0, 3, 1], [2, 2, 1]]), rng.uniform(0.5, 2, 4),
               ignore_index=3),
        Sample(_rand(rng, 2, 2, 2), np.array([[[0, 1], [2, 0]], [[1, 1], [0, 2]]]),
               rng.uniform(0.5, 2, 3)),
        Sample(np.asarray(-0.4), np.array(3), np.ones(5)),
    ],
))


# =========================================================================================
# binary_cross_entropy (elementwise; weight and reduction are applied by the functional)
# =========================================================================================
_LOG_FLOOR = -100.0  # torch clamps both logs at -100 so x = 0 or 1 gives a finite loss
_BCE_EPS = 1e-12  # torch's floor on x * (1 - x) in the backward


def _bce_meta(x, target):
    if x.shape != target.shape:
        raise op_error("binary_cross_entropy", f"Using a target size ({list(target.shape)}) "
                       f"that is different to the input size ({list(x.shape)}) is deprecated. "
                       "Please ensure they have the same size.", ValueError)
    require_float("binary_cross_entropy", "input", x)
    if target.dtype is not x.dtype:
        raise op_error("binary_cross_entropy", f"expected target of dtype {x.dtype.name}, got "
                       f"{target.dtype.name}", TypeError)
    return x


def _bce_kernel(ctx, x, target):
    k, (x, y) = _in_compute(ctx, (x, target))
    log_x = k.bin("maximum", k.u("log", x), _LOG_FLOOR)
    log_1mx = k.bin("maximum", k.u("log1p", k.u("neg", x)), _LOG_FLOOR)
    # (y - 1) * log(1 - x) - y * log(x), in torch's order of operations
    return _finish(ctx, k.sub(k.mul(k.sub(y, 1.0), log_1mx), k.mul(y, log_x)))


def _bce_grad(ctx, g):
    x, y = ctx.inputs
    gx = gy = None
    if ctx.needs_input_grad[0]:
        gx = g * (x - y) / ((1 - x) * x).clamp(min=_BCE_EPS)
    if ctx.needs_input_grad[1]:
        log_x = op("log", x).clamp(min=_LOG_FLOOR)
        log_1mx = op("log1p", op("neg", x)).clamp(min=_LOG_FLOOR)
        gy = g * (log_1mx - log_x)
    return gx, gy


register(OpDef(
    "binary_cross_entropy",
    inputs=("input", "target"),
    infer_meta=_bce_meta,
    kernel=_bce_kernel,
    grad=_bce_grad,
    saves=("input", "target"),
    sbp=lambda x, t: elementwise_signatures([x.shape, t.shape], x.shape),
    reference=lambda torch, x, t: torch.nn.functional.binary_cross_entropy(
        x, t, reduction="none"),
    samples=lambda rng: [
        Sample(rng.uniform(0.05, 0.95, (3, 4)), rng.uniform(0, 1, (3, 4))),
        Sample(rng.uniform(0.05, 0.95, (5,)), (rng.uniform(0, 1, 5) > 0.5).astype(np.float64)),
        Sample(np.asarray(0.3), np.asarray(0.8)),
        Sample(np.array([0.0, 1.0, 1e-50, 0.5]), np.array([0.2, 0.9, 0.5, 0.5]), grad=False),
        Sample(rng.uniform(0.05, 0.95, (2, 3)).astype(np.float32),
               rng.uniform(0, 1, (2, 3)).astype(np.float32), grad=False),
    ],
))


# =========================================================================================
# ctc_loss
# =========================================================================================
# Connectionist temporal classification over the extended label sequence
# l' = (blank, y1, blank, y2, ..., yL, blank) of length S' = 2 S + 1 (S: the padded target
# width).  The alpha (forward) and beta (backward) recursions run in log space, one
# vectorised step per time step over (batch, S'); samples shorter than the longest run on
# with masks (entries past 2 L_n form no path, since paths only move up in s).
def _ctc_check(name, lp, targets, input_lengths, target_lengths, blank):
    require_float(name, "log_probs", lp)
    if lp.ndim != 3:
        raise op_error(name, f"expected log_probs of shape (T, N, C), got {list(lp.shape)}")
    t, n, c = lp.shape
    _check_indices(name, "targets", targets)
    if targets.ndim != 2 or targets.shape[0] != n:
        raise op_error(name, f"expected padded targets of shape (N={n}, S), got "
                       f"{list(targets.shape)}")
    for arg, m in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        _check_indices(name, arg, m)
        if m.shape != (n,):
            raise op_error(name, f"{arg} must be of size batch_size ({n}), got "
                           f"{list(m.shape)}")
    if not 0 <= blank < c:
        raise op_error(name, f"blank must be in label range [0, {c}), got {blank}")


def _ctc_loss_meta(lp, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _ctc_check("ctc_loss", lp, targets, input_lengths, target_lengths, blank)
    return TensorMeta((lp.shape[1],), lp.dtype)


def _lse(k, terms):
    """log(sum(exp(terms))) elementwise, -inf where every term is -inf."""
    m = terms[0]
    for x in terms[1:]:
        m = k.bin("maximum", m, x)
    safe = k.where(k.u("isinf", m), 0.0, m)  # all -inf: exp(-inf - 0) sums to 0, log -> -inf
    total = None
    for x in terms:
        e = k.u("exp", k.sub(x, safe))
        total = e if total is None else k.add(total, e)
    return k.add(k.u("log", total), safe)


def _shift(k, x, by, fill):
    """x[:, s - by] along the last axis (by > 0: from below; by < 0: from above), fill where
    that falls outside."""
    p = k.p
    n, s = x.shape
    if by > 0:
        padded = p.pad(x, ((0, 0), (by, 0)), "constant", fill)
        return p.slice(padded, (slice(None), slice(0, s)))
    padded = p.pad(x, ((0, 0), (0, -by)), "constant", fill)
    return p.slice(padded, (slice(None), slice(-by, s - by)))


def _ctc_setup(ctx, metas, lp, targets, input_lengths, target_lengths, blank):
    """(k, lp in compute dtype, emissions (T, N, S'), ext labels (N, S'), T_n, L_n, the valid
    s mask, the s-2 -> s transition mask)."""
    p = ctx.prims
    lpm, tm, ilm, tlm = metas
    k, (lp,) = _in_compute(ctx, (lp,), (lpm,))
    t_max, n, c = lpm.shape
    width = 2 * tm.shape[1] + 1
    tg = cast_array(ctx, targets, tm.dtype, dt.int64)
    # Padding entries may hold anything: clamp them into the class range for the gather.
    tg = p.binary("minimum", p.binary("maximum", tg, p.full((), dt.int64, 0)),
                  p.full((), dt.int64, c - 1))
    ext = p.full((n, width), dt.int64, blank)
    if tm.shape[1]:
        p.index_put(ext, (slice(None), slice(1, None, 2)), tg)
    index = p.contiguous(p.broadcast_to(p.reshape(ext, (1, n, width)), (t_max, n, width)))
    em = p.gather(lp, 2, index)
    il = p.reshape(cast_array(ctx, input_lengths, ilm.dtype, dt.int64), (n, 1))
    tl = p.reshape(cast_array(ctx, target_lengths, tlm.dtype, dt.int64), (n, 1))
    _ctc_check_lengths(ctx, il, tl, t_max, tm.shape[1])
    s_idx = p.from_host(np.arange(width).reshape(1, width), dt.int64)
    two_l = p.binary("mul", tl, p.full((), dt.int64, 2))
    valid = p.binary("le", s_idx, two_l)  # s < 2 L + 1
    odd3 = p.from_host(((np.arange(width) % 2 == 1) & (np.arange(width) >= 3))
                       .reshape(1, width), dt.bool_)
    prev2 = _shift(k, ext, 2, blank)
    allow2 = p.binary("logical_and", odd3, p.binary("ne", ext, prev2))
    return k, lp, em, ext, il, two_l, valid, allow2


def _ctc_check_lengths(ctx, il, tl, t_max, width):
    """Lengths are data: the kernel checks them, as torch's does (two scalars each read on
    the host by the thread running the kernel; see _out_of_range)."""
    p = ctx.prims
    if il.shape[0] == 0:
        return
    lo = min(int(p.to_host(p.reduce("min", il, (0, 1)))),
             int(p.to_host(p.reduce("min", tl, (0, 1)))))
    if lo < 0:
        raise RuntimeError(f"ctc_loss(): input and target lengths must be non-negative, got "
                           f"{lo}")
    longest = int(p.to_host(p.reduce("max", il, (0, 1))))
    if longest > t_max:
        raise RuntimeError(f"Expected input_lengths to have value at most {t_max}, but got "
                           f"value {longest} (while checking arguments for ctc_loss)")
    longest = int(p.to_host(p.reduce("max", tl, (0, 1))))
    if longest > width:
        raise RuntimeError(f"Expected tensor to have size at least {longest} at dimension 1, "
                           f"but got size {width} for argument #2 'targets' (while checking "
                           "arguments for ctc_loss)")


def _ctc_alpha(k, em, valid, allow2):
    """log alpha (T, N, S') with -inf where s is not a valid state."""
    p = k.p
    t_max, n, width = em.shape
    neg = -np.inf
    out = p.full((t_max, n, width), k.dtype, neg)
    first = p.from_host((np.arange(width) < 2).reshape(1, width), dt.bool_)
    cur = k.where(p.binary("logical_and", first, valid), p.slice(em, (0,)), neg)
    p.copy(p.slice(out, (0,)), cur)
    for t in range(1, t_max):
        a1 = _shift(k, cur, 1, neg)
        a2 = k.where(allow2, _shift(k, cur, 2, neg), neg)
        cur = k.where(valid, k.add(_lse(k, (cur, a1, a2)), p.slice(em, (t,))), neg)
        p.copy(p.slice(out, (t,)), cur)
    return out


def _ctc_nll(k, alpha, il, two_l):
    """-log p(target | input) per sample, from alpha at t = T_n - 1, s in {2L, 2L - 1}."""
    p = k.p
    t_max, n, width = alpha.shape
    zero = p.full((), dt.int64, 0)
    last_t = p.binary("maximum", p.binary("sub", il, p.full((), dt.int64, 1)), zero)
    at_t = p.gather(alpha, 0, p.contiguous(p.broadcast_to(p.reshape(last_t, (1, n, 1)),
                                                          (1, n, width))))
    at_t = p.reshape(at_t, (n, width))
    end = p.gather(at_t, 1, two_l)
    before = p.gather(at_t, 1, p.binary("maximum", p.binary("sub", two_l, p.full(
        (), dt.int64, 1)), zero))
    before = k.where(p.binary("gt", two_l, zero), before, -np.inf)  # no label: blank only
    return k.u("neg", p.reshape(_lse(k, (end, before)), (n,)))


def _ctc_loss_kernel(ctx, lp, targets, input_lengths, target_lengths, blank=0,
                     zero_infinity=False):
    k, lp, em, ext, il, two_l, valid, allow2 = _ctc_setup(
        ctx, ctx.in_metas, lp, targets, input_lengths, target_lengths, blank)
    nll = _ctc_nll(k, _ctc_alpha(k, em, valid, allow2), il, two_l)
    if zero_infinity:
        nll = k.where(k.u("isinf", nll), 0.0, nll)
    return _finish(ctx, nll)


def _ctc_loss_grad(ctx, g):
    if not ctx.needs_input_grad[0]:
        return None, None, None, None
    a = ctx.attrs
    return (op("ctc_loss_grad", g, ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3),
               blank=a["blank"], zero_infinity=a["zero_infinity"]), None, None, None)


def _ctc_loss_grad_meta(g, lp, targets, input_lengths, target_lengths, blank=0,
                        zero_infinity=False):
    _ctc_check("ctc_loss_backward", lp, targets, input_lengths, target_lengths, blank)
    if g.shape != (lp.shape[1],):
        raise op_error("ctc_loss_backward", f"expected grad_output of shape [{lp.shape[1]}], "
                       f"got {list(g.shape)}")
    return TensorMeta(lp.shape, lp.dtype)


def _ctc_loss_grad_kernel(ctx, g, lp, targets, input_lengths, target_lengths, blank=0,
                          zero_infinity=False):
    """torch's gradient w.r.t. log_probs: exp(lp) - exp(log sum_{s: l'_s = c} alpha beta
    + nll - lp), times grad_output, zero for t >= T_n (and for infinite losses with
    zero_infinity).  The exp(lp) term is the one torch's kernel adds for log_softmax input."""
    p = ctx.prims
    gm = ctx.in_metas[0]
    k, lp, em, ext, il, two_l, valid, allow2 = _ctc_setup(
        ctx, ctx.in_metas[1:], lp, targets, input_lengths, target_lengths, blank)
    t_max, n, width = em.shape
    c = ctx.in_metas[1].shape[2]
    neg = -np.inf
    alpha = _ctc_alpha(k, em, valid, allow2)
    nll = _ctc_nll(k, alpha, il, two_l)
    # beta, from t = T_n - 1 down; it starts in the two final states.
    beta = p.full((t_max, n, width), k.dtype, neg)
    s_idx = p.from_host(np.arange(width).reshape(1, width), dt.int64)
    one = p.full((), dt.int64, 1)
    final = p.binary("logical_or", p.binary("eq", s_idx, two_l),
                     p.binary("eq", s_idx, p.binary("sub", two_l, one)))
    final = p.binary("logical_and", final, valid)
    allow_up2 = _shift(k, allow2, -2, False)  # s -> s + 2 is allowed where s + 2 -> s was
    cur = p.full((n, width), k.dtype, neg)
    for t in range(t_max - 1, -1, -1):
        step = p.full((), dt.int64, t)
        b1 = _shift(k, cur, -1, neg)
        b2 = k.where(allow_up2, _shift(k, cur, -2, neg), neg)
        rec = k.add(_lse(k, (cur, b1, b2)), p.slice(em, (t,)))
        last = p.binary("logical_and", p.binary("eq", il, p.binary("add", step, one)), final)
        inside = p.binary("gt", il, p.binary("add", step, one))  # t < T_n - 1
        cur = k.where(last, p.slice(em, (t,)), k.where(inside, k.where(valid, rec, neg), neg))
        p.copy(p.slice(beta, (t,)), cur)
    ab = k.add(alpha, beta)  # (T, N, S')
    m = p.reduce("max", ab, (2,), True)
    m = k.where(k.u("isinf", m), 0.0, m)
    index = p.contiguous(p.broadcast_to(p.reshape(ext, (1, n, width)), (t_max, n, width)))
    sums = p.scatter(p.full((t_max, n, c), k.dtype, 0), 2, index,
                     p.contiguous(k.u("exp", k.sub(ab, m))), "add")
    lcab = k.add(k.u("log", sums), m)
    nll3 = p.reshape(nll, (1, n, 1))
    grad = k.sub(k.u("exp", lp), k.u("exp", k.sub(k.add(lcab, nll3), lp)))
    gg = p.reshape(cast_array(ctx, g, gm.dtype, k.dtype), (1, n, 1))
    grad = k.mul(grad, gg)
    t_idx = p.from_host(np.arange(t_max).reshape(t_max, 1, 1), dt.int64)
    live = p.binary("lt", t_idx, p.reshape(il, (1, n, 1)))
    if zero_infinity:
        live = p.binary("logical_and", live, p.unary("logical_not", p.unary("isinf", nll3)))
    return _finish(ctx, k.where(live, grad, 0.0))


def _ctc_sbp(*metas, **attrs):
    n = metas[-1].shape[0]
    sigs = [Signature((B,) * len(metas), (B,))]
    if n > 1:  # samples are independent: log_probs and its gradient split on axis 1
        ins = tuple(Split(1) if m.ndim == 3 else Split(0) for m in metas)
        out = Split(1) if len(metas) == 5 else Split(0)
        sigs.append(Signature(ins, (out,)))
    if len(metas) == 5:  # (P, B, B, B, B)->P: linear in grad_output
        sigs.append(Signature((P, B, B, B, B), (P,)))
    return sigs


def _ctc_reference(torch, lp, targets, input_lengths, target_lengths, blank=0,
                   zero_infinity=False):
    return torch.nn.functional.ctc_loss(lp, targets, input_lengths, target_lengths, blank,
                                        reduction="none", zero_infinity=zero_infinity)


def _ctc_grad_reference(torch, g, lp, targets, input_lengths, target_lengths, blank=0,
                        zero_infinity=False):
    x = lp.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = torch.nn.functional.ctc_loss(x, targets, input_lengths, target_lengths, blank,
                                            reduction="none", zero_infinity=zero_infinity)
        (gx,) = torch.autograd.grad(loss, x, g)
    return gx


def _ctc_samples(rng, with_grad=False):
    def lp(t, n, c, dtype=np.float64):
        x = rng.standard_normal((t, n, c))
        x = x - np.log(np.exp(x).sum(-1, keepdims=True))
        return x.astype(dtype)

    def g(n):
        return (rng.standard_normal(n),) if with_grad else ()

    out = [
        Sample(*g(3), lp(6, 3, 5), np.array([[1, 2, 2], [3, 0, 0], [4, 1, 3]]),
               np.array([6, 5, 6]), np.array([3, 1, 2])),
        # repeated labels, a sample too short for its target (infinite loss), an empty target
        Sample(*g(3), lp(5, 3, 4), np.array([[2, 2, 2], [1, 1, 0], [3, 3, 3]]),
               np.array([5, 2, 4]), np.array([3, 2, 0]), blank=0, zero_infinity=True),
        Sample(*g(2), lp(7, 2, 4, np.float32), np.array([[0, 1, 0, 2], [2, 2, 1, 1]],
                                                        np.int32),
               np.array([7, 6], np.int32), np.array([4, 3], np.int32), blank=3),
    ]
    if not with_grad:
        for s in out:
            # torch's gradient adds exp(log_probs) (it assumes log_softmax input), which finite
            # differences of the loss do not see: ctc_loss_grad's samples compare it instead.
            s.grad = False
    return out


register(OpDef(
    "ctc_loss",
    inputs=("log_probs", "targets", "input_lengths", "target_lengths"),
    attrs={"blank": Attr("int", 0), "zero_infinity": Attr("bool", False)},
    infer_meta=_ctc_loss_meta,
    kernel=_ctc_loss_kernel,
    grad=_ctc_loss_grad,
    saves=("log_probs", "targets", "input_lengths", "target_lengths"),
    sbp=_ctc_sbp,
    reference=_ctc_reference,
    samples=_ctc_samples,
    doc="Per-sample CTC negative log likelihood (padded targets), log-space alpha recursion.",
))

register(OpDef(
    "ctc_loss_grad",
    inputs=("grad_output", "log_probs", "targets", "input_lengths", "target_lengths"),
    attrs={"blank": Attr("int", 0), "zero_infinity": Attr("bool", False)},
    infer_meta=_ctc_loss_grad_meta,
    kernel=_ctc_loss_grad_kernel,
    sbp=_ctc_sbp,
    reference=_ctc_grad_reference,
    samples=lambda rng: _ctc_samples(rng, with_grad=True),
    doc="torch's CTC gradient w.r.t. log_probs (alpha and beta recomputed); no double "
        "backward, as in torch.",
))


# =========================================================================================
# embedding_bag
# =========================================================================================
# Bags are runs of `indices` starting at `offsets`; each bag's looked-up rows are summed,
# averaged or maxed.  Outputs follow ATen's _embedding_bag: (out, offset2bag, bag_size,
# max_indices).  Here offset2bag is -1 at positions no bag uses (padding_idx, or past the
# last offset with include_last_offset), bag_size counts the rows each bag used, and
# max_indices (mode max only; else empty) holds the weight row that gave each maximum.
# With include_last_offset the last offset is dropped: torch's last bag runs to the end.
_BAG_MODES = ("sum", "mean", "max")


def _embedding_bag_meta(weight, indices, offsets, per_sample_weights, mode="mean",
                        padding_idx=None, include_last_offset=False,
                        scale_grad_by_freq=False):
    name = "embedding_bag"
    if weight.ndim != 2:
        raise op_error(name, f"'weight' must be 2-D, got {list(weight.shape)}")
    require_float(name, "weight", weight)
    _check_indices(name, "indices", indices)
    _check_indices(name, "offsets", offsets)
    if indices.ndim != 1 or offsets.ndim != 1:
        raise op_error(name, f"expected 1-D indices and offsets, got {list(indices.shape)} and "
                       f"{list(offsets.shape)}")
    if per_sample_weights.shape != indices.shape or per_sample_weights.dtype is not \
            weight.dtype:
        raise op_error(name, f"expected per_sample_weights of shape {list(indices.shape)} and "
                       f"dtype {weight.dtype.name}, got {list(per_sample_weights.shape)} "
                       f"{per_sample_weights.dtype.name}")
    if mode not in _BAG_MODES:
        raise op_error(name, f"mode has to be one of sum, mean or max, got {mode!r}",
                       ValueError)
    if padding_idx is not None and not 0 <= padding_idx < weight.shape[0]:
        raise op_error(name, f"padding_idx must be within [0, {weight.shape[0]}), got "
                       f"{padding_idx}", ValueError)
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    if bags < 0:
        raise op_error(name, "include_last_offset needs at least one offset")
    dim = weight.shape[1]
    max_shape = (bags, dim) if mode == "max" else (0,)
    return (TensorMeta((bags, dim), weight.dtype), TensorMeta(indices.shape, dt.int64),
            TensorMeta((bags,), dt.int64), TensorMeta(max_shape, dt.int64))


def _embedding_bag_kernel(ctx, weight, indices, offsets, psw, mode="mean", padding_idx=None,
                          include_last_offset=False, scale_grad_by_freq=False):
    p = ctx.prims
    wm, im, om, _ = ctx.in_metas
    num, dim = wm.shape
    length = im.shape[0]
    bags = ctx.out_metas[0].shape[0]
    k, (weight, psw) = _in_compute(ctx, (weight, psw), (wm, ctx.in_metas[3]))
    idx = cast_array(ctx, indices, im.dtype, dt.int64)
    bad = _out_of_range(ctx, idx, num)
    if bad is not None:
        raise IndexError(f"embedding_bag(): index out of range in self (index {bad}, table of "
                         f"{num} rows)")
    off = cast_array(ctx, offsets, om.dtype, dt.int64)
    if om.shape[0]:
        first = int(p.to_host(p.slice(off, (0,))))
        if first != 0:
            raise RuntimeError("embedding_bag: offsets[0] has to be 0, i.e., the first sequence "
                               f"in the mini-batch has to start from position 0. However, got "
                               f"{first}")
    # bag of each position: how many offsets (after the first) are <= it.
    marks = p.full((length + 1,), dt.int64, 0)
    if bags > 1:
        later = p.binary("minimum", p.binary("maximum", p.slice(off, (slice(1, bags),)),
                                             p.full((), dt.int64, 0)),
                         p.full((), dt.int64, length))
        p.scatter(marks, 0, p.contiguous(later), p.full((bags - 1,), dt.int64, 1), "add")
    bag = p.slice(p.scan("cumsum", marks, 0), (slice(0, length),))
    keep = p.binary("lt", bag, p.full((), dt.int64, bags))
    if padding_idx is not None:
        keep = p.binary("logical_and", keep, p.binary("ne", idx, p.full((), dt.int64,
                                                                          padding_idx)))
    zero = p.full((), dt.int64, 0)
    offset2bag = p.where(keep, bag, p.full((), dt.int64, -1))
    bag_c = p.contiguous(p.where(keep, bag, zero))
    size = p.index_put(p.full((bags,), dt.int64, 0), (bag_c,), p.cast(keep, dt.int64),
                       accumulate=True)
    rows = p.index(weight, (idx,))  # (L, D)
    keep_col = p.reshape(keep, (length, 1))
    if mode == "max":
        masked = k.where(keep_col, rows, -np.inf)
        index = p.contiguous(p.broadcast_to(p.reshape(bag_c, (length, 1)), (length, dim)))
        best = p.scatter(p.full((bags, dim), k.dtype, -np.inf), 0, index, masked, "amax")
        # the first position holding each bag's maximum (torch's strict > scan)
        hit = p.binary("logical_and", p.binary("eq", masked, p.index(best, (bag_c,))),
                       keep_col)
        pos = p.where(hit, p.from_host(np.arange(length).reshape(length, 1), dt.int64),
                      p.full((), dt.int64, length))
        first = p.scatter(p.full((bags, dim), dt.int64, length), 0, index, pos, "amin")
        used = p.reshape(p.binary("gt", size, zero), (bags, 1))
        idx_pad = p.pad(idx, ((0, 1),), "constant", 0)
        max_indices = p.where(used, p.index(idx_pad, (first,)), zero)
        out = k.where(used, best, 0.0)
        return _finish(ctx, out), offset2bag, size, p.contiguous(max_indices)
    scale = k.mul(psw, p.cast(keep, k.dtype))
    rows = k.mul(rows, p.reshape(scale, (length, 1)))
    out = p.index_put(p.full((bags, dim), k.dtype, 0), (bag_c,), rows, accumulate=True)
    if mode == "mean":
        count = p.cast(p.binary("maximum", size, p.full((), dt.int64, 1)), k.dtype)
        out = k.div(out, p.reshape(count, (bags, 1)))
    return _finish(ctx, out), offset2bag, size, p.full((0,), dt.int64, 0)


def _embedding_bag_grad(ctx, g, _g_o2b=None, _g_size=None, _g_max=None):
    a = ctx.attrs
    weight, indices, psw = ctx.input(0), ctx.input(1), ctx.input(3)
    offset2bag, size, max_indices = ctx.output(1), ctx.output(2), ctx.output(3)
    num = ctx.in_metas[0].shape[0]
    gw = gpsw = None
    if a["mode"] == "max":
        if ctx.needs_input_grad[0]:
            # each maximum's gradient goes to the row that gave it; empty bags give nothing
            empty = op("reshape", size == 0, shape=(size.shape[0], 1))
            zeros = op("full", shape=tuple(weight.shape), fill_value=0.0, dtype=g.dtype,
                       _device=g._where())
            gw = op("scatter_add", zeros, max_indices,
                    op("masked_fill", g, empty, value=0.0), dim=0)
        return gw, None, None, None
    dropped = offset2bag < 0
    rows = op("embedding", op("clamp", offset2bag, min=0), g)  # (L, D): each row's bag grad
    if ctx.needs_input_grad[0]:
        scale = op("masked_fill", psw, dropped, value=0.0)
        if a["mode"] == "mean":
            sizes = op("reshape", size.clamp(min=1).to(psw.dtype), shape=(size.shape[0], 1))
            count = op("embedding", op("clamp", offset2bag, min=0), sizes)  # (L, 1)
            scale = scale / op("reshape", count, shape=(count.shape[0],))
        gw = op("embedding_grad", rows * op("reshape", scale, shape=(scale.shape[0], 1)),
                indices, num_weights=num, padding_idx=a["padding_idx"],
                scale_grad_by_freq=a["scale_grad_by_freq"])
    if ctx.needs_input_grad[3] and a["mode"] == "sum":
        looked = op("embedding", indices, weight)
        gpsw = op("masked_fill", (rows * looked).sum(dim=1), dropped, value=0.0)
    return gw, None, None, gpsw


def _embedding_bag_sbp(weight, indices, offsets, psw, mode="mean", **attrs):
    sigs = [Signature((B,) * 4, (B,) * 4)]
    if weight.shape[1] > 1:  # (S1,B,B,B)->S1: each column is pooled on its own
        last = Split(1) if mode == "max" else B
        sigs.append(Signature((Split(1), B, B, B), (Split(1), B, B, last)))
    return sigs


def _embedding_bag_reference(torch, weight, indices, offsets, psw, mode="mean",
                             padding_idx=None, include_last_offset=False,
                             scale_grad_by_freq=False):
    f = torch.nn.functional
    out = f.embedding_bag(indices, weight, offsets, mode=mode,
                          per_sample_weights=psw if mode == "sum" else None,
                          include_last_offset=include_last_offset, padding_idx=padding_idx,
                          scale_grad_by_freq=scale_grad_by_freq)
    length, bags = indices.shape[0], out.shape[0]
    bag = torch.bucketize(torch.arange(length), offsets[1:bags], right=True)
    keep = bag < bags
    if padding_idx is not None:
        keep &= indices != padding_idx
    offset2bag = torch.where(keep, bag, -1)
    size = torch.zeros(bags, dtype=torch.int64).index_add_(0, bag[keep], torch.ones_like(
        bag[keep]))
    if mode == "max":
        modes = {"sum": 0, "mean": 1, "max": 2}
        max_indices = torch.ops.aten._embedding_bag(
            weight, indices, offsets, False, modes[mode], False, None, include_last_offset,
            -1 if padding_idx is None else padding_idx)[3]
    else:
        max_indices = torch.zeros(0, dtype=torch.int64)
    return out, offset2bag, size, max_indices


def _embedding_bag_samples(rng):
    idx = np.array([1, 2, 4, 5, 4, 3, 2, 0])
    off = np.array([0, 2, 2, 5])
    ones = np.ones(8)
    w = _rand(rng, 6, 3)
    return [
        Sample(w, idx, off, rng.standard_normal(8), mode="sum"),
        Sample(w, idx, off, ones, mode="mean"),
        Sample(w, idx, off, ones, mode="max"),
        Sample(w, idx, off, ones, mode="mean", padding_idx=2),
        Sample(w, idx, off, rng.standard_normal(8), mode="sum", padding_idx=4),
        Sample(w, idx, np.array([0, 3, 6, 8]), ones, mode="max", padding_idx=2,
               include_last_offset=True),
        Sample(w, idx, np.array([0, 3, 6]), ones, mode="sum", include_last_offset=True),
        Sample(_rand(rng, 5, 4, dtype=np.float32), np.array([0, 4, 4, 1], np.int32),
               np.array([0, 1], np.int32), np.ones(4, np.float32), mode="mean", grad=False),
    ]


register(OpDef(
    "embedding_bag",
    inputs=("weight", "indices", "offsets", "per_sample_weights"),
    outputs=("out", "offset2bag", "bag_size", "max_indices"),
    attrs={"mode": Attr("str", "mean"), "padding_idx": Attr("int", None),
           "include_last_offset": Attr("bool", False),
           "scale_grad_by_freq": Attr("bool", False)},
    infer_meta=_embedding_bag_meta,
    kernel=_embedding_bag_kernel,
    grad=_embedding_bag_grad,
    saves=("weight", "indices", "per_sample_weights", "offset2bag", "bag_size",
           "max_indices"),
    sbp=_embedding_bag_sbp,
    reference=_embedding_bag_reference,
    samples=_embedding_bag_samples,
    doc="Sums, means or maxima of bags of embedding rows (bags given by offsets).",
))
