"""Neural-network API: `nn.functional` now; modules arrive with the nn issue."""

from . import functional  # noqa: F401
