"""Activation modules (torch.nn.modules.activation), MultiheadAttention included."""

from __future__ import annotations

import math
import warnings

import numpy as np

from ...autograd.grad_mode import is_grad_enabled
from ...framework.functional import creation, shape
from ...framework.parameter import Parameter
from .. import functional as F
from .. import init
from .linear import NonDynamicallyQuantizableLinear
from .module import Module

__all__ = [
    "Threshold", "ReLU", "RReLU", "Hardtanh", "ReLU6", "Sigmoid", "Hardsigmoid", "Tanh", "SiLU",
    "Mish", "Hardswish", "ELU", "CELU", "SELU", "GLU", "GELU", "Hardshrink", "LeakyReLU",
    "LogSigmoid", "Softplus", "Softshrink", "MultiheadAttention", "PReLU", "Softsign",
    "Tanhshrink", "Softmin", "Softmax", "Softmax2d", "LogSoftmax",
]


def _inplace_str(inplace: bool) -> str:
    return ", inplace=True" if inplace else ""


class _Inplaceable(Module):
    """An activation whose only argument is `inplace`; prints it only when set."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Threshold(Module):
    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__()
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}{_inplace_str(self.inplace)}"


class ReLU(_Inplaceable):
    def forward(self, input):
        return F.relu(input, inplace=self.inplace)


class RReLU(Module):
    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__()
        self.lower = lower
        self.upper = upper
        self.inplace = inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"lower={self.lower}, upper={self.upper}{_inplace_str(self.inplace)}"


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False,
                 min_value: float | None = None, max_value: float | None = None):
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument `min_value` is deprecated and renamed to `min_val`",
                          FutureWarning, stacklevel=2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument `max_value` is deprecated and renamed to `max_val`",
                          FutureWarning, stacklevel=2)
            max_val = max_value
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise AssertionError(f"max_val ({self.max_val}) must be greater than min_val "
                                 f"({self.min_val})")

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_str(self.inplace)}"


class ReLU6(Hardtanh):
    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class Hardsigmoid(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.hardsigmoid(input, self.inplace)


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class SiLU(_Inplaceable):
    def forward(self, input):
        return F.silu(input, inplace=self.inplace)


class Mish(_Inplaceable):
    def forward(self, input):
        return F.mish(input, inplace=self.inplace)


class Hardswish(Module):
    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.hardswish(input, self.inplace)


class ELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_str(self.inplace)}"


class CELU(Module):
    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_str(self.inplace)}"


class SELU(_Inplaceable):
    def forward(self, input):
        return F.selu(input, self.inplace)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Hardshrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.hardshrink(input, self.lambd)

    def extra_repr(self) -> str:
        return f"{self.lambd}"


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{_inplace_str(self.inplace)}"


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = beta
        self.threshold = threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Softshrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def forward(self, input):
        return F.softshrink(input, self.lambd)

    def extra_repr(self) -> str:
        return str(self.lambd)


class PReLU(Module):
    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(creation.empty(num_parameters, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Softsign(Module):
    def forward(self, input):
        return F.softsign(input)


class Tanhshrink(Module):
    def forward(self, input):
        return F.tanhshrink(input)


class _DimModule(Module):
    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(_DimModule):
    def forward(self, input):
        return F.softmin(input, self.dim, _stacklevel=5)


class Softmax(_DimModule):
    def forward(self, input):
        return F.softmax(input, self.dim, _stacklevel=5)


class Softmax2d(Module):
    def forward(self, input):
        if input.dim() not in (3, 4):
            raise ValueError(f"Softmax2d: expected input to be 3D or 4D, got {input.dim()}D "
                             "instead")
        return F.softmax(input, -3, _stacklevel=5)


class LogSoftmax(_DimModule):
    def forward(self, input):
        return F.log_softmax(input, self.dim, _stacklevel=5)


# =========================================================================================
# MultiheadAttention (torch keeps it in activation.py, so its module path is this file)
# =========================================================================================
class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: same constructor, parameter names and layouts (state dicts
    interchange), masks, flags and outputs.

    Computed batch-major inside, (N, h, L, d): every reshape splits or merges axes after the
    batch axis, so a global batch split S(0) survives the whole block without boxing."""

    __constants__ = ["batch_first"]

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim=None, vdim=None, batch_first: bool = False, device=None, dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim="
                             f"{embed_dim} and num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")

        def empty(*shape):
            return Parameter(creation.empty(*shape, dtype=dtype))

        if not self._qkv_same_embed_dim:
            self.q_proj_weight = empty(embed_dim, embed_dim)
            self.k_proj_weight = empty(embed_dim, self.kdim)
            self.v_proj_weight = empty(embed_dim, self.vdim)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = empty(3 * embed_dim, embed_dim)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = empty(3 * embed_dim)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        dtype=dtype)
        if add_bias_kv:
            self.bias_k = empty(1, 1, embed_dim)
            self.bias_v = empty(1, 1, embed_dim)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        if self._fused_inference(query, key, value, attn_mask, key_padding_mask):
            # torch's fused kernel: the masks as given (no causal hint), NaN for a query that
            # may attend to no key
            return self._attend(query, key, value, key_padding_mask, need_weights, attn_mask,
                                average_attn_weights, False, zero_dead_rows=False)
        return self._attend(query, key, value, key_padding_mask, need_weights, attn_mask,
                            average_attn_weights, is_causal, zero_dead_rows=not need_weights)

    def _fused_inference(self, query, key, value, attn_mask, key_padding_mask) -> bool:
        """Where torch runs this module with its fused kernel (_native_multi_head_attention):
        its conditions (self-attention in evaluation, without gradients, bool masks...)."""
        if any(m is not None and m.dtype.is_floating_point
               for m in (attn_mask, key_padding_mask)):
            return False
        w, b = self.in_proj_weight, self.in_proj_bias
        if (query.dim() != 3 or query is not key or key is not value or w is None
                or b is None or query.dtype != b.dtype or query.dtype != w.dtype
                or self.training or self.num_heads % 2 or not self.batch_first
                or self.bias_k is not None or self.bias_v is not None or self.add_zero_attn
                or not self._qkv_same_embed_dim):
            return False
        return not (is_grad_enabled() and any(
            t is not None and t.requires_grad
            for t in (query, w, b, self.out_proj.weight, self.out_proj.bias)))

    def _attend(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights, is_causal, zero_dead_rows: bool):
        """forward; `zero_dead_rows`: a query whose every key is masked gets zeros (torch's
        scaled_dot_product_attention) rather than NaN (its explicit softmax, and the fused
        encoder-layer kernel of its inference path)."""
        batched = _mha_shape_check(query, key, value, key_padding_mask, attn_mask,
                                   self.num_heads)
        key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask",
                                          _none_or_dtype(attn_mask), "attn_mask", query.dtype)
        attn_mask = canonical_mask(attn_mask, "attn_mask", None, "", query.dtype)
        for name, m in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
            if m is not None and m.dtype != query.dtype:  # torch fails in its kernels
                raise RuntimeError(f"MultiheadAttention: expected {name} to be bool or of the "
                                   f"query's dtype {query.dtype}, but got {m.dtype}")
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                               "Transformer module method `generate_square_subsequent_mask` "
                               "to create this mask.")
        # torch trusts the hint where it may (no padding mask, no weights wanted): the mask
        # given is then replaced by the causal one.
        causal = is_causal and key_padding_mask is None and not need_weights

        # -> batch-major (N, L, E)
        if not batched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        bsz, tgt_len, e = query.shape
        src_len = key.shape[1]
        h, d = self.num_heads, self.head_dim
        if e != self.embed_dim:
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but "
                                 f"got {e}")
        if self._qkv_same_embed_dim:
            if tuple(key.shape) != tuple(value.shape):
                raise AssertionError(f"key shape {_seq_first(key)} does not match value shape "
                                     f"{_seq_first(value)}")
            wq, wk, wv = self.in_proj_weight.chunk(3)
        else:
            if tuple(key.shape[:2]) != tuple(value.shape[:2]):
                raise AssertionError(f"key's sequence and batch dims {_seq_first(key)[:2]} do "
                                     f"not match value's {_seq_first(value)[:2]}")
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        q = F.linear(query, wq, bq)
        k = F.linear(key, wk, bk)
        v = F.linear(value, wv, bv)

        if causal:
            attn_mask = None
        elif attn_mask is not None:
            _check_attn_mask(attn_mask, bsz * h, tgt_len, src_len)
            if attn_mask.dim() == 3:  # (N*h, L, S), batch-major like torch's heads
                attn_mask = attn_mask.reshape(bsz, h, tgt_len, src_len)
        if self.bias_k is not None and self.bias_v is not None:
            # one more key and value, the learnt biases, that every query may attend to
            k = _cat1(k, self.bias_k.expand(bsz, 1, e))
            v = _cat1(v, self.bias_v.expand(bsz, 1, e))
            attn_mask = _pad_last(attn_mask)
            key_padding_mask = _pad_last(key_padding_mask)
        elif self.bias_k is not None or self.bias_v is not None:
            raise AssertionError("bias_k is set but bias_v is None" if self.bias_k is not None
                                 else "bias_v is set but bias_k is None")

        # (N, L, E) -> (N, L, h, d) -> (N, h, L, d)
        q = q.reshape(bsz, tgt_len, h, d).transpose(1, 2)
        k = k.reshape(bsz, k.shape[1], h, d).transpose(1, 2)
        v = v.reshape(bsz, v.shape[1], h, d).transpose(1, 2)
        if self.add_zero_attn:  # and one more of zeros
            k = F.pad(k, (0, 0, 0, 1))
            v = F.pad(v, (0, 0, 0, 1))
            attn_mask = _pad_last(attn_mask)
            key_padding_mask = _pad_last(key_padding_mask)
        src_len = k.shape[2]

        mask = attn_mask
        if causal:
            mask = _causal_mask(tgt_len, src_len, q)
        if key_padding_mask is not None:
            if key_padding_mask.shape[0] != bsz:
                raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                                     f"{key_padding_mask.shape[0]}")
            if key_padding_mask.shape[1] != src_len:
                raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but "
                                     f"got {key_padding_mask.shape[1]}")
            kp = key_padding_mask.reshape(bsz, 1, 1, src_len)
            mask = kp if mask is None else mask + kp

        scores = (q * math.sqrt(1.0 / d)) @ k.transpose(-2, -1)  # (N, h, L, S)
        dead = None
        if mask is not None:
            if zero_dead_rows:
                # Found on the (small) mask: the scores themselves are finite.
                dead = (mask == float("-inf")).all(dim=-1, keepdim=True)
                mask = mask.masked_fill(dead, 0.0)
            scores = scores + mask
        attn = F.softmax(scores, dim=-1)
        if self.dropout > 0.0 and self.training:
            attn = F.dropout(attn, self.dropout)
        out = attn @ v  # (N, h, L, d)
        if dead is not None:  # zeroed here, not on attn: d values a row instead of S
            out = out.masked_fill(dead, 0.0)
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, tgt_len, e))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = attn.mean(dim=1) if average_attn_weights else attn
        if not batched:
            weights = weights.squeeze(0)
        return out, weights

    def merge_masks(self, attn_mask, key_padding_mask, query):
        """torch's helper: one mask of shape (N, num_heads, L, L) from a self-attention's masks
        (attn_mask 2-D or 3-D, key_padding_mask (N, L)) and the mask type: 1 padding only,
        2 any attention mask, None without masks. `query` is batch-major (N, L, E)."""
        mask_type = None
        merged = None
        if key_padding_mask is not None:
            mask_type = 1
            merged = key_padding_mask
        if attn_mask is not None:
            batch_size, seq_len, _ = query.shape
            mask_type = 2
            if attn_mask.dim() == 3:
                expanded = attn_mask.reshape(batch_size, -1, seq_len, seq_len)
            else:
                expanded = attn_mask.reshape(1, 1, seq_len, seq_len).expand(
                    batch_size, self.num_heads, seq_len, seq_len)
            merged = expanded
            if key_padding_mask is not None:
                merged = expanded + key_padding_mask.reshape(batch_size, 1, 1, seq_len).expand(
                    batch_size, self.num_heads, 1, seq_len)
        return merged, mask_type


def _mha_shape_check(query, key, value, key_padding_mask, attn_mask, num_heads) -> bool:
    """torch's checks of the inputs' ranks; True for a batched (3-D) query."""
    if query.dim() == 3:
        if key.dim() != 3 or value.dim() != 3:
            raise AssertionError("For batched (3-D) `query`, expected `key` and `value` to be "
                                 f"3-D but found {key.dim()}-D and {value.dim()}-D tensors "
                                 "respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 2:
            raise AssertionError("For batched (3-D) `query`, expected `key_padding_mask` to be "
                                 f"`None` or 2-D but found {key_padding_mask.dim()}-D tensor "
                                 "instead")
        if attn_mask is not None and attn_mask.dim() not in (2, 3):
            raise AssertionError("For batched (3-D) `query`, expected `attn_mask` to be `None`, "
                                 f"2-D or 3-D but found {attn_mask.dim()}-D tensor instead")
        return True
    if query.dim() == 2:
        if key.dim() != 2 or value.dim() != 2:
            raise AssertionError("For unbatched (2-D) `query`, expected `key` and `value` to "
                                 f"be 2-D but found {key.dim()}-D and {value.dim()}-D tensors "
                                 "respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 1:
            raise AssertionError("For unbatched (2-D) `query`, expected `key_padding_mask` to "
                                 f"be `None` or 1-D but found {key_padding_mask.dim()}-D tensor "
                                 "instead")
        if attn_mask is not None:
            if attn_mask.dim() not in (2, 3):
                raise AssertionError("For unbatched (2-D) `query`, expected `attn_mask` to be "
                                     f"`None`, 2-D or 3-D but found {attn_mask.dim()}-D tensor "
                                     "instead")
            if attn_mask.dim() == 3:
                expected = (num_heads, query.shape[0], key.shape[0])
                if tuple(attn_mask.shape) != expected:
                    raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got "
                                         f"{attn_mask.shape}")
        return False
    raise AssertionError("query should be unbatched 2D or batched 3D tensor but received "
                         f"{query.dim()}-D query tensor")


def _check_attn_mask(attn_mask, n_heads_total: int, tgt_len: int, src_len: int) -> None:
    if attn_mask.dim() == 2:
        want = (tgt_len, src_len)
        if tuple(attn_mask.shape) != want:
            raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should "
                               f"be {want}.")
    elif attn_mask.dim() == 3:
        want = (n_heads_total, tgt_len, src_len)
        if tuple(attn_mask.shape) != want:
            raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should "
                               f"be {want}.")
    else:
        raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")


def _seq_first(t) -> tuple:
    """A batch-major (N, S, E) shape as torch reports it, sequence first."""
    s = tuple(t.shape)
    return type(t.shape)((s[1], s[0]) + s[2:])


def _cat1(a, b):
    return shape.cat([a, b], dim=1)


def _pad_last(mask):
    """A mask gets one more (unmasked) key: a zero column on the right."""
    return None if mask is None else F.pad(mask, (0, 1))


def _causal_mask(tgt_len: int, src_len: int, like):
    """-inf above the diagonal, made where `like` lives (a global input gets it broadcast)."""
    upper = np.triu(np.ones((tgt_len, src_len), dtype=bool), 1)
    return _bool_to_additive(creation.tensor(upper, device=like._where()), like.dtype)


def _bool_to_additive(m, dtype):
    return creation.zeros(*m.shape, dtype=dtype, device=m._where()).masked_fill(
        m, float("-inf"))


def _none_or_dtype(t):
    if t is None:
        return None
    if hasattr(t, "dtype"):
        return t.dtype
    raise RuntimeError("input to _none_or_dtype() must be None or torch.Tensor")


def canonical_mask(mask, mask_name: str, other_type, other_name: str, target_type,
                   check_other: bool = True):
    """torch's _canonical_mask: a bool mask becomes an additive float mask (-inf where True,
    of target_type); a float mask is kept; any other dtype is an error. Warns, as torch, when
    the mask's dtype differs from the other mask's."""
    if mask is None:
        return None
    from ..._core.dtype import bool_

    is_float = mask.dtype.is_floating_point
    if mask.dtype is not bool_ and not is_float:
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype != other_type:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. Use "
                      "same type for both instead.", stacklevel=3)
    if not is_float:
        mask = _bool_to_additive(mask, target_type)
    return mask
