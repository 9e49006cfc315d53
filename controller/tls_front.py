"""HTTPS for the controller's HTTP API: TLS is ended here, on asyncio, and each connection whose handshake passed is
relayed byte for byte to the HTTP server (waitress, which speaks no TLS) on a Unix socket in a folder only this user
reaches, so nobody on the machine goes round the certificate check through it.

Why asyncio and not a thread per connection: a client that connects and never finishes its handshake, or trickles its
request, holds no thread; the handshake must end within `timeout` seconds, a relayed connection silent for as long in
both directions is closed, and at most CONNECTIONS are open. A refused handshake (no client certificate, one another
CA signed, plain HTTP on the HTTPS port) is counted and logged by the listener's Access. The HTTP server hears each
client as "PEER via TLS": its side of the Unix socket is bound to an abstract name that carries the peer's address.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import ssl
import threading
from typing import Any

from controller.access import Access

log = logging.getLogger(__name__)

CHUNK = 65536
PREFIX = "mbalancer-tls"  # abstract Unix names of relayed connections: "\0mbalancer-tls <pid> <n> <peer>"
_names = itertools.count()


class TlsFront:
    """Bound at construction (a taken port fails at once); start() serves in a daemon thread, shutdown() stops."""

    def __init__(self, address: tuple[str, int], access: Access, inner: str, timeout: float, backlog: int,
                 connections: int):
        self.access, self.inner, self.timeout, self.connections = access, inner, timeout, connections
        self.context = access.context
        host, port = address
        self._socket = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                            backlog=backlog)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._open = 0

    def start(self) -> "TlsFront":
        self._thread = threading.Thread(target=self._run, name="mbalancer-https", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop listening and close every connection (the loop's thread closes the loop on its way out)."""
        if self._thread is None:
            self._loop.close()
        else:
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:  # stopped already
                pass
            self._thread.join(timeout=3)
        self._socket.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, sock=self._socket))
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            if tasks:  # each cancelled relay closes its sockets on its way out
                self._loop.run_until_complete(asyncio.wait(tasks, timeout=2))
            self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _address(writer.get_extra_info("peername"))
        if self._open >= self.connections:  # as waitress's connection_limit: the client may try again
            writer.close()
            return
        self._open += 1
        try:
            await self._serve(peer, reader, writer)
        finally:
            self._open -= 1
            writer.close()

    async def _serve(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.start_tls(self.context, ssl_handshake_timeout=self.timeout)
        except (ssl.SSLError, OSError, asyncio.TimeoutError, ConnectionError) as err:
            self.access.refuse("tls", "a TLS handshake", f"{peer} ({_why(err)})")
            return
        try:
            inner_reader, inner_writer = await self._connect_inner(peer)
        except OSError as err:  # the HTTP server is stopping
            log.warning("HTTPS from %s not relayed: %s", peer, err)
            return
        try:
            await asyncio.gather(self._pipe(reader, inner_writer, half_close=True), self._pipe(inner_reader, writer))
        finally:
            inner_writer.close()

    async def _connect_inner(self, peer: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to the HTTP server whose own address names the client (the server logs and refuses by it)."""
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            inner.bind(f"\0{PREFIX} {os.getpid()} {next(_names)} {peer}"[:107])
            inner.setblocking(False)
            await asyncio.wait_for(self._loop.sock_connect(inner, self.inner), self.timeout)
        except (OSError, asyncio.TimeoutError) as err:
            inner.close()
            raise OSError(str(err) or "timed out") from None
        return await asyncio.open_unix_connection(sock=inner)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, half_close: bool = False) -> None:
        """Copy until the source ends or nothing moves for twice `timeout` s (the HTTP server closes a silent
        connection after `timeout`: this bounds the relay should it not). A client that only stopped sending
        (half_close) still gets its answer."""
        ended = False
        try:
            while data := await asyncio.wait_for(source.read(CHUNK), self.timeout * 2):
                sink.write(data)
                await asyncio.wait_for(sink.drain(), self.timeout * 2)
            ended = half_close and sink.can_write_eof()
            if ended:
                sink.write_eof()
        except (OSError, asyncio.TimeoutError, ConnectionError):
            ended = False
        finally:
            if not ended:
                sink.close()


def peer_of(address: Any) -> tuple[str, None]:
    """What the HTTP server calls a relayed client (waitress's fix_addr): "PEER via TLS"."""
    name = address.decode(errors="replace") if isinstance(address, bytes) else str(address)
    parts = name.lstrip("\0").split(" ", 3)
    return (f"{parts[3]} via TLS" if len(parts) == 4 and parts[0] == PREFIX else "localhost"), None


def _address(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"
    return str(peer)


def _why(err: BaseException) -> str:
    """A handshake's failure in a few words."""
    if isinstance(err, asyncio.TimeoutError):
        return "no handshake in time"
    if isinstance(err, ssl.SSLError):
        return err.reason.lower().replace("_", " ") if err.reason else str(err)
    return str(err) or type(err).__name__
