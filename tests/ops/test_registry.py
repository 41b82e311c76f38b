"""Tests generated from the op registry: every op, every sample.

- forward against torch 2.13, plus meta/kernel agreement and no aliasing of inputs;
- backward against torch;
- finite-difference gradients in float64;
- the SBP rule validator on 2 and 3 simulated ranks (zero false rules), with a report of
  plausible signatures that ops do not declare;
- a run on the `mock` device, whose opaque arrays prove kernels use primitives only.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.device import primitives
from sbpflow.framework.interpreter import apply
from sbpflow.ops import registry

from . import harness as H

ALL = H.all_cases()
NONRANDOM = H.all_cases(lambda opdef, s: not opdef.random)
GRAD = H.all_cases(
    lambda opdef, s: s.grad and opdef.grad is not None and not opdef.random
    and any(np.asarray(a).dtype.kind == "f" for a in H.flat_inputs(opdef, s))
)
GRAD64 = [c for c in GRAD if any(
    np.asarray(a).dtype == np.float64
    for a in H.flat_inputs(registry.get(c[0]), H.op_samples(c[0])[c[1]])
)]


def _ids(cases):
    return [f"{n}-{i}" for n, i in cases]


def _case(name, i):
    return registry.get(name), H.op_samples(name)[i]


def test_registry_size():
    names = registry.list_ops()
    assert len(names) >= 150, f"only {len(names)} ops registered"
    for n in names:
        opdef = registry.get(n)
        assert opdef.samples is not None, f"{n} has no samples"
        assert opdef.reference is not None, f"{n} has no torch reference"


def test_grad_rules_declare_what_they_save():
    """Autograd keeps only the declared inputs and outputs alive; the backward tests below
    then fail loudly where a rule reads anything else."""
    undeclared = [n for n in registry.list_ops()
                  if registry.get(n).grad is not None and registry.get(n).saves is None]
    assert not undeclared, f"ops with a grad rule but no `saves`: {undeclared}"
    mul, exp = registry.get("mul"), registry.get("exp")
    assert mul.saved_input_indices(2) == (0, 1) and mul.saved_output_indices(1) == ()
    assert exp.saved_input_indices(1) == () and exp.saved_output_indices(1) == (0,)
    assert registry.get("index").saved_input_indices(4) == (1, 2, 3)


@pytest.mark.parametrize("name,i", NONRANDOM, ids=_ids(NONRANDOM))
def test_forward_matches_torch(name, i):
    opdef, sample = _case(name, i)
    inputs = H.to_flow(opdef, sample)
    out = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
    metas = opdef.meta(tuple(t._meta for t in H.flat_inputs(opdef, type(sample)(*inputs))
                             ) if False else tuple(
        t._meta for t in (list(inputs[0]) if opdef.variadic else inputs)), opdef.bind_attrs(
        dict(sample.attrs)))
    ref = H.resolve_reference(opdef.reference)
    expected = H.as_tuple(ref(*H.to_torch_inputs(opdef, sample), **H.torch_attrs(sample.attrs)))
    assert len(out) == len(expected) == len(metas)
    flat_in = list(inputs[0]) if opdef.variadic else list(inputs)
    for k, (o, e, m) in enumerate(zip(out, expected, metas)):
        assert tuple(o.shape) == tuple(e.shape), f"output {k} shape"
        assert o.dtype.name == str(e.dtype).replace("torch.", ""), f"output {k} dtype"
        assert o._meta == m, f"output {k}: tensor meta {o._meta} != inferred {m}"
        host = o._host()
        assert host.shape == m.shape and host.dtype == m.dtype.np, (
            f"output {k}: kernel produced {host.dtype}{list(host.shape)}, meta says {m}")
        if not opdef.view:
            for t in flat_in:
                assert not np.shares_memory(host, t._host()), f"output {k} aliases an input"
        rtol, atol = H.tolerance(sample, o.dtype.name)
        H.assert_close(H.host(o), H.host(e), rtol, atol, f"{name} output {k}")


def _cotangents(outs, seed):
    """Standard normal upstream gradients for the outputs that carry one (floating, and not
    an op's nondiff workspace: those never require grad)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(o.shape)) if o.requires_grad else None for o in outs]


@pytest.mark.parametrize("name,i", GRAD, ids=_ids(GRAD))
def test_backward_matches_torch(name, i):
    opdef, sample = _case(name, i)
    inputs = H.to_flow(opdef, sample, requires_grad=True)
    flat = list(inputs[0]) if opdef.variadic else list(inputs)
    outs = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
    cots = _cotangents(outs, i)
    roots = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
    if not roots:
        pytest.fail(f"{name}: sample marked grad=True but no output requires grad")
    flow.autograd.backward([o for o, _ in roots],
                           [flow.tensor(c, dtype=o.dtype) for o, c in roots])

    t_inputs = H.to_torch_inputs(opdef, sample, requires_grad=True)
    t_flat = list(t_inputs[0]) if opdef.variadic else list(t_inputs)
    ref = H.resolve_reference(opdef.reference)
    t_outs = H.as_tuple(ref(*t_inputs, **H.torch_attrs(sample.attrs)))
    t_roots = [(o, torch.from_numpy(c).to(o.dtype)) for o, c in zip(t_outs, cots)
               if c is not None and o.requires_grad]
    torch.autograd.backward([o for o, _ in t_roots], [c for _, c in t_roots])
    for k, (a, b) in enumerate(zip(flat, t_flat)):
        if not b.is_floating_point():
            continue
        if b.grad is None:
            assert a.grad is None or not np.any(H.host(a.grad)), f"input {k}: torch has no grad"
            continue
        assert a.grad is not None, f"{name}: input {k} got no gradient"
        assert a.grad.dtype == a.dtype, f"input {k}: grad dtype {a.grad.dtype} != {a.dtype}"
        rtol, atol = H.tolerance(sample, a.dtype.name)
        H.assert_close(H.host(a.grad), H.host(b.grad), rtol * 10, atol * 10,
                       f"{name} grad of input {k}")


def _float_positions(opdef, sample):
    return [k for k, a in enumerate(H.flat_inputs(opdef, sample))
            if np.asarray(a).dtype.kind == "f"]


MULTI = [c for c in GRAD if len(_float_positions(registry.get(c[0]),
                                                 H.op_samples(c[0])[c[1]])) > 1]


@pytest.mark.parametrize("name,i", MULTI, ids=_ids(MULTI))
def test_backward_with_one_input_requiring_grad(name, i):
    """A rule may read an input only for another input's gradient (`saves=("other for
    input",)`): with one input requiring grad, its gradient equals the all-inputs one."""
    opdef, sample = _case(name, i)

    def grads(want):
        inputs = H.to_flow(opdef, sample)
        flat = list(inputs[0]) if opdef.variadic else list(inputs)
        for k in want:
            flat[k].requires_grad_()
        outs = H.as_tuple(apply(opdef, inputs, dict(sample.attrs)))
        roots = [(o, c) for o, c in zip(outs, _cotangents(outs, i))
                 if c is not None and o.requires_grad]
        if roots:
            flow.autograd.backward([o for o, _ in roots],
                                   [flow.tensor(c, dtype=o.dtype) for o, c in roots])
        return [None if t.grad is None else H.host(t.grad) for t in flat]

    floats = _float_positions(opdef, sample)
    full = grads(floats)
    for k in floats:
        alone = grads([k])[k]
        if full[k] is None:
            assert alone is None or not np.any(alone), f"{name}: input {k} alone got a grad"
            continue
        assert alone is not None, f"{name}: input {k} alone got no gradient"
        rtol, atol = H.tolerance(sample, str(alone.dtype))
        H.assert_close(alone, full[k], rtol, atol, f"{name} grad of input {k} alone")


@pytest.mark.parametrize("name,i", GRAD64, ids=_ids(GRAD64))
def test_gradient_finite_differences(name, i):
    opdef, sample = _case(name, i)
    attrs = dict(sample.attrs)
    inputs = H.to_flow(opdef, sample, requires_grad=True)
    flat = list(inputs[0]) if opdef.variadic else list(inputs)
    outs = H.as_tuple(apply(opdef, inputs, attrs))
    cots = _cotangents(outs, 100 + i)
    roots = [(o, c) for o, c in zip(outs, cots) if c is not None and o.requires_grad]
    flow.autograd.backward([o for o, _ in roots], [flow.tensor(c) for _, c in roots])

    arrays = [np.array(a, dtype=np.asarray(a).dtype, copy=True) for a in H.flat_inputs(opdef,
                                                                                    sample)]

    def objective(arrs):
        with flow.no_grad():
            ins = tuple(flow.tensor(a) for a in arrs)
            res = H.as_tuple(apply(opdef, (ins,) if opdef.variadic else ins, attrs))
        return sum(float(np.sum(H.host(o).astype(np.float64) * c))
                   for o, c in zip(res, cots) if c is not None)

    rng = np.random.default_rng(7)
    eps = 1e-6
    for k, a in enumerate(arrays):
        if a.dtype != np.float64 or flat[k].grad is None:
            continue
        analytic = H.host(flat[k].grad).ravel()
        idx = np.arange(a.size)
        if a.size > 48:
            idx = rng.choice(a.size, 48, replace=False)
        for j in idx:
            plus = [x.copy() for x in arrays]
            minus = [x.copy() for x in arrays]
            plus[k].flat[j] += eps
            minus[k].flat[j] -= eps
            numeric = (objective(plus) - objective(minus)) / (2 * eps)
            assert abs(numeric - analytic[j]) <= 1e-5 + 1e-4 * abs(numeric), (
                f"{name} input {k} element {j}: analytic {analytic[j]} numeric {numeric}")


SBP_CASES = H.all_cases(lambda opdef, s: opdef.sbp is not None)


@pytest.mark.parametrize("name,i", SBP_CASES, ids=_ids(SBP_CASES))
def test_sbp_signatures_hold(name, i):
    opdef, sample = _case(name, i)
    attrs = opdef.bind_attrs(dict(sample.attrs))
    arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
    metas = [flow.tensor(a)._meta for a in arrays]
    sigs = opdef.signatures(tuple(metas), attrs)
    assert sigs, f"{name} declares no signatures"
    rng = np.random.default_rng(3)
    false_rules = []
    out_metas = opdef.meta(tuple(metas), attrs)
    for sig in sigs:
        assert len(sig.inputs) == len(metas), f"{sig}: wrong number of input SBPs"
        for n in (2, 3):
            if not H._valid_for(sig, metas, n, out_metas):
                continue
            ok, detail = H.check_signature(opdef, arrays, metas, attrs, sig, n, rng)
            if not ok:
                false_rules.append(f"{sig} on {n} ranks: {detail}")
    assert not false_rules, f"{name}: false SBP rules:\n" + "\n".join(false_rules)


MISSING_CASES = [(n, i) for n, i in SBP_CASES if i == 0]


@pytest.mark.parametrize("name,i", MISSING_CASES, ids=_ids(MISSING_CASES))
def test_sbp_missing_report(name, i, sbp_report):
    """Search all 1-D signatures; record the plausible ones the op does not declare."""
    opdef, sample = _case(name, i)
    attrs = opdef.bind_attrs(dict(sample.attrs))
    arrays = [np.asarray(a) for a in H.flat_inputs(opdef, sample)]
    if sum(a.ndim for a in arrays) > 8 or len(arrays) > 3:
        return  # the search space is too large to enumerate quickly
    metas = [flow.tensor(a)._meta for a in arrays]
    declared = opdef.signatures(tuple(metas), attrs)
    found = H.missing_signatures(opdef, arrays, metas, attrs, declared,
                                 np.random.default_rng(5))
    # Partial outputs that hold only because the value is all zeros are not interesting.
    if found:
        sbp_report.append(f"{name} {sample}: " + ", ".join(map(repr, found)))
    # A declared signature that the search reproduces is consistent with the validator.
    assert all(s not in declared for s in found)


@pytest.mark.parametrize("name,i", ALL, ids=_ids(ALL))
def test_mock_device_uses_primitives_only(name, i):
    opdef, sample = _case(name, i)
    prims = primitives("mock")
    before = sum(prims.calls.values())
    inputs = H.to_flow(opdef, sample, device="mock", requires_grad=sample.grad)
    kwargs = {"device": "mock"} if not H.flat_inputs(opdef, sample) else {}
    out = H.as_tuple(apply(opdef, inputs, dict(sample.attrs), **kwargs))
    flow.synchronize()  # kernels run on the VM's worker: wait before counting their calls
    assert sum(prims.calls.values()) > before, f"{name}: no primitive was called"
    if not opdef.random:
        cpu = H.as_tuple(apply(opdef, H.to_flow(opdef, sample), dict(sample.attrs)))
        for o, c in zip(out, cpu):
            H.assert_close(H.host(o), H.host(c), 0, 0, f"{name} mock vs cpu")
    roots = [o for o in out if o.requires_grad]
    if roots and opdef.grad is not None:
        flow.autograd.backward(roots, [flow.ones(*o.shape, dtype=o.dtype, device="mock")
                                       for o in roots])
