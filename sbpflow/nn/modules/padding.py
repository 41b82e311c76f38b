"""Padding modules (torch.nn.modules.padding)."""

from __future__ import annotations

__all__: list[str] = []
