"""The MBalancer config file (TOML): one place for the settings the controller, the monitor and the experiments
share. Every setting but the servers has a default; a bad value raises ConfigError naming the field.

See mbalancer/mbalancer.example.toml for a documented example.
"""
from __future__ import annotations

import ipaddress
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NoReturn

from mbalancer.macs import MAC
from mbalancer.memcache.addresses import ServerAddress, parse_server
from mbalancer.memcache.hashing import parse_hash_spec
from mbalancer.settings import ConfigError, Server, no_unknown, parse_section, typed

REPLICA_MODES = ("equal", "weighted")


AUTO_REPORT_KEYS = 50  # keys per monitor report with hot = "auto": the most the controller may choose


@dataclass(frozen=True)
class Balancing:
    hot: int | None = 10  # H; None with a target: as many as it takes to reach the target imbalance factor
    target: float | None = None  # with hot = "auto": the imbalance factor to reach, in (0, 1]
    groups: int = 1  # G
    mode: str = "weighted"  # water-filling over measured load; "equal" is the thesis's, kept for reproduction
    hysteresis: int = 2  # reports a key must stay hot (or cold) before it changes state
    hash: str = "ketama"  # how clients map keys to home servers


@dataclass(frozen=True)
class Monitoring:
    interval: float = 1.0  # seconds per monitor report
    capacity: int = 1024  # keys the monitor's heavy-hitter summary tracks (its memory), at least balancing.hot


@dataclass(frozen=True)
class Controller:
    listen: str = "127.0.0.1:8080"  # HTTP: state as JSON, monitor reports in
    health_interval: float = 0.1  # seconds between probes of each server
    health_timeout: float = 0.25  # seconds a probe waits for each answer: longer than the queueing delay of a
    # server that is busy but alive (at its link's cap with 32 clients queued: ~55 ms p50), short enough that a
    # hung one is out in well under a second
    health_failures: int = 2  # probes in a row that must fail before a server loses its weight ...
    health_hold: float = 0.25  # ... over at least this many seconds: shorter transients move nothing
    health_udp: bool = True  # probe over UDP too (the protocol balanced gets use); false for TCP-only servers
    lease: float = 1.0  # seconds the switch trusts the copies without hearing from the controller
    poll_interval: float = 0.5  # seconds between CAS checks of every hot key at its home (writes around the switch)
    copy_depth: int = 64  # copies (reads, deletes) sent to one server per round trip in a hot-set change (1: each its
    # own round trip)
    etcd: tuple[str, ...] = ()  # every etcd member's endpoint (http://HOST:PORT): controllers elect one leader there,
    # each asking the member that answered last and the next when it does not; empty: none
    election_key: str = "/mbalancer/leader"  # the key the leader holds (one per fleet of switches)
    election_ttl: int = 1  # seconds: a leader that stops renewing is replaced after this (etcd rounds it up to its
    # minimum, 1.5 x its election timeout: run etcd with --election-timeout 500 for a 1 s lease)
    etcd_ca: str = ""  # https:// etcd endpoints: the CA of etcd's certificate (PEM); empty: the system's
    etcd_cert: str = ""  # this controller's client certificate for etcd (etcd --client-cert-auth); empty: none
    etcd_key: str = ""  # the private key of etcd_cert
    etcd_user: str = ""  # where etcd's auth is on: the user this controller logs in as; empty: no login
    etcd_password_file: str = ""  # a file whose first line is etcd_user's password
    # Who may use the HTTP API (controller/access.py), as [dataplane.agent] says who may drive an agent, and read by
    # the same code (dataplanes/agent/wire.py): the controller checks them, the monitor sends them. Off loopback the
    # controller needs token_file or tls_ca; with either, every endpoint of `listen` needs them, reads included.
    token_file: str = ""  # both: a file whose first line is a shared secret (16 characters or more); empty: none
    tls_cert: str = ""  # controller: its certificate (HTTPS on listen); monitor: its client certificate
    tls_key: str = ""  # the private key of tls_cert
    tls_ca: str = ""  # controller: client certificates must be signed by it; monitor: the CA of the controller's
    metrics_listen: str = ""  # host:port serving GET /metrics, /state, /decisions read-only, without credentials,
    # for scrapers that cannot hold them; empty: none (reads go to listen, with the credentials)
    hide_keys: bool = False  # true: /state, /decisions and /metrics name hot keys by a hash, never their text


@dataclass(frozen=True)
class DataPlane:
    kind: str = "none"  # the data plane the controller drives, by its name in dataplanes/registry.py
    sections: tuple[tuple[str, Any], ...] = ()  # (kind, its [dataplane.<kind>] section as its Settings dataclass)

    @property
    def settings(self) -> Any:
        """The chosen kind's settings (None: a kind without any)."""
        return dict(self.sections).get(self.kind)

    def choose(self, kind: str) -> "DataPlane":
        """The same sections with another kind (e.g. from --driver); ConfigError if it cannot drive a switch."""
        from dataplanes.registry import get
        _check_kind(kind)
        return DataPlane(get(kind).name, self.sections)

    def with_settings(self, settings: Any) -> "DataPlane":
        """The chosen kind's section replaced by `settings` (e.g. from --switch)."""
        others = tuple((k, v) for k, v in self.sections if k != self.kind)
        return DataPlane(self.kind, others + ((self.kind, settings),))


@dataclass(frozen=True)
class Config:
    servers: tuple[Server, ...]
    balancing: Balancing = field(default_factory=Balancing)
    monitor: Monitoring = field(default_factory=Monitoring)
    controller: Controller = field(default_factory=Controller)
    dataplane: DataPlane = field(default_factory=DataPlane)


SECTIONS = {"servers", "balancing", "monitor", "controller", "dataplane"}


def load_config(path: Path | str) -> Config:
    """Read and check a config file."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return parse_config(raw)


def config_option(path: Path | str, fail: Callable[[str], NoReturn]) -> Config:
    """The config a command's --config names, or fail("--config: <why>") (argparse's error: one line, exit 2)."""
    try:
        return load_config(path)
    except ConfigError as err:
        fail(f"--config: {err}")


def parse_config(raw: dict[str, Any]) -> Config:
    """Check a parsed config document; unknown sections and keys are errors (a typo must not pass silently)."""
    no_unknown("", raw, SECTIONS)
    servers = tuple(_server(i, entry) for i, entry in enumerate(_list(raw, "servers")))
    if not servers:
        raise ConfigError("servers: give at least one [[servers]] entry (name, ip, mac, port)")
    for what, values in (("name", [s.name for s in servers]), ("ip and port", [s.address for s in servers]),
                         ("mac", [s.mac.lower() for s in servers])):
        first: dict = {}
        for index, value in enumerate(values):
            if value in first:
                raise ConfigError(f"servers: {servers[first[value]].name} (servers[{first[value]}]) and "
                                  f"{servers[index].name} (servers[{index}]) share the same {what} ({value})")
            first[value] = index
    balancing = _balancing(raw.get("balancing", {}), len(servers))
    monitor = _section(raw, "monitor", Monitoring)
    if not (monitor.interval > 0 and math.isfinite(monitor.interval)):
        raise ConfigError(f"monitor.interval: must be a positive number of seconds (got {monitor.interval})")
    if monitor.capacity < (balancing.hot or 1):
        raise ConfigError(f"monitor.capacity: must be at least balancing.hot ({balancing.hot})")
    controller = _section(raw, "controller", Controller)
    host_port("controller.listen", controller.listen)
    if controller.metrics_listen:
        host_port("controller.metrics_listen", controller.metrics_listen)
        if controller.metrics_listen == controller.listen:
            raise ConfigError("controller.metrics_listen: must differ from controller.listen (it serves reads only)")
    if bool(controller.etcd_cert) != bool(controller.etcd_key):
        raise ConfigError("controller.etcd_key: etcd_cert and etcd_key go together (both, or neither)")
    if bool(controller.etcd_user) != bool(controller.etcd_password_file):
        raise ConfigError("controller.etcd_password_file: etcd_user and etcd_password_file go together (both, or "
                          "neither)")
    if bool(controller.tls_cert) != bool(controller.tls_key):
        raise ConfigError("controller.tls_key: tls_cert and tls_key go together (both, or neither)")
    if not (controller.health_interval > 0 and math.isfinite(controller.health_interval)):
        raise ConfigError(f"controller.health_interval: must be a positive number of seconds "
                          f"(got {controller.health_interval})")
    if not (controller.health_timeout > 0 and math.isfinite(controller.health_timeout)):
        raise ConfigError(f"controller.health_timeout: must be a positive number of seconds "
                          f"(got {controller.health_timeout})")
    if controller.copy_depth < 1:
        raise ConfigError(f"controller.copy_depth: at least 1 copy per round trip (got {controller.copy_depth})")
    if controller.health_failures < 1:
        raise ConfigError(f"controller.health_failures: at least 1 probe (got {controller.health_failures})")
    for name in ("health_hold", "lease", "poll_interval"):
        value = getattr(controller, name)
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"controller.{name}: must be a number of seconds, 0 or more (got {value})")
    if controller.lease <= 2 * controller.health_interval:
        raise ConfigError(f"controller.lease: must be longer than two health intervals ({controller.lease} <= "
                          f"2 x {controller.health_interval}): the lease is renewed once per interval")
    return Config(servers, balancing, monitor, controller, parse_dataplane(raw.get("dataplane", {})))


def parse_dataplane(raw: Any) -> DataPlane:
    """The [dataplane] section: `kind` and each kind's own sub-table, checked against the registry (every
    sub-table is checked, so a typo in one that is not in use is caught too)."""
    from dataplanes.registry import KINDS  # here: the registry reads its sections with parse_section below
    if not isinstance(raw, dict):
        raise ConfigError("dataplane: must be a table ([dataplane])")
    no_unknown("dataplane.", raw, {"kind"} | {k.name for k in KINDS.values() if k.settings})
    kind = raw.get("kind", DataPlane.kind)
    if not isinstance(kind, str):
        raise ConfigError(f"dataplane.kind: expected str, got {kind!r}")
    _check_kind(kind)
    return DataPlane(kind, tuple((k.name, k.parse_settings(raw.get(k.name))) for k in KINDS.values() if k.settings))


def _check_kind(name: str) -> None:
    from dataplanes.registry import KINDS, UnknownDataPlane, get
    try:
        kind = get(name)
    except UnknownDataPlane as err:
        raise ConfigError(f"dataplane.kind: {err}") from None
    if kind.missing:
        raise ConfigError(f"dataplane.kind: {name}: {kind.missing}")
    if kind.driver is None:
        raise ConfigError(f"dataplane.kind: {name} has no controller driver "
                          f"(choose from {', '.join(k.name for k in KINDS.values() if k.driver and not k.missing)})")


def _server(index: int, entry: Any) -> Server:
    where = f"servers[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table with name, ip, mac and port")
    no_unknown(where + ".", entry, {"name", "ip", "mac", "port"})
    for required in ("name", "ip", "mac"):
        if required not in entry:
            raise ConfigError(f"{where}.{required}: missing")
    server = Server(**{k: typed(f"{where}.{k}", v, Server.__dataclass_fields__[k].type) for k, v in entry.items()})
    try:
        ipaddress.IPv4Address(server.ip)
    except ValueError:
        raise ConfigError(f"{where}.ip: {server.ip!r} is not an IPv4 address") from None
    if not MAC.match(server.mac):
        raise ConfigError(f"{where}.mac: {server.mac!r} is not a MAC address like 02:00:00:00:00:01")
    if not 0 < server.port < 65536:
        raise ConfigError(f"{where}.port: must be 1-65535 (got {server.port})")
    return server


def _balancing(raw: Any, servers: int) -> Balancing:
    if isinstance(raw, dict) and isinstance(raw.get("hot"), str) and raw["hot"] != "auto":
        raise ConfigError(f'balancing.hot: a number of keys, or "auto" (got {raw["hot"]!r})')
    if isinstance(raw, dict) and raw.get("hot") == "auto":
        raw = {**raw, "hot": None}
        if "target" not in raw:
            raise ConfigError('balancing.target: hot = "auto" needs a target imbalance factor, e.g. 0.9')
    b = _section({"balancing": raw}, "balancing", Balancing)
    if b.hot is not None and b.hot < 0:
        raise ConfigError(f'balancing.hot: must be 0 or more, or "auto" (got {b.hot})')
    if b.target is not None and not 0 < b.target <= 1:
        raise ConfigError(f"balancing.target: an imbalance factor in (0, 1] (got {b.target})")
    if b.hot is not None and b.target is not None:
        raise ConfigError('balancing.target: only with hot = "auto"')
    if b.groups < 1 or servers % b.groups:
        raise ConfigError(f"balancing.groups: must divide the {servers} servers into equal groups (got {b.groups})")
    if b.mode not in REPLICA_MODES:
        raise ConfigError(f"balancing.mode: one of {', '.join(REPLICA_MODES)} (got {b.mode!r})")
    if b.hysteresis < 1:
        raise ConfigError(f"balancing.hysteresis: at least 1 report (got {b.hysteresis})")
    try:
        parse_hash_spec(b.hash)
    except ValueError as err:
        raise ConfigError(f"balancing.hash: {err}") from None
    return b


def _section(raw: dict, name: str, kind: type):
    return parse_section(raw.get(name, {}), name, kind)


def _list(raw: dict, name: str) -> list:
    value = raw.get(name, [])
    if not isinstance(value, list):
        raise ConfigError(f"{name}: must be a list of tables ([[{name}]])")
    return value


def host_port(where: str, text: str) -> ServerAddress:
    """host:port with both given (parse_server would default the port to memcached's); ConfigError naming `where`."""
    if ":" not in text:
        raise ConfigError(f"{where}: write host:port, e.g. 127.0.0.1:8080 (got {text!r})")
    try:
        return parse_server(text)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


def config_toml(config: Config) -> str:
    """The config as a file load_config reads back to an equal Config (for a controller in another process, e.g.
    ryu-manager started by an experiment)."""
    lines = []
    for server in config.servers:
        lines += ["[[servers]]", *_toml_fields(server)]
    for name in ("balancing", "monitor", "controller"):
        section = getattr(config, name)
        fields = _toml_fields(section)
        if name == "balancing" and section.hot is None:
            fields.append('hot = "auto"')
        lines += [f"[{name}]", *fields]
    lines += ["[dataplane]", f"kind = {_toml_value(config.dataplane.kind)}"]
    for kind, settings in config.dataplane.sections:
        if settings is not None:
            lines += [f"[dataplane.{kind}]", *_toml_fields(settings)]
    return "\n".join(lines) + "\n"


def _toml_fields(section: Any) -> list[str]:
    """`name = value` for each field with a value (TOML has no null: a None is the default's business)."""
    return [f"{name} = {_toml_value(value)}" for name, value in vars(section).items() if value is not None]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")
