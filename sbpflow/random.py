"""torch.random: the default CPU generator's seed and state, and fork_rng."""

from __future__ import annotations

import contextlib

from .framework.generator import (
    Generator,
    default_generator,
    get_rng_state,
    initial_seed,
    manual_seed,
    seed,
    set_rng_state,
)

__all__ = ["Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed",
           "manual_seed", "seed", "set_rng_state"]


@contextlib.contextmanager
def fork_rng(devices=None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: str = "cuda"):
    """Run the block with the default generator's state saved and restored afterwards, so
    random draws inside it leave the outer sequence unchanged.  There are no accelerator
    generators to fork (`devices` must name none)."""
    if not enabled:
        yield
        return
    if devices:
        from .device import Device

        Device(device_type).check_available()
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
