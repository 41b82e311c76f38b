"""Every op's samples with its tensor inputs laid out as users pass them, against torch 2.13.

Users rarely hand an op a fresh contiguous tensor: a language model embeds `idx[:, :-1]`, a
layer multiplies by `w.t()`, broadcasting code passes `x.expand(...)`.  Here each sample of
each registered op runs with every tensor input (index tensors included) made
non-contiguous with the same logical value, in both frameworks, as torch's OpInfo does:

- `transposed`: a transpose of a contiguous tensor holding the input's last two axes swapped
  (inputs of fewer than 2 dims stay as they are);
- `strided`: every other element of the last axis of a tensor twice as long;
- `expanded`: the input's first row, expanded along axis 0 with stride 0 (the value changes,
  identically in both frameworks; where torch refuses the new value, sbpflow must refuse it
  too).

Forward outputs and, where the sample has a gradient, the gradients of the contiguous
leaves the views come from are compared with torch's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry

from . import harness as H

LAYOUTS = ("transposed", "strided", "expanded")
# A repeated row is a degenerate value for these ops: the result is not unique or not
# defined, in torch as here (not a layout question; the other two layouts run them).
DEGENERATE_WHEN_REPEATED = {
    "linalg_cofactor": "the gradient at a singular matrix",
    "linalg_slogdet": "the gradient at a singular matrix",
    "linalg_lu_factor_ex": "pivots between equal rows",
    "linalg_qr": "the gradient through a singular R",
    "linalg_svd": "singular vectors of a repeated zero singular value",
    "std": "the gradient at zero variance (0/0)",
    "topk": "the indices of ties",
}
CASES = [(name, i, how) for name, i in H.all_cases(lambda opdef, s: not opdef.random)
         for how in LAYOUTS
         if not (how == "expanded" and name in DEGENERATE_WHEN_REPEATED)]
# Registry ops that are the view half of a torch function: the functional layer copies when
# the strides allow no view (torch.flatten does too), so they run through it here.
PUBLIC = {"flatten": lambda x, start_dim=0, end_dim=-1: flow.flatten(x, start_dim, end_dim)}


def _call(opdef, inputs, attrs):
    fn = PUBLIC.get(opdef.name)
    if fn is not None:
        return fn(*inputs, **attrs)
    return apply(opdef, inputs, attrs)


def _leaf(a, how: str, fw):
    """The contiguous leaf (of framework `fw`: sbpflow or torch) a view of `how` is cut from."""
    a = np.asarray(a)
    make = flow.tensor if fw is flow else H.to_torch_tensor
    if how == "transposed" and a.ndim >= 2:
        return make(np.ascontiguousarray(np.swapaxes(a, -1, -2)))
    if how == "strided" and a.ndim >= 1:
        base = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        base[..., ::2] = a
        return make(base)
    if how == "expanded" and a.ndim >= 1 and a.shape[0] > 1:
        return make(np.ascontiguousarray(a[:1]))
    return make(np.array(a, copy=True))


def _view(leaf, a, how: str):
    """The non-contiguous view of `leaf` whose value is `a` (for `expanded`, `a`'s first row
    repeated along axis 0)."""
    a = np.asarray(a)
    if how == "transposed" and a.ndim >= 2:
        return leaf.transpose(-1, -2)
    if how == "strided" and a.ndim >= 1:
        return leaf[..., ::2]
    if how == "expanded" and a.ndim >= 1 and a.shape[0] > 1:
        return leaf.expand(*a.shape)
    return leaf


def _strided_by(a, how: str) -> bool:
    """Whether the layout makes `a` non-contiguous (not only a size-1 or empty axis)."""
    shape = np.shape(a)
    if 0 in shape:
        return False
    if how == "transposed":
        return len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1
    if how == "strided":
        return len(shape) >= 1 and shape[-1] > 1
    return len(shape) >= 1 and shape[0] > 1 and np.prod(shape[1:]) > 0


def _inputs(opdef, sample, how, fw, grad, contiguous=False):
    """(leaves, op inputs) of one framework; floating leaves require grad when `grad`.
    `contiguous`: each op input is a contiguous copy of its view (torch's oracle: the same
    values through its contiguous kernels, differentiable back to the same leaves)."""
    leaves, views = [], []
    for a in H.flat_inputs(opdef, sample):
        leaf = _leaf(a, how, fw)
        if grad and leaf.dtype.is_floating_point:
            leaf.requires_grad_()
        leaves.append(leaf)
        view = _view(leaf, a, how)
        views.append(view.contiguous() if contiguous else view)
    return leaves, ((tuple(views),) if opdef.variadic else tuple(views))


def _builtin(cls):
    """The built-in exception class torch's error derives from (torch.linalg.LinAlgError is
    a RuntimeError; sbpflow's own is another class with the same base)."""
    return next(c for c in cls.__mro__ if c.__module__ == "builtins")


def _torch_call(opdef, sample, inputs):
    ref = H.resolve_reference(opdef.reference)
    return H.as_tuple(ref(*inputs, **H.torch_attrs(sample.attrs)))


@pytest.mark.parametrize("name,i,how", CASES, ids=[f"{n}-{i}-{h}" for n, i, h in CASES])
def test_op_on_noncontiguous_inputs_matches_torch(name, i, how):
    opdef, sample = registry.get(name), H.op_samples(name)[i]
    grad = bool(sample.grad and opdef.grad is not None)
    # The oracle: torch on contiguous copies of the same views, back to the same leaves
    # (torch's own kernels on strided inputs have bugs: median over an expanded axis and
    # embedding_bag's expanded offsets read garbage).  A view op's refusal of a layout is
    # its contract (`view` of a transpose), so there torch runs on the views themselves.
    try:
        t_leaves, t_inputs = _inputs(opdef, sample, how, torch, grad, contiguous=not opdef.view)
        t_outs = _torch_call(opdef, sample, t_inputs)
    except (RuntimeError, ValueError, IndexError) as err:
        # torch refuses the layout or the value (a singular matrix from a repeated row):
        # so must we, with torch's built-in exception type
        _, inputs = _inputs(opdef, sample, how, flow, False)
        with pytest.raises(_builtin(type(err))):
            _call(opdef, inputs, dict(sample.attrs))
        return
    leaves, inputs = _inputs(opdef, sample, how, flow, grad)
    flat = list(inputs[0]) if opdef.variadic else list(inputs)
    if any(_strided_by(a, how) for a in H.flat_inputs(opdef, sample)):
        assert any(not v.is_contiguous() for v in flat), f"{name} ({how}): all contiguous"
    outs = H.as_tuple(_call(opdef, inputs, dict(sample.attrs)))
    assert len(outs) == len(t_outs)
    for k, (o, e) in enumerate(zip(outs, t_outs)):
        rtol, atol = H.tolerance(sample, o.dtype.name)
        H.assert_close(H.host(o), H.host(e), rtol, atol, f"{name} ({how}) output {k}")
    if not grad:
        return
    rng = np.random.default_rng(i)
    roots = [(o, rng.standard_normal(tuple(o.shape))) for o in outs]
    roots = [(o, c, e) for (o, c), e in zip(roots, t_outs) if o.requires_grad and e.requires_grad]
    if not roots:
        return
    flow.autograd.backward([o for o, _, _ in roots],
                           [flow.tensor(c, dtype=o.dtype) for o, c, _ in roots])
    torch.autograd.backward([e for _, _, e in roots],
                            [torch.from_numpy(c).to(e.dtype) for _, c, e in roots])
    for k, (a, b) in enumerate(zip(leaves, t_leaves)):
        if not b.is_floating_point():
            continue
        if b.grad is None:
            assert a.grad is None or not np.any(H.host(a.grad)), f"input {k}: torch has none"
            continue
        assert a.grad is not None, f"{name} ({how}): input {k} got no gradient"
        rtol, atol = H.tolerance(sample, a.dtype.name)
        H.assert_close(H.host(a.grad), H.host(b.grad), rtol * 10, atol * 10,
                       f"{name} ({how}) grad of input {k}")


def test_language_model_inputs_sliced_from_one_token_batch_train_as_in_torch():
    """The report: `emb(idx[:, :-1])` (every language model's input) failed in backward,
    because embedding_grad reshaped the sliced index in place."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 11, (4, 9))
    w = rng.standard_normal((11, 5))
    results = []
    for fw in (flow, torch):
        idx = fw.tensor(tokens)
        emb = fw.nn.Embedding(11, 5)
        with fw.no_grad():
            emb.weight.copy_(fw.tensor(w, dtype=emb.weight.dtype))
        x, y = idx[:, :-1], idx[:, 1:]  # non-contiguous slices
        logits = emb(x) @ emb.weight.t()
        loss = fw.nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
        loss.backward()
        results.append((loss.item(), emb.weight.grad.numpy()))
    (loss, grad), (t_loss, t_grad) = results
    np.testing.assert_allclose(loss, t_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, t_grad, rtol=1e-4, atol=1e-6)
