"""sbpflow.distributions against torch.distributions 2.13 on the same parameters: log_prob,
entropy, moments, KL and their gradients; shapes, expand, validation errors.  Sampling is
checked by seeded statistics (sbpflow's generator does not reproduce torch's draws)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import sbpflow as flow
import sbpflow.distributions as D
from tests.mpijob import mpiexec_cmd, run_job

RNG = np.random.default_rng(0)
LOGITS = RNG.standard_normal((2, 3, 4)).astype(np.float32)
PROBS = RNG.uniform(0.1, 2.0, (2, 3, 4)).astype(np.float32)  # unnormalised on purpose
P01 = RNG.uniform(0.05, 0.95, (2, 3)).astype(np.float32)
LOC = RNG.standard_normal((2, 3)).astype(np.float32)
SCALE = RNG.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
LOW = RNG.uniform(-2.0, 0.0, (2, 3)).astype(np.float32)
HIGH = LOW + RNG.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
_A = RNG.standard_normal((2, 3, 3)).astype(np.float32)
COV = _A @ _A.transpose(0, 2, 1) + np.eye(3, dtype=np.float32)
TRIL = np.linalg.cholesky(COV).astype(np.float32)


def _pair(arr):
    return (flow.tensor(arr, requires_grad=True), torch.tensor(arr, requires_grad=True))


# name -> (params as numpy, constructor taking a module and the tensors, sample values)
CASES = {
    "categorical_probs": ((PROBS,), lambda m, p: m.Categorical(probs=p),
                          RNG.integers(0, 4, (5, 2, 3))),
    "categorical_logits": ((LOGITS,), lambda m, lg: m.Categorical(logits=lg),
                           RNG.integers(0, 4, (2, 3))),
    "bernoulli_probs": ((P01,), lambda m, p: m.Bernoulli(probs=p),
                        RNG.integers(0, 2, (4, 2, 3)).astype(np.float32)),
    "bernoulli_logits": ((LOC * 3,), lambda m, lg: m.Bernoulli(logits=lg),
                         RNG.integers(0, 2, (2, 3)).astype(np.float32)),
    "normal": ((LOC, SCALE), lambda m, a, b: m.Normal(a, b),
               RNG.standard_normal((5, 2, 3)).astype(np.float32)),
    "uniform": ((LOW, HIGH), lambda m, a, b: m.Uniform(a, b),
                (LOW + (HIGH - LOW) * RNG.uniform(0, 1, (3, 2, 3))).astype(np.float32)),
    "independent_normal": ((LOC, SCALE), lambda m, a, b: m.Independent(m.Normal(a, b), 1),
                           RNG.standard_normal((4, 2, 3)).astype(np.float32)),
    "mvn_cov": ((LOC, COV), lambda m, a, c: m.MultivariateNormal(a, covariance_matrix=c),
                RNG.standard_normal((4, 2, 3)).astype(np.float32)),
    "mvn_tril": ((LOC[0], TRIL), lambda m, a, c: m.MultivariateNormal(a, scale_tril=c),
                 RNG.standard_normal((2, 3)).astype(np.float32)),
    "mvn_precision": ((LOC, COV[0]), lambda m, a, c: m.MultivariateNormal(a, precision_matrix=c),
                      RNG.standard_normal((3, 1, 3)).astype(np.float32)),
    "onehot": ((LOGITS,), lambda m, lg: m.OneHotCategorical(logits=lg),
               np.eye(4, dtype=np.float32)[RNG.integers(0, 4, (5, 2, 3))]),
}


def _build(name):
    params, ctor, value = CASES[name]
    pairs = [_pair(p) for p in params]
    ours = ctor(D, *[p[0] for p in pairs])
    theirs = ctor(torch.distributions, *[p[1] for p in pairs])
    return ours, theirs, pairs, value


def _close(a, b, **kw):
    a = a.detach().numpy() if isinstance(a, flow.Tensor) else np.asarray(a)
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=kw.get("rtol", 1e-5), atol=kw.get("atol", 1e-6),
                               equal_nan=True)


@pytest.mark.parametrize("name", CASES)
def test_values_and_shapes_match_torch(name):
    ours, theirs, _, value = _build(name)
    assert tuple(ours.batch_shape) == tuple(theirs.batch_shape)
    assert tuple(ours.event_shape) == tuple(theirs.event_shape)
    _close(ours.log_prob(flow.tensor(value)), theirs.log_prob(torch.tensor(value)))
    _close(ours.entropy(), theirs.entropy())
    _close(ours.mean, theirs.mean)
    _close(ours.variance, theirs.variance)
    _close(ours.stddev, theirs.stddev)
    _close(ours.mode, theirs.mode)
    _close(ours.perplexity(), theirs.perplexity(), rtol=1e-4)
    for shape in [(), (5,), (2, 3)]:
        assert tuple(ours.sample(shape).shape) == tuple(theirs.sample(shape).shape)
    assert ours.has_rsample == theirs.has_rsample
    assert ours.has_enumerate_support == theirs.has_enumerate_support
    if theirs.has_enumerate_support:
        for expand in (True, False):
            _close(ours.enumerate_support(expand), theirs.enumerate_support(expand))


@pytest.mark.parametrize("name", CASES)
def test_gradients_of_log_prob_and_entropy_match_torch(name):
    ours, theirs, pairs, value = _build(name)
    w = RNG.standard_normal(theirs.log_prob(torch.tensor(value)).shape).astype(np.float32)
    (ours.log_prob(flow.tensor(value)) * flow.tensor(w)).sum().backward()
    (theirs.log_prob(torch.tensor(value)) * torch.tensor(w)).sum().backward()
    for a, b in pairs:
        _close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    ours, theirs, pairs, _ = _build(name)
    ours.entropy().sum().backward()
    theirs.entropy().sum().backward()
    for a, b in pairs:
        if b.grad is None:  # the entropy does not depend on it (Normal's loc)
            assert a.grad is None or not a.grad.numpy().any()
        else:
            _close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_categorical_normalises_as_torch():
    for kw in ({"probs": PROBS}, {"logits": LOGITS * 5 + 3}):
        ours = D.Categorical(**{k: flow.tensor(v) for k, v in kw.items()})
        theirs = torch.distributions.Categorical(**{k: torch.tensor(v) for k, v in kw.items()})
        _close(ours.probs, theirs.probs)
        _close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-5)
        assert tuple(ours.param_shape) == tuple(theirs.param_shape)


@pytest.mark.parametrize("cls", ["Categorical", "Bernoulli"])
def test_lazy_probs_first_read_under_no_grad_still_track_gradients(cls):
    ours_logits, their_logits = _pair(LOGITS)
    ours = getattr(D, cls)(logits=ours_logits)
    theirs = getattr(torch.distributions, cls)(logits=their_logits)
    with flow.no_grad():
        ours.sample()  # reads (and caches) probs
    with torch.no_grad():
        theirs.sample()
    assert ours.probs.requires_grad and theirs.probs.requires_grad
    ours.entropy().sum().backward()
    theirs.entropy().sum().backward()
    _close(ours_logits.grad, their_logits.grad, rtol=1e-4, atol=1e-5)


def test_categorical_and_bernoulli_sampling_statistics():
    flow.manual_seed(0)
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], np.float32)
    s = D.Categorical(probs=flow.tensor(probs)).sample((20000,)).numpy()
    assert s.dtype == np.int64 and s.shape == (20000, 2)
    freq = np.stack([(s == k).mean(0) for k in range(3)], -1)
    # binomial standard error <= 0.0036 for n = 20000: allow 5 of them
    np.testing.assert_allclose(freq, probs, atol=0.018)
    b = D.Bernoulli(probs=flow.tensor([0.1, 0.5, 0.9])).sample((20000,)).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0}
    np.testing.assert_allclose(b.mean(0), [0.1, 0.5, 0.9], atol=0.018)


def test_multivariate_normal_sampling_statistics_and_ppo_style_use():
    flow.manual_seed(2)
    x = D.MultivariateNormal(flow.tensor(LOC[0]), flow.tensor(COV[0])).sample((20000,)).numpy()
    c = COV[0].astype(np.float64)
    se = np.sqrt((np.outer(np.diag(c), np.diag(c)) + c**2) / 20000)  # of a sample covariance
    np.testing.assert_array_less(np.abs(np.cov(x.T) - c), 5 * se)
    np.testing.assert_array_less(np.abs(x.mean(0) - LOC[0]),
                                 5 * np.sqrt(np.diag(COV[0]) / 20000))
    # PPO (continuous actions): a diagonal covariance built with diag(...).unsqueeze(0)
    mean, tmean = _pair(LOC)
    var = np.full(3, 0.36, np.float32)
    ours = D.MultivariateNormal(mean, flow.diag(flow.tensor(var)).unsqueeze(0))
    theirs = torch.distributions.MultivariateNormal(tmean, torch.diag(torch.tensor(var))
                                                    .unsqueeze(0))
    action = LOC + 0.3
    (ours.log_prob(flow.tensor(action)).sum() - ours.entropy().sum()).backward()
    (theirs.log_prob(torch.tensor(action)).sum() - theirs.entropy().sum()).backward()
    _close(mean.grad, tmean.grad, rtol=1e-5)


@pytest.mark.parametrize("dist", ["normal", "uniform"])
def test_continuous_sampling_statistics(dist):
    flow.manual_seed(1)
    n = 20000
    if dist == "normal":
        d = D.Normal(flow.tensor([1.0, -2.0]), flow.tensor([0.5, 3.0]))
        mean, std = np.array([1.0, -2.0]), np.array([0.5, 3.0])
    else:
        d = D.Uniform(flow.tensor([0.0, -1.0]), flow.tensor([1.0, 3.0]))
        mean, std = np.array([0.5, 1.0]), np.array([1.0, 4.0]) / math.sqrt(12)
        x = d.sample((n,)).numpy()
        assert (x >= d.low.numpy()).all() and (x < d.high.numpy()).all()
    x = d.sample((n,)).numpy()
    assert x.shape == (n, 2)
    np.testing.assert_array_less(np.abs(x.mean(0) - mean), 5 * std / math.sqrt(n))
    np.testing.assert_allclose(x.std(0), std, rtol=0.03)


def test_draws_are_reproducible_from_flow_manual_seed():
    d = D.Normal(flow.zeros(3), flow.ones(3))
    c = D.Categorical(logits=flow.zeros(5))
    flow.manual_seed(42)
    a1, b1 = d.sample((4,)).numpy(), c.sample((6,)).numpy()
    flow.manual_seed(42)
    a2, b2 = d.sample((4,)).numpy(), c.sample((6,)).numpy()
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)
    assert not np.array_equal(a1, d.sample((4,)).numpy())


def test_rsample_is_pathwise_and_sample_is_not_differentiable():
    loc = flow.tensor([0.5, -1.0], requires_grad=True)
    scale = flow.tensor([2.0, 0.5], requires_grad=True)
    d = D.Normal(loc, scale)
    flow.manual_seed(3)
    x = d.rsample((1000,))
    x.sum().backward()
    eps = (x.detach().numpy() - loc.detach().numpy()) / scale.detach().numpy()
    np.testing.assert_allclose(loc.grad.numpy(), [1000.0, 1000.0])
    np.testing.assert_allclose(scale.grad.numpy(), eps.sum(0), rtol=1e-4, atol=1e-3)
    assert not d.sample((3,)).requires_grad
    low = flow.tensor([0.0], requires_grad=True)
    high = flow.tensor([2.0], requires_grad=True)
    u = D.Uniform(low, high).rsample((500,))
    u.sum().backward()
    frac = (u.detach().numpy() - 0.0) / 2.0
    np.testing.assert_allclose(high.grad.numpy(), frac.sum(0), rtol=1e-4)
    np.testing.assert_allclose(low.grad.numpy(), (1 - frac).sum(0), rtol=1e-4)


KL_PAIRS = [
    ("normal", lambda m, a, b: m.Normal(a, b), (LOC, SCALE),
     lambda m, a, b: m.Normal(b, a * a + 0.5), (SCALE, LOC)),
    ("categorical", lambda m, a: m.Categorical(logits=a), (LOGITS,),
     lambda m, a: m.Categorical(probs=a), (PROBS,)),
    ("onehot", lambda m, a: m.OneHotCategorical(logits=a), (LOGITS,),
     lambda m, a: m.OneHotCategorical(logits=a * 2), (LOGITS[::-1].copy(),)),
    ("bernoulli", lambda m, a: m.Bernoulli(probs=a), (P01,),
     lambda m, a: m.Bernoulli(logits=a), (LOC,)),
    ("uniform", lambda m, a, b: m.Uniform(a, b), (LOW, HIGH),
     lambda m, a, b: m.Uniform(a - 0.5, b + 1), (LOW, HIGH)),
    ("uniform_normal", lambda m, a, b: m.Uniform(a, b), (LOW, HIGH),
     lambda m, a, b: m.Normal(a, b), (LOC, SCALE)),
    ("mvn", lambda m, a, c: m.MultivariateNormal(a, covariance_matrix=c), (LOC, COV),
     lambda m, a, c: m.MultivariateNormal(a, scale_tril=c), (LOC[::-1].copy(), TRIL[:1])),
    ("independent", lambda m, a, b: m.Independent(m.Normal(a, b), 2), (LOC, SCALE),
     lambda m, a, b: m.Independent(m.Normal(b, a.abs() + 0.1), 2), (SCALE, LOC)),
]


@pytest.mark.parametrize("case", KL_PAIRS, ids=[k[0] for k in KL_PAIRS])
def test_kl_divergence_and_gradients_match_torch(case):
    _, make_p, p_args, make_q, q_args = case
    ppairs, qpairs = [_pair(a) for a in p_args], [_pair(a) for a in q_args]
    ours = D.kl_divergence(make_p(D, *[a for a, _ in ppairs]), make_q(D, *[a for a, _ in qpairs]))
    theirs = torch.distributions.kl_divergence(make_p(torch.distributions, *[b for _, b in ppairs]),
                                               make_q(torch.distributions, *[b for _, b in qpairs]))
    _close(ours, theirs, rtol=1e-4, atol=1e-5)
    ours.sum().backward()
    theirs.sum().backward()
    for a, b in ppairs + qpairs:
        if b.grad is not None:
            _close(a.grad, b.grad, rtol=1e-3, atol=1e-4)


def test_kl_infinite_where_support_is_not_covered():
    p = D.Uniform(flow.tensor([0.0, 0.0]), flow.tensor([1.0, 1.0]))
    q = D.Uniform(flow.tensor([0.5, -1.0]), flow.tensor([2.0, 2.0]))
    out = D.kl_divergence(p, q).numpy()
    assert out[0] == math.inf and np.isfinite(out[1])
    cp = D.Categorical(probs=flow.tensor([0.5, 0.5, 0.0]))
    cq = D.Categorical(probs=flow.tensor([1.0, 0.0, 0.0]))
    ref = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=torch.tensor([0.5, 0.5, 0.0])),
        torch.distributions.Categorical(probs=torch.tensor([1.0, 0.0, 0.0])))
    assert D.kl_divergence(cp, cq).item() == ref.item() == math.inf
    assert D.kl_divergence(cq, cp).item() == pytest.approx(ref.new_tensor(math.log(2)).item())


def test_kl_dispatch_register_and_missing_pair():
    with pytest.raises(NotImplementedError,
                       match="No KL\\(p \\|\\| q\\) is implemented for p type Bernoulli and q "
                             "type Normal"):
        D.kl_divergence(D.Bernoulli(probs=flow.tensor(0.5)), D.Normal(0.0, 1.0))

    class MyNormal(D.Normal):
        pass

    calls = []
    p = MyNormal(flow.tensor(0.0), flow.tensor(1.0))
    q = D.Normal(flow.tensor(1.0), flow.tensor(1.0))
    assert D.kl_divergence(p, q).item() == pytest.approx(0.5)  # the Normal rule, inherited

    @D.register_kl(MyNormal, D.Normal)
    def _mine(p, q):
        calls.append(1)
        return flow.tensor(-1.0)

    assert D.kl_divergence(p, q).item() == -1.0 and calls == [1]  # the more specific rule
    with pytest.raises(TypeError, match="Expected type_p to be a Distribution subclass"):
        D.register_kl(int, D.Normal)


def _msg(exc):
    return str(exc.value).replace("torch.Size", "sbpflow.Size")


def test_validation_errors_match_torch():
    cases = [
        lambda m, t: m.Normal(t([0.0, 1.0]), t([1.0, -1.0])),
        lambda m, t: m.Bernoulli(probs=t([0.5, 1.5])),
        lambda m, t: m.Categorical(probs=t([[0.5, -0.5]])),
        lambda m, t: m.OneHotCategorical(logits=t([0.0, 0.0, 0.0])).log_prob(t([1.0, 0.0])),
        lambda m, t: m.OneHotCategorical(logits=t([0.0, 0.0])).log_prob(t([1.0, 1.0])),
        lambda m, t: m.Bernoulli(probs=t([0.5])).log_prob(t([0.5])),
        lambda m, t: m.Categorical(logits=t([0.0, 0.0])).log_prob(t([3])),
        lambda m, t: m.Uniform(t([0.0]), t([1.0])).log_prob(t([1.5])),
        lambda m, t: m.Uniform(t([1.0]), t([0.0])),
        lambda m, t: m.Independent(m.Normal(t([0.0]), t([1.0])), 2),
        lambda m, t: m.Normal(t([0.0, 1.0]), t([1.0, 1.0])).log_prob(t([1.0, 2.0, 3.0])),
        lambda m, t: m.Normal(t(0.0), t(1.0)).log_prob([1.0]),
        lambda m, t: m.Categorical(),
        lambda m, t: m.MultivariateNormal(t([0.0, 0.0]), t([[1.0, 2.0], [2.0, 1.0]])),
        lambda m, t: m.MultivariateNormal(t([0.0, 0.0]), scale_tril=t([[1.0, 1.0], [0.0, 1.0]])),
        lambda m, t: m.MultivariateNormal(t([0.0, 0.0]), t([[1.0, 0.0], [0.0, 1.0]]),
                                          scale_tril=t([[1.0, 0.0], [0.0, 1.0]])),
        lambda m, t: m.MultivariateNormal(t(0.0), t([[1.0]])),
    ]
    for make in cases:
        with pytest.raises(ValueError) as theirs:
            make(torch.distributions, torch.tensor)
        with pytest.raises(ValueError) as ours:
            make(D, flow.tensor)
        assert _msg(ours) == _msg(theirs)


def test_validate_args_switches():
    D.Normal(flow.tensor([0.0]), flow.tensor([-1.0]), validate_args=False)  # no check
    d = D.Bernoulli(probs=flow.tensor([0.5]), validate_args=False)
    assert np.isfinite(d.log_prob(flow.tensor([0.5])).numpy()).all()
    assert D.Distribution._validate_args is torch.distributions.Distribution._validate_args
    try:
        D.Distribution.set_default_validate_args(False)
        D.Normal(flow.tensor([0.0]), flow.tensor([-1.0]))
    finally:
        D.Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        D.Normal(flow.tensor([0.0]), flow.tensor([-1.0]))
    with pytest.raises(ValueError):
        D.Distribution.set_default_validate_args("yes")


@pytest.mark.parametrize("name", CASES)
def test_expand_matches_torch(name):
    ours, theirs, _, value = _build(name)
    shape = (5,) + tuple(theirs.batch_shape)
    oe, te = ours.expand(shape), theirs.expand(shape)
    assert tuple(oe.batch_shape) == tuple(te.batch_shape) == shape
    assert tuple(oe.event_shape) == tuple(te.event_shape)
    _close(oe.log_prob(flow.tensor(value[:1])), te.log_prob(torch.tensor(value[:1])))
    assert tuple(oe.sample((2,)).shape) == tuple(te.sample((2,)).shape)


def test_reprs_and_constraints_match_torch():
    c = torch.distributions.constraints
    ours = [D.constraints.real, D.constraints.positive, D.constraints.simplex,
            D.constraints.boolean, D.constraints.unit_interval, D.constraints.real_vector,
            D.constraints.integer_interval(0, 3), D.constraints.one_hot,
            D.constraints.independent(D.constraints.positive, 2), D.constraints.lower_cholesky,
            D.constraints.positive_definite]
    theirs = [c.real, c.positive, c.simplex, c.boolean, c.unit_interval, c.real_vector,
              c.integer_interval(0, 3), c.one_hot, c.independent(c.positive, 2), c.lower_cholesky,
              c.positive_definite]
    for a, b in zip(ours, theirs, strict=True):
        assert repr(a) == repr(b)
        assert a.event_dim == b.event_dim and a.is_discrete == b.is_discrete
    x = np.array([[0.2, 0.8], [0.5, 0.6]], np.float32)
    for a, b in zip(ours[:7], theirs[:7], strict=True):
        np.testing.assert_array_equal(a.check(flow.tensor(x)).numpy(),
                                      b.check(torch.tensor(x)).numpy())
    assert D.constraints.is_dependent(D.constraints.dependent)
    assert not D.constraints.is_dependent(D.constraints.real)
    u, tu = D.Uniform(0.0, 1.0), torch.distributions.Uniform(0.0, 1.0)
    assert repr(u.arg_constraints) == repr(tu.arg_constraints)
    for make in [lambda m: m.Normal(0.0, 1.0), lambda m: m.Bernoulli(probs=0.3),
                 lambda m: m.Independent(m.Normal(m_t(m, [0.0, 1.0]), 1.0), 1)]:
        assert repr(make(D)).replace("sbpflow", "torch") == repr(make(torch.distributions))
    assert repr(D.Uniform(0.0, 1.0).support) == repr(torch.distributions.Uniform(0.0, 1.0).support)


def m_t(m, v):
    return flow.tensor(v) if m is D else torch.tensor(v)


def test_reinforce_program_under_mock_torch():
    """The policy-gradient step of pytorch/examples' REINFORCE, run as torch code."""
    with flow.mock_torch.enable():
        import torch as T
        from torch.distributions import Categorical

        assert Categorical is D.Categorical and T.distributions is D
        T.manual_seed(0)
        policy = T.nn.Sequential(T.nn.Linear(4, 16), T.nn.ReLU(), T.nn.Linear(16, 2))
        state = T.randn(8, 4)
        probs = T.softmax(policy(state), dim=1)
        m = Categorical(probs)
        action = m.sample()
        loss = (-m.log_prob(action) * T.randn(8)).sum()
        loss.backward()
        assert action.dtype == T.int64 and action.shape == (8,)
        assert policy[0].weight.grad is not None
        assert float(policy[0].weight.grad.abs().sum()) > 0


def test_structured_constraints_match_torch():
    c, dc = torch.distributions.constraints, D.constraints
    mats = np.stack([np.eye(3), np.tril(RNG.standard_normal((3, 3))),
                     RNG.standard_normal((3, 3))]).astype(np.float32)
    mats[2] = mats[2] + mats[2].T  # symmetric, not triangular
    counts = np.array([[1, 2, 0], [3, 0, 2], [-1, 1, 1]], np.float32)
    pairs = [(dc.square, c.square, mats), (dc.symmetric, c.symmetric, mats),
             (dc.lower_triangular, c.lower_triangular, mats),
             (dc.lower_cholesky, c.lower_cholesky, mats),
             (dc.positive_definite, c.positive_definite, np.concatenate([mats, COV])),
             (dc.square, c.square, mats[:, :2]),
             (dc.multinomial(4), c.multinomial(4), counts),
             (dc.cat([dc.positive, dc.real], 1, [1, 2]), c.cat([c.positive, c.real], 1, [1, 2]),
              counts),
             (dc.stack([dc.positive, dc.real, dc.nonnegative], 1),
              c.stack([c.positive, c.real, c.nonnegative], 1), counts)]
    for ours, theirs, x in pairs:
        np.testing.assert_array_equal(ours.check(flow.tensor(x)).numpy(),
                                      theirs.check(torch.tensor(x)).numpy())
        assert ours.event_dim == theirs.event_dim and ours.is_discrete == theirs.is_discrete


def test_global_tensors_on_two_ranks_equal_the_single_device_run():
    """log_prob, entropy, KL and their gradients on S(0) and B global parameters equal the
    local run; rsample and Categorical.sample give global draws (oracle inside the job)."""
    check = str(Path(__file__).resolve().parent / "global_check.py")
    job = run_job(mpiexec_cmd(2, "-m", "mpi4py", check), timeout=120)
    assert job.returncode == 0, job.output
    assert job.strays == 0, job.output
    passed = re.findall(r"rank (\d+): distributions global check passed \((\d+) checks\)",
                        job.stdout)
    assert sorted(int(r) for r, _ in passed) == [0, 1], job.output
    assert {int(c) for _, c in passed} == {12}, job.output
