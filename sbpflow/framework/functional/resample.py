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

import itertools
import math
import warnings

from ..._core import dtype as dt
from ..tensor import Tensor
from . import creation
from . import elementwise as _elementwise
from . import shape as _shape
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


# -- affine_grid / grid_sample ----------------------------------------------------------------
_ALIGN_WARNING = ("Default grid_sample and affine_grid behavior has changed to align_corners="
                  "False since 1.3.0. Please specify align_corners=True if the old behavior is "
                  "desired. See the documentation of grid_sample for details.")


def _linspace_from_neg_one(theta: Tensor, steps: int, align_corners: bool) -> Tensor:
    if steps <= 1:
        return creation.zeros(1, dtype=theta.dtype)
    r = creation.linspace(-1, 1, steps, dtype=theta.dtype)
    return r if align_corners else r * ((steps - 1) / steps)


def affine_grid(theta, size, align_corners=None):
    _require_tensor("affine_grid", "theta", theta)
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if not theta.dtype.is_floating_point:
        raise ValueError(f"Expected theta to have floating point type, but got {theta.dtype}")
    size = [int(s) for s in size]
    if len(size) == 4:
        if theta.ndim != 3 or tuple(theta.shape[-2:]) != (2, 3):
            raise ValueError("Expected a batch of 2D affine matrices of shape Nx2x3 for size "
                             f"{size}. Got {theta.shape}.")
        spatial = size[-2:]
    elif len(size) == 5:
        if theta.ndim != 3 or tuple(theta.shape[-2:]) != (3, 4):
            raise ValueError("Expected a batch of 3D affine matrices of shape Nx3x4 for size "
                             f"{size}. Got {theta.shape}.")
        spatial = size[-3:]
    else:
        raise NotImplementedError("affine_grid only supports 4D and 5D sizes, for 2D and 3D "
                                  f"affine transforms, respectively. Got size {size}.")
    if align_corners and min(spatial) == 1:
        warnings.warn("Since version 1.3.0, affine_grid behavior has changed for unit-size "
                      "grids when align_corners=True. This is not an intended use case of "
                      "affine_grid. See the documentation of affine_grid for details.",
                      stacklevel=2)
    elif min(size) <= 0:
        raise ValueError(f"Expected non-zero, positive output size. Got {size}")
    n = len(spatial)
    # base (*spatial, n + 1): (x, y[, z], 1) with x along the last axis, as torch
    axes = []
    for k in range(n):  # coordinate k runs along spatial axis n - 1 - k
        axis = n - 1 - k
        shape = [1] * n
        shape[axis] = spatial[axis]
        line = reshape(_linspace_from_neg_one(theta, spatial[axis], align_corners), shape)
        axes.append(line.expand(*spatial))
    axes.append(creation.ones(*spatial, dtype=theta.dtype))
    base = reshape(_shape.stack(axes, -1), (1, math.prod(spatial), n + 1))
    grid = base.matmul(theta.transpose(1, 2))  # (N, prod(spatial), n)
    return reshape(grid, (size[0], *spatial, n))


def _grid_source_index(coord: Tensor, size: int, padding_mode: str, align_corners: bool):
    """torch's grid_sampler_compute_source_index: grid coordinate -> input pixel coordinate."""
    if align_corners:
        coord = (coord + 1) * ((size - 1) / 2)
    else:
        coord = ((coord + 1) * size - 1) / 2
    if padding_mode == "border":
        coord = coord.clamp(0, size - 1)
    elif padding_mode == "reflection":
        lo2, hi2 = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        if lo2 == hi2:
            coord = coord * 0
        else:
            lo, span = lo2 / 2, (hi2 - lo2) / 2
            dist = (coord - lo).abs()
            extra = dist.fmod(span)
            flips = (dist / span).floor()
            coord = _elementwise.where(flips.fmod(2) == 0, extra + lo, span - extra + lo)
        coord = coord.clamp(0, size - 1)
    return coord


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    name = "grid_sampler"
    _require_tensor("grid_sample", "input", input)
    _require_tensor("grid_sample", "grid", grid)
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise ValueError("nn.functional.grid_sample(): expected mode to be 'bilinear', "
                         f"'nearest' or 'bicubic', but got: '{mode}'")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError("nn.functional.grid_sample(): expected padding_mode to be 'zeros', "
                         f"'border', or 'reflection', but got: '{padding_mode}'")
    if align_corners is None:
        warnings.warn(_ALIGN_WARNING, stacklevel=2)
        align_corners = False
    if input.ndim not in (4, 5) or grid.ndim != input.ndim:
        raise RuntimeError(f"{name}(): expected 4D or 5D input and grid with same number of "
                           f"dimensions, but got input with sizes {list(input.shape)} and grid "
                           f"with sizes {list(grid.shape)}")
    if input.dtype is not grid.dtype:
        raise RuntimeError(f"{name}(): expected input and grid to have same dtype, but input "
                           f"has {input.dtype} and grid has {grid.dtype}")
    if input.shape[0] != grid.shape[0]:
        raise RuntimeError(f"{name}(): expected grid and input to have same batch size, but "
                           f"got input with sizes {list(input.shape)} and grid with sizes "
                           f"{list(grid.shape)}")
    if grid.shape[-1] != input.ndim - 2:
        raise RuntimeError(f"{name}(): expected grid to have size {input.ndim - 2} in last "
                           f"dimension, but got grid with sizes {list(grid.shape)}")
    if mode == "bicubic":
        raise NotImplementedError("grid_sample(): mode='bicubic' is not implemented in sbpflow")
    nb, c, *sizes = input.shape
    out = tuple(grid.shape[1:-1])
    n = len(sizes)
    # grid[..., k] addresses spatial axis n - 1 - k (x is the width, the last axis)
    src = [_grid_source_index(grid[..., n - 1 - a], sizes[a], padding_mode, align_corners)
           for a in range(n)]
    flat = reshape(input, (nb, c, math.prod(sizes)))
    length = math.prod(out)

    def tap(points):
        """input at integer-valued pixel coordinates (one (N, *out) tensor per axis), and
        where they lie inside the image (zero outside, as the zeros padding reads)."""
        inside = index = None
        for a, p in enumerate(points):
            ok = (p >= 0) & (p <= sizes[a] - 1)
            inside = ok if inside is None else inside & ok
            term = p.clamp(0, sizes[a] - 1) * math.prod(sizes[a + 1:])
            index = term if index is None else index + term
        index = reshape(index.long(), (nb, 1, length)).expand(nb, c, length)
        values = reshape(flat.gather(2, index), (nb, c, *out))
        return values, reshape(inside.to(input.dtype), (nb, 1, *out))

    if mode == "nearest":  # nearbyint: halves to even, as torch.round
        values, inside = tap([p.round() for p in src])
        result = values * inside
        if grid.requires_grad:
            # torch's grid gradient here is zeros, not None: join the grid in with a zero
            # select (a multiply by zero would turn an inf in the grid into nan)
            never = creation.zeros(nb, 1, *out, dtype=dt.bool_)
            result = result + _elementwise.where(never, reshape(grid[..., 0], (nb, 1, *out)), 0.0)
        return result
    base = [p.floor() for p in src]
    frac = [p - b for p, b in zip(src, base, strict=True)]
    result = None
    for corner in itertools.product((0, 1), repeat=n):
        weight = None
        for d, f in zip(corner, frac, strict=True):
            wa = f if d else 1 - f
            weight = wa if weight is None else weight * wa
        values, inside = tap([b + d for b, d in zip(base, corner, strict=True)])
        term = values * (reshape(weight, (nb, 1, *out)) * inside)
        result = term if result is None else result + term
    return result


METHODS: dict = {}

__all__: list[str] = [
    "affine_grid", "fold", "grid_sample", "interpolate", "pixel_shuffle", "pixel_unshuffle",
    "unfold", "upsample", "upsample_bilinear", "upsample_nearest",
]
