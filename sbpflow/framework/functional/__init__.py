"""The functional API, gathered from the family modules; also installs Tensor methods.

Every family's `__all__` becomes `sbpflow.<name>`, except the nn and conv families: they are
torch.nn.functional, and only the names torch also offers at top level with the same
signature are lifted there.
"""

from __future__ import annotations

import functools
import inspect

from ..tensor import Tensor
from . import (
    conv,
    conversion,
    creation,
    elementwise,
    fused,
    index,
    linalg,
    nn,
    reduce,
    resample,
    shape,
    sparse,
)

_FAMILIES = (conversion, creation, elementwise, linalg, reduce, shape, index, nn, conv, resample,
             fused, sparse)
_NN_FAMILIES = (nn, conv, resample, fused)
_TOP_LEVEL_NN = {
    "relu", "relu_", "selu", "selu_", "celu", "celu_", "rrelu", "rrelu_", "prelu",
    "hardshrink", "threshold", "threshold_", "softmax", "log_softmax", "dropout", "dropout_",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d",
    "layer_norm", "rms_norm", "group_norm", "cosine_similarity", "pairwise_distance", "bilinear",
    "pixel_shuffle", "pixel_unshuffle",
    "gather_nd",  # OneFlow's flow.gather_nd
}

# torch's argument parser takes NumPy's spelling of two argument names in every native function
# and Tensor method: `axis` for `dim` and `keepdims` for `keepdim` (`x.sum(1, keepdims=True)`).
# torch's functions written in Python don't, nor does torch.nn.functional: those keep their
# own signatures here too.
_NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))
_PYTHON_IN_TORCH = {"split", "norm", "unique", "unique_consecutive", "stft", "istft"}
_PYTHON_METHODS_IN_TORCH = _PYTHON_IN_TORCH | {"unflatten"}


def _accept_numpy_names(name: str, fn, owner: str, python_in_torch=_PYTHON_IN_TORCH):
    """fn, or a wrapper of it taking the NumPy names; `owner` is where it is published (a
    module, or "module:Class"), so that pickle finds the wrapper by name."""
    if name in python_in_torch:
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn
    aliases = tuple((a, n) for a, n in _NUMPY_NAMES if n in params and a not in params)
    if not aliases:
        return fn

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if kwargs:
            for alias, dim_name in aliases:
                if alias in kwargs:
                    if dim_name in kwargs:
                        raise TypeError(f"{name}() got both '{dim_name}' and its NumPy alias "
                                        f"'{alias}'")
                    kwargs[dim_name] = kwargs.pop(alias)
        return fn(*args, **kwargs)

    module, _, cls = owner.partition(":")
    call.__module__, call.__qualname__ = module, f"{cls}.{name}" if cls else name
    call._numpy_names = aliases
    return call


_TENSOR = f"{Tensor.__module__}:{Tensor.__qualname__}"

__all__: list[str] = []
for _m in _FAMILIES:
    names = [n for n in _m.__all__ if _m not in _NN_FAMILIES or n in _TOP_LEVEL_NN]
    for _name in names:
        globals()[_name] = _accept_numpy_names(_name, getattr(_m, _name), __name__)
    __all__ += names
    for _name, _fn in _m.METHODS.items():
        setattr(Tensor, _name, _accept_numpy_names(_name, _fn, _TENSOR, _PYTHON_METHODS_IN_TORCH))
for _name in ("size", "stride"):  # Tensor's own methods that torch's parser handles
    setattr(Tensor, _name, _accept_numpy_names(_name, getattr(Tensor, _name), _TENSOR))
