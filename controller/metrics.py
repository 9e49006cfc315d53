"""GET /metrics: the controller in Prometheus's text format, rendered by prometheus-client from what the core has
published (its last snapshot, the data plane's counters as the counters thread last read them, the servers' health),
so a scrape never waits for the worker and never reads the switch itself.

Names: mbalancer_* (docs/deployment.md lists them with the dashboard in install/grafana/). The plan's estimates keep
their older names (spread label); mbalancer_load_* put them next to what the switch and the servers measured, one
`source` label each (controller/measured_balance.py). Counters only grow: the
data plane's per-key counters start again from zero when a key is installed anew, so the totals are kept by
controller/switch_counts.py; a key's own series ends when it cools (and starts anew if it warms again).
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from controller.access import REFUSED, key_hash
from controller.core import ControllerCore
from controller.mac_check import MacStatus
from controller.measured_balance import Spread
from mbalancer.memcache.keys import key_from_text

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what Prometheus 2 (Debian 12 has 2.42) asks for; our names fit it
SERVER_LABELS = ["server", "name", "address"]
TCP_METRICS = {  # the eBPF switch's TCP path's counters (dataplanes/bpf/tables.py TCP_COUNTERS) -> help
    "tcp_connections": "clients' TCP connections to servers taken by the switch's TCP splitter",
    "tcp_gets": "single-key TCP gets the splitter asked the pipeline about",
    "tcp_balanced": "of those, sent to another server than the one the client addressed",
    "tcp_home_while_dirty": "of those, of a hot key that was dirty (or its lease out, or its replica suspect): home",
}
CORE_COUNTERS = {  # the core's counts exported as counters: name -> help
    "reports": "monitor reports handled",
    "mirrors": "copied packets (mirrored writes) handled",
    "mirrors_unreadable": "copied packets the controller could not read (their server's hot keys were checked)",
    "copies": "values copied to replicas",
    "bytes_copied": "bytes of values copied to replicas",
    "copy_failures": "copies that failed",
    "mirrors_lost": "copies of counted writes that never reached the controller",
    "writes_found_by_polling": "writes to hot keys found by polling rather than by their copy",
}


def exposition(core: ControllerCore, hide_keys: bool = False, refused: Mapping[str, int] | None = None) -> bytes:
    """The text a Prometheus scrape gets: the core's metrics and this process's (CPU, memory, open files).
    hide_keys: key labels are hashes (controller/access.py); refused: the HTTP API's refusals by reason."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoreCollector(core, key_hash if hide_keys else key_label, refused or {}))
    ProcessCollector(registry=registry)
    return generate_latest(registry)


class CoreCollector(Collector):
    def __init__(self, core: ControllerCore, label: Callable[[bytes], str] | None = None,
                 refused: Mapping[str, int] | None = None):
        self.core = core
        self.label = label or key_label
        self.refused = refused or {}

    def collect(self) -> Iterator[Metric]:
        published = self.core.published()  # one snapshot for the whole scrape
        yield from self._controller()
        yield from self._refused()
        yield from self._hot_keys(published["hot_keys"])
        yield from self._servers()
        yield from self._spreads(self.core.spreads())
        yield from self._data_plane()
        yield from self._work_done(published["counters"], len(published["retries"]))

    def _controller(self) -> Iterator[Metric]:
        core = self.core
        info = GaugeMetricFamily("mbalancer_controller_info", "the controller's data plane driver and balancing mode",
                                 labels=["driver", "mode", "hash"])
        info.add_metric([core.driver.name, core.config.balancing.mode, core.config.balancing.hash], 1)
        yield info
        yield GaugeMetricFamily("mbalancer_uptime_seconds", "seconds since the controller started",
                                value=core.clock() - core.started)
        freshness = core.freshness()
        yield GaugeMetricFamily("mbalancer_report_age_seconds", "seconds since the last monitor report came (since the "
                                "start if none has): the loads and imbalance are that old", value=freshness[
                                    "last_report_age_s"])
        yield GaugeMetricFamily("mbalancer_switch_counters_age_seconds", "seconds since the switch's counters were "
                                "last read", value=freshness["counters_age_s"])
        plan, report = core.last_plan, core.last_report
        factors = GaugeMetricFamily("mbalancer_imbalance_factor", "mean server load over the maximum (1 = even), "
                                    "the plan's estimates from the last report (measured: "
                                    "mbalancer_load_imbalance_factor)", labels=["spread"])
        if plan is not None:
            factors.add_metric(["now"], plan.imbalance_now)  # as the switch spreads gets now
            factors.add_metric(["without"], plan.imbalance_without)  # where the clients' hash sends them
            factors.add_metric(["planned"], plan.imbalance_predicted)  # once the last plan is carried out
        yield factors
        if report is not None:
            yield GaugeMetricFamily("mbalancer_monitor_gets_per_second", "all gets/s in the last monitor report",
                                    value=report.rate)
            yield GaugeMetricFamily("mbalancer_hot_keys_target", "hot keys the last plan aimed for (H)",
                                    value=plan.hot_target if plan else 0)

    def _hot_keys(self, hot_keys: list[dict]) -> Iterator[Metric]:
        yield GaugeMetricFamily("mbalancer_hot_keys", "keys balanced by the data plane now", value=len(hot_keys))
        weight = GaugeMetricFamily("mbalancer_hot_key_replica_weight", "share of a hot key's gets each copy gets",
                                   labels=["key", "server"])
        dirty = GaugeMetricFamily("mbalancer_hot_key_dirty", "1 while a hot key's copies may be stale (gets go home)",
                                  labels=["key"])
        for hot in hot_keys:
            key = self.label(key_from_text(hot["key"]))
            dirty.add_metric([key], float(hot["dirty"]))
            for replica in hot["replicas"]:
                weight.add_metric([key, str(replica["server"])], replica["weight"])
        yield weight
        yield dirty
        counters = self.core.switch_counts.snapshot.counters
        gets = CounterMetricFamily("mbalancer_hot_key_gets", "gets for a hot key the data plane counted since it "
                                   "was installed", labels=["key"])
        split = CounterMetricFamily("mbalancer_hot_key_replica_gets", "of those, the gets each copy was sent",
                                    labels=["key", "server"])
        for key, counts in (counters.keys.items() if counters else ()):
            gets.add_metric([self.label(key)], counts.gets)
            for server, n in counts.per_replica.items():
                split.add_metric([self.label(key), str(server)], n)
        yield gets
        yield split

    def _refused(self) -> Iterator[Metric]:
        refused = CounterMetricFamily("mbalancer_http_refused", "HTTP API requests refused for their credentials: "
                                      "no token, a wrong one, a TLS handshake refused", labels=["reason"])
        for reason in REFUSED:
            refused.add_metric([reason.replace(" ", "_")], self.refused.get(reason, 0))
        yield refused

    def _servers(self) -> Iterator[Metric]:
        core = self.core
        plan = core.last_plan
        up = GaugeMetricFamily("mbalancer_server_up", "1 while the server answers its health probes",
                               labels=SERVER_LABELS)
        failed = GaugeMetricFamily("mbalancer_server_failed_probes", "health probes failed in a row",
                                   labels=SERVER_LABELS)
        gets = GaugeMetricFamily("mbalancer_server_gets_per_second", "the plan's estimate of gets/s per server from "
                                 "the last report: as its weights spread them now, or as the clients' hash sends them "
                                 "(without); measured: mbalancer_load_gets_per_second", labels=[*SERVER_LABELS, "spread"])
        share = GaugeMetricFamily("mbalancer_server_share", "the server's share of all gets as the plan estimates them "
                                  "spread now", labels=SERVER_LABELS)
        mac_wrong = GaugeMetricFamily("mbalancer_server_mac_wrong", "1 while the server is out of every replica set "
                                      "because its configured MAC is not the one the switch saw (or its balanced gets "
                                      "were flooded); absent where the data plane cannot tell", labels=SERVER_LABELS)
        flooded = CounterMetricFamily("mbalancer_server_flooded_gets", "gets balanced to the server that the switch "
                                      "flooded: it did not know where the server's configured MAC is",
                                      labels=SERVER_LABELS)
        total = sum(plan.loads) if plan else 0.0
        for index, (server, health) in enumerate(zip(core.config.servers, core.health.servers)):
            labels = [str(index), server.name, f"{server.ip}:{server.port}"]
            up.add_metric(labels, float(health.up))
            failed.add_metric(labels, health.failures)
            mac = core.macs.latest[index]
            if mac.status is not MacStatus.UNSUPPORTED:
                mac_wrong.add_metric(labels, float(index in core.macs.wrong))
                flooded.add_metric(labels, mac.flooded)
            if plan is not None:
                gets.add_metric([*labels, "now"], plan.loads[index])
                if plan.loads_without:
                    gets.add_metric([*labels, "without"], plan.loads_without[index])
                share.add_metric(labels, plan.loads[index] / total if total else 0.0)
        yield from (up, failed, gets, share, mac_wrong, flooded)

    def _spreads(self, spreads: list[Spread]) -> Iterator[Metric]:
        """The plan's estimate and the switch's and servers' measurements side by side, one `source` label each
        (controller/measured_balance.py); a source that cannot be had has available 0 and no figures (never a 0)."""
        families = {
            "available": GaugeMetricFamily("mbalancer_load_available", "1 while the source's per-server loads can be "
                                           "had (plan, switch, servers); 0: /state's balance says why",
                                           labels=["source"]),
            "age": GaugeMetricFamily("mbalancer_load_age_seconds", "how old the oldest figure the source's loads were "
                                     "made from is", labels=["source"]),
            "imbalance": GaugeMetricFamily("mbalancer_load_imbalance_factor", "mean server load over the maximum "
                                           "(1 = even), by source", labels=["source"]),
            "balanced": GaugeMetricFamily("mbalancer_load_balanced_gets_per_second", "gets/s sent to another server "
                                          "than the clients addressed (plan: by its weights; switch: as counted)",
                                          labels=["source"]),
            "gets": GaugeMetricFamily("mbalancer_load_gets_per_second", "gets/s per server, by source",
                                      labels=[*SERVER_LABELS, "source"]),
            "share": GaugeMetricFamily("mbalancer_load_share", "the server's share of all gets, by source",
                                       labels=[*SERVER_LABELS, "source"])}
        for spread in spreads:
            self._add_spread(families, spread)
        yield from families.values()

    def _add_spread(self, families: dict[str, GaugeMetricFamily], spread: Spread) -> None:
        source = [spread.source]
        families["available"].add_metric(source, float(spread.loads is not None))
        if spread.age_s is not None:
            families["age"].add_metric(source, spread.age_s)
        if spread.balanced is not None:
            families["balanced"].add_metric(source, spread.balanced)
        if spread.loads is None:
            return
        families["imbalance"].add_metric(source, spread.imbalance)
        shares = spread.shares
        for index, (server, load) in enumerate(zip(self.core.config.servers, spread.loads)):
            labels = [str(index), server.name, f"{server.ip}:{server.port}", spread.source]
            families["gets"].add_metric(labels, load)
            if shares is not None:
                families["share"].add_metric(labels, shares[index])

    def _data_plane(self) -> Iterator[Metric]:
        snapshot = self.core.switch_counts.snapshot
        totals, counters = snapshot.totals, snapshot.counters
        for name, value, text in (
                ("hot_gets", totals["gets"], "gets for hot keys the data plane counted"),
                ("balanced_gets", totals["gets"] - totals["home_while_dirty"],
                 "of those, gets spread over the key's copies by weight"),
                ("home_while_dirty_gets", totals["home_while_dirty"],
                 "of those, gets sent home because the key was dirty or the lease had run out"),
                ("mirrored_writes", totals["mirrored"], "writes to hot keys the data plane copied to the controller"),
                ("unsure_requests", counters.unsure if counters else 0,
                 "requests the data plane could not read whole: they made their server's hot keys dirty"),
                ("unparsed_packets", counters.unparsed if counters else 0,
                 "memcached-port packets forwarded untouched because the pipeline could not parse them")):
            yield CounterMetricFamily(f"mbalancer_dataplane_{name}", text, value=value)
        switch = counters.switch if counters else {}
        for name, text in TCP_METRICS.items():  # the eBPF switch's TCP path (0 elsewhere)
            yield CounterMetricFamily(f"mbalancer_dataplane_{name}", text, value=switch.get(name, 0))

    def _work_done(self, counts: dict, retries: int) -> Iterator[Metric]:
        for name, text in CORE_COUNTERS.items():
            yield CounterMetricFamily(f"mbalancer_{name}", text, value=counts.get(name, 0))
        decisions = CounterMetricFamily("mbalancer_decisions", "decisions taken, by kind (warm, cool, reweight, "
                                        "server-down, error, ...)", labels=["kind"])
        for name, n in sorted(counts.items()):
            if name.startswith("decisions_"):
                decisions.add_metric([name.removeprefix("decisions_")], n)
        yield decisions
        sync = self.core.executor.sync_times
        buckets = sync.buckets()
        yield HistogramMetricFamily(
            "mbalancer_sync_seconds", "time from a mirrored write's arrival to every copy of its key updated",
            buckets=[("+Inf" if bound == float("inf") else repr(bound / 1000), n) for bound, n in buckets],
            sum_value=sync.sum_ms / 1000)
        yield GaugeMetricFamily("mbalancer_retries_pending", "actions waiting to be tried again", value=retries)


def key_label(key: bytes) -> str:
    """A key as a label value: UTF-8 as itself, any other byte as \\xNN (a label is UTF-8 text)."""
    return key.decode("utf-8", "backslashreplace")
