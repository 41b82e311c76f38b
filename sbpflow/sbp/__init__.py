"""SBP values, placements, piece layout, signature inference and boxing routes.

`flow.sbp.split(i)`, `flow.sbp.broadcast`, `flow.sbp.partial_sum`; `flow.placement(type,
ranks)`. This layer computes on metadata and NumPy pieces only; the framework above runs its
routes as VM instructions.
"""

from .layout import (
    NdSbp,
    balanced_bounds,
    check_split_axes,
    dual,
    fmt_sbp,
    local_shape,
    normalize_sbp,
    piece,
)
from .placement import Placement, placement
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

sbp = Sbp  # OneFlow's `flow.sbp.sbp`: the type of SBP values (isinstance(B, flow.sbp.sbp))

__all__ = [
    "B", "Broadcast", "NdSbp", "P", "PartialSum", "Placement", "S", "Sbp", "Signature",
    "Split", "balanced_bounds", "broadcast", "check_split_axes", "dual", "einsum_signatures",
    "elementwise_signatures", "fmt_sbp", "local_shape", "normalize_sbp", "partial_sum", "piece",
    "placement", "sbp", "split",
]
