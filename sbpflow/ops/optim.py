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
    kernel=_madagrad_kernel,
    reference=_torch_multi(lambda torch, *ts, **a: _torch_adagrad(torch, *ts, **a),
                           lambda a: 4),
    samples=_multi_samples(_adagrad_samples, lambda a: 4, lambda a: 1, 2),
    doc="Adagrad steps of n parameters in one call; outputs per parameter param, sum, step.",
))

__all__: list[str] = []
_ = TensorMeta  # metas flow through unchanged: an update keeps the param's meta
