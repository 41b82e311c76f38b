"""Matrix products beyond the registry samples: the functional forms, einsum's parser and its
equation forms, gradients (first and second order) against torch, and torch's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow


def _pair(rng, *shape, requires_grad=True):
    a = rng.standard_normal(shape)
    return (flow.tensor(a, requires_grad=requires_grad),
            torch.tensor(a, requires_grad=requires_grad))


def _close(f, t, rtol=1e-10, atol=1e-10):
    f = f.detach().numpy() if isinstance(f, flow.Tensor) else f
    t = t.detach().numpy() if isinstance(t, torch.Tensor) else t
    assert np.shape(f) == np.shape(t)
    np.testing.assert_allclose(f, t, rtol=rtol, atol=atol)


def _check_forward_backward(fn_flow, fn_torch, shapes, seed=0):
    """Forward, first gradients and a second-order gradient against torch."""
    rng = np.random.default_rng(seed)
    pairs = [_pair(rng, *s) for s in shapes]
    fs, ts = [p[0] for p in pairs], [p[1] for p in pairs]
    out_f, out_t = fn_flow(*fs), fn_torch(*ts)
    _close(out_f, out_t)
    cot = rng.standard_normal(tuple(out_t.shape))
    grads_f = flow.autograd.grad(out_f, fs, flow.tensor(cot), create_graph=True)
    grads_t = torch.autograd.grad(out_t, ts, torch.tensor(cot), create_graph=True)
    for gf, gt in zip(grads_f, grads_t, strict=True):
        _close(gf, gt)
    if not grads_t[0].requires_grad:
        return  # a gradient constant in the inputs (a linear op's): nothing of second order
    # d/d inputs of sum(grad_0 ** 2): exercises the grad rules' own differentiability.
    second_f = flow.autograd.grad((grads_f[0] * grads_f[0]).sum(), fs, allow_unused=True)
    second_t = torch.autograd.grad((grads_t[0] * grads_t[0]).sum(), ts, allow_unused=True)
    for gf, gt in zip(second_f, second_t, strict=True):
        if gt is None:
            assert gf is None or not np.any(gf.numpy())
        else:
            _close(gf, gt)


# -- products ---------------------------------------------------------------------------------
PRODUCTS = {
    "mm": (lambda m: m.mm, [(3, 4), (4, 5)]),
    "bmm": (lambda m: m.bmm, [(2, 3, 4), (2, 4, 5)]),
    "dot": (lambda m: m.dot, [(6,), (6,)]),
    "outer": (lambda m: m.outer, [(3,), (4,)]),
    "mv": (lambda m: m.mv, [(3, 4), (4,)]),
    "matmul_1d_3d": (lambda m: m.matmul, [(4,), (2, 4, 3)]),
    "matmul_3d_1d": (lambda m: m.matmul, [(2, 3, 4), (4,)]),
    "matmul_broadcast": (lambda m: m.matmul, [(2, 1, 3, 4), (5, 4, 2)]),
    "matmul_1d_1d": (lambda m: m.matmul, [(4,), (4,)]),
    "tensordot_2": (lambda m: m.tensordot, [(2, 3, 4), (3, 4, 5)]),
    "tensordot_lists": (lambda m: lambda a, b: m.tensordot(a, b, dims=([1, 0], [2, 0])),
                        [(3, 2, 4), (3, 5, 2)]),
    "tensordot_0": (lambda m: lambda a, b: m.tensordot(a, b, dims=0), [(2, 3), (4,)]),
    "addmm": (lambda m: lambda x, a, b: m.addmm(x, a, b, beta=0.5, alpha=2.0),
              [(4,), (3, 5), (5, 4)]),
    "baddbmm": (lambda m: lambda x, a, b: m.baddbmm(x, a, b, beta=-1.0),
                [(2, 3, 1), (2, 3, 4), (2, 4, 5)]),
    "addmv": (lambda m: lambda x, a, b: m.addmv(x, a, b, alpha=3),
              [(3,), (3, 4), (4,)]),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_products_against_torch(name):
    make, shapes = PRODUCTS[name]
    _check_forward_backward(make(flow), make(torch), shapes)


def test_tensor_methods_and_operators():
    rng = np.random.default_rng(1)
    a, ta = _pair(rng, 3, 4, requires_grad=False)
    b, tb = _pair(rng, 4, 2, requires_grad=False)
    v, tv = _pair(rng, 4, requires_grad=False)
    _close(a.mm(b), ta.mm(tb))
    _close(a @ b, ta @ tb)
    _close(a.mv(v), ta.mv(tv))
    _close(v.dot(v), tv.dot(tv))
    _close(v.outer(v), tv.outer(tv))
    _close(a.matmul(b), ta.matmul(tb))
    _close(a.addmm(a, flow.eye(4, dtype=flow.float64)),
           ta.addmm(ta, torch.eye(4, dtype=torch.float64)))


def test_addmm_with_beta_zero_ignores_nan_input():
    a = np.ones((2, 3))
    b = np.ones((3, 2))
    x = np.full((2, 2), np.nan)
    f = flow.addmm(flow.tensor(x), flow.tensor(a), flow.tensor(b), beta=0)
    t = torch.addmm(torch.tensor(x), torch.tensor(a), torch.tensor(b), beta=0)
    _close(f, t)


def test_outer_promotes_dtypes_like_torch():
    for da, db in (("int64", "float32"), ("float32", "float64"), ("int32", "int64")):
        a = np.arange(3).astype(da)
        b = np.arange(2).astype(db)
        f = flow.outer(flow.tensor(a), flow.tensor(b))
        t = torch.outer(torch.tensor(a), torch.tensor(b))
        assert f.dtype.name == str(t.dtype).replace("torch.", "")
        _close(f.numpy().astype(np.float64), t.numpy().astype(np.float64))


ERRORS = {
    "mm_1d": lambda m: m.mm(m.ones(3), m.ones(3, 3)),
    "mm_shapes": lambda m: m.mm(m.ones(2, 3), m.ones(4, 5)),
    "mm_dtypes": lambda m: m.mm(m.ones(2, 3), m.ones(3, 5, dtype=m.float64)),
    "bmm_2d": lambda m: m.bmm(m.ones(2, 3), m.ones(3, 5)),
    "bmm_batch": lambda m: m.bmm(m.ones(2, 2, 3), m.ones(3, 3, 5)),
    "dot_2d": lambda m: m.dot(m.ones(3, 1), m.ones(3)),
    "dot_sizes": lambda m: m.dot(m.ones(3), m.ones(4)),
    "dot_dtypes": lambda m: m.dot(m.ones(3), m.ones(3, dtype=m.float64)),
    "outer_2d": lambda m: m.outer(m.ones(3), m.ones(3, 2)),
    "matmul_0d": lambda m: m.matmul(m.ones(()), m.ones(3)),
    "matmul_sizes_2d_1d": lambda m: m.matmul(m.ones(2, 3), m.ones(4)),
    "matmul_sizes_1d_1d": lambda m: m.matmul(m.ones(3), m.ones(4)),
    "matmul_batch": lambda m: m.matmul(m.ones(2, 3, 4), m.ones(3, 4, 6)),
    "mv_shapes": lambda m: m.mv(m.ones(2, 3), m.ones(3, 1)),
    "tensordot_sizes": lambda m: m.tensordot(m.ones(2, 3), m.ones(4, 5), dims=1),
    "einsum_sizes": lambda m: m.einsum("ij,jk->ik", m.ones(2, 3), m.ones(4, 5)),
    "einsum_too_few": lambda m: m.einsum("ij,jk", m.ones(2, 3)),
    "einsum_too_many": lambda m: m.einsum("a", m.ones(2), m.ones(2)),
    "einsum_unknown_output": lambda m: m.einsum("ij->ik", m.ones(2, 3)),
    "einsum_ndim": lambda m: m.einsum("ijk->ij", m.ones(2, 3)),
    "einsum_ndim_ellipsis": lambda m: m.einsum("ijk...->ij", m.ones(2, 3)),
    "einsum_repeated_sizes": lambda m: m.einsum("ii->i", m.ones(2, 3)),
    "einsum_repeated_output": lambda m: m.einsum("ij->jj", m.ones(2, 3)),
    "einsum_bad_char": lambda m: m.einsum("i1->i", m.ones(2, 3)),
    "einsum_dot": lambda m: m.einsum("a.b", m.ones(2, 3)),
    "einsum_two_ellipses": lambda m: m.einsum("...a...", m.ones(2, 3)),
    "einsum_ellipsis_sizes": lambda m: m.einsum("...ab,...b->...a", m.ones(4, 2, 3),
                                                m.ones(5, 2, 3)),
    "einsum_dtypes": lambda m: m.einsum("ij,jk->ik", m.ones(2, 3),
                                        m.ones(3, 5, dtype=m.float64)),
    "einsum_no_operand": lambda m: m.einsum("ij"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_as_torch(name):
    call = ERRORS[name]
    with pytest.raises(Exception) as expected:
        call(torch)
    with pytest.raises(type(expected.value)):
        call(flow)


def test_error_messages_name_op_and_sizes():
    with pytest.raises(RuntimeError, match=r"mm\(\).*2x3 and 4x5"):
        flow.mm(flow.ones(2, 3), flow.ones(4, 5))
    with pytest.raises(RuntimeError, match=r"einsum\(\).*subscript j has size 4 for operand 1"):
        flow.einsum("ij,jk->ik", flow.ones(2, 3), flow.ones(4, 5))
    with pytest.raises(RuntimeError, match=r"einsum\(\).*index 1 "):
        flow.einsum("i1->i", flow.ones(2, 3))


# -- einsum -----------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ba,ab", [(3, 4), (4, 3)]),  # implicit output sorts the free letters: none here
    ("Ab,bA", [(2, 3), (3, 2)]),
    ("iB,Bj", [(2, 3), (3, 4)]),  # implicit: uppercase before lowercase (torch's order)
    ("ii", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("iij->j", [(3, 3, 2)]),
    ("iji->ij", [(3, 2, 3)]),
    ("ij->", [(3, 4)]),
    ("ijk->kij", [(2, 3, 4)]),
    ("...ij->...ji", [(2, 5, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("i...,i...->...", [(3, 2, 4), (3, 1, 4)]),
    ("...,...->...", [(2, 3), (3,)]),
    ("...i->i", [(2, 3, 4)]),
    ("ij,ij->ij", [(3, 4), (1, 4)]),
    ("ij,jk->ik", [(2, 1), (3, 5)]),
    ("ij,j->i", [(2, 3), (1,)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]),
    ("i,i,i->", [(5,), (5,), (5,)]),
    ("i,j,k->ijk", [(2,), (3,), (4,)]),
    ("ab,ab,ab->b", [(2, 3), (2, 3), (1, 3)]),
    ("bii,bj->bij", [(2, 3, 3), (2, 4)]),
    (",i->i", [(), (4,)]),
    (",->", [(), ()]),
    ("i->i", [(0,)]),
    ("ij,jk->ik", [(2, 0), (0, 3)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum_against_torch(equation, shapes):
    _check_forward_backward(lambda *xs: flow.einsum(equation, *xs),
                            lambda *xs: torch.einsum(equation, *xs), shapes)


def test_einsum_calling_forms():
    rng = np.random.default_rng(2)
    a, ta = _pair(rng, 2, 3, requires_grad=False)
    b, tb = _pair(rng, 3, 4, requires_grad=False)
    expected = torch.einsum("ij,jk->ik", ta, tb)
    _close(flow.einsum("ij,jk->ik", [a, b]), expected)
    _close(flow.einsum("ij,jk->ik", (a, b)), expected)
    _close(flow.einsum(a, [0, 1], b, [1, 2], [0, 2]), expected)
    _close(flow.einsum(a, [0, 1], b, [1, 2]), torch.einsum(ta, [0, 1], tb, [1, 2]))
    c, tc = _pair(rng, 3, 2, requires_grad=False)
    _close(flow.einsum(a, [Ellipsis, 1], c, [1, Ellipsis]),
           torch.einsum(ta, [Ellipsis, 1], tc, [1, Ellipsis]))
    _close(flow.einsum(" i j , j k -> k i ", a, b), torch.einsum(" i j , j k -> k i ", ta, tb))


def test_einsum_output_is_fresh_memory_and_dtype_kept():
    x = flow.tensor(np.arange(6.0).reshape(2, 3))
    y = flow.einsum("ij->ji", x)
    assert not np.shares_memory(y.numpy(), x.numpy())
    x.add_(1.0)
    np.testing.assert_array_equal(y.numpy(), np.arange(6.0).reshape(2, 3).T)
    for dtype in ("float32", "float16", "int64"):
        a = np.arange(6).reshape(2, 3).astype(dtype)
        f = flow.einsum("ij,kj->ik", flow.tensor(a), flow.tensor(a))
        t = torch.einsum("ij,kj->ik", torch.tensor(a), torch.tensor(a))
        assert f.dtype.name == dtype
        np.testing.assert_allclose(f.numpy().astype(np.float64), t.numpy().astype(np.float64))
    # A single integer operand summed as torch.sum does: int64.
    i32 = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert flow.einsum("ij->i", flow.tensor(i32)).dtype.name == str(
        torch.einsum("ij->i", torch.tensor(i32)).dtype).replace("torch.", "")


def _random_equation(rng):
    letters = "abcdE"
    sizes = {c: int(rng.integers(1, 4)) for c in letters}
    terms, shapes = [], []
    for _ in range(int(rng.integers(1, 4))):
        term = "".join(rng.choice(list(letters), int(rng.integers(0, 4))))
        terms.append(term)
        shapes.append(tuple(sizes[c] for c in term))
    used = sorted(set("".join(terms)))
    if rng.random() < 0.5:
        return ",".join(terms), shapes
    out = "".join(rng.permutation([c for c in used if rng.random() < 0.5]))
    return ",".join(terms) + "->" + out, shapes


def test_einsum_random_equations_against_torch():
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(150):
        equation, shapes = _random_equation(rng)
        arrays = [rng.standard_normal(s) for s in shapes]
        ts = [torch.tensor(a, requires_grad=True) for a in arrays]
        fs = [flow.tensor(a, requires_grad=True) for a in arrays]
        ref = torch.einsum(equation, *ts)
        out = flow.einsum(equation, *fs)
        _close(out, ref)
        cot = rng.standard_normal(tuple(ref.shape))
        ref.backward(torch.tensor(cot))
        out.backward(flow.tensor(cot))
        for f, t in zip(fs, ts, strict=True):
            _close(f.grad, t.grad)
        checked += 1
    assert checked == 150


def test_einsum_diagonal_gradient_on_mock_device():
    # The diagonal's gradient builds an identity on the gradient's device.
    a = np.random.default_rng(4).standard_normal((3, 3))
    x = flow.tensor(a, device="mock", requires_grad=True)
    flow.einsum("ii->i", x).sum().backward()
    assert x.grad.device == flow.device("mock")
    np.testing.assert_array_equal(x.grad._host(), np.eye(3))


def test_einsum_signatures_follow_the_expanded_equation():
    from sbpflow.ops import registry
    from sbpflow.sbp import B, P, Signature, Split

    opdef = registry.get("einsum")
    metas = (flow.ones(2, 3, 4)._meta, flow.ones(4, 5)._meta)
    sigs = opdef.signatures(metas, opdef.bind_attrs({"equation": "...ij,jk"}))
    assert Signature((Split(0), B), (Split(0),)) in sigs  # the ellipsis axis
    assert Signature((Split(2), Split(0)), (P,)) in sigs  # the contracted j
    assert Signature((B, Split(1)), (Split(2),)) in sigs  # k
    diag = opdef.signatures((flow.ones(3, 3)._meta,), opdef.bind_attrs({"equation": "ii->i"}))
    assert set(diag) == {Signature((B,), (B,)), Signature((P,), (P,))}
