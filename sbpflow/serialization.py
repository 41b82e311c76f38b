"""torch.serialization for sbpflow: save/load and the allowlist for whole-object checkpoints."""

from __future__ import annotations

from .framework.serialization import load, save

__all__ = ["load", "save"]
