"""Random generators: a seed plus a counter offset into a Philox stream.

Each random op takes `words_used` words from the offset, so the same seed gives the same
sequence of tensors, and a piece of a tensor can be drawn without drawing the rest.
"""

from __future__ import annotations

import os
import threading


class Generator:
    def __init__(self, device="cpu"):
        self.device = device
        self._seed = 67280421310721
        self._offset = 0
        self._lock = threading.Lock()

    def manual_seed(self, seed: int) -> Generator:
        seed = int(seed)
        self._seed = seed & (2**64 - 1)
        self._offset = 0
        return self

    def seed(self) -> int:
        s = int.from_bytes(os.urandom(8), "little") & (2**63 - 1)
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed

    def take(self, words: int) -> tuple[int, int]:
        """Reserve `words` words of the stream: returns (seed, offset) for the draw."""
        with self._lock:
            off = self._offset
            self._offset += words
        return self._seed, off

    def get_state(self) -> tuple[int, int]:
        return self._seed, self._offset

    def set_state(self, state) -> None:
        self._seed, self._offset = int(state[0]), int(state[1])


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    return default_generator.manual_seed(seed)


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()
