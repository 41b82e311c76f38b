"""Recurrent modules: RNN, LSTM, GRU and their cells (torch.nn.modules.rnn)."""

from __future__ import annotations

__all__: list[str] = []
