"""sbpflow.utils.checkpoint: gradients equal the plain run, the function really runs again in
backward (call counts), dropout masks match through the saved RNG state, and torch 2.13's
warnings and errors."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.utils.checkpoint as tcp

import sbpflow as flow
import sbpflow.utils.checkpoint as cp


class Block:
    """A dropout block that counts its forward calls."""

    def __init__(self, p=0.5):
        self.lin = flow.nn.Linear(6, 6)
        self.drop = flow.nn.Dropout(p)
        self.calls = 0

    def __call__(self, x, scale=1.0):
        self.calls += 1
        return self.drop(flow.tanh(self.lin(x))) * scale + x


def _grads(block, x):
    return [t.grad.numpy().copy() for t in (x, block.lin.weight, block.lin.bias)]


def _clear(block, x):
    for t in (x, block.lin.weight, block.lin.bias):
        t.grad = None


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradients_equal_plain_run_and_forward_is_recomputed(use_reentrant):
    flow.manual_seed(0)
    block = Block()
    x = flow.randn(4, 6, requires_grad=True)
    flow.manual_seed(7)
    plain = block(x)
    (plain * plain).sum().backward()
    want = _grads(block, x)
    _clear(block, x)
    flow.manual_seed(7)
    out = cp.checkpoint(block, x, use_reentrant=use_reentrant)
    assert block.calls == 2  # one plain, one checkpointed forward
    np.testing.assert_array_equal(out.detach().numpy(), plain.detach().numpy())
    assert out.grad_fn is not None and "Checkpoint" in out.grad_fn.name()
    (out * out).sum().backward()
    assert block.calls == 3  # backward ran the block again
    for g, w in zip(_grads(block, x), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_without_preserved_rng_the_recomputed_mask_differs():
    flow.manual_seed(0)
    block = Block()
    x = flow.randn(8, 6, requires_grad=True)
    flow.manual_seed(3)
    block(x).sum().backward()
    want = x.grad.numpy().copy()
    _clear(block, x)
    flow.manual_seed(3)
    cp.checkpoint(block, x, use_reentrant=True, preserve_rng_state=False).sum().backward()
    assert not np.allclose(x.grad.numpy(), want)  # so the preserved state is what matches


def test_recomputation_leaves_the_outer_random_sequence_alone():
    flow.manual_seed(0)
    block = Block()
    x = flow.randn(4, 6, requires_grad=True)
    flow.manual_seed(11)
    out = cp.checkpoint(block, x, use_reentrant=True)
    state = flow.get_rng_state()
    expected = flow.rand(5).numpy()
    flow.set_rng_state(state)
    out.sum().backward()
    np.testing.assert_array_equal(flow.rand(5).numpy(), expected)


def test_no_activation_is_recorded_inside_the_region():
    seen = []

    def fn(x):
        h = flow.exp(x)
        seen.append(h.requires_grad)
        return h * 2

    x = flow.randn(3, requires_grad=True)
    y = cp.checkpoint(fn, x, use_reentrant=True)
    assert seen == [False]  # forward ran under no_grad
    y.sum().backward()
    assert seen == [False, True]  # the recomputation built the graph
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(x.detach().numpy()), rtol=1e-6)


def test_non_reentrant_takes_kwargs_and_gives_param_grads_without_input_grads():
    flow.manual_seed(0)
    block = Block(p=0.0)
    x = flow.randn(4, 6)
    block(x, scale=3.0).sum().backward()
    want = block.lin.weight.grad.numpy().copy()
    block.lin.weight.grad = None
    cp.checkpoint(block, x, scale=3.0, use_reentrant=False).sum().backward()
    np.testing.assert_allclose(block.lin.weight.grad.numpy(), want, rtol=1e-6)
    assert block.calls == 3


def test_multiple_outputs_and_non_tensor_args():
    def fn(a, k, b):
        return a * b * k, (a + b).sin()

    a = flow.randn(3, requires_grad=True)
    b = flow.randn(3, requires_grad=True)
    p, q = cp.checkpoint(fn, a, 2.5, b, use_reentrant=True)
    (p.sum() + q.sum()).backward()
    ta = torch.tensor(a.detach().numpy(), requires_grad=True)
    tb = torch.tensor(b.detach().numpy(), requires_grad=True)
    tp, tq = fn(ta, 2.5, tb)
    (tp.sum() + tq.sum()).backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5)


def _warning_texts(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fn()
    return [str(m.message) for m in w]


def test_use_reentrant_warnings_match_torch():
    x = flow.randn(2, requires_grad=True)
    tx = torch.randn(2, requires_grad=True)
    ours = _warning_texts(lambda: cp.checkpoint(flow.sin, x))
    theirs = _warning_texts(lambda: tcp.checkpoint(torch.sin, tx))
    assert ours == theirs and "use_reentrant parameter" in ours[0]
    seq = [flow.nn.Linear(2, 2), flow.nn.Tanh(), flow.nn.Linear(2, 2)]
    tseq = [torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 2)]
    ours = _warning_texts(lambda: cp.checkpoint_sequential(seq, 2, x))
    theirs = _warning_texts(lambda: tcp.checkpoint_sequential(tseq, 2, tx))
    assert ours[0] == theirs[0]
    ours = _warning_texts(lambda: cp.checkpoint(flow.sin, x.detach(), use_reentrant=True))
    theirs = _warning_texts(lambda: tcp.checkpoint(torch.sin, tx.detach(), use_reentrant=True))
    assert ours == theirs == ["None of the inputs have requires_grad=True. Gradients will be None"]


def test_errors_match_torch():
    x = flow.randn(2, requires_grad=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        cp.checkpoint(flow.sin, x, scale=2, use_reentrant=True)
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        cp.checkpoint(flow.sin, x, use_reentrant=True, debug=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        cp.checkpoint_sequential([flow.sin], 1, x, use_reentrant=True, foo=1)


def test_checkpoint_sequential_matches_plain_and_recomputes_segments():
    flow.manual_seed(0)
    layers = [flow.nn.Linear(5, 5) for _ in range(4)]
    counts = [0] * 4

    def counted(i):
        def f(h):
            counts[i] += 1
            return flow.tanh(layers[i](h))
        return f

    fns = [counted(i) for i in range(4)]
    x = flow.randn(3, 5, requires_grad=True)
    h = x
    for f in fns:
        h = f(h)
    h.sum().backward()
    want = [x.grad.numpy().copy()] + [m.weight.grad.numpy().copy() for m in layers]
    x.grad = None
    for m in layers:
        m.weight.grad = m.bias.grad = None
    counts[:] = [0] * 4
    out = cp.checkpoint_sequential(fns, 2, x, use_reentrant=True)
    out.sum().backward()
    assert counts == [2, 2, 1, 1]  # the first segment ran again, the last did not
    got = [x.grad.numpy()] + [m.weight.grad.numpy() for m in layers]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)
    seq = flow.nn.Sequential(*[flow.nn.Linear(5, 5) for _ in range(3)])
    np.testing.assert_allclose(
        cp.checkpoint_sequential(seq, 3, x, use_reentrant=False).detach().numpy(),
        seq(x).detach().numpy(), rtol=1e-6)


def test_importable_under_mock_torch():
    with flow.mock_torch.enable():
        import torch.utils.checkpoint as mocked
        assert mocked is cp
        from torch.utils.checkpoint import checkpoint
        assert checkpoint is cp.checkpoint


def test_reachable_after_a_plain_import_as_in_torch():
    """`import torch` then `torch.utils.checkpoint.checkpoint(...)` works in torch without
    importing the submodule; so must it here (a fresh interpreter: this file imported it)."""
    code = ("import sbpflow, torch; print(sbpflow.utils.checkpoint.checkpoint.__name__, "
            "torch.utils.checkpoint.checkpoint.__name__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["checkpoint", "checkpoint"]
