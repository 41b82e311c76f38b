"""torch.distributions: probability distributions built from sbpflow tensor ops.

Every density, entropy and KL rule is written with sbpflow ops, so it is differentiable and
runs on global tensors wherever those ops do; `rsample` is pathwise (gradients reach the
parameters).  Draws come from sbpflow's default generator, so `flow.manual_seed` makes them
reproducible (they are not torch's draws).
"""

from __future__ import annotations

from . import constraints
from .bernoulli import Bernoulli
from .categorical import Categorical
from .distribution import Distribution
from .independent import Independent
from .kl import kl_divergence, register_kl
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .one_hot_categorical import OneHotCategorical
from .uniform import Uniform

__all__ = [
    "Bernoulli", "Categorical", "Distribution", "Independent", "MultivariateNormal", "Normal",
    "OneHotCategorical", "Uniform", "constraints", "kl_divergence", "register_kl",
]
