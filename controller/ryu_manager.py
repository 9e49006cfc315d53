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


def launch(config: Path | str, log: IO | None = None, homes: Path | None = None,
           log_config: Path | None = None) -> subprocess.Popen:
    """ryu-manager with the MBalancer app in a process of its own (tests, experiments); stop it with
    mbalancer.processes.stop_process (SIGTERM: the app ends its lease and leaves the switch forwarding).
    log_config: a logging config file (ryu-manager's --log-config-file), e.g. for timestamps on every line."""
    extra = (["--mbalancer-homes", str(homes)] if homes else []) + \
        (["--log-config-file", str(log_config)] if log_config else [])
    return subprocess.Popen([sys.executable, "-m", "controller.ryu_manager", "--mbalancer-config", str(config),
                             *extra, str(APP)], stdout=log, stderr=subprocess.STDOUT if log else None,
                            stdin=subprocess.DEVNULL)


def main() -> int:
    patch_eventlet()
    register_options(cli=True)
    import greenlet
    _MAIN.append(greenlet.getcurrent())  # ryu-manager's, waiting on its apps
    signal.signal(signal.SIGTERM, lambda *_: _throw_into_main(KeyboardInterrupt))  # as Ctrl-C: every app stops
    from ryu.cmd import manager
    return manager.main() or 0


_MAIN: list = []  # the main greenlet, once main() runs


def end_ryu_manager(status: int) -> None:
    """End ryu-manager with `status` (an app that must stop: a leader that lost the lead), closing every app first.
    Under plain ryu-manager (no main() here), SIGTERM to this process instead."""
    if _MAIN:
        _throw_into_main(SystemExit(status))
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def _throw_into_main(exception) -> None:
    """Raise `exception` in ryu-manager's main greenlet, from any greenlet or a signal handler.

    Raised in whichever greenlet runs when the signal lands (an app's, the lease's) it would end that one alone,
    leaving ryu-manager running; the hub throws it into the main greenlet instead, where ryu-manager closes every app
    (the core ends its lease) in its `finally`, then ends (KeyboardInterrupt: status 0; SystemExit: its status)."""
    from eventlet import hubs
    hubs.get_hub().schedule_call_global(0, _MAIN[0].throw, exception)


if __name__ == "__main__":  # as controller.ryu_manager, the module the app imports (one _MAIN)
    from controller import ryu_manager
    sys.exit(ryu_manager.main())
