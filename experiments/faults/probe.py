"""A coherence probe, run in the client's namespace: one request over TCP to a hot key's home (a TTL change, a write
split across segments, ...), then, for a while, in turn: what the home holds (`gets` over TCP, which the switch always
sends home) and a get of the key through the switch, over UDP or (--gets tcp) over a TCP connection (which it may
send to a replica), each recorded with its time since the request. Prints one JSON object: {"reply": the TCP reply,
"home": [[t, value or null]], "gets": [[t, value or null]], "timeouts": n}; a get that returns a value after the home
answered a miss was served by a stale copy.
    python -m experiments.faults.probe --key K --home IP:PORT --send HEX [--then HEX --after S] [--seconds S]
    python -m experiments.faults.probe --key K --home IP:PORT --jobs FILE
--send is written first, --then (if given) --after seconds later on the same connection; t counts from the last.
--jobs runs several probes in turn, each a JSON object {"send", "then", "after", "seconds"} (hex bytes) of a JSON
list in FILE, and prints a JSON list of results.
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time

from experiments.faults.load import reply_complete

GET_EVERY = 0.002  # s between gets: ~500 gets/s, enough to see a stale window of a few ms
REPLY_WAIT = 0.5  # s a get may take before it counts as a timeout
ANSWER_WAIT = 5.0  # s the home may take to answer the probe's own request
CAS_MARK = b"<cas>"  # in a probe's bytes: replaced by the key's CAS at its home when the probe starts


def probe(key: bytes, home: tuple[str, int], first: bytes, then: bytes | None, after: float,
          seconds: float, gets: str = "udp") -> dict:
    with socket.create_connection(home, timeout=5) as tcp:
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if CAS_MARK in first + (then or b""):  # a cas command: the item's CAS as it is now
            cas = _home_cas(tcp, key)
            first, then = first.replace(CAS_MARK, cas), then.replace(CAS_MARK, cas) if then else then
        tcp.sendall(first)
        if then is not None:
            time.sleep(after)
            tcp.sendall(then)
        reply = _read_reply(tcp)
        started = time.monotonic()  # the home has answered: the change (if any) is there from now on
    at_home: socket.socket | None = None
    through = TcpGet(home) if gets == "tcp" else UdpGet(home)
    got, homes, timeouts = [], [], 0
    while time.monotonic() - started < seconds:
        try:  # the home may restart under the probe: its reading is skipped until it answers again
            at_home = at_home or socket.create_connection(home, timeout=REPLY_WAIT)
            homes.append([round(time.monotonic() - started, 4), _home_value(at_home, key)])
        except OSError:
            if at_home is not None:
                at_home.close()
            at_home = None
        sent = time.monotonic() - started
        try:
            answer = through.get(key)
        except OSError:  # unanswered in time, or refused (nothing listening while a server restarts)
            timeouts += 1
            time.sleep(GET_EVERY)
            continue
        got.append([round(sent, 4), _value(answer, key)])
        time.sleep(GET_EVERY)
    if at_home is not None:
        at_home.close()
    through.close()
    return {"reply": reply.decode("latin-1"), "home": homes, "gets": got, "timeouts": timeouts}


class UdpGet:
    """Gets through the switch as memcached UDP datagrams."""

    def __init__(self, home: tuple[str, int]):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(REPLY_WAIT)
        self.sock.connect(home)
        self.request_id = 0

    def get(self, key: bytes) -> bytes:
        """The reply (without the frame header); OSError when unanswered in time."""
        self.request_id = (self.request_id + 1) % 65536
        self.sock.send(struct.pack("!HHHH", self.request_id, 0, 1, 0) + b"get " + key + b"\r\n")
        while True:
            datagram = self.sock.recv(65536)
            if struct.unpack("!H", datagram[:2])[0] == self.request_id:
                return datagram[8:]

    def close(self) -> None:
        self.sock.close()


class TcpGet:
    """Gets through the switch over one TCP connection, made again after a reply that did not come (reset)."""

    def __init__(self, home: tuple[str, int]):
        self.home = home
        self.sock: socket.socket | None = None

    def get(self, key: bytes) -> bytes:
        """The reply; OSError when unanswered in time (the connection is then reset)."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.home, timeout=REPLY_WAIT)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.sendall(b"get " + key + b"\r\n")
            data = b""
            while not reply_complete(data):
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            return data
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _home_value(tcp: socket.socket, key: bytes) -> str | None:
    """The key's value at its home, or None for a miss: `gets` over TCP, which the switch always sends home (a
    replica's CAS is its own) and reads as it reads any get, so the probe's reading changes nothing it watches."""
    tcp.sendall(b"gets " + key + b"\r\n")
    data = b""
    while not reply_complete(data):
        chunk = tcp.recv(65536)
        if not chunk:
            raise ConnectionError("the home closed the connection")
        data += chunk
    return _value(data, key)


def _home_cas(tcp: socket.socket, key: bytes) -> bytes:
    """The key's CAS at its home (mg with the c flag), as digits."""
    tcp.sendall(b"mg " + key + b" c\r\n")
    line = b""
    while not line.endswith(b"\r\n"):
        chunk = tcp.recv(4096)
        if not chunk:
            raise ConnectionError("the home closed the connection")
        line += chunk
    flags = line.split()
    if flags[:1] != [b"HD"] or not any(f.startswith(b"c") for f in flags[1:]):
        raise ValueError(f"no CAS for {key!r} at its home: {line!r}")
    return next(f[1:] for f in flags[1:] if f.startswith(b"c"))


def _read_reply(tcp: socket.socket) -> bytes:
    """What the server answered, up to the end of its first line (a busy switch may take a while: every probe's
    request is answered; a request that is not is over after ANSWER_WAIT)."""
    tcp.settimeout(ANSWER_WAIT)
    data = b""
    try:
        while not data.endswith(b"\r\n"):
            chunk = tcp.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    return data


def _value(reply: bytes, key: bytes) -> str | None:
    """The value in a single-key get reply (get or gets, as a datagram or over TCP), or None for a miss."""
    if not reply.startswith(b"VALUE " + key + b" "):
        return None
    header, _, rest = reply.partition(b"\r\n")
    length = int(header.split(b" ")[3])
    return rest[:length].decode("latin-1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--key", required=True)
    parser.add_argument("--home", required=True, help="ip:port of the key's home")
    parser.add_argument("--send", help="the bytes to send first, in hex")
    parser.add_argument("--jobs", help="a JSON file: a list of probes, each {send, then, after, seconds}")
    parser.add_argument("--then", help="bytes sent --after seconds later on the same connection, in hex")
    parser.add_argument("--after", type=float, default=0.1)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to send gets after the request")
    parser.add_argument("--gets", choices=("udp", "tcp"), default="udp", help="what the gets through the switch go "
                                                                              "over")
    args = parser.parse_args(argv)
    ip, _, port = args.home.rpartition(":")
    home = (ip, int(port))
    if args.jobs:
        with open(args.jobs) as jobs:
            print(json.dumps([probe(args.key.encode(), home, bytes.fromhex(job["send"]),
                                    bytes.fromhex(job["then"]) if job.get("then") else None, job.get("after", 0.0),
                                    job.get("seconds", 1.0), args.gets) for job in json.load(jobs)]))
        return 0
    if not args.send:
        parser.error("--send or --jobs is needed")
    print(json.dumps(probe(args.key.encode(), home, bytes.fromhex(args.send),
                           bytes.fromhex(args.then) if args.then else None, args.after, args.seconds, args.gets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
