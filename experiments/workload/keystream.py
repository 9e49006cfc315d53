"""The requests clients draw from: key ranks by Zipf(alpha) and get/set by the mix, in chunks, seeded."""
from __future__ import annotations

import numpy as np

CHUNK = 1 << 16


class KeyStream:
    """Draw (key index, is_set) pairs. Numpy samples a chunk at a time; clients take them one by one as plain
    ints, which is what the event loop can afford per request."""

    def __init__(self, weights: np.ndarray, set_ratio: float, seed: int):
        self._rng = np.random.default_rng(seed)
        self._cumulative = np.cumsum(weights)
        self._cumulative[-1] = 1.0  # guard against rounding: every draw lands on a key
        self._set_ratio = set_ratio
        self._keys: list[int] = []
        self._sets: list[bool] = []
        self._next = 0

    def draw(self) -> tuple[int, bool]:
        if self._next == len(self._keys):
            self._refill()
        i = self._next
        self._next += 1
        return self._keys[i], self._sets[i]

    def _refill(self) -> None:
        uniform = self._rng.random(CHUNK)
        self._keys = np.searchsorted(self._cumulative, uniform, side="right").tolist()
        self._sets = (self._rng.random(CHUNK) < self._set_ratio).tolist()
        self._next = 0
