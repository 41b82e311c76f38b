"""MultiheadAttention and TransformerEncoderLayer with torch's parameter layout."""

from __future__ import annotations

import math

from ...framework.functional import creation
from ...framework.parameter import Parameter
from .. import functional as F
from .. import init
from .activation import GELU, ReLU
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm

__all__ = [
    "NonDynamicallyQuantizableLinear", "MultiheadAttention", "TransformerEncoderLayer",
    "TransformerEncoder",
]


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention.out_proj; kept so state dicts interchange."""


class MultiheadAttention(Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0,
                 bias: bool = True, add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim=None, vdim=None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim="
                             f"{embed_dim} and num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if add_bias_kv or add_zero_attn or (kdim not in (None, embed_dim)) or (
                vdim not in (None, embed_dim)):
            raise NotImplementedError(
                "MultiheadAttention: add_bias_kv, add_zero_attn and kdim/vdim != embed_dim "
                "are not supported yet")
        self.embed_dim = embed_dim
        self.kdim = self.vdim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = Parameter(creation.empty(3 * embed_dim, embed_dim, dtype=dtype))
        if bias:
            self.in_proj_bias = Parameter(creation.empty(3 * embed_dim, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        dtype=dtype)
        self._reset_parameters()

    def _reset_parameters(self):
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        batched = query.dim() == 3
        # Batch-major inside: (N, L, E).  Every reshape below then splits or merges axes
        # after the batch axis, so a batch split over ranks (a global S on N) survives the
        # whole block without boxing.
        if not batched:
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        bsz, tgt_len, e = query.shape
        src_len = key.shape[1]
        h, d = self.num_heads, self.head_dim
        w = self.in_proj_weight
        b = self.in_proj_bias
        wq, wk, wv = w.chunk(3)
        bq, bk, bv = b.chunk(3) if b is not None else (None, None, None)
        # (N, L, E) -> (N, L, h, d) -> (N, h, L, d)
        q = F.linear(query, wq, bq).reshape(bsz, tgt_len, h, d).transpose(1, 2)
        k = F.linear(key, wk, bk).reshape(bsz, src_len, h, d).transpose(1, 2)
        v = F.linear(value, wv, bv).reshape(bsz, src_len, h, d).transpose(1, 2)

        mask = _merge_masks(attn_mask, key_padding_mask, bsz, h, tgt_len, src_len, q.dtype,
                            is_causal)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        if mask is not None:
            scores = scores + mask
        attn = F.softmax(scores, dim=-1)
        if self.dropout > 0.0 and self.training:
            attn = F.dropout(attn, self.dropout)
        out = attn @ v  # (N, h, L, d)
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, tgt_len, e))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        weights = None
        if need_weights:
            weights = attn.mean(dim=1) if average_attn_weights else attn
            if not batched:
                weights = weights.squeeze(0)
        return out, weights


def _merge_masks(attn_mask, key_padding_mask, bsz, h, tgt_len, src_len, dtype, is_causal):
    """One additive float mask of shape broadcastable to (N, h, L, S)."""
    if attn_mask is None and is_causal:
        attn_mask = creation.ones(tgt_len, src_len, dtype=_bool()).triu(1)
    mask = None
    if attn_mask is not None:
        m = _to_additive(attn_mask, dtype)
        if m.dim() == 3:  # (N*h, L, S)
            m = m.reshape(bsz, h, tgt_len, src_len)
        mask = m
    if key_padding_mask is not None:
        kp = _to_additive(key_padding_mask, dtype).reshape(bsz, 1, 1, src_len)
        mask = kp if mask is None else mask + kp
    return mask


def _to_additive(m, dtype):
    if m.dtype is _bool():
        # made where the mask lives (a global mask gets a broadcast one on its placement)
        return creation.zeros(*m.shape, dtype=dtype, device=m._where()).masked_fill(
            m, float("-inf"))
    return m.to(dtype)


def _bool():
    from ..._core.dtype import bool_

    return bool_


class TransformerEncoderLayer(Module):
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise RuntimeError(f"activation should be relu/gelu, not {activation}")
            self.activation = ReLU() if activation == "relu" else GELU()
        else:
            self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor=True):
        super().__init__()
        import copy

        from .container import ModuleList

        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        out = src
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                        is_causal=bool(is_causal))
        return self.norm(out) if self.norm is not None else out
