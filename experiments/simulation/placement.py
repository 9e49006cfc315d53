"""Random placement of keys on servers, the thesis's model of consistent hashing, for many trials at once."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Draw homes in blocks of about this many keys x trials, so memory stays bounded (about 20 MB a block).
_BLOCK = 2_000_000


@dataclass(frozen=True)
class Placement:
    """Where every key lives in each of `trials` independent random assignments.

    weights: (keys,) request share of each key, hottest first.
    loads:   (trials, servers) request share each server gets with no remedy.
    homes:   (trials, kept) home server of the `kept` hottest keys (the ones a remedy may treat).
    """

    servers: int
    weights: np.ndarray
    loads: np.ndarray
    homes: np.ndarray

    @property
    def trials(self) -> int:
        return self.loads.shape[0]


def assignment_rng(seed: int, servers: int, keys: int) -> np.random.Generator:
    """The generator of one setting's assignments: the same (seed, servers, keys) always gives the same homes,
    whatever H, G, alpha or remedy is asked for, so remedies are compared on identical assignments."""
    return np.random.default_rng(np.random.SeedSequence([seed, servers, keys]))


def place(weights: np.ndarray, servers: int, trials: int, seed: int, kept: int) -> Placement:
    """Assign each key to a server uniformly at random, `trials` times; keep the homes of the `kept` hottest."""
    keys = len(weights)
    kept = min(kept, keys)
    rng = assignment_rng(seed, servers, keys)
    loads = np.empty((trials, servers))
    homes = np.empty((trials, kept), dtype=np.int32)
    rows = max(1, _BLOCK // keys)
    for start in range(0, trials, rows):
        stop = min(trials, start + rows)
        block = rng.integers(0, servers, size=(stop - start, keys), dtype=np.int32)
        loads[start:stop] = server_loads(block, weights, servers)
        homes[start:stop] = block[:, :kept]
    return Placement(servers=servers, weights=weights, loads=loads, homes=homes)


def server_loads(homes: np.ndarray, weights: np.ndarray, servers: int) -> np.ndarray:
    """Sum of the weights of the keys on each server: homes (trials, keys) -> loads (trials, servers)."""
    trials = homes.shape[0]
    # One bincount over (trial, server) cells is a single pass, much faster than a loop over servers.
    cells = homes + (np.arange(trials, dtype=np.int64) * servers)[:, None]
    flat = np.bincount(cells.ravel(), weights=np.broadcast_to(weights, homes.shape).ravel(),
                       minlength=trials * servers)
    return flat.reshape(trials, servers)
