"""Zipf key popularity: the i-th most popular of N keys gets a share proportional to 1 / i**alpha."""
from __future__ import annotations

import numpy as np


def zipf_weights(keys: int, alpha: float) -> np.ndarray:
    """Request share of each key, hottest first; shape (keys,), summing to 1."""
    if keys < 1:
        raise ValueError("keys must be at least 1")
    if alpha <= 0:
        raise ValueError("alpha must be positive")
    raw = np.arange(1, keys + 1, dtype=float) ** -alpha
    return raw / raw.sum()


def hot_share(hot: int, keys: int, alpha: float) -> float:
    """Share of all requests that go to the `hot` most popular keys (H_hot / H_keys for alpha = 1)."""
    if not 0 <= hot <= keys:
        raise ValueError("hot must be between 0 and keys")
    return float(zipf_weights(keys, alpha)[:hot].sum())
