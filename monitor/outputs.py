"""What happens to each report: JSON lines, an HTTP push to the controller (the terminal view: monitor/terminal.py).

Push protocol (to the controller): each report is sent as the body of an HTTP POST to the configured URL,
Content-Type application/json, the same object as a --json line. A failed push is logged and counted, never fatal:
the next interval's report supersedes it.
"""
from __future__ import annotations

import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Sequence, TextIO

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


class HttpPush:
    """Each report POSTed to the controller. Several URLs: the controllers of a failover group (only the leader
    listens); each report goes to the one that took the last, else to the next that takes it."""

    def __init__(self, urls: Sequence[str], timeout: float = 0.5):
        self.urls = list(urls)
        self.timeout = timeout
        self.sent = self.failed = 0

    def __call__(self, report: Report) -> None:
        data = json.dumps(report).encode()
        errors = []
        for url in list(self.urls):
            request = urllib.request.Request(url, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                    reply.read()
            except (urllib.error.URLError, OSError, ValueError) as err:
                errors.append(f"{url}: {err}")
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
