"""What a load run does, checked before anything is sent."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from experiments.simulation.zipf import MAX_KEYS, zipf_weights
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.client import DEFAULT_TIMEOUT, MAX_UDP_REQUEST
from mbalancer.memcache.hashing import KeyHash, make_hash
from mbalancer.memcache.keys import key_problem
from mbalancer.memcache.lines import MAX_VALUE
from mbalancer.memcache.requests import build_set

PROTOCOLS = ("udp", "tcp")


class WorkloadError(ValueError):
    """An impossible workload; the message names the option."""


@dataclass(frozen=True)
class Workload:
    servers: tuple[ServerAddress, ...]
    keys: int = 1000
    alpha: float = 1.0
    clients: int = 64
    duration: float = 10.0  # seconds; ignored when `requests` is set
    requests: int | None = None  # stop after this many requests in all
    value_size: int = 100
    set_ratio: float = 0.0  # share of requests that are sets (the rest are gets)
    hash: str = "ketama"
    protocol: str = "udp"
    timeout: float = DEFAULT_TIMEOUT
    seed: int = 1
    key_prefix: str = "key:"

    def check(self) -> None:
        """Raise WorkloadError naming the first impossible option."""
        if not self.servers:
            raise WorkloadError("--servers: give at least one host:port")
        for name in ("keys", "clients", "value_size"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.keys > MAX_KEYS:
            raise WorkloadError(f"--keys must be at most {MAX_KEYS:,} (got {self.keys:,}): every key is held in "
                                f"memory")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise WorkloadError(f"--alpha must be a positive number (got {self.alpha})")
        if not (self.duration >= 0 and math.isfinite(self.duration)):
            raise WorkloadError(f"--duration must be zero or more seconds (got {self.duration})")
        if self.requests is not None and self.requests < 0:
            raise WorkloadError(f"--requests must be zero or more (got {self.requests})")
        if not 0 <= self.set_ratio <= 1:
            raise WorkloadError(f"--set-ratio must lie in [0, 1] (got {self.set_ratio})")
        if not self.timeout > 0:
            raise WorkloadError(f"--timeout must be positive (got {self.timeout})")
        if self.protocol not in PROTOCOLS:
            raise WorkloadError(f"--protocol must be one of {', '.join(PROTOCOLS)} (got {self.protocol!r})")
        if self.value_size > MAX_VALUE:
            raise WorkloadError(f"--value-size must be at most {MAX_VALUE} bytes (memcached's item limit)")
        self._check_keys()
        try:
            self.key_hash  # builds the hash: a skewed target out of reach fails here
        except ValueError as err:
            raise WorkloadError(f"--hash: {err}") from None

    def _check_keys(self) -> None:
        longest = self.key_names[-1]
        if problem := key_problem(longest):
            raise WorkloadError(f"--key-prefix: keys such as {longest[:40]!r} are invalid: {problem}")
        if self.protocol == "udp" and self.set_ratio > 0:
            size = len(build_set(longest, self.value(0)))
            if size > MAX_UDP_REQUEST:
                raise WorkloadError(f"--value-size: a set of {size} bytes does not fit one UDP datagram "
                                    f"({MAX_UDP_REQUEST}); use --protocol tcp or a smaller value")

    @cached_property
    def key_names(self) -> list[bytes]:
        """Keys by popularity rank: key_names[0] is the hottest (`key:1`)."""
        return [f"{self.key_prefix}{rank}".encode() for rank in range(1, self.keys + 1)]

    def weights(self) -> np.ndarray:
        return zipf_weights(self.keys, self.alpha)

    @cached_property
    def key_hash(self) -> KeyHash:
        return make_hash(self.hash, self.servers, self.key_names, self.weights())

    def value(self, key_index: int) -> bytes:
        """The value stored under a key: `value_size` bytes that name the key, so a wrong answer is visible."""
        name = self.key_names[key_index] + b"|"
        return (name * (self.value_size // len(name) + 1))[:self.value_size]

    @cached_property
    def homes(self) -> list[int]:
        """Server index of every key, by popularity rank."""
        return [self.key_hash.server_of(name) for name in self.key_names]
