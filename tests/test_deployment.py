"""Your own deployment, with namespaces standing in for machines: a Linux box whose bridge forwards between a
client and three memcached servers gets the eBPF switch from `mbalancer switch attach`, then runs `mbalancer
controller` and `mbalancer monitor` from the same config, as the README's "Your own memcached servers" says, with
Prometheus scraping the controller; `mbalancer switch detach` gives the box its bridge back."""
from __future__ import annotations

import json
import socket
import os
import subprocess
import time
import urllib.request

import pytest

from dataplanes.bpf.program import PIN_ROOT, available, mirror_link_of
from mbalancer.memcache.addresses import ServerAddress
from mbalancer.memcache.meta import MetaClient
from mbalancer.memcache.server import free_port
from mbalancer.processes import stop_process
from monitor.cli import READY
from tests.conftest import MBALANCER, eventually, memcached_answers, wait_for_line
from tests.prometheus_server import PrometheusServer, available as prometheus_available, dashboard_queries
from topologies.netns import NamespaceNetwork

why_not = available() if os.geteuid() == 0 else "needs root (namespaces, bpf)"
pytestmark = pytest.mark.skipif(why_not is not None, reason=f"eBPF data plane cannot run here: {why_not}")
TAG = "mbdep"  # the network's tag, and the switch's name: a killed run's leftovers go with the network's claim
KEYS = 1000
LOAD_SECONDS = 120  # at most: the generator is stopped once everything is checked
WINDOW = 6  # seconds over which the servers' shares are measured
prometheus_missing = prometheus_available()


def write_config(net: NamespaceNetwork, path, listen: str, tag: str = TAG) -> list[str]:
    """The one config file of the deployment, as docs/deployment.md writes it; returns the switch ports it names."""
    ports = [h.port for h in net.hosts] + [f"{tag}-rp"]  # the root namespace (the controller) is on a port too
    servers = "".join(f'[[servers]]\nname = "{h.name}"\nip = "{h.ip}"\nmac = "{h.mac}"\nport = 11211\n'
                      for h in net.server_hosts)
    path.write_text(servers + f'[controller]\nlisten = "{listen}"\n[dataplane]\nkind = "ebpf"\n'
                    f'[dataplane.ebpf]\nswitches = ["{tag}"]\nports = {json.dumps(ports)}\n')
    return ports


def load_command(net: NamespaceNetwork, seconds: float, out, clients: int = 4) -> list[str]:
    servers = ",".join(f"{h.ip}:11211" for h in net.server_hosts)
    return [str(MBALANCER), "load", "--servers", servers, "--keys", str(KEYS), "--alpha", "1", "--clients",
            str(clients), "--duration", f"{seconds:g}", "--value-size", "100", "--no-records", "--out", str(out),
            "--json"]


def serve_and_fill(net: NamespaceNetwork) -> None:
    """memcached on every server host (UDP on), every key of the workload stored."""
    for host in net.server_hosts:
        net.popen(host, ["memcached", "-l", host.ip, "-p", "11211", "-U", "11211", "-u", "root", "-t", "1"])
    assert eventually(lambda: all(memcached_answers(h.ip) for h in net.server_hosts), timeout=10)
    populate = net.run(net.client_hosts[0], [str(MBALANCER), "load", "--servers", ",".join(
        f"{h.ip}:11211" for h in net.server_hosts), "--keys", str(KEYS), "--value-size", "100", "--populate",
        "--duration", "0"])
    assert populate.returncode == 0, populate.stderr


def load(net: NamespaceNetwork, seconds: float, out) -> dict:
    result = net.run(net.client_hosts[0], load_command(net, seconds, out))
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def switch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(MBALANCER), "switch", *args], capture_output=True, text=True, timeout=60)


def gets_served(net: NamespaceNetwork) -> list[int]:
    """Each memcached's own count of the gets it answered."""
    return [int(MetaClient(ServerAddress(h.ip)).stats()["cmd_get"]) for h in net.server_hosts]


def controller_state(listen: str) -> dict:
    with urllib.request.urlopen(f"http://{listen}/state", timeout=10) as reply:
        return json.load(reply)


@pytest.mark.skipif(prometheus_missing is not None, reason=str(prometheus_missing))
def test_the_readme_on_a_bridging_box_balances_under_heavy_load_and_prometheus_sees_it(tmp_path):
    """README's "Your own memcached servers", word for word: attach, controller, monitor (the switch's sketch, the
    default), under a load the capture monitor could not keep up with (64 clients, as many gets as they can); the
    servers' own counts of gets served are even; Prometheus scrapes the controller and every query of every
    dashboard panel returns series; detach gives the box its bridge back."""
    with NamespaceNetwork(servers=3, clients=1, tag=TAG, dataplane="bridge") as net:
        serve_and_fill(net)
        config = tmp_path / "mbalancer.toml"
        listen = f"127.0.0.1:{free_port()}"
        ports = write_config(net, config, listen)
        processes = []
        try:
            attached = switch("attach", "--config", str(config))
            assert attached.returncode == 0 and f"{TAG} attached to" in attached.stderr, attached.stderr
            again = switch("attach", "--config", str(config))
            assert again.returncode == 1 and "attached already" in again.stderr and "Traceback" not in again.stderr
            status = json.loads(switch("status", "--name", TAG, "--json").stdout)
            assert status["ports"] == ports and status["memcached_ports"] == [11211]
            assert status["sketch_read"] is False  # no monitor renews it yet
            piped = subprocess.Popen([str(MBALANCER), "switch", "status", "--name", TAG], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            piped.stdout.close()  # the reader is gone before the command writes (as with `| head -0`)
            assert piped.wait(timeout=60) == 141 and piped.stderr.read() == ""  # quiet, as cat is

            processes.append(subprocess.Popen([str(MBALANCER), "controller", "--config", str(config)],
                                              stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], "mbalancer controller:", timeout=30)
            processes.append(subprocess.Popen([str(MBALANCER), "monitor", "--config", str(config)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            assert f"{READY} switch {TAG}" in wait_for_line(processes[-1], READY, timeout=30)
            with PrometheusServer(tmp_path, [listen]) as prometheus:
                generator = net.popen(net.client_hosts[0], load_command(net, LOAD_SECONDS, tmp_path, clients=64),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                assert eventually(lambda: switch_status()["hot_keys"] == 10, timeout=30), switch_status()
                time.sleep(2)  # the weights settle on the measured loads
                reports, before = controller_state(listen)["counters"]["reports"], gets_served(net)
                time.sleep(WINDOW)
                state, after = controller_state(listen), gets_served(net)
                served = [b - a for a, b in zip(before, after)]
                shares = [n / sum(served) for n in served]
                sent = [s["measured_gets_per_s"] for s in state["servers"]]  # as the clients' hash sends them
                unbalanced = [x / sum(sent) for x in sent]
                print(f"{sum(served) / WINDOW:.0f} gets/s served; shares {shares}, the clients' {unbalanced}; "
                      f"{state['counters']['reports'] - reports} reports in {WINDOW} s")
                # a report every interval (1 s), whatever the load; the servers' own counts even, the clients' not
                assert state["counters"]["reports"] - reports >= WINDOW - 2, state["counters"]
                assert max(shares) < 0.40 < max(unbalanced), (shares, unbalanced)
                assert eventually(prometheus.targets_up, timeout=10)
                empty = [(title, query) for title, query in dashboard_queries() if not prometheus.query(query)]
                assert empty == [], empty
                generator.terminate()  # the generator stops early and reports what it measured
                out, err = generator.communicate(timeout=60)
            assert generator.returncode == 0, err[-2000:]
            measured = json.loads(out)
            print({k: measured[k] for k in ("requests", "hits", "misses", "timeouts")})
            assert measured["misses"] == 0 and measured["hits"] > 0, measured
            assert measured["timeouts"] <= 0.01 * measured["requests"], measured
            # detached under a running controller: the command warns, the controller's /state says so
            detached = switch("detach", "--config", str(config))
            assert f"warning: ebpf:{TAG} is driven by controller pid {processes[0].pid}" in detached.stderr, \
                detached.stderr
            assert eventually(lambda: controller_state(listen)["switches_gone"] == [TAG], timeout=10)
        finally:
            for process in processes:
                stop_process(process, grace=30)
            switch("detach", "--config", str(config))  # whatever an assertion above left attached
        assert detached.returncode == 0 and "removed" in detached.stderr, detached.stderr
        assert not (PIN_ROOT / TAG).exists() and not os.path.exists(f"/sys/class/net/{mirror_link_of(TAG)[0]}")
        assert "nothing to remove" in switch("detach", "--name", TAG).stderr
        after = load(net, 1.0, tmp_path)  # the bridge forwards again
        assert after["timeouts"] == 0 and after["hits"] > 0


def switch_status(name: str = TAG) -> dict:
    return json.loads(switch("status", "--name", name, "--json").stdout)


def test_attach_balances_the_clients_tcp_gets_with_nothing_to_configure_and_detach_stops_the_splitter(tmp_path):
    """The own-servers path as the README gives it, no TCP setting (docs/dataplanes/tcp.md): attach starts the TCP
    splitter, which outlives the command; with the controller told the top keys, TCP clients' gets reach every
    server, none missed; detach stops the splitter and removes its link and routes, and TCP goes through the bridge
    again. Where the TCP path cannot run (the port taken on the box), attach goes on without it and says why, unless
    --tcp asks for it; --no-tcp makes none."""
    with NamespaceNetwork(servers=3, clients=1, tag=TAG, dataplane="bridge") as net:
        serve_and_fill(net)
        config = tmp_path / "mbalancer.toml"
        listen = f"127.0.0.1:{free_port()}"
        write_config(net, config, listen)
        controller = None
        try:
            attached = switch("attach", "--config", str(config))
            assert attached.returncode == 0 and "TCP gets balanced by splitter" in attached.stderr, attached.stderr
            splitter = switch_status()["tcp_splitter"]
            assert splitter["running"], splitter
            controller = subprocess.Popen([str(MBALANCER), "controller", "--config", str(config)],
                                          stderr=subprocess.PIPE, text=True)
            wait_for_line(controller, "mbalancer controller:", timeout=30)
            top = [{"key": f"key:{rank}", "rate": 1000.0 / rank} for rank in range(1, 11)]
            for second in range(2):  # hysteresis: hot for two reports
                request = urllib.request.Request(f"http://{listen}/report", method="POST", data=json.dumps(
                    {"time": time.time() + second, "interval": 1.0, "rate": 7500.0, "top": top}).encode())
                urllib.request.urlopen(request, timeout=10).close()
            assert eventually(lambda: sum(k["state"] == "clean" for k in controller_state(listen)["hot_keys"]) == 10,
                              timeout=30), controller_state(listen)["hot_keys"]
            before = gets_served(net)
            result = net.run(net.client_hosts[0], load_command(net, 3, tmp_path) + ["--protocol", "tcp"])
            assert result.returncode == 0, result.stderr[-2000:]
            measured, served = json.loads(result.stdout), [b - a for a, b in zip(before, gets_served(net))]
            assert measured["misses"] == 0 and measured["timeouts"] == 0 and measured["hits"] > 0, measured
            assert all(n > 0 for n in served), served
            assert switch_status()["counters"]["tcp_balanced"] > 0
        finally:
            if controller is not None:
                controller.terminate()
                controller.wait(timeout=30)
            detached = switch("detach", "--config", str(config))
        assert detached.returncode == 0 and f"the TCP splitter (pid {splitter['pid']})" in detached.stderr, \
            detached.stderr
        assert eventually(lambda: not os.path.exists(f"/proc/{splitter['pid']}"), timeout=10)
        assert not os.path.exists(f"/sys/class/net/{TAG}-t")
        assert "lookup" not in subprocess.run(["ip", "rule", "show", "pref", "1000"], capture_output=True,
                                              text=True).stdout
        after = net.run(net.client_hosts[0], load_command(net, 1.0, tmp_path) + ["--protocol", "tcp"])
        assert after.returncode == 0 and json.loads(after.stdout)["timeouts"] == 0, after.stderr[-2000:]
        assert_tcp_path_optional(config)


def assert_tcp_path_optional(config) -> None:
    """With the memcached port taken on the box: attach without the TCP path, saying why; --tcp refuses in one
    line, leaving nothing attached; --no-tcp makes no path and says nothing of it."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the splitter's connections just closed wait
        taken.bind(("0.0.0.0", 11211))
        taken.listen()
        try:
            attached = switch("attach", "--config", str(config))
            assert attached.returncode == 0 and "TCP gets go home, no TCP path" in attached.stderr, attached.stderr
            assert "Address already in use" in switch_status()["tcp_splitter"]["missing"]
            assert "no TCP path" in switch("status", "--config", str(config)).stdout
        finally:
            switch("detach", "--config", str(config))
        required = switch("attach", "--config", str(config), "--tcp")
        assert required.returncode == 1 and "Traceback" not in required.stderr, required.stderr
        assert len(required.stderr.strip().splitlines()) == 1 and not os.path.exists(f"/sys/class/net/{TAG}-t")
    try:
        off = switch("attach", "--config", str(config), "--no-tcp")
        assert off.returncode == 0 and "TCP" not in off.stderr and switch_status()["tcp_splitter"] is None
    finally:
        switch("detach", "--config", str(config))


@pytest.mark.parametrize("args, message", [
    (["attach", "--ports", "no-such-if0"], "no such interface"),
    (["attach"], "--ports"),
    (["attach", "--ports", "lo", "--name", "a/b"], "bad data plane name"),
    (["attach", "--ports", "lo", "--name", "x" * 18], "too long: at most 12 characters"),
    (["status", "--name", "no-such-switch"], "no switch named"),
])
def test_bad_switch_commands_say_why(args, message):
    result = switch(*args)
    assert result.returncode in (1, 2) and message in result.stderr and "Traceback" not in result.stderr


BOX = "mbbox"  # a namespace standing in for a switch box of its own; the switch is named after it
BOX_PORT = "mbbox-port"  # the box's port, renamed from eth0 so that only the box's namespace has it
SEND_GETS = ("import socket, sys\n"
             "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             "for i in range(int(sys.argv[2])):\n"
             "    s.sendto(bytes([0, i % 256, 0, 0, 0, 1, 0, 0]) + b'get boxkey\\r\\n', (sys.argv[1], 11211))\n")


def in_box(netns: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{netns}"]


def test_a_switch_on_a_box_namespace_is_run_through_nsenter_and_ip_netns_exec_is_refused():
    """The switch's pins live in the machine's bpffs: `ip netns exec` would put them in a private /sys that vanishes
    with the command (while the program stayed on the ports), so it is refused, naming nsenter; under
    `nsenter --net` attach and the monitor see the box's own interfaces (not /sys/class/net's); status and detach
    work from the machine's own namespace too."""
    with NamespaceNetwork(servers=1, clients=1, tag=BOX, dataplane="bridge") as net:
        box, client = net.server_hosts[0], net.client_hosts[0]
        net.run(client, ["ip", "neigh", "replace", box.ip, "lladdr", box.mac, "dev", "eth0"])
        for command in (["eth0", "down"], ["eth0", "name", BOX_PORT], [BOX_PORT, "up"]):  # a name only the box has
            assert net.run(box, ["ip", "link", "set", *command]).returncode == 0
        attach = ["attach", "--name", BOX, "--ports", BOX_PORT]
        try:
            refused = subprocess.run(["ip", "netns", "exec", box.netns, str(MBALANCER), "switch", *attach],
                                     capture_output=True, text=True, timeout=60)
            assert refused.returncode == 1 and "nsenter --net" in refused.stderr, refused.stderr
            assert len(refused.stderr.strip().splitlines()) == 1 and not (PIN_ROOT / BOX).exists()
            assert "clsact" not in net.run(box, ["tc", "qdisc", "show", "dev", BOX_PORT]).stdout  # nothing attached

            attached = subprocess.run([*in_box(box.netns), str(MBALANCER), "switch", *attach], capture_output=True,
                                      text=True, timeout=60)
            assert attached.returncode == 0, attached.stderr
            monitor = subprocess.Popen([*in_box(box.netns), str(MBALANCER), "monitor", "--iface", BOX_PORT, "--json",
                                        "--interval", "0.5", "--duration", "30"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                wait_for_line(monitor, READY)
                sent = net.run(client, ["python3", "-c", SEND_GETS, box.ip, "40"])
                assert sent.returncode == 0, sent.stderr
                assert eventually(lambda: switch_status(BOX)["counters"].get("memcached", 0) >= 40, timeout=10)
            finally:
                monitor.terminate()
                out, err = monitor.communicate(timeout=30)
            counted = sum(k["count"] for line in out.splitlines() for k in json.loads(line)["top"]
                          if k["key"] == "boxkey")
            assert counted == 40, err  # the box's port, found in the box's namespace
            status = switch("status", "--name", BOX).stdout  # from the machine's own namespace: the pins are shared
            assert f"ports {BOX_PORT} (in network namespace {box.netns})" in status, status
        finally:
            detached = switch("detach", "--name", BOX)  # the record says where the ports are
        assert detached.returncode == 0 and f"in network namespace {box.netns}" in detached.stderr, detached.stderr
        assert not (PIN_ROOT / BOX).exists()
        assert "clsact" not in net.run(box, ["tc", "qdisc", "show", "dev", BOX_PORT]).stdout


def test_a_switch_whose_namespace_is_gone_is_detached_from_its_pins():
    """The box was deleted with the switch attached: its ports went with it, the pins and the record did not."""
    box = "mbgone"
    switch("detach", "--name", box)  # whatever a killed run left
    subprocess.run(["ip", "netns", "add", box], check=True)
    try:
        subprocess.run(["ip", "-n", box, "link", "add", "gone0", "type", "veth", "peer", "name", "gone1"], check=True)
        subprocess.run(["ip", "-n", box, "link", "set", "gone0", "up"], check=True)
        attached = subprocess.run([*in_box(box), str(MBALANCER), "switch", "attach", "--name", box, "--ports",
                                   "gone0"], capture_output=True, text=True, timeout=60)
        assert attached.returncode == 0, attached.stderr
        splitter = switch_status(box)["tcp_splitter"]["pid"]  # its TCP path, made in the box by default
    finally:
        subprocess.run(["ip", "netns", "del", box], capture_output=True)
    detached = switch("detach", "--name", box)
    assert detached.returncode == 0 and f"network namespace {box} is gone" in detached.stderr, detached.stderr
    assert f"the TCP splitter (pid {splitter})" in detached.stderr  # it alone kept the box's namespace alive
    assert eventually(lambda: not os.path.exists(f"/proc/{splitter}/cmdline") or
                      not open(f"/proc/{splitter}/cmdline").read(), timeout=10)
    assert not (PIN_ROOT / box).exists() and "nothing to remove" in switch("detach", "--name", box).stderr


AGENT_TAG = "mbagt"


def test_a_controller_elsewhere_drives_the_box_through_its_switch_agent(tmp_path):
    """docs/deployment.md "Several boxes": the box attaches its switch and serves it (`mbalancer switch serve`, a
    token); a controller with its own config (kind = "agent") drives it over gRPC, the box's monitor reports to that
    controller. Under load with writes, the servers' own counts of gets are even, no get misses, and the controller
    copied mirrored writes that crossed the agent; a second controller with the same election id is refused."""
    with NamespaceNetwork(servers=3, clients=1, tag=AGENT_TAG, dataplane="bridge") as net:
        serve_and_fill(net)
        listen, agent_at = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        token = tmp_path / "token"
        token.write_text("0123456789abcdef0123456789abcdef\n")
        box, controller_config = tmp_path / "box.toml", tmp_path / "controller.toml"
        write_config(net, box, listen, AGENT_TAG)
        box.write_text(box.read_text() + f'[dataplane.agent]\nlisten = "{agent_at}"\ntoken_file = "{token}"\n')
        servers = box.read_text().split("[controller]")[0]
        controller_config.write_text(servers + f'[controller]\nlisten = "{listen}"\n[dataplane]\nkind = "agent"\n'
                                     f'[dataplane.agent]\naddress = "{agent_at}"\nkind = "ebpf"\n'
                                     f'token_file = "{token}"\n')
        processes = []
        try:
            attached = switch("attach", "--config", str(box))
            assert attached.returncode == 0, attached.stderr
            processes.append(subprocess.Popen([str(MBALANCER), "switch", "serve", "--config", str(box)],
                                              stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], "switch agent: serving", timeout=30)  # its first line
            processes.append(subprocess.Popen([str(MBALANCER), "controller", "--config", str(controller_config)],
                                              stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], "mbalancer controller:", timeout=30)
            second = subprocess.run([str(MBALANCER), "controller", "--config", str(controller_config), "--listen",
                                     f"127.0.0.1:{free_port()}", "--duration", "5"],
                                    capture_output=True, text=True, timeout=60)
            said = second.stderr.strip().splitlines()[-1]  # argparse's one error line, after the usage
            assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
            assert said.startswith('mbalancer controller: error: [dataplane] kind = "agent" (') and \
                "switch agent" in said and "ALREADY_EXISTS" in said, second.stderr
            processes.append(subprocess.Popen([str(MBALANCER), "monitor", "--config", str(box)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            wait_for_line(processes[-1], READY, timeout=30)
            generator = net.popen(net.client_hosts[0], load_command(net, LOAD_SECONDS, tmp_path, clients=16)
                                  + ["--set-ratio", "0.002"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert eventually(lambda: switch_status(AGENT_TAG)["hot_keys"] == 10, timeout=30), \
                switch_status(AGENT_TAG)
            time.sleep(2)  # the weights settle on the measured loads
            before = gets_served(net)
            time.sleep(WINDOW)
            state, after = controller_state(listen), gets_served(net)
            served = [b - a for a, b in zip(before, after)]
            shares = [n / sum(served) for n in served]
            sent = [s["measured_gets_per_s"] for s in state["servers"]]
            unbalanced = [x / sum(sent) for x in sent]
            print(f"{sum(served) / WINDOW:.0f} gets/s served; shares {shares}, the clients' {unbalanced}; "
                  f"counters {state['counters']}")
            assert max(shares) < 0.40 < max(unbalanced), (shares, unbalanced)
            assert state["counters"]["mirrors"] > 0 and state["counters"]["mirrors_lost"] == 0, state["counters"]
            generator.terminate()
            out, err = generator.communicate(timeout=60)
            assert generator.returncode == 0, err[-2000:]
            measured = json.loads(out)
            assert measured["misses"] == 0 and measured["hits"] > 0, measured
        finally:
            for process in reversed(processes):
                stop_process(process, grace=30)
            switch("detach", "--config", str(box))
        agent_log = processes[0].stderr.read() if processes else ""
        assert "is the primary" in agent_log and "stopped: driver closed, lease ended" in agent_log, agent_log
