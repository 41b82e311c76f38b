"""Optimizer update ops, emitted by the graph's optimizer pass and run by the eager
optimizers' multi-tensor (foreach) steps, which write the outputs in place.

Each op takes a parameter, its gradient and its optimizer state, plus host scalars fed at
every graph call (`lr`, SGD's `first`: 1.0 while the momentum buffer is not initialised),
and returns the new parameter and states; `assign` ops then write them into the variables.
The math is torch's single-tensor update step for step, with the same float32 scalars, so a
graph trains exactly as the eager optimizers in `sbpflow.optim` (which follow torch):

    SGD     g = ±grad (+ wd * p);  b = g (first) else m * b + (1 - dampening) * g
            g = g + m * b (nesterov) else b;  p = p - lr * g
    Adam(W) t = t + 1;  g = ±grad (+ wd * p, Adam)  p = p * (1 - lr * wd) (AdamW)
            m = lerp(m, g, 1 - b1);  v = b2 * v + (1 - b2) * g * g;  v_hat = max(v_hat, v)
            p = p - lr / (1 - b1^t) * m / (sqrt(v or v_hat) / sqrt(1 - b2^t) + eps)
    Adagrad t = t + 1;  g = ±grad (+ wd * p);  clr = lr / (1 + (t - 1) * lr_decay)
            s = s + g * g;  p = p - clr * g / (sqrt(s) + eps)

`multi_*` forms take the tensors of many parameters in one variadic call (the multi-tensor
update that `allow_fuse_model_update_ops` selects): per parameter its (param, grad, states...)
block, then the shared host scalars.  No gradients: these ops only run in the update.
"""

from __future__ import annotations

import numpy as np

from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, Signature, Split
from .elementwise import _lerp_arrays
from .registry import Attr, OpDef, Sample, register


def _s(ctx, value, d):
    return ctx.prims.full((), d, value)


def _host(ctx, a) -> float:
    """A host scalar input (fed lr, step counter): a 0-d array read on the host."""
    return float(np.asarray(ctx.prims.to_host(a)).reshape(()))


def _check_like(name, p, others, what):
    for arg, m in zip(what, others):
        if m.shape != p.shape or m.dtype is not p.dtype:
            raise op_error(name, f"{arg} must match param {p.dtype.name}{list(p.shape)}, got "
                                 f"{m.dtype.name}{list(m.shape)}")
    if not p.dtype.is_floating_point:
        raise op_error(name, f"param must be floating point, got {p.dtype.name}")


def _check_scalar(name, m, arg):
    if m.shape != ():
        raise op_error(name, f"{arg} must be a 0-d tensor, got shape {list(m.shape)}")


def _elementwise_sbp(infer_meta):
    """The SBP signatures of an update (`infer_meta`: the op's): (B, ...) -> B, and S(a) on
    every tensor that is not 0-d (grads and states included) for each axis a they all have
    -> S(a), since the update is elementwise (a split parameter is updated piece by piece,
    with no communication).  0-d tensors (step counts, lr, 0-d params) stay B: every rank
    advances its own copy.  A P gradient has no signature: it is reduced first."""
    def sbp(*metas, **attrs):
        outs = infer_meta(*metas, **attrs)
        sigs = [Signature((B,) * len(metas), (B,) * len(outs))]
        shaped = [m.ndim for m in (*metas, *outs) if m.ndim]
        for a in range(min(shaped, default=0)):
            sigs.append(Signature(tuple(Split(a) if m.ndim else B for m in metas),
                                  tuple(Split(a) if m.ndim else B for m in outs)))
        return sigs

    return sbp


def _param_of(*metas, **attrs):
    """`keeps_sbp` of a one-parameter update: its parameter (input 0) is updated in place."""
    return (0,)


def _params_of(per_of):
    """`keeps_sbp` of a multi-tensor update: the parameter opening each block."""
    def params(*metas, n=1, **attrs):
        return tuple(k * per_of(attrs) for k in range(n))

    return params


# -- SGD ------------------------------------------------------------------------------------
_SGD_ATTRS = {"momentum": Attr("float", 0.0), "dampening": Attr("float", 0.0),
              "nesterov": Attr("bool", False), "weight_decay": Attr("float", 0.0),
              "maximize": Attr("bool", False)}


def _sgd_meta(p, g, *rest, momentum=0.0, **_):
    if momentum != 0:
        buf, lr, first = rest
        _check_like("sgd_update", p, (g, buf), ("grad", "momentum_buffer"))
        _check_scalar("sgd_update", first, "first")
        _check_scalar("sgd_update", lr, "lr")
        return (p, p)
    (lr,) = rest
    _check_like("sgd_update", p, (g,), ("grad",))
    _check_scalar("sgd_update", lr, "lr")
    return (p,)


def _sgd_arrays(ctx, d, p, g, buf, lr, first, momentum, dampening, nesterov, weight_decay,
                maximize, p_out=None, buf_out=None):
    """The new param and buffer; written into `p_out`/`buf_out` when given (they may be the
    memory of `p`/`buf`: every element is read before it is written)."""
    prims = ctx.prims
    if maximize:
        g = prims.unary("neg", g)
    if weight_decay != 0:
        g = prims.binary("add", g, prims.binary("mul", _s(ctx, weight_decay, d), p))
    new_buf = None
    if momentum != 0:
        if first:
            new_buf = prims.contiguous(g) if buf_out is None else prims.copy(buf_out, g)
        elif (not (maximize or weight_decay or nesterov or dampening)
              and (fused := prims.sgd_momentum(p, g, buf, momentum, lr, p_out, buf_out))):
            return fused  # one pass where the device has it (same roundings)
        else:
            # x * 1.0 is x exactly: skip it when there is no dampening (the common case)
            scaled = g if dampening == 0 else prims.binary("mul", _s(ctx, 1 - dampening, d), g)
            new_buf = prims.binary("mul", buf, _s(ctx, momentum, d), out=buf_out)
            new_buf = prims.binary("add", new_buf, scaled, out=new_buf)  # ours to overwrite
        g = (prims.binary("add", g, prims.binary("mul", _s(ctx, momentum, d), new_buf))
             if nesterov else new_buf)
    step = prims.binary("mul", _s(ctx, -lr, d), g)
    new_p = prims.binary("add", p, step, out=step if p_out is None else p_out)
    return new_p, new_buf


def _sgd_kernel(ctx, p, g, *rest, momentum=0.0, dampening=0.0, nesterov=False,
                weight_decay=0.0, maximize=False, out=None):
    d = ctx.out_metas[0].dtype
    if momentum != 0:
        buf, lr, first = rest
        first = _host(ctx, first) != 0
        p_out, buf_out = out if out is not None else (None, None)
    else:
        (lr,), buf, first = rest, None, False
        p_out, buf_out = out, None
    new_p, new_buf = _sgd_arrays(ctx, d, p, g, buf, _host(ctx, lr), first, momentum,
                                 dampening, nesterov, weight_decay, maximize, p_out, buf_out)
    return (new_p, new_buf) if momentum != 0 else new_p


def _torch_sgd(torch, p, g, *rest, momentum=0.0, dampening=0.0, nesterov=False,
               weight_decay=0.0, maximize=False):
    p = p.detach().clone()
    p.grad = g.detach().clone()
    lr = float(rest[-2] if momentum != 0 else rest[-1])
    opt = torch.optim.SGD([p], lr=lr, momentum=momentum, dampening=dampening,
                          nesterov=nesterov, weight_decay=weight_decay, maximize=maximize)
    if momentum != 0 and float(rest[-1]) == 0:
        opt.state[p]["momentum_buffer"] = rest[0].detach().clone()
    opt.step()
    if momentum != 0:
        return p.detach(), opt.state[p]["momentum_buffer"]
    return p.detach()


def _sgd_samples(rng):
    # Few, 1-D tensors: the global-op check tries every SBP of every input (the product
    # grows fast); tests/graph/test_optimizer_pass.py checks every option against torch.
    def r(n, dtype=np.float64):
        return rng.standard_normal(n).astype(dtype)

    lr = np.asarray(0.1)
    return [
        Sample(r(4), r(4), lr, grad=False, weight_decay=0.1, maximize=True),
        Sample(r(4), r(4), r(4), lr, np.asarray(1.0), grad=False, momentum=0.9),
        Sample(r(5, np.float32), r(5, np.float32), r(5, np.float32), lr, np.asarray(0.0),
               grad=False, momentum=0.8, dampening=0.5, weight_decay=0.01),
    ]


def _sgd_update_kernel(ctx, ts, out=None, **a):
    return _sgd_kernel(ctx, *ts, out=out, **a)


# The graph runtime may pass `out=`: (param, momentum_buffer) arrays or None each (a single
# array without momentum), possibly the inputs' own memory, to update the variables in place.
_sgd_update_kernel.accepts_out = True
_sgd_update_kernel.out_may_alias_inputs = True

register(OpDef(
    "sgd_update",
    inputs=("*tensors",),  # param, grad[, momentum_buffer], lr[, first]
    outputs=("param", "momentum_buffer"),
    attrs=dict(_SGD_ATTRS),
    infer_meta=_sgd_meta,
    sbp=_elementwise_sbp(_sgd_meta),
    keeps_sbp=_param_of,
    kernel=_sgd_update_kernel,
    reference=lambda torch, ts, **a: _torch_sgd(torch, *ts, **a),
    samples=lambda rng: [Sample(list(s.inputs), grad=False, **s.attrs)
                         for s in _sgd_samples(rng)],
    doc="One SGD step of one parameter (torch's formula); outputs param[, momentum_buffer].",
))


# -- Adam / AdamW ---------------------------------------------------------------------------
_ADAM_ATTRS = {"beta1": Attr("float", 0.9), "beta2": Attr("float", 0.999),
               "eps": Attr("float", 1e-8), "weight_decay": Attr("float", 0.0),
               "decoupled_weight_decay": Attr("bool", False), "amsgrad": Attr("bool", False),
               "maximize": Attr("bool", False)}


def _adam_meta(p, g, m, v, *rest, amsgrad=False, **_):
    states = (m, v, rest[0]) if amsgrad else (m, v)
    step, lr = rest[-2:]
    _check_like("adam_update", p, (g, *states),
                ("grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"))
    _check_scalar("adam_update", step, "step")
    _check_scalar("adam_update", lr, "lr")
    return (p, *states, step)


def _adam_arrays(ctx, d, p, g, m, v, vmax, step, lr, beta1, beta2, eps, weight_decay,
                 decoupled_weight_decay, amsgrad, maximize, outs=(None, None, None, None)):
    """The new param and states; written into `outs` (param, m, v, vmax arrays or None) when
    given (they may be the inputs' memory: every element is read before it is written)."""
    prims = ctx.prims
    p_out, m_out, v_out, vmax_out = outs
    if maximize:
        g = prims.unary("neg", g)
    if weight_decay != 0:
        if decoupled_weight_decay:
            p = prims.binary("mul", p, _s(ctx, 1 - lr * weight_decay, d), out=p_out)
        else:
            g = prims.binary("add", g, prims.binary("mul", _s(ctx, weight_decay, d), p))
    w = 1 - beta1  # lerp(m, g, w): the lerp op's own arithmetic (two-sided, fused as torch)
    new_m = _lerp_arrays(ctx, m, g, w, -0.5 < w < 0.5)
    m = new_m if m_out is None else prims.copy(m_out, new_m)
    gg = prims.binary("mul", prims.binary("mul", _s(ctx, 1 - beta2, d), g), g)
    v = prims.binary("mul", v, _s(ctx, beta2, d), out=v_out)
    v = prims.binary("add", v, gg, out=v)  # v is v_out or a fresh array
    bias_correction1 = 1 - beta1 ** step
    bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
    step_size = lr / bias_correction1
    if amsgrad:
        vmax = prims.binary("maximum", vmax, v, out=vmax_out)
    denom = prims.binary("add", prims.binary("div", prims.unary("sqrt", vmax if amsgrad else v),
                                             _s(ctx, bias_correction2_sqrt, d)),
                         _s(ctx, eps, d))
    p = prims.binary("add", p, prims.binary("mul", _s(ctx, -step_size, d),
                                            prims.binary("div", m, denom)), out=p_out)
    return p, m, v, vmax


def _adam_kernel(ctx, p, g, m, v, *rest, amsgrad=False, out=None, **attrs):
    d = ctx.out_metas[0].dtype
    vmax = rest[0] if amsgrad else None
    step, lr = rest[-2:]
    sd = ctx.out_metas[-1].dtype
    if out is None:
        out = (None,) * (5 if amsgrad else 4)
    outs = tuple(out[:4]) if amsgrad else (*out[:3], None)
    new_step = ctx.prims.binary("add", step, _s(ctx, 1, sd), out=out[-1])
    p, m, v, vmax = _adam_arrays(ctx, d, p, g, m, v, vmax, _host(ctx, new_step),
                                 _host(ctx, lr), amsgrad=amsgrad, outs=outs, **attrs)
    return (p, m, v, vmax, new_step) if amsgrad else (p, m, v, new_step)


def _torch_adam(torch, p, g, m, v, *rest, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                decoupled_weight_decay=False, amsgrad=False, maximize=False):
    p = p.detach().clone()
    p.grad = g.detach().clone()
    step, lr = rest[-2:]
    cls = torch.optim.AdamW if decoupled_weight_decay else torch.optim.Adam
    opt = cls([p], lr=float(lr), betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
              amsgrad=amsgrad, maximize=maximize)
    st = opt.state[p]
    st["step"] = step.detach().clone().float()
    st["exp_avg"], st["exp_avg_sq"] = m.detach().clone(), v.detach().clone()
    if amsgrad:
        st["max_exp_avg_sq"] = rest[0].detach().clone()
    opt.step()
    out = [p.detach(), st["exp_avg"], st["exp_avg_sq"]]
    if amsgrad:
        out.append(st["max_exp_avg_sq"])
    return (*out, st["step"])


def _adam_samples(rng):
    # Few, 1-D tensors (see _sgd_samples); amsgrad and the other options are checked
    # against torch in tests/graph/test_optimizer_pass.py.
    def r(n, dtype=np.float64):
        return rng.standard_normal(n).astype(dtype)

    lr = np.asarray(0.01)
    return [
        Sample([r(4), r(4), r(4), np.abs(r(4)), np.asarray(3.0, np.float32), lr], grad=False,
               weight_decay=0.1),
        Sample([r(5, np.float32), r(5, np.float32), r(5, np.float32),
                np.abs(r(5, np.float32)), np.asarray(1.0, np.float32), lr], grad=False,
               decoupled_weight_decay=True, weight_decay=0.01, maximize=True, beta1=0.3),
    ]


def _adam_update_kernel(ctx, ts, out=None, **a):
    return _adam_kernel(ctx, *ts, out=out, **a)


# `out=`: an array or None per output, possibly the inputs' own memory (see sgd_update).
_adam_update_kernel.accepts_out = True
_adam_update_kernel.out_may_alias_inputs = True

register(OpDef(
    "adam_update",
    inputs=("*tensors",),  # param, grad, exp_avg, exp_avg_sq[, max_exp_avg_sq], step, lr
    outputs=("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"),
    attrs=dict(_ADAM_ATTRS),
    infer_meta=_adam_meta,
    sbp=_elementwise_sbp(_adam_meta),
    keeps_sbp=_param_of,
    kernel=_adam_update_kernel,
    reference=lambda torch, ts, **a: _torch_adam(torch, *ts, **a),
    samples=_adam_samples,
    doc="One Adam/AdamW step of one parameter (torch's formula); outputs param, exp_avg, "
        "exp_avg_sq[, max_exp_avg_sq], step.",
))


# -- Adagrad --------------------------------------------------------------------------------
_ADAGRAD_ATTRS = {"lr_decay": Attr("float", 0.0), "weight_decay": Attr("float", 0.0),
                  "eps": Attr("float", 1e-10), "maximize": Attr("bool", False)}


def _adagrad_meta(p, g, s, step, lr, **_):
    _check_like("adagrad_update", p, (g, s), ("grad", "sum"))
    _check_scalar("adagrad_update", step, "step")
    _check_scalar("adagrad_update", lr, "lr")
    return (p, s, step)


def _adagrad_kernel(ctx, p, g, s, step, lr, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
                    maximize=False, out=None):
    """torch's single-tensor Adagrad step (the eager optimizer's formula, same roundings):
    t = t + 1;  g = ±grad (+ wd * p);  clr = lr / (1 + (t - 1) * lr_decay)
    s = s + g * g;  p = p + (-clr) * (g / (sqrt(s) + eps)).
    `out`: (param, sum, step) arrays or None, possibly the inputs' memory."""
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, s_out, t_out = out if out is not None else (None, None, None)
    new_step = prims.binary("add", step, _s(ctx, 1, ctx.out_metas[2].dtype), out=t_out)
    t = _host(ctx, new_step)
    if maximize:
        g = prims.unary("neg", g)
    if weight_decay != 0:
        g = prims.binary("add", g, prims.binary("mul", _s(ctx, weight_decay, d), p))
    clr = _host(ctx, lr) / (1 + (t - 1) * lr_decay)
    s = prims.binary("add", s, prims.binary("mul", g, g), out=s_out)
    std = prims.binary("add", prims.unary("sqrt", s), _s(ctx, eps, d))
    p = prims.binary("add", p, prims.binary("mul", _s(ctx, -clr, d), prims.binary("div", g, std)),
                     out=p_out)
    return p, s, new_step


def _torch_adagrad(torch, p, g, s, step, lr, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
                   maximize=False):
    p = p.detach().clone()
    p.grad = g.detach().clone()
    opt = torch.optim.Adagrad([p], lr=float(lr), lr_decay=lr_decay, weight_decay=weight_decay,
                              eps=eps, maximize=maximize, foreach=False)
    st = opt.state[p]
    st["step"] = step.detach().clone().float()
    st["sum"] = s.detach().clone()
    opt.step()
    return p.detach(), st["sum"], st["step"]


def _adagrad_samples(rng):
    def r(n, dtype=np.float64):
        return rng.standard_normal(n).astype(dtype)

    lr = np.asarray(0.1)
    return [
        Sample([r(4), r(4), np.abs(r(4)), np.asarray(2.0, np.float32), lr], grad=False,
               weight_decay=0.1, lr_decay=0.01),
        Sample([r(5, np.float32), r(5, np.float32), np.abs(r(5, np.float32)),
                np.asarray(0.0, np.float32), lr], grad=False, maximize=True, eps=1e-6),
    ]


def _adagrad_update_kernel(ctx, ts, out=None, **a):
    return _adagrad_kernel(ctx, *ts, out=out, **a)


_adagrad_update_kernel.accepts_out = True
_adagrad_update_kernel.out_may_alias_inputs = True

register(OpDef(
    "adagrad_update",
    inputs=("*tensors",),  # param, grad, sum, step, lr
    outputs=("param", "sum", "step"),
    attrs=dict(_ADAGRAD_ATTRS),
    infer_meta=_adagrad_meta,
    sbp=_elementwise_sbp(_adagrad_meta),
    keeps_sbp=_param_of,
    kernel=_adagrad_update_kernel,
    reference=lambda torch, ts, **a: _torch_adagrad(torch, *ts, **a),
    samples=_adagrad_samples,
    doc="One Adagrad step of one parameter (torch's formula); outputs param, sum, step.",
))


# -- multi-tensor forms ---------------------------------------------------------------------
def _blocks(name, metas, n, per, shared):
    if n < 1 or len(metas) != n * per + shared:
        raise op_error(name, f"expected {n} blocks of {per} tensors and {shared} shared "
                             f"scalars, got {len(metas)} tensors")
    return [metas[i * per:(i + 1) * per] for i in range(n)], metas[n * per:]


def _multi(name, single_meta, single_kernel, per_of, shared_of):
    def meta(*metas, n=1, **attrs):
        blocks, shared = _blocks(name, metas, n, per_of(attrs), shared_of(attrs))
        return tuple(m for b in blocks for m in single_meta(*b, *shared, **attrs))

    def kernel(ctx, ts, n=1, out=None, **attrs):
        blocks, shared = _blocks(name, ts, n, per_of(attrs), shared_of(attrs))
        metas = ctx.out_metas
        k = len(metas) // n
        if out is not None and not isinstance(out, tuple):
            out = (out,)  # the runtime passes a lone output's array bare
        res_all = []
        for i, b in enumerate(blocks):
            sub = _Sub(ctx, metas[i * k:(i + 1) * k])
            o = None
            if out is not None and any(x is not None for x in out[i * k:(i + 1) * k]):
                o = out[i * k:(i + 1) * k] if k > 1 else out[i * k]
            res = single_kernel(sub, *b, *shared, out=o, **attrs)
            res_all.extend(res if isinstance(res, tuple) else (res,))
        return tuple(res_all)

    kernel.accepts_out = True  # per output an array or None, as the single-tensor kernel
    kernel.out_may_alias_inputs = True

    return meta, kernel


class _Sub:
    """A kernel context for one block of a multi-tensor call."""

    __slots__ = ("prims", "out_metas")

    def __init__(self, ctx, out_metas):
        self.prims = ctx.prims
        self.out_metas = out_metas


def _sgd_per(attrs):
    return 3 if attrs.get("momentum", 0.0) != 0 else 2


def _sgd_shared(attrs):
    return 2 if attrs.get("momentum", 0.0) != 0 else 1


def _adam_per(attrs):
    return 5 if attrs.get("amsgrad") else 4


_msgd_meta, _msgd_kernel = _multi("multi_sgd_update", _sgd_meta, _sgd_kernel, _sgd_per,
                                  _sgd_shared)


def _adam_single_meta(p, g, m, v, *rest, amsgrad=False, **attrs):
    # a block carries its own step counter: (p, g, m, v[, vmax], step) + shared lr
    return _adam_meta(p, g, m, v, *rest, amsgrad=amsgrad, **attrs)


_madam_meta, _madam_kernel = _multi("multi_adam_update", _adam_single_meta, _adam_kernel,
                                    lambda a: _adam_per(a) + 1, lambda a: 1)


_madagrad_meta, _madagrad_kernel = _multi("multi_adagrad_update", _adagrad_meta,
                                          _adagrad_kernel, lambda a: 4, lambda a: 1)


def _torch_multi(single, per_of):
    def ref(torch, ts, n=1, **attrs):
        per = per_of(attrs)
        out = []
        for i in range(n):
            res = single(torch, *ts[i * per:(i + 1) * per], *ts[n * per:], **attrs)
            out.extend(res if isinstance(res, tuple) else (res,))
        return tuple(out)

    return ref


def _multi_samples(single_samples, per_of, shared_of, n):
    """The first single-op sample as `n` blocks (few tensors: see _sgd_samples)."""
    def samples(rng):
        s = single_samples(rng)[0]
        ts = list(s.inputs[0]) if isinstance(s.inputs[0], list) else list(s.inputs)
        per, shared = per_of(s.attrs), shared_of(s.attrs)
        block, tail = ts[:len(ts) - shared], ts[len(ts) - shared:]
        assert len(block) == per
        blocks = [[x + 0.5 * k if x.ndim else x for x in block] for k in range(n)]
        return [Sample([t for b in blocks for t in b] + tail, grad=False, n=n, rtol=s.rtol,
                       **s.attrs)]

    return samples


register(OpDef(
    "multi_sgd_update",
    inputs=("*tensors",),  # n x (param, grad[, momentum_buffer]), lr[, first]
    outputs=("out",),
    attrs={"n": Attr("int", 1), **_SGD_ATTRS},
    infer_meta=_msgd_meta,
    sbp=_elementwise_sbp(_msgd_meta),
    keeps_sbp=_params_of(_sgd_per),
    kernel=_msgd_kernel,
    reference=_torch_multi(lambda torch, *ts, **a: _torch_sgd(torch, *ts, **a), _sgd_per),
    samples=_multi_samples(_sgd_samples, _sgd_per, _sgd_shared, 2),
    doc="SGD steps of n parameters in one call; outputs per parameter param[, buffer].",
))

register(OpDef(
    "multi_adam_update",
    inputs=("*tensors",),  # n x (param, grad, exp_avg, exp_avg_sq[, max_exp_avg_sq], step), lr
    outputs=("out",),
    attrs={"n": Attr("int", 1), **_ADAM_ATTRS},
    infer_meta=_madam_meta,
    sbp=_elementwise_sbp(_madam_meta),
    keeps_sbp=_params_of(lambda a: _adam_per(a) + 1),
    kernel=_madam_kernel,
    reference=_torch_multi(lambda torch, *ts, **a: _torch_adam(torch, *ts, **a),
                           lambda a: _adam_per(a) + 1),
    samples=_multi_samples(_adam_samples, lambda a: _adam_per(a) + 1, lambda a: 1, 1),
    doc="Adam/AdamW steps of n parameters in one call; outputs per parameter param, "
        "exp_avg, exp_avg_sq[, max_exp_avg_sq], step.",
))

register(OpDef(
    "multi_adagrad_update",
    inputs=("*tensors",),  # n x (param, grad, sum, step), lr
    outputs=("out",),
    attrs={"n": Attr("int", 1), **_ADAGRAD_ATTRS},
    infer_meta=_madagrad_meta,
    sbp=_elementwise_sbp(_madagrad_meta),
    keeps_sbp=_params_of(lambda a: 4),
    kernel=_madagrad_kernel,
    reference=_torch_multi(lambda torch, *ts, **a: _torch_adagrad(torch, *ts, **a),
                           lambda a: 4),
    samples=_multi_samples(_adagrad_samples, lambda a: 4, lambda a: 1, 2),
    doc="Adagrad steps of n parameters in one call; outputs per parameter param, sum, step.",
))

__all__: list[str] = []
_ = TensorMeta  # metas flow through unchanged: an update keeps the param's meta


# -- multi-tensor updates of the other eager optimizers ----------------------------------------
# RMSprop, Adadelta, Adamax, NAdam, RAdam, ASGD and Rprop, run by their foreach steps: per
# parameter a block (param, grad, states..., 0-d state scalars...), then the shared host `lr`
# (Rprop has none).  Each block is torch's single-tensor step written with the same
# elementwise arithmetic as the per-parameter path (foreach=False), so the two agree bit for
# bit.  The 0-d state scalars (step counts; NAdam's mu_product; ASGD's eta and mu) are
# advanced inside the op and read there, at run time, never by the Python thread.
#
#   RMSprop  g = ±grad (+ wd * p);  v = alpha * v + (1 - alpha) * g * g
#            centered: a = lerp(a, g, 1 - alpha); avg = sqrt(v - a * a) + eps
#            else avg = sqrt(v) + eps
#            momentum: b = momentum * b + g / avg; p = p - lr * b;  else p = p - lr * g / avg
#   Adadelta v = rho * v + (1 - rho) * g * g;  delta = sqrt(u + eps) / sqrt(v + eps) * g
#            u = rho * u + (1 - rho) * delta * delta;  p = p - lr * delta
#   Adamax   m = lerp(m, g, 1 - b1);  u = max(b2 * u, |g| + eps);  p = p - lr / (1 - b1^t) * m / u
#   NAdam    mu_t = b1 (1 - 0.5 * 0.96^(t * momentum_decay));  mu_product *= mu_t
#            m, v as Adam;  denom = sqrt(v / (1 - b2^t)) + eps
#            p = p - lr (1 - mu_t) / (1 - mu_product) g / denom
#                  - lr mu_{t+1} / (1 - mu_product mu_{t+1}) m / denom
#   RAdam    m, v as Adam;  rho_t = rho_inf - 2 t b2^t / (1 - b2^t)
#            p = p - lr m / (1 - b1^t) (* sqrt(1 - b2^t) / (sqrt(v) + eps) * r_t if rho_t > 5)
#   ASGD     p = p (1 - lambd eta) - eta g;  ax = p if mu == 1 else ax + mu (p - ax)
#            eta = f32(lr / (1 + lambd lr t)^alpha);  mu = f32(1 / max(1, t - t0))
#   Rprop    s = sign(g * prev);  step_size = clamp(step_size * (etaplus | etaminus | 1), ...)
#            g = 0 where s < 0;  p = p - sign(g) * step_size;  prev = g
def _outs(out, k):
    """The kernel's `out=`: an array or None per output (None: fresh arrays)."""
    if out is None:
        return (None,) * k
    return tuple(out) if isinstance(out, tuple) else (out,)


def _prep_grad(ctx, d, p, g, weight_decay, maximize):
    """±grad (+ weight_decay * p), as the eager step: `-grad`, then `grad.add(p, alpha=wd)`."""
    prims = ctx.prims
    if maximize:
        g = prims.unary("neg", g)
    if weight_decay != 0:
        g = prims.binary("add", g, prims.binary("mul", p, _s(ctx, weight_decay, d)))
    return g


def _advance(ctx, step, out, k=-1):
    """step + 1 in the counter's own dtype (written into `out`), and its value on the host."""
    new = ctx.prims.binary("add", step, _s(ctx, 1, ctx.out_metas[k].dtype), out=out)
    return new, _host(ctx, new)


def _square_avg(ctx, d, v, g, rate, out):
    """v.mul_(rate).addcmul_(g, g, value=1 - rate)."""
    prims = ctx.prims
    v = prims.binary("mul", v, _s(ctx, rate, d), out=out)
    gg = prims.binary("mul", prims.binary("mul", _s(ctx, 1 - rate, d), g), g)
    return prims.binary("add", v, gg, out=v)  # v is `out` or a fresh array: ours


def _lerp_into(ctx, start, end, w, out):
    """start.lerp_(end, w) with the lerp op's arithmetic, written into `out` when given."""
    new = _lerp_arrays(ctx, start, end, w, -0.5 < w < 0.5)
    return new if out is None else ctx.prims.copy(out, new)


def _names_meta(name, keys, n_scalars):
    """A block's meta check: (param, grad, *states like param, *0-d scalars[, lr])."""
    def meta(p, g, *rest, has_lr=True, **_):
        states = rest[:len(keys)]
        scalars = rest[len(keys):]
        if len(states) != len(keys) or len(scalars) != n_scalars + has_lr:
            raise op_error(name, f"expected a block of param, grad, {', '.join(keys)} and "
                                 f"{n_scalars} scalars, got {2 + len(rest)} tensors")
        _check_like(name, p, (g, *states), ("grad", *keys))
        for m in scalars:
            _check_scalar(name, m, "a state scalar or lr")
        return (p, *states, *scalars[:n_scalars])

    return meta


# -- RMSprop
_RMSPROP_ATTRS = {"alpha": Attr("float", 0.99), "eps": Attr("float", 1e-8),
                  "weight_decay": Attr("float", 0.0), "momentum": Attr("float", 0.0),
                  "centered": Attr("bool", False), "maximize": Attr("bool", False)}


def _rmsprop_keys(momentum=0.0, centered=False, **_):
    return ("square_avg",) + (("momentum_buffer",) if momentum > 0 else ()) + (
        ("grad_avg",) if centered else ())


def _rmsprop_meta(*ts, **attrs):
    keys = _rmsprop_keys(**attrs)
    return _names_meta("rmsprop_update", keys, 1)(*ts)


def _rmsprop_kernel(ctx, p, g, *rest, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                    centered=False, maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    nk = len(_rmsprop_keys(momentum, centered))
    states, (step, lr) = rest[:nk], rest[nk:]
    outs = _outs(out, nk + 2)
    new_step, _ = _advance(ctx, step, outs[-1])
    lr = _host(ctx, lr)
    g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    v = _square_avg(ctx, d, states[0], g, alpha, outs[1])
    new = [v]
    buf = None
    if momentum > 0:
        buf = states[1]
    if centered:
        a = _lerp_into(ctx, states[-1], g, 1 - alpha, outs[nk])
        avg = prims.unary("sqrt", prims.binary(
            "add", v, prims.binary("mul", prims.binary("mul", _s(ctx, -1, d), a), a)))
    else:
        avg = prims.unary("sqrt", v)
    avg = prims.binary("add", avg, _s(ctx, eps, d), out=avg)  # avg is a fresh array
    if momentum > 0:
        # buf.mul_(momentum).addcdiv_(g, avg): value 1 multiplies exactly, so it is left out
        buf = prims.binary("mul", buf, _s(ctx, momentum, d), out=outs[2])
        buf = prims.binary("add", buf, prims.binary("div", g, avg), out=buf)
        new.append(buf)
        p = prims.binary("add", p, prims.binary("mul", buf, _s(ctx, -lr, d)), out=outs[0])
    else:
        p = prims.binary("add", p, prims.binary("mul", _s(ctx, -lr, d),
                                                prims.binary("div", g, avg)), out=outs[0])
    if centered:
        new.append(a)
    return (p, *new, new_step)


# -- Adadelta
_ADADELTA_ATTRS = {"rho": Attr("float", 0.9), "eps": Attr("float", 1e-6),
                   "weight_decay": Attr("float", 0.0), "maximize": Attr("bool", False)}
_adadelta_meta = _names_meta("adadelta_update", ("square_avg", "acc_delta"), 1)


def _adadelta_kernel(ctx, p, g, v, u, step, lr, rho=0.9, eps=1e-6, weight_decay=0.0,
                     maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, v_out, u_out, t_out = _outs(out, 4)
    new_step, _ = _advance(ctx, step, t_out)
    lr = _host(ctx, lr)
    g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    v = _square_avg(ctx, d, v, g, rho, v_out)
    std = prims.unary("sqrt", prims.binary("add", v, _s(ctx, eps, d)))
    delta = prims.unary("sqrt", prims.binary("add", u, _s(ctx, eps, d)))
    delta = prims.binary("mul", prims.binary("div", delta, std), g)
    u = _square_avg(ctx, d, u, delta, rho, u_out)
    p = prims.binary("add", p, prims.binary("mul", delta, _s(ctx, -lr, d)), out=p_out)
    return p, v, u, new_step


# -- Adamax
_ADAMAX_ATTRS = {"beta1": Attr("float", 0.9), "beta2": Attr("float", 0.999),
                 "eps": Attr("float", 1e-8), "weight_decay": Attr("float", 0.0),
                 "maximize": Attr("bool", False)}
_adamax_meta = _names_meta("adamax_update", ("exp_avg", "exp_inf"), 1)


def _adamax_kernel(ctx, p, g, m, u, step, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                   weight_decay=0.0, maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, m_out, u_out, t_out = _outs(out, 4)
    new_step, t = _advance(ctx, step, t_out)
    lr = _host(ctx, lr)
    g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    m = _lerp_into(ctx, m, g, 1 - beta1, m_out)
    bound = prims.binary("add", prims.unary("abs", g), _s(ctx, eps, d))
    u = prims.binary("maximum", prims.binary("mul", u, _s(ctx, beta2, d)), bound, out=u_out)
    clr = lr / (1 - beta1**t)
    p = prims.binary("add", p, prims.binary("mul", _s(ctx, -clr, d), prims.binary("div", m, u)),
                     out=p_out)
    return p, m, u, new_step


# -- NAdam
_NADAM_ATTRS = {"beta1": Attr("float", 0.9), "beta2": Attr("float", 0.999),
                "eps": Attr("float", 1e-8), "weight_decay": Attr("float", 0.0),
                "momentum_decay": Attr("float", 4e-3),
                "decoupled_weight_decay": Attr("bool", False), "maximize": Attr("bool", False)}
_nadam_meta = _names_meta("nadam_update", ("exp_avg", "exp_avg_sq"), 2)


def _nadam_kernel(ctx, p, g, m, v, step, mu_product, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=0.0, momentum_decay=4e-3, decoupled_weight_decay=False,
                  maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, m_out, v_out, t_out, mp_out = _outs(out, 5)
    new_step, t = _advance(ctx, step, t_out, 3)
    lr = _host(ctx, lr)
    if weight_decay != 0 and decoupled_weight_decay:
        p = prims.binary("mul", p, _s(ctx, 1 - lr * weight_decay, d), out=p_out)
        g = _prep_grad(ctx, d, p, g, 0.0, maximize)
    else:
        g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    mu = beta1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))
    mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
    # the product in the tensor's dtype, as torch's `mu_product *= mu` rounds it
    new_mp = prims.binary("mul", mu_product, _s(ctx, mu, ctx.out_metas[4].dtype), out=mp_out)
    mp = _host(ctx, new_mp)
    mp_next = mp * mu_next
    m = _lerp_into(ctx, m, g, 1 - beta1, m_out)
    v = _square_avg(ctx, d, v, g, beta2, v_out)
    denom = prims.unary("sqrt", prims.binary("div", v, _s(ctx, 1 - beta2**t, d)))
    denom = prims.binary("add", denom, _s(ctx, eps, d), out=denom)
    c1 = -lr * (1.0 - mu) / (1.0 - mp)
    c2 = -lr * mu_next / (1.0 - mp_next)
    p = prims.binary("add", p, prims.binary("mul", _s(ctx, c1, d), prims.binary("div", g, denom)),
                     out=p_out)
    p = prims.binary("add", p, prims.binary("mul", _s(ctx, c2, d), prims.binary("div", m, denom)),
                     out=p if p_out is None else p_out)
    return p, m, v, new_step, new_mp


# -- RAdam
_RADAM_ATTRS = {"beta1": Attr("float", 0.9), "beta2": Attr("float", 0.999),
                "eps": Attr("float", 1e-8), "weight_decay": Attr("float", 0.0),
                "decoupled_weight_decay": Attr("bool", False), "maximize": Attr("bool", False)}
_radam_meta = _names_meta("radam_update", ("exp_avg", "exp_avg_sq"), 1)


def _radam_kernel(ctx, p, g, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8,
                  weight_decay=0.0, decoupled_weight_decay=False, maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, m_out, v_out, t_out = _outs(out, 4)
    new_step, t = _advance(ctx, step, t_out)
    lr = _host(ctx, lr)
    if weight_decay != 0 and decoupled_weight_decay:
        p = prims.binary("mul", p, _s(ctx, 1 - lr * weight_decay, d), out=p_out)
        g = _prep_grad(ctx, d, p, g, 0.0, maximize)
    else:
        g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    m = _lerp_into(ctx, m, g, 1 - beta1, m_out)
    v = _square_avg(ctx, d, v, g, beta2, v_out)
    bias_correction1 = 1 - beta1**t
    bias_correction2 = 1 - beta2**t
    update = prims.binary("mul", prims.binary("div", m, _s(ctx, bias_correction1, d)),
                          _s(ctx, lr, d))
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * t * (beta2**t) / bias_correction2
    if rho_t > 5.0:
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        adaptive = prims.binary("div", _s(ctx, bias_correction2**0.5, d), prims.binary(
            "add", prims.unary("sqrt", v), _s(ctx, eps, d)))
        update = prims.binary("mul", prims.binary("mul", update, adaptive), _s(ctx, rect, d))
    p = prims.binary("add", p, prims.binary("mul", update, _s(ctx, -1.0, d)), out=p_out)
    return p, m, v, new_step


# -- ASGD
_ASGD_ATTRS = {"lambd": Attr("float", 1e-4), "alpha": Attr("float", 0.75),
               "t0": Attr("float", 1e6), "weight_decay": Attr("float", 0.0),
               "maximize": Attr("bool", False)}
_asgd_meta = _names_meta("asgd_update", ("ax",), 3)


def _asgd_kernel(ctx, p, g, ax, step, eta, mu, lr, lambd=1e-4, alpha=0.75, t0=1e6,
                 weight_decay=0.0, maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, ax_out, t_out, eta_out, mu_out = _outs(out, 5)
    new_step, t = _advance(ctx, step, t_out, 2)
    lr = _host(ctx, lr)
    g = _prep_grad(ctx, d, p, g, weight_decay, maximize)
    eta_v, mu_v = _host(ctx, eta), _host(ctx, mu)
    p = prims.binary("mul", p, _s(ctx, 1 - lambd * eta_v, d), out=p_out)
    p = prims.binary("add", p, prims.binary("mul", g, _s(ctx, -eta_v, d)),
                     out=p if p_out is None else p_out)
    if mu_v != 1:
        step_ax = prims.binary("mul", prims.binary("sub", p, ax), _s(ctx, mu_v, d))
        ax = prims.binary("add", ax, step_ax, out=ax_out)
    else:
        ax = prims.contiguous(p) if ax_out is None else prims.copy(ax_out, p)
    # torch makes both new values float32 tensors before copying them into the state
    new_eta = float(np.float32(lr / ((1 + lambd * lr * t) ** alpha)))
    new_mu = float(np.float32(1 / max(1, t - t0)))
    eta = _s(ctx, new_eta, ctx.out_metas[3].dtype)
    mu = _s(ctx, new_mu, ctx.out_metas[4].dtype)
    if eta_out is not None:
        eta = prims.copy(eta_out, eta)
    if mu_out is not None:
        mu = prims.copy(mu_out, mu)
    return p, ax, new_step, eta, mu


# -- Rprop
_RPROP_ATTRS = {"etaminus": Attr("float", 0.5), "etaplus": Attr("float", 1.2),
                "step_size_min": Attr("float", 1e-6), "step_size_max": Attr("float", 50.0),
                "maximize": Attr("bool", False)}
_rprop_names_meta = _names_meta("rprop_update", ("prev", "step_size"), 1)


def _rprop_meta(*ts, **_):
    return _rprop_names_meta(*ts, has_lr=False)


def _rprop_kernel(ctx, p, g, prev, step_size, step, etaminus=0.5, etaplus=1.2,
                  step_size_min=1e-6, step_size_max=50.0, maximize=False, out=None):
    prims = ctx.prims
    d = ctx.out_metas[0].dtype
    p_out, prev_out, ss_out, t_out = _outs(out, 4)
    new_step, _ = _advance(ctx, step, t_out)
    if maximize:
        g = prims.unary("neg", g)
    sign = prims.unary("sign", prims.binary("mul", g, prev))
    zero = _s(ctx, 0, d)
    up, down = prims.binary("gt", sign, zero), prims.binary("lt", sign, zero)
    # masked fills of `sign`, as the eager step: etaplus, etaminus, then 1 where it is 0
    factor = prims.where(up, _s(ctx, etaplus, d), sign)
    factor = prims.where(down, _s(ctx, etaminus, d), factor)
    factor = prims.where(prims.binary("eq", sign, zero), _s(ctx, 1, d), factor)
    ss = prims.binary("mul", step_size, factor, out=ss_out)
    ss = prims.binary("maximum", ss, _s(ctx, step_size_min, d), out=ss)
    ss = prims.binary("minimum", ss, _s(ctx, step_size_max, d), out=ss)
    g = prims.where(down, zero, g)
    step_p = prims.binary("mul", prims.binary("mul", _s(ctx, -1, d), prims.unary("sign", g)), ss)
    p = prims.binary("add", p, step_p, out=p_out)
    prev = g if prev_out is None else prims.copy(prev_out, g)
    return p, prev, ss, new_step


# -- their torch references and samples
def _torch_block(cls, keys_of, n_scalars, kwargs_of, has_lr=True):
    """torch's optimizer `cls` (foreach=False) run one step on one block, its state set from
    the block: (param, grad, *states, *scalars[, lr]) -> (param, *states, *scalars)."""
    def single(torch, p, g, *rest, **attrs):
        names = keys_of(attrs) + _SCALAR_KEYS[cls][:n_scalars]
        kw = kwargs_of(**attrs)
        if has_lr:
            kw["lr"] = float(rest[-1])
        p = p.detach().clone()
        p.grad = g.detach().clone()
        opt = getattr(torch.optim, cls)([p], foreach=False, **kw)
        st = opt.state[p]
        for k, v in zip(names, rest, strict=False):
            st[k] = v.detach().clone()
        opt.step()
        return (p.detach(), *(st[k] for k in names))

    return single


_SCALAR_KEYS = {"RMSprop": ("step",), "Adadelta": ("step",), "Adamax": ("step",),
                "NAdam": ("step", "mu_product"), "RAdam": ("step",),
                "ASGD": ("step", "eta", "mu"), "Rprop": ("step",)}


def _betas_kw(beta1=0.9, beta2=0.999, **kw):
    return {"betas": (beta1, beta2), **kw}


def _rprop_kw(etaminus=0.5, etaplus=1.2, step_size_min=1e-6, step_size_max=50.0, **kw):
    return {"etas": (etaminus, etaplus), "step_sizes": (step_size_min, step_size_max), **kw}


def _optim_samples(block, variants, has_lr=True):
    """Samples of a multi-tensor update: one block of 1-D float64 tensors with the first
    attrs, one block of 0-d tensors (float32, float64 alternately) for each other variant,
    and a call of two 0-d blocks where that is small.  Few, small tensors: the global-op
    check tries every SBP of every input (B, P, S(i)), and the product grows fast."""
    def samples(rng):
        lr = [np.asarray(0.05)] if has_lr else []
        out = [Sample(block(rng, (4,), np.float64, variants[0]) + lr, grad=False, n=1,
                      **variants[0])]
        for k, attrs in enumerate(variants[1:]):
            dtype = np.float32 if k % 2 == 0 else np.float64
            out.append(Sample(block(rng, (), dtype, attrs) + lr, grad=False, n=1, **attrs))
        two = block(rng, (), np.float64, variants[0]) + block(rng, (), np.float64, variants[0])
        if len(two) <= 10:  # 2 ** 10 SBP combinations (B or P per 0-d input), times lr's
            out.append(Sample(two + lr, grad=False, n=2, **variants[0]))
        return out

    return samples


def _r(rng, shape, dtype, positive=False):
    x = rng.standard_normal(shape)
    return (np.abs(x) + 0.1 if positive else x).astype(dtype)


def _f32(value):
    return np.asarray(value, np.float32)


def _rmsprop_block(rng, shape, dtype, attrs):
    p, g = _r(rng, shape, dtype), _r(rng, shape, dtype)
    a = _r(rng, shape, dtype)
    v = (a * a + _r(rng, shape, dtype, True)).astype(dtype)  # v >= a * a: sqrt(v - a * a)
    states = [v]
    if attrs.get("momentum", 0.0) > 0:
        states.append(_r(rng, shape, dtype))
    if attrs.get("centered"):
        states.append(a)
    return [p, g, *states, _f32(2.0)]


def _adadelta_block(rng, shape, dtype, attrs):
    return [_r(rng, shape, dtype), _r(rng, shape, dtype), _r(rng, shape, dtype, True),
            _r(rng, shape, dtype, True), _f32(3.0)]


def _adamax_block(rng, shape, dtype, attrs):
    return [_r(rng, shape, dtype), _r(rng, shape, dtype), _r(rng, shape, dtype),
            _r(rng, shape, dtype, True), _f32(2.0)]


def _adam_like_block(step, *extra, early=None):
    """(param, grad, exp_avg, exp_avg_sq, step, *extra); the step is `early` for attrs with
    beta2 0.9 (RAdam's unrectified first steps)."""
    def block(rng, shape, dtype, attrs):
        t = early if early is not None and attrs.get("beta2") == 0.9 else step
        return [_r(rng, shape, dtype), _r(rng, shape, dtype), _r(rng, shape, dtype),
                _r(rng, shape, dtype, True), _f32(t), *map(_f32, extra)]

    return block


def _asgd_block(rng, shape, dtype, attrs):
    # mu is 1 until the step passes t0 (then ax becomes p), a fraction after (ax averages)
    mu = 0.5 if attrs.get("t0", 1e6) < 3 else 1.0
    return [_r(rng, shape, dtype), _r(rng, shape, dtype), _r(rng, shape, dtype),
            _f32(3.0), _f32(0.04), _f32(mu)]


def _rprop_block(rng, shape, dtype, attrs):
    prev = _r(rng, shape, dtype)
    if prev.ndim:
        prev[0] = 0  # a zero sign: the step size is kept
    return [_r(rng, shape, dtype), _r(rng, shape, dtype), prev,
            _r(rng, shape, dtype, True), _f32(4.0)]


def _register_multi(name, single, keys_of, n_scalars, attrs, kwargs_of, block, variants,
                    meta, kernel, doc, has_lr=True):
    def per_of(a):
        return 2 + len(keys_of(a)) + n_scalars

    shared = 1 if has_lr else 0
    mmeta, mkernel = _multi(name, meta, kernel, per_of, lambda a: shared)
    register(OpDef(
        name,
        inputs=("*tensors",),
        outputs=("out",),
        attrs={"n": Attr("int", 1), **attrs},
        infer_meta=mmeta,
        kernel=mkernel,
        saves=(),  # no gradient: an update only
        sbp=_elementwise_sbp(mmeta),
        keeps_sbp=_params_of(per_of),
        reference=_torch_multi(_torch_block(single, keys_of, n_scalars, kwargs_of, has_lr),
                               per_of),
        samples=_optim_samples(block, variants, has_lr=has_lr),
        doc=doc,
    ))


_register_multi(
    "multi_rmsprop_update", "RMSprop", lambda a: _rmsprop_keys(**a), 1, _RMSPROP_ATTRS,
    lambda **a: a, _rmsprop_block,
    [dict(weight_decay=0.1), dict(centered=True, maximize=True),
     dict(momentum=0.9, centered=True, alpha=0.9), dict(momentum=0.5, eps=1e-3)],
    _rmsprop_meta, _rmsprop_kernel,
    "RMSprop steps of n parameters in one call: n x (param, grad, square_avg"
    "[, momentum_buffer][, grad_avg], step), lr; outputs per parameter param, its states, "
    "step.")

_register_multi(
    "multi_adadelta_update", "Adadelta", lambda a: ("square_avg", "acc_delta"), 1,
    _ADADELTA_ATTRS, lambda **a: a, _adadelta_block,
    [dict(weight_decay=0.1), dict(rho=0.5, maximize=True, eps=1e-3)],
    _adadelta_meta, _adadelta_kernel,
    "Adadelta steps of n parameters in one call: n x (param, grad, square_avg, acc_delta, "
    "step), lr; outputs per parameter param, square_avg, acc_delta, step.")

_register_multi(
    "multi_adamax_update", "Adamax", lambda a: ("exp_avg", "exp_inf"), 1, _ADAMAX_ATTRS,
    _betas_kw, _adamax_block,
    [dict(weight_decay=0.1), dict(beta1=0.3, beta2=0.5, maximize=True)],
    _adamax_meta, _adamax_kernel,
    "Adamax steps of n parameters in one call: n x (param, grad, exp_avg, exp_inf, step), "
    "lr; outputs per parameter param, exp_avg, exp_inf, step.")

_register_multi(
    "multi_nadam_update", "NAdam", lambda a: ("exp_avg", "exp_avg_sq"), 2, _NADAM_ATTRS,
    _betas_kw, _adam_like_block(2.0, 0.8),
    [dict(weight_decay=0.1), dict(decoupled_weight_decay=True, weight_decay=0.1,
                                  momentum_decay=0.01, maximize=True)],
    _nadam_meta, _nadam_kernel,
    "NAdam steps of n parameters in one call: n x (param, grad, exp_avg, exp_avg_sq, step, "
    "mu_product), lr; outputs per parameter param, exp_avg, exp_avg_sq, step, mu_product.")

_register_multi(
    "multi_radam_update", "RAdam", lambda a: ("exp_avg", "exp_avg_sq"), 1, _RADAM_ATTRS,
    # step 10: rho_t > 5, the rectified branch; with beta2 0.9 step 2: rho_t < 5
    _betas_kw, _adam_like_block(9.0, early=1.0),
    [dict(weight_decay=0.1), dict(decoupled_weight_decay=True, weight_decay=0.1,
                                  maximize=True),
     dict(beta2=0.9)],
    _radam_meta, _radam_kernel,
    "RAdam steps of n parameters in one call: n x (param, grad, exp_avg, exp_avg_sq, step), "
    "lr; outputs per parameter param, exp_avg, exp_avg_sq, step.")

_register_multi(
    "multi_asgd_update", "ASGD", lambda a: ("ax",), 3, _ASGD_ATTRS, lambda **a: a,
    _asgd_block,
    [dict(weight_decay=0.1, t0=1.0), dict(maximize=True, lambd=0.01, alpha=0.5)],
    _asgd_meta, _asgd_kernel,
    "ASGD steps of n parameters in one call: n x (param, grad, ax, step, eta, mu), lr; "
    "outputs per parameter param, ax, step, eta, mu.")

_register_multi(
    "multi_rprop_update", "Rprop", lambda a: ("prev", "step_size"), 1, _RPROP_ATTRS,
    _rprop_kw, _rprop_block,
    [dict(), dict(etaminus=0.3, etaplus=1.5, step_size_min=0.2, step_size_max=1.0,
                  maximize=True)],
    _rprop_meta, _rprop_kernel,
    "Rprop steps of n parameters in one call: n x (param, grad, prev, step_size, step); "
    "outputs per parameter param, prev, step_size, step.", has_lr=False)
