"""torch.onnx: `export` writes a model traced into the nn.Graph Job IR as an ONNX model.

`onnx` (and `onnxruntime`, to run the result) are the optional extra `sbpflow[onnx]`."""

from __future__ import annotations

import enum

from .export import OnnxExporterError, UnsupportedOperatorError, export, is_in_onnx_export

__all__ = ["OnnxExporterError", "TrainingMode", "UnsupportedOperatorError", "export",
           "is_in_onnx_export", "supported_ops"]


class TrainingMode(enum.IntEnum):
    """torch.onnx.TrainingMode: the modules' mode while exporting (EVAL by default)."""

    EVAL = 0
    PRESERVE = 1
    TRAINING = 2


def supported_ops() -> list[str]:
    """The op types (registry names) that have an ONNX mapping."""
    from .ops import supported_ops as _ops

    return _ops()
