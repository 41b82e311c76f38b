"""torch.linalg for sbpflow: the vector norm so far."""

from .framework.functional.reduce import vector_norm

__all__ = ["vector_norm"]
