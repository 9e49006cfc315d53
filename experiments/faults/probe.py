"""A coherence probe, run in the client's namespace: one request over TCP to a hot key's home (a TTL change, a write
split across segments, ...), then, for a while, in turn: what the home holds (`mg <key> v` over TCP, which the
switch never balances) and a get of the key over UDP through the switch (which it may send to a replica), each
recorded with its time since the request. Prints one JSON object: {"reply": the TCP reply, "home": [[t, value or
null]], "gets": [[t, value or null]], "timeouts": n}; a get that returns a value after the home answered a miss
was served by a stale copy.
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

GET_EVERY = 0.002  # s between gets: ~500 gets/s, enough to see a stale window of a few ms
REPLY_WAIT = 0.5  # s a get may take before it counts as a timeout
ANSWER_WAIT = 5.0  # s the home may take to answer the probe's own request
CAS_MARK = b"<cas>"  # in a probe's bytes: replaced by the key's CAS at its home when the probe starts


def probe(key: bytes, home: tuple[str, int], first: bytes, then: bytes | None, after: float,
          seconds: float) -> dict:
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
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.settimeout(REPLY_WAIT)
    udp.connect(home)
    gets, homes, timeouts, request_id = [], [], 0, 0
    while time.monotonic() - started < seconds:
        try:  # the home may restart under the probe: its reading is skipped until it answers again
            at_home = at_home or socket.create_connection(home, timeout=REPLY_WAIT)
            homes.append([round(time.monotonic() - started, 4), _home_value(at_home, key)])
        except OSError:
            if at_home is not None:
                at_home.close()
            at_home = None
        request_id = (request_id + 1) % 65536
        sent = time.monotonic() - started
        try:
            udp.send(struct.pack("!HHHH", request_id, 0, 1, 0) + b"get " + key + b"\r\n")
            while True:
                datagram = udp.recv(65536)
                if struct.unpack("!H", datagram[:2])[0] == request_id:
                    break
        except OSError:  # unanswered in time, or refused (nothing listening while a server restarts)
            timeouts += 1
            time.sleep(GET_EVERY)
            continue
        gets.append([round(sent, 4), _value(datagram[8:], key)])
        time.sleep(GET_EVERY)
    if at_home is not None:
        at_home.close()
    return {"reply": reply.decode("latin-1"), "home": homes, "gets": gets, "timeouts": timeouts}


def _home_value(tcp: socket.socket, key: bytes) -> str | None:
    """The key's value at its home (mg over TCP: the switch forwards it home untouched), or None for a miss."""
    tcp.sendall(b"mg " + key + b" v\r\n")
    data = b""
    while True:
        if data.startswith(b"EN\r\n"):
            return None
        header, found, rest = data.partition(b"\r\n")
        if found and header.startswith(b"VA "):
            size = int(header.split(b" ")[1])
            if len(rest) >= size + 2:
                return rest[:size].decode("latin-1")
        chunk = tcp.recv(65536)
        if not chunk:
            raise ConnectionError("the home closed the connection")
        data += chunk


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
    """The value of a single-datagram get reply, or None for a miss."""
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
    args = parser.parse_args(argv)
    ip, _, port = args.home.rpartition(":")
    home = (ip, int(port))
    if args.jobs:
        with open(args.jobs) as jobs:
            print(json.dumps([probe(args.key.encode(), home, bytes.fromhex(job["send"]),
                                    bytes.fromhex(job["then"]) if job.get("then") else None, job.get("after", 0.0),
                                    job.get("seconds", 1.0)) for job in json.load(jobs)]))
        return 0
    if not args.send:
        parser.error("--send or --jobs is needed")
    print(json.dumps(probe(args.key.encode(), home, bytes.fromhex(args.send),
                           bytes.fromhex(args.then) if args.then else None, args.after, args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
