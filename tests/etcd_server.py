"""etcd for tests: Debian's etcd-server, one member on free loopback ports (or in a namespace of the testbed's
management LAN, at its address), its data in a folder of the test's, with
a 500 ms election timeout so that a 1 s lease is honoured (etcd's minimum TTL is 1.5 election timeouts), its data
in memory."""
from __future__ import annotations

import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process

START_TIMEOUT = 30.0


def available() -> str | None:
    return None if shutil.which("etcd") else "etcd is missing (apt package etcd-server: make install)"


class EtcdServer:
    def __init__(self, folder: Path, host=None, tls: tuple[Path, Path, Path] | None = None):
        """host: a topologies.management.LanHost to run in, reached at its address (default: 127.0.0.1). tls: (ca,
        server, client) of tests/certificates.py: https, client certificates that CA signed required
        (--client-cert-auth), the client's used by the health check."""
        client, peer = free_port(), free_port()
        ip = host.ip if host is not None else "127.0.0.1"
        inside = host.command() if host is not None else []
        # its data in memory (/dev/shm): a disk busy with other tests stalls etcd's fsyncs past a 1 s lease
        self.data = Path(tempfile.mkdtemp(prefix="mbalancer-etcd-", dir="/dev/shm"))
        self.url = f"{'https' if tls else 'http'}://{ip}:{client}"
        self.context = None
        secure = []
        if tls:
            ca, server, me = tls
            secure = ["--client-cert-auth", "--trusted-ca-file", f"{ca}.crt", "--cert-file", f"{server}.crt",
                      "--key-file", f"{server}.key"]
            self.context = ssl.create_default_context(cafile=f"{ca}.crt")
            self.context.load_cert_chain(f"{me}.crt", f"{me}.key")
        self.log = folder / "etcd.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [*inside, "etcd", "--name", "test", "--data-dir", str(self.data), "--listen-client-urls", self.url,
                 "--advertise-client-urls", self.url, "--listen-peer-urls", f"http://{ip}:{peer}",
                 "--initial-advertise-peer-urls", f"http://{ip}:{peer}",
                 "--initial-cluster", f"test=http://{ip}:{peer}", "--heartbeat-interval", "50",
                 "--election-timeout", "500", *secure], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._healthy():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"etcd did not start: {self.log.read_text()[-1000:]}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1, context=self.context) as reply:
                return b'"true"' in reply.read()
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.process, grace=15)
        shutil.rmtree(self.data, ignore_errors=True)

    def __enter__(self) -> "EtcdServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
