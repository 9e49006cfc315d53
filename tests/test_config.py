"""The config file: the documented example loads, defaults fill the rest, every bad value names its field."""
from __future__ import annotations

from pathlib import Path

import pytest

from mbalancer.config import Balancing, ConfigError, Controller, Monitoring, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[1] / "mbalancer" / "mbalancer.example.toml"
TWO = [{"name": "s1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"},
       {"name": "s2", "ip": "10.0.0.2", "mac": "02:00:00:00:00:02", "port": 11212}]


def test_the_documented_example_is_the_defaults():
    config = load_config(EXAMPLE)
    assert [s.name for s in config.servers] == ["s1", "s2"]
    assert config.balancing == Balancing() and config.monitor == Monitoring() and config.controller == Controller()


def test_only_servers_are_required():
    config = parse_config({"servers": TWO})
    assert config.servers[0].port == 11211 and str(config.servers[1].address) == "10.0.0.2:11212"
    assert config.balancing.hot == 10 and config.balancing.mode == "weighted"  # the one that never lowers the IF


def test_two_servers_sharing_an_address_are_both_named():
    with pytest.raises(ConfigError) as refused:
        parse_config({"servers": [TWO[0], TWO[1], {**TWO[0], "name": "s9", "mac": "02:00:00:00:00:09"}]})
    assert str(refused.value) == ("servers: s1 (servers[0]) and s9 (servers[2]) share the same ip and port "
                                  "(10.0.0.1:11211)")


def test_auto_hot_with_a_target():
    config = parse_config({"servers": TWO, "balancing": {"hot": "auto", "target": 0.9, "mode": "weighted"}})
    assert config.balancing.hot is None and config.balancing.target == 0.9


@pytest.mark.parametrize("changes, field", [
    ({"servers": []}, "servers:"),
    ({"servers": [{"name": "s1", "ip": "10.0.0.1"}]}, "servers[0].mac: missing"),
    ({"servers": [{**TWO[0], "ip": "10.0.0"}]}, "servers[0].ip"),
    ({"servers": [{**TWO[0], "mac": "02:00:00:00:01"}]}, "servers[0].mac"),
    ({"servers": [{**TWO[0], "port": 0}]}, "servers[0].port"),
    ({"servers": [{**TWO[0], "port": "11211"}]}, "servers[0].port: expected int"),
    ({"servers": [{**TWO[0], "weight": 2}]}, "servers[0].weight: unknown"),
    ({"servers": [TWO[0], {**TWO[1], "name": "s1"}]}, "same name"),
    ({"servers": [TWO[0], {**TWO[0], "name": "s9", "mac": "02:00:00:00:00:09"}]}, "same ip and port"),
    ({"balancing": {"groups": 3}}, "balancing.groups"),
    ({"balancing": {"mode": "fair"}}, "balancing.mode"),
    ({"balancing": {"hot": -1}}, "balancing.hot"),
    ({"balancing": {"hot": "auto"}}, "balancing.target"),
    ({"balancing": {"target": 0.9}}, "balancing.target: only with"),
    ({"balancing": {"hot": "auto", "target": 1.5}}, "balancing.target"),
    ({"balancing": {"hysteresis": 0}}, "balancing.hysteresis"),
    ({"balancing": {"hash": "crc"}}, "balancing.hash"),
    ({"balancing": {"hot": True}}, "balancing.hot: expected int"),
    ({"balancing": {"hot": "ten"}}, 'balancing.hot: a number of keys, or "auto"'),
    ({"monitor": {"interval": 0}}, "monitor.interval"),
    ({"monitor": {"capacity": 5}}, "monitor.capacity"),
    ({"controller": {"listen": "no-such-host.invalid:80"}}, "controller.listen"),
    ({"controller": {"listen": "127.0.0.1"}}, "controller.listen"),
    ({"controler": {}}, "controler: unknown"),
    ({"monitor": 3}, "monitor: must be a table"),
])
def test_bad_values_name_the_field(changes, field):
    raw = {"servers": TWO, **changes}
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_config(raw)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[servers\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize("text, message", [
    ("10.77.0:11211", "10.77.0 is not an IPv4 address"),
    ("10.0.0.256:11211", "is not an IPv4 address"),
    ("10.0.0.1:0", "port must be a number"),
])
def test_a_server_address_is_a_whole_ipv4_address(text, message):
    from mbalancer.memcache.addresses import parse_server
    with pytest.raises(ValueError, match=message):
        parse_server(text)


def test_the_controller_listens_only_where_told(run_cli, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[[servers]]\nname = "s1"\nip = "127.0.0.1"\nmac = "02:00:00:00:00:01"\nport = 11211\n')
    result = run_cli("controller", "--config", str(config), "--listen", "localhost", timeout=60)
    assert result.returncode == 2 and "--listen: write host:port" in result.stderr.strip().splitlines()[-1]
