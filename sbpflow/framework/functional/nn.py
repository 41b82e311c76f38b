"""torch.nn.functional: activations, softmax, normalisation, dropout, linear, embedding, losses
and attention.

The hot functions call one op each (see ops/nn.py).  Losses, attention, group and batch norm
are composed here from ops, so their gradients come from the ops' rules; they follow torch's
formulas step by step (including its reductions and edge cases) so values match.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..._core import dtype as dt
from ...autograd.grad_mode import no_grad
from ...ops import registry
from .. import interpreter
from ..tensor import Tensor
from . import creation
from ._base import call, inplace_method
from .elementwise import sigmoid, tanh  # F.sigmoid and F.tanh are torch.sigmoid and torch.tanh

# =========================================================================================
# helpers
# =========================================================================================


def _maybe_inplace(name: str, fn, input: Tensor, inplace: bool, **kwargs) -> Tensor:
    """fn(input, **kwargs), written back into input when inplace (torch's `inplace=True`)."""
    if inplace:
        return interpreter.inplace(name + "_", input, fn, (), kwargs)
    return fn(input, **kwargs)


def _reduction_arg(size_average, reduce, reduction: str) -> str:
    """torch's legacy size_average/reduce flags, mapped to a reduction string."""
    if size_average is not None or reduce is not None:
        warnings.warn("size_average and reduce args will be deprecated, please use "
                      "reduction='mean' or 'sum' or 'none' instead.", stacklevel=3)
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = ("mean" if size_average else "sum") if reduce else "none"
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _warn_size_mismatch(input: Tensor, target: Tensor) -> None:
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(
            f"Using a target size ({target.shape}) that is different to the input size "
            f"({input.shape}). This will likely lead to incorrect results due to "
            "broadcasting. Please ensure they have the same size.", stacklevel=3)


def _feature_shape(c: int, ndim: int, class_dim: int) -> tuple[int, ...]:
    """Shape that broadcasts a per-class vector along `class_dim` of an ndim-d tensor."""
    return (c,) + (1,) * (ndim - class_dim - 1)


# =========================================================================================
# activations
# =========================================================================================
def _op_fn(name: str, **fixed):
    def fn(input, **attrs):
        return call(name, input, **fixed, **attrs)

    fn.__name__ = name
    return fn


_relu = _op_fn("relu")
_RELU = registry.get("relu")
_leaky_relu = _op_fn("leaky_relu")
_elu = _op_fn("elu")
_hardtanh = _op_fn("hardtanh")
_silu = _op_fn("silu")
_mish = _op_fn("mish")
_hardsigmoid = _op_fn("hardsigmoid")
_hardswish = _op_fn("hardswish")

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    if not inplace:
        return interpreter.apply(_RELU, (input,), {})
    return _maybe_inplace("relu", _relu, input, inplace)


def _relu_method(self):
    return interpreter.apply(_RELU, (self,), {})


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return _maybe_inplace("leaky_relu", _leaky_relu, input, inplace,
                          negative_slope=negative_slope)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return _maybe_inplace("elu", _elu, input, inplace, alpha=alpha)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("selu", _elu, input, inplace, alpha=_SELU_ALPHA, scale=_SELU_SCALE)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: celu(): alpha must not be 0")
    return _maybe_inplace("celu", _elu, input, inplace, alpha=alpha, input_scale=1.0 / alpha)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    return call("gelu", input, approximate=approximate)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("silu", _silu, input, inplace)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("mish", _mish, input, inplace)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    return call("softplus", input, beta=beta, threshold=threshold)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> Tensor:
    return _maybe_inplace("hardtanh", _hardtanh, input, inplace, min_val=min_val,
                          max_val=max_val)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("hardsigmoid", _hardsigmoid, input, inplace)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    return _maybe_inplace("hardswish", _hardswish, input, inplace)


def logsigmoid(input: Tensor) -> Tensor:
    return call("logsigmoid", input)


def softsign(input: Tensor) -> Tensor:
    return input / (input.abs() + 1)


def tanhshrink(input: Tensor) -> Tensor:
    return input - call("tanh", input)


def _threshold(input: Tensor, threshold: float, value: float) -> Tensor:
    fill = creation.full((), value, dtype=input.dtype)
    return call("where", input > threshold, input, fill)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    return _maybe_inplace("threshold", _threshold, input, inplace, threshold=threshold,
                          value=value)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    n = input.shape[dim]
    if n % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim % input.ndim} "
                           f"is size {n}")
    lead = (("slice", None, None, None),) * (dim % input.ndim)  # the index ops' basic keys
    a = call("slice", input, key=lead + (("slice", 0, n // 2, None),))
    b = call("slice", input, key=lead + (("slice", n // 2, n, None),))
    return a * call("sigmoid", b)


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.numel() not in (1, channels):
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                           f"parameter numbers = {weight.numel()} and channel size = "
                           f"{channels}.")
    if weight.numel() > 1:
        weight = weight.reshape(_feature_shape(channels, input.ndim, 1))
    elif weight.ndim:
        weight = weight.reshape(())
    return call("where", input > 0, input, input * weight)


def _rrelu(input: Tensor, lower: float, upper: float, training: bool) -> Tensor:
    if not training:
        return call("leaky_relu", input, negative_slope=(lower + upper) / 2)
    # A slope drawn uniformly in [lower, upper] for every element (used where x < 0).
    slope = creation.rand_like(input) * (upper - lower) + lower
    return call("where", input >= 0, input, input * slope)


def rrelu(input: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3,
          training: bool = False, inplace: bool = False) -> Tensor:
    if lower > upper:
        raise RuntimeError(f"Lower bound should be less than or equal to the upper bound, got "
                           f"{lower} and {upper}")
    return _maybe_inplace("rrelu", _rrelu, input, inplace, lower=lower, upper=upper,
                          training=training)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    zero = creation.zeros((), dtype=input.dtype)
    return call("where", input.abs() > lambd, input, zero)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    # x - clamp(x, -l, l): shifts by l outside the band, 0 inside; the gradient is 1 outside.
    return input - input.clamp(-lambd, lambd)


relu_ = inplace_method("relu_", _relu)
rrelu_ = inplace_method("rrelu_", rrelu)
leaky_relu_ = inplace_method("leaky_relu_", leaky_relu)
elu_ = inplace_method("elu_", elu)
selu_ = inplace_method("selu_", selu)
celu_ = inplace_method("celu_", celu)
hardtanh_ = inplace_method("hardtanh_", hardtanh)
threshold_ = inplace_method("threshold_", threshold)


# =========================================================================================
# softmax family
# =========================================================================================
def _softmax_dim(name: str, ndim: int, dim) -> int:
    if dim is not None:
        return dim
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  "to include dim=X as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    return call("softmax", input, dim=_softmax_dim("softmax", input.ndim, dim), dtype=dtype)


def log_softmax(input: Tensor, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    return call("log_softmax", input, dim=_softmax_dim("log_softmax", input.ndim, dim),
                dtype=dtype)


def softmin(input: Tensor, dim=None, _stacklevel: int = 3, dtype=None) -> Tensor:
    dim = _softmax_dim("softmin", input.ndim, dim)
    if dtype is not None:
        input = input.to(dtype)
    return call("softmax", call("neg", input), dim=dim)


# =========================================================================================
# dropout
# =========================================================================================
def _check_p(p: float) -> None:
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _dropout(input: Tensor, p: float) -> Tensor:
    return call("dropout", input, p=p)[0]


def dropout(input: Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> Tensor:
    _check_p(p)
    # As torch: off in eval mode and for p = 0 the input itself comes back.
    if not training or p == 0.0 or input.numel() == 0:
        return input
    return _maybe_inplace("dropout", _dropout, input, inplace, p=float(p))


def _keep_mask(input: Tensor, p: float, shape) -> Tensor:
    """A 0/1 mask of `shape` in input's dtype: each entry kept with probability 1 - p."""
    ones = creation.ones(tuple(shape), dtype=input.dtype, device=input._where())
    return call("dropout", ones, p=p)[1].to(input.dtype)


def _feature_noise_shape(name: str, input: Tensor) -> tuple[int, ...]:
    # ATen's make_feature_noise: one draw per (batch, channel), shared over the rest.
    if input.ndim < 2:
        raise RuntimeError(f"{name}: Feature dropout requires at least 2 dimensions in the "
                           f"input, got a {input.ndim}D input")
    return tuple(input.shape[:2]) + (1,) * (input.ndim - 2)


def _feature_dropout_impl(name, input, p, training, inplace, alpha=False, feature=True):
    """ATen's _dropout_impl: feature dropout draws per (N, C); alpha dropout keeps SELU's
    statistics."""
    if not training or p == 0.0 or input.numel() == 0:
        return input
    shape = _feature_noise_shape(name, input) if feature else tuple(input.shape)
    if p == 1.0:
        zero = creation.zeros((), dtype=input.dtype, device=input._where())
        return input.mul_(zero) if inplace else input * zero
    keep = _keep_mask(input, p, shape)
    if alpha:
        # out = x * keep * a + b, b = (keep - 1) * alpha * a + alpha * a * p: SELU's mean and
        # variance are kept (torch's constants and order of operations).
        a = 1.0 / math.sqrt((_ALPHA_PRIME * _ALPHA_PRIME * p + 1) * (1 - p))
        b = (keep - 1) * (_ALPHA_PRIME * a) + _ALPHA_PRIME * a * p
        noise = keep * a
        if inplace:
            return input.mul_(noise).add_(b)
        return input * noise + b
    noise = keep / (1 - p)
    if inplace:
        return input.mul_(noise)
    return input * noise


_ALPHA_PRIME = 1.7580993408473766  # -SELU's negative saturation value, scale * alpha


def _unsqueezed_feature_dropout(name, input, p, training, inplace, batched_ndim):
    if input.ndim == batched_ndim:
        return _feature_dropout_impl(name, input, p, training, inplace)
    # Unbatched input: one draw per channel.
    x = input.unsqueeze(0)
    out = _feature_dropout_impl(name, x, p, training, False)
    if out is x:
        return input
    out = out.squeeze(0)
    if inplace:
        interpreter.assign(input, out, name + "_")
        return input
    return out


def dropout1d(input, p=0.5, training=True, inplace=False):
    _check_p(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. "
            "Note that dropout1d exists to provide channel-wise dropout on inputs with 1 "
            "spatial dimension, a channel dimension, and an optional batch dimension "
            "(i.e. 2D or 3D inputs).")
    return _unsqueezed_feature_dropout("dropout1d", input, p, training, inplace, 3)


def dropout2d(input, p=0.5, training=True, inplace=False):
    _check_p(p)
    if input.ndim not in (3, 4):
        warnings.warn(
            f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated "
            "and will result in an error in a future release. To retain the behavior "
            "and silence this warning, please use dropout instead. Note that dropout2d "
            "exists to provide channel-wise dropout on inputs with 2 spatial dimensions, "
            "a channel dimension, and an optional batch dimension (i.e. 3D or 4D inputs).",
            stacklevel=2)
    if input.ndim == 3:
        # torch keeps its historical reading of 3-D input: (N, C, L), not unbatched (C, H, W).
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise "
            "1D dropout behavior is desired - input is interpreted as shape (N, C, L), where C "
            "is the channel dim. This behavior will change in a future release to interpret the "
            "input as one without a batch dimension, i.e. shape (C, H, W). To maintain the 1D "
            "channel-wise dropout behavior, please switch to using dropout1d instead.",
            stacklevel=2)
    return _feature_dropout_impl("dropout2d", input, p, training, inplace)


def dropout3d(input, p=0.5, training=True, inplace=False):
    _check_p(p)
    if input.ndim not in (4, 5):
        warnings.warn(
            f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is deprecated "
            "and will result in an error in a future release. To retain the behavior "
            "and silence this warning, please use dropout instead. Note that dropout3d "
            "exists to provide channel-wise dropout on inputs with 3 spatial dimensions, "
            "a channel dimension, and an optional batch dimension (i.e. 4D or 5D inputs).",
            stacklevel=2)
    if input.ndim == 5:
        return _feature_dropout_impl("dropout3d", input, p, training, inplace)
    return _unsqueezed_feature_dropout("dropout3d", input, p, training, inplace, 5)


def alpha_dropout(input, p=0.5, training=False, inplace=False):
    _check_p(p)
    return _feature_dropout_impl("alpha_dropout", input, p, training, inplace, alpha=True,
                                 feature=False)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False):
    _check_p(p)
    return _feature_dropout_impl("feature_alpha_dropout", input, p, training, inplace,
                                 alpha=True)


# =========================================================================================
# linear
# =========================================================================================
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    if weight.ndim == 2 and bias is not None:
        return call("linear", input, weight, bias)
    w = weight if weight.ndim < 2 else call("transpose", weight, dim0=0, dim1=1)
    out = call("matmul", input, w)
    return out if bias is None else out + bias


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None):
    if weight.ndim != 3:
        raise RuntimeError(f"bilinear(): weight must be three-dimensional, got "
                           f"{weight.ndim}-d")
    out_f, in1, in2 = weight.shape
    if input1.ndim != input2.ndim or tuple(input1.shape[:-1]) != tuple(input2.shape[:-1]):
        raise RuntimeError("bilinear(): input batch dimensions do not match: got "
                           f"{list(input1.shape[:-1])} and {list(input2.shape[:-1])}")
    if input1.shape[-1] != in1:
        raise RuntimeError(f"bilinear(): input1 size does not match weight size: got "
                           f"{input1.shape[-1]} but expected {in1}")
    if input2.shape[-1] != in2:
        raise RuntimeError(f"bilinear(): input2 size does not match weight size: got "
                           f"{input2.shape[-1]} but expected {in2}")
    lead = tuple(input1.shape[:-1])
    # y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j]: one matmul, then a row-wise dot.
    w = weight.permute(1, 0, 2).reshape(in1, out_f * in2)
    t = call("matmul", input1, w).reshape(lead + (out_f, in2))
    y = (t * input2.reshape(lead + (1, in2))).sum(-1)
    return y if bias is None else y + bias


# =========================================================================================
# normalisation
# =========================================================================================
def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    # The op always takes an affine pair; identity ones stand in for missing ones.
    if weight is None:
        weight = creation.ones(ns, dtype=input.dtype, device=input._where())
    if bias is None:
        bias = creation.zeros(ns, dtype=input.dtype, device=input._where())
    return call("layer_norm", input, weight, bias, normalized_shape=ns, eps=eps)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """input / sqrt(mean(input**2 over the normalized dims) + eps) * weight, computed in
    float32 for 16-bit inputs; eps defaults to the machine epsilon of that computing dtype."""
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(ns) > input.ndim:
        raise ValueError(f"Input tensor must have at least {len(ns)} dimensions, but got "
                         f"{input.ndim}")
    if tuple(input.shape[input.ndim - len(ns):]) != ns:
        raise RuntimeError(f"Given normalized_shape={list(ns)}, expected input with shape "
                           f"[*{', '.join(map(str, ns))}], but got input of size"
                           f"{list(input.shape)}")
    if weight is not None and tuple(weight.shape) != ns:
        raise RuntimeError(f"Expected weight to be of same shape as normalized_shape, but got "
                           f"weight of shape {list(weight.shape)} and normalized_shape = "
                           f"{list(ns)}")
    compute = dt.float32 if input.dtype.itemsize < 4 else input.dtype
    if eps is None:
        eps = float(np.finfo(compute.np).eps)
    x = input.to(compute)
    dims = tuple(range(input.ndim - len(ns), input.ndim))
    y = x * (x * x).mean(dims, keepdim=True).add(eps).rsqrt()
    if weight is not None:
        y = y * weight
    return y.to(input.dtype)


def _channel_affine(y: Tensor, weight, bias, ndim: int) -> Tensor:
    shape = _feature_shape(y.shape[1], ndim, 1)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _check_channel_vector(name: str, arg: str, t, c: int, input: Tensor) -> None:
    if t is not None and tuple(t.shape) != (c,):
        raise RuntimeError(f"{name}(): Expected {arg} to be a vector of size equal to the "
                           f"number of channels in input, but got {arg} of shape "
                           f"{list(t.shape)} and input of shape {list(input.shape)}")


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received "
                           f"{input.ndim}")
    n, c = input.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by "
                           f"num_groups, but got input of shape {list(input.shape)} and "
                           f"num_groups={num_groups}")
    _check_channel_vector("group_norm", "weight", weight, c, input)
    _check_channel_vector("group_norm", "bias", bias, c, input)
    # Each (sample, group) is one row of a layer norm without affine.
    grouped = input.reshape(n, num_groups, -1)
    y = layer_norm(grouped, (grouped.shape[-1],), eps=eps).reshape(tuple(input.shape))
    return _channel_affine(y, weight, bias, input.ndim)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool):
        raise TypeError(f"batch_norm(): argument 'momentum' must be float, not "
                        f"{type(momentum).__name__}")
    if input.ndim < 2:
        raise ValueError(f"batch_norm(): expected 2D or more input (got {input.ndim}D input)")
    c = input.shape[1]
    count = input.numel() // max(c, 1)
    for arg, t in (("running_mean", running_mean), ("running_var", running_var)):
        if t is not None and tuple(t.shape) != (c,):
            raise RuntimeError(f"{arg} should contain {c} elements not {t.numel()}")
    _check_channel_vector("batch_norm", "weight", weight, c, input)
    _check_channel_vector("batch_norm", "bias", bias, c, input)
    shape = _feature_shape(c, input.ndim, 1)
    axes = (0,) + tuple(range(2, input.ndim))
    if training:
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {input.shape}")
        if (weight is not None and bias is not None and input._gl is None
                and input.dtype in _BN_FUSED and weight.dtype is input.dtype
                and bias.dtype is input.dtype):
            # One op (a fused loop per channel) and one gradient op; global tensors, half
            # types and affine=False keep the composition below, whose sums box as partials.
            y, mean, var = call("batch_norm", input, weight, bias, eps=eps)
            _update_running_stats(running_mean, running_var, mean, var, momentum, count)
            return y
        mean = input.sum(dim=axes, keepdim=True) * (1.0 / count)
        centered = input - mean
        var = (centered * centered).sum(dim=axes, keepdim=True) * (1.0 / count)
        _update_running_stats(running_mean, running_var, mean, var, momentum, count)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")
        mean = running_mean.reshape(shape)
        var = running_var.reshape(shape)
        centered = input - mean
    y = centered * call("rsqrt", var + eps)
    return _channel_affine(y, weight, bias, input.ndim)


_BN_FUSED = (dt.float32, dt.float64)


def _update_running_stats(running_mean, running_var, mean, var, momentum, count):
    """running = (1 - momentum) * running + momentum * batch statistic, written in place
    without autograd; the variance stored is the unbiased one, as torch does."""
    with no_grad():
        for running, stat in ((running_mean, mean), (running_var, var * (count / (count - 1)))):
            if running is None:
                continue
            new = running * (1.0 - momentum) + stat.reshape(tuple(running.shape)) * momentum
            if new.dtype is not running.dtype:
                new = new.to(running.dtype)
            interpreter.assign(running, new, "batch_norm")


def instance_norm(input: Tensor, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5):
    if not use_input_stats or running_mean is not None or running_var is not None:
        raise NotImplementedError("instance_norm(): running statistics are not supported")
    if input.ndim < 3:
        raise ValueError(f"instance_norm(): expected 3D or more input (got {input.ndim}D)")
    n, c = input.shape[:2]
    rows = input.reshape(n, c, -1)
    y = layer_norm(rows, (rows.shape[-1],), eps=eps).reshape(tuple(input.shape))
    return _channel_affine(y, weight, bias, input.ndim)


# =========================================================================================
# embedding, one_hot
# =========================================================================================
def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    if sparse:
        raise NotImplementedError("embedding(): sparse gradients are not supported")
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    num = weight.shape[0]
    if padding_idx is not None:
        if padding_idx >= num or padding_idx < -num:
            raise ValueError(f"Padding_idx must be within num_embeddings, got {padding_idx} "
                             f"for {num} embeddings")
        padding_idx %= num
    # Index ranges are data-dependent: the kernels check them (ops/nn.py, _out_of_range), so
    # a call never syncs; a bad index raises at the next sync point.
    if max_norm is not None:
        _embedding_renorm(weight, input, max_norm, norm_type)
    return call("embedding", input, weight, padding_idx=padding_idx,
                scale_grad_by_freq=scale_grad_by_freq)


def _embedding_renorm(weight: Tensor, indices: Tensor, max_norm: float, norm_type: float):
    """torch.embedding_renorm_: rows looked up whose norm exceeds max_norm are scaled to it, in
    place and outside autograd."""
    with no_grad():
        flat = indices.reshape(-1)
        ones = creation.ones((flat.shape[0], 1), dtype=weight.dtype, device=weight._where())
        used = call("embedding_grad", ones, flat, num_weights=weight.shape[0]) > 0
        if norm_type == 2:
            norms = (weight * weight).sum(dim=1, keepdim=True).sqrt()
        elif norm_type == math.inf:
            norms = weight.abs().amax(dim=1, keepdim=True)
        else:
            norms = (weight.abs() ** norm_type).sum(dim=1, keepdim=True) ** (1.0 / norm_type)
        scale = max_norm / (norms + 1e-7)
        one = creation.ones((), dtype=weight.dtype)
        scale = call("where", used, call("where", norms > max_norm, scale, one), one)
        interpreter.assign(weight, weight * scale, "embedding_renorm_")


def embedding_bag(input: Tensor, weight: Tensor, offsets: Tensor | None = None,
                  max_norm: float | None = None, norm_type: float = 2,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int | None = None) -> Tensor:
    """Sums, means or maxima over bags of embedding rows: one `embedding_bag` op."""
    if sparse:
        raise NotImplementedError("embedding_bag(): sparse gradients are not supported")
    if weight.ndim != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension "
                         f"{weight.ndim}")
    if input.dtype not in (dt.int64, dt.int32):
        raise TypeError(f"embedding_bag(): expected input of type Long or Int, got "
                        f"{input.dtype.name}")
    if mode not in ("sum", "mean", "max"):
        raise ValueError("mode has to be one of sum, mean or max")
    if per_sample_weights is not None and tuple(input.shape) != tuple(
            per_sample_weights.shape):
        raise ValueError(f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) "
                         f"is not None, then it must have the same shape as the input "
                         f"({input.shape})")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(
            "embedding_bag: per_sample_weights was not None. per_sample_weights is only "
            f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
            "GitHub.")
    if scale_grad_by_freq and mode == "max":
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    num = weight.shape[0]
    if padding_idx is not None:
        if padding_idx >= num or padding_idx < -num:
            raise AssertionError("padding_idx must be within num_embeddings")
        padding_idx %= num
    where = weight._where()
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated "
                             "is a mini-batch of fixed length sequences. However, found "
                             f"offsets of type {type(offsets).__name__}")
        bags, length = input.shape
        offsets = creation.arange(0, bags * length, length, dtype=input.dtype, device=where)
        input = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif input.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.ndim != 1:
            raise ValueError("offsets has to be a 1D Tensor")
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension "
                         f"{input.ndim}")
    if max_norm is not None:
        _embedding_renorm(weight, input, max_norm, norm_type)
    if per_sample_weights is None:
        per_sample_weights = creation.ones(tuple(input.shape), dtype=weight.dtype, device=where)
    return call("embedding_bag", weight, input, offsets, per_sample_weights, mode=mode,
                padding_idx=padding_idx, include_last_offset=bool(include_last_offset),
                scale_grad_by_freq=bool(scale_grad_by_freq))[0]


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    if tensor.dtype is not dt.int64:
        raise TypeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        # The output's shape depends on the data: this one sync is unavoidable (torch too).
        num_classes = int(tensor.max().item()) + 1
    # Class values are checked by the kernel, without a sync.
    return call("one_hot", tensor, num_classes=num_classes)


# =========================================================================================
# losses
# =========================================================================================
def _class_count(input: Tensor, name: str) -> tuple[int, int]:
    """(class dim, number of classes) of a loss input (N, C, d1, ...) or (C,)."""
    if input.ndim == 0:
        raise ValueError(f"{name}(): Expected 1 or more dimensions (got 0)")
    class_dim = 1 if input.ndim >= 2 else 0
    return class_dim, input.shape[class_dim]


def _nll(input: Tensor, target: Tensor, weight, reduction: str, ignore_index: int):
    """(loss with reduction 'none' or 'sum', total weight of the counted targets)."""
    _, c = _class_count(input, "nll_loss")
    if input.ndim == 1 and target.ndim == 1:
        if target.shape[0] != 1:
            raise ValueError(f"For 1D input, 1D target must have size 1, but got target size: "
                             f"{target.shape[0]}")
        target = target.reshape(())
    if weight is None:
        weight = creation.ones((c,), dtype=input.dtype, device=input._where())
    # Targets outside [0, c) are checked by the kernel (no sync per call; ignore_index skipped).
    return call("nll_loss", input, target, weight,
                reduction="none" if reduction == "none" else "sum", ignore_index=ignore_index)


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    out, total_weight = _nll(input, target, weight, reduction, ignore_index)
    # mean = weighted sum / sum of the counted weights (nan when nothing counts, as torch)
    return out / total_weight if reduction == "mean" else out


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                           f"{label_smoothing}")
    class_dim, c = _class_count(input, "cross_entropy")
    logp = log_softmax(input, class_dim)
    if target.dtype.is_floating_point:
        return _cross_entropy_probs(logp, target, weight, reduction, label_smoothing,
                                    class_dim, c)
    out, total_weight = _nll(logp, target, weight, reduction, ignore_index)
    nll = out / total_weight if reduction == "mean" else out
    if label_smoothing == 0.0:
        return nll
    # torch: the smoothing term is -sum_c w_c logp_c per sample, zero at ignored targets, and
    # its mean divides by the same total weight as the nll term.
    if weight is not None:
        logp = logp * weight.reshape(_feature_shape(c, input.ndim, class_dim))
    smooth = call("neg", logp.sum(dim=class_dim))
    if target.ndim == smooth.ndim:
        smooth = smooth * (target != ignore_index)
    if reduction == "mean":
        smooth = smooth.sum() / total_weight
    elif reduction == "sum":
        smooth = smooth.sum()
    return nll * (1.0 - label_smoothing) + smooth * (label_smoothing / c)


def _cross_entropy_probs(logp, target, weight, reduction, label_smoothing, class_dim, c):
    if tuple(target.shape) != tuple(logp.shape):
        raise RuntimeError(f"cross_entropy(): class-probability target must have the input's "
                           f"shape {list(logp.shape)}, got {list(target.shape)}")
    if label_smoothing > 0.0:
        target = target * (1.0 - label_smoothing) + label_smoothing / c
    terms = logp * target
    if weight is not None:
        terms = terms * weight.reshape(_feature_shape(c, logp.ndim, class_dim))
    loss = call("neg", terms.sum(dim=class_dim))
    if reduction == "mean":
        # torch divides by the number of samples (all positions but the class axis).
        count = logp.numel() // c if c else 0
        return loss.sum() / count if count else loss.sum() * float("nan")
    return _reduce(loss, reduction)


def _pointwise_loss(input, target, weight, reduction, elementwise, weighted_mean):
    _warn_size_mismatch(input, target)
    loss = elementwise(input - target)
    if weight is None:
        return _reduce(loss, reduction)
    if tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "mean":
        return weighted_mean(loss, weight)
    return _reduce(loss, reduction)


def _sum_over_weight(loss, weight):
    return loss.sum() / weight.sum()


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
             reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    return _pointwise_loss(input, target, weight, reduction, lambda d: d * d,
                           _sum_over_weight)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
            reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    return _pointwise_loss(input, target, weight, reduction, lambda d: d.abs(),
                           _sum_over_weight)


def _host_lengths(name: str, lengths, n: int) -> list[int]:
    """Lengths (a tensor, or a sequence of ints) as host ints; a tensor is read (a sync, as
    torch's CPU kernel reads them too)."""
    if isinstance(lengths, Tensor):
        if lengths.dtype.is_floating_point or lengths.dtype is dt.bool_:
            raise RuntimeError(f"ctc_loss(): {name} must be an integer tensor, got "
                               f"{lengths.dtype.name}")
        values = lengths.reshape(-1).tolist()
    elif isinstance(lengths, (int, np.integer)):
        values = [int(lengths)]
    else:
        values = [int(v) for v in lengths]
    if len(values) != n:
        raise RuntimeError(f"{name} must be of size batch_size")
    return values


def _ctc_host_lengths(targets, input_lengths, target_lengths, t_max, n, where):
    """Lengths read on the host (given as sequences, or needed to unpack 1-D targets) and
    checked; 1-D concatenated targets become padded (N, max length)."""
    il = _host_lengths("input_lengths", input_lengths, n)
    tl = _host_lengths("target_lengths", target_lengths, n)
    for v in il:
        if v > t_max:
            raise RuntimeError(f"Expected input_lengths to have value at most {t_max}, but got "
                               f"value {v} (while checking arguments for ctc_loss)")
    if any(v < 0 for v in il + tl):
        raise RuntimeError("ctc_loss(): input and target lengths must be non-negative")
    widest = max(tl, default=0)
    if targets.ndim == 1:
        total = sum(tl)
        if targets.shape[0] != total:
            raise RuntimeError(f"Expected tensor to have size {total} at dimension 0, but got "
                               f"size {targets.shape[0]} for argument #2 'targets' (while "
                               "checking arguments for ctc_loss)")
        # Concatenated targets -> padded (N, max length): one gather with a host-built index.
        starts = np.cumsum([0] + tl[:-1])
        index = starts[:, None] + np.arange(widest)[None, :]
        index = np.minimum(index, max(total - 1, 0))
        if total == 0:
            targets = creation.zeros((n, widest), dtype=targets.dtype,
                                     device=targets._where())
        else:
            targets = targets[creation.tensor(index, dtype=dt.int64,
                                              device=targets._where())]
    elif targets.ndim == 2:
        if targets.shape[1] < widest:
            raise RuntimeError(f"Expected tensor to have size at least {widest} at dimension 1, "
                               f"but got size {targets.shape[1]} for argument #2 'targets' "
                               "(while checking arguments for ctc_loss)")
        if targets.shape[0] != n:
            raise RuntimeError(f"Expected tensor to have size {n} at dimension 0, but got size "
                               f"{targets.shape[0]} for argument #2 'targets'")
    else:
        raise RuntimeError(f"ctc_loss(): expected targets of 1 or 2 dimensions, got "
                           f"{targets.ndim}")
    return (creation.tensor(il, dtype=dt.int64, device=where),
            creation.tensor(tl, dtype=dt.int64, device=where), targets)


def ctc_loss(log_probs: Tensor, targets: Tensor, input_lengths, target_lengths,
             blank: int = 0, reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """Connectionist temporal classification loss (the `ctc_loss` op per sample)."""
    reduction = _reduction_arg(None, None, reduction)
    if log_probs.ndim == 2:  # unbatched: (T, C) with a 1-D target
        log_probs = log_probs.unsqueeze(1)
        targets = targets.unsqueeze(0)
    if log_probs.ndim != 3:
        raise RuntimeError(f"ctc_loss(): expected log_probs of shape (T, N, C) or (T, C), got "
                           f"{list(log_probs.shape)}")
    t_max, n, c = log_probs.shape
    if not 0 <= blank < c:
        raise RuntimeError("blank must be in label range")
    where = log_probs._where()
    if targets.ndim == 2 and isinstance(input_lengths, Tensor) and \
            isinstance(target_lengths, Tensor):
        # Padded targets with tensor lengths: no host read here (so nn.Graph traces it); the
        # kernel checks the lengths' values.
        il_t, tl_t = input_lengths.reshape(-1), target_lengths.reshape(-1)
        for arg, t in (("input_lengths", il_t), ("target_lengths", tl_t)):
            if t.dtype.is_floating_point or t.dtype is dt.bool_:
                raise RuntimeError(f"ctc_loss(): {arg} must be an integer tensor, got "
                                   f"{t.dtype.name}")
            if t.shape[0] != n:
                raise RuntimeError(f"{arg} must be of size batch_size")
        if targets.shape[0] != n:
            raise RuntimeError(f"Expected tensor to have size {n} at dimension 0, but got size "
                               f"{targets.shape[0]} for argument #2 'targets'")
    else:
        il_t, tl_t, targets = _ctc_host_lengths(targets, input_lengths, target_lengths,
                                                t_max, n, where)
    loss = call("ctc_loss", log_probs, targets, il_t, tl_t, blank=int(blank),
                zero_infinity=bool(zero_infinity))
    if reduction == "mean":
        return (loss / tl_t.clamp(min=1).to(loss.dtype)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _quadratic_near_zero(d: Tensor, width: float, quad_scale: float, lin_scale: float):
    """quad_scale * d^2 / 2 for |d| < width, lin_scale * (|d| - width / 2) beyond."""
    a = d.abs()
    return call("where", a < width, d * d * (0.5 * quad_scale), (a - 0.5 * width) * lin_scale)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    if beta == 0.0:
        return l1_loss(input, target, reduction=reduction)
    return _pointwise_loss(input, target, None, reduction,
                           lambda d: _quadratic_near_zero(d, beta, 1.0 / beta, 1.0), None)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    reduction = _reduction_arg(None, None, reduction)
    if delta <= 0:
        raise RuntimeError(f"huber_loss does not support non-positive values for delta, got "
                           f"{delta}")
    return _pointwise_loss(input, target, weight, reduction,
                           lambda d: _quadratic_near_zero(d, delta, 1.0, delta),
                           lambda loss, w: loss.mean())


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    loss = call("binary_cross_entropy", input, target)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor,
                                     weight: Tensor | None = None, size_average=None,
                                     reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({target.shape}) must be the same as input size "
                         f"({input.shape})")
    # torch: (1 - y) * x - lw * log_sigmoid(x), lw = 1 + (pos_weight - 1) * y
    log_sig = call("logsigmoid", input)
    if pos_weight is not None:
        log_sig = log_sig * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sig
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    if reduction == "batchmean":
        legacy = _reduction_arg(size_average, reduce, "sum")
        reduction = "batchmean" if legacy == "sum" else legacy
    else:
        reduction = _reduction_arg(size_average, reduce, reduction)
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", stacklevel=2)
    if log_target:
        loss = call("exp", target) * (target - input)
    else:
        # xlogy(t, t) - t * x: the 0 * log(0) terms are 0.
        positive = target > 0
        one = creation.ones((), dtype=target.dtype)
        safe = call("where", positive, target, one)
        loss = target * call("log", safe) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction)


def soft_margin_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                     reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    # log(1 + exp(-y x)), evaluated stably (softplus without the linear cut-off)
    return _reduce(softplus(-(target * input), threshold=float("inf")), reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                size_average=None, reduce=None,
                                reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    loss = call("neg", target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    class_dim = input.ndim - 1
    loss = loss.sum(dim=class_dim) * (1.0 / input.shape[class_dim])
    return _reduce(loss, reduction)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    if input1.ndim != input2.ndim or input1.ndim != target.ndim:
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same "
                           f"dimension but got sizes: input1: {input1.shape}, input2: "
                           f"{input2.shape}, target: {target.shape} ")
    return _reduce((call("neg", target) * (input1 - input2) + margin).clamp(min=0), reduction)


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0, size_average=None,
                         reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    zero = creation.zeros((), dtype=input.dtype)
    # torch: margin term where target != 1, the input itself where target != -1
    margin_term = call("where", target != 1, (call("neg", input) + margin).clamp(min=0), zero)
    self_term = call("where", target != -1, input, zero)
    return _reduce(margin_term + self_term, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    dim = 1 if input1.ndim == 2 else 0
    eps = 1e-12  # torch's EPSILON on the squared magnitudes
    dot = (input1 * input2).sum(dim=dim)
    mag1 = (input1 * input1).sum(dim=dim) + eps
    mag2 = (input2 * input2).sum(dim=dim) + eps
    cos = dot / (mag1 * mag2).sqrt()
    zero = creation.zeros((), dtype=cos.dtype)
    loss = call("where", target == 1, 1 - cos, zero) + \
        call("where", target == -1, (cos - margin).clamp(min=0), zero)
    return _reduce(loss, reduction)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,
                     size_average=None, eps: float = 1e-8, reduce=None,
                     reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    if log_input:
        loss = call("exp", input) - target * input
    else:
        loss = input - target * call("log", input + eps)
    if full:
        # Stirling's approximation of log(target!), counted only where target > 1.
        big = target > 1
        safe = call("where", big, target, creation.ones((), dtype=target.dtype))
        stirling = safe * call("log", safe) - safe + call("log", safe * (2 * math.pi)) * 0.5
        loss = loss + call("where", big, stirling, creation.zeros((), dtype=loss.dtype))
    return _reduce(loss, reduction)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0,
                        p: float = 2, eps: float = 1e-6, swap: bool = False, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
    reduction = _reduction_arg(size_average, reduce, reduction)
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_neg = call("minimum", d_neg, pairwise_distance(positive, negative, p, eps))
    return _reduce((d_pos - d_neg + margin).clamp(min=0), reduction)


# =========================================================================================
# attention
# =========================================================================================
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale=None,
                                 enable_gqa: bool = False) -> Tensor:
    """softmax(q k^T * scale + mask) v, as torch's math reference.  Rows whose every score is
    masked give zeros (torch's safe softmax), with zero gradients."""
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RuntimeError("scaled_dot_product_attention(): query, key and value must be at "
                           "least 2-D")
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set "
                           "when is_causal=True")
    if query.shape[-1] != key.shape[-1]:
        raise RuntimeError(f"scaled_dot_product_attention(): query and key must have the same "
                           f"embedding size, got {query.shape[-1]} and {key.shape[-1]}")
    if enable_gqa and query.ndim >= 3:
        key, value = _repeat_kv_heads(query, key), _repeat_kv_heads(query, value)
    length, source = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = call("matmul", query, call("transpose", key, dim0=-2, dim1=-1)) * scale
    neg_inf = creation.full((), float("-inf"), dtype=scores.dtype)
    if is_causal:
        keep = creation.tensor(np.tril(np.ones((length, source), dtype=bool)),
                               device=query._where())
        scores = call("where", keep, scores, neg_inf)
    if attn_mask is not None:
        if attn_mask.dtype is dt.bool_:
            scores = call("where", attn_mask, scores, neg_inf)
        else:
            scores = scores + attn_mask
    dead = None
    if is_causal or attn_mask is not None:
        # Fully masked rows: softmax would be 0/0.  Give them finite scores, zero them after.
        dead = (scores == float("-inf")).all(dim=-1, keepdim=True)
        zero = creation.zeros((), dtype=scores.dtype)
        scores = call("where", dead, zero, scores)
    weights = call("softmax", scores, dim=-1)
    if dead is not None:
        weights = call("where", dead, creation.zeros((), dtype=scores.dtype), weights)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, training=True)
    return call("matmul", weights, value)


def _repeat_kv_heads(query: Tensor, kv: Tensor) -> Tensor:
    """Grouped-query attention: each key/value head serves query_heads / kv_heads queries."""
    hq, hk = query.shape[-3], kv.shape[-3]
    if hq == hk:
        return kv
    if hk == 0 or hq % hk:
        raise RuntimeError(f"scaled_dot_product_attention(): number of query heads ({hq}) must "
                           f"be a multiple of key/value heads ({hk})")
    lead, (s, e) = tuple(kv.shape[:-3]), tuple(kv.shape[-2:])
    grouped = kv.reshape(lead + (hk, 1, s, e)).expand(*lead, hk, hq // hk, s, e)
    return grouped.reshape(lead + (hq, s, e))


# =========================================================================================
# distances
# =========================================================================================
def _vector_norm(x: Tensor, p: float, dim: int) -> Tensor:
    if p == 2:
        return (x * x).sum(dim=dim, keepdim=True).sqrt()
    if p == 1:
        return x.abs().sum(dim=dim, keepdim=True)
    return (x.abs() ** p).sum(dim=dim, keepdim=True) ** (1.0 / p)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,
              out=None) -> Tensor:
    if out is not None:
        raise NotImplementedError("normalize(): out= is not supported")
    return input / _vector_norm(input, p, dim).clamp(min=eps)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    # torch: the p-norm of x1 - x2 + eps over the last dimension
    out = _vector_norm(x1 - x2 + eps, p, -1)
    return out if keepdim else out.reshape(tuple(out.shape[:-1]))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    # As torch: scale each vector by its (clamped) norm first, then take the dot product.
    x1n = x1 / _vector_norm(x1, 2, dim).clamp(min=eps)
    x2n = x2 / _vector_norm(x2, 2, dim).clamp(min=eps)
    return (x1n * x2n).sum(dim=dim)


METHODS = {
    "relu": _relu_method,
    # OneFlow's Tensor methods of three activations (torch has only the functions)
    "mish": lambda self: mish(self), "selu": lambda self: selu(self),
    "silu": lambda self: silu(self),
    "relu_": relu_,
    "softmax": lambda self, dim, dtype=None: call("softmax", self, dim=dim, dtype=dtype),
    "log_softmax": lambda self, dim, dtype=None: call("log_softmax", self, dim=dim,
                                                      dtype=dtype),
}

__all__ = [
    "batch_norm", "bilinear", "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu",
    "celu_", "cosine_embedding_loss", "cosine_similarity", "cross_entropy", "ctc_loss",
    "dropout", "dropout1d", "alpha_dropout", "feature_alpha_dropout",
    "dropout2d", "dropout3d", "elu", "elu_", "embedding", "embedding_bag", "gelu", "glu",
    "group_norm",
    "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "hardtanh_", "hinge_embedding_loss",
    "huber_loss", "instance_norm", "kl_div", "l1_loss", "layer_norm", "leaky_relu", "leaky_relu_",
    "linear", "log_softmax", "logsigmoid", "margin_ranking_loss", "mish", "mse_loss",
    "multilabel_soft_margin_loss", "nll_loss", "normalize", "one_hot", "pairwise_distance",
    "poisson_nll_loss", "prelu", "relu", "relu6", "relu_", "rms_norm", "rrelu", "rrelu_",
    "scaled_dot_product_attention", "selu", "selu_", "sigmoid", "silu", "smooth_l1_loss",
    "soft_margin_loss", "softmax", "softmin", "softplus", "softshrink", "softsign", "tanh",
    "tanhshrink", "threshold", "threshold_", "triplet_margin_loss",
]
