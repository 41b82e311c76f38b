"""Utilities: data loading (`sbpflow.utils.data`), activation checkpointing
(`sbpflow.utils.checkpoint`), OneFlow's `global_view`, and TensorBoard logging
(`sbpflow.utils.tensorboard`, not imported here: it needs the optional `tensorboard`
package, and importing it without that package fails as torch's does)."""

from . import checkpoint, data, global_view

__all__ = ["checkpoint", "data", "global_view"]
