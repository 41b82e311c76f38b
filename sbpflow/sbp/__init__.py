"""SBP values and signature builders (placement and boxing arrive with global tensors)."""

from .sbp import (
    B,
    Broadcast,
    P,
    PartialSum,
    S,
    Sbp,
    Signature,
    Split,
    broadcast,
    partial_sum,
    split,
)
from .signature import einsum_signatures, elementwise_signatures

__all__ = [
    "B", "P", "S", "Broadcast", "PartialSum", "Sbp", "Signature", "Split", "broadcast",
    "einsum_signatures", "elementwise_signatures", "partial_sum", "split",
]
