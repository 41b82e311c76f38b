"""torch.accelerator: the current accelerator, of which sbpflow's CPU-only build has none.

Queries answer "none" (current_accelerator() None, is_available() False, device_count() 0);
what needs an accelerator raises torch's RuntimeError.
"""

from __future__ import annotations

__all__ = [
    "current_accelerator", "current_device_idx", "current_device_index", "current_stream",
    "device_count", "device_index", "empty_cache", "empty_host_cache", "get_device_capability",
    "get_memory_info", "is_available",
    "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
    "memory_stats", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    "set_device_idx", "set_device_index", "set_stream", "synchronize",
]


def _none() -> RuntimeError:
    return RuntimeError("Cannot access accelerator device when none is available.")


def current_accelerator(check_available: bool = False):
    return None


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def _needs_accelerator(name: str):
    def fn(*args, **kwargs):
        raise _none()

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"torch.accelerator.{name}: raises (no accelerator)."
    return fn


current_device_index = _needs_accelerator("current_device_index")
current_device_idx = current_device_index
set_device_index = _needs_accelerator("set_device_index")
set_device_idx = set_device_index
current_stream = _needs_accelerator("current_stream")
set_stream = _needs_accelerator("set_stream")
synchronize = _needs_accelerator("synchronize")
empty_cache = _needs_accelerator("empty_cache")
empty_host_cache = _needs_accelerator("empty_host_cache")
get_device_capability = _needs_accelerator("get_device_capability")
get_memory_info = _needs_accelerator("get_memory_info")
memory_allocated = _needs_accelerator("memory_allocated")
max_memory_allocated = _needs_accelerator("max_memory_allocated")
memory_reserved = _needs_accelerator("memory_reserved")
max_memory_reserved = _needs_accelerator("max_memory_reserved")
memory_stats = _needs_accelerator("memory_stats")
reset_accumulated_memory_stats = _needs_accelerator("reset_accumulated_memory_stats")
reset_peak_memory_stats = _needs_accelerator("reset_peak_memory_stats")


class device_index:  # noqa: N801 - torch's name
    """A context selecting accelerator `device`; None selects nothing."""

    def __init__(self, device, /):
        self.idx = device

    def __enter__(self):
        if self.idx is not None:
            raise _none()
        return None

    def __exit__(self, *exc):
        return False
