"""The functional API, generated from family modules; also installs Tensor methods."""

from __future__ import annotations

from ..tensor import Tensor
from . import conv, conversion, creation, elementwise, index, linalg, nn, reduce, shape

_FAMILIES = (conversion, creation, elementwise, linalg, reduce, shape, index, nn, conv)

__all__: list[str] = []
for _m in _FAMILIES:
    for _name in _m.__all__:
        globals()[_name] = getattr(_m, _name)
    __all__ += list(_m.__all__)
    for _name, _fn in _m.METHODS.items():
        setattr(Tensor, _name, _fn)
