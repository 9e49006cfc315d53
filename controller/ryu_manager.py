"""`mbalancer-ryu-manager` (or `python -m controller.ryu_manager`): Ryu's own ryu-manager, made to run on Python 3.11.

Ryu 4.34 imports eventlet.wsgi.ALREADY_HANDLED, which eventlet removed (0.34+); Ryu only ever compares a response
against it, so any unique object will do. Everything else is ryu-manager unchanged: its options, its app list:

    mbalancer-ryu-manager --mbalancer-config mbalancer.toml controller/ryu_app.py
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import IO

APP = Path(__file__).with_name("ryu_app.py")


def patch_eventlet() -> None:
    """Give eventlet.wsgi the ALREADY_HANDLED that Ryu 4.34 imports (idempotent)."""
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")  # on import, in every process
    import eventlet.wsgi
    if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
        eventlet.wsgi.ALREADY_HANDLED = object()


def register_options(cli: bool = False) -> None:
    """MBalancer's options for ryu-manager: on the command line (registered here, before ryu-manager parses it) or
    in a Ryu config file's [DEFAULT] (mbalancer_config = ...)."""
    from ryu import cfg
    options = [cfg.StrOpt("mbalancer-config", default=os.environ.get("MBALANCER_CONFIG"),
                          help="MBalancer config (TOML); default: $MBALANCER_CONFIG"),
               cfg.StrOpt("mbalancer-homes", help="JSON {key: server index}: the homes of a skewed hash "
                                                  "(balancing.hash = skewed:IF, which needs the workload's keys)")]
    for option in options:
        try:
            (cfg.CONF.register_cli_opt if cli else cfg.CONF.register_opt)(option)
        except cfg.DuplicateOptError:
            pass  # registered already, the other way


def launch(config: Path | str, log: IO | None = None, homes: Path | None = None) -> subprocess.Popen:
    """ryu-manager with the MBalancer app in a process of its own (tests, experiments); stop it with
    mbalancer.processes.stop_process (SIGTERM: the app ends its lease and leaves the switch forwarding)."""
    extra = ["--mbalancer-homes", str(homes)] if homes else []
    return subprocess.Popen([sys.executable, "-m", "controller.ryu_manager", "--mbalancer-config", str(config),
                             *extra, str(APP)], stdout=log, stderr=subprocess.STDOUT if log else None,
                            stdin=subprocess.DEVNULL)


def main() -> int:
    patch_eventlet()
    register_options(cli=True)
    signal.signal(signal.SIGTERM, _interrupt_main_greenlet())  # as Ctrl-C: ryu-manager stops every app
    from ryu.cmd import manager
    return manager.main() or 0


def _interrupt_main_greenlet():
    """A SIGTERM handler that interrupts the greenlet calling it now (ryu-manager's, waiting on its apps).

    A handler that raised KeyboardInterrupt itself would raise it in whichever greenlet runs when the signal lands
    (an app's, the lease's) and end that one alone, leaving ryu-manager running; the hub throws it into the main
    greenlet instead, where ryu-manager catches it and closes every app (the core ends its lease)."""
    import greenlet
    from eventlet import hubs
    main_greenlet = greenlet.getcurrent()

    def interrupt(*_) -> None:
        hubs.get_hub().schedule_call_global(0, main_greenlet.throw, KeyboardInterrupt)
    return interrupt


if __name__ == "__main__":
    sys.exit(main())
