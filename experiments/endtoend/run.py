"""One run: a point (the clients' hash) in one mode (baseline or MBalancer) on a running testbed.

    fresh switch tables -> flush and fill the servers (each key on its home) -> [MBalancer: controller + monitor]
    -> load from every client host -> warm-up [MBalancer: until the controller has acted on it]
    -> the window: server counters sampled at its ends, the clients' records cut at the same wall-clock moments
    -> generators stopped (they write their records) -> stop what the run started -> RunResult
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from pymemcache.exceptions import MemcacheError

from controller.load import imbalance_factor
from experiments.endtoend.measure import (cpu_shares, process_cores, read_client_records, sample_servers,
                                          server_rates)
from experiments.endtoend.predict import model_hot, simulated_imbalance
from experiments.endtoend.spec import ExperimentSpec
from experiments.endtoend.stack import MBalancerStack
from experiments.workload.populate import populate
from experiments.workload.spec import Workload
from mbalancer.config import Balancing
from mbalancer.memcache.client import tcp_client
from mbalancer.processes import stop_process
from topologies.testbed import Testbed

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
STARTUP = 60.0  # seconds a load generator may take to start (Python imports; seconds on a busy machine) at most
TAIL = 1.0  # a generator's slack past the latest the window can end (it is stopped as the window closes)
GENERATOR_WRITE = 60.0  # seconds a stopped generator may take to write its records


class RunError(RuntimeError):
    """A run could not be carried out (a generator or the monitor failed); the message says which and why."""


@dataclass
class RunResult:
    point: str  # the clients' hash, e.g. skewed:0.7
    mode: str  # baseline | mbalancer | calibration
    replicas: str  # MBalancer's replica weighting (equal | weighted); "" otherwise
    throughput: float  # answered gets/s, all clients, in the window
    server_rates: list[float]  # gets/s each server served (its own counters)
    imbalance_measured: float  # mean / max of server_rates
    imbalance_simulated: float  # the model's IF for this placement and mode
    imbalance_hash: float  # the model's IF of the placement with no remedy
    mean_ms: float
    p50_ms: float
    p99_ms: float
    server_mean_ms: list[float]  # mean latency of the requests addressed to each server
    answered: int
    timeouts: int
    misses: int
    hot_keys: int  # hot keys installed when the window opened (MBalancer)
    hot_model: int  # H of the model: the fixed H, or the fewest keys that reach the target with H "auto"
    bytes_copied: int
    window_s: float
    cpu_busy: float  # share of the busiest CPU's time in use during the window
    cpu_steal: float  # share of that CPU taken by the hypervisor for others (a shared VM)
    cores: dict[str, float]  # cores each of the run's processes kept busy in the window (load generators, ...)

    def to_dict(self) -> dict:
        return asdict(self)


WARM_WAIT = 10.0  # seconds at most the measurement waits for the controller to finish acting on the warm-up


def run_once(bed: Testbed, spec: ExperimentSpec, workload: Workload, mode: str, out: Path, progress: Progress,
             balancing: Balancing | None = None) -> RunResult:
    """Run `workload` in `mode`: baseline, calibration (the baseline of the capacity workload), or mbalancer
    with `balancing`."""
    out.mkdir(parents=True, exist_ok=True)
    bed.reload_dataplane()
    _fill(workload)
    stack = MBalancerStack(bed, balancing, workload.key_hash, spec.monitor_interval, out,
                           spec.most_hot(), spec.detects_with(), spec.runs_controller()).start() \
        if mode == "mbalancer" else None
    generators: list[subprocess.Popen] = []
    window_state = None
    try:
        generators = _start_generators(bed, spec, workload, out)
        check = _checker(generators, stack)
        _wait_started(bed, out, check)
        wait_until(time.monotonic() + spec.warmup, check)
        # Measure what MBalancer does once it has acted on the warm-up's reports (copies take a while over
        # saturated links); the window starts then, for the servers' counters and the clients' records alike.
        if stack and not stack.wait_acted(WARM_WAIT):
            log.warning("the controller had not acted on the warm-up after %g s more (%d reports): measuring "
                        "anyway", WARM_WAIT, stack.reports())
        hot_keys = stack.hot_keys() if stack else 0
        if stack and not hot_keys and model_hot(workload, balancing, spec.most_hot()):
            log.warning("no hot key installed after the warm-up (the model has %d): MBalancer's run measures the "
                        "baseline", model_hot(workload, balancing, spec.most_hot()))
        watched = _watched_processes(bed, generators, stack)
        first = sample_servers(workload.servers, watched)
        end = first.time + spec.measure
        while (now := time.monotonic()) < end:
            wait_until(min(now + 1.0, end), check)
            progress(f"{workload.hash:<10} {mode:<11} {balancing.mode if stack else '':<8} measuring "
                     f"{min(time.monotonic(), end) - first.time:4.1f}/{spec.measure:g} s")
        last = sample_servers(workload.servers, watched)
        # The controller as the window closed: once the load ends, the monitor's empty reports cool every key.
        window_state = stack.state() if stack else None
        _stop_generators(generators)
    finally:
        for process in generators:
            stop_process(process)
        state = stack.stop(window_state) if stack else None
    return _result(workload, mode, balancing if stack else None, spec.most_hot(), out, (first, last), hot_keys,
                   state)


def wait_until(deadline: float, check=lambda: None, step: float = 0.2) -> None:
    """Sleep until monotonic `deadline`, calling check() (which may raise) every `step` seconds."""
    while (left := deadline - time.monotonic()) > 0:
        check()
        time.sleep(min(step, left))


def _fill(workload: Workload) -> None:
    """Empty every server, then store each key on its home (copies left by an earlier run would be served)."""
    for server in workload.servers:
        client = tcp_client(server, timeout=5.0)
        try:
            client.flush_all(noreply=False)
        except (OSError, MemcacheError) as err:
            raise RunError(f"cannot flush {server}: {err}") from None
        finally:
            client.close()
    populate(workload)


def _start_generators(bed: Testbed, spec: ExperimentSpec, workload: Workload, out: Path) -> list[subprocess.Popen]:
    """One `mbalancer load` per client host, running until _stop_generators (its duration only bounds it)."""
    servers = ",".join(f"{s.host}:{s.port}" for s in workload.servers)
    longest = STARTUP + spec.warmup + WARM_WAIT + spec.measure + TAIL
    generators = []
    for number, host in enumerate(bed.client_hosts, 1):
        share = spec.workload(workload.servers, workload.hash, host=number)
        command = [sys.executable, "-m", "mbalancer.cli", "load", "--servers", servers, "--hash", workload.hash,
                   "--keys", str(workload.keys), "--alpha", f"{workload.alpha:g}", "--clients", str(share.clients),
                   "--duration", f"{longest:g}", "--value-size", str(workload.value_size),
                   "--timeout", f"{workload.timeout:g}", "--seed", str(share.seed), "--json",
                   "--out", str(out / host.name), "--started-file", str(_started_file(out, host))]
        generators.append(bed.popen(host, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return generators


def _started_file(out: Path, host) -> Path:
    return out / f".{host.name}.started"


def _wait_started(bed: Testbed, out: Path, check: Callable[[], None]) -> None:
    """Until every generator has its first requests out (on a busy machine one may take seconds to start: the
    warm-up and the window count from the last one)."""
    files = [_started_file(out, host) for host in bed.client_hosts]
    deadline = time.monotonic() + STARTUP
    while not all(f.exists() for f in files):
        if time.monotonic() > deadline:
            raise RunError(f"a load generator had not started after {STARTUP:g} s")
        check()
        time.sleep(0.05)
    for f in files:
        f.unlink()


def _watched_processes(bed: Testbed, generators: list[subprocess.Popen], stack: MBalancerStack | None) -> dict:
    """The run's single-threaded-ish processes whose CPU use may cap it: name -> pid."""
    watched = {f"load on {host.name}": process.pid for host, process in zip(bed.client_hosts, generators)}
    if stack:
        watched.update({"monitor": stack.monitor.pid, "controller": stack.controller.pid})
    return watched


def _checker(generators: list[subprocess.Popen], stack: MBalancerStack | None) -> Callable[[], None]:
    def check() -> None:
        for process in generators:
            if process.poll() is not None:
                raise RunError(f"a load generator exited (code {process.returncode}) before the window closed: "
                               f"{process.stderr.read().strip()[-500:]}")
        if stack:
            stack.check_monitor()
    return check


def _stop_generators(generators: list[subprocess.Popen]) -> None:
    """SIGTERM ends each generator's run; it writes what it recorded and exits 0."""
    for process in generators:
        process.terminate()
    for process in generators:
        try:
            _, stderr = process.communicate(timeout=GENERATOR_WRITE)
        except subprocess.TimeoutExpired:
            raise RunError(f"a load generator did not write its records within {GENERATOR_WRITE:g} s") from None
        if process.returncode != 0:
            raise RunError(f"a load generator exited with code {process.returncode}: {stderr.strip()[-500:]}")


def _result(workload: Workload, mode: str, balancing: Balancing | None, most_hot: int, out: Path, window: tuple,
            hot_keys: int, state: dict | None) -> RunResult:
    rates = server_rates(*window)
    folders = sorted(p for p in out.iterdir() if p.is_dir())  # one per client host
    records = read_client_records(folders, workload.servers, *window)
    latency = records.latency_ms[records.answered]
    mean, p50, p99 = (float(latency.mean()), *map(float, np.percentile(latency, [50, 99]))) if latency.size \
        else (float("nan"),) * 3
    return RunResult(
        point=workload.hash, mode=mode, replicas=balancing.mode if balancing else "",
        throughput=records.throughput, server_rates=rates.round(1).tolist(),
        imbalance_measured=float(imbalance_factor(rates)),
        imbalance_simulated=simulated_imbalance(workload, balancing, most_hot),
        imbalance_hash=simulated_imbalance(workload, None),
        mean_ms=mean, p50_ms=p50, p99_ms=p99,
        server_mean_ms=[round(float(x), 3) for x in records.latency_by_server(len(workload.servers))],
        answered=int(records.answered.sum()), timeouts=int((records.outcome == "timeout").sum()),
        misses=int((records.outcome == "miss").sum()), hot_keys=hot_keys,
        hot_model=model_hot(workload, balancing, most_hot) if balancing else 0,
        bytes_copied=int(state["counters"]["bytes_copied"]) if state else 0, window_s=records.window,
        cpu_busy=cpu_shares(*window)[0], cpu_steal=cpu_shares(*window)[1],
        cores={name: round(used, 3) for name, used in process_cores(*window).items()})
