"""multinomial: shapes, exactness (distinct draws without replacement, zero mass never drawn),
statistics against the distribution (fixed seeds, bounds of several standard errors),
reproducibility through the generator, and torch's errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sbpflow as flow


def _draw(p, n, replacement=False, **kw):
    return flow.multinomial(flow.tensor(np.asarray(p, dtype=np.float64)), n, replacement, **kw)


@pytest.mark.parametrize("shape,n,replacement", [((5,), 3, False), ((4, 6), 6, False),
                                                 ((3,), 10, True), ((2, 4), 1, True),
                                                 ((0, 3), 2, False)])
def test_shapes_and_dtype_match_torch(shape, n, replacement):
    p = np.random.default_rng(0).uniform(0.1, 1.0, shape)
    out = flow.multinomial(flow.tensor(p), n, replacement)
    ref = torch.multinomial(torch.tensor(p), n, replacement)
    assert tuple(out.shape) == tuple(ref.shape)
    assert out.dtype == flow.int64
    x = out.numpy()
    assert ((x >= 0) & (x < shape[-1])).all()


def test_float32_input_and_tensor_method():
    p = flow.tensor([[0.2, 0.3, 0.5], [1.0, 1.0, 1.0]], dtype=flow.float32)
    out = p.multinomial(2)
    assert tuple(out.shape) == (2, 2) and out.dtype == flow.int64


def test_without_replacement_draws_distinct_categories():
    flow.manual_seed(1)
    p = np.random.default_rng(1).uniform(0.0, 1.0, (200, 7))
    x = _draw(p, 7).numpy()
    assert (np.sort(x, axis=1) == np.arange(7)).all()  # every row is a permutation
    y = _draw(p, 4).numpy()
    assert all(len(set(row)) == 4 for row in y)


def test_zero_probability_categories_are_never_drawn():
    flow.manual_seed(2)
    p = np.array([[0.0, 1.0, 0.0, 3.0, 0.0, 0.5]] * 300)
    for replacement, n in ((True, 20), (False, 3), (False, 1)):
        x = _draw(p, n, replacement).numpy()
        assert set(np.unique(x)) <= {1, 3, 5}, (replacement, n)
    # Without replacement and exactly the number of positive categories: all of them.
    x = _draw(p, 3).numpy()
    assert (np.sort(x, axis=1) == [1, 3, 5]).all()
    # A single positive category, with replacement: always that one.
    assert (_draw([0.0, 0.0, 2.0, 0.0], 50, True).numpy() == 2).all()


def _within(freq, prob, count, sigmas=5.0):
    se = np.sqrt(prob * (1 - prob) / count)
    assert np.all(np.abs(freq - prob) <= sigmas * se + 1e-12), (freq, prob)


def test_with_replacement_frequencies_match_the_distribution():
    flow.manual_seed(3)
    w = np.array([1.0, 2.0, 3.0, 0.5, 3.5])
    n = 40_000
    x = _draw(w, n, True).numpy()
    _within(np.bincount(x, minlength=5) / n, w / w.sum(), n)
    # Rows of a 2-D input follow their own distributions.
    rows = np.array([[1.0, 0.0, 1.0], [0.2, 0.6, 0.2]])
    y = _draw(rows, n, True).numpy()
    for r in range(2):
        _within(np.bincount(y[r], minlength=3) / n, rows[r] / rows[r].sum(), n)


def test_without_replacement_follows_sequential_sampling():
    """First draw ~ p; second draw ~ p renormalised without the first (torch's semantics)."""
    flow.manual_seed(4)
    p = np.array([0.5, 0.3, 0.2])
    n = 30_000
    x = _draw(np.tile(p, (n, 1)), 2).numpy()
    _within(np.bincount(x[:, 0], minlength=3) / n, p, n)
    pair = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            if i != j:
                pair[i, j] = p[i] * p[j] / (1 - p[i])
    counts = np.zeros((3, 3))
    np.add.at(counts, (x[:, 0], x[:, 1]), 1)
    _within(counts.ravel() / n, pair.ravel(), n)


def test_seed_reproducibility_and_generators():
    p = flow.tensor([[0.1, 0.2, 0.3, 0.4]] * 8)
    flow.manual_seed(5)
    a = flow.multinomial(p, 3).numpy()
    b = flow.multinomial(p, 3).numpy()
    flow.manual_seed(5)
    assert (flow.multinomial(p, 3).numpy() == a).all()
    assert (flow.multinomial(p, 3).numpy() == b).all()
    assert not (a == b).all()  # successive calls draw new keys
    g1 = flow.Generator().manual_seed(9)
    g2 = flow.Generator().manual_seed(9)
    c = flow.multinomial(p, 4, True, generator=g1).numpy()
    assert (flow.multinomial(p, 4, True, generator=g2).numpy() == c).all()


def test_no_gradient_flows():
    p = flow.tensor([0.2, 0.8], requires_grad=True)
    out = flow.multinomial(p, 1)
    assert not out.requires_grad


@pytest.mark.parametrize("p,n,replacement", [
    ([1.0, -1.0], 1, False), ([1.0, float("inf")], 1, True), ([1.0, float("nan")], 1, False),
    ([0.0, 0.0], 1, False), ([[1.0, 1.0], [0.0, 0.0]], 1, True), ([1.0, 1.0], 3, False),
    ([1.0, 1.0], 0, True), ([1.0, 1.0], -1, False), ([[[1.0, 1.0]]], 1, False),
])
def test_errors_match_torch(p, n, replacement):
    with pytest.raises(RuntimeError) as ours:
        _draw(p, n, replacement).numpy()
    with pytest.raises(RuntimeError) as theirs:
        torch.multinomial(torch.tensor(p, dtype=torch.float64), n, replacement)
    assert str(theirs.value).splitlines()[0] in str(ours.value)


def test_integer_input_is_an_error():
    with pytest.raises(RuntimeError, match="multinomial only supports floating-point dtypes "
                                           "for input, got: Long"):
        flow.multinomial(flow.tensor([1, 2, 3]), 1)


def test_sorted_counting_path_gives_the_same_draws(monkeypatch):
    """Large draws count through a sort instead of one broadcast comparison: same result."""
    from sbpflow.ops import creation

    p = np.random.default_rng(6).uniform(0.0, 1.0, (3, 40))
    p[:, ::7] = 0.0
    flow.manual_seed(6)
    direct = _draw(p, 500, True).numpy()
    monkeypatch.setattr(creation, "_COMPARE_LIMIT", 0)
    flow.manual_seed(6)
    merged = _draw(p, 500, True).numpy()
    assert (direct == merged).all()
    assert not np.isin(merged, np.arange(0, 40, 7)).any()


def test_large_draw_with_replacement():
    flow.manual_seed(7)
    w = np.random.default_rng(7).uniform(0.0, 1.0, 3000)
    n = 4000  # 12M comparisons: the sorted path
    x = _draw(w, n, True).numpy()
    assert x.shape == (n,) and x.min() >= 0 and x.max() < 3000
    # Coarse statistics: mass of the first half of the categories.
    half = w[:1500].sum() / w.sum()
    _within(np.array([np.mean(x < 1500)]), np.array([half]), n)
