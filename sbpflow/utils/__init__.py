"""Utilities: data loading (`sbpflow.utils.data`), activation checkpointing
(`sbpflow.utils.checkpoint`), OneFlow's `global_view`."""

from . import checkpoint, data, global_view

__all__ = ["checkpoint", "data", "global_view"]
