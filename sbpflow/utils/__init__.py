"""Utilities: data loading (`sbpflow.utils.data`), OneFlow's `global_view`."""

from . import data, global_view

__all__ = ["data", "global_view"]
