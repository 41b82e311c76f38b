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
from .registry import Attr, OpDef, Sample, differentiating, op, register


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


# =========================================================================================
# lstm_layer: one LSTM layer in one direction over a whole padded sequence, in one op
# =========================================================================================
# The per-step path above issues about five ops per time step from Python; this op runs the
# time loop inside its kernel, so a sequence costs one op call forward and one backward (as
# torch's fused LSTM does).  Its third output is a workspace for the backward, per step
# [h_prev | c_prev | tanh(c) | i f g o (activated)], each block hidden_size wide: the backward
# reads it instead of recomputing the gates, and the weight gradient is one GEMM over all
# steps.  The workspace is `nondiff` (it carries no gradient).
_RESERVE = 7  # blocks of hidden_size per row of the workspace


def _time_steps(n, reverse):
    return range(n - 1, -1, -1) if reverse else range(n)


def _check_same_dtype(name, ref, named):
    for arg, m in named:  # RuntimeError, as torch's LSTM raises for a mixed-dtype state
        if m.dtype is not ref.dtype:
            raise op_error(name, f"expected '{arg}' to have dtype {ref.dtype.name}, but got "
                           f"{m.dtype.name}", RuntimeError)


def _lstm_layer_meta(proj, h0, c0, w_hh, reverse):
    name = "lstm_layer"
    if proj.ndim != 3:
        raise op_error(name, "argument 'proj' must be 3-D [seq_len, batch, 4 * hidden_size], "
                             f"got shape {list(proj.shape)}")
    require_float(name, "proj", proj)
    steps, batch, width = proj.shape
    if w_hh.ndim != 2 or w_hh.shape[0] != width or width != 4 * w_hh.shape[1]:
        raise op_error(name, f"argument 'w_hh' must have shape [4 * hidden_size, hidden_size] "
                             f"= {[width, width // 4]} (from proj's last axis {width}), got "
                             f"{list(w_hh.shape)}")
    hidden = w_hh.shape[1]
    for arg, m in (("h0", h0), ("c0", c0)):
        if m.shape != (batch, hidden):
            raise op_error(name, f"argument '{arg}' must have shape [batch, hidden_size] = "
                                 f"{[batch, hidden]}, got {list(m.shape)}")
    _check_same_dtype(name, proj, (("h0", h0), ("c0", c0), ("w_hh", w_hh)))
    return (TensorMeta((steps, batch, hidden), proj.dtype), TensorMeta((batch, hidden),
                                                                       proj.dtype),
            TensorMeta((steps, batch, _RESERVE * hidden), proj.dtype))


def _lstm_layer_kernel(ctx, proj, h0, c0, w_hh, reverse):
    k, (proj, h, c, w) = _in_compute(ctx, (proj, h0, c0, w_hh))
    p = ctx.prims
    steps, batch, _ = ctx.in_metas[0].shape
    hs = ctx.in_metas[3].shape[1]
    out = p.empty((steps, batch, hs), k.dtype)
    reserve = p.empty((steps, batch, _RESERVE * hs), k.dtype)
    wt = p.permute(w, (1, 0))
    for t in _time_steps(steps, reverse):
        r, h_out, proj_t = p.slice(reserve, (t,)), p.slice(out, (t,)), p.slice(proj, (t,))
        hw = p.matmul(h, wt)
        c_new = p.lstm_step(proj_t, hw, h, c, r, h_out)  # one loop, where the device has it
        h, c = h_out, (_lstm_step_composed(k, proj_t, hw, h, c, r, h_out, hs)
                       if c_new is None else c_new)
    c_n = p.contiguous(c)  # a fresh array even for an empty sequence (c is then c0)
    return _finish(ctx, out, 0), _finish(ctx, c_n, 1), _finish(ctx, reserve, 2)


def _lstm_step_composed(k, proj_t, hw, h, c, r, h_out, hs):
    """lstm_step from the other primitives: fills the reserve row r and h_out, returns c."""
    p = k.p
    p.copy(_cols(k, r, 0, hs), h)
    p.copy(_cols(k, r, hs, hs), c)
    pre = k.add(proj_t, hw)
    acts = _cols(k, r, 3 * hs, 4 * hs)
    k.u("sigmoid", pre, out=acts)  # i, f, o; the g block is overwritten with tanh
    g = k.u("tanh", _cols(k, pre, 2 * hs, hs), out=_cols(k, acts, 2 * hs, hs))
    c = k.add(k.mul(_cols(k, acts, hs, hs), c), k.mul(_cols(k, acts, 0, hs), g))
    tc = k.u("tanh", c, out=_cols(k, r, 2 * hs, hs))
    k.to("mul", _cols(k, acts, 3 * hs, hs), tc, h_out)
    return c


def _lstm_layer_grad(ctx, g_out, g_cn, _g_reserve=None):
    need = ctx.needs_input_grad
    if differentiating():
        grads = _lstm_layer_composed_grad(ctx, g_out, g_cn)
    else:
        grads = op("lstm_layer_backward", g_out, g_cn, ctx.output(2), ctx.input(3),
                   reverse=ctx.attrs["reverse"])
    return tuple(g if n else None for g, n in zip(grads, need))


def _lstm_layer_composed_grad(ctx, g_out, g_cn):
    """The gradient in differentiable ops, for a double backward: the forward recomputed
    step by step with lstm_cell from the saved inputs, then its gradient with
    lstm_cell_backward (whose own grad rule gives the second order)."""
    proj, h, c, w = (ctx.input(j) for j in range(4))
    steps = ctx.in_metas[0].shape[0]
    order = list(_time_steps(steps, ctx.attrs["reverse"]))
    if not order:
        return proj * 0.0, h * 0.0, g_cn * 1.0, w * 0.0
    wt = op("transpose", w, dim0=0, dim1=1)
    pre, h_prev, c_prev = {}, {}, {}
    for t in order:
        h_prev[t], c_prev[t] = h, c
        pre[t] = op("select", proj, dim=0, index=t) + op("matmul", h, wt)
        h, c = op("lstm_cell", pre[t], c)
    dh, dc, d_w = None, g_cn, None
    d_pre = [None] * steps
    for t in reversed(order):
        gh = op("select", g_out, dim=0, index=t)
        gh = gh if dh is None else gh + dh
        d_pre[t], dc = op("lstm_cell_backward", gh, dc, pre[t], c_prev[t])
        dh = op("matmul", d_pre[t], w)
        dw_t = op("matmul", op("transpose", d_pre[t], dim0=0, dim1=1), h_prev[t])
        d_w = dw_t if d_w is None else d_w + dw_t
    return op("stack", d_pre, dim=0), dh, dc, d_w


def _lstm_layer_sbp(proj, h0, c0, w_hh, reverse):
    sigs = [Signature((B, B, B, B), (B, B, B))]
    if proj.shape[1] > 1:  # batch entries run independently
        sigs.append(Signature((Split(1), Split(0), Split(0), B), (Split(1), Split(0), Split(1))))
    return sigs


def _lstm_layer_reference(torch, proj, h0, c0, w_hh, reverse=False):
    steps, batch = proj.shape[0], proj.shape[1]
    hs = w_hh.shape[1]
    outs, rows = [None] * steps, [None] * steps
    h, c = h0, c0
    for t in (reversed(range(steps)) if reverse else range(steps)):
        i, f, g, o = (proj[t] + h @ w_hh.T).chunk(4, 1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c_new = f * c + i * g
        tc = torch.tanh(c_new)
        rows[t] = torch.cat([h, c, tc, i, f, g, o], 1)
        h, c = o * tc, c_new
        outs[t] = h
    if not steps:
        return (proj.new_zeros(0, batch, hs), c0.clone(),
                proj.new_zeros(0, batch, _RESERVE * hs))
    return torch.stack(outs), c, torch.stack(rows).detach()


def _lstm_layer_samples(rng):
    # Few and small: the global-ops check runs every SBP combination of the inputs.
    def case(steps, batch, hs, dtype=np.float64, **kw):
        return Sample(_rand(rng, steps, batch, 4 * hs, dtype=dtype),
                      _rand(rng, batch, hs, dtype=dtype), _rand(rng, batch, hs, dtype=dtype),
                      _rand(rng, 4 * hs, hs, dtype=dtype) * 0.5, **kw)

    return [case(3, 2, 2), case(2, 3, 1, reverse=True),
            case(2, 2, 2, np.float32, grad=False), case(0, 2, 1, grad=False)]


register(OpDef(
    "lstm_layer",
    inputs=("proj", "h0", "c0", "w_hh"),
    outputs=("out", "c_n", "reserve"),
    attrs={"reverse": Attr("bool", False)},
    infer_meta=_lstm_layer_meta,
    kernel=_lstm_layer_kernel,
    grad=_lstm_layer_grad,
    saves=("proj", "h0", "c0", "w_hh", "reserve"),
    nondiff=("reserve",),
    sbp=_lstm_layer_sbp,
    reference=_lstm_layer_reference,
    samples=_lstm_layer_samples,
    doc="One LSTM layer and direction over a padded sequence: proj [T, B, 4H] (the input "
        "projection with both biases), h0, c0 [B, H], w_hh [4H, H] -> (out [T, B, H], c_n, "
        "reserve), the time loop inside the kernel.",
))


# -- lstm_layer_backward: (g_out, g_cn, reserve, w_hh) -> (d_proj, d_h0, d_c0, d_w_hh) -----
def _lstm_layer_backward_meta(g_out, g_cn, reserve, w_hh, reverse):
    name = "lstm_layer_backward"
    if g_out.ndim != 3 or w_hh.ndim != 2:
        raise op_error(name, f"arguments 'grad_out' and 'w_hh' must be 3-D and 2-D, got "
                             f"shapes {list(g_out.shape)} and {list(w_hh.shape)}")
    require_float(name, "grad_out", g_out)
    steps, batch, hs = g_out.shape
    want = (("grad_c_n", g_cn, (batch, hs)), ("reserve", reserve, (steps, batch, _RESERVE * hs)),
            ("w_hh", w_hh, (4 * hs, hs)))
    for arg, m, shape in want:
        if m.shape != shape:
            raise op_error(name, f"argument '{arg}' must have shape {list(shape)} (from "
                                 f"grad_out {list(g_out.shape)}), got {list(m.shape)}")
    _check_same_dtype(name, g_out, [(a, m) for a, m, _ in want])
    return (TensorMeta((steps, batch, 4 * hs), g_out.dtype), g_cn, g_cn, w_hh)


def _lstm_layer_backward_kernel(ctx, g_out, g_cn, reserve, w_hh, reverse):
    k, (g_out, dc, reserve, w) = _in_compute(ctx, (g_out, g_cn, reserve, w_hh))
    p = ctx.prims
    steps, batch, hs = ctx.in_metas[0].shape
    d_proj = p.empty((steps, batch, 4 * hs), k.dtype)
    dh = p.full((batch, hs), k.dtype, 0)
    for t in _time_steps(steps, not reverse):
        r, d, g_t = p.slice(reserve, (t,)), p.slice(d_proj, (t,)), p.slice(g_out, (t,))
        dc_prev = p.lstm_step_grad(g_t, dh, dc, r, d)  # one loop, where the device has it
        dc = _lstm_step_grad_composed(k, g_t, dh, dc, r, d, hs) if dc_prev is None else dc_prev
        dh = p.matmul(d, w)
    if not steps:
        dc = p.contiguous(dc)  # outputs never alias inputs
    # The weight gradient of every step at once: sum_t d_pre_t^T h_prev_t.
    rows = steps * batch
    h_prev = p.slice(reserve, (slice(None), slice(None), slice(0, hs)))
    d_w = p.matmul(p.permute(p.reshape(d_proj, (rows, 4 * hs)), (1, 0)),
                   p.reshape(p.contiguous(h_prev), (rows, hs)))
    return (_finish(ctx, d_proj, 0), _finish(ctx, dh, 1), _finish(ctx, dc, 2),
            _finish(ctx, d_w, 3))


def _lstm_step_grad_composed(k, g_t, dh, dc, r, d, hs):
    """lstm_step_grad from the other primitives: fills d (B, 4H), returns the new dc."""
    one = k.c(1.0)
    c_prev, tc = _cols(k, r, hs, hs), _cols(k, r, 2 * hs, hs)
    i, f, g, o = (_cols(k, r, (3 + j) * hs, hs) for j in range(4))
    gh = k.add(g_t, dh)
    dc = k.add(dc, k.mul(k.mul(gh, o), k.sub(one, k.mul(tc, tc))))
    k.to("mul", k.mul(dc, g), k.mul(i, k.sub(one, i)), _cols(k, d, 0, hs))
    k.to("mul", k.mul(dc, c_prev), k.mul(f, k.sub(one, f)), _cols(k, d, hs, hs))
    k.to("mul", k.mul(dc, i), k.sub(one, k.mul(g, g)), _cols(k, d, 2 * hs, hs))
    k.to("mul", k.mul(gh, tc), k.mul(o, k.sub(one, o)), _cols(k, d, 3 * hs, hs))
    return k.mul(dc, f)


def _lstm_layer_backward_sbp(g_out, g_cn, reserve, w_hh, reverse):
    sigs = [Signature((B,) * 4, (B,) * 4)]
    if g_out.shape[1] > 1:  # batch entries run independently; the weight gradient sums them
        sigs.append(Signature((Split(1), Split(0), Split(1), B),
                              (Split(1), Split(0), Split(0), P)))
    sigs.append(Signature((P, P, B, B), (P,) * 4))  # linear in the incoming gradients
    return sigs


def _lstm_layer_backward_reference(torch, g_out, g_cn, reserve, w_hh, reverse=False):
    """lstm_layer's gradient from its workspace, written out with torch ops."""
    steps, batch, hs = g_out.shape
    d_pre = [None] * steps
    dh, dc = None, g_cn
    d_w = torch.zeros_like(w_hh)
    for t in (range(steps) if reverse else reversed(range(steps))):
        hp, cp, tc, i, f, g, o = reserve[t].split(hs, 1)
        gh = g_out[t] if dh is None else g_out[t] + dh
        dc = dc + gh * o * (1 - tc * tc)
        d_pre[t] = torch.cat([dc * g * i * (1 - i), dc * cp * f * (1 - f), dc * i * (1 - g * g),
                              gh * tc * o * (1 - o)], 1)
        dc = dc * f
        dh = d_pre[t] @ w_hh
        d_w = d_w + d_pre[t].T @ hp
    if not steps:
        return (g_out.new_zeros(0, batch, 4 * hs), g_cn.new_zeros(batch, hs), g_cn.clone(),
                d_w)
    return torch.stack(d_pre), dh, dc, d_w


def _lstm_layer_backward_samples(rng):
    def case(steps, batch, hs, dtype=np.float64, **kw):
        return Sample(_rand(rng, steps, batch, hs, dtype=dtype),
                      _rand(rng, batch, hs, dtype=dtype),
                      _rand(rng, steps, batch, _RESERVE * hs, dtype=dtype),
                      _rand(rng, 4 * hs, hs, dtype=dtype), grad=False, **kw)

    return [case(3, 2, 2), case(2, 3, 1, np.float32, reverse=True)]


register(OpDef(
    "lstm_layer_backward",
    inputs=("grad_out", "grad_c_n", "reserve", "w_hh"),
    outputs=("grad_proj", "grad_h0", "grad_c0", "grad_w_hh"),
    attrs={"reverse": Attr("bool", False)},
    infer_meta=_lstm_layer_backward_meta,
    kernel=_lstm_layer_backward_kernel,
    sbp=_lstm_layer_backward_sbp,
    reference=_lstm_layer_backward_reference,
    samples=_lstm_layer_backward_samples,
    doc="lstm_layer's gradients from its workspace, the time loop run backwards in the "
        "kernel.",
))


# =========================================================================================
# gru_layer: one GRU layer in one direction over a whole padded sequence, in one op
# =========================================================================================
# As lstm_layer.  The hidden bias stays separate (n = tanh(gi_n + r (h W_hn^T + b_hn)) puts
# it under r).  Workspace per step: [h_prev | r z n (activated) | gh_n], hidden_size each.
_GRU_RESERVE = 5


def _gru_layer_meta(proj, h0, w_hh, b_hh, reverse):
    name = "gru_layer"
    if proj.ndim != 3:
        raise op_error(name, "argument 'proj' must be 3-D [seq_len, batch, 3 * hidden_size], "
                             f"got shape {list(proj.shape)}")
    require_float(name, "proj", proj)
    steps, batch, width = proj.shape
    if w_hh.ndim != 2 or w_hh.shape[0] != width or width != 3 * w_hh.shape[1]:
        raise op_error(name, f"argument 'w_hh' must have shape [3 * hidden_size, hidden_size] "
                             f"= {[width, width // 3]} (from proj's last axis {width}), got "
                             f"{list(w_hh.shape)}")
    hidden = w_hh.shape[1]
    for arg, m, shape in (("h0", h0, (batch, hidden)), ("b_hh", b_hh, (width,))):
        if m.shape != shape:
            raise op_error(name, f"argument '{arg}' must have shape {list(shape)}, got "
                                 f"{list(m.shape)}")
    _check_same_dtype(name, proj, (("h0", h0), ("w_hh", w_hh), ("b_hh", b_hh)))
    return (TensorMeta((steps, batch, hidden), proj.dtype),
            TensorMeta((steps, batch, _GRU_RESERVE * hidden), proj.dtype))


def _gru_layer_kernel(ctx, proj, h0, w_hh, b_hh, reverse):
    k, (proj, h, w, bias) = _in_compute(ctx, (proj, h0, w_hh, b_hh))
    p = ctx.prims
    steps, batch, _ = ctx.in_metas[0].shape
    hs = ctx.in_metas[2].shape[1]
    out = p.empty((steps, batch, hs), k.dtype)
    reserve = p.empty((steps, batch, _GRU_RESERVE * hs), k.dtype)
    wt = p.permute(w, (1, 0))
    for t in _time_steps(steps, reverse):
        r, h_out, proj_t = p.slice(reserve, (t,)), p.slice(out, (t,)), p.slice(proj, (t,))
        gh = k.add(p.matmul(h, wt), bias)
        if p.gru_step(proj_t, gh, h, r, h_out) is None:  # no loop on this device
            _gru_step_composed(k, proj_t, gh, h, r, h_out, hs)
        h = h_out
    return _finish(ctx, out, 0), _finish(ctx, reserve, 1)


def _gru_step_composed(k, proj_t, gh, h, r, h_out, hs):
    """gru_step from the other primitives."""
    p = k.p
    p.copy(_cols(k, r, 0, hs), h)
    p.copy(_cols(k, r, 4 * hs, hs), _cols(k, gh, 2 * hs, hs))
    k.u("sigmoid", k.add(_cols(k, proj_t, 0, 2 * hs), _cols(k, gh, 0, 2 * hs)),
        out=_cols(k, r, hs, 2 * hs))
    z = _cols(k, r, 2 * hs, hs)
    n = k.u("tanh", k.add(_cols(k, proj_t, 2 * hs, hs),
                          k.mul(_cols(k, r, hs, hs), _cols(k, gh, 2 * hs, hs))),
            out=_cols(k, r, 3 * hs, hs))
    k.to("add", n, k.mul(z, k.sub(h, n)), h_out)


def _gru_layer_grad(ctx, g_out, _g_reserve=None):
    need = ctx.needs_input_grad
    if differentiating():
        grads = _gru_layer_composed_grad(ctx, g_out)
    else:
        grads = op("gru_layer_backward", g_out, ctx.output(1), ctx.input(2),
                   reverse=ctx.attrs["reverse"])
    return tuple(g if n else None for g, n in zip(grads, need))


def _gru_layer_composed_grad(ctx, g_out):
    """For a double backward: the forward recomputed step by step with gru_cell, then its
    gradient with gru_cell_backward (differentiable)."""
    proj, h, w, bias = (ctx.input(j) for j in range(4))
    steps = ctx.in_metas[0].shape[0]
    order = list(_time_steps(steps, ctx.attrs["reverse"]))
    if not order:
        return proj * 0.0, h * 0.0, w * 0.0, bias * 0.0
    wt = op("transpose", w, dim0=0, dim1=1)
    gi, gh, h_prev = {}, {}, {}
    for t in order:
        h_prev[t], gi[t] = h, op("select", proj, dim=0, index=t)
        gh[t] = op("matmul", h, wt) + bias
        h = op("gru_cell", gi[t], gh[t], h)
    dh, d_w, d_b = None, None, None
    d_gi = [None] * steps
    for t in reversed(order):
        g = op("select", g_out, dim=0, index=t)
        g = g if dh is None else g + dh
        d_gi[t], d_gh, d_h = op("gru_cell_backward", g, gi[t], gh[t], h_prev[t])
        dh = d_h + op("matmul", d_gh, w)
        dw_t = op("matmul", op("transpose", d_gh, dim0=0, dim1=1), h_prev[t])
        db_t = op("sum", d_gh, dim=(0,))
        d_w, d_b = (dw_t, db_t) if d_w is None else (d_w + dw_t, d_b + db_t)
    return op("stack", d_gi, dim=0), dh, d_w, d_b


def _gru_layer_sbp(proj, h0, w_hh, b_hh, reverse):
    sigs = [Signature((B,) * 4, (B, B))]
    if proj.shape[1] > 1:
        sigs.append(Signature((Split(1), Split(0), B, B), (Split(1), Split(1))))
    return sigs


def _gru_layer_reference(torch, proj, h0, w_hh, b_hh, reverse=False):
    steps, batch = proj.shape[0], proj.shape[1]
    hs = w_hh.shape[1]
    outs, rows = [None] * steps, [None] * steps
    h = h0
    for t in (reversed(range(steps)) if reverse else range(steps)):
        gh = h @ w_hh.T + b_hh
        ir, iz, in_ = proj[t].chunk(3, 1)
        hr, hz, hn = gh.chunk(3, 1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        rows[t] = torch.cat([h, r, z, n, hn], 1)
        h = n + z * (h - n)
        outs[t] = h
    if not steps:
        return proj.new_zeros(0, batch, hs), proj.new_zeros(0, batch, _GRU_RESERVE * hs)
    return torch.stack(outs), torch.stack(rows).detach()


def _gru_layer_samples(rng):
    # Few and small: the global-ops check runs every SBP combination of the inputs.
    def case(steps, batch, hs, dtype=np.float64, **kw):
        return Sample(_rand(rng, steps, batch, 3 * hs, dtype=dtype),
                      _rand(rng, batch, hs, dtype=dtype), _rand(rng, 3 * hs, hs, dtype=dtype) * 0.5,
                      _rand(rng, 3 * hs, dtype=dtype), **kw)

    return [case(3, 2, 2), case(2, 3, 1, reverse=True),
            case(2, 2, 2, np.float32, grad=False), case(0, 2, 1, grad=False)]


register(OpDef(
    "gru_layer",
    inputs=("proj", "h0", "w_hh", "b_hh"),
    outputs=("out", "reserve"),
    attrs={"reverse": Attr("bool", False)},
    infer_meta=_gru_layer_meta,
    kernel=_gru_layer_kernel,
    grad=_gru_layer_grad,
    saves=("proj", "h0", "w_hh", "b_hh", "reserve"),
    nondiff=("reserve",),
    sbp=_gru_layer_sbp,
    reference=_gru_layer_reference,
    samples=_gru_layer_samples,
    doc="One GRU layer and direction over a padded sequence: proj [T, B, 3H] (the input "
        "projection with its bias), h0 [B, H], w_hh [3H, H], b_hh [3H] -> (out [T, B, H], "
        "reserve), the time loop inside the kernel.",
))


# -- gru_layer_backward: (g_out, reserve, w_hh) -> (d_proj, d_h0, d_w_hh, d_b_hh) -----------
def _gru_layer_backward_meta(g_out, reserve, w_hh, reverse):
    name = "gru_layer_backward"
    if g_out.ndim != 3:
        raise op_error(name, f"argument 'grad_out' must be 3-D, got shape {list(g_out.shape)}")
    require_float(name, "grad_out", g_out)
    steps, batch, hs = g_out.shape
    want = (("reserve", reserve, (steps, batch, _GRU_RESERVE * hs)),
            ("w_hh", w_hh, (3 * hs, hs)))
    for arg, m, shape in want:
        if m.shape != shape:
            raise op_error(name, f"argument '{arg}' must have shape {list(shape)} (from "
                                 f"grad_out {list(g_out.shape)}), got {list(m.shape)}")
    _check_same_dtype(name, g_out, [(a, m) for a, m, _ in want])
    return (TensorMeta((steps, batch, 3 * hs), g_out.dtype),
            TensorMeta((batch, hs), g_out.dtype), w_hh, TensorMeta((3 * hs,), g_out.dtype))


def _gru_layer_backward_kernel(ctx, g_out, reserve, w_hh, reverse):
    k, (g_out, reserve, w) = _in_compute(ctx, (g_out, reserve, w_hh))
    p = ctx.prims
    steps, batch, hs = ctx.in_metas[0].shape
    d_proj = p.empty((steps, batch, 3 * hs), k.dtype)
    d_ghs = p.empty((steps, batch, 3 * hs), k.dtype)
    dh = p.full((batch, hs), k.dtype, 0)
    for t in _time_steps(steps, not reverse):
        r, g_t = p.slice(reserve, (t,)), p.slice(g_out, (t,))
        d_gi, d_gh = p.slice(d_proj, (t,)), p.slice(d_ghs, (t,))
        part = p.gru_step_grad(g_t, dh, r, d_gi, d_gh)  # one loop, where the device has it
        if part is None:
            part = _gru_step_grad_composed(k, g_t, dh, r, d_gi, d_gh, hs)
        dh = k.add(part, p.matmul(d_gh, w))
    # Weight and bias gradients of every step at once.
    rows = steps * batch
    flat = p.reshape(d_ghs, (rows, 3 * hs))
    h_prev = p.slice(reserve, (slice(None), slice(None), slice(0, hs)))
    d_w = p.matmul(p.permute(flat, (1, 0)), p.reshape(p.contiguous(h_prev), (rows, hs)))
    d_b = p.reduce("sum", flat, (0,))
    return (_finish(ctx, d_proj, 0), _finish(ctx, dh, 1), _finish(ctx, d_w, 2),
            _finish(ctx, d_b, 3))


def _gru_step_grad_composed(k, g_t, dh, r, d_gi, d_gh, hs):
    """gru_step_grad from the other primitives: fills d_gi, d_gh, returns g z."""
    p, one = k.p, k.c(1.0)
    hp, rg, z, n, ghn = (_cols(k, r, j * hs, hs) for j in range(5))
    g = k.add(g_t, dh)
    dn = k.mul(k.mul(g, k.sub(one, z)), k.sub(one, k.mul(n, n)))
    dz = k.mul(k.mul(g, k.sub(hp, n)), k.mul(z, k.sub(one, z)))
    dr = k.mul(k.mul(dn, ghn), k.mul(rg, k.sub(one, rg)))
    for d in (d_gi, d_gh):
        p.copy(_cols(k, d, 0, hs), dr)
        p.copy(_cols(k, d, hs, hs), dz)
    p.copy(_cols(k, d_gi, 2 * hs, hs), dn)
    k.to("mul", dn, rg, _cols(k, d_gh, 2 * hs, hs))
    return k.mul(g, z)


def _gru_layer_backward_sbp(g_out, reserve, w_hh, reverse):
    sigs = [Signature((B,) * 3, (B,) * 4)]
    if g_out.shape[1] > 1:
        sigs.append(Signature((Split(1), Split(1), B), (Split(1), Split(0), P, P)))
    sigs.append(Signature((P, B, B), (P,) * 4))  # linear in the incoming gradient
    return sigs


def _gru_layer_backward_reference(torch, g_out, reserve, w_hh, reverse=False):
    """gru_layer's gradient from its workspace, written out with torch ops."""
    steps, batch, hs = g_out.shape
    d_gi = [None] * steps
    dh = g_out.new_zeros(batch, hs)
    d_w, d_b = torch.zeros_like(w_hh), g_out.new_zeros(3 * hs)
    for t in (range(steps) if reverse else reversed(range(steps))):
        hp, r, z, n, ghn = reserve[t].split(hs, 1)
        g = g_out[t] + dh
        dn = g * (1 - z) * (1 - n * n)
        dz = g * (hp - n) * z * (1 - z)
        dr = dn * ghn * r * (1 - r)
        d_gi[t] = torch.cat([dr, dz, dn], 1)
        d_gh = torch.cat([dr, dz, dn * r], 1)
        dh = g * z + d_gh @ w_hh
        d_w, d_b = d_w + d_gh.T @ hp, d_b + d_gh.sum(0)
    if not steps:
        return g_out.new_zeros(0, batch, 3 * hs), dh, d_w, d_b
    return torch.stack(d_gi), dh, d_w, d_b


def _gru_layer_backward_samples(rng):
    def case(steps, batch, hs, dtype=np.float64, **kw):
        return Sample(_rand(rng, steps, batch, hs, dtype=dtype),
                      _rand(rng, steps, batch, _GRU_RESERVE * hs, dtype=dtype),
                      _rand(rng, 3 * hs, hs, dtype=dtype), grad=False, **kw)

    return [case(3, 2, 2), case(2, 3, 1, np.float32, reverse=True)]


register(OpDef(
    "gru_layer_backward",
    inputs=("grad_out", "reserve", "w_hh"),
    outputs=("grad_proj", "grad_h0", "grad_w_hh", "grad_b_hh"),
    attrs={"reverse": Attr("bool", False)},
    infer_meta=_gru_layer_backward_meta,
    kernel=_gru_layer_backward_kernel,
    sbp=_gru_layer_backward_sbp,
    reference=_gru_layer_backward_reference,
    samples=_gru_layer_backward_samples,
    doc="gru_layer's gradients from its workspace, the time loop run backwards in the kernel.",
))
