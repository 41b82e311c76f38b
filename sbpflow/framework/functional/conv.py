"""Convolution and pooling functions with torch.nn.functional's signatures.

The ops take batched input; these wrappers add and drop the batch axis of unbatched input, add
the bias with a broadcasting `add` (so its gradient is the usual sum), and pick the outputs
that torch returns (max pooling's indices only with return_indices=True).  Transposed
convolution is the input gradient of the forward convolution, `conv_input_grad`.
"""

from __future__ import annotations

from ...ops.conv import conv_tuple
from ..tensor import Tensor
from ._base import call
from .shape import narrow, pad, reshape


def _require_tensor(name: str, arg: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be Tensor, not {type(x).__name__}")


def _hashable(v):
    """Lists become tuples so attrs can key the meta cache; strings and ints pass through."""
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _batched(name: str, input: Tensor, n: int, what: str) -> tuple[Tensor, bool]:
    """The input with a batch axis, and whether one was added."""
    _require_tensor(name, "input", input)
    if input.ndim == n + 2:
        return input, False
    if input.ndim == n + 1:
        return reshape(input, (1,) + tuple(input.shape)), True
    raise RuntimeError(f"{name}(): Expected {n + 1}D (unbatched) or {n + 2}D (batched) {what} "
                       f"to {name}, but got input of size: {list(input.shape)}")


def _unbatched(t: Tensor, was_unbatched: bool) -> Tensor:
    return reshape(t, tuple(t.shape)[1:]) if was_unbatched else t


def _add_bias(name: str, out: Tensor, bias, weight: Tensor, channels: int, n: int) -> Tensor:
    if bias is None:
        return out
    _require_tensor(name, "bias", bias)
    if bias.ndim != 1 or bias.shape[0] != channels:
        raise RuntimeError(f"{name}(): Given weight of size {list(weight.shape)}, expected bias "
                           f"to be 1-dimensional with {channels} elements, but got bias of size "
                           f"{list(bias.shape)} instead")
    if bias.dtype is not out.dtype:
        raise RuntimeError(f"{name}(): Input type ({out.dtype.name}) and bias type "
                           f"({bias.dtype.name}) should be the same")
    return call("add", out, reshape(bias, (channels,) + (1,) * n))


# -- convolution --------------------------------------------------------------------------------
def _conv(n, input, weight, bias, stride, padding, dilation, groups):
    name = f"conv{n}d"
    x, unbatched = _batched(name, input, n, "input")
    _require_tensor(name, "weight", weight)
    out = call(name, x, weight, stride=_hashable(stride), padding=_hashable(padding),
               dilation=_hashable(dilation), groups=groups)
    out = _add_bias(name, out, bias, weight, weight.shape[0], n)
    return _unbatched(out, unbatched)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(3, input, weight, bias, stride, padding, dilation, groups)


def _conv_transpose(n, input, weight, bias, stride, padding, output_padding, groups, dilation):
    name = f"conv_transpose{n}d"
    x, unbatched = _batched(name, input, n, "input")
    _require_tensor(name, "weight", weight)
    if weight.ndim != n + 2:
        raise RuntimeError(f"{name}(): expected weight to be {n + 2}-dimensional ([in_channels, "
                           f"out_channels / groups, *kernel_size]), but got weight of size "
                           f"{list(weight.shape)}")
    if groups <= 0:
        raise RuntimeError(f"{name}(): non-positive groups is not supported, got "
                           f"groups={groups}")
    if x.shape[1] != weight.shape[0]:
        raise RuntimeError(f"{name}(): Given transposed=1, weight of size {list(weight.shape)}, "
                           f"expected input{list(x.shape)} to have {weight.shape[0]} channels, "
                           f"but got {x.shape[1]} channels instead")
    if weight.shape[0] % groups:
        raise RuntimeError(f"{name}(): Given groups={groups}, expected weight to be divisible "
                           f"by {groups} at dimension 0, but got weight of size "
                           f"{list(weight.shape)} instead")
    s = conv_tuple(name, "stride", stride, n)
    p = conv_tuple(name, "padding", padding, n)
    op_ = conv_tuple(name, "output_padding", output_padding, n)
    d = conv_tuple(name, "dilation", dilation, n)
    if any(v <= 0 for v in s) or any(v <= 0 for v in d) or any(v < 0 for v in p + op_):
        raise RuntimeError(f"{name}(): stride and dilation must be positive and padding and "
                           f"output_padding non-negative, got stride={list(s)}, "
                           f"padding={list(p)}, output_padding={list(op_)}, "
                           f"dilation={list(d)}")
    for oi, si, di in zip(op_, s, d, strict=True):
        if oi >= si and oi >= di:
            raise RuntimeError(f"{name}(): output padding must be smaller than either stride "
                               f"or dilation, but got output_padding={list(op_)}, "
                               f"stride={list(s)}, dilation={list(d)}")
    kernel = tuple(weight.shape[2:])
    size = tuple((i - 1) * si - 2 * pi + di * (ki - 1) + oi + 1 for i, si, pi, di, ki, oi in
                 zip(tuple(x.shape[2:]), s, p, d, kernel, op_, strict=True))
    if any(v <= 0 for v in size):
        raise RuntimeError(f"{name}(): Given input size per channel: {list(x.shape[2:])}, "
                           f"the calculated output size {list(size)} is too small")
    if all(oi < si for oi, si in zip(op_, s, strict=True)):
        # The forward convolution of an input of this size gives back x's size: the
        # transposed convolution is exactly its input gradient.
        out = call("conv_input_grad", x, weight, input_size=size, stride=s, padding=p,
                   dilation=d, groups=groups)
    else:
        # output_padding >= stride (allowed below the dilation): the unpadded transposed
        # output, cropped by the padding in front and zero-filled past its reach behind.
        full = tuple((i - 1) * si + di * (ki - 1) + 1 for i, si, di, ki in
                     zip(tuple(x.shape[2:]), s, d, kernel, strict=True))
        out = call("conv_input_grad", x, weight, input_size=full, stride=s, padding=0,
                   dilation=d, groups=groups)
        widths = []
        for axis in range(n):
            keep = min(size[axis], full[axis] - p[axis])
            out = narrow(out, 2 + axis, p[axis], keep)
            widths = [0, size[axis] - keep] + widths  # F.pad lists the last axis first
        if any(widths):
            out = pad(out, widths)
    out = _add_bias(name, out, bias, weight, weight.shape[1] * groups, n)
    return _unbatched(out, unbatched)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


def conv_transpose3d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    return _conv_transpose(3, input, weight, bias, stride, padding, output_padding, groups,
                           dilation)


# -- pooling ------------------------------------------------------------------------------------
def _stride(stride):
    # torch treats an empty stride like None: the kernel size.
    return None if stride is None or (isinstance(stride, (tuple, list)) and not stride) else \
        _hashable(stride)


def _max_pool(n, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    name = f"max_pool{n}d"
    x, unbatched = _batched(name, input, n, "input")
    out, indices = call(name, x, kernel_size=_hashable(kernel_size), stride=_stride(stride),
                        padding=_hashable(padding), dilation=_hashable(dilation),
                        ceil_mode=ceil_mode)
    out = _unbatched(out, unbatched)
    if return_indices:
        return out, _unbatched(indices, unbatched)
    return out


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode,
                     return_indices)


def _avg_pool(n, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    name = f"avg_pool{n}d"
    x, unbatched = _batched(name, input, n, "input")
    out = call(name, x, kernel_size=_hashable(kernel_size), stride=_stride(stride),
               padding=_hashable(padding), ceil_mode=ceil_mode,
               count_include_pad=count_include_pad, divisor_override=divisor_override)
    return _unbatched(out, unbatched)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _adaptive_avg_pool(n, input, output_size):
    name = f"adaptive_avg_pool{n}d"
    x, unbatched = _batched(name, input, n, "input")
    out = call(name, x, output_size=_hashable(output_size))
    return _unbatched(out, unbatched)


def adaptive_avg_pool1d(input, output_size):
    return _adaptive_avg_pool(1, input, output_size)


def adaptive_avg_pool2d(input, output_size):
    return _adaptive_avg_pool(2, input, output_size)


def adaptive_avg_pool3d(input, output_size):
    return _adaptive_avg_pool(3, input, output_size)


def _adaptive_max_pool(n, input, output_size, return_indices):
    name = f"adaptive_max_pool{n}d"
    x, unbatched = _batched(name, input, n, "input")
    out, indices = call(name, x, output_size=_hashable(output_size))
    out = _unbatched(out, unbatched)
    if return_indices:
        return out, _unbatched(indices, unbatched)
    return out


def adaptive_max_pool1d(input, output_size, return_indices=False):
    return _adaptive_max_pool(1, input, output_size, return_indices)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    return _adaptive_max_pool(2, input, output_size, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices=False):
    return _adaptive_max_pool(3, input, output_size, return_indices)


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_pool(1, input, output_size, True)


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_pool(2, input, output_size, True)


def adaptive_max_pool3d_with_indices(input, output_size, return_indices=False):
    return _adaptive_max_pool(3, input, output_size, True)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, True)


def _lp_pool(n, input, norm_type, kernel_size, stride, ceil_mode):
    """torch's composition: (window sum of x^p)^(1/p), the sum as avg_pool times the size."""
    k = conv_tuple(f"lp_pool{n}d", "kernel_size", kernel_size, n)
    maxp = (max_pool1d, max_pool2d, max_pool3d)[n - 1]
    if norm_type == float("inf"):
        return maxp(input.abs(), k, stride, 0, 1, ceil_mode)
    if norm_type == -float("inf"):
        return -maxp(-input.abs(), k, stride, 0, 1, ceil_mode)
    avg = (avg_pool1d, avg_pool2d, avg_pool3d)[n - 1]
    out = avg(input.pow(norm_type), k, stride, 0, ceil_mode)
    size = 1
    for v in k:
        size *= v
    return (out.sign() * out.abs().relu()).mul(size).pow(1.0 / norm_type)


def lp_pool1d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(1, input, float(norm_type), kernel_size, stride, ceil_mode)


def lp_pool2d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(2, input, float(norm_type), kernel_size, stride, ceil_mode)


def lp_pool3d(input, norm_type, kernel_size, stride=None, ceil_mode=False):
    return _lp_pool(3, input, float(norm_type), kernel_size, stride, ceil_mode)


def _unpool_output_size(name, input, kernel, stride, padding, output_size):
    n = len(kernel)
    spatial = tuple(input.shape)[-n:]
    default = [(spatial[d] - 1) * stride[d] + kernel[d] - 2 * padding[d] for d in range(n)]
    if output_size is None:
        size = default
    else:
        size = [int(v) for v in output_size]
        if len(size) == n + 2:
            size = size[2:]
        if len(size) != n:
            raise ValueError(f"output_size should be a sequence containing {n} or {n + 2} "
                             f"elements, but it has a length of '{len(size)}'")
        for d in range(n):
            lo, hi = default[d] - stride[d], default[d] + stride[d]
            if not lo < size[d] < hi:
                raise ValueError(f'invalid output_size "{size}" (dim {d} must be between {lo} '
                                 f"and {hi})")
    if any(v < 0 for v in size):
        raise ValueError(f"{name}: output_size must contain non-negative spatial dimensions, "
                         f"but got output_size={size}")
    return tuple(size)


def _max_unpool(n, input, indices, kernel_size, stride, padding, output_size):
    """The values scattered back to the positions max pooling took them from: the same
    scatter as max pooling's gradient (`max_pool_grad`), so its gradient is a gather.
    Where windows overlap and two outputs name one position, they add (torch keeps one)."""
    name = f"max_unpool{n}d"
    x, unbatched = _batched(name, input, n, "input")
    _require_tensor(name, "indices", indices)
    idx = reshape(indices, tuple(x.shape)) if unbatched else indices
    k = conv_tuple(name, "kernel_size", kernel_size, n)
    s = k if stride is None else conv_tuple(name, "stride", stride, n)
    p = conv_tuple(name, "padding", padding, n)
    size = _unpool_output_size(name, x, k, s, p, output_size)
    out = call("max_pool_grad", x, idx, input_size=size)
    return _unbatched(out, unbatched)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool(1, input, indices, kernel_size, stride, padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool(2, input, indices, kernel_size, stride, padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    return _max_unpool(3, input, indices, kernel_size, stride, padding, output_size)


METHODS: dict = {}

__all__: list[str] = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "adaptive_max_pool1d_with_indices", "adaptive_max_pool2d_with_indices",
    "adaptive_max_pool3d_with_indices", "lp_pool1d", "lp_pool2d", "lp_pool3d",
    "max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "max_unpool1d", "max_unpool2d", "max_unpool3d",
]
