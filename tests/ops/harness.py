"""Shared machinery for the registry-driven op tests.

Converts samples to sbpflow and torch tensors, calls an op's torch reference, and simulates
SBP shards of a sample in one process (the validator).
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import torch

import sbpflow as flow
from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext
from sbpflow.sbp import B, P, Signature, Split

TOL = {
    "float64": (1e-7, 1e-7),
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (2e-2, 2e-2),
}


def op_samples(name: str):
    opdef = registry.get(name)
    if opdef.samples is None:
        return []
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return list(opdef.samples(rng))


def all_cases(filter_fn=lambda opdef, s: True):
    cases = []
    for name in registry.list_ops():
        opdef = registry.get(name)
        for i, s in enumerate(op_samples(name)):
            if filter_fn(opdef, s):
                cases.append((name, i))
    return cases


def flat_inputs(opdef, sample):
    return list(sample.inputs[0]) if opdef.variadic else list(sample.inputs)


def to_flow(opdef, sample, device="cpu", requires_grad=False):
    def conv(a):
        t = flow.tensor(a, device=device)
        if requires_grad and t.dtype.is_floating_point:
            t.requires_grad_()
        return t

    if opdef.variadic:
        return (tuple(conv(a) for a in sample.inputs[0]),)
    return tuple(conv(a) for a in sample.inputs)


def to_torch_tensor(a, requires_grad=False):
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    else:
        t = torch.from_numpy(a.copy())
    if requires_grad and t.is_floating_point():
        t.requires_grad_()
    return t


def to_torch_inputs(opdef, sample, requires_grad=False):
    if opdef.variadic:
        return ([to_torch_tensor(a, requires_grad) for a in sample.inputs[0]],)
    return tuple(to_torch_tensor(a, requires_grad) for a in sample.inputs)


def torch_attrs(attrs):
    out = {}
    for k, v in attrs.items():
        out[k] = getattr(torch, v.name) if isinstance(v, dt.DType) else v
    return out


def resolve_reference(ref):
    if callable(ref):
        return lambda *a, **k: ref(torch, *a, **k)
    obj = torch
    try:
        for part in ref.split("."):
            obj = getattr(obj, part)
        return obj
    except AttributeError:
        pass
    obj = torch.nn.functional
    for part in ref.split("."):
        obj = getattr(obj, part)
    return obj


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def host(x):
    """A float64/int NumPy copy of a tensor (either framework) for comparison."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy().copy()
    a = x.detach()._host()
    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    return np.array(a, copy=True)


def tolerance(sample, dtype_name):
    rtol, atol = TOL.get(dtype_name, (0, 0))
    return (sample.rtol if sample.rtol is not None else rtol,
            sample.atol if sample.atol is not None else atol)


def assert_close(actual, expected, rtol, atol, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind in "fc" or expected.dtype.kind in "fc":
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


# -- SBP validator ----------------------------------------------------------------------------
def _split_bounds(n: int, parts: int):
    """torch.tensor_split / OneFlow balanced splitter: the first ranks get one more."""
    q, r = divmod(n, parts)
    sizes = [q + (i < r) for i in range(parts)]
    starts = np.cumsum([0] + sizes[:-1])
    return [(int(s), int(s + z)) for s, z in zip(starts, sizes)]


def _piece(arr, sbp, rank, n, rng, partial_parts):
    if isinstance(sbp, Split):
        lo, hi = _split_bounds(arr.shape[sbp.axis], n)[rank]
        key = [slice(None)] * arr.ndim
        key[sbp.axis] = slice(lo, hi)
        return arr[tuple(key)]
    if sbp == B:
        return arr
    return partial_parts[rank]


def _partial_parts(arr, n, rng):
    """n random arrays that sum to arr."""
    if arr.dtype == np.bool_:
        return None
    if arr.dtype.kind in "iu":
        parts = [rng.integers(-3, 4, size=arr.shape).astype(arr.dtype) for _ in range(n - 1)]
    else:
        parts = [rng.standard_normal(arr.shape).astype(arr.dtype) for _ in range(n - 1)]
    last = arr - sum(parts) if parts else arr
    return parts + [np.asarray(last).astype(arr.dtype)]


def _local_meta(meta: TensorMeta, sbp, rank, n):
    if isinstance(sbp, Split):
        lo, hi = _split_bounds(meta.shape[sbp.axis], n)[rank]
        shape = list(meta.shape)
        shape[sbp.axis] = hi - lo
        piece = [slice(0, s) for s in meta.shape]
        piece[sbp.axis] = slice(lo, hi)
        return TensorMeta(tuple(shape), meta.dtype), tuple(piece)
    return meta, tuple(slice(0, s) for s in meta.shape)


def run_kernel(opdef, arrays, in_metas, attrs, out_metas, logical_in=None, logical_out=None,
               pieces=None):
    prims = flow.device("cpu").prims
    ctx = KernelContext(prims, opdef.name, tuple(in_metas), tuple(out_metas),
                        None if logical_in is None else tuple(logical_in),
                        None if logical_out is None else tuple(logical_out),
                        pieces, seed=1234, offset=0)
    arrays = [np.array(a, copy=True) for a in arrays]
    res = opdef.kernel(ctx, arrays, **attrs) if opdef.variadic else opdef.kernel(
        ctx, *arrays, **attrs)
    return [np.asarray(r) for r in as_tuple(res)] if len(out_metas) > 1 else [np.asarray(res)]


def _valid_for(sig, metas, n, out_metas=()):
    """Whether sig applies on n ranks: splits at least n long, and even where it says so
    (`Signature.even` indexes inputs, then outputs)."""
    for sbp, m in zip(sig.inputs, metas):
        if isinstance(sbp, Split) and (sbp.axis >= m.ndim or m.shape[sbp.axis] < n):
            return False
    tensors = list(zip(sig.inputs, metas)) + list(zip(sig.outputs, out_metas))
    for i in sig.even:
        if i >= len(tensors):
            return False  # an output's evenness cannot be checked without its meta
        sbp, m = tensors[i]
        if isinstance(sbp, Split) and m.shape[sbp.axis] % n:
            return False
    return True


def shard_outputs(opdef, arrays, metas, attrs, in_sbps, n, rng):
    """Run the kernel on n simulated ranks; returns per-rank outputs, or None if impossible."""
    out_logical = opdef.meta(tuple(metas), attrs)
    parts = [_partial_parts(a, n, rng) if s == P else None for a, s in zip(arrays, in_sbps)]
    if any(s == P and p is None for s, p in zip(in_sbps, parts)):
        return None, out_logical
    per_rank = []
    for r in range(n):
        local_arrays = [_piece(a, s, r, n, rng, p) for a, s, p in zip(arrays, in_sbps, parts)]
        local_metas = [TensorMeta(tuple(np.shape(a)), m.dtype)
                       for a, m in zip(local_arrays, metas)]
        per_rank.append((r, local_arrays, local_metas))
    return per_rank, out_logical


def combine(outs_per_rank, sbp, meta, n):
    if isinstance(sbp, Split):
        return np.concatenate(outs_per_rank, axis=sbp.axis)
    if sbp == B:
        for o in outs_per_rank[1:]:
            if o.shape != outs_per_rank[0].shape or not np.array_equal(
                o, outs_per_rank[0], equal_nan=True
            ):
                return None
        return outs_per_rank[0]
    total = outs_per_rank[0].astype(np.float64) if outs_per_rank[0].dtype.kind == "f" else \
        outs_per_rank[0]
    for o in outs_per_rank[1:]:
        total = total + o
    return total


def check_signature(opdef, arrays, metas, attrs, sig, n, rng):
    """True when running sig's shards and combining per the output SBPs equals the result.

    Returns (ok, detail)."""
    full = run_kernel(opdef, arrays, metas, attrs, opdef.meta(tuple(metas), attrs))
    per_rank, out_logical = shard_outputs(opdef, arrays, metas, attrs, sig.inputs, n, rng)
    if per_rank is None:
        return False, "P on a bool input"
    outs = []
    for r, local_arrays, local_metas in per_rank:
        locals_out, pieces = zip(*[_local_meta(m, s, r, n)
                                   for m, s in zip(out_logical, sig.outputs)])
        try:
            res = run_kernel(opdef, local_arrays, local_metas, attrs, locals_out, metas,
                             out_logical, pieces)
        except Exception as e:  # a signature whose pieces the kernel cannot run is false
            return False, f"kernel raised on rank {r}: {type(e).__name__}: {e}"
        outs.append(res)
    for i, (sbp, m) in enumerate(zip(sig.outputs, out_logical)):
        pieces = [o[i] for o in outs]
        try:
            got = combine(pieces, sbp, m, n)
        except ValueError as e:
            return False, f"output {i}: cannot combine: {e}"
        if got is None:
            return False, f"output {i}: ranks disagree for B"
        exp = full[i]
        if got.shape != exp.shape:
            return False, f"output {i}: shape {got.shape} != {exp.shape}"
        if exp.dtype.kind == "f" or (exp.dtype.name == "bfloat16"):
            a, b = got.astype(np.float64), exp.astype(np.float64)
            rtol = 1e-6 if exp.dtype == np.float64 else 1e-3
            if not np.allclose(a, b, rtol=rtol, atol=rtol, equal_nan=True):
                return False, f"output {i}: values differ (max err {np.nanmax(np.abs(a - b))})"
        elif not np.array_equal(got, exp):
            return False, f"output {i}: values differ"
    return True, ""


def candidate_sbps(meta: TensorMeta):
    return [B, P] + [Split(i) for i in range(meta.ndim) if meta.shape[i] > 1]


def missing_signatures(opdef, arrays, metas, attrs, declared, rng, limit=400):
    """Signatures that hold on 2 and 3 simulated ranks but that the op does not declare."""
    out_logical = opdef.meta(tuple(metas), attrs)
    in_choices = [candidate_sbps(m) for m in metas]
    out_choices = [candidate_sbps(m) for m in out_logical]
    declared = set(declared)
    found = []
    combos = list(itertools.product(*in_choices))[:limit]
    for ins in combos:
        if all(s == B for s in ins) and metas:
            continue
        for outs in itertools.product(*out_choices):
            sig = Signature(tuple(ins), tuple(outs))
            if sig in declared or any(s == P for s in ins if False):
                continue
            if not (_valid_for(sig, metas, 2) and _valid_for(sig, metas, 3)):
                continue
            if all(check_signature(opdef, arrays, metas, attrs, sig, n, rng)[0]
                   for n in (2, 3)):
                found.append(sig)
    return found
