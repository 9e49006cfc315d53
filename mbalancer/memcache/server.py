"""Start and stop a local memcached process (tests, benchmarks), with UDP on, stopped by its own PID."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from mbalancer.memcache.frame import pack_udp_frame, parse_udp_frame
from mbalancer.memcache.requests import build_get
from mbalancer.processes import stop_process


class MemcachedError(RuntimeError):
    """memcached is missing or did not come up."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free for both TCP and UDP right now (memcached listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((host, 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
            return port
    raise MemcachedError("no free port found")


@dataclass
class MemcachedServer:
    """One memcached listening on host:port over TCP and UDP. Use as a context manager, or start()/stop()."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free one
    threads: int = 1
    memory_mb: int = 64
    max_item: str = "1m"
    extra_args: list[str] = field(default_factory=list)
    launcher: Callable[..., subprocess.Popen] = subprocess.Popen  # e.g. a Mininet host's popen: run it there
    process: subprocess.Popen | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self, timeout: float = 5.0) -> "MemcachedServer":
        binary = shutil.which("memcached")
        if binary is None:
            raise MemcachedError("memcached is not installed (it is in install/apt-packages.txt: run make install)")
        self.port = self.port or free_port(self.host)
        args = [binary, "-l", self.host, "-p", str(self.port), "-U", str(self.port), "-t", str(self.threads),
                "-m", str(self.memory_mb), "-I", self.max_item, "-u", "root", *self.extra_args]
        self.process = self.launcher(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout)
        return self

    def stop(self) -> None:
        if self.process:
            stop_process(self.process)
        if self.process and self.process.stderr:
            self.process.stderr.close()

    def __enter__(self) -> "MemcachedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self, timeout: float) -> None:
        """Ready when it answers a UDP get (so both TCP setup and the UDP listener are up)."""
        deadline = time.monotonic() + timeout
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.settimeout(0.1)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    err = self.process.stderr.read().decode(errors="replace").strip()
                    raise MemcachedError(f"memcached exited with code {self.process.returncode}: {err}")
                try:
                    probe.sendto(pack_udp_frame(1, build_get(b"__ready__")), self.address)
                    if not isinstance(parse_udp_frame(probe.recv(2048)), tuple):
                        continue
                    return
                except OSError:
                    time.sleep(0.05)
        self.stop()
        raise MemcachedError(f"memcached on {self.host}:{self.port} did not answer within {timeout} s")
