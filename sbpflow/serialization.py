"""torch.serialization for sbpflow: save/load and the allowlist for whole-object checkpoints."""

from __future__ import annotations

from .framework.serialization import (
    DEFAULT_PROTOCOL,
    add_safe_globals,
    clear_safe_globals,
    get_safe_globals,
    load,
    safe_globals,
    save,
)

__all__ = ["DEFAULT_PROTOCOL", "add_safe_globals", "clear_safe_globals", "get_safe_globals",
           "load", "safe_globals", "save"]
