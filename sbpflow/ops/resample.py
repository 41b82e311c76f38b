"""Resampling ops: interpolation, pixel shuffle, im2col/col2im."""

from __future__ import annotations
