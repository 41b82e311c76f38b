"""MultivariateNormal: a Gaussian over vectors, given one of covariance_matrix,
precision_matrix or scale_tril (the lower Cholesky factor of the covariance)."""

from __future__ import annotations

import math

from ..framework import functional as F
from ..framework.functional.linalg import linalg_cholesky, linalg_solve_triangular
from ..framework.tensor import Size
from . import constraints
from .distribution import Distribution, _size
from .utils import draw, lazy_property

__all__ = ["MultivariateNormal"]


def _batch_mahalanobis(L, x):
    """x^T (L L^T)^{-1} x over the last dimension, L broadcast against x's batch dims."""
    shape = tuple(F.broadcast_shapes(tuple(L.shape[:-2]), tuple(x.shape[:-1])))
    k = x.shape[-1]
    Lb = L.expand(shape + (k, k))
    y = linalg_solve_triangular(Lb, x.expand(shape + (k,)).unsqueeze(-1), upper=False)
    return y.squeeze(-1).pow(2).sum(-1)


def _half_log_det(L):
    return L.diagonal(dim1=-2, dim2=-1).log().sum(-1)


class MultivariateNormal(Distribution):
    arg_constraints = {
        "loc": constraints.real_vector,
        "covariance_matrix": constraints.positive_definite,
        "precision_matrix": constraints.positive_definite,
        "scale_tril": constraints.lower_cholesky,
    }
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc, covariance_matrix=None, precision_matrix=None, scale_tril=None,
                 validate_args=None):
        if loc.dim() < 1:
            raise ValueError("loc must be at least one-dimensional.")
        given = [m is not None for m in (covariance_matrix, scale_tril, precision_matrix)]
        if sum(given) != 1:
            raise ValueError("Exactly one of covariance_matrix or precision_matrix or "
                             "scale_tril may be specified.")
        for name, m in (("scale_tril", scale_tril), ("covariance_matrix", covariance_matrix),
                        ("precision_matrix", precision_matrix)):
            if m is None:
                continue
            if m.dim() < 2:
                raise ValueError(f"{name} matrix must be at least two-dimensional, with "
                                 "optional leading batch dimensions")
            batch_shape = tuple(F.broadcast_shapes(tuple(m.shape[:-2]), tuple(loc.shape[:-1])))
            setattr(self, name, m.expand(batch_shape + (-1, -1)))
        self.loc = loc.expand(batch_shape + (-1,))
        super().__init__(Size(batch_shape), self.loc.shape[-1:], validate_args=validate_args)
        if scale_tril is not None:
            self._unbroadcasted_scale_tril = scale_tril
        elif covariance_matrix is not None:
            self._unbroadcasted_scale_tril = linalg_cholesky(covariance_matrix)
        else:
            self._unbroadcasted_scale_tril = linalg_cholesky(F.inverse(precision_matrix))

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MultivariateNormal, _instance)
        batch_shape = _size(batch_shape)
        loc_shape = tuple(batch_shape) + tuple(self.event_shape)
        cov_shape = loc_shape + tuple(self.event_shape)
        new.loc = self.loc.expand(loc_shape)
        new._unbroadcasted_scale_tril = self._unbroadcasted_scale_tril
        for name in ("covariance_matrix", "scale_tril", "precision_matrix"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(cov_shape))
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @lazy_property
    def scale_tril(self):
        return self._unbroadcasted_scale_tril.expand(
            tuple(self._batch_shape) + tuple(self._event_shape) * 2)

    @lazy_property
    def covariance_matrix(self):
        L = self._unbroadcasted_scale_tril
        return (L @ L.mT).expand(tuple(self._batch_shape) + tuple(self._event_shape) * 2)

    @lazy_property
    def precision_matrix(self):
        return F.cholesky_inverse(self._unbroadcasted_scale_tril).expand(
            tuple(self._batch_shape) + tuple(self._event_shape) * 2)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self._unbroadcasted_scale_tril.pow(2).sum(-1).expand(
            tuple(self._batch_shape) + tuple(self._event_shape))

    def rsample(self, sample_shape=Size()):
        shape = self._extended_shape(sample_shape)
        eps = draw(F.randn, shape, self.loc)
        return self.loc + (self._unbroadcasted_scale_tril @ eps.unsqueeze(-1)).squeeze(-1)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        diff = value - self.loc
        M = _batch_mahalanobis(self._unbroadcasted_scale_tril, diff)
        k = self._event_shape[0]
        return -0.5 * (k * math.log(2 * math.pi) + M) - _half_log_det(
            self._unbroadcasted_scale_tril)

    def entropy(self):
        k = self._event_shape[0]
        H = 0.5 * k * (1.0 + math.log(2 * math.pi)) + _half_log_det(
            self._unbroadcasted_scale_tril)
        return H.expand(self._batch_shape) if len(self._batch_shape) else H
