"""torch.onnx: importable; exporting a model to ONNX is planned for a later issue."""

from __future__ import annotations

__all__ = ["OnnxExporterError", "export", "is_in_onnx_export"]


class OnnxExporterError(RuntimeError):
    """torch.onnx's error type."""


def export(model, args=(), f=None, *pos, **kwargs):
    raise NotImplementedError(
        "sbpflow.onnx.export: exporting models to ONNX is not implemented yet in sbpflow; "
        "ONNX export comes in a later issue")


def is_in_onnx_export() -> bool:
    return False
