"""torch.optim.adamw's module path: AdamW lives with Adam (adam.py)."""

from .adam import AdamW

__all__ = ["AdamW"]
