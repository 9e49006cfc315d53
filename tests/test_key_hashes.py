"""Key -> server hashes: ketama's balance and stability, the skewed hash's dialled imbalance."""
from __future__ import annotations

import numpy as np
import pytest

from controller.load import imbalance_factor
from experiments.simulation.zipf import zipf_weights
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.hashing import KetamaHash, ModuloHash, SkewedHash, make_hash

SERVERS = [ServerAddress(f"10.0.0.{i}") for i in range(1, 11)]
KEYS = [b"key:%d" % i for i in range(1, 20001)]


def test_ketama_spreads_keys_evenly():
    ketama = KetamaHash(SERVERS)
    counts = np.bincount([ketama.server_of(k) for k in KEYS], minlength=10)
    assert counts.min() > 0.6 * len(KEYS) / 10 and counts.max() < 1.4 * len(KEYS) / 10


def test_ketama_adding_a_server_moves_only_its_share_and_only_to_it():
    before = KetamaHash(SERVERS)
    after = KetamaHash(SERVERS + [ServerAddress("10.0.0.11")])
    moved = [(before.server_of(k), after.server_of(k)) for k in KEYS if before.server_of(k) != after.server_of(k)]
    assert all(new == 10 for _, new in moved)
    assert 0.5 / 11 < len(moved) / len(KEYS) < 1.5 / 11


def test_ketama_is_a_function_of_the_addresses_not_of_the_process():
    first, again = KetamaHash(SERVERS), KetamaHash([ServerAddress(s.host, s.port) for s in SERVERS])
    assert [again.server_of(k) for k in KEYS[:500]] == [first.server_of(k) for k in KEYS[:500]]
    ports = KetamaHash([ServerAddress(s.host, 11212) for s in SERVERS])
    assert [ports.server_of(k) for k in KEYS[:500]] != [again.server_of(k) for k in KEYS[:500]]


def test_modulo_uses_every_server():
    assert set(ModuloHash(SERVERS).server_of(k) for k in KEYS) == set(range(10))


@pytest.mark.parametrize("servers, target", [(n, t) for n in (2, 3) for t in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)]
                         + [(10, 0.3), (10, 0.7)])  # 10 servers: the hottest key caps it at 0.749
def test_skewed_hash_dials_the_imbalance_factor(servers, target):
    weights = zipf_weights(1000, 1.0)
    skewed = SkewedHash(SERVERS[:servers], KEYS[:1000], weights, target)
    loads = np.bincount([skewed.server_of(k) for k in KEYS[:1000]], weights=weights, minlength=servers)
    assert imbalance_factor(loads) == pytest.approx(target, abs=0.01)
    if target < 1:
        assert loads.argmax() == 0  # the first server is the heavy one


def test_skewed_hash_refuses_what_it_cannot_reach_and_falls_back_to_ketama():
    weights = zipf_weights(1000, 1.0)
    with pytest.raises(ValueError, match=r"out of reach.*\[0\.100, 0\.749\]"):
        SkewedHash(SERVERS, KEYS[:1000], weights, 0.9)  # the hottest key alone is 13% of 10 servers' load
    with pytest.raises(ValueError, match="at least two"):
        SkewedHash(SERVERS[:1], KEYS[:1000], weights, 1.0)
    skewed = SkewedHash(SERVERS[:2], KEYS[:1000], weights, 0.7)
    assert skewed.server_of(b"not-in-workload") == KetamaHash(SERVERS[:2]).server_of(b"not-in-workload")


@pytest.mark.parametrize("spec, message", [("md5", "unknown hash"), ("ketama:3", "unknown hash"),
                                           ("skewed", "skewed:IF"), ("skewed:x", "skewed:IF")])
def test_make_hash_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        make_hash(spec, SERVERS[:2], KEYS[:10], zipf_weights(10, 1.0))


def test_make_hash_skewed_needs_the_workload():
    with pytest.raises(ValueError, match="experiment's own keys .* ketama or modulo"):
        make_hash("skewed:0.7", SERVERS[:2])
    assert make_hash("skewed:0.7", SERVERS[:2], KEYS[:10], zipf_weights(10, 1.0)).spec == "skewed:0.7"
