"""What a config section is, below every part that has one: ConfigError, typed tables of settings (a dataclass
whose fields have defaults, checked field by field), and the server record every part passes around.

mbalancer/config.py reads the config file with these; each data plane's section ([dataplane.<kind>]) is read with
parse_section by the registry (dataplanes/registry.py), which therefore needs nothing of the config file itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mbalancer.memcache.addresses import DEFAULT_PORT, ServerAddress


class ConfigError(ValueError):
    """A config value that cannot be used; the message starts with the field, e.g. `servers[2].mac: ...`."""


@dataclass(frozen=True)
class Server:
    name: str  # how logs, /state and the fabric's boxes name it; unique
    ip: str  # its IPv4 address, as the clients address it
    mac: str  # its MAC (or the next hop's), which balanced gets are rewritten to: the switch checks it
    port: int = DEFAULT_PORT  # its memcached port (TCP and UDP)

    @property
    def address(self) -> ServerAddress:
        return ServerAddress(self.ip, self.port)


def parse_section(values: Any, where: str, kind: type) -> Any:
    """A table of settings as the dataclass `kind` (every field has a default); unknown keys and values of the
    wrong type are errors naming the field, e.g. `dataplane.ebpf.switches: ...`."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: must be a table ([{where}])")
    fields = kind.__dataclass_fields__
    no_unknown(where + ".", values, set(fields))
    return kind(**{k: typed(f"{where}.{k}", v, fields[k].type) for k, v in values.items()})


def typed(where: str, value: Any, annotation: str) -> Any:
    """Check a value against a field's annotation (as text: `int`, `float | None`, ...)."""
    allowed = [a.strip() for a in annotation.split("|")]
    if value is None and "None" in allowed:
        return None
    if "float" in allowed and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if "int" in allowed and isinstance(value, int) and not isinstance(value, bool):
        return value
    if "str" in allowed and isinstance(value, str):
        return value
    if "bool" in allowed and isinstance(value, bool):
        return value
    if "tuple[str, ...]" in allowed and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if "tuple[int, ...]" in allowed and isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    names = {"tuple[str, ...]": "a list of strings", "tuple[int, ...]": "a list of integers", "bool": "true or false"}
    raise ConfigError(f"{where}: expected {' or '.join(names.get(a, a) for a in allowed if a != 'None')}, "
                      f"got {value!r}")


def no_unknown(prefix: str, table: dict, known: set[str]) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{prefix}{key}: unknown setting (known: {', '.join(sorted(known))})")
