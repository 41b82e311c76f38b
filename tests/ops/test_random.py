"""Random ops, generators and the creation ops' piece-wise kernels.

torch's random streams cannot be matched value for value, so random ops are checked for:
reproducibility under a seed, different values for different seeds and calls, distribution
statistics (tolerances from the sample size), dtype/shape/device as torch gives them, and that
kernels drawing pieces of a logical tensor (as the ranks of a global tensor do) reassemble
exactly the whole tensor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sbpflow as flow
from sbpflow._core import dtype as dt
from sbpflow._core.meta import TensorMeta
from sbpflow.ops import registry
from sbpflow.ops.registry import KernelContext


@pytest.fixture(autouse=True)
def _restore_rng():
    state = flow.get_rng_state()
    yield
    flow.set_rng_state(state)


def _np(t):
    return t.detach().numpy().copy()


def _normal_cdf(x):
    return 0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(x, np.float64) / math.sqrt(2.0)))


def _ks_statistic(samples, cdf):
    """Kolmogorov-Smirnov distance between the empirical CDF of samples and cdf."""
    x = np.sort(np.asarray(samples, np.float64).ravel())
    n = x.size
    f = cdf(x)
    return max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(0, n) / n))


# The 1% critical value of the KS distance is about 1.63 / sqrt(n); 2.0 / sqrt(n) leaves margin
# (a correct generator fails it with probability below 1e-3; the seeds are fixed anyway).
def _ks_bound(n):
    return 2.0 / math.sqrt(n)


# -- reproducibility --------------------------------------------------------------------------
DRAWS = {
    "rand": lambda **kw: flow.rand(4, 5, **kw),
    "randn": lambda **kw: flow.randn(4, 5, **kw),
    "randint": lambda **kw: flow.randint(0, 1000, (4, 5), **kw),
    "randperm": lambda **kw: flow.randperm(20, **kw),
    "normal": lambda **kw: flow.normal(2.0, 3.0, (4, 5), **kw),
    "bernoulli": lambda **kw: flow.bernoulli(flow.full((4, 5), 0.5), **kw),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_same_seed_same_values_and_new_values_per_call(name):
    draw = DRAWS[name]
    flow.manual_seed(1234)
    a, b = _np(draw()), _np(draw())
    flow.manual_seed(1234)
    a2, b2 = _np(draw()), _np(draw())
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b), "two calls drew the same values"
    flow.manual_seed(4321)
    assert not np.array_equal(_np(draw()), a), "a different seed drew the same values"


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_generator_keyword_uses_its_own_stream(name):
    draw = DRAWS[name]
    g1 = flow.Generator().manual_seed(7)
    g2 = flow.Generator().manual_seed(7)
    before = flow.get_rng_state()
    np.testing.assert_array_equal(_np(draw(generator=g1)), _np(draw(generator=g2)))
    # The default generator did not advance.
    np.testing.assert_array_equal(before.numpy(), flow.get_rng_state().numpy())
    flow.manual_seed(7)
    np.testing.assert_array_equal(_np(draw()), _np(draw(generator=flow.Generator().manual_seed(7))))


def test_rng_state_round_trip_uint8_and_int64():
    flow.manual_seed(99)
    flow.rand(3)
    state = flow.get_rng_state()
    assert state.dtype is flow.uint8 and tuple(state.shape) == (16,)
    a = _np(flow.randn(6))
    flow.set_rng_state(state)
    np.testing.assert_array_equal(_np(flow.randn(6)), a)
    seed, offset = state.numpy().view("<u8")
    flow.set_rng_state(flow.tensor([int(seed), int(offset)], dtype=flow.int64))
    np.testing.assert_array_equal(_np(flow.randn(6)), a)
    with pytest.raises(RuntimeError):
        flow.set_rng_state(flow.zeros(3, dtype=flow.uint8))
    with pytest.raises(TypeError):
        flow.set_rng_state("state")


def test_generator_api():
    g = flow.Generator()
    assert g.device == flow.device("cpu")
    assert g.manual_seed(5) is g
    assert g.initial_seed() == 5
    s = g.seed()
    assert isinstance(s, int) and g.initial_seed() == s
    assert flow.manual_seed(-1).initial_seed() == 2**64 - 1  # torch keeps seeds modulo 2**64
    assert flow.initial_seed() == 2**64 - 1
    new = flow.seed()
    assert flow.initial_seed() == new
    state = g.get_state()
    x = _np(flow.rand(4, generator=g))
    assert g.set_state(state) is g
    np.testing.assert_array_equal(_np(flow.rand(4, generator=g)), x)
    with pytest.raises(TypeError):
        g.manual_seed("five")


def test_default_initial_seed_matches_torch():
    fresh = flow.Generator()
    assert fresh.initial_seed() == torch.Generator().initial_seed()


# -- distributions ----------------------------------------------------------------------------
N = 200_000


def test_rand_uniform_statistics():
    flow.manual_seed(0)
    x = _np(flow.rand(N, dtype=flow.float64))
    assert x.min() >= 0.0 and x.max() < 1.0
    # mean of U(0,1) is 1/2 with sd sqrt(1/12 / n); variance 1/12.
    assert abs(x.mean() - 0.5) < 5 * math.sqrt(1 / 12 / N)
    assert abs(x.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / N)
    assert _ks_statistic(x, lambda v: np.clip(v, 0, 1)) < _ks_bound(N)


@pytest.mark.parametrize("dtype", [flow.float16, flow.bfloat16, flow.float32])
def test_rand_low_precision_stays_below_one(dtype):
    # Rounding a 53-bit draw to the dtype would give 1.0 now and then; draws must stay in [0, 1).
    flow.manual_seed(11)
    x = flow.rand(N, dtype=dtype)
    assert x.dtype is dtype
    host = x.numpy().astype(np.float64)
    assert host.min() >= 0.0 and host.max() < 1.0
    assert abs(host.mean() - 0.5) < 0.01


def test_uniform_inplace_range_and_statistics():
    flow.manual_seed(1)
    x = flow.empty(N, dtype=flow.float64)
    ptr = x.data_ptr()
    v0 = x._version
    out = x.uniform_(-2.0, 3.0)
    assert out is x and x.data_ptr() == ptr and x._version > v0
    h = x.numpy()
    assert h.min() >= -2.0 and h.max() < 3.0
    assert abs(h.mean() - 0.5) < 5 * 5 / math.sqrt(12 * N)
    assert _ks_statistic(h, lambda v: np.clip((v + 2) / 5, 0, 1)) < _ks_bound(N)


def test_randn_and_normal_statistics():
    flow.manual_seed(2)
    z = _np(flow.randn(N, dtype=flow.float64))
    assert abs(z.mean()) < 5 / math.sqrt(N)
    assert abs(z.std() - 1.0) < 5 / math.sqrt(2 * N)
    assert _ks_statistic(z, _normal_cdf) < _ks_bound(N)
    y = _np(flow.normal(3.0, 0.5, (N,)))
    assert y.dtype == np.float32
    assert abs(y.mean() - 3.0) < 5 * 0.5 / math.sqrt(N)
    assert abs(y.std() - 0.5) < 5 * 0.5 / math.sqrt(2 * N)
    w = flow.zeros(N, dtype=flow.float64).normal_(-1.0, 2.0).numpy()
    assert _ks_statistic(w, lambda v: _normal_cdf((v + 1.0) / 2.0)) < _ks_bound(N)


def test_normal_with_tensor_mean_and_std():
    flow.manual_seed(3)
    mean = flow.tensor([[-5.0], [5.0]], dtype=flow.float64)
    std = flow.tensor([0.1, 1.0, 10.0], dtype=flow.float64)
    draws = np.stack([_np(flow.normal(mean, std)) for _ in range(4000)])
    assert draws.shape[1:] == (2, 3)
    np.testing.assert_allclose(draws.mean(0), np.broadcast_to(mean.numpy(), (2, 3)),
                               atol=5 * 10 / math.sqrt(4000))
    np.testing.assert_allclose(draws.std(0), np.broadcast_to(std.numpy(), (2, 3)), rtol=0.1)
    assert flow.normal(mean, 2.0).shape == (2, 1)
    assert flow.normal(0.0, std).shape == (3,)


def test_randint_range_all_values_hit_and_uniform():
    flow.manual_seed(4)
    x = _np(flow.randint(-3, 7, (N,)))
    assert x.dtype == np.int64
    assert x.min() == -3 and x.max() == 6
    counts = np.bincount(x + 3, minlength=10)
    assert np.all(counts > 0)
    # chi-square with 9 degrees of freedom: the 0.1% critical value is 27.9.
    expected = N / 10
    assert np.sum((counts - expected) ** 2 / expected) < 27.9
    y = _np(flow.randint(5, (1000,), dtype=flow.int32))
    assert y.dtype == np.int32 and set(np.unique(y)) == {0, 1, 2, 3, 4}


def test_random_inplace_ranges():
    flow.manual_seed(5)
    x = flow.zeros(5000, dtype=flow.float32)
    x.random_(3, 9)
    assert set(np.unique(x.numpy())) == {3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    x.random_(4)
    assert set(np.unique(x.numpy())) == {0.0, 1.0, 2.0, 3.0}
    x.random_()
    assert x.numpy().min() >= 0 and x.numpy().max() <= 2**24  # torch: [0, 2**mantissa]
    b = flow.zeros(2000, dtype=flow.uint8).random_()
    assert b.numpy().max() > 200 and b.numpy().min() < 50


def test_randperm_is_a_permutation():
    flow.manual_seed(6)
    for n in (0, 1, 2, 17, 1000):
        p = _np(flow.randperm(n))
        assert p.dtype == np.int64
        np.testing.assert_array_equal(np.sort(p), np.arange(n))
    perms = {tuple(_np(flow.randperm(6))) for _ in range(200)}
    assert len(perms) > 100, "randperm repeats permutations far too often"
    # Each position takes each value about equally often.
    first = np.array([_np(flow.randperm(4))[0] for _ in range(4000)])
    assert np.all(np.abs(np.bincount(first, minlength=4) - 1000) < 5 * math.sqrt(1000 * 0.75))
    np.testing.assert_array_equal(np.sort(_np(flow.randperm(9, dtype=flow.float32))),
                                  np.arange(9, dtype=np.float32))


def test_bernoulli_statistics_and_edge_probabilities():
    flow.manual_seed(8)
    p = flow.tensor(np.linspace(0, 1, 5), dtype=flow.float64).reshape(5, 1).expand(5, 20000)
    draws = _np(flow.bernoulli(p))
    assert set(np.unique(draws)) <= {0.0, 1.0}
    assert np.all(draws[0] == 0) and np.all(draws[-1] == 1)
    means = draws.mean(1)
    np.testing.assert_allclose(means, np.linspace(0, 1, 5), atol=5 * 0.5 / math.sqrt(20000))
    scalar_p = _np(flow.bernoulli(flow.zeros(N), 0.3))
    assert scalar_p.dtype == np.float32
    assert abs(scalar_p.mean() - 0.3) < 5 * math.sqrt(0.21 / N)
    x = flow.zeros(N, dtype=flow.int64).bernoulli_(0.75)
    assert x.dtype is flow.int64 and abs(x.numpy().mean() - 0.75) < 5 * math.sqrt(0.1875 / N)


def test_bernoulli_gradient_is_zero_like_torch():
    p = flow.tensor([0.2, 0.7, 0.5], requires_grad=True)
    out = flow.bernoulli(p)
    tp = torch.tensor([0.2, 0.7, 0.5], requires_grad=True)
    assert out.requires_grad == torch.bernoulli(tp).requires_grad
    out.backward(flow.ones(3))
    np.testing.assert_array_equal(p.grad.numpy(), np.zeros(3, np.float32))


# -- dtype, shape and device as torch ----------------------------------------------------------
def _torch_and_flow(call):
    return call(torch), call(flow)


META_CASES = {
    "rand": lambda m: m.rand(2, 3),
    "rand_tuple": lambda m: m.rand((2, 3)),
    "rand_size_kw": lambda m: m.rand(size=(4,)),
    "rand_f64": lambda m: m.rand(2, dtype=m.float64),
    "rand_0d": lambda m: m.rand(()),
    "randn": lambda m: m.randn(3, 1, 2),
    "randn_f16": lambda m: m.randn(3, dtype=m.float16),
    "randint_high": lambda m: m.randint(10, (3,)),
    "randint_low_high": lambda m: m.randint(2, 10, (2, 2)),
    "randint_size_kw": lambda m: m.randint(0, 5, size=(3,)),
    "randint_dtype": lambda m: m.randint(0, 5, (3,), dtype=m.int32),
    "randint_float": lambda m: m.randint(0, 5, (3,), dtype=m.float32),
    "randperm": lambda m: m.randperm(5),
    "randperm_dtype": lambda m: m.randperm(5, dtype=m.float64),
    "normal": lambda m: m.normal(0.0, 1.0, (2, 3)),
    "normal_tensor": lambda m: m.normal(m.zeros(2, 3, dtype=m.float64), 1.0),
    "bernoulli": lambda m: m.bernoulli(m.full((2, 2), 0.5, dtype=m.float64)),
    "rand_like": lambda m: m.rand_like(m.zeros(2, 3, dtype=m.float64)),
    "randn_like": lambda m: m.randn_like(m.zeros(4, dtype=m.float16)),
    "randint_like": lambda m: m.randint_like(m.zeros(2, 2, dtype=m.int32), 7),
    "randint_like_low": lambda m: m.randint_like(m.zeros(3), 2, 7),
    "randn_requires_grad": lambda m: m.randn(2, requires_grad=True),
}


@pytest.mark.parametrize("name", sorted(META_CASES))
def test_dtype_and_shape_as_torch(name):
    t, f = _torch_and_flow(META_CASES[name])
    assert tuple(f.shape) == tuple(t.shape)
    assert f.dtype.name == str(t.dtype).replace("torch.", "")
    assert f.requires_grad == t.requires_grad


def test_default_dtype_is_followed():
    old = flow.get_default_dtype()
    try:
        flow.set_default_dtype(flow.float64)
        assert flow.rand(2).dtype is flow.float64
        assert flow.randn(2).dtype is flow.float64
        assert flow.randint(0, 3, (2,)).dtype is flow.int64
    finally:
        flow.set_default_dtype(old)


def test_device_keyword_and_like_forms_keep_device():
    x = flow.rand(3, device="mock")
    assert x.device == flow.device("mock")
    assert flow.randn_like(x).device == flow.device("mock")
    assert flow.randperm(4, device="mock").device == flow.device("mock")


ERROR_CASES = {
    "rand_int_dtype": (lambda m: m.rand(2, dtype=m.int64), NotImplementedError),
    "randn_int_dtype": (lambda m: m.randn(2, dtype=m.int64), NotImplementedError),
    "randint_empty_range": (lambda m: m.randint(5, 5, (2,)), RuntimeError),
    "randint_uint8_high": (lambda m: m.randint(0, 300, (2,), dtype=m.uint8), RuntimeError),
    "randint_uint8_low": (lambda m: m.randint(-1, 3, (2,), dtype=m.uint8), RuntimeError),
    "randint_float_high": (lambda m: m.randint(3.5, (2,)), TypeError),
    "randperm_negative": (lambda m: m.randperm(-1), RuntimeError),
    "randperm_bool": (lambda m: m.randperm(3, dtype=m.bool), NotImplementedError),
    "rand_negative": (lambda m: m.rand(-1), RuntimeError),
    "normal_negative_std": (lambda m: m.normal(0.0, -1.0, (3,)), RuntimeError),
    "bernoulli_int": (lambda m: m.bernoulli(m.ones(3, dtype=m.int64)), NotImplementedError),
    "randint_requires_grad": (lambda m: m.randint(0, 3, (2,), requires_grad=True),
                              RuntimeError),
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_errors_as_torch(name):
    call, exc = ERROR_CASES[name]
    with pytest.raises(exc):
        call(torch)
    with pytest.raises(exc):
        call(flow)


def test_inplace_sampling_on_a_leaf_that_requires_grad():
    w = flow.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        w.uniform_()
    with flow.no_grad():
        w.uniform_(-1, 1)
        w.normal_()
    assert w.requires_grad and w.grad_fn is None


# -- pieces of a logical tensor ----------------------------------------------------------------
def _kernel_piece(name, attrs, logical_shape, piece, inputs=(), seed=77, offset=8):
    """Run op `name`'s kernel for one piece (slices per axis) of the logical output."""
    opdef = registry.get(name)
    attrs = opdef.bind_attrs(attrs)
    in_metas = tuple(TensorMeta(a.shape, dt.from_numpy(a.dtype)) for a in inputs)
    (logical,) = opdef.meta(in_metas, attrs)
    assert logical.shape == tuple(logical_shape)
    local = TensorMeta(tuple(len(range(*s.indices(n))) for s, n in zip(piece, logical_shape,
                                                                        strict=True)),
                       logical.dtype)
    local_in = tuple(np.ascontiguousarray(a[piece]) for a in inputs)
    ctx = KernelContext(flow.device("cpu").prims, name,
                        tuple(TensorMeta(a.shape, m.dtype) for a, m in zip(local_in, in_metas,
                                                                            strict=True)),
                        (local,), in_metas, (logical,), (tuple(piece),), seed=seed,
                        offset=offset)
    out = np.asarray(opdef.kernel(ctx, *local_in, **attrs))
    assert out.shape == local.shape and out.dtype == local.dtype.np
    return out


def _quarters(shape):
    (r, c) = shape
    rows = [slice(0, r // 2), slice(r // 2, r)]
    cols = [slice(0, c // 2 + 1), slice(c // 2 + 1, c)]
    return [(a, b) for a in rows for b in cols]


PIECE_OPS = {
    "uniform": ({"shape": (6, 5), "low": -1.0, "high": 2.0, "dtype": dt.float32}, ()),
    "normal": ({"shape": (6, 5), "mean": 1.0, "std": 3.0, "dtype": dt.float64}, ()),
    "randint": ({"shape": (6, 5), "low": -50, "high": 50}, ()),
    "bernoulli": ({}, (np.random.default_rng(0).uniform(0, 1, (6, 5)),)),
    "arange": ({"start": 0.5, "end": 30.5, "step": 1, "dtype": dt.float32}, None),
    "linspace": ({"start": -3, "end": 7, "steps": 30, "dtype": dt.float32}, None),
    "eye": ({"n": 6, "m": 5, "dtype": dt.float32}, ()),
    "full": ({"shape": (6, 5), "fill_value": 2.5, "dtype": dt.float32}, ()),
}


@pytest.mark.parametrize("name", sorted(PIECE_OPS))
def test_pieces_reassemble_the_whole_tensor(name):
    attrs, inputs = PIECE_OPS[name]
    if inputs is None:  # 1-D ops: uneven thirds
        whole = _kernel_piece(name, attrs, (30,), (slice(0, 30),))
        parts = [_kernel_piece(name, attrs, (30,), (s,))
                 for s in (slice(0, 11), slice(11, 21), slice(21, 30))]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        return
    whole = _kernel_piece(name, attrs, (6, 5), (slice(0, 6), slice(0, 5)), inputs)
    got = np.empty_like(whole)
    for piece in _quarters((6, 5)):
        got[piece] = _kernel_piece(name, attrs, (6, 5), piece, inputs)
    np.testing.assert_array_equal(got, whole)
    # Uneven row splits (tensor_split of 6 rows in 4: 2, 2, 1, 1) and column splits too.
    for bounds, axis in (([0, 2, 4, 5, 6], 0), ([0, 2, 3, 4, 5], 1)):
        parts = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            piece = [slice(0, 6), slice(0, 5)]
            piece[axis] = slice(lo, hi)
            parts.append(_kernel_piece(name, attrs, (6, 5), tuple(piece), inputs))
        np.testing.assert_array_equal(np.concatenate(parts, axis=axis), whole)


def test_piece_kernel_matches_an_eager_draw():
    # The eager path draws with the generator's (seed, offset); the same pair through the
    # kernel for the whole tensor gives the same values.
    g = flow.Generator().manual_seed(77)
    seed, offset = g.take(0)
    eager = _np(flow.rand(6, 5, generator=g))
    kernel = _kernel_piece("uniform", {"shape": (6, 5), "low": 0.0, "high": 1.0,
                                       "dtype": dt.float32}, (6, 5),
                           (slice(0, 6), slice(0, 5)), seed=seed, offset=offset)
    np.testing.assert_array_equal(eager, kernel)


# -- creation ops: values against torch and an independent oracle --------------------------------
ARANGE_CASES = [
    (5,), (1, 10, 2), (-3, 7, 3), (5, 5), (10, 0, -3), (0.5, 5), (0, 1, 0.1),
    (-1.5, 2.25, 0.75), (True,),
]


@pytest.mark.parametrize("args", ARANGE_CASES, ids=str)
def test_arange_as_torch(args):
    t = torch.arange(*args)
    f = flow.arange(*args)
    assert f.dtype.name == str(t.dtype).replace("torch.", "")
    np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "float64"])
@pytest.mark.parametrize("args", [(0.5, 5.5, 1), (-0.7, 3.2, 1.9), (5, -3.2, -1.9),
                                  (1, 2.5, 0.5), (0, 300, 100)], ids=str)
def test_arange_integer_truncation_as_torch(args, dtype):
    def run(m):
        return m.arange(*args, dtype=getattr(m, dtype))

    try:
        expected = run(torch).numpy()
    except (RuntimeError, ValueError) as e:
        with pytest.raises(type(e)):
            run(flow)
        return
    # Integers exactly; float64 to rounding (torch's SIMD loop adds steps to a block's start).
    np.testing.assert_allclose(run(flow).numpy(), expected, rtol=1e-12, atol=1e-12)


def test_arange_errors_as_torch():
    for args, exc in (((0, 5, 0), RuntimeError), ((5, 0, 1), RuntimeError),
                      ((0, 5, -1), RuntimeError), ((0, float("inf")), RuntimeError)):
        with pytest.raises(exc):
            torch.arange(*args)
        with pytest.raises(exc):
            flow.arange(*args)
    with pytest.raises(NotImplementedError):
        flow.arange(3, dtype=flow.bool)


def _linspace_oracle(start, end, steps, np_dtype):
    """torch's algorithm in plain NumPy scalars: the first half counts up from start, the
    second half counts down from end, all in the dtype."""
    c = np_dtype.type
    s, e = c(start), c(end)
    step = (e - s) / c(steps - 1)
    return np.array([s + step * c(i) if i < steps // 2 else e - step * c(steps - 1 - i)
                     for i in range(steps)], dtype=np_dtype)


@pytest.mark.parametrize("start,end,steps", [(-1.3, 2.7, 11), (10, -7.5, 64), (0, 1, 1000),
                                             (3.3, 3.3, 4), (-2, 5, 2)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_linspace_exact_algorithm_and_close_to_torch(start, end, steps, dtype):
    out = flow.linspace(start, end, steps, dtype=getattr(flow, dtype)).numpy()
    np.testing.assert_array_equal(out, _linspace_oracle(start, end, steps, np.dtype(dtype)))
    ref = torch.linspace(start, end, steps, dtype=getattr(torch, dtype)).numpy()
    # torch's SIMD loop adds steps to a block's first value, which can round differently:
    # within one ulp of the range's magnitude; the ends are exact.
    ulp = np.spacing(np.array(max(abs(start), abs(end)), dtype=dtype))
    assert np.max(np.abs(out.astype(np.float64) - ref)) <= ulp
    assert out[0] == ref[0] and out[-1] == ref[-1]


def test_linspace_small_cases_and_errors_as_torch():
    for args in ((0, 1, 1), (0, 1, 0), (0, 10, 4), (-0.5, 10.7, 5)):
        for d in ("float32", "int64", "int32"):
            t = torch.linspace(*args, dtype=getattr(torch, d))
            f = flow.linspace(*args, dtype=getattr(flow, d))
            assert f.dtype.name == d
            np.testing.assert_array_equal(f.numpy(), t.numpy())
    with pytest.raises(RuntimeError):
        flow.linspace(0, 1, -1)
    with pytest.raises(TypeError):
        flow.linspace(0, 1, 2.5)


def test_logspace_and_eye_as_torch():
    np.testing.assert_allclose(flow.logspace(-2, 2, 9).numpy(),
                               torch.logspace(-2, 2, 9).numpy(), rtol=1e-6)
    np.testing.assert_allclose(flow.logspace(0, 5, 6, base=2).numpy(),
                               torch.logspace(0, 5, 6, base=2).numpy(), rtol=1e-6)
    for args in ((3,), (2, 4), (4, 2), (0,)):
        np.testing.assert_array_equal(flow.eye(*args).numpy(), torch.eye(*args).numpy())
    assert flow.eye(2, dtype=flow.int64).dtype is flow.int64
    for args in ((-1,), (2, -1)):
        with pytest.raises(RuntimeError):
            flow.eye(*args)
