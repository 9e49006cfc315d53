"""A data plane's sketch read through its controller (POST /sketch): for the P4 switch, whose digests of heavy keys
reach only the P4Runtime primary, the controller. Offers SketchReader (monitor/dataplane.py) the calls the eBPF
maps do; each is one HTTP request the controller passes to its driver (dataplanes/p4/sketch.py does the work)."""
from __future__ import annotations

import json
import time
import urllib.error
from typing import Any

from dataplanes.pipeline import HeavyKey
from monitor.outputs import Credentials, refusal

TIMEOUT = 10.0  # s per call: a read waits for the finished epoch's digests (up to 5 s)


class SketchUnavailable(RuntimeError):
    """The controller could not be reached, or refused the call; the message says which and why."""


class ControllerSketch:
    def __init__(self, url: str, credentials: Credentials = Credentials()):
        self.url = url.rstrip("/") + "/sketch"
        self.credentials = credentials

    def set_sketch_control(self, until_ns: int, epoch: int) -> None:
        """Sent as the nanoseconds left (the controller's clock is not this process's); 0 stops it."""
        self._call("set_sketch_control", max(until_ns - time.monotonic_ns(), 1) if until_ns else 0, epoch)

    def clear_sketch(self, epoch: int) -> None:
        self._call("clear_sketch", epoch)

    def heavy_keys(self, epoch: int, limit: int) -> list[HeavyKey]:
        return [HeavyKey(bytes.fromhex(h["key"]), h["count"], h["server"])
                for h in self._call("heavy_keys", epoch, limit)]

    def take_sketch_destinations(self, epoch: int) -> tuple[dict[str, int], int]:
        per_server, elsewhere = self._call("take_sketch_destinations", epoch)
        return per_server, elsewhere

    def counters(self) -> dict[str, int]:
        return self._call("counters")

    def close(self) -> None:
        pass  # nothing held between calls

    def _call(self, call: str, *args: int) -> Any:
        try:
            with self.credentials.open(self.url, json.dumps({"call": call, "args": list(args)}).encode(),
                                       TIMEOUT) as reply:
                return json.load(reply)["result"]
        except urllib.error.HTTPError as err:
            raise SketchUnavailable(f"the controller at {self.url} refused {call}: "
                                    f"{refusal(err).partition(': ')[2]}") from None
        except (OSError, ValueError, KeyError) as err:
            raise SketchUnavailable(f"the controller at {self.url} did not answer {call}: {err}") from None
