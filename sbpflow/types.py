"""torch.types: the type aliases annotations use (Storage is left out: sbpflow exposes no
storage objects)."""

from __future__ import annotations

import os
from typing import IO

from .device import Device as _device
from .framework.tensor import Size, Tensor

__all__ = ["Device", "FileLike", "Number"]

Number = int | float | bool
Device = _device | str | int | None
FileLike = str | os.PathLike | IO[bytes]
_size = Size | list[int] | tuple[int, ...]
_TensorOrTensors = Tensor | tuple[Tensor, ...]
