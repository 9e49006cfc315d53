"""What happens to each report: JSON lines, an HTTP push to the controller (the terminal view: monitor/terminal.py).

Push protocol (to the controller): each report is sent as the body of an HTTP POST to the configured URL,
Content-Type application/json, the same object as a --json line, with the credentials of the config's [controller]
(Credentials: its token as `Authorization: Bearer`, over HTTPS its CA and this monitor's certificate). A failed push
is logged and counted, never fatal: the next interval's report supersedes it.
"""
from __future__ import annotations

import json
import logging
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence, TextIO

from dataplanes.agent.wire import read_token, tls_files
from mbalancer.settings import ConfigError
from monitor.monitor import Report

log = logging.getLogger(__name__)


class JsonLines:
    def __init__(self, out: TextIO = sys.stdout):
        self.out = out

    def __call__(self, report: Report) -> None:
        print(json.dumps(report), file=self.out, flush=True)


def url_problem(url: str) -> str | None:
    """None for an http(s) URL with a host; else what is wrong with it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"an http:// URL with a host, e.g. http://127.0.0.1:8080/report (got {url!r})"
    try:
        parts.port  # noqa: B018 (raises ValueError for a port out of range or not a number)
    except ValueError:
        return f"the port of {url!r} is not a number from 1 to 65535"
    return None


@dataclass(frozen=True)
class Credentials:
    """What a client of the controller's HTTP API sends: [controller] token_file, and for HTTPS the CA of the
    controller's certificate (tls_ca) and this client's own certificate (tls_cert, tls_key), read by the switch
    agent's code. None of them: plain requests, as to a controller on loopback."""
    token: str | None = None
    context: ssl.SSLContext | None = None

    @classmethod
    def of(cls, settings: Any) -> "Credentials":
        """From [controller]; ConfigError naming the field for a file that cannot be read or used."""
        token = read_token(settings, "controller")
        cert, _, ca = tls_files(settings, "controller")
        if cert is None and ca is None:
            return cls(token)
        try:
            context = ssl.create_default_context(cadata=ca.decode("ascii", "replace") if ca else None)
            if cert is not None:
                context.load_cert_chain(settings.tls_cert, settings.tls_key)
        except (ssl.SSLError, ValueError, OSError) as err:
            raise ConfigError(f"controller.tls_cert/tls_ca: {err}") from None
        return cls(token, context)

    @property
    def scheme(self) -> str:
        return "https" if self.context is not None else "http"

    def open(self, url: str, data: bytes, timeout: float):
        """POST `data` (JSON) to `url` with the credentials; urllib's reply, or its errors."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method="POST", headers=headers)
        return urllib.request.urlopen(request, timeout=timeout, context=self.context)


def refusal(err: Exception) -> str:
    """An HTTP error in one line, with the controller's own reason (its JSON "error") where it gave one."""
    if isinstance(err, urllib.error.HTTPError):
        try:
            return f"{err.code}: {json.load(err).get('error', err.reason)}"
        except (ValueError, AttributeError, OSError):
            return f"{err.code}: {err.reason}"
    return str(err)


class HttpPush:
    """Each report POSTed to the controller. Several URLs: the controllers of a failover group (only the leader
    listens); each report goes to the one that took the last, else to the next that takes it."""

    def __init__(self, urls: Sequence[str], timeout: float = 0.5, credentials: Credentials = Credentials()):
        self.urls = list(urls)
        self.timeout = timeout
        self.credentials = credentials
        self.sent = self.failed = 0

    def __call__(self, report: Report) -> None:
        data = json.dumps(report).encode()
        errors = []
        for url in list(self.urls):
            try:
                with self.credentials.open(url, data, self.timeout) as reply:
                    reply.read()
            except (urllib.error.URLError, OSError, ValueError) as err:
                errors.append(f"{url}: {refusal(err)}")
                continue
            if url != self.urls[0]:
                log.warning("reports now go to %s (%s)", url, "; ".join(errors))
                self.urls.remove(url)
                self.urls.insert(0, url)
            self.sent += 1
            return
        self.failed += 1
        log.warning("push of the report failed (%s); %d failed so far", "; ".join(errors), self.failed)


class Fanout:
    """Send each report to several outputs."""

    def __init__(self, *outputs):
        self.outputs = outputs

    def __call__(self, report: Report) -> None:
        for output in self.outputs:
            output(report)
