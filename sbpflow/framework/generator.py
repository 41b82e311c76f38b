"""Random generators: a seed plus a counter offset into a Philox stream.

Each random op reserves `words_used` words from the offset (`take`), so the same seed gives the
same sequence of tensors, and a piece of a tensor can be drawn without drawing the rest (see
device/random.py).  The whole state is those two numbers; `get_state` encodes them as a uint8
tensor (16 bytes, little-endian seed then offset), as torch's generators return a ByteTensor.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..device import Device

_U64 = 2**64
# torch's default seed, so a fresh process reports the same initial_seed() as torch.
_DEFAULT_SEED = 67280421310721


def _as_seed(seed) -> int:
    """torch.manual_seed takes int(seed) for any int in [-2**63, 2**64), modulo 2**64."""
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise TypeError(f"manual_seed(): seed must be an int, not {type(seed).__name__}") from None
    if not -(2**63) <= seed < _U64:
        raise RuntimeError(f"manual_seed(): seed must be in [-2**63, 2**64), got {seed}")
    return seed % _U64


class Generator:
    """A counter-based generator: `(seed, offset)` into the Philox stream of `seed`."""

    def __init__(self, device="cpu"):
        self._device = Device(device)
        if self._device.type == "cuda":  # torch's CPU build, word for word (first sentence)
            raise RuntimeError("Cannot get CUDA generator without ATen_cuda library. PyTorch "
                               "splits its backend into two shared libraries: a CPU library "
                               "and a CUDA library; the CUDA library is not available here.")
        self._seed = _DEFAULT_SEED
        self._offset = 0
        self._lock = threading.Lock()

    @property
    def device(self) -> Device:
        return self._device

    def manual_seed(self, seed) -> Generator:
        seed = _as_seed(seed)
        with self._lock:
            self._seed, self._offset = seed, 0
        return self

    def seed(self) -> int:
        """Reseed from OS entropy; returns the new seed."""
        s = int.from_bytes(os.urandom(8), "little") & (2**63 - 1)
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed

    def take(self, words: int) -> tuple[int, int]:
        """Reserve `words` words of the stream: returns (seed, offset) for the draw."""
        with self._lock:
            off = self._offset
            self._offset += int(words)
        return self._seed, off

    def get_state(self):
        """The state as a uint8 tensor of 16 bytes: seed then offset, little-endian uint64."""
        from .functional.creation import tensor

        with self._lock:
            words = np.array([self._seed, self._offset % _U64], dtype="<u8")
        return tensor(words.view(np.uint8).copy())

    def set_state(self, new_state) -> Generator:
        """Accept what get_state returns (uint8, 16 bytes), an int64 tensor [seed, offset] or
        a (seed, offset) pair."""
        seed, offset = _decode_state(new_state)
        with self._lock:
            self._seed, self._offset = seed, offset
        return self

    def __repr__(self):
        return f"<sbpflow.Generator object (device={self._device}, seed={self._seed})>"


def _decode_state(state) -> tuple[int, int]:
    from .tensor import Tensor

    if isinstance(state, (tuple, list)) and len(state) == 2 and not isinstance(state[0], Tensor):
        return _as_seed(state[0]), int(state[1]) % _U64
    if not isinstance(state, Tensor):
        raise TypeError(f"set_state(): expected a uint8 or int64 Tensor, got "
                        f"{type(state).__name__}")
    host = np.ascontiguousarray(state.detach()._host()).reshape(-1)
    if host.dtype == np.uint8 and host.size == 16:
        seed, offset = host.view("<u8")
    elif host.dtype == np.int64 and host.size == 2:
        seed, offset = host.view(np.uint64)
    else:
        raise RuntimeError(
            "set_state(): expected a uint8 tensor of 16 bytes or an int64 tensor of 2 elements "
            f"(seed, offset), got {state.dtype.name} with {host.size} elements"
        )
    return int(seed), int(offset)


default_generator = Generator()


def manual_seed(seed) -> Generator:
    """Seed the default generator; returns it (as torch.manual_seed does)."""
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state():
    """The default generator's state as a uint8 tensor (see Generator.get_state)."""
    return default_generator.get_state()


def set_rng_state(new_state) -> None:
    default_generator.set_state(new_state)
