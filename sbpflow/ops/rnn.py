"""Recurrent-cell ops: the pointwise part of one LSTM or GRU step, fused.

A recurrent layer computes the input projection of every time step with one matmul before its
loop; each step then adds the hidden projection (`linear`) and calls one of these ops, which
applies the gate nonlinearities and the state update in one kernel.  Gate layouts are torch's:
(i, f, g, o) for LSTM and (r, z, n) for GRU, each a block of `hidden_size` columns.

The grad rules are written with ops (so double backward works); they recompute the gate
activations from the saved pre-activations instead of keeping them as extra outputs.
"""

from __future__ import annotations

import numpy as np

from .._core.errors import op_error
from .._core.meta import TensorMeta
from ..sbp import B, P, Signature, Split
from ._util import require_float
from .nn import _finish, _in_compute
from .registry import OpDef, Sample, op, register


def _rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


def _check_rows(name, metas, names):
    """Every input is [batch, k] with the same batch and dtype."""
    for arg, m in zip(names, metas):
        if m.ndim != 2:
            raise op_error(name, f"argument '{arg}' must be 2-D [batch, features], got shape "
                           f"{list(m.shape)}")
        require_float(name, arg, m)
    ref = metas[0]
    for arg, m in zip(names[1:], metas[1:]):
        if m.shape[0] != ref.shape[0]:
            raise op_error(name, f"argument '{arg}' has batch size {m.shape[0]}, expected "
                           f"{ref.shape[0]} (the batch size of '{names[0]}')")
        if m.dtype is not ref.dtype:
            raise op_error(name, f"expected '{arg}' to have dtype {ref.dtype.name}, but got "
                           f"{m.dtype.name}", TypeError)


def _rows_sbp(n_in, n_out):
    def sbp(*metas, **attrs):
        sigs = [Signature((B,) * n_in, (B,) * n_out)]
        if metas[0].shape[0] > 1:
            # Rows (batch entries) update independently; the gate blocks of a row stay whole.
            sigs.append(Signature((Split(0),) * n_in, (Split(0),) * n_out))
        return sigs

    return sbp


def _cols(k, x, start, length):
    """Columns [start, start + length) of a 2-D kernel array."""
    return k.p.slice(x, (slice(None), slice(start, start + length)))


# =========================================================================================
# lstm_cell: (gates, c_prev) -> (h, c)
# =========================================================================================
def _lstm_cell_meta(gates, c_prev):
    _check_rows("lstm_cell", (gates, c_prev), ("gates", "c_prev"))
    h = c_prev.shape[1]
    if gates.shape[1] != 4 * h:
        raise op_error("lstm_cell", f"argument 'gates' must have 4 * hidden_size = {4 * h} "
                       f"columns (hidden_size from c_prev), got shape {list(gates.shape)}")
    return c_prev, c_prev


def _lstm_cell_kernel(ctx, gates, c_prev):
    h = ctx.in_metas[1].shape[1]
    k, (gates, c_prev) = _in_compute(ctx, (gates, c_prev))
    i = k.u("sigmoid", _cols(k, gates, 0, h))
    f = k.u("sigmoid", _cols(k, gates, h, h))
    g = k.u("tanh", _cols(k, gates, 2 * h, h))
    o = k.u("sigmoid", _cols(k, gates, 3 * h, h))
    c = k.add(k.mul(f, c_prev), k.mul(i, g))
    hy = k.mul(o, k.u("tanh", c))
    return _finish(ctx, hy, 0), _finish(ctx, c, 1)


def _lstm_cell_grad(ctx, gh, gc):
    d_gates, d_c_prev = op("lstm_cell_backward", gh, gc, ctx.input(0), ctx.input(1))
    return (d_gates if ctx.needs_input_grad[0] else None,
            d_c_prev if ctx.needs_input_grad[1] else None)


def _lstm_cell_reference(torch, gates, c_prev):
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _lstm_cell_samples(rng):
    return [
        Sample(_rand(rng, 3, 8), _rand(rng, 3, 2)),
        Sample(_rand(rng, 1, 12) * 2, _rand(rng, 1, 3)),
        Sample(_rand(rng, 4, 4), _rand(rng, 4, 1)),
        Sample(_rand(rng, 2, 8, dtype=np.float32), _rand(rng, 2, 2, dtype=np.float32),
               grad=False),
    ]


register(OpDef(
    "lstm_cell",
    inputs=("gates", "c_prev"),
    outputs=("h", "c"),
    infer_meta=_lstm_cell_meta,
    kernel=_lstm_cell_kernel,
    grad=_lstm_cell_grad,
    saves=("gates", "c_prev"),
    sbp=_rows_sbp(2, 2),
    reference=_lstm_cell_reference,
    samples=_lstm_cell_samples,
    doc="One LSTM step from the gate pre-activations (i, f, g, o) and the previous cell.",
))


# =========================================================================================
# gru_cell: (gi, gh, h_prev) -> h
# =========================================================================================
def _gru_cell_meta(gi, gh, h_prev):
    _check_rows("gru_cell", (gi, gh, h_prev), ("gi", "gh", "h_prev"))
    h = h_prev.shape[1]
    for arg, m in (("gi", gi), ("gh", gh)):
        if m.shape[1] != 3 * h:
            raise op_error("gru_cell", f"argument '{arg}' must have 3 * hidden_size = {3 * h} "
                           f"columns (hidden_size from h_prev), got shape {list(m.shape)}")
    return TensorMeta(h_prev.shape, h_prev.dtype)


def _gru_cell_kernel(ctx, gi, gh, h_prev):
    h = ctx.in_metas[2].shape[1]
    k, (gi, gh, h_prev) = _in_compute(ctx, (gi, gh, h_prev))
    r = k.u("sigmoid", k.add(_cols(k, gi, 0, h), _cols(k, gh, 0, h)))
    z = k.u("sigmoid", k.add(_cols(k, gi, h, h), _cols(k, gh, h, h)))
    n = k.u("tanh", k.add(_cols(k, gi, 2 * h, h), k.mul(r, _cols(k, gh, 2 * h, h))))
    # h = (1 - z) n + z h_prev = n + z (h_prev - n)
    return _finish(ctx, k.add(n, k.mul(z, k.sub(h_prev, n))))


def _gru_cell_grad(ctx, g):
    d_gi, d_gh, d_h = op("gru_cell_backward", g, ctx.input(0), ctx.input(1), ctx.input(2))
    need = ctx.needs_input_grad
    return (d_gi if need[0] else None, d_gh if need[1] else None, d_h if need[2] else None)


def _gru_cell_reference(torch, gi, gh, h_prev):
    ir, iz, in_ = gi.chunk(3, 1)
    hr, hz, hn = gh.chunk(3, 1)
    r = torch.sigmoid(ir + hr)
    z = torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    return (1 - z) * n + z * h_prev


def _gru_cell_samples(rng):
    return [
        Sample(_rand(rng, 3, 6), _rand(rng, 3, 6), _rand(rng, 3, 2)),
        Sample(_rand(rng, 1, 9) * 2, _rand(rng, 1, 9), _rand(rng, 1, 3)),
        Sample(_rand(rng, 2, 6, dtype=np.float32), _rand(rng, 2, 6, dtype=np.float32),
               _rand(rng, 2, 2, dtype=np.float32), grad=False),
    ]


register(OpDef(
    "gru_cell",
    inputs=("gi", "gh", "h_prev"),
    infer_meta=_gru_cell_meta,
    kernel=_gru_cell_kernel,
    grad=_gru_cell_grad,
    saves=("gi", "gh", "h_prev"),
    sbp=_rows_sbp(3, 1),
    reference=_gru_cell_reference,
    samples=_gru_cell_samples,
    doc="One GRU step from the input and hidden projections (r, z, n) and the previous state.",
))


# =========================================================================================
# The fused backward steps (their own grads, written with ops, give double backward)
# =========================================================================================
def _backward_sbp(n_linear, n_in, n_out):
    """Rows split as in the forward; and the backward is linear in the incoming gradients
    (the first n_linear inputs) for fixed saved tensors: (P.., B..) -> P."""
    rows = _rows_sbp(n_in, n_out)

    def sbp(*metas, **attrs):
        return rows(*metas) + [Signature((P,) * n_linear + (B,) * (n_in - n_linear),
                                         (P,) * n_out)]

    return sbp


def _blocks(k, pieces, dtype):
    """Concatenate 2-D kernel arrays along columns into a fresh array."""
    rows = pieces[0].shape[0]
    widths = [p.shape[1] for p in pieces]
    out = k.p.empty((rows, sum(widths)), dtype)
    start = 0
    for p, w in zip(pieces, widths):
        k.p.copy(_cols(k, out, start, w), p)
        start += w
    return out


def _narrow_cols(x, h, *blocks):
    return [op("narrow", x, dim=1, start=b * h, length=h) for b in blocks]


# -- lstm_cell_backward: (gh, gc, gates, c_prev) -> (d_gates, d_c_prev) -------------------
# The cell state c = f c_prev + i g is recomputed, not saved: one tensor less to keep per step.
def _lstm_cell_backward_meta(gh, gc, gates, c_prev):
    names = ("grad_h", "grad_c", "gates", "c_prev")
    _check_rows("lstm_cell_backward", (gh, gc, gates, c_prev), names)
    _lstm_cell_meta(gates, c_prev)
    for arg, m in zip(names, (gh, gc, gates, c_prev)):
        if arg != "gates" and m.shape != c_prev.shape:
            raise op_error("lstm_cell_backward", f"argument '{arg}' must have the shape of "
                           f"c_prev {list(c_prev.shape)}, got {list(m.shape)}")
    return gates, c_prev


def _lstm_cell_backward_kernel(ctx, gh, gc, gates, c_prev):
    h = ctx.in_metas[3].shape[1]
    k, (gh, gc, gates, c_prev) = _in_compute(ctx, (gh, gc, gates, c_prev))
    i = k.u("sigmoid", _cols(k, gates, 0, h))
    f = k.u("sigmoid", _cols(k, gates, h, h))
    g = k.u("tanh", _cols(k, gates, 2 * h, h))
    o = k.u("sigmoid", _cols(k, gates, 3 * h, h))
    tc = k.u("tanh", k.add(k.mul(f, c_prev), k.mul(i, g)))
    dc = k.add(gc, k.mul(k.mul(gh, o), k.sub(1.0, k.mul(tc, tc))))
    di = k.mul(k.mul(dc, g), k.mul(i, k.sub(1.0, i)))
    df = k.mul(k.mul(dc, c_prev), k.mul(f, k.sub(1.0, f)))
    dg = k.mul(k.mul(dc, i), k.sub(1.0, k.mul(g, g)))
    do = k.mul(k.mul(gh, tc), k.mul(o, k.sub(1.0, o)))
    d_gates = _blocks(k, [di, df, dg, do], k.dtype)
    return _finish(ctx, d_gates, 0), _finish(ctx, k.mul(dc, f), 1)


def _lstm_cell_backward_grad(ctx, u, v):
    """Second order.  With s_x the derivative of gate x's activation and w the cotangent
    reaching dc (w = u_i g s_i + u_f c_prev s_f + u_g i s_g + v f), differentiate
    dc = gc + gh o s_c, d_i = dc g s_i, d_f = dc c_prev s_f, d_g = dc i s_g, d_o = gh tanh(c) s_o
    and d_c_prev = dc f in each input (sigmoid' = s (1 - 2 sigmoid), tanh'' = -2 tanh s); the
    part through c = f c_prev + i g (l_c) then follows c back to the gates and c_prev."""
    h = ctx.in_metas[3].shape[1]
    gh, gc, gates, cp = (ctx.input(j) for j in range(4))
    i, f, o = (op("sigmoid", a) for a in _narrow_cols(gates, h, 0, 1, 3))
    (g,) = (op("tanh", a) for a in _narrow_cols(gates, h, 2))
    u_i, u_f, u_g, u_o = _narrow_cols(u, h, 0, 1, 2, 3)
    tc = op("tanh", f * cp + i * g)
    s_c = 1 - tc * tc
    s_i, s_f, s_o, s_g = i * (1 - i), f * (1 - f), o * (1 - o), 1 - g * g
    dc = gc + gh * o * s_c
    w = u_i * g * s_i + u_f * cp * s_f + u_g * i * s_g + v * f
    need = ctx.needs_input_grad
    d_gh = w * o * s_c + u_o * tc * s_o if need[0] else None
    d_gc = w if need[1] else None
    l_c = s_c * (u_o * gh * s_o - 2 * w * gh * o * tc)
    d_gates = None
    if need[2]:
        d_gates = op("cat", [
            s_i * (dc * (u_i * g * (1 - 2 * i) + u_g * s_g) + l_c * g),
            s_f * (dc * (u_f * cp * (1 - 2 * f) + v) + l_c * cp),
            s_g * (dc * (u_i * s_i - 2 * u_g * i * g) + l_c * i),
            s_o * gh * (w * s_c + u_o * tc * (1 - 2 * o)),
        ], dim=1)
    d_cp = u_f * dc * s_f + l_c * f if need[3] else None
    return d_gh, d_gc, d_gates, d_cp


def _lstm_cell_backward_reference(torch, gh, gc, gates, c_prev):
    """lstm_cell's gradient written out with torch ops."""
    a_i, a_f, a_g, a_o = gates.chunk(4, 1)
    i, f, o, g = torch.sigmoid(a_i), torch.sigmoid(a_f), torch.sigmoid(a_o), torch.tanh(a_g)
    tc = torch.tanh(f * c_prev + i * g)
    dc = gc + gh * o * (1 - tc * tc)
    d_gates = torch.cat([dc * g * i * (1 - i), dc * c_prev * f * (1 - f), dc * i * (1 - g * g),
                         gh * tc * o * (1 - o)], 1)
    return d_gates, dc * f


def _lstm_cell_backward_samples(rng):
    # Few and small: the global-ops check runs every SBP combination of the four inputs.
    def case(n, h, dtype=np.float64, **kw):
        return Sample(*(_rand(rng, n, k, dtype=dtype) for k in (h, h, 4 * h, h)), **kw)

    return [case(3, 2), case(1, 3, np.float32, grad=False)]


register(OpDef(
    "lstm_cell_backward",
    inputs=("grad_h", "grad_c", "gates", "c_prev"),
    outputs=("grad_gates", "grad_c_prev"),
    infer_meta=_lstm_cell_backward_meta,
    kernel=_lstm_cell_backward_kernel,
    grad=_lstm_cell_backward_grad,
    saves=("grad_h", "grad_c", "gates", "c_prev"),
    sbp=_backward_sbp(2, 4, 2),
    reference=_lstm_cell_backward_reference,
    samples=_lstm_cell_backward_samples,
    doc="The gradient of lstm_cell in one kernel: (grad_h, grad_c) -> (grad_gates, "
        "grad_c_prev).",
))


# -- gru_cell_backward: (g, gi, gh, h_prev) -> (d_gi, d_gh, d_h_prev) ---------------------
def _gru_cell_backward_meta(g, gi, gh, h_prev):
    _check_rows("gru_cell_backward", (g, gi, gh, h_prev), ("grad", "gi", "gh", "h_prev"))
    _gru_cell_meta(gi, gh, h_prev)
    if g.shape != h_prev.shape:
        raise op_error("gru_cell_backward", f"argument 'grad' must have the shape of h_prev "
                       f"{list(h_prev.shape)}, got {list(g.shape)}")
    return gi, gh, h_prev


def _gru_cell_backward_kernel(ctx, g, gi, gh, h_prev):
    h = ctx.in_metas[3].shape[1]
    k, (g, gi, gh, h_prev) = _in_compute(ctx, (g, gi, gh, h_prev))
    r = k.u("sigmoid", k.add(_cols(k, gi, 0, h), _cols(k, gh, 0, h)))
    z = k.u("sigmoid", k.add(_cols(k, gi, h, h), _cols(k, gh, h, h)))
    gh_n = _cols(k, gh, 2 * h, h)
    n = k.u("tanh", k.add(_cols(k, gi, 2 * h, h), k.mul(r, gh_n)))
    dn = k.mul(k.mul(g, k.sub(1.0, z)), k.sub(1.0, k.mul(n, n)))
    dz = k.mul(k.mul(g, k.sub(h_prev, n)), k.mul(z, k.sub(1.0, z)))
    dr = k.mul(k.mul(dn, gh_n), k.mul(r, k.sub(1.0, r)))
    d_gi = _blocks(k, [dr, dz, dn], k.dtype)
    d_gh = _blocks(k, [dr, dz, k.mul(dn, r)], k.dtype)
    return _finish(ctx, d_gi, 0), _finish(ctx, d_gh, 1), _finish(ctx, k.mul(g, z), 2)


def _gru_cell_backward_grad(ctx, u_gi, u_gh, v):
    """Second order.  The first-order outputs are d_gi = (dr, dz, dn), d_gh = (dr, dz, r dn),
    d_h = g z with dn = g (1 - z) s_n, dz = g (h_prev - n) s_z, dr = dn gh_n s_r; the
    cotangent objective is L = dn K + u_z dz + v g z, K = u_r gh_n s_r + ui_n + uh_n r."""
    h = ctx.in_metas[3].shape[1]
    g, gi, gh, hp = (ctx.input(j) for j in range(4))
    gi_r, gi_z, gi_n = _narrow_cols(gi, h, 0, 1, 2)
    gh_r, gh_z, gh_n = _narrow_cols(gh, h, 0, 1, 2)
    ui_r, ui_z, ui_n = _narrow_cols(u_gi, h, 0, 1, 2)
    uh_r, uh_z, uh_n = _narrow_cols(u_gh, h, 0, 1, 2)
    r = op("sigmoid", gi_r + gh_r)
    z = op("sigmoid", gi_z + gh_z)
    n = op("tanh", gi_n + r * gh_n)
    s_r, s_z, s_n = r * (1 - r), z * (1 - z), 1 - n * n
    u_r, u_z = ui_r + uh_r, ui_z + uh_z
    dn = g * (1 - z) * s_n
    big_k = u_r * gh_n * s_r + ui_n + uh_n * r
    l_an = s_n * (-2 * n * g * (1 - z) * big_k - u_z * g * s_z)
    l_az = s_z * g * (u_z * (hp - n) * (1 - 2 * z) - s_n * big_k + v)
    l_ar = s_r * (dn * (u_r * gh_n * (1 - 2 * r) + uh_n) + l_an * gh_n)
    need = ctx.needs_input_grad
    d_g = ((1 - z) * s_n * big_k + u_z * (hp - n) * s_z + v * z) if need[0] else None
    d_gi = op("cat", [l_ar, l_az, l_an], dim=1) if need[1] else None
    d_gh = op("cat", [l_ar, l_az, l_an * r + dn * u_r * s_r], dim=1) if need[2] else None
    d_hp = u_z * g * s_z if need[3] else None
    return d_g, d_gi, d_gh, d_hp


def _gru_cell_backward_reference(torch, g, gi, gh, h_prev):
    """gru_cell's gradient written out with torch ops."""
    ir, iz, in_ = gi.chunk(3, 1)
    hr, hz, hn = gh.chunk(3, 1)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    dn = g * (1 - z) * (1 - n * n)
    dz = g * (h_prev - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    return torch.cat([dr, dz, dn], 1), torch.cat([dr, dz, dn * r], 1), g * z


def _gru_cell_backward_samples(rng):
    # Few and small: the global-ops check runs every SBP combination of the four inputs.
    def case(n, h, dtype=np.float64, **kw):
        return Sample(*(_rand(rng, n, k, dtype=dtype) for k in (h, 3 * h, 3 * h, h)), **kw)

    return [case(3, 2), case(1, 3, np.float32, grad=False)]


register(OpDef(
    "gru_cell_backward",
    inputs=("grad", "gi", "gh", "h_prev"),
    outputs=("grad_gi", "grad_gh", "grad_h_prev"),
    infer_meta=_gru_cell_backward_meta,
    kernel=_gru_cell_backward_kernel,
    grad=_gru_cell_backward_grad,
    saves=("grad", "gi", "gh", "h_prev"),
    sbp=_backward_sbp(1, 4, 3),
    reference=_gru_cell_backward_reference,
    samples=_gru_cell_backward_samples,
    doc="The gradient of gru_cell in one kernel: grad_h -> (grad_gi, grad_gh, grad_h_prev).",
))
