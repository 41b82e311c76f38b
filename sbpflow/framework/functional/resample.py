"""Functional resampling: interpolate, pixel_shuffle, unfold, fold (torch.nn.functional).

`interpolate` follows torch's argument handling step by step (which of size / scale_factor,
recompute_scale_factor, the mode for the input's rank) and hands batched input to one op per
mode family: `upsample_nearest` (nearest, nearest-exact), `upsample_linear` (linear, bilinear,
trilinear), `upsample_bicubic2d`; `area` is adaptive average pooling, as in torch.  A scale
factor that is not recomputed travels to the op, which maps coordinates with 1/scale (torch's
rule), while the output size is the truncated product size * scale.

pixel_shuffle and pixel_unshuffle are a reshape, a permute and a reshape; unfold and fold are
the `im2col` and `col2im` ops, with the batch axis added for unbatched input.
"""

from __future__ import annotations

import warnings

from ..tensor import Tensor
from ._base import call
from .conv import adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d
from .shape import permute, reshape

_AREA = {1: adaptive_avg_pool1d, 2: adaptive_avg_pool2d, 3: adaptive_avg_pool3d}
_LINEAR = {3: "linear", 4: "bilinear", 5: "trilinear"}
_MODES = ("nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
          "nearest-exact")


def _require_tensor(name: str, arg: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def _is_integer(x) -> bool:
    if isinstance(x, Tensor):
        return x.numel() == 1 and not x.dtype.is_floating_point
    return isinstance(x, int) or type(x).__name__.startswith("int")


def _scale(value) -> float:
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, (int, float)) or type(value).__name__.startswith(("int", "float")):
        return float(value)
    raise TypeError(f"interpolate(): scale_factor must be a number or a sequence of numbers, "
                    f"not {type(value).__name__} ({value!r})")


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    _require_tensor("interpolate", "input", input)
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating "
                             "modes: linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False

    dim = input.ndim - 2  # spatial dims
    spatial = list(input.shape[2:])
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        scale_factors = None
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got "
                    f"input with spatial dimensions of {spatial} and output size of {size}. "
                    "Please provide input tensor in (N, C, d1, d2, ...,dK) format and output "
                    "size in (o1, o2, ...,oK) format.")
            if not all(_is_integer(x) for x in size):
                raise TypeError(
                    "expected size to be one of int or Tuple[int] or Tuple[int, int] or "
                    f"Tuple[int, int, int], but got size with types {[type(x) for x in size]}")
            output_size = [int(x) for x in size]
        else:
            output_size = [size] * dim
    elif scale_factor is not None:
        output_size = None
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, "
                    f"but got input with spatial dimensions of {spatial} and scale_factor of "
                    f"shape {scale_factor}. Please provide input tensor in (N, C, d1, d2, "
                    "...,dK) format and scale_factor in (s1, s2, ...,sK) format.")
            scale_factors = [_scale(s) for s in scale_factor]
        else:
            scale_factors = [_scale(scale_factor)] * dim
    else:
        raise ValueError("either size or scale_factor should be defined")

    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and output_size is None:
        recompute_scale_factor = True  # area pools to an explicit size
    if output_size is None:
        # torch truncates size * scale toward zero, here and in its C++ kernels alike.
        output_size = [int(n * s) for n, s in zip(spatial, scale_factors, strict=True)]
        if recompute_scale_factor:
            scale_factors = None

    if antialias and not (mode in ("bilinear", "bicubic", "lanczos") and input.ndim == 4):
        raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and lanczos "
                         "modes and requires a 4-D tensor as input")
    scales = None if scale_factors is None else tuple(scale_factors)
    rank_ok = input.ndim in (3, 4, 5)
    if rank_ok and mode in ("nearest", "nearest-exact"):
        return call("upsample_nearest", input, output_size=tuple(output_size), scales=scales,
                    exact=mode == "nearest-exact")
    if rank_ok and mode == "area":
        return _AREA[dim](input, output_size)
    if (rank_ok and _LINEAR[input.ndim] == mode) or (input.ndim == 4 and mode == "bicubic"):
        if antialias:
            raise NotImplementedError(f"interpolate(): antialias=True (mode={mode!r}) is not "
                                      "implemented in sbpflow")
        name = "upsample_bicubic2d" if mode == "bicubic" else "upsample_linear"
        return call(name, input, output_size=tuple(output_size), scales=scales,
                    align_corners=bool(align_corners))
    if input.ndim == 4 and mode == "lanczos":
        if align_corners:
            raise ValueError("Lanczos mode does not support align_corners=True")
        if not antialias:
            raise ValueError("Lanczos mode requires antialias=True")
        raise NotImplementedError("interpolate(): mode='lanczos' is not implemented in sbpflow")
    wanted = {"linear": 3, "bilinear": 4, "trilinear": 5}
    if rank_ok and mode in wanted:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs "
                                  f"{wanted[mode]}D input")
    raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
                              f"{input.ndim}D) for the modes: {_MODES} (got {mode})")


def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    warnings.warn("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` "
                  "instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    warnings.warn("`nn.functional.upsample_nearest` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    warnings.warn("`nn.functional.upsample_bilinear` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


# -- pixel shuffle ------------------------------------------------------------------------------
def _check_factor(name: str, arg: str, factor) -> int:
    if not _is_integer(factor) or isinstance(factor, (bool, Tensor)):
        raise TypeError(f"{name}(): argument '{arg}' (position 2) must be int, not "
                        f"{type(factor).__name__}")
    factor = int(factor)
    if factor <= 0:
        raise RuntimeError(f"{name} expects a positive {arg}, but got {factor}")
    return factor


def pixel_shuffle(input, upscale_factor):
    name = "pixel_shuffle"
    _require_tensor(name, "input", input)
    r = _check_factor(name, "upscale_factor", upscale_factor)
    if input.ndim < 3:
        raise RuntimeError(f"{name} expects input to have at least 3 dimensions, but got input "
                           f"with {input.ndim} dimension(s)")
    *lead, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"{name} expects its input's 'channel' dimension to be divisible by "
                           f"the square of upscale_factor, but input.size(-3)={c} is not "
                           f"divisible by {r * r}")
    k = len(lead)
    x = reshape(input, (*lead, c // (r * r), r, r, h, w))
    x = permute(x, (*range(k), k, k + 3, k + 1, k + 4, k + 2))  # (..., C, H, r, W, r)
    return reshape(x, (*lead, c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    name = "pixel_unshuffle"
    _require_tensor(name, "input", input)
    r = _check_factor(name, "downscale_factor", downscale_factor)
    if input.ndim < 3:
        raise RuntimeError(f"{name} expects input to have at least 3 dimensions, but got input "
                           f"with {input.ndim} dimension(s)")
    *lead, c, h, w = input.shape
    if h % r:
        raise RuntimeError(f"{name} expects height to be divisible by downscale_factor, but "
                           f"input.size(-2)={h} is not divisible by {r}")
    if w % r:
        raise RuntimeError(f"{name} expects width to be divisible by downscale_factor, but "
                           f"input.size(-1)={w} is not divisible by {r}")
    k = len(lead)
    x = reshape(input, (*lead, c, h // r, r, w // r, r))
    x = permute(x, (*range(k), k, k + 2, k + 4, k + 1, k + 3))  # (..., C, r, r, H, W)
    return reshape(x, (*lead, c * r * r, h // r, w // r))


# -- unfold / fold --------------------------------------------------------------------------------
def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    _require_tensor("unfold", "input", input)
    if 0 < input.ndim < 3:  # torch reads a missing spatial dim before checking the rank
        raise IndexError(f"Dimension out of range (expected to be in range of [{-input.ndim}, "
                         f"{input.ndim - 1}], but got {input.ndim})")
    if input.ndim not in (3, 4) or any(n == 0 for n in input.shape[-3:]):
        raise RuntimeError("Expected 3D or 4D (batch mode) tensor with possibly 0 batch size "
                           "and other non-zero dimensions for input, but got: "
                           f"{list(input.shape)}")
    unbatched = input.ndim == 3
    x = reshape(input, (1, *input.shape)) if unbatched else input
    out = call("im2col", x, kernel_size=_hashable(kernel_size), dilation=_hashable(dilation),
               padding=_hashable(padding), stride=_hashable(stride))
    return reshape(out, tuple(out.shape[1:])) if unbatched else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    _require_tensor("fold", "input", input)
    if input.ndim not in (2, 3) or any(n == 0 for n in input.shape[-2:]):
        raise RuntimeError("Expected 2D or 3D (batch mode) tensor for input with possibly 0 "
                           "batch size and non-zero dimensions for input, but got: "
                           f"{list(input.shape)}")
    unbatched = input.ndim == 2
    x = reshape(input, (1, *input.shape)) if unbatched else input
    out = call("col2im", x, output_size=_hashable(output_size),
               kernel_size=_hashable(kernel_size), dilation=_hashable(dilation),
               padding=_hashable(padding), stride=_hashable(stride))
    return reshape(out, tuple(out.shape[1:])) if unbatched else out


METHODS: dict = {}

__all__: list[str] = [
    "fold", "interpolate", "pixel_shuffle", "pixel_unshuffle", "unfold", "upsample",
    "upsample_bilinear", "upsample_nearest",
]
