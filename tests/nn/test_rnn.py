"""RNN, LSTM, GRU, their cells and packed sequences against torch 2.13: same weights, same
inputs -> same outputs, hidden states and gradients of inputs and every parameter."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.utils.rnn as trnn

import sbpflow as flow
import sbpflow.nn.utils.rnn as frnn
from tests.mpijob import mpiexec_cmd, run_job

RTOL, ATOL = 1e-9, 1e-10


def _pair(name, *args, **kwargs):
    """The torch module and ours, both float64, ours loaded from torch's state dict."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(*args, dtype=torch.float64, **kwargs)
    ours = getattr(flow.nn, name)(*args, dtype=flow.float64, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (n, p), (tn, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert n == tn and tuple(p.shape) == tuple(tp.shape), n
    sd = {k: flow.tensor(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()}
    res = ours.load_state_dict(sd)
    assert not res.missing_keys and not res.unexpected_keys
    return ours, theirs


def _flat(out):
    """Tensors of a (possibly nested) module output, PackedSequence data included."""
    if isinstance(out, (frnn.PackedSequence, trnn.PackedSequence)):
        return [out.data]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


def _close(a, b, what, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol, atol,
                               err_msg=what)


def _check(ours, theirs, f_args, t_args, f_leaves, t_leaves, seed=0):
    """Forward outputs equal; the backward of a random projection of every output gives the
    same gradients for the leaves and every parameter."""
    f_out, t_out = ours(*f_args), theirs(*t_args)
    fo, to = _flat(f_out), _flat(t_out)
    assert len(fo) == len(to)
    rng = np.random.default_rng(seed)
    cots = []
    for k, (a, b) in enumerate(zip(fo, to)):
        assert tuple(a.shape) == tuple(b.shape), f"output {k}: {a.shape} vs {b.shape}"
        _close(a, b, f"output {k}")
        cots.append(rng.standard_normal(tuple(b.shape)))
    flow.autograd.backward(fo, [flow.tensor(c) for c in cots])
    torch.autograd.backward(to, [torch.tensor(c) for c in cots])
    for k, (a, b) in enumerate(zip(f_leaves, t_leaves)):
        assert a.grad is not None, f"leaf {k} got no gradient"
        _close(a.grad, b.grad, f"grad of leaf {k}", 1e-8, 1e-9)
    for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert p.grad is not None, f"{n} got no gradient"
        _close(p.grad, tp.grad, f"grad of {n}", 1e-8, 1e-9)
    return f_out, t_out


def _leaf(x):
    return flow.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)


CONFIGS = [
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2}),
    ("RNN", {"bidirectional": True, "bias": False}),
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 2}),
    ("LSTM", {"proj_size": 3, "num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"bias": False, "batch_first": True}),
    ("GRU", {}),
    ("GRU", {"num_layers": 3, "batch_first": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "bias": False}),
]


def _ids(configs):
    return [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}"
            for n, kw in configs]


def _hidden(name, kw, batch, rng, batched=True):
    d = 2 if kw.get("bidirectional") else 1
    lead = (kw.get("num_layers", 1) * d,) + ((batch,) if batched else ())
    h = rng.standard_normal(lead + (kw.get("proj_size") or 4,))
    if name != "LSTM":
        return _leaf(h)
    fh, th = _leaf(h)
    fc, tc = _leaf(rng.standard_normal(lead + (4,)))
    return (fh, fc), (th, tc)


def _leaves(hx):
    return list(hx) if isinstance(hx, tuple) else [hx]


@pytest.mark.parametrize("name,kw", CONFIGS, ids=_ids(CONFIGS))
@pytest.mark.parametrize("with_hx", [False, True])
def test_module_matches_torch(name, kw, with_hx):
    ours, theirs = _pair(name, 3, 4, **kw)
    rng = np.random.default_rng(1)
    shape = (2, 5, 3) if kw.get("batch_first") else (5, 2, 3)
    fx, tx = _leaf(rng.standard_normal(shape))
    if with_hx:
        fh, th = _hidden(name, kw, 2, rng)
        _check(ours, theirs, (fx, fh), (tx, th), [fx, *_leaves(fh)], [tx, *_leaves(th)])
    else:
        _check(ours, theirs, (fx,), (tx,), [fx], [tx])


@pytest.mark.parametrize("name,kw", [CONFIGS[2], CONFIGS[6], CONFIGS[10]],
                         ids=_ids([CONFIGS[2], CONFIGS[6], CONFIGS[10]]))
@pytest.mark.parametrize("with_hx", [False, True])
def test_unbatched_input(name, kw, with_hx):
    ours, theirs = _pair(name, 3, 4, **kw)
    rng = np.random.default_rng(2)
    fx, tx = _leaf(rng.standard_normal((4, 3)))
    if with_hx:
        fh, th = _hidden(name, kw, None, rng, batched=False)
        f_out, _ = _check(ours, theirs, (fx, fh), (tx, th), [fx, *_leaves(fh)],
                          [tx, *_leaves(th)])
    else:
        f_out, _ = _check(ours, theirs, (fx,), (tx,), [fx], [tx])
    assert f_out[0].ndim == 2


@pytest.mark.parametrize("name,kw", CONFIGS, ids=_ids(CONFIGS))
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_packed_sequence_matches_torch(name, kw, enforce_sorted):
    """Varying lengths: packed output, and each sequence's final state at its own length."""
    ours, theirs = _pair(name, 3, 4, **kw)
    rng = np.random.default_rng(3)
    lengths = [5, 3, 2, 1] if enforce_sorted else [2, 5, 1, 3]
    bf = kw.get("batch_first", False)
    x = rng.standard_normal((4, 5, 3) if bf else (5, 4, 3))
    fx, tx = _leaf(x)
    fp = frnn.pack_padded_sequence(fx, lengths, batch_first=bf, enforce_sorted=enforce_sorted)
    tp = trnn.pack_padded_sequence(tx, lengths, batch_first=bf, enforce_sorted=enforce_sorted)
    fh, th = _hidden(name, kw, 4, rng)
    f_out, t_out = _check(ours, theirs, (fp, fh), (tp, th), [fx, *_leaves(fh)],
                          [tx, *_leaves(th)])
    assert isinstance(f_out[0], frnn.PackedSequence)
    assert f_out[0].batch_sizes.tolist() == t_out[0].batch_sizes.tolist()
    fpad, flen = frnn.pad_packed_sequence(f_out[0], batch_first=bf)
    tpad, tlen = trnn.pad_packed_sequence(t_out[0], batch_first=bf)
    _close(fpad, tpad, "padded output")
    assert flen.tolist() == tlen.tolist() == lengths


def test_packed_without_hx():
    ours, theirs = _pair("LSTM", 3, 4, bidirectional=True)
    x = np.random.default_rng(4).standard_normal((4, 3, 3))
    fx, tx = _leaf(x)
    fp = frnn.pack_padded_sequence(fx, [2, 4, 1], enforce_sorted=False)
    tp = trnn.pack_padded_sequence(tx, [2, 4, 1], enforce_sorted=False)
    _check(ours, theirs, (fp,), (tp,), [fx], [tx])


# -- cells ---------------------------------------------------------------------------------
CELLS = [
    ("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu", "bias": False}),
    ("LSTMCell", {}), ("LSTMCell", {"bias": False}), ("GRUCell", {}), ("GRUCell", {"bias": False}),
]


@pytest.mark.parametrize("name,kw", CELLS, ids=_ids(CELLS))
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [False, True])
def test_cell_matches_torch(name, kw, batched, with_hx):
    ours, theirs = _pair(name, 3, 4, **kw)
    rng = np.random.default_rng(5)
    lead = (2,) if batched else ()
    fx, tx = _leaf(rng.standard_normal(lead + (3,)))
    if not with_hx:
        _check(ours, theirs, (fx,), (tx,), [fx], [tx])
        return
    fh, th = _leaf(rng.standard_normal(lead + (4,)))
    if name == "LSTMCell":
        fc, tc = _leaf(rng.standard_normal(lead + (4,)))
        _check(ours, theirs, (fx, (fh, fc)), (tx, (th, tc)), [fx, fh, fc], [tx, th, tc])
    else:
        _check(ours, theirs, (fx, fh), (tx, th), [fx, fh], [tx, th])


def test_cell_unrolled_equals_module():
    """An LSTMCell stepped by hand gives the LSTM's output (same weights)."""
    lstm = flow.nn.LSTM(3, 4, dtype=flow.float64)
    cell = flow.nn.LSTMCell(3, 4, dtype=flow.float64)
    cell.load_state_dict({k[:-3]: v for k, v in lstm.state_dict().items()})
    x = flow.tensor(np.random.default_rng(6).standard_normal((5, 2, 3)))
    out, (h, c) = lstm(x)
    hc = None
    for t in range(5):
        hc = cell(x[t], hc)
        _close(hc[0], out[t], f"step {t}")
    _close(hc[0], h[0], "h_n")
    _close(hc[1], c[0], "c_n")


# -- state dicts, init, repr, flatten_parameters -------------------------------------------
@pytest.mark.parametrize("name,kw", [CONFIGS[6], CONFIGS[10]],
                         ids=_ids([CONFIGS[6], CONFIGS[10]]))
def test_state_dict_into_torch(name, kw):
    ours = getattr(flow.nn, name)(3, 4, dtype=flow.float64, **kw)
    theirs = getattr(torch.nn, name)(3, 4, dtype=torch.float64, **kw)
    res = theirs.load_state_dict({k: torch.tensor(v.numpy().copy())
                                  for k, v in ours.state_dict().items()})
    assert not res.missing_keys and not res.unexpected_keys
    x = np.random.default_rng(7).standard_normal((2, 5, 3) if kw.get("batch_first") else
                                                 (5, 2, 3))
    _close(ours(flow.tensor(x))[0], theirs(torch.tensor(x))[0], "output")


def test_init_range_names_and_repr():
    m = flow.nn.LSTM(3, 16, num_layers=2, bidirectional=True, proj_size=4)
    t = torch.nn.LSTM(3, 16, num_layers=2, bidirectional=True, proj_size=4)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert m._flat_weights_names == t._flat_weights_names
    assert [[tuple(w.shape) for w in ws] for ws in m.all_weights] == \
        [[tuple(w.shape) for w in ws] for ws in t.all_weights]
    bound = 1 / 4.0
    for n, p in m.named_parameters():
        v = p.detach().numpy()
        assert v.min() >= -bound and v.max() <= bound and v.std() > bound / 4, n
    assert repr(m) == repr(t)
    assert repr(flow.nn.GRU(2, 3, bias=False, batch_first=True, dropout=0.5, num_layers=2)) == \
        repr(torch.nn.GRU(2, 3, bias=False, batch_first=True, dropout=0.5, num_layers=2))
    assert repr(flow.nn.RNNCell(2, 3, nonlinearity="relu")) == \
        repr(torch.nn.RNNCell(2, 3, nonlinearity="relu"))
    assert m.flatten_parameters() is None


# -- dropout -------------------------------------------------------------------------------
def test_dropout_between_layers():
    m = flow.nn.LSTM(3, 4, num_layers=3, dropout=0.5, dtype=flow.float64)
    x = flow.tensor(np.random.default_rng(8).standard_normal((5, 2, 3)))
    m.eval()
    ref = m(x)[0].detach().numpy()
    assert np.array_equal(m(x)[0].detach().numpy(), ref), "eval is deterministic"
    m.train()
    flow.manual_seed(3)
    a = m(x)[0].detach().numpy()
    flow.manual_seed(3)
    b = m(x)[0].detach().numpy()
    assert np.array_equal(a, b), "same seed, same dropout masks"
    assert not np.allclose(a, ref), "training applies dropout between layers"
    m0 = flow.nn.GRU(3, 4, num_layers=2, dropout=0.0, dtype=flow.float64)
    out_train = m0.train()(x)[0].detach().numpy()
    assert np.array_equal(out_train, m0.eval()(x)[0].detach().numpy()), "p=0 equals eval"


def test_dropout_warning_and_range():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        flow.nn.LSTM(3, 4, dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flow.nn.LSTM(3, 4, num_layers=2, dropout=0.2)
    for bad in (1.5, -0.1, True):
        with pytest.raises(ValueError, match="dropout should be a number in range"):
            flow.nn.GRU(3, 4, dropout=bad)


# -- bad input: torch's exception types and messages ---------------------------------------
def _raises_like(fn_ours, fn_theirs):
    with pytest.raises(Exception) as te:
        fn_theirs()
    with pytest.raises(type(te.value)) as oe:
        fn_ours()
    # dtypes print under their own package name: sbpflow.float32 for torch.float32
    assert str(oe.value) == str(te.value).replace("torch.", "sbpflow.")


@pytest.mark.parametrize("args,kw", [
    ((3, 4), {"proj_size": 4}), ((3, 4), {"proj_size": -1}), ((0, 4), {}), ((3, 0), {}),
    ((3, 4), {"num_layers": 0}), ((3, 4), {"bias": 1}), ((3, 4), {"batch_first": None}),
    ((3.0, 4), {}),
])
def test_constructor_errors(args, kw):
    _raises_like(lambda: flow.nn.LSTM(*args, **kw), lambda: torch.nn.LSTM(*args, **kw))


def test_constructor_errors_rnn_gru():
    _raises_like(lambda: flow.nn.GRU(3, 4, proj_size=2), lambda: torch.nn.GRU(3, 4, proj_size=2))
    _raises_like(lambda: flow.nn.RNN(3, 4, nonlinearity="gelu"),
                 lambda: torch.nn.RNN(3, 4, nonlinearity="gelu"))


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU"])
def test_forward_errors(name):
    ours, theirs = _pair(name, 3, 4, num_layers=2)
    lstm = name == "LSTM"

    def both(x_shape, h_shapes=None, dtype=np.float64):
        x = np.zeros(x_shape, dtype=dtype)
        if h_shapes is None:
            return (lambda: ours(flow.tensor(x)), lambda: theirs(torch.tensor(x)))
        hs = [np.zeros(s) for s in h_shapes]
        fh = tuple(flow.tensor(h) for h in hs) if lstm else flow.tensor(hs[0])
        th = tuple(torch.tensor(h) for h in hs) if lstm else torch.tensor(hs[0])
        return (lambda: ours(flow.tensor(x), fh), lambda: theirs(torch.tensor(x), th))

    _raises_like(*both((1, 5, 2, 3)))  # 4-D input
    _raises_like(*both((5, 2, 2)))  # wrong input_size
    _raises_like(*both((5, 2, 3), dtype=np.float32))  # dtype differs from the weights
    _raises_like(*both((5, 2, 3), [(2, 3, 4), (2, 3, 4)]))  # wrong batch in hx
    _raises_like(*both((5, 2, 3), [(2, 4), (2, 4)]))  # 2-D hx for batched input
    _raises_like(*both((5, 3), [(2, 1, 4), (2, 1, 4)]))  # 3-D hx for unbatched input
    if lstm:
        _raises_like(*both((5, 2, 3), [(2, 2, 4), (2, 2, 5)]))  # wrong cell size


CELL_ERRORS = [
    ("LSTMCell", (2, 2, 3), None),  # 3-D input
    ("LSTMCell", (2, 3), [(2, 4), (3, 4)]),  # batch of c differs
    ("LSTMCell", (2, 3), [(2, 2, 4), (2, 4)]),  # 3-D h
    ("GRUCell", (2, 5), None),  # input_size
    ("GRUCell", (2, 3), [(3, 4)]),  # batch of h
    ("GRUCell", (2, 3), [(2, 5)]),  # hidden_size
    ("GRUCell", (2, 3), [(1, 2, 4)]),  # 3-D h
    ("RNNCell", (3,), [(2, 4)]),  # 2-D h for an unbatched input
    ("RNNCell", (2, 3), [(4,)]),  # 1-D h for a batched input
]


@pytest.mark.parametrize("name,x_shape,h_shapes", CELL_ERRORS)
def test_cell_errors(name, x_shape, h_shapes):
    ours, theirs = _pair(name, 3, 4)

    def call(mod, lib):
        x = lib.zeros(*x_shape, dtype=lib.float64)
        if h_shapes is None:
            return lambda: mod(x)
        hs = [lib.zeros(*s, dtype=lib.float64) for s in h_shapes]
        return lambda: mod(x, tuple(hs) if name == "LSTMCell" else hs[0])

    _raises_like(call(ours, flow), call(theirs, torch))


# -- packing utilities ---------------------------------------------------------------------
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("lengths,enforce_sorted", [([4, 2, 1], True), ([2, 4, 3], False),
                                                    ([3, 3, 1], True)])
def test_pack_pad_roundtrip(batch_first, lengths, enforce_sorted):
    x = np.random.default_rng(9).standard_normal((3, 4, 2) if batch_first else (4, 3, 2))
    fx, tx = _leaf(x)
    fp = frnn.pack_padded_sequence(fx, flow.tensor(lengths), batch_first, enforce_sorted)
    tp = trnn.pack_padded_sequence(tx, torch.tensor(lengths), batch_first, enforce_sorted)
    _close(fp.data, tp.data, "packed data")
    assert fp.batch_sizes.tolist() == tp.batch_sizes.tolist()
    assert fp.batch_sizes.dtype == flow.int64
    for a, b in ((fp.sorted_indices, tp.sorted_indices),
                 (fp.unsorted_indices, tp.unsorted_indices)):
        assert (a is None) == (b is None) and (a is None or a.tolist() == b.tolist())
    for total in (None, 6):
        fpad, flen = frnn.pad_packed_sequence(fp, batch_first, -1.5, total)
        tpad, tlen = trnn.pad_packed_sequence(tp, batch_first, -1.5, total)
        _close(fpad, tpad, f"padded, total_length={total}")
        assert flen.tolist() == tlen.tolist() and flen.dtype == flow.int64
    cot = np.random.default_rng(1).standard_normal(tuple(tpad.shape))
    fpad.backward(flow.tensor(cot))
    tpad.backward(torch.tensor(cot))
    _close(fx.grad, tx.grad, "grad through pack and pad")


def test_pack_errors():
    x = np.zeros((3, 2, 4))
    for lengths in ([2, 3], [3, 0], [3, 2, 1]):
        _raises_like(lambda n=lengths: frnn.pack_padded_sequence(flow.tensor(x), n),
                     lambda n=lengths: trnn.pack_padded_sequence(torch.tensor(x), n))
    fp = frnn.pack_padded_sequence(flow.tensor(x), [3, 2])
    tp = trnn.pack_padded_sequence(torch.tensor(x), [3, 2])
    _raises_like(lambda: frnn.pad_packed_sequence(fp, total_length=2),
                 lambda: trnn.pad_packed_sequence(tp, total_length=2))
    _raises_like(lambda: frnn.pad_sequence([flow.zeros(2)], padding_side="middle"),
                 lambda: trnn.pad_sequence([torch.zeros(2)], padding_side="middle"))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence(batch_first, side):
    rng = np.random.default_rng(10)
    seqs = [rng.standard_normal((n, 2, 3)) for n in (2, 5, 3)]
    f_in = [flow.tensor(s, requires_grad=True) for s in seqs]
    t_in = [torch.tensor(s, requires_grad=True) for s in seqs]
    a = frnn.pad_sequence(f_in, batch_first, 0.25, side)
    b = trnn.pad_sequence(t_in, batch_first, 0.25, side)
    _close(a, b, "padded")
    cot = rng.standard_normal(tuple(b.shape))
    a.backward(flow.tensor(cot))
    b.backward(torch.tensor(cot))
    for k, (fa, tb) in enumerate(zip(f_in, t_in)):
        _close(fa.grad, tb.grad, f"grad of sequence {k}")


@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_sequence_unpack_unpad(enforce_sorted):
    rng = np.random.default_rng(11)
    lens = (5, 3, 2) if enforce_sorted else (2, 5, 3)
    seqs = [rng.standard_normal((n, 2)) for n in lens]
    fp = frnn.pack_sequence([flow.tensor(s) for s in seqs], enforce_sorted)
    tp = trnn.pack_sequence([torch.tensor(s) for s in seqs], enforce_sorted)
    _close(fp.data, tp.data, "packed")
    for got, want in zip(frnn.unpack_sequence(fp), seqs):
        np.testing.assert_array_equal(got.numpy(), want)
    padded = frnn.pad_sequence([flow.tensor(s) for s in seqs], batch_first=True)
    for got, want in zip(frnn.unpad_sequence(padded, flow.tensor(lens), batch_first=True),
                         seqs):
        np.testing.assert_array_equal(got.numpy(), want)


def test_packed_sequence_type():
    fp = frnn.pack_sequence([flow.ones(3, 2), flow.ones(1, 2)])
    data, batch_sizes, sorted_i, unsorted_i = fp  # a namedtuple, as torch's
    assert fp._fields == ("data", "batch_sizes", "sorted_indices", "unsorted_indices")
    assert sorted_i is None and unsorted_i is None and batch_sizes.tolist() == [2, 1, 1]
    d = fp.to(flow.float64)
    assert d.data.dtype == flow.float64 and d.batch_sizes is fp.batch_sizes
    assert fp.to(flow.float32) is fp
    assert fp.double().data.dtype == flow.float64 and not fp.is_cuda
    q = frnn.PackedSequence(data, batch_sizes, flow.tensor([1, 0]))
    assert q.unsorted_indices.tolist() == [1, 0]


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_double_backward(name):
    """The cell ops' grads are written with ops: a gradient penalty matches torch's."""
    ours, theirs = _pair(name, 3, 4)
    fx, tx = _leaf(np.random.default_rng(12).standard_normal((3, 2, 3)))
    (fg,) = flow.autograd.grad(ours(fx)[0].pow(2).sum(), [fx], create_graph=True)
    (tg,) = torch.autograd.grad(theirs(tx)[0].pow(2).sum(), [tx], create_graph=True)
    _close(fg, tg, "first gradient")
    fg.pow(2).sum().backward()
    tg.pow(2).sum().backward()
    _close(fx.grad, tx.grad, "second-order gradient of the input", 1e-8, 1e-9)
    for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        _close(p.grad, tp.grad, f"second-order gradient of {n}", 1e-8, 1e-9)


# -- global tensors ------------------------------------------------------------------------
def test_global_tensors_on_two_ranks_equal_single_device():
    """LSTM/GRU/RNN with broadcast parameters and an S(0) batch on 2 ranks, padded and packed:
    outputs, states and all gradients equal the single-device run (the oracle runs inside
    the job)."""
    check = str(Path(__file__).resolve().parent / "rnn_global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", check), timeout=120)
    assert job.returncode == 0, job.output
    assert job.strays == 0, job.output
    passed = re.findall(r"rank (\d+): rnn global check passed \((\d+) configurations\)",
                        job.stdout)
    assert sorted(int(r) for r, _ in passed) == [0, 1], job.output
    assert {int(c) for _, c in passed} == {6}, job.output


# -- nn.Graph ------------------------------------------------------------------------------
def test_graph_training_equals_eager():
    """An LSTM trained in nn.Graph (traced forward, backward and SGD) takes eager's steps."""
    flow.manual_seed(0)
    eager = flow.nn.LSTM(3, 4, num_layers=2, batch_first=True, dtype=flow.float64)
    traced = copy.deepcopy(eager)
    opt = flow.optim.SGD(traced.parameters(), lr=0.1)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = traced
            self.add_optimizer(opt)

        def build(self, x):
            out, _ = self.m(x)
            loss = (out * out).sum()
            loss.backward()
            return loss

    x = flow.tensor(np.random.default_rng(13).standard_normal((2, 5, 3)))
    graph = Train()
    got = [float(graph(x).numpy()) for _ in range(3)]
    opt_e = flow.optim.SGD(eager.parameters(), lr=0.1)
    want = []
    for _ in range(3):
        out, _ = eager(x)
        loss = (out * out).sum()
        opt_e.zero_grad()
        loss.backward()
        opt_e.step()
        want.append(loss.item())
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert want[-1] < want[0]


def test_graph_packed_sequence():
    m = flow.nn.GRU(3, 4, dtype=flow.float64)

    class Run(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            out, h = self.m(frnn.pack_padded_sequence(x, [5, 2, 3], enforce_sorted=False))
            return frnn.pad_packed_sequence(out)[0], h

    x = flow.tensor(np.random.default_rng(14).standard_normal((5, 3, 3)))
    got_out, got_h = Run()(x)
    out, h = m(frnn.pack_padded_sequence(x, [5, 2, 3], enforce_sorted=False))
    _close(got_out, frnn.pad_packed_sequence(out)[0], "padded output")
    _close(got_h, h, "h_n")


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU"])
def test_float32_default_dtype(name):
    """The default float32 modules: outputs and gradients within float32 rounding of torch's."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(3, 5, num_layers=2, bidirectional=True)
    ours = getattr(flow.nn, name)(3, 5, num_layers=2, bidirectional=True)
    ours.load_state_dict({k: flow.tensor(v.detach().numpy().copy())
                          for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(15).standard_normal((6, 2, 3)).astype(np.float32)
    fx, tx = _leaf(x)
    f_out, t_out = ours(fx), theirs(tx)
    assert f_out[0].dtype == flow.float32
    np.testing.assert_allclose(f_out[0].detach().numpy(), t_out[0].detach().numpy(), 1e-5, 1e-6)
    f_out[0].sum().backward()
    t_out[0].sum().backward()
    np.testing.assert_allclose(fx.grad.numpy(), tx.grad.numpy(), 1e-4, 1e-5)
    for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert p.grad.dtype == flow.float32
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), 1e-4, 1e-5, err_msg=n)


@pytest.mark.parametrize("name", ["RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell"])
def test_hidden_dtype_mismatch_is_a_runtime_error(name):
    """float32 hidden state, float64 weights and input: RuntimeError in both libraries."""
    ours, theirs = _pair(name, 3, 4)
    cell = name.endswith("Cell")
    for mod, lib in ((theirs, torch), (ours, flow)):
        x = lib.zeros(*((2, 3) if cell else (5, 2, 3)), dtype=lib.float64)
        h = lib.zeros(*((2, 4) if cell else (1, 2, 4)))
        with pytest.raises(RuntimeError, match="dtype"):
            mod(x, (h, h) if name.startswith("LSTM") else h)
