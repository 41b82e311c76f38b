"""torch.linalg beyond the registry samples: the public functions (sbpflow.linalg, the top-level
forms and Tensor methods) on batches against torch, gradients of the compositions (norms,
pinv, logdet, svdvals) against torch, finite differences for the ops that read one triangle
(cholesky, eigh: symmetric perturbations), the sign conventions, and torch's errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow.ops.linalg import LinAlgError


def _close(f, t, rtol=1e-9, atol=1e-10):
    f = f.detach().numpy() if isinstance(f, flow.Tensor) else np.asarray(f)
    t = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    assert f.shape == t.shape, (f.shape, t.shape)
    np.testing.assert_allclose(f, t, rtol=rtol, atol=atol)


def _square(rng, *shape):
    n = shape[-1]
    return rng.standard_normal(shape) + n * np.eye(n)


def _spd(rng, *shape):
    x = rng.standard_normal(shape)
    return x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1])


def _pair(a, requires_grad=True):
    return flow.tensor(a, requires_grad=requires_grad), torch.tensor(a, requires_grad=requires_grad)


def _grads_match(fn_flow, fn_torch, arrays, seed=0, rtol=1e-8, atol=1e-9):
    """Forward and the gradient of a random projection of the output, against torch."""
    pairs = [_pair(a) for a in arrays]
    out_f = fn_flow(*[p[0] for p in pairs])
    out_t = fn_torch(*[p[1] for p in pairs])
    _close(out_f, out_t, rtol, atol)
    c = np.random.default_rng(seed).standard_normal(tuple(out_t.shape))
    (out_f * flow.tensor(c)).sum().backward()
    (out_t * torch.tensor(c)).sum().backward()
    for f, t in pairs:
        _close(f.grad, t.grad, rtol * 100, atol * 100)


def _sym_fd(fn, a, c, eps=1e-6):
    """Directional derivatives of sum(c * fn(A)) along the symmetric units E_ij + E_ji."""
    n = a.shape[-1]
    out = np.zeros(a.shape)
    for idx in np.ndindex(a.shape[:-2]):
        for i in range(n):
            for j in range(i + 1):
                e = np.zeros(a.shape)
                e[idx + (i, j)] = e[idx + (j, i)] = 1.0
                plus = float(np.sum(c * fn(a + eps * e)))
                minus = float(np.sum(c * fn(a - eps * e)))
                out[idx + (i, j)] = out[idx + (j, i)] = (plus - minus) / (2 * eps)
    return out


def _sym_dir(g):
    """The same directional derivatives from a gradient: g_ij + g_ji off the diagonal."""
    s = g + np.swapaxes(g, -1, -2)
    n = g.shape[-1]
    return s - np.eye(n) * np.diagonal(g, axis1=-2, axis2=-1)[..., None, :]


# -- forward on batches ---------------------------------------------------------------------
def test_inv_det_slogdet_on_batches():
    rng = np.random.default_rng(0)
    a = _square(rng, 2, 3, 4, 4)
    fa, ta = flow.tensor(a), torch.tensor(a)
    _close(flow.linalg.inv(fa), torch.linalg.inv(ta))
    _close(flow.inverse(fa), torch.inverse(ta))
    _close(fa.inverse(), ta.inverse())
    _close(flow.linalg.det(fa), torch.linalg.det(ta))
    _close(fa.det(), ta.det())
    mixed = rng.standard_normal((3, 3, 3))
    mixed[0] = np.eye(3)  # determinants of both signs
    mixed[1, 0] *= -np.sign(np.linalg.det(mixed[1]))
    for m in (a, mixed):
        res = flow.linalg.slogdet(flow.tensor(m))
        tres = torch.linalg.slogdet(torch.tensor(m))
        assert type(res).__name__ == "linalg_slogdet"
        _close(res.sign, tres.sign)
        _close(res.logabsdet, tres.logabsdet)
        old = flow.tensor(m).slogdet()
        _close(old.sign, torch.slogdet(torch.tensor(m)).sign)
        _close(old.logabsdet, torch.slogdet(torch.tensor(m)).logabsdet)
    assert set(np.unique(flow.linalg.slogdet(flow.tensor(mixed)).sign.numpy())) == {-1.0, 1.0}


def test_logdet_signs():
    rng = np.random.default_rng(1)
    a = _square(rng, 3, 3)
    neg = a.copy()
    neg[0] *= -1
    for m in (a, neg, np.zeros((2, 2))):
        _close(flow.logdet(flow.tensor(m)), torch.logdet(torch.tensor(m)))
        _close(flow.tensor(m).logdet(), torch.tensor(m).logdet())


@pytest.mark.parametrize("a_shape,b_shape", [((3, 3), (3,)), ((3, 3), (3, 2)),
                                             ((2, 3, 3), (2, 3)), ((2, 3, 3), (3,)),
                                             ((3, 3, 3), (3, 3)), ((2, 1, 3, 3), (4, 3, 2)),
                                             ((3, 3), (5, 3, 1))])
def test_solve_shapes_and_gradients(a_shape, b_shape):
    rng = np.random.default_rng(2)
    a, b = _square(rng, *a_shape), rng.standard_normal(b_shape)
    _grads_match(flow.linalg.solve, torch.linalg.solve, [a, b])


def test_solve_left_false():
    rng = np.random.default_rng(3)
    a, b = _square(rng, 2, 3, 3), rng.standard_normal((2, 4, 3))
    _grads_match(lambda x, y: flow.linalg.solve(x, y, left=False),
                 lambda x, y: torch.linalg.solve(x, y, left=False), [a, b])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_forward_and_forms(upper):
    rng = np.random.default_rng(4)
    a = _spd(rng, 2, 3, 4, 4)
    _close(flow.linalg.cholesky(flow.tensor(a), upper=upper),
           torch.linalg.cholesky(torch.tensor(a), upper=upper))
    _close(flow.cholesky(flow.tensor(a), upper), torch.cholesky(torch.tensor(a), upper))
    _close(flow.tensor(a).cholesky(upper), torch.tensor(a).cholesky(upper))


def test_eigh_reconstructs_and_fixes_signs():
    rng = np.random.default_rng(5)
    a = _spd(rng, 2, 4, 4)
    w, v = flow.linalg.eigh(flow.tensor(a))
    tw = torch.linalg.eigvalsh(torch.tensor(a))
    _close(w, tw)
    _close(flow.linalg.eigvalsh(flow.tensor(a), UPLO="U"), torch.linalg.eigvalsh(
        torch.tensor(a), UPLO="U"))
    v = v.numpy()
    recon = v @ (w.numpy()[..., None] * np.swapaxes(v, -1, -2))
    np.testing.assert_allclose(recon, a, rtol=1e-10, atol=1e-10)
    # The convention: each eigenvector's entry of largest magnitude is positive.
    idx = np.abs(v).argmax(axis=-2)
    assert (np.take_along_axis(v, idx[..., None, :], axis=-2) > 0).all()


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 4, 4), (2, 2, 5, 3)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_invariants(shape, full):
    rng = np.random.default_rng(6)
    a = rng.standard_normal(shape)
    u, s, vh = (x.numpy() for x in flow.linalg.svd(flow.tensor(a), full_matrices=full))
    tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full)
    assert u.shape == tuple(tu.shape) and vh.shape == tuple(tvh.shape)
    _close(s, ts)
    k = s.shape[-1]
    np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=1e-10)
    for q in (u, np.swapaxes(vh, -1, -2)):  # orthonormal columns
        np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(
            np.eye(q.shape[-1]), q.shape[:-2] + (q.shape[-1],) * 2), atol=1e-10)
    _close(flow.linalg.svdvals(flow.tensor(a)), torch.linalg.svdvals(torch.tensor(a)))


def test_old_svd_api():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 5, 3))
    u, s, v = flow.svd(flow.tensor(a))
    assert (tuple(u.shape), tuple(s.shape), tuple(v.shape)) == ((2, 5, 3), (2, 3), (2, 3, 3))
    np.testing.assert_allclose((u.numpy() * s.numpy()[..., None, :]) @ np.swapaxes(
        v.numpy(), -1, -2), a, atol=1e-10)
    u, s, v = flow.tensor(a).svd(some=False)
    assert (tuple(u.shape), tuple(v.shape)) == ((2, 5, 5), (2, 3, 3))
    u, s, v = flow.svd(flow.tensor(a), compute_uv=False)
    tu, ts, tv = torch.svd(torch.tensor(a), compute_uv=False)
    _close(u, tu)
    _close(s, ts)
    _close(v, tv)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3), (2, 5, 2)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_torch(shape, mode):
    a = np.random.default_rng(8).standard_normal(shape)
    q, r = flow.linalg.qr(flow.tensor(a), mode=mode)
    tq, tr = torch.linalg.qr(torch.tensor(a), mode=mode)
    _close(q, tq)
    _close(r, tr)
    if mode != "r":
        np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-10)
    if mode != "r":
        some = mode == "reduced"
        _close(flow.qr(flow.tensor(a), some).Q, torch.qr(torch.tensor(a), some).Q)
        _close(flow.tensor(a).qr(some)[1], torch.tensor(a).qr(some)[1])


# -- norms, pinv, rank, cross ---------------------------------------------------------------
@pytest.mark.parametrize("ord", ["fro", "nuc", 2, -2, 1, -1, math.inf, -math.inf])
@pytest.mark.parametrize("dim,keepdim", [((-2, -1), False), ((0, 2), True), ((2, 0), False)])
def test_matrix_norm_and_gradients(ord, dim, keepdim):
    a = np.random.default_rng(9).standard_normal((3, 2, 4))
    _grads_match(lambda x: flow.linalg.matrix_norm(x, ord, dim, keepdim),
                 lambda x: torch.linalg.matrix_norm(x, ord, dim, keepdim), [a])
    _grads_match(lambda x: flow.linalg.norm(x, ord, dim, keepdim),
                 lambda x: torch.linalg.norm(x, ord, dim, keepdim), [a])


@pytest.mark.parametrize("shape,ord,dim", [((5,), None, None), ((2, 3, 4), None, None),
                                           ((5,), 3, None), ((3, 4), "nuc", None),
                                           ((3, 4), 1, None), ((2, 3, 4), 1, 1),
                                           ((2, 3, 4), math.inf, (1,)),
                                           ((2, 3, 4), -math.inf, (2, 1))])
def test_norm_forms(shape, ord, dim):
    a = np.random.default_rng(10).standard_normal(shape)
    _grads_match(lambda x: flow.linalg.norm(x, ord, dim),
                 lambda x: torch.linalg.norm(x, ord, dim), [a])


def test_norm_dtype_and_vector_norm():
    a = np.random.default_rng(11).standard_normal((3, 4)).astype(np.float32)
    out = flow.linalg.matrix_norm(flow.tensor(a), dtype=flow.float64)
    assert out.dtype == flow.float64
    _close(out, torch.linalg.matrix_norm(torch.tensor(a), dtype=torch.float64), rtol=1e-6)
    _close(flow.linalg.vector_norm(flow.tensor(a), 3, 1),
           torch.linalg.vector_norm(torch.tensor(a), 3, 1), rtol=1e-6)


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
def test_pinv_and_gradients(shape):
    a = np.random.default_rng(12).standard_normal(shape)
    _grads_match(flow.linalg.pinv, torch.linalg.pinv, [a], rtol=1e-7)
    _close(flow.pinverse(flow.tensor(a)), torch.pinverse(torch.tensor(a)))
    _close(flow.tensor(a).pinverse(), torch.tensor(a).pinverse())


def test_pinv_and_rank_of_rank_deficient_matrices():
    rng = np.random.default_rng(13)
    a = rng.standard_normal((2, 5, 2)) @ rng.standard_normal((2, 2, 4))  # rank 2
    _close(flow.linalg.pinv(flow.tensor(a)), torch.linalg.pinv(torch.tensor(a)), atol=1e-9)
    _close(flow.linalg.matrix_rank(flow.tensor(a)), torch.linalg.matrix_rank(torch.tensor(a)))
    for kw in ({"atol": 1.0}, {"rtol": 0.5}, {"atol": 0.5, "rtol": 0.2}):
        _close(flow.linalg.matrix_rank(flow.tensor(a), **kw),
               torch.linalg.matrix_rank(torch.tensor(a), **kw))
        _close(flow.linalg.pinv(flow.tensor(a), **kw), torch.linalg.pinv(torch.tensor(a), **kw),
               atol=1e-9)


def test_cross():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((1, 3))
    _grads_match(flow.linalg.cross, torch.linalg.cross, [a, b])
    c, d = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    _grads_match(lambda x, y: flow.linalg.cross(x, y, dim=0),
                 lambda x, y: torch.linalg.cross(x, y, dim=0), [c, d])


# -- gradients ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["inv", "det", "logdet", "slogdet"])
def test_second_order_gradients(name):
    a = _square(np.random.default_rng(15), 2, 3, 3)
    fns = {
        "inv": (flow.linalg.inv, torch.linalg.inv),
        "det": (flow.linalg.det, torch.linalg.det),
        "logdet": (flow.logdet, torch.logdet),
        "slogdet": (lambda x: flow.linalg.slogdet(x)[1], lambda x: torch.linalg.slogdet(x)[1]),
    }
    ff, tf = fns[name]
    fa, ta = _pair(a)
    (gf,) = flow.autograd.grad(ff(fa).sum(), fa, create_graph=True)
    (gt,) = torch.autograd.grad(tf(ta).sum(), ta, create_graph=True)
    _close(gf, gt, 1e-8, 1e-9)
    (hf,) = flow.autograd.grad((gf * gf).sum(), fa)
    (ht,) = torch.autograd.grad((gt * gt).sum(), ta)
    _close(hf, ht, 1e-7, 1e-8)


def test_svd_gradients_full_matrices_and_svdvals():
    rng = np.random.default_rng(16)
    for shape in ((4, 3), (3, 4)):
        a = rng.standard_normal(shape)

        def project(svd):
            def f(x):
                u, s, vh = svd(x)
                k = s.shape[-1]
                return (u[..., :k] * vh[..., :k, :].sum(-1).unsqueeze(-2)).sum() + s.sum()
            return f

        # A loss that is invariant to the sign of each singular pair, on full_matrices=True.
        _grads_match(project(lambda x: flow.linalg.svd(x, full_matrices=True)),
                     project(lambda x: torch.linalg.svd(x, full_matrices=True)), [a])
        _grads_match(flow.linalg.svdvals, torch.linalg.svdvals, [a])


def test_eigvalsh_gradient():
    a = _spd(np.random.default_rng(17), 2, 4, 4)
    _grads_match(flow.linalg.eigvalsh, torch.linalg.eigvalsh, [a])


@pytest.mark.parametrize("name", ["cholesky", "cholesky_upper", "eigh"])
def test_one_triangle_ops_finite_differences(name):
    """cholesky and eigh read one triangle: their gradient (torch's, symmetric) is checked
    along symmetric perturbations."""
    rng = np.random.default_rng(18)
    a = _spd(rng, 2, 3, 3)
    if name == "eigh":
        def run(x, lib):
            w, v = lib.linalg.eigh(x)
            return w, v
    else:
        def run(x, lib):
            return (lib.linalg.cholesky(x, upper=name.endswith("upper")),)
    outs = run(flow.tensor(a), flow)
    cs = [rng.standard_normal(tuple(o.shape)) for o in outs]

    def value(x):
        with flow.no_grad():
            res = run(flow.tensor(x), flow)
        return sum(float(np.sum(c * r.numpy())) for c, r in zip(cs, res))

    fa = flow.tensor(a, requires_grad=True)
    loss = sum((o * flow.tensor(c)).sum() for o, c in zip(run(fa, flow), cs))
    loss.backward()
    numeric = _sym_fd(lambda x: value(x), a, 1.0)
    np.testing.assert_allclose(_sym_dir(fa.grad.numpy()), numeric, rtol=1e-5, atol=1e-6)


# -- errors ---------------------------------------------------------------------------------
def _same_error(fn_flow, fn_torch, cls=RuntimeError):
    with pytest.raises(torch.linalg.LinAlgError if cls is LinAlgError else cls) as theirs:
        fn_torch()
    with pytest.raises(cls) as ours:
        out = fn_flow()
        for o in out if isinstance(out, tuple) else (out,):
            o.numpy()
    assert str(theirs.value).splitlines()[0] in str(ours.value), (ours.value, theirs.value)
    return ours.value


@pytest.mark.parametrize("name", ["inv", "det", "slogdet", "cholesky", "eigh"])
def test_shape_and_dtype_errors(name):
    ff, tf = getattr(flow.linalg, name), getattr(torch.linalg, name)
    for a in (np.ones((3, 4)), np.ones(3), np.ones((2, 2), dtype=np.int64)):
        if name in ("cholesky", "eigh") and a.dtype == np.int64:
            continue  # torch: NotImplementedError from its kernel dispatch
        _same_error(lambda a=a: ff(flow.tensor(a)), lambda a=a: tf(torch.tensor(a)))
    _same_error(lambda: flow.linalg.inv(flow.ones(2, 2, dtype=flow.float16)),
                lambda: torch.linalg.inv(torch.ones(2, 2, dtype=torch.float16)))


def test_singular_matrices_raise_linalg_error():
    assert issubclass(flow.linalg.LinAlgError, RuntimeError)
    assert flow.linalg.LinAlgError is LinAlgError
    s = np.zeros((2, 2))
    batch = np.stack([np.eye(2), s])
    for a in (s, batch):
        err = _same_error(lambda a=a: flow.linalg.inv(flow.tensor(a)),
                          lambda a=a: torch.linalg.inv(torch.tensor(a)), LinAlgError)
        assert isinstance(err, flow.linalg.LinAlgError)
        _same_error(lambda a=a: flow.linalg.solve(flow.tensor(a), flow.ones(a.shape[:-1],
                                                                            dtype=flow.float64)),
                    lambda a=a: torch.linalg.solve(torch.tensor(a), torch.ones(
                        a.shape[:-1], dtype=torch.float64)), LinAlgError)
    # The first zero pivot is named as torch's LAPACK names it.
    r = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]])
    _same_error(lambda: flow.linalg.inv(flow.tensor(r)), lambda: torch.linalg.inv(
        torch.tensor(r)), LinAlgError)


def test_not_positive_definite_cholesky():
    a = np.stack([np.eye(3), np.diag([1.0, 2.0, -1.0])])
    _same_error(lambda: flow.linalg.cholesky(flow.tensor(a)),
                lambda: torch.linalg.cholesky(torch.tensor(a)), LinAlgError)
    _same_error(lambda: flow.linalg.cholesky(flow.tensor(-np.eye(2))),
                lambda: torch.linalg.cholesky(torch.tensor(-np.eye(2))), LinAlgError)


def test_argument_errors():
    a = flow.eye(3, dtype=flow.float64)
    t = torch.eye(3, dtype=torch.float64)
    _same_error(lambda: flow.linalg.eigh(a, UPLO="X"), lambda: torch.linalg.eigh(t, UPLO="X"))
    _same_error(lambda: flow.linalg.qr(a, mode="x"), lambda: torch.linalg.qr(t, mode="x"))
    _same_error(lambda: flow.linalg.solve(a, flow.ones(4, dtype=flow.float64)),
                lambda: torch.linalg.solve(t, torch.ones(4, dtype=torch.float64)))
    _same_error(lambda: flow.linalg.solve(a, flow.ones(2, 3, dtype=flow.float64)),
                lambda: torch.linalg.solve(t, torch.ones(2, 3, dtype=torch.float64)))
    _same_error(lambda: flow.linalg.solve(a, flow.ones(3)),
                lambda: torch.linalg.solve(t, torch.ones(3)))
    _same_error(lambda: flow.linalg.matrix_norm(a, ord=3),
                lambda: torch.linalg.matrix_norm(t, ord=3))
    _same_error(lambda: flow.linalg.matrix_norm(a, dim=(0, 0)),
                lambda: torch.linalg.matrix_norm(t, dim=(0, 0)))
    _same_error(lambda: flow.linalg.matrix_norm(flow.ones(3)),
                lambda: torch.linalg.matrix_norm(torch.ones(3)))
    _same_error(lambda: flow.linalg.norm(flow.ones(2, 2, 2), ord=2),
                lambda: torch.linalg.norm(torch.ones(2, 2, 2), ord=2))
    _same_error(lambda: flow.linalg.norm(flow.ones(2, 2, 2), dim=(0, 1, 2)),
                lambda: torch.linalg.norm(torch.ones(2, 2, 2), dim=(0, 1, 2)))
    _same_error(lambda: flow.linalg.cross(flow.ones(3), flow.ones(2)),
                lambda: torch.linalg.cross(torch.ones(3), torch.ones(2)))


def test_qr_backward_errors():
    for mode, shape in (("r", (3, 2)), ("complete", (3, 2))):
        a, ta = _pair(np.ones(shape) + np.eye(*shape))
        _same_error(lambda a=a, m=mode: flow.linalg.qr(a, mode=m)[1].sum().backward(),
                    lambda ta=ta, m=mode: torch.linalg.qr(ta, mode=m)[1].sum().backward())


def test_deprecated_forms_warn_like_torch():
    from sbpflow.framework.functional import linalg as fl

    fl._WARNED.clear()
    a = flow.eye(2, dtype=flow.float64)
    for fn, text in ((flow.cholesky, "torch.cholesky is deprecated in favor of "
                      "torch.linalg.cholesky"), (flow.qr, "torch.qr is deprecated in favor "
                                                           "of torch.linalg.qr")):
        with pytest.warns(UserWarning, match=text):
            fn(a)


# -- compositions: solve_triangular, lstsq, matrix_power, multi_dot, cond, ... ------------
@pytest.mark.parametrize("upper,left,unit", [(True, True, False), (False, True, False),
                                             (True, False, True), (False, False, False)])
def test_solve_triangular(upper, left, unit):
    rng = np.random.default_rng(20)
    a = _square(rng, 2, 3, 3)
    b = rng.standard_normal((2, 3, 4) if left else (2, 4, 3))
    _grads_match(
        lambda x, y: flow.linalg.solve_triangular(x, y, upper=upper, left=left,
                                                  unitriangular=unit),
        lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=left,
                                                   unitriangular=unit), [a, b])
    # B of one dim fewer than A is still a matrix (torch's solve would read it as vectors).
    c = rng.standard_normal((3, 3))
    _close(flow.linalg.solve_triangular(flow.tensor(np.stack([a[0]] * 3)), flow.tensor(c),
                                        upper=upper),
           torch.linalg.solve_triangular(torch.tensor(np.stack([a[0]] * 3)), torch.tensor(c),
                                         upper=upper))


@pytest.mark.parametrize("driver", [None, "gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("a_shape,b_shape", [((5, 3), (5, 2)), ((2, 5, 3), (2, 5, 2)),
                                             ((3, 5), (3, 2)), ((5, 3), (5,))])
def test_lstsq(driver, a_shape, b_shape):
    rng = np.random.default_rng(21)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    if driver == "gels" and a_shape[-2] < a_shape[-1]:
        return  # gels needs full column rank in torch's CPU path: not compared
    ours = flow.linalg.lstsq(flow.tensor(a), flow.tensor(b), driver=driver)
    ref = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver=driver)
    for f, t in zip(ours, ref):
        _close(f, t, 1e-8, 1e-9)
    _grads_match(lambda x, y: flow.linalg.lstsq(x, y, driver=driver).solution,
                 lambda x, y: torch.linalg.lstsq(x, y, driver=driver).solution, [a, b])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, -1, -3])
def test_matrix_power(n):
    a = _square(np.random.default_rng(22), 2, 3, 3) / 3
    if n == 0:
        _close(flow.linalg.matrix_power(flow.tensor(a), 0),
               torch.linalg.matrix_power(torch.tensor(a), 0))
        return
    _grads_match(lambda x: flow.linalg.matrix_power(x, n),
                 lambda x: torch.linalg.matrix_power(x, n), [a])
    _close(flow.tensor(a).matrix_power(n), torch.tensor(a).matrix_power(n))
    _close(flow.matrix_power(flow.tensor(a), n), torch.matrix_power(torch.tensor(a), n))


def test_multi_dot_vecdot_diagonal_matmul():
    rng = np.random.default_rng(23)
    ms = [rng.standard_normal(s) for s in ((3,), (3, 4), (4, 2), (2,))]
    _grads_match(lambda *xs: flow.linalg.multi_dot(xs), lambda *xs: torch.linalg.multi_dot(xs),
                 ms)
    x, y = rng.standard_normal((2, 4)), rng.standard_normal((3, 1, 4))
    _grads_match(flow.linalg.vecdot, torch.linalg.vecdot, [x, y])
    a = rng.standard_normal((2, 3, 3))
    _close(flow.linalg.diagonal(flow.tensor(a), offset=1),
           torch.linalg.diagonal(torch.tensor(a), offset=1))
    _close(flow.linalg.matmul(flow.tensor(a), flow.tensor(a)),
           torch.linalg.matmul(torch.tensor(a), torch.tensor(a)))
    _same_error(lambda: flow.linalg.multi_dot([flow.ones(2, 2)]),
                lambda: torch.linalg.multi_dot([torch.ones(2, 2)]))
    _same_error(lambda: flow.linalg.multi_dot([flow.ones(2, 2, 2), flow.ones(2, 2)]),
                lambda: torch.linalg.multi_dot([torch.ones(2, 2, 2), torch.ones(2, 2)]))


@pytest.mark.parametrize("p", [None, 2, -2, "fro", "nuc", 1, -1, math.inf, -math.inf])
def test_cond(p):
    a = _square(np.random.default_rng(24), 2, 3, 3)
    _close(flow.linalg.cond(flow.tensor(a), p), torch.linalg.cond(torch.tensor(a), p), 1e-8)
    if p in (None, 2, -2):
        ref = torch.linalg.cond
    else:  # torch's own backward of cond fails here (an in-place write in linalg.inv_ex)
        def ref(x, p):
            return torch.linalg.matrix_norm(x, p) * torch.linalg.matrix_norm(
                torch.linalg.inv(x), p)
    _grads_match(lambda x: flow.linalg.cond(x, p), lambda x: ref(x, p), [a], rtol=1e-7)


def test_vander_tensorinv_tensorsolve():
    rng = np.random.default_rng(25)
    x = rng.standard_normal((2, 4))
    _close(flow.linalg.vander(flow.tensor(x)), torch.linalg.vander(torch.tensor(x)))
    _close(flow.linalg.vander(flow.tensor(x), N=3), torch.linalg.vander(torch.tensor(x), N=3))
    a = _square(rng, 6, 6).reshape(6, 2, 3)
    _close(flow.linalg.tensorinv(flow.tensor(a), ind=1),
           torch.linalg.tensorinv(torch.tensor(a), ind=1))
    a2 = _square(rng, 6, 6).reshape(2, 3, 6)
    b = rng.standard_normal((2, 3))
    _close(flow.linalg.tensorsolve(flow.tensor(a2), flow.tensor(b)),
           torch.linalg.tensorsolve(torch.tensor(a2), torch.tensor(b)))
    a3 = _square(rng, 6, 6).reshape(6, 2, 3)  # dims=(0,): A is (2, 3, 6) for B (2, 3)
    b3 = rng.standard_normal((2, 3))
    _close(flow.linalg.tensorsolve(flow.tensor(a3), flow.tensor(b3), dims=(0,)),
           torch.linalg.tensorsolve(torch.tensor(a3), torch.tensor(b3), dims=(0,)))


@pytest.mark.parametrize("name", ["eig", "eigvals", "ldl_factor", "householder_product"])
def test_left_out_functions_say_so(name):
    with pytest.raises(NotImplementedError, match=f"linalg.{name}"):
        getattr(flow.linalg, name)(flow.eye(2))


def test_inv_ex_and_cholesky_ex_report_info():
    s = np.stack([np.eye(3), np.diag([1.0, 0.0, 2.0]), np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0],
                                                                 [0.0, 1.0, 1.0]])])
    inv, info = flow.linalg.inv_ex(flow.tensor(s))
    tinv, tinfo = torch.linalg.inv_ex(torch.tensor(s))
    assert info.dtype == flow.int32
    _close(info, tinfo)
    _close(inv[0], tinv[0])
    assert np.isnan(inv.numpy()[1:]).all()
    _same_error(lambda: flow.linalg.inv_ex(flow.tensor(s), check_errors=True),
                lambda: torch.linalg.inv_ex(torch.tensor(s), check_errors=True), LinAlgError)
    rng = np.random.default_rng(26)
    n = np.stack([_spd(rng, 3, 3), np.diag([1.0, -1.0, 2.0]), np.diag([2.0, 3.0, 0.0])])
    for upper in (False, True):
        lo, info = flow.linalg.cholesky_ex(flow.tensor(n), upper=upper)
        tlo, tinfo = torch.linalg.cholesky_ex(torch.tensor(n), upper=upper)
        _close(info, tinfo)
        _close(lo, tlo)  # the failing matrices' factors as LAPACK's potrf leaves them
    _same_error(lambda: flow.linalg.cholesky_ex(flow.tensor(n), check_errors=True),
                lambda: torch.linalg.cholesky_ex(torch.tensor(n), check_errors=True),
                LinAlgError)
    a = _spd(rng, 2, 3, 3)
    _grads_match(lambda x: flow.linalg.cholesky_ex(x).L,
                 lambda x: torch.linalg.cholesky_ex(x).L, [a])
    _grads_match(lambda x: flow.linalg.inv_ex(x).inverse,
                 lambda x: torch.linalg.inv_ex(x).inverse, [a])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    rng = np.random.default_rng(27)
    a = _spd(rng, 2, 3, 3)
    factor = torch.linalg.cholesky(torch.tensor(a), upper=upper).numpy()
    b = rng.standard_normal((2, 3, 4))
    _grads_match(lambda x, y: flow.cholesky_solve(x, y, upper),
                 lambda x, y: torch.cholesky_solve(x, y, upper), [b, factor])
    _grads_match(lambda x, y: x.cholesky_solve(y, upper),
                 lambda x, y: x.cholesky_solve(y, upper), [b, factor])
    _grads_match(lambda x: flow.cholesky_inverse(x, upper),
                 lambda x: torch.cholesky_inverse(x, upper), [factor])


def test_torch_norm_nuclear():
    a = np.random.default_rng(28).standard_normal((2, 3, 4))
    _grads_match(lambda x: flow.norm(x, "nuc", dim=(1, 2)),
                 lambda x: torch.norm(x, "nuc", dim=(1, 2)), [a])
    _close(flow.norm(flow.tensor(a[0]), "nuc"), torch.norm(torch.tensor(a[0]), "nuc"))
    _close(flow.tensor(a).norm("nuc", dim=(0, 2), keepdim=True),
           torch.tensor(a).norm("nuc", dim=(0, 2), keepdim=True))


@pytest.mark.parametrize("scale", [0.01, 0.5, 3.0, 40.0])
def test_matrix_exp(scale):
    a = np.random.default_rng(29).standard_normal((2, 4, 4)) * scale
    _grads_match(flow.linalg.matrix_exp, torch.linalg.matrix_exp, [a], rtol=1e-9, atol=1e-9)
    _close(flow.matrix_exp(flow.tensor(a)), torch.matrix_exp(torch.tensor(a)), 1e-9, 1e-9)
    _close(flow.tensor(a).matrix_exp(), torch.tensor(a).matrix_exp(), 1e-9, 1e-9)


def _cofactor_fd(a, eps=1e-6):
    """The gradient of det by central differences (det is a polynomial: exact up to
    rounding)."""
    out = np.zeros(a.shape)
    for idx in np.ndindex(a.shape):
        e = np.zeros(a.shape)
        e[idx] = eps
        out[idx] = (np.linalg.det(a + e) - np.linalg.det(a - e)) / (2 * eps)
    return out


def test_det_gradient_of_singular_matrices():
    """The cofactor matrix, continuous at singular matrices (torch returns zeros for some
    exactly singular ones, e.g. diag(1, 2, 0), where the derivative is not zero)."""
    mats = [np.diag([1.0, 2.0, 0.0]), np.ones((3, 3)), np.array([[1.0, 2.0], [2.0, 4.0]]),
            np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]]), np.zeros((2, 2))]
    for m in mats:
        a = flow.tensor(m, requires_grad=True)
        flow.linalg.det(a).backward()
        np.testing.assert_allclose(a.grad.numpy(), _cofactor_fd(m), atol=1e-8)
    # A batch mixing invertible and singular matrices.
    rng = np.random.default_rng(30)
    batch = np.stack([_square(rng, 3, 3), np.diag([1.0, 2.0, 0.0]), rng.standard_normal((3, 3))])
    a = flow.tensor(batch, requires_grad=True)
    flow.linalg.det(a).sum().backward()
    for k in range(3):
        np.testing.assert_allclose(a.grad.numpy()[k], _cofactor_fd(batch[k]), atol=1e-8)


@pytest.mark.parametrize("shape", [(0, 3, 3), (2, 0, 0), (3, 0)])
@pytest.mark.parametrize("name", ["inv", "det", "slogdet", "cholesky", "eigh", "svd", "qr",
                                  "svdvals", "pinv", "matrix_norm", "inv_ex", "cholesky_ex"])
def test_empty_inputs(shape, name):
    a = np.zeros(shape)
    try:
        ref = getattr(torch.linalg, name)(torch.tensor(a))
    except RuntimeError as e:
        _same_error(lambda: getattr(flow.linalg, name)(flow.tensor(a)),
                    lambda: getattr(torch.linalg, name)(torch.tensor(a)))
        assert "square" in str(e)
        return
    out = getattr(flow.linalg, name)(flow.tensor(a))
    ref = ref if isinstance(ref, tuple) else (ref,)
    out = out if isinstance(out, tuple) else (out,)
    assert [tuple(o.shape) for o in out] == [tuple(r.shape) for r in ref]
    for o, r in zip(out, ref):
        _close(o, r)


@pytest.mark.parametrize("upper", [False, True])
def test_one_triangle_is_read(upper):
    """cholesky reads the lower triangle, or the upper one with upper=True (as torch)."""
    rng = np.random.default_rng(31)
    a = _spd(rng, 2, 3, 3)
    noisy = a + np.triu(rng.standard_normal((3, 3)), 1) * (1 if not upper else 0) + np.tril(
        rng.standard_normal((3, 3)), -1) * (1 if upper else 0)
    _close(flow.linalg.cholesky(flow.tensor(noisy), upper=upper),
           torch.linalg.cholesky(torch.tensor(noisy), upper=upper))
    _close(flow.linalg.cholesky_ex(flow.tensor(noisy), upper=upper).L,
           torch.linalg.cholesky_ex(torch.tensor(noisy), upper=upper).L)
    uplo = "U" if upper else "L"
    _close(flow.linalg.eigvalsh(flow.tensor(noisy), UPLO=uplo),
           torch.linalg.eigvalsh(torch.tensor(noisy), UPLO=uplo))


def test_global_tensors_match_local():
    """The functions on global tensors (S(0) batches and broadcast) on 2 ranks equal the
    local run, values and gradients (tests/ops/linalg_global_check.py)."""
    import re
    from pathlib import Path

    from tests.mpijob import mpiexec_cmd, run_job

    check = str(Path(__file__).resolve().parent / "linalg_global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", check), timeout=180)
    assert job.returncode == 0, job.output[-6000:]
    assert job.strays == 0, job.output[-6000:]
    passed = re.findall(r"rank (\d+): linalg global check passed \((\d+) cases\)", job.stdout)
    assert sorted(int(r) for r, _ in passed) == [0, 1], job.output[-6000:]
    assert all(int(c) >= 40 for _, c in passed), job.output[-6000:]


@pytest.mark.parametrize("upper,transpose,unit", [(True, False, False), (False, True, False),
                                                  (True, True, True), (False, False, True)])
def test_triangular_solve(upper, transpose, unit):
    rng = np.random.default_rng(32)
    a, b = _square(rng, 2, 3, 3), rng.standard_normal((2, 3, 2))
    _grads_match(lambda x, y: flow.triangular_solve(x, y, upper, transpose, unit).solution,
                 lambda x, y: torch.triangular_solve(x, y, upper, transpose, unit).solution,
                 [b, a])
    res = flow.tensor(b).triangular_solve(flow.tensor(a), upper)
    assert type(res).__name__ == "triangular_solve"
    _close(res.cloned_coefficient, a)


# -- LU -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (4, 3), (2, 3, 5)])
def test_lu_factor_lu_and_unpack(shape):
    a = np.random.default_rng(33).standard_normal(shape)
    lu, piv = flow.linalg.lu_factor(flow.tensor(a))
    tlu, tpiv = torch.linalg.lu_factor(torch.tensor(a))
    assert piv.dtype == flow.int32
    _close(lu, tlu)
    _close(piv, tpiv)
    for ours, ref in zip(flow.linalg.lu(flow.tensor(a)), torch.linalg.lu(torch.tensor(a))):
        _close(ours, ref)
    for ours, ref in zip(flow.lu_unpack(lu, piv), torch.lu_unpack(tlu, tpiv)):
        _close(ours, ref)
    p, lo, up = flow.lu_unpack(lu, piv)
    np.testing.assert_allclose(p.numpy() @ lo.numpy() @ up.numpy(), a, atol=1e-12)
    if shape[-1] == shape[-2]:
        _grads_match(lambda x: flow.linalg.lu_factor(x).LU,
                     lambda x: torch.linalg.lu_factor(x).LU, [a])
        for k in (1, 2):  # L and U (P carries no gradient)
            _grads_match(lambda x, k=k: flow.linalg.lu(x)[k],
                         lambda x, k=k: torch.linalg.lu(x)[k], [a])


@pytest.mark.parametrize("left,adjoint", [(True, False), (True, True), (False, False),
                                          (False, True)])
def test_lu_solve(left, adjoint):
    rng = np.random.default_rng(34)
    a = rng.standard_normal((2, 3, 3))
    b = rng.standard_normal((2, 3, 2) if left else (2, 2, 3))
    tlu, tpiv = torch.linalg.lu_factor(torch.tensor(a))
    lu, piv = tlu.numpy(), flow.tensor(tpiv.numpy())
    _grads_match(lambda x, y: flow.linalg.lu_solve(x, piv, y, left=left, adjoint=adjoint),
                 lambda x, y: torch.linalg.lu_solve(x, tpiv, y, left=left, adjoint=adjoint),
                 [lu, b])
    if left and not adjoint:
        _close(flow.tensor(b).lu_solve(flow.tensor(lu), piv),
               torch.tensor(b).lu_solve(tlu, tpiv))


def test_lu_errors_info_and_deprecated_forms():
    s = np.stack([np.eye(3), np.diag([1.0, 0.0, 2.0])])
    _same_error(lambda: flow.linalg.lu_factor(flow.tensor(s)),
                lambda: torch.linalg.lu_factor(torch.tensor(s)))
    _same_error(lambda: flow.linalg.lu_factor(flow.eye(3), pivot=False),
                lambda: torch.linalg.lu_factor(torch.eye(3), pivot=False))
    lu, piv, info = flow.linalg.lu_factor_ex(flow.tensor(s))
    tlu, tpiv, tinfo = torch.linalg.lu_factor_ex(torch.tensor(s))
    for ours, ref in ((lu, tlu), (piv, tpiv), (info, tinfo)):
        _close(ours, ref)
    from sbpflow.framework.functional import linalg as fl

    fl._WARNED.discard("lu")
    with pytest.warns(UserWarning, match="torch.lu is deprecated"):
        out = flow.lu(flow.tensor(s), get_infos=True)
    _close(out[2], tinfo)
    _close(flow.tensor(s[0]).lu()[0], torch.tensor(s[0]).lu()[0])


def test_solve_ex():
    rng = np.random.default_rng(35)
    a = _square(rng, 2, 3, 3)
    for b_shape, left in (((2, 3),  True), ((2, 3, 2), True), ((3,), True), ((2, 4, 3), False)):
        b = rng.standard_normal(b_shape)
        _grads_match(lambda x, y, left=left: flow.linalg.solve_ex(x, y, left=left).result,
                     lambda x, y, left=left: torch.linalg.solve_ex(x, y, left=left).result,
                     [a, b])
    s = np.stack([np.eye(2), np.zeros((2, 2))])
    res, info = flow.linalg.solve_ex(flow.tensor(s), flow.ones(2, 2, dtype=flow.float64))
    tres, tinfo = torch.linalg.solve_ex(torch.tensor(s), torch.ones(2, 2, dtype=torch.float64))
    _close(info, tinfo)
    _close(res[0], tres[0])
    assert not np.isfinite(res.numpy()[1]).all()
    _same_error(lambda: flow.linalg.solve_ex(flow.tensor(s), flow.ones(2, 2, dtype=flow.float64),
                                             check_errors=True),
                lambda: torch.linalg.solve_ex(torch.tensor(s), torch.ones(
                    2, 2, dtype=torch.float64), check_errors=True), LinAlgError)


def test_solve_triangular_singular_dtypes_and_errors():
    d = np.diag([1.0, 0.0, 2.0])
    for upper in (True, False):
        ours = flow.linalg.solve_triangular(flow.tensor(d), flow.ones(3, 1, dtype=flow.float64),
                                            upper=upper).numpy()
        ref = torch.linalg.solve_triangular(torch.tensor(d), torch.ones(3, 1, dtype=torch.float64),
                                            upper=upper).numpy()
        np.testing.assert_array_equal(ours, ref)  # inf and nan where torch has them
    a = _square(np.random.default_rng(36), 3, 3)
    out = flow.linalg.solve_triangular(flow.tensor(a), flow.ones(3, 2), upper=True)
    ref = torch.linalg.solve_triangular(torch.tensor(a), torch.ones(3, 2), upper=True)
    assert out.dtype == flow.float64
    _close(out, ref)
    t = torch.eye(3, dtype=torch.float64)
    f = flow.eye(3, dtype=flow.float64)
    _same_error(lambda: flow.linalg.solve_triangular(f, flow.ones(3, dtype=flow.float64),
                                                     upper=True),
                lambda: torch.linalg.solve_triangular(t, torch.ones(3, dtype=torch.float64),
                                                      upper=True))
    _same_error(lambda: flow.linalg.solve_triangular(f, flow.ones(4, 2, dtype=flow.float64),
                                                     upper=True),
                lambda: torch.linalg.solve_triangular(t, torch.ones(4, 2, dtype=torch.float64),
                                                      upper=True))
    # lu_solve of a singular factorisation: inf/nan as torch, no error.
    s = np.diag([1.0, 0.0, 2.0])
    lu, piv = torch.linalg.lu_factor_ex(torch.tensor(s))[:2]
    ours = flow.linalg.lu_solve(flow.tensor(lu.numpy()), flow.tensor(piv.numpy()),
                                flow.ones(3, 1, dtype=flow.float64)).numpy()
    assert not np.isfinite(ours).all()


def test_lstsq_shapes_and_errors():
    rng = np.random.default_rng(37)
    a, b = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5))
    ours = flow.linalg.lstsq(flow.tensor(a), flow.tensor(b), driver="gelsd")
    ref = torch.linalg.lstsq(torch.tensor(a), torch.tensor(b), driver="gelsd")
    for f, t in zip(ours, ref):
        _close(f, t)
    for a_shape, b_shape in (((2, 5, 3), (5,)), ((5, 3), (4,)), ((5, 3), (4, 2)), ((3,), (3,)),
                             ((5, 3), (2, 5, 2))):
        a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
        _same_error(lambda a=a, b=b: flow.linalg.lstsq(flow.tensor(a), flow.tensor(b)),
                    lambda a=a, b=b: torch.linalg.lstsq(torch.tensor(a), torch.tensor(b)))


_SECOND_ORDER = {
    "cholesky": (lambda L, x: L.cholesky(x @ x.mT + 3 * _eye_of(L, x)), 3),
    "eigvalsh": (lambda L, x: L.eigvalsh(x @ x.mT), 3),
    # Squared entries: independent of each eigenvector's sign (LAPACKs differ there).
    "eigh vectors": (lambda L, x: L.eigh(x @ x.mT + _diag_of(L, x))[1] ** 2, 3),
    "svdvals": (lambda L, x: L.svdvals(x), 3),
    "qr": (lambda L, x: L.qr(x)[1], 3),
    "solve": (lambda L, x: L.solve(x + 3 * _eye_of(L, x), x.sum(-1)), 3),
    "solve_triangular": (lambda L, x: L.solve_triangular(x + 3 * _eye_of(L, x), x, upper=True),
                         3),
    "lu_factor": (lambda L, x: L.lu_factor(x + 3 * _eye_of(L, x))[0], 3),
    "pinv": (lambda L, x: L.pinv(x[..., :2]), 3),
}


def _eye_of(lib, x):
    if lib is torch.linalg:
        return torch.eye(x.shape[-1], dtype=x.dtype)
    return flow.eye(x.shape[-1], dtype=x.dtype)


def _diag_of(lib, x):
    d = np.diag([0.0, 3.0, 7.0])  # separated eigenvalues
    return flow.tensor(d) if lib is flow.linalg else torch.tensor(d)


@pytest.mark.parametrize("name", sorted(_SECOND_ORDER))
def test_second_order_gradients_of_decompositions(name):
    fn, n = _SECOND_ORDER[name]
    a = np.random.default_rng(38).standard_normal((2, n, n))
    fa, ta = _pair(a)
    c = np.random.default_rng(39).standard_normal(tuple(fn(torch.linalg, ta).shape))
    (gf,) = flow.autograd.grad((fn(flow.linalg, fa) * flow.tensor(c)).sum(), fa,
                               create_graph=True)
    (gt,) = torch.autograd.grad((fn(torch.linalg, ta) * torch.tensor(c)).sum(), ta,
                                create_graph=True)
    _close(gf, gt, 1e-7, 1e-8)
    (hf,) = flow.autograd.grad((gf * gf).sum(), fa)
    (ht,) = torch.autograd.grad((gt * gt).sum(), ta)
    _close(hf, ht, 1e-6, 1e-7)


def test_torch_cross():
    rng = np.random.default_rng(40)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    _grads_match(lambda x, y: flow.cross(x, y, dim=1), lambda x, y: torch.cross(x, y, dim=1),
                 [a, b])
    _close(flow.tensor(a).cross(flow.tensor(b), dim=-1), torch.tensor(a).cross(
        torch.tensor(b), dim=-1))
    from sbpflow.framework.functional import linalg as fl

    fl._WARNED.discard("cross")
    c, d = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    with pytest.warns(UserWarning, match="torch.cross without specifying the dim"):
        out = flow.cross(flow.tensor(c), flow.tensor(d))
    _close(out, torch.cross(torch.tensor(c), torch.tensor(d), dim=0))
    _same_error(lambda: flow.cross(flow.ones(2, 2), flow.ones(2, 2)),
                lambda: torch.cross(torch.ones(2, 2), torch.ones(2, 2)))


def test_kron_and_chain_matmul():
    rng = np.random.default_rng(41)
    for sa, sb in (((2, 3), (4, 2)), ((2, 3), (4,)), ((), (3,)), ((2, 1, 3), (2, 2))):
        a, b = rng.standard_normal(sa), rng.standard_normal(sb)
        _grads_match(flow.kron, torch.kron, [a, b])
    ms = [rng.standard_normal(s) for s in ((2, 3), (3, 4), (4, 2))]
    with pytest.warns(UserWarning, match="chain_matmul is deprecated"):
        from sbpflow.framework.functional import linalg as fl

        fl._WARNED.discard("chain_matmul")
        out = flow.chain_matmul(*[flow.tensor(m) for m in ms])
    _close(out, torch.linalg.multi_dot([torch.tensor(m) for m in ms]))
    _close(flow.chain_matmul(flow.tensor(ms[0])), ms[0])
