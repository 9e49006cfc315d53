"""Data-plane drivers by name (`mbalancer controller --driver NAME`)."""
from __future__ import annotations

from controller.driver import Driver

DRIVERS = ("none",)  # the eBPF driver (issue 6) and P4Runtime/OpenFlow follow


def make_driver(name: str) -> Driver:
    """A driver by name; ValueError naming the choices for an unknown one."""
    if name == "none":
        from controller.drivers.recording import RecordingDriver
        return RecordingDriver()
    raise ValueError(f"unknown driver {name!r} (choose from {', '.join(DRIVERS)})")
