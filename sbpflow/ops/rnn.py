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
from ..sbp import B, Signature, Split
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
    """c = f c_prev + i g, h = o tanh(c): dc = gc + gh o (1 - tanh(c)^2), then each gate's
    pre-activation gradient through its sigmoid or tanh."""
    h = ctx.in_metas[1].shape[1]
    gates = ctx.input(0)
    i, f, o = (op("sigmoid", op("narrow", gates, dim=1, start=s * h, length=h))
               for s in (0, 1, 3))
    g = op("tanh", op("narrow", gates, dim=1, start=2 * h, length=h))
    tc = op("tanh", ctx.output(1))
    dc = gc + gh * o * (1 - tc * tc)
    d_gates = d_c_prev = None
    if ctx.needs_input_grad[0]:
        di = dc * g * i * (1 - i)
        df = dc * ctx.input(1) * f * (1 - f)
        dg = dc * i * (1 - g * g)
        do = gh * tc * o * (1 - o)
        d_gates = op("cat", [di, df, dg, do], dim=1)
    if ctx.needs_input_grad[1]:
        d_c_prev = dc * f
    return d_gates, d_c_prev


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
    saves=("gates", "c_prev", "c"),
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
    """r, z = sigmoid(gi_rz + gh_rz), n = tanh(gi_n + r gh_n), h = n + z (h_prev - n)."""
    h = ctx.in_metas[2].shape[1]
    gi, gh, h_prev = ctx.input(0), ctx.input(1), ctx.input(2)

    def blk(x, s):
        return op("narrow", x, dim=1, start=s * h, length=h)

    r = op("sigmoid", blk(gi, 0) + blk(gh, 0))
    z = op("sigmoid", blk(gi, 1) + blk(gh, 1))
    gh_n = blk(gh, 2)
    n = op("tanh", blk(gi, 2) + r * gh_n)
    dn = g * (1 - z) * (1 - n * n)  # through the tanh: grad of n's pre-activation
    dz = g * (h_prev - n) * z * (1 - z)
    dr = dn * gh_n * r * (1 - r)
    d_gi = d_gh = d_h = None
    if ctx.needs_input_grad[0]:
        d_gi = op("cat", [dr, dz, dn], dim=1)
    if ctx.needs_input_grad[1]:
        d_gh = op("cat", [dr, dz, dn * r], dim=1)
    if ctx.needs_input_grad[2]:
        d_h = g * z
    return d_gi, d_gh, d_h


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
        Sample(_rand(rng, 4, 3), _rand(rng, 4, 3), _rand(rng, 4, 1)),
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
