"""Normalisation layers: batch, instance, layer, RMS, group and local response normalisation.

torch spreads them over batchnorm.py, instancenorm.py and normalization.py; those module
paths re-export from here.
"""

from __future__ import annotations

import numbers
import warnings

from ...framework.functional import creation
from ...framework.parameter import Parameter
from .. import functional as F
from .. import init
from .module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "InstanceNorm1d",
           "InstanceNorm2d", "InstanceNorm3d", "LayerNorm", "LocalResponseNorm", "RMSNorm"]


class _NormBase(Module):
    """Per-channel affine parameters and running statistics (torch's _NormBase)."""

    _version = 2  # version 2 added num_batches_tracked, as torch's

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None, *, bias: bool = True):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        self.weight = Parameter(creation.ones(num_features, dtype=dtype)) if affine else None
        if affine and bias:
            self.bias = Parameter(creation.zeros(num_features, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        if not affine:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", creation.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", creation.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", creation.tensor(0))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _upgrade_state_dict(self, state_dict, prefix: str, local_metadata: dict) -> None:
        # torch: a dict older than version 2, or without version metadata (a plain dict, one
        # read back from a file), may lack num_batches_tracked; the module keeps its own count
        version = local_metadata.get("version")
        key = prefix + "num_batches_tracked"
        if (version is None or version < 2) and self.track_running_stats and \
                key not in state_dict:
            count = self.num_batches_tracked
            state_dict[key] = count if count is not None else creation.tensor(0)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            init.zeros_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    _expected_dims: tuple[int, ...] = ()

    def forward(self, input):
        if input.dim() not in self._expected_dims:
            raise ValueError(
                f"expected {' or '.join(f'{d}D' for d in self._expected_dims)} input "
                f"(got {input.dim()}D input)"
            )
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            from ...autograd import no_grad

            with no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch = self.training or self.running_mean is None
        return F.batch_norm(
            input,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight, self.bias, use_batch, factor, self.eps,
        )


class BatchNorm1d(_BatchNorm):
    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _expected_dims = (4,)


class BatchNorm3d(_BatchNorm):
    _expected_dims = (5,)


class _InstanceNorm(_NormBase):
    """Normalise each (sample, channel) over its spatial positions (torch's _InstanceNorm).
    With track_running_stats, training updates running_mean/running_var with the mean over
    the batch of the per-instance statistics, and eval normalises with them."""

    _batched_ndim = 0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None,
                 dtype=None, *, bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, bias=bias)

    def forward(self, input):
        nd = self._batched_ndim
        if input.dim() not in (nd - 1, nd):
            raise ValueError(f"expected {nd - 1}D or {nd}D input (got {input.dim()}D input)")
        feature_dim = input.dim() - (nd - 1)
        if input.size(feature_dim) != self.num_features:
            if self.affine:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features "
                    f"({self.num_features}), but got: {input.size(feature_dim)}.")
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features. You can "
                "silence this warning by not passing in num_features, which is not used "
                "because affine=False", stacklevel=2)
        if input.dim() == nd - 1:
            return self._norm(input.unsqueeze(0)).squeeze(0)
        return self._norm(input)

    def _norm(self, input):
        if self.training or not self.track_running_stats:
            if self.track_running_stats and self.training:
                self._update_running_stats(input)
            return F.instance_norm(input, weight=self.weight, bias=self.bias, eps=self.eps)
        # eval with running statistics: every instance of channel c uses running stats c
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                            self.bias, False, 0.0, self.eps)

    def _update_running_stats(self, input) -> None:
        from ...autograd import no_grad

        momentum = 0.0 if self.momentum is None else self.momentum
        with no_grad():
            rows = input.detach().reshape(input.shape[0], input.shape[1], -1)
            mean = rows.mean(-1).mean(0)
            var = rows.var(-1, correction=1).mean(0)  # unbiased, as batch_norm's update
            self.running_mean.mul_(1 - momentum).add_(mean.to(self.running_mean.dtype),
                                                      alpha=momentum)
            self.running_var.mul_(1 - momentum).add_(var.to(self.running_var.dtype),
                                                     alpha=momentum)


class InstanceNorm1d(_InstanceNorm):
    _batched_ndim = 3


class InstanceNorm2d(_InstanceNorm):
    _batched_ndim = 4


class InstanceNorm3d(_InstanceNorm):
    _batched_ndim = 5


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(creation.ones(*self.normalized_shape, dtype=dtype))
            if bias:
                self.bias = Parameter(creation.zeros(*self.normalized_shape, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(creation.ones(*self.normalized_shape, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device=None, dtype=None):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(creation.ones(num_channels, dtype=dtype))
            self.bias = Parameter(creation.zeros(num_channels, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class LocalResponseNorm(Module):
    """Divide each channel by (k + alpha / size * sum of squares over `size` neighbouring
    channels) ** beta; the window is zero-padded at the channel ends."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.k = k

    def forward(self, input):
        if input.dim() < 3:
            raise ValueError(f"Expected 3D or higher dimensionality input (got {input.dim()} "
                             "dimensions)")
        if input.numel() == 0:
            return input
        c = input.shape[1]
        sq = (input * input).movedim(1, -1)  # channels last, so F.pad pads them
        padded = F.pad(sq, (self.size // 2, (self.size - 1) // 2))
        window = padded.narrow(-1, 0, c)
        for i in range(1, self.size):  # the window's offsets (a loop over `size` ops)
            window = window + padded.narrow(-1, i, c)
        div = (window * (self.alpha / self.size) + self.k).pow(self.beta).movedim(-1, 1)
        return input / div

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
