"""The functional API, gathered from the family modules; also installs Tensor methods.

Every family's `__all__` becomes `sbpflow.<name>`, except the nn and conv families: they are
torch.nn.functional, and only the names torch also offers at top level with the same
signature are lifted there.
"""

from __future__ import annotations

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
)

_FAMILIES = (conversion, creation, elementwise, linalg, reduce, shape, index, nn, conv, resample,
             fused)
_NN_FAMILIES = (nn, conv, resample, fused)
_TOP_LEVEL_NN = {
    "relu", "relu_", "selu", "selu_", "celu", "celu_", "rrelu", "rrelu_", "prelu",
    "hardshrink", "threshold", "threshold_", "softmax", "log_softmax", "dropout", "dropout_",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "adaptive_avg_pool1d",
    "layer_norm", "group_norm", "cosine_similarity", "pairwise_distance", "bilinear",
    "pixel_shuffle", "pixel_unshuffle",
    "gather_nd",  # OneFlow's flow.gather_nd
}

__all__: list[str] = []
for _m in _FAMILIES:
    names = [n for n in _m.__all__ if _m not in _NN_FAMILIES or n in _TOP_LEVEL_NN]
    for _name in names:
        globals()[_name] = getattr(_m, _name)
    __all__ += names
    for _name, _fn in _m.METHODS.items():
        setattr(Tensor, _name, _fn)
