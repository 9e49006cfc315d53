"""Data-plane drivers, one module per kind of switch, each thin over its control library in dataplanes/<kind>/.

Which kinds exist, and how each driver is made from its config section, is the registry's business
(dataplanes/registry.py); make_driver is the one way the controller makes a driver from the config.
"""
from __future__ import annotations

from dataplanes.driver import Driver
from dataplanes import registry
from mbalancer.config import DataPlane


def make_driver(dataplane: DataPlane) -> Driver:
    """The driver the config's [dataplane] section asks for; DriverError (or ConfigError) saying why not."""
    return registry.get(dataplane.kind).make_driver(dataplane.settings)
