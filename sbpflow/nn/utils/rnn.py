"""Packed sequences and padding helpers (torch.nn.utils.rnn)."""

from __future__ import annotations

__all__: list[str] = []
