"""nn.init: in-place initialisers, with torch's fan computations and gain table."""

from __future__ import annotations

import math

import numpy as np

from ..autograd import no_grad
from ..framework.functional import creation as _creation


def calculate_gain(nonlinearity: str, param=None) -> float:
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.dim() < 2:
        raise ValueError(
            "Fan in and fan out can not be computed for tensor with fewer than 2 dimensions"
        )
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _fill_from(tensor, values_tensor):
    with no_grad():
        tensor.copy_(values_tensor)
    return tensor


def uniform_(tensor, a: float = 0.0, b: float = 1.0, generator=None):
    return _fill_from(tensor, _creation_rand(tensor, generator) * (b - a) + a)


def normal_(tensor, mean: float = 0.0, std: float = 1.0, generator=None):
    return _fill_from(tensor, _creation_randn(tensor, generator) * std + mean)


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Inverse-CDF sampling of a normal truncated to [a, b], as torch does."""
    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lo, hi = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
    with no_grad():
        u = _creation_rand(tensor, generator) * (2 * hi - 2 * lo) + (2 * lo - 1)
        v = u.erfinv() if hasattr(u, "erfinv") else _erfinv(u)
        v = v * (std * math.sqrt(2.0)) + mean
        v = v.clamp(min=a, max=b)
        tensor.copy_(v)
    return tensor


def _erfinv(u):
    # Fallback through NumPy on the host when no erfinv op is registered (init only, no grad).
    x = np.asarray(u.numpy(), dtype=np.float64)
    # Giles' single-precision approximation refined by two Newton steps on math.erf.
    w = -np.log((1.0 - x) * (1.0 + x))
    out = np.where(w < 5.0, _poly_small(w - 2.5) * x, _poly_large(np.sqrt(w) - 3.0) * x)
    erf = np.vectorize(math.erf)
    for _ in range(2):
        out = out - (erf(out) - x) / (2.0 / math.sqrt(math.pi) * np.exp(-out * out))
    return _creation.tensor(out, dtype=u.dtype, **_where(u))


def _poly_small(w):
    c = [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941]
    p = np.zeros_like(w)
    for k in c:
        p = p * w + k
    return p


def _poly_large(w):
    c = [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
         -0.0076224613, 0.00943887047, 1.00167406, 2.83297682]
    p = np.zeros_like(w)
    for k in c:
        p = p * w + k
    return p


def constant_(tensor, val: float):
    with no_grad():
        tensor.fill_(val)
    return tensor


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def eye_(tensor):
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill_from(tensor, _creation_eye(tensor))


def xavier_uniform_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    a = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain: float = 1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def kaiming_uniform_(tensor, a: float = 0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None):
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a: float = 0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None):
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor, gain: float = 1.0, generator=None):
    """QR of a normal matrix with the sign fix that makes the result uniformly distributed."""
    if tensor.dim() < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flat = _creation_randn_shape((rows, cols), tensor, generator).numpy().astype(np.float64)
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill_from(tensor, _creation.tensor(q.reshape(tuple(tensor.shape)) * gain,
                                               dtype=tensor.dtype, **_where(tensor)))


def _where(tensor) -> dict:
    """Where an initialiser draws: a global tensor's values are ONE logical random tensor
    made on its placement and SBP (each rank computes only its piece, from the logical
    stream), so the result does not depend on SBP or placement and equals a single-device
    init with the same seed."""
    if tensor.is_global:
        return {"placement": tensor.placement, "sbp": tensor.sbp}
    return {}


def _creation_rand(tensor, generator):
    return _creation.rand(*tensor.shape, dtype=tensor.dtype, generator=generator,
                          **_where(tensor))


def _creation_randn(tensor, generator):
    return _creation.randn(*tensor.shape, dtype=tensor.dtype, generator=generator,
                           **_where(tensor))


def _creation_randn_shape(shape, tensor, generator):
    # orthogonal_ factorises the whole matrix on the host: every rank draws the same logical
    # normal matrix (the generators stay in step) and keeps its piece afterwards.
    return _creation.randn(*shape, dtype=tensor.dtype, generator=generator)


def _creation_eye(tensor):
    return _creation.eye(tensor.shape[0], tensor.shape[1], dtype=tensor.dtype,
                         **_where(tensor))
