"""Who may use the controller's HTTP API, and what a reader sees of the keys.

The switch agent's rules, read by the agent's own code (dataplanes/agent/wire.py) from [controller]: `token_file` (a
shared secret sent as `Authorization: Bearer ...`) and/or TLS (`tls_cert`, `tls_key`; with `tls_ca`, client
certificates signed by that CA are required: controller/tls_front.py checks them before any byte reaches the HTTP
server). Off loopback the controller needs one of token_file and tls_ca, or it refuses to start: anyone reaching the
port would choose the hot keys (which makes it copy values onto other servers), switch the sketch off and read the
keys, which often carry user ids and login tokens. With credentials, every endpoint needs them, reads included
(docs/deployment.md says why); `metrics_listen` serves the reads without them where the operator opens it.

A refusal is a 401 in one line, counted (`mbalancer_http_refused_total`) and logged, at most one line a second so
that a flood of refusals cannot fill the log (the line says how many more there were).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import re
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dataplanes.agent.wire import is_loopback, read_token, tls_files
from mbalancer.settings import ConfigError

log = logging.getLogger(__name__)

SECTION = "controller"
LOG_EVERY = 1.0  # seconds between two lines about refused requests
REFUSED = {"no token": "send Authorization: Bearer <the secret of controller.token_file>",
           "wrong token": "the token is not controller.token_file's",
           "tls": "TLS refused: no client certificate, one of another CA, or not TLS"}


@dataclass
class Access:
    """The credentials every request on a listener must carry; none: open (loopback without credentials, or the
    read-only metrics_listen)."""
    token: str | None = None
    context: ssl.SSLContext | None = None  # HTTPS: the controller's certificate (and the CA of clients', if any)
    client_certificates: bool = False  # required (tls_ca)
    hide_keys: bool = False
    refused: Counter = field(default_factory=Counter)  # reason -> requests refused
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _logged_at: float = field(default=float("-inf"), repr=False)
    _unlogged: int = field(default=0, repr=False)

    @property
    def tls(self) -> bool:
        return self.context is not None

    def describe(self) -> str:
        """How the listener is guarded, for the start line."""
        parts = (["HTTPS" + (" with client certificates" if self.client_certificates else "")] if self.tls else []) + \
            (["a token"] if self.token else [])
        return " and ".join(parts) if parts else "no credentials (loopback only)"

    def refusal(self, authorization: str) -> str | None:
        """Why a request with this Authorization header is refused, or None (a reason of REFUSED)."""
        if self.token is None:
            return None
        if not authorization:
            return "no token"
        scheme, _, given = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(errors="replace"),
                                                                 self.token.encode()):
            return "wrong token"
        return None

    def refuse(self, reason: str, what: str, client: str) -> None:
        """Count a refused request and log it (at most one line per LOG_EVERY s, with the count of the others)."""
        with self._lock:
            self.refused[reason] += 1
            now = time.monotonic()
            if now - self._logged_at < LOG_EVERY:
                self._unlogged += 1
                return
            more, self._unlogged, self._logged_at = self._unlogged, 0, now
        log.warning("refused %s from %s: %s%s", _printable(what), _printable(client),
                    "TLS" if reason == "tls" else reason, f" ({more} more refused in the last seconds)" if more else "")


def _printable(text: str) -> str:
    """A client's words in a log line: one line, whatever it sent (a path may hold an encoded line end)."""
    return "".join(c if c.isprintable() else "?" for c in str(text)[:200])


def access_for(settings: Any, listen: str) -> Access:
    """The credentials of [controller] (`settings`) for serving on `listen`; ConfigError, in one line, for files
    that cannot be read or an address off loopback with neither a token nor client certificates."""
    token = read_token(settings, SECTION)
    cert, _, ca = tls_files(settings, SECTION)
    if ca is not None and cert is None:
        raise ConfigError(f"{SECTION}.tls_ca: client certificates are checked over HTTPS: give tls_cert and tls_key")
    if not is_loopback(listen) and token is None and ca is None:
        raise ConfigError(f"{SECTION}.listen: {listen} is reached from other machines: give token_file or tls_ca "
                          f"(anyone who reaches the port would choose the hot keys and read them)")
    return Access(token, _server_context(settings, ca) if cert else None, ca is not None, settings.hide_keys)


def _server_context(settings: Any, ca: bytes | None) -> ssl.SSLContext:
    """The HTTPS side of [controller]: its certificate, and client certificates required when tls_ca is given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (ssl.SSLError, OSError) as err:
        raise ConfigError(f"{SECTION}.tls_cert: {settings.tls_cert} with {settings.tls_key}: {err}") from None
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as err:
            raise ConfigError(f"{SECTION}.tls_ca: {settings.tls_ca}: not a PEM certificate ({err})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def reader_access(main: Access) -> Access:
    """metrics_listen's: no credentials, the keys hidden as on the main listener, the refusals counted there (its
    /metrics shows them)."""
    return Access(hide_keys=main.hide_keys, refused=main.refused)


# --- hidden keys ------------------------------------------------------------------------------------------------------
def key_hash(key: bytes) -> str:
    """What a hidden key reads as: a prefix of its SHA-256 (an operator finds a key of their own with
    `printf %s KEY | sha256sum`; a key easy to guess is as easy to confirm, so it hides text, not guessable keys)."""
    return "sha256:" + hashlib.sha256(key).hexdigest()[:24]


def hide_keys(data: Any) -> Any:
    """`data` (/state's or /decisions' JSON) with every key named by key_hash: each "key" field, the data plane's
    per-key counters, and the keys where a text (a decision's reason, an error) quotes one."""
    keys: set[str] = set()
    _collect(data, keys)
    if not keys:
        return data
    hashes = {text: key_hash(text.encode("utf-8", "surrogateescape")) for text in keys}
    # a key counts where it stands alone (a reason quotes it between spaces, quotes or brackets), so a short key
    # does not garble the words that contain it
    quoted = re.compile(r"(?<![^\s'\"(\[{,=])(" + "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
                        + r")(?![^\s'\"):\]},.;=])")
    return _replace(data, hashes, quoted)


def _collect(data: Any, keys: set[str]) -> None:
    if isinstance(data, dict):
        for name, value in data.items():
            if name == "key" and isinstance(value, str):
                keys.add(value)
            elif name == "keys" and isinstance(value, dict):  # the data plane's counters: key -> counts
                keys.update(k for k in value if isinstance(k, str))
            else:
                _collect(value, keys)
    elif isinstance(data, list):
        for value in data:
            _collect(value, keys)


def _replace(data: Any, hashes: dict[str, str], quoted: re.Pattern) -> Any:
    if isinstance(data, dict):
        return {name: hashes.get(value, value) if name == "key" and isinstance(value, str) else
                {hashes.get(k, k): _replace(v, hashes, quoted) for k, v in value.items()}
                if name == "keys" and isinstance(value, dict) else _replace(value, hashes, quoted)
                for name, value in data.items()}
    if isinstance(data, list):
        return [_replace(value, hashes, quoted) for value in data]
    if isinstance(data, str):
        return quoted.sub(lambda match: hashes[match.group(1)], data)
    return data
