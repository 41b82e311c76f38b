"""Recurrent modules: RNN, LSTM, GRU and their cells (torch.nn.modules.rnn).

Parameter names, shapes, gate order and initialisation are torch's, so state dicts interchange.
A layer computes the input projection of all time steps with one `linear`.  A GRU layer, or
an LSTM layer without `proj_size`, over a padded sequence then runs as one `gru_layer` /
`lstm_layer` op (the time loop in its kernel, and one backward op).  Otherwise (packed
sequences, proj_size, the Elman RNN) the module loops over time steps: each step is
the hidden projection (`linear`), an add and one fused cell op (`lstm_cell`, `gru_cell`, or
tanh/relu for the Elman RNN).  A PackedSequence runs the same loop
on the rows of each step; a sequence that has ended keeps its state, so the final hidden state
of each sequence is the one at its own length, as in torch.
"""

from __future__ import annotations

import math
import numbers
import warnings

from ...framework.functional import creation
from ...framework.functional import shape as S
from ...framework.functional._base import call
from ...framework.parameter import Parameter
from .. import functional as F
from .. import init
from ..utils.rnn import PackedSequence
from .module import Module

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _check_int(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} should be of type int, got: {type(v).__name__}")


def _step(mode, x_t, h, c, w_hh, b_hh, w_hr):
    """One time step of one layer and direction: x_t is the input projection of the step
    (bias included).  Returns (h, c)."""
    if mode == "GRU":
        return call("gru_cell", x_t, F.linear(h, w_hh, b_hh), h), None
    pre = x_t + F.linear(h, w_hh, b_hh)
    if mode == "LSTM":
        h, c = call("lstm_cell", pre, c)
        if w_hr is not None:
            h = F.linear(h, w_hr)
        return h, c
    return (pre.tanh() if mode == "RNN_TANH" else pre.relu()), None


def _run_direction(mode, proj, h, c, weights, reverse, sizes):
    """Run one layer in one direction over the projected input `proj`: [T, B, G] padded, or
    [N, G] packed with `sizes` the batch size of each step.  Returns (outputs, h, c)."""
    _, w_hh, _, b_hh, w_hr = weights
    steps = proj.shape[0] if sizes is None else len(sizes)
    starts = None
    if sizes is not None:
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
    batch = h.shape[0]
    outs = [None] * steps
    # The gradient of each step's slice of `proj` is a zero-padded tensor of proj's size;
    # slicing in two levels (blocks of about sqrt(T) steps, then the step within its block)
    # makes summing them O(T^1.5) instead of O(T^2) in the sequence length.
    span = max(1, math.isqrt(steps))
    blocks = {}
    for t in (reversed(range(steps)) if reverse else range(steps)):
        b0 = t - t % span
        if b0 not in blocks:
            b1 = min(b0 + span, steps)
            if sizes is None:
                blocks[b0] = S.narrow(proj, 0, b0, b1 - b0)
            else:
                end = starts[b1 - 1] + sizes[b1 - 1]
                blocks[b0] = S.narrow(proj, 0, starts[b0], end - starts[b0])
        if sizes is None:
            x_t, n = S.select(blocks[b0], 0, t - b0), batch
        else:
            n = sizes[t]
            x_t = S.narrow(blocks[b0], 0, starts[t] - starts[b0], n)
        if n == batch:
            h, c = _step(mode, x_t, h, c, w_hh, b_hh, w_hr)
            outs[t] = h
            continue
        # Packed: rows n.. have ended (forward) or not started (reverse); they keep their state.
        h_t, c_t = _step(mode, x_t, S.narrow(h, 0, 0, n),
                         None if c is None else S.narrow(c, 0, 0, n), w_hh, b_hh, w_hr)
        outs[t] = h_t
        h = S.cat([h_t, S.narrow(h, 0, n, batch - n)], 0)
        if c is not None:
            c = S.cat([c_t, S.narrow(c, 0, n, batch - n)], 0)
    out = S.stack(outs, 0) if sizes is None else S.cat(outs, 0)
    return out, h, c


def _lstm_layer(x, h, c, weights, reverse):
    """A padded sequence through one LSTM layer and direction without a projection: one
    `lstm_layer` op runs the time loop (both biases go into the input projection)."""
    w_ih, w_hh, b_ih, b_hh, _ = weights
    bias = b_ih if b_hh is None else b_hh if b_ih is None else b_ih + b_hh
    out, c, _ = call("lstm_layer", F.linear(x, w_ih, bias), h, c, w_hh, reverse=reverse)
    return out, S.select(out, 0, 0 if reverse else -1), c


def _gru_layer(x, h, weights, reverse):
    """A padded sequence through one GRU layer and direction: one `gru_layer` op."""
    w_ih, w_hh, b_ih, b_hh, _ = weights
    if b_hh is None:  # bias=False: the op takes a hidden bias; zeros change nothing
        b_hh = creation.zeros(w_hh.shape[0], dtype=w_hh.dtype, device=h._where())
    out, _ = call("gru_layer", F.linear(x, w_ih, b_ih), h, w_hh, b_hh, reverse=reverse)
    return out, S.select(out, 0, 0 if reverse else -1)


def _permute(hx, index):
    return hx if index is None else hx.index_select(1, index)


class RNNBase(Module):
    """The shared body of RNN, LSTM and GRU (torch.nn.RNNBase)."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None, dtype=None):
        super().__init__()
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        if not isinstance(bias, bool):
            raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first should be of type bool, got: "
                            f"{type(batch_first).__name__}")
        _check_int("input_size", input_size)
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        _check_int("hidden_size", hidden_size)
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        directions = 2 if bidirectional else 1
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else real_hidden * directions
                shapes = [("weight_ih_l{}{}", (gate_size, layer_input)),
                          ("weight_hh_l{}{}", (gate_size, real_hidden))]
                if bias:
                    shapes += [("bias_ih_l{}{}", (gate_size,)), ("bias_hh_l{}{}", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr_l{}{}", (proj_size, hidden_size))]
                suffix = "_reverse" if direction == 1 else ""
                names = []
                for fmt, shape in shapes:
                    name = fmt.format(layer, suffix)
                    setattr(self, name, Parameter(creation.empty(*shape, dtype=dtype,
                                                                 device=device)))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """cuDNN packs the weights into one buffer; there is no such buffer here."""

    @property
    def _flat_weights(self):
        return [getattr(self, n, None) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # -- checks (torch's messages) ---------------------------------------------------------
    def check_input(self, input, batch_sizes) -> None:
        w = self._flat_weights[0]
        if input.dtype != w.dtype:
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype "
                             f"({w.dtype}). Convert input: input.to({w.dtype}), or convert "
                             f"model: model.to({input.dtype})")
        expected = 2 if batch_sizes is not None else 3
        if input.dim() != expected:
            raise RuntimeError(f"input must have {expected} dimensions, got {input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.size(-1)}")

    def get_expected_hidden_size(self, input, batch_sizes) -> tuple[int, int, int]:
        if batch_sizes is not None:
            mini_batch = int(batch_sizes[0])
        else:
            mini_batch = input.size(0) if self.batch_first else input.size(1)
        directions = 2 if self.bidirectional else 1
        size = self.proj_size if self.proj_size > 0 else self.hidden_size
        return (self.num_layers * directions, mini_batch, size)

    def check_hidden_size(self, hx, expected_hidden_size,
                          msg: str = "Expected hidden size {}, got {}") -> None:
        if tuple(hx.size()) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(tuple(expected_hidden_size), list(hx.size())))

    def check_forward_args(self, input, hidden, batch_sizes) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    def permute_hidden(self, hx, permutation):
        return _permute(hx, permutation)

    # -- the shared forward ----------------------------------------------------------------
    def _prepare(self, input, hx):
        """Unpack, unsqueeze unbatched input, check, and sort hx for a PackedSequence.
        Returns (x, hx, sizes, sorted_indices, unsorted_indices, is_batched)."""
        name = {"LSTM": "LSTM", "GRU": "GRU"}.get(self.mode, "RNN")
        lstm = self.mode == "LSTM"
        if isinstance(input, PackedSequence):
            x, batch_sizes, sorted_i, unsorted_i = input
            sizes = [int(n) for n in batch_sizes.tolist()]
            self.check_input(x, batch_sizes)
            if hx is not None:
                self._check_hx(x, hx, batch_sizes)
                hx = tuple(_permute(h, sorted_i) for h in hx) if lstm else _permute(hx, sorted_i)
            return x, hx, sizes, sorted_i, unsorted_i, True
        if input.dim() not in (2, 3):
            got = f"{input.dim()}D" + (" tensor" if name == "RNN" else "")
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {got} instead")
        batched = input.dim() == 3
        if not batched:
            input = input.unsqueeze(0 if self.batch_first else 1)
        if hx is not None:
            dims = [h.dim() for h in hx] if lstm else [hx.dim()]
            want = 3 if batched else 2
            if any(d != want for d in dims):
                kind = "batched 3-D" if batched else "unbatched 2-D"
                if lstm:
                    raise RuntimeError(f"For {kind} input, hx and cx should also be {want}-D "
                                       f"but got ({dims[0]}-D, {dims[1]}-D) tensors")
                raise RuntimeError(f"For {kind} input, hx should also be {want}-D but got "
                                   f"{dims[0]}-D tensor")
            if not batched:
                hx = tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
        self.check_input(input, None)
        if hx is not None:
            self._check_hx(input, hx, None)
        x = S.transpose(input, 0, 1) if self.batch_first else input
        return x, hx, None, None, None, batched

    def _check_hx(self, x, hx, batch_sizes):
        expected = self.get_expected_hidden_size(x, batch_sizes)
        if self.mode != "LSTM":
            self.check_hidden_size(hx, expected)
            return
        self.check_hidden_size(hx[0], expected, "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hx[1], (expected[0], expected[1], self.hidden_size),
                               "Expected hidden[1] size {}, got {}")

    def _layers(self, x, h0, c0, sizes):
        """All layers and directions.  x: [T, B, F] (sizes None) or packed rows [N, F]."""
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                names = self._all_weights[k]
                w = dict(zip((n.split("_l")[0] for n in names), (getattr(self, n) for n in names)))
                weights = (w["weight_ih"], w["weight_hh"], w.get("bias_ih"), w.get("bias_hh"),
                           w.get("weight_hr"))
                h = S.select(h0, 0, k)
                c = None if c0 is None else S.select(c0, 0, k)
                if self.mode == "LSTM" and self.proj_size == 0 and sizes is None:
                    out, h, c = _lstm_layer(x, h, c, weights, d == 1)
                elif self.mode == "GRU" and sizes is None:
                    out, h = _gru_layer(x, h, weights, d == 1)
                else:
                    proj = F.linear(x, weights[0], weights[2])
                    out, h, c = _run_direction(self.mode, proj, h, c, weights, d == 1, sizes)
                outs.append(out)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else S.cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        return x, S.stack(h_n, 0), (None if c0 is None else S.stack(c_n, 0))

    def _forward(self, input, hx):
        x, hx, sizes, sorted_i, unsorted_i, batched = self._prepare(input, hx)
        lstm = self.mode == "LSTM"
        batch = x.shape[1] if sizes is None else sizes[0]
        directions = 2 if self.bidirectional else 1
        if hx is None:
            size = self.proj_size if self.proj_size > 0 else self.hidden_size
            where = x._where()
            h0 = creation.zeros(self.num_layers * directions, batch, size, dtype=x.dtype,
                                device=where)
            c0 = (creation.zeros(self.num_layers * directions, batch, self.hidden_size,
                                 dtype=x.dtype, device=where) if lstm else None)
        else:
            h0, c0 = hx if lstm else (hx, None)
        out, h_n, c_n = self._layers(x, h0, c0, sizes)
        if sizes is not None:
            out = PackedSequence(out, input.batch_sizes, sorted_i, unsorted_i)
            h_n = _permute(h_n, unsorted_i)
            c_n = None if c_n is None else _permute(c_n, unsorted_i)
        else:
            if self.batch_first:
                out = S.transpose(out, 0, 1)
            if not batched:
                out = out.squeeze(0 if self.batch_first else 1)
                h_n = h_n.squeeze(1)
                c_n = None if c_n is None else c_n.squeeze(1)
        return out, ((h_n, c_n) if lstm else h_n)

    def forward(self, input, hx=None):
        return self._forward(input, hx)


class RNN(RNNBase):
    """Elman RNN with tanh or ReLU: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' "
                             f"or 'relu'.")
        super().__init__(mode, *args, **kwargs)


class LSTM(RNNBase):
    """Long short-term memory, gates (i, f, g, o); proj_size > 0 projects h (LSTMP)."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    def get_expected_cell_size(self, input, batch_sizes) -> tuple[int, int, int]:
        n, b, _ = self.get_expected_hidden_size(input, batch_sizes)
        return (n, b, self.hidden_size)

    def permute_hidden(self, hx, permutation):
        return tuple(_permute(h, permutation) for h in hx)


class GRU(RNNBase):
    """Gated recurrent unit, gates (r, z, n) with n = tanh(W_in x + b_in + r (W_hn h + b_hn))."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)


# =========================================================================================
# Cells
# =========================================================================================
class RNNCellBase(Module):
    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(creation.empty(num_chunks * hidden_size, input_size,
                                                  dtype=dtype, device=device))
        self.weight_hh = Parameter(creation.empty(num_chunks * hidden_size, hidden_size,
                                                  dtype=dtype, device=device))
        if bias:
            self.bias_ih = Parameter(creation.empty(num_chunks * hidden_size, dtype=dtype,
                                                    device=device))
            self.bias_hh = Parameter(creation.empty(num_chunks * hidden_size, dtype=dtype,
                                                    device=device))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"
        return s

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    @staticmethod
    def _check_dims(name, input, named_hx) -> bool:
        """torch's dimension checks (input, then each hidden state); True when batched."""
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D "
                             f"instead")
        for label, h in named_hx or ():
            if h.dim() not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {h.dim()}D "
                                 f"instead")
        return input.dim() == 2

    def _check_forward(self, input, hxs) -> None:
        """ATen's cell checks, on the batched (unsqueezed) input and hidden states."""
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} "
                               f"expected {self.input_size}")
        for k, h in enumerate(hxs):
            if input.size(0) != h.size(0):
                raise RuntimeError(f"Input batch size {input.size(0)} doesn't match hidden{k} "
                                   f"batch size {h.size(0)}")
            if h.size(1) != self.hidden_size:
                raise RuntimeError(f"hidden{k} has inconsistent hidden_size: got {h.size(1)}, "
                                   f"expected {self.hidden_size}")

    def _zeros(self, x):
        return creation.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x._where())

    def _step(self, mode, x, h, c):
        proj = F.linear(x, self.weight_ih, self.bias_ih)
        return _step(mode, proj, h, c, self.weight_hh, self.bias_hh, None)


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device,
                         dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        batched = self._check_dims("RNNCell", input, None if hx is None else [("hidden", hx)])
        if not batched:
            input = input.unsqueeze(0)
        hx = self._zeros(input) if hx is None else (hx if batched else hx.unsqueeze(0))
        self._check_forward(input, (hx,))
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        h, _ = self._step(mode, input, hx, None)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device,
                         dtype=dtype)

    def forward(self, input, hx=None):
        named = None if hx is None else [(f"hx[{i}]", v) for i, v in enumerate(hx)]
        batched = self._check_dims("LSTMCell", input, named)
        if not batched:
            input = input.unsqueeze(0)
        if hx is None:
            zeros = self._zeros(input)
            hx = (zeros, zeros)
        elif not batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        self._check_forward(input, hx)
        h, c = self._step("LSTM", input, hx[0], hx[1])
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device,
                         dtype=dtype)

    def forward(self, input, hx=None):
        batched = self._check_dims("GRUCell", input, None if hx is None else [("hidden", hx)])
        if not batched:
            input = input.unsqueeze(0)
        hx = self._zeros(input) if hx is None else (hx if batched else hx.unsqueeze(0))
        self._check_forward(input, (hx,))
        h, _ = self._step("GRU", input, hx, None)
        return h if batched else h.squeeze(0)
