"""torch.cuda on a machine without CUDA: what torch 2.13's CPU-only build does.

Queries answer "no CUDA" (is_available() False, device_count() 0, zero memory in use);
what needs a CUDA device raises torch's AssertionError("Torch not compiled with CUDA
enabled").  Seeding calls are accepted and, as in torch's CPU build, affect no CPU generator:
seed with sbpflow.manual_seed, which torch documents as seeding every device.
"""

from __future__ import annotations

import warnings

from ..device import Device
from . import amp

__all__ = [
    "Event", "Stream", "amp", "current_device", "current_stream", "default_stream", "device",
    "device_count", "device_of", "empty_cache", "get_arch_list", "get_device_capability",
    "get_device_name", "get_device_properties", "get_rng_state", "get_rng_state_all", "init",
    "initial_seed", "ipc_collect", "is_available", "is_bf16_supported", "is_initialized",
    "is_tf32_supported", "manual_seed", "manual_seed_all", "max_memory_allocated",
    "max_memory_cached", "max_memory_reserved", "mem_get_info", "memory_allocated",
    "memory_cached", "memory_reserved", "memory_stats", "reset_accumulated_memory_stats",
    "reset_max_memory_allocated", "reset_peak_memory_stats", "seed", "seed_all", "set_device",
    "set_per_process_memory_fraction", "set_rng_state", "set_rng_state_all", "stream",
    "synchronize",
]


def _no_cuda() -> AssertionError:
    return AssertionError("Torch not compiled with CUDA enabled")


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def is_initialized() -> bool:
    return False


def init() -> None:
    raise _no_cuda()


def get_arch_list() -> list[str]:
    return []


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return False


def is_tf32_supported() -> bool:
    return False


def _needs_cuda(name: str):
    def fn(*args, **kwargs):
        raise _no_cuda()

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"torch.cuda.{name}: raises, as torch's CPU build does (no CUDA)."
    return fn


current_device = _needs_cuda("current_device")
get_device_name = _needs_cuda("get_device_name")
get_device_capability = _needs_cuda("get_device_capability")
get_device_properties = _needs_cuda("get_device_properties")
synchronize = _needs_cuda("synchronize")
current_stream = _needs_cuda("current_stream")
default_stream = _needs_cuda("default_stream")
mem_get_info = _needs_cuda("mem_get_info")
set_per_process_memory_fraction = _needs_cuda("set_per_process_memory_fraction")
ipc_collect = _needs_cuda("ipc_collect")
initial_seed = _needs_cuda("initial_seed")
get_rng_state = _needs_cuda("get_rng_state")
set_rng_state = _needs_cuda("set_rng_state")
reset_peak_memory_stats = _needs_cuda("reset_peak_memory_stats")
reset_max_memory_allocated = _needs_cuda("reset_max_memory_allocated")
reset_accumulated_memory_stats = _needs_cuda("reset_accumulated_memory_stats")


def set_device(device) -> None:
    """A negative index is a no-op in torch; selecting a CUDA device raises."""
    if isinstance(device, int) and device < 0:
        return
    raise _no_cuda()


def manual_seed(seed) -> None:
    """Accepted; there are no CUDA generators to seed (torch's CPU build queues the call and
    never runs it).  The CPU generator is seeded by sbpflow.manual_seed."""
    int(seed)


def manual_seed_all(seed) -> None:
    int(seed)


def seed() -> None:
    """Accepted, as torch's CPU build queues it: no CUDA generator to reseed."""


def seed_all() -> None:
    """Accepted, as seed()."""


def get_rng_state_all() -> list:
    return []


def set_rng_state_all(new_states) -> None:
    pass


# -- memory: nothing is allocated on a CUDA device ------------------------------------------------
def empty_cache() -> None:
    pass


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def memory_cached(device=None) -> int:
    warnings.warn("`torch.cuda.memory_cached` has been renamed to `torch.cuda.memory_reserved`",
                  FutureWarning, stacklevel=2)
    return 0


def max_memory_cached(device=None) -> int:
    warnings.warn("`torch.cuda.max_memory_cached` has been renamed to "
                  "`torch.cuda.max_memory_reserved`", FutureWarning, stacklevel=2)
    return 0


def memory_stats(device=None) -> dict:
    from collections import OrderedDict

    return OrderedDict()


# -- devices and streams ------------------------------------------------------------------------
class device:  # noqa: N801 - torch's name
    """torch.cuda.device(idx): a context manager selecting a CUDA device; entering it raises
    (no CUDA); idx -1 or None selects nothing."""

    def __init__(self, device):
        if isinstance(device, (str, Device)):
            device = Device(device).index
        self.idx = -1 if device is None else int(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            raise RuntimeError("PyTorch was compiled without CUDA support")
        return self

    def __exit__(self, *exc):
        return False


class device_of(device):  # noqa: N801 - torch's name
    """The device of a tensor as a context: a CPU tensor selects nothing."""

    def __init__(self, obj):
        idx = obj.device.index if obj.device.type == "cuda" else -1
        super().__init__(idx)


class StreamContext:
    """torch.cuda.stream(None) is a no-op context; a real stream needs CUDA."""

    def __init__(self, stream):
        if stream is not None:
            raise _no_cuda()
        self.stream = None

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)


class Stream:
    def __new__(cls, *args, **kwargs):
        raise RuntimeError("torch.cuda.Stream requires CUDA support")


class Event:
    def __new__(cls, *args, **kwargs):
        raise RuntimeError("Tried to instantiate dummy base class Event")


def __getattr__(name):
    # torch.cuda.FloatTensor, ...: the legacy CUDA tensor types (building one raises)
    from .._legacy_types import CUDA_TYPES

    if name in CUDA_TYPES:
        return CUDA_TYPES[name]
    raise AttributeError(f"module 'sbpflow.cuda' has no attribute '{name}'")
