"""Functional resampling: interpolate, pixel_shuffle, unfold, fold (torch.nn.functional)."""

from __future__ import annotations

__all__: list[str] = []
METHODS: dict = {}
