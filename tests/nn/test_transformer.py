"""MultiheadAttention and the Transformer family against torch 2.13.

Each case builds the same module in both frameworks, copies torch's state dict into ours, runs
the same inputs and compares outputs, attention weights, and the gradients of the inputs and
of every parameter (by name: the state dicts must have torch's keys in torch's order)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.nn as nn
import sbpflow.nn.functional as F

RTOL, ATOL = 1e-4, 1e-5


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _load_from_torch(ours, theirs):
    assert list(ours.state_dict()) == list(theirs.state_dict())
    sd = {k: flow.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()}
    result = ours.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys


def _pair(x):
    """A value as (ours, theirs): arrays become tensors (float ones require grad)."""
    if isinstance(x, np.ndarray):
        grad = x.dtype.kind == "f"
        return flow.tensor(x, requires_grad=grad), torch.tensor(x, requires_grad=grad)
    return x, x


def _np(t):
    return None if t is None else t.detach().numpy()


def _run_both(ours, theirs, args, kwargs, train=False, check_grads=True):
    """Forward both with the same inputs; compare every output, then the gradients of the
    inputs and parameters for a random cotangent on every float output."""
    ours.train(train)
    theirs.train(train)
    _load_from_torch(ours, theirs)
    pairs = [_pair(a) for a in args]
    kpairs = {k: _pair(v) for k, v in kwargs.items()}
    f_out = ours(*[p[0] for p in pairs], **{k: p[0] for k, p in kpairs.items()})
    t_out = theirs(*[p[1] for p in pairs], **{k: p[1] for k, p in kpairs.items()})
    f_outs = f_out if isinstance(f_out, tuple) else (f_out,)
    t_outs = t_out if isinstance(t_out, tuple) else (t_out,)
    assert len(f_outs) == len(t_outs)
    rng = np.random.default_rng(1)
    f_loss = t_loss = 0
    for fo, to in zip(f_outs, t_outs):
        if to is None:
            assert fo is None
            continue
        assert tuple(fo.shape) == tuple(to.shape)
        np.testing.assert_allclose(_np(fo), _np(to), RTOL, ATOL)
        cot = rng.standard_normal(tuple(to.shape)).astype(np.float32)
        f_loss = f_loss + (fo * flow.tensor(cot)).sum()
        t_loss = t_loss + (to * torch.tensor(cot)).sum()
    if not check_grads:
        return f_outs, t_outs
    f_loss.backward()
    t_loss.backward()
    f_named = dict(ours.named_parameters())
    t_named = dict(theirs.named_parameters())
    assert list(f_named) == list(t_named)
    for name, tp in t_named.items():
        assert (f_named[name].grad is None) == (tp.grad is None), name
        if tp.grad is not None:
            np.testing.assert_allclose(_np(f_named[name].grad), _np(tp.grad), RTOL * 10,
                                       ATOL * 10, err_msg=name)
    for (fa, ta) in pairs + list(kpairs.values()):
        if isinstance(ta, torch.Tensor) and ta.grad is not None:
            np.testing.assert_allclose(_np(fa.grad), _np(ta.grad), RTOL * 10, ATOL * 10)
    return f_outs, t_outs


def _causal(n, m=None):
    return np.triu(np.ones((n, m or n), dtype=bool), 1)


def _float_mask(shape, seed):
    """A float mask with some -inf entries (never a whole row) and finite values."""
    m = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    m[..., 1:][np.random.default_rng(seed + 1).random(m[..., 1:].shape) < 0.3] = -np.inf
    return m


def _padding(n, s, seed):
    kpm = np.random.default_rng(seed).random((n, s)) < 0.3
    kpm[:, 0] = False  # every batch row keeps a key
    return kpm


# -- MultiheadAttention -------------------------------------------------------------------
L, S, N, E, H = 4, 5, 3, 8, 2

MHA_CASES = [
    ("self", dict(), lambda: ((_x(L, N, E),) * 3, {})),
    ("cross-batch_first", dict(batch_first=True),
     lambda: ((_x(N, L, E), _x(N, S, E, seed=1), _x(N, S, E, seed=2)), {})),
    ("kdim-vdim", dict(kdim=6, vdim=5),
     lambda: ((_x(L, N, E), _x(S, N, 6, seed=1), _x(S, N, 5, seed=2)), {})),
    ("no-bias", dict(bias=False),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)), {})),
    ("bool-causal-mask", dict(),
     lambda: ((_x(L, N, E),) * 3, {"attn_mask": _causal(L)})),
    ("float-2d-mask", dict(),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"attn_mask": _float_mask((L, S), 3)})),
    ("bool-3d-mask", dict(batch_first=True),
     lambda: ((_x(N, L, E), _x(N, S, E, seed=1), _x(N, S, E, seed=2)),
              {"attn_mask": np.random.default_rng(4).random((N * H, L, S)) < 0.3
               * np.r_[0, np.ones(S - 1)]})),
    ("float-3d-mask", dict(),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"attn_mask": _float_mask((N * H, L, S), 5)})),
    ("bool-padding", dict(),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"key_padding_mask": _padding(N, S, 6)})),
    ("float-padding-and-float-mask", dict(),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"key_padding_mask": _float_mask((N, S), 7), "attn_mask": _float_mask((L, S), 8)})),
    ("padding-and-bool-mask-no-weights", dict(batch_first=True),
     lambda: ((_x(N, L, E),) * 3,
              {"key_padding_mask": _padding(N, L, 9), "attn_mask": _causal(L),
               "need_weights": False})),
    ("per-head-weights", dict(),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"key_padding_mask": _padding(N, S, 10), "average_attn_weights": False})),
    ("add_bias_kv", dict(add_bias_kv=True),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"key_padding_mask": _padding(N, S, 11), "attn_mask": _float_mask((L, S), 12)})),
    ("add_zero_attn", dict(add_zero_attn=True),
     lambda: ((_x(L, N, E), _x(S, N, E, seed=1), _x(S, N, E, seed=2)),
              {"key_padding_mask": _padding(N, S, 13), "attn_mask": _causal(L, S)})),
    ("bias_kv-zero_attn-kdim-3d-mask", dict(add_bias_kv=True, add_zero_attn=True, kdim=3,
                                           vdim=7, batch_first=True),
     lambda: ((_x(N, L, E), _x(N, S, 3, seed=1), _x(N, S, 7, seed=2)),
              {"attn_mask": _float_mask((N * H, L, S), 14), "average_attn_weights": False})),
    ("bias_kv-no-weights", dict(add_bias_kv=True, add_zero_attn=True),
     lambda: ((_x(L, N, E),) * 3,
              {"key_padding_mask": _padding(N, L, 15), "need_weights": False})),
    ("unbatched", dict(),
     lambda: ((_x(L, E), _x(S, E, seed=1), _x(S, E, seed=2)),
              {"key_padding_mask": _padding(1, S, 16)[0], "attn_mask": _float_mask((L, S), 17)})),
    ("unbatched-3d-mask-batch_first", dict(batch_first=True, add_bias_kv=True),
     lambda: ((_x(L, E), _x(S, E, seed=1), _x(S, E, seed=2)),
              {"attn_mask": _float_mask((H, L, S), 18), "average_attn_weights": False})),
    # torch trusts the is_causal hint when no weights and no padding mask are asked for: the
    # (deliberately non-causal) mask is replaced by the causal one.
    ("is_causal-hint", dict(batch_first=True),
     lambda: ((_x(N, L, E),) * 3,
              {"attn_mask": _float_mask((L, L), 19), "is_causal": True, "need_weights": False})),
    # ... and ignores the hint when weights are asked for
    ("is_causal-with-weights", dict(),
     lambda: ((_x(L, N, E),) * 3, {"attn_mask": _float_mask((L, L), 20), "is_causal": True})),
]


@pytest.mark.parametrize("kw,make_inputs", [c[1:] for c in MHA_CASES],
                         ids=[c[0] for c in MHA_CASES])
def test_multihead_attention_matches_torch(kw, make_inputs):
    torch.manual_seed(0)
    args, kwargs = make_inputs()
    ours, theirs = nn.MultiheadAttention(E, H, **kw), torch.nn.MultiheadAttention(E, H, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's mismatched-mask deprecation (tested below)
        _run_both(ours, theirs, args, kwargs)


def test_multihead_attention_parameters_are_torchs():
    for kw in ({}, {"kdim": 3, "vdim": 5}, {"add_bias_kv": True}, {"bias": False},
               {"kdim": 3, "add_bias_kv": True, "bias": False}):
        ours, theirs = nn.MultiheadAttention(E, H, **kw), torch.nn.MultiheadAttention(E, H, **kw)
        assert list(ours.state_dict()) == list(theirs.state_dict()), kw
        for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
            assert name == tname and tuple(p.shape) == tuple(tp.shape)
        assert ours._qkv_same_embed_dim == theirs._qkv_same_embed_dim
        assert (ours.kdim, ours.vdim, ours.head_dim) == (theirs.kdim, theirs.vdim,
                                                         theirs.head_dim)
        assert repr(ours) == repr(theirs)
    m = nn.MultiheadAttention(E, H)
    assert type(m.out_proj).__module__ == "sbpflow.nn.modules.linear"
    assert type(m).__module__ == "sbpflow.nn.modules.activation"
    from sbpflow.nn.modules.transformer import MultiheadAttention

    assert MultiheadAttention is nn.MultiheadAttention
    # torch's initialisation: zero biases, xavier in-projection
    np.testing.assert_array_equal(m.in_proj_bias.detach().numpy(), 0)
    np.testing.assert_array_equal(m.out_proj.bias.detach().numpy(), 0)
    bound = np.sqrt(6.0 / (E + 3 * E))
    assert np.abs(m.in_proj_weight.detach().numpy()).max() <= bound


def test_multihead_attention_dropout_in_eval_is_identity_and_in_training_random():
    torch.manual_seed(0)
    ours, theirs = nn.MultiheadAttention(E, H, dropout=0.5), torch.nn.MultiheadAttention(
        E, H, dropout=0.5)
    _run_both(ours, theirs, (_x(L, N, E),) * 3, {}, train=False)
    ours.train()
    x = flow.tensor(_x(L, N, E))
    with flow.no_grad():
        w = ours(x, x, x, average_attn_weights=False)[1].numpy()
        ours.eval()
        w0 = ours(x, x, x, average_attn_weights=False)[1].numpy()
    # each weight is dropped (0) or kept and scaled by 1 / (1 - p)
    dropped = w == 0
    assert 0 < dropped.mean() < 1
    np.testing.assert_allclose(w[~dropped], 2 * w0[~dropped], 1e-6)


def test_fully_masked_rows_as_torch():
    """A query that may attend to no key: zeros without weights (torch's fused path), NaN
    with them (torch's explicit softmax)."""
    torch.manual_seed(0)
    ours, theirs = nn.MultiheadAttention(E, H), torch.nn.MultiheadAttention(E, H)
    with torch.no_grad():
        theirs.out_proj.bias.normal_()
    _load_from_torch(ours, theirs)
    x = _x(L, N, E)
    kpm = _padding(N, L, 0)
    kpm[1] = True  # batch row 1: every key padded
    for need_weights in (False, True):
        f = ours(flow.tensor(x), flow.tensor(x), flow.tensor(x),
                 key_padding_mask=flow.tensor(kpm), need_weights=need_weights)[0]
        t = theirs(torch.tensor(x), torch.tensor(x), torch.tensor(x),
                   key_padding_mask=torch.tensor(kpm), need_weights=need_weights)[0]
        np.testing.assert_allclose(_np(f), _np(t), RTOL, ATOL)
        assert np.isnan(_np(t)).any() == need_weights
    # the zeros of the fused path have zero gradients
    xs = flow.tensor(x, requires_grad=True)
    ours(xs, xs, xs, key_padding_mask=flow.tensor(kpm), need_weights=False)[0].sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    theirs(xt, xt, xt, key_padding_mask=torch.tensor(kpm), need_weights=False)[0].sum().backward()
    np.testing.assert_allclose(_np(xs.grad), _np(xt.grad), 1e-3, 1e-4)


def _raises_like_torch(make, call, exc):
    """Both frameworks raise the same exception type (and ours names the problem)."""
    torch.manual_seed(0)
    with pytest.raises(exc) as theirs:
        call(make(torch), torch)
    with pytest.raises(exc) as ours:
        call(make(flow), flow)
    return str(ours.value), str(theirs.value)


def _t(lib, a):
    return lib.tensor(a)


@pytest.mark.parametrize("call,exc", [
    # query of rank 4
    (lambda m, lib: m(_t(lib, _x(1, L, N, E)), _t(lib, _x(1, L, N, E)), _t(lib, _x(1, L, N, E))),
     AssertionError),
    # batched query, unbatched key
    (lambda m, lib: m(_t(lib, _x(L, N, E)), _t(lib, _x(L, E)), _t(lib, _x(L, E))),
     AssertionError),
    # 2-D mask of the wrong shape
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, attn_mask=_t(lib, _causal(L, L + 1))),
     RuntimeError),
    # 3-D mask of the wrong shape
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, attn_mask=_t(lib, np.zeros((N, L, L),
                                                                               np.float32))),
     RuntimeError),
    # 4-D mask
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3,
                      attn_mask=_t(lib, np.zeros((1, N * H, L, L), np.float32))),
     AssertionError),
    # integer padding mask
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, key_padding_mask=_t(lib, np.zeros(
        (N, L), np.int64))), AssertionError),
    # padding mask of the wrong length
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, key_padding_mask=_t(lib, _padding(N, L + 1,
                                                                                      0))),
     AssertionError),
    # padding mask of the wrong rank
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, key_padding_mask=_t(lib, _padding(N, L, 0)
                                                                        [0])),
     AssertionError),
    # is_causal without a mask
    (lambda m, lib: m(*(_t(lib, _x(L, N, E)),) * 3, is_causal=True), RuntimeError),
    # wrong embedding size
    (lambda m, lib: m(*(_t(lib, _x(L, N, E + 2)),) * 3), AssertionError),
    # key and value of different lengths
    (lambda m, lib: m(_t(lib, _x(L, N, E)), _t(lib, _x(S, N, E)), _t(lib, _x(L, N, E))),
     AssertionError),
], ids=["query-4d", "key-unbatched", "mask-2d-shape", "mask-3d-shape", "mask-4d",
        "int-padding", "padding-length", "padding-rank", "is_causal-no-mask", "embed-dim",
        "key-value-shapes"])
def test_multihead_attention_errors_match_torch(call, exc):
    ours, theirs = _raises_like_torch(lambda lib: lib.nn.MultiheadAttention(E, H), call, exc)
    assert ours == theirs.replace("torch.Size", "sbpflow.Size")


def test_multihead_attention_constructor_errors_match_torch():
    for args, exc in (((6, 4), AssertionError), ((0, 2), ValueError), ((8, 0), ValueError)):
        with pytest.raises(exc) as theirs:
            torch.nn.MultiheadAttention(*args)
        with pytest.raises(exc) as ours:
            nn.MultiheadAttention(*args)
        assert str(ours.value) == str(theirs.value)


def test_mismatched_mask_types_warn_as_torch():
    m = nn.MultiheadAttention(E, H)
    x = flow.tensor(_x(L, N, E))
    with pytest.warns(UserWarning, match="Support for mismatched key_padding_mask and "
                                         "attn_mask is deprecated"):
        m(x, x, x, key_padding_mask=flow.tensor(_padding(N, L, 0)),
          attn_mask=flow.zeros(L, L))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(x, x, x, key_padding_mask=flow.tensor(_padding(N, L, 0)),
          attn_mask=flow.tensor(_causal(L)))


# -- layers and stacks --------------------------------------------------------------------
D, FF = 8, 16


def _enc_layer(lib, **kw):
    kw.setdefault("dropout", 0.0)
    return lib.nn.TransformerEncoderLayer(D, H, FF, **kw)


def _dec_layer(lib, **kw):
    kw.setdefault("dropout", 0.0)
    return lib.nn.TransformerDecoderLayer(D, H, FF, **kw)


def _silu(lib):
    return lib.nn.functional.silu


LAYER_CASES = [
    ("enc", lambda lib: _enc_layer(lib), lambda: ((_x(L, N, D),), {})),
    ("enc-norm_first-gelu-batch_first", lambda lib: _enc_layer(
        lib, norm_first=True, activation="gelu", batch_first=True),
     lambda: ((_x(N, L, D),), {"src_mask": _causal(L),
                               "src_key_padding_mask": _padding(N, L, 1)})),
    ("enc-callable-activation-no-bias-eps", lambda lib: _enc_layer(
        lib, activation=_silu(lib), bias=False, layer_norm_eps=1e-3),
     lambda: ((_x(L, N, D),), {"src_mask": _float_mask((L, L), 2)})),
    ("enc-module-activation-is_causal", lambda lib: _enc_layer(lib, activation=lib.nn.GELU()),
     lambda: ((_x(L, N, D),), {"src_mask": _causal(L), "is_causal": True})),
    ("enc-unbatched", lambda lib: _enc_layer(lib),
     lambda: ((_x(L, D),), {"src_key_padding_mask": _padding(1, L, 3)[0]})),
    ("dec", lambda lib: _dec_layer(lib), lambda: ((_x(L, N, D), _x(S, N, D, seed=1)), {})),
    ("dec-masks", lambda lib: _dec_layer(lib, batch_first=True),
     lambda: ((_x(N, L, D), _x(N, S, D, seed=1)),
              {"tgt_mask": _causal(L), "memory_mask": _float_mask((L, S), 4),
               "tgt_key_padding_mask": _padding(N, L, 5),
               "memory_key_padding_mask": _padding(N, S, 6)})),
    ("dec-norm_first-gelu-is_causal", lambda lib: _dec_layer(lib, norm_first=True,
                                                             activation="gelu"),
     lambda: ((_x(L, N, D), _x(S, N, D, seed=1)),
              {"tgt_mask": _causal(L), "tgt_is_causal": True,
               "memory_key_padding_mask": _padding(N, S, 7)})),
    ("dec-unbatched", lambda lib: _dec_layer(lib, activation=_silu(lib)),
     lambda: ((_x(L, D), _x(S, D, seed=1)), {"tgt_mask": _causal(L)})),
    ("encoder-stack-norm", lambda lib: lib.nn.TransformerEncoder(
        _enc_layer(lib), 2, norm=lib.nn.LayerNorm(D), enable_nested_tensor=False),
     lambda: ((_x(L, N, D),), {"mask": _causal(L), "src_key_padding_mask": _padding(N, L, 8)})),
    ("encoder-stack-is_causal", lambda lib: lib.nn.TransformerEncoder(
        _enc_layer(lib, batch_first=True, norm_first=True), 3, enable_nested_tensor=False),
     lambda: ((_x(N, L, D),), {"mask": _causal(L), "is_causal": True})),
    ("encoder-stack-float-padding", lambda lib: lib.nn.TransformerEncoder(
        _enc_layer(lib), 2, enable_nested_tensor=False),
     lambda: ((_x(L, N, D),), {"src_key_padding_mask": _float_mask((N, L), 9)})),
    ("decoder-stack", lambda lib: lib.nn.TransformerDecoder(_dec_layer(lib), 2,
                                                            norm=lib.nn.LayerNorm(D)),
     lambda: ((_x(L, N, D), _x(S, N, D, seed=1)),
              {"tgt_mask": _causal(L), "memory_key_padding_mask": _padding(N, S, 10)})),
    ("decoder-stack-tgt_is_causal", lambda lib: lib.nn.TransformerDecoder(
        _dec_layer(lib, batch_first=True), 2),
     lambda: ((_x(N, L, D), _x(N, S, D, seed=1)),
              {"tgt_mask": _causal(L), "tgt_is_causal": True})),
    ("transformer", lambda lib: lib.nn.Transformer(D, H, 2, 2, FF, dropout=0.0),
     lambda: ((_x(S, N, D), _x(L, N, D, seed=1)),
              {"src_key_padding_mask": _padding(N, S, 11), "tgt_mask": _causal(L),
               "tgt_key_padding_mask": _padding(N, L, 12),
               "memory_key_padding_mask": _padding(N, S, 11)})),
    ("transformer-batch_first-norm_first", lambda lib: lib.nn.Transformer(
        D, H, 1, 2, FF, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"),
     lambda: ((_x(N, S, D), _x(N, L, D, seed=1)),
              {"src_mask": _float_mask((S, S), 13), "memory_mask": _causal(L, S)})),
    ("transformer-unbatched", lambda lib: lib.nn.Transformer(D, H, 1, 1, FF, dropout=0.0),
     lambda: ((_x(S, D), _x(L, D, seed=1)), {"tgt_mask": _causal(L), "tgt_is_causal": True})),
]


@pytest.mark.parametrize("make,make_inputs", [c[1:] for c in LAYER_CASES],
                         ids=[c[0] for c in LAYER_CASES])
def test_transformer_modules_match_torch(make, make_inputs):
    args, kwargs = make_inputs()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs, ours = make(torch), make(flow)
    _run_both(ours, theirs, args, kwargs)


def test_transformer_in_training_mode_with_zero_dropout_matches_torch():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = nn.Transformer(D, H, 1, 1, FF, dropout=0.0)
        theirs = torch.nn.Transformer(D, H, 1, 1, FF, dropout=0.0)
    _run_both(ours, theirs, (_x(S, N, D), _x(L, N, D, seed=1)),
              {"tgt_mask": _causal(L)}, train=True)


def test_state_dict_keys_and_repr_are_torchs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = [(lib.nn.Transformer(D, H, 2, 1, FF), lib) for lib in (flow, torch)]
    (ours, _), (theirs, _) = pairs
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert "encoder.layers.1.self_attn.in_proj_weight" in ours.state_dict()
    assert "decoder.layers.0.multihead_attn.out_proj.weight" in ours.state_dict()
    for (name, p), (tname, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == tname and tuple(p.shape) == tuple(tp.shape)
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    # the activation is a function in torch (not a submodule)
    assert ours.encoder.layers[0].activation is F.relu
    assert ours.encoder.layers[0].activation_relu_or_gelu == 1
    assert _enc_layer(flow, activation="gelu").activation is F.gelu
    assert _enc_layer(flow, activation=nn.GELU()).activation_relu_or_gelu == 2
    assert _enc_layer(flow, activation=F.silu).activation_relu_or_gelu == 0


def test_transformer_initialisation_is_xavier_on_matrices():
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = nn.Transformer(D, H, 1, 1, FF)
    w = m.encoder.layers[0].linear1.weight.detach().numpy()
    assert np.abs(w).max() <= np.sqrt(6.0 / (D + FF))
    np.testing.assert_array_equal(m.encoder.norm.weight.detach().numpy(), 1)


def test_stacked_layers_are_deep_copies():
    layer = nn.TransformerEncoderLayer(D, H, FF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = nn.TransformerEncoder(layer, 3)
    assert len(enc.layers) == 3 and enc.num_layers == 3
    ws = [lay.self_attn.in_proj_weight for lay in enc.layers]
    assert len({id(w) for w in ws} | {id(layer.self_attn.in_proj_weight)}) == 4
    for w in ws:
        np.testing.assert_array_equal(w.detach().numpy(),
                                      layer.self_attn.in_proj_weight.detach().numpy())
    with flow.no_grad():
        ws[0].fill_(1.0)
    assert not np.allclose(ws[1].detach().numpy(), 1.0)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, H, FF), 2)
    assert dec.layers[0] is not dec.layers[1]
    assert dec.norm is None


def test_generate_square_subsequent_mask_is_torchs():
    for sz in (1, 4):
        ours = nn.Transformer.generate_square_subsequent_mask(sz)
        theirs = torch.nn.Transformer.generate_square_subsequent_mask(sz)
        assert ours.dtype == flow.float32
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    m64 = nn.Transformer.generate_square_subsequent_mask(3, dtype=flow.float64)
    assert m64.dtype == flow.float64
    assert np.isneginf(m64.numpy()[0, 1]) and m64.numpy()[1, 0] == 0
    # a static method: callable from an instance too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = nn.Transformer(D, H, 1, 1, FF)
    np.testing.assert_array_equal(t.generate_square_subsequent_mask(2).numpy(),
                                  np.array([[0, -np.inf], [0, 0]], np.float32))


@pytest.mark.parametrize("make", [
    lambda lib: _enc_layer(lib),
    lambda lib: _enc_layer(lib, batch_first=True, norm_first=True),
    lambda lib: _enc_layer(lib, batch_first=True, bias=False),
    lambda lib: _enc_layer(lib, batch_first=True, activation=_silu(lib)),
    lambda lib: _enc_layer_nhead(lib, batch_first=True, nhead=1),
    lambda lib: _dec_layer(lib),
], ids=["batch_first", "norm_first", "bias", "activation", "odd-heads", "not-encoder-layer"])
def test_nested_tensor_warning_as_torch(make):
    def caught(lib):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            lib.nn.TransformerEncoder(make(lib), 1)
        return [str(x.message) for x in w if "enable_nested_tensor" in str(x.message)]

    theirs, ours = caught(torch), caught(flow)
    assert len(theirs) == 1 and ours == theirs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.TransformerEncoder(make(flow), 1, enable_nested_tensor=False, mask_check=False)


def _enc_layer_nhead(lib, **kw):
    return lib.nn.TransformerEncoderLayer(D, kw.pop("nhead"), FF, dropout=0.0, **kw)


def test_no_warning_for_a_nested_capable_encoder():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        enc = nn.TransformerEncoder(_enc_layer(flow, batch_first=True), 2)
    assert enc.use_nested_tensor and enc.enable_nested_tensor and enc.mask_check


def test_transformer_errors_match_torch():
    def make(lib):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return lib.nn.Transformer(D, H, 1, 1, FF)

    for call in (lambda m, lib: m(lib.tensor(_x(S, N, D)), lib.tensor(_x(L, N + 1, D))),
                 lambda m, lib: m(lib.tensor(_x(S, N, D)), lib.tensor(_x(L, N, D + 1)))):
        ours, theirs = _raises_like_torch(make, call, RuntimeError)
        assert ours == theirs
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(D, H, activation="tanh")
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerDecoderLayer(D, H, activation="tanh")


def test_copy_of_a_layer_keeps_torch_semantics():
    layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0)
    twin = copy.deepcopy(layer)
    assert twin.activation is F.relu
    x, mem = flow.tensor(_x(L, N, D)), flow.tensor(_x(S, N, D, seed=1))
    layer.eval()
    twin.eval()
    np.testing.assert_array_equal(layer(x, mem).detach().numpy(), twin(x, mem).detach().numpy())


# -- global tensors -----------------------------------------------------------------------
@pytest.mark.parametrize("make,batch_first", [
    (lambda: nn.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True), True),
    (lambda: nn.MultiheadAttention(E, H, add_zero_attn=True), False),
    (lambda: _enc_layer(flow, batch_first=True, norm_first=True), True),
    (lambda: _dec_layer(flow), False),
], ids=["mha-bias_kv", "mha-zero_attn", "encoder-layer", "decoder-layer"])
def test_global_batch_split_equals_local(make, batch_first):
    """Parameters broadcast and the batch split S(0) (batch-major) or S(1) (sequence-first)
    on a placement: the values equal the local module's."""
    one = flow.placement("cpu", [0])
    torch.manual_seed(0)
    m = make()
    m.eval()
    is_dec = isinstance(m, nn.TransformerDecoderLayer)
    shape = (N, L, E) if batch_first else (L, N, E)
    axis = 0 if batch_first else 1
    x = _x(*shape)
    kpm = _padding(N, L, 1)
    kw = {"src_key_padding_mask" if isinstance(m, nn.TransformerEncoderLayer) else
          "tgt_key_padding_mask" if is_dec else "key_padding_mask": kpm}

    def run(module, wrap):
        args = (wrap(x, axis),) * (2 if is_dec else 1 if not isinstance(
            module, nn.MultiheadAttention) else 3)
        out = module(*args, **{k: wrap(v, 0) for k, v in kw.items()})
        return out[0] if isinstance(out, tuple) else out

    local = run(m, lambda a, ax: flow.tensor(a)).detach().numpy()
    g = copy.deepcopy(m).to_global(placement=one, sbp=flow.sbp.broadcast)
    out = run(g, lambda a, ax: flow.tensor(a, placement=one, sbp=flow.sbp.split(ax)))
    assert out.is_global
    np.testing.assert_allclose(out.detach().numpy(), local, 1e-6, 1e-6)


@pytest.mark.parametrize("n", [2])
def test_global_modules_on_ranks_equal_local(n):
    """transformer_global_check.py under mpiexec: batch split over ranks (uneven pieces),
    outputs and all gradients equal the local module's."""
    import re
    from pathlib import Path

    from tests.mpijob import mpiexec_cmd, run_job

    check = str(Path(__file__).resolve().parent / "transformer_global_check.py")
    job = run_job(mpiexec_cmd(n, "-m", "mpi4py", check), timeout=120)
    assert job.returncode == 0 and job.strays == 0, job.output
    passed = re.findall(r"rank (\d+): transformer global check passed \(5 cases\)", job.stdout)
    assert sorted(int(r) for r in passed) == list(range(n)), job.output


_LEFT = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], bool)
_RAGGED = np.array([[0, 0, 0, 1, 1], [0, 1, 0, 1, 1], [0, 0, 0, 0, 1]], bool)


@pytest.mark.parametrize("kpm,mask_check,no_grad,with_mask", [
    (_LEFT, True, True, False),
    (np.where(_LEFT, -np.inf, 0).astype(np.float32), True, True, False),
    (np.where(_LEFT, -2.5, 0).astype(np.float32), True, True, False),  # nonzero pads
    (_RAGGED, True, True, False),  # not left-aligned: the ordinary path
    (_RAGGED, False, True, False),  # unchecked: each row keeps its first `length` keys
    (_LEFT, True, False, False),  # gradients wanted: the ordinary path
    (_LEFT, True, True, True),  # an attention mask too: the ordinary path
    (np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool), True, True, False),
], ids=["bool", "float", "float-finite", "ragged", "ragged-unchecked", "grad", "mask",
        "empty-row"])
def test_encoder_nested_tensor_inference_values_as_torch(kpm, mask_check, no_grad, with_mask):
    """torch packs a padded batch into a nested tensor for inference: padded positions come
    out as zeros (then the final norm); the same values here."""
    def make(lib):
        layer = _enc_layer(lib, batch_first=True)
        enc = lib.nn.TransformerEncoder(layer, 2, norm=lib.nn.LayerNorm(D),
                                        mask_check=mask_check)
        return enc.eval()

    torch.manual_seed(0)
    theirs, ours = make(torch), make(flow)
    with torch.no_grad():
        theirs.norm.bias.normal_()  # padded rows come out as this bias: make it visible
    _load_from_torch(ours, theirs)
    x = _x(3, 5, D)
    kw = {"mask": _causal(5)} if with_mask else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's nested-tensor prototype warning
        if no_grad:
            with torch.no_grad(), flow.no_grad():
                t = theirs(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm),
                           **{k: torch.tensor(v) for k, v in kw.items()})
                f = ours(flow.tensor(x), src_key_padding_mask=flow.tensor(kpm),
                         **{k: flow.tensor(v) for k, v in kw.items()})
        else:
            t = theirs(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm))
            f = ours(flow.tensor(x), src_key_padding_mask=flow.tensor(kpm))
    np.testing.assert_allclose(_np(f), _np(t), RTOL, ATOL)


# -- nn.Graph -----------------------------------------------------------------------------
class _TrainGraph(flow.nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, *args):
        out = self.model(*args)
        loss = (out * out).mean()
        loss.backward()
        return loss


class _CrossAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True, kdim=5,
                                         vdim=5, batch_first=True)
        kpm = np.array([[0, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)  # row 2: all padded
        self.register_buffer("kpm", flow.tensor(kpm))

    def forward(self, x, mem):
        return self.mha(x, mem, mem, key_padding_mask=self.kpm, need_weights=False)[0]


class _Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.t = nn.Transformer(D, H, 1, 1, FF, dropout=0.0, batch_first=True)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.t(src, tgt, tgt_mask=mask, tgt_is_causal=True)


@pytest.mark.parametrize("make,shapes", [
    (_CrossAttention, ((3, 4, E), (3, 4, 5))),
    (_Seq2Seq, ((3, 4, D), (3, 5, D))),
], ids=["mha-bias_kv-zero_attn-kdim", "transformer"])
def test_graph_training_equals_eager(make, shapes):
    flow.manual_seed(0)
    eager = make()
    traced = copy.deepcopy(eager)
    opt = flow.optim.SGD(eager.parameters(), lr=0.1)
    graph = _TrainGraph(traced, flow.optim.SGD(traced.parameters(), lr=0.1))
    for step in range(2):
        args = [flow.tensor(_x(*s, seed=10 * step + i)) for i, s in enumerate(shapes)]
        out = eager(*args)
        loss = (out * out).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        np.testing.assert_allclose(graph(*args).item(), loss.item(), 1e-5)
    for (name, p), (_, q) in zip(eager.named_parameters(), traced.named_parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), 1e-5, 1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("attn_dim,with_kpm", [(2, True), (3, True), (2, False), (None, True)])
def test_merge_masks_as_torch(attn_dim, with_kpm):
    ours, theirs = nn.MultiheadAttention(E, H, batch_first=True), torch.nn.MultiheadAttention(
        E, H, batch_first=True)
    q = _x(N, L, E)
    attn = None if attn_dim is None else _float_mask((L, L) if attn_dim == 2 else (N * H, L, L),
                                                     0)
    kpm = np.where(_padding(N, L, 1), -np.inf, 0).astype(np.float32) if with_kpm else None

    def t(lib, a):
        return None if a is None else lib.tensor(a)

    fm, ftype = ours.merge_masks(t(flow, attn), t(flow, kpm), t(flow, q))
    tm, ttype = theirs.merge_masks(t(torch, attn), t(torch, kpm), t(torch, q))
    assert ftype == ttype
    np.testing.assert_array_equal(_np(fm), _np(tm))


@pytest.mark.parametrize("name", ["attn_mask", "key_padding_mask"])
def test_float_mask_of_another_dtype_is_a_runtime_error_as_torch(name):
    shape = (L, L) if name == "attn_mask" else (N, L)

    def call(m, lib):
        x = lib.tensor(_x(L, N, E))
        m(x, x, x, **{name: lib.tensor(np.zeros(shape))})  # float64 mask, float32 query

    ours, _ = _raises_like_torch(lambda lib: lib.nn.MultiheadAttention(E, H), call, RuntimeError)
    assert f"expected {name} to be bool or of the query's dtype" in ours


_DEAD_KPM = np.array([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]], bool)  # row 1: nothing to see
_DEAD_MASK = np.triu(np.ones((4, 4), bool), 1)
_DEAD_MASK[2] = True  # query 2 may see no key


@pytest.mark.parametrize("kw,stack,hint", [
    ({"src_key_padding_mask": _DEAD_KPM}, False, False),
    ({"src_mask": _DEAD_MASK}, False, False),
    ({"src_mask": _DEAD_MASK, "src_key_padding_mask": _DEAD_KPM}, False, False),
    ({"src_mask": np.where(_DEAD_MASK, -np.inf, 0).astype(np.float32)}, False, True),
    ({"src_mask": _float_mask((4, 4), 3)}, False, True),  # the hint is not used: the mask is
    ({"mask": _DEAD_MASK, "src_key_padding_mask": _DEAD_KPM}, True, False),
    ({"mask": _float_mask((4, 4), 4)}, True, True),
    # the kernel hides every key whose merged float mask is nonzero, whatever the value
    ({"src_mask": np.diag(np.full(3, 0.5, np.float32), 1),
      "src_key_padding_mask": np.where(_DEAD_KPM & (np.arange(4) == 3), -0.7, 0).astype(
          np.float32)}, False, False),
], ids=["padding", "mask", "both", "float-mask-hint", "non-causal-hint", "stack-both",
        "stack-hint", "finite-float-masks"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_inference_kernel_values_as_torch(kw, stack, hint, norm_first):
    """Evaluation without gradients: torch's fused encoder-layer kernel takes the masks as
    given (not the causal hint) and gives NaN where a query may attend to no key."""
    def make(lib):
        layer = _enc_layer(lib, batch_first=True, norm_first=norm_first)
        m = lib.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False) if stack else layer
        return m.eval()

    torch.manual_seed(0)
    theirs, ours = make(torch), make(flow)
    _load_from_torch(ours, theirs)
    x = _x(3, 4, D)
    if hint:
        kw = {**kw, "is_causal": True}
    with torch.no_grad(), flow.no_grad():
        t = theirs(torch.tensor(x), **{k: v if isinstance(v, bool) else torch.tensor(v)
                                       for k, v in kw.items()})
        f = ours(flow.tensor(x), **{k: v if isinstance(v, bool) else flow.tensor(v)
                                    for k, v in kw.items()})
    np.testing.assert_allclose(_np(f), _np(t), RTOL, ATOL)  # NaN where torch has NaN


_MHA_INFERENCE_MASKS = {
    "padding": {"key_padding_mask": _DEAD_KPM},
    "mask": {"attn_mask": _DEAD_MASK},
    "both": {"attn_mask": _DEAD_MASK, "key_padding_mask": _DEAD_KPM},
    "per-head-weights": {"key_padding_mask": _DEAD_KPM, "average_attn_weights": False},
    "float-mask": {"attn_mask": np.where(_DEAD_MASK, -np.inf, 0).astype(np.float32)},
    "causal-hint": {"attn_mask": _causal(4), "is_causal": True},
    "hint-on-other-mask": {"attn_mask": _DEAD_MASK, "is_causal": True},
}


@pytest.mark.parametrize("masks", list(_MHA_INFERENCE_MASKS.values()),
                         ids=list(_MHA_INFERENCE_MASKS))
@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "no-weights"])
@pytest.mark.parametrize("kw,self_attention", [
    ({"batch_first": True}, True),
    ({"batch_first": True}, False),
    ({}, True),
    ({"batch_first": True, "add_bias_kv": True}, True),
], ids=["fused", "cross", "seq-first", "bias_kv"])
def test_multihead_attention_inference_values_as_torch(masks, need_weights, kw,
                                                       self_attention):
    """Evaluation without gradients: torch's fused self-attention kernel (batch_first, bool
    masks) ignores the causal hint and gives NaN where a query may attend to no key; the
    other paths are its ordinary ones."""
    torch.manual_seed(0)
    theirs, ours = torch.nn.MultiheadAttention(D, H, **kw).eval(), nn.MultiheadAttention(
        D, H, **kw).eval()
    _load_from_torch(ours, theirs)
    x, other = _x(3, 4, D), _x(3, 4, D, seed=1)  # batch 3, length 4
    if not kw.get("batch_first"):
        x, other = x.swapaxes(0, 1).copy(), other.swapaxes(0, 1).copy()
    outs = []
    for lib, m in ((torch, theirs), (flow, ours)):
        q = lib.tensor(x)
        kv = q if self_attention else lib.tensor(other)
        args = {k: lib.tensor(v) if isinstance(v, np.ndarray) else v for k, v in masks.items()}
        with lib.no_grad():
            outs.append(m(q, kv, kv, need_weights=need_weights, **args))
    (t_out, t_w), (f_out, f_w) = outs
    np.testing.assert_allclose(_np(f_out), _np(t_out), RTOL, ATOL)
    assert (f_w is None) == (t_w is None)
    if t_w is not None:
        np.testing.assert_allclose(_np(f_w), _np(t_w), RTOL, ATOL)
