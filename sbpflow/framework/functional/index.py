"""index functions."""

from __future__ import annotations

METHODS: dict = {}

__all__: list[str] = []
