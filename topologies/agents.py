"""One switch agent per switch node of a testbed, each on a box of its own, as a fabric has them.

A box is a network namespace `mbbox-<switch>`: its agent (`mbalancer switch serve`) runs there, holds the controller's
end of its switch's mirror link (moved in from the root namespace) and listens on its end of a management link,
`<switch>-mg` in the root namespace <-> `mg0` in the box, a /30 of MANAGEMENT_SUBNET per box. The controller (root
namespace) reaches every agent over that network with a shared token, never through the local bpffs; the agent
reaches its switch's pinned maps (one mount namespace, as on a real box the agent and its switch share a kernel).
Every get is balanced at its home's leaf (dataplanes/agent/fabric.py), so each box is told which servers hang off it.
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from dataplanes.agent import DEFAULT_PORT
from dataplanes.agent.process import AgentProcess
from dataplanes.bpf.program import in_netns, mirror_link_of
from dataplanes.switch_nodes import sh
from topologies.claim import Made

log = logging.getLogger(__name__)

MANAGEMENT_SUBNET = "10.0.1"  # box k's management link: .4k+1 (controller side) and .4k+2 (the agent)
MAX_BOXES = 63

CONFIG = """# the switch agent of box {name} (topologies/agents.py)
[[servers]]
name = "unused"
ip = "127.0.0.1"
mac = "02:00:00:00:00:00"

[dataplane]
kind = "ebpf"

[dataplane.ebpf]
switches = ["{name}"]
trusted = ["{controller}"]

[dataplane.agent]
listen = "{listen}"
token_file = "{token_file}"
"""


@dataclass(frozen=True)
class Box:
    switch: str
    number: int  # 0, 1, ...: its /30 of the management subnet

    @property
    def namespace(self) -> str:
        return f"mbbox-{self.switch}"

    @property
    def link(self) -> str:
        return f"{self.switch}-mg"

    @property
    def controller_ip(self) -> str:
        return f"{MANAGEMENT_SUBNET}.{4 * self.number + 1}"

    @property
    def agent_ip(self) -> str:
        return f"{MANAGEMENT_SUBNET}.{4 * self.number + 2}"

    @property
    def address(self) -> str:
        return f"{self.agent_ip}:{DEFAULT_PORT}"


class SwitchAgents:
    """agents = SwitchAgents(folder, ["leaf1", "spine1"]); agents.start(); agents.settings(racks); agents.close()."""

    def __init__(self, folder: Path, switches: Sequence[str], controller_ip: str):
        """controller_ip: the controller's address on the data network, whose copies the switches trust."""
        if len(switches) > MAX_BOXES:
            raise ValueError(f"at most {MAX_BOXES} boxes on the management subnet (got {len(switches)})")
        self.folder, self.controller_ip = folder, controller_ip
        self.boxes = [Box(name, number) for number, name in enumerate(switches)]
        self.token_file = folder / "agents.token"
        self.agents: list[AgentProcess] = []
        self.built: list[Box] = []

    def made(self) -> Made:
        """What start() makes in the root namespace, for the network's claim."""
        return Made(interfaces=[box.link for box in self.boxes], namespaces=[box.namespace for box in self.boxes])

    def start(self) -> "SwitchAgents":
        self.folder.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(secrets.token_hex(16) + "\n")
        self.token_file.chmod(0o600)
        for box in self.boxes:
            self._build(box)
        self.start_agents()
        return self

    def _build(self, box: Box) -> None:
        sh("ip", "netns", "add", box.namespace)
        self.built.append(box)
        sh("ip", "link", "add", box.link, "type", "veth", "peer", "name", "mg0", "netns", box.namespace)
        sh("sysctl", "-qw", f"net.ipv6.conf.{box.link}.disable_ipv6=1", check=False)
        sh("ip", "addr", "add", f"{box.controller_ip}/30", "dev", box.link)
        sh("ip", "link", "set", box.link, "up")
        inside = in_netns(box.namespace)
        sh(*inside, "ip", "addr", "add", f"{box.agent_ip}/30", "dev", "mg0")
        for iface in ("mg0", "lo"):
            sh(*inside, "ip", "link", "set", iface, "up")

    def start_agents(self) -> None:
        """Each box's mirror link end moved in (the switch makes it anew when it reloads), then its agent."""
        for box in self.boxes:
            mirror = mirror_link_of(box.switch)[1]
            sh("ip", "link", "set", mirror, "netns", box.namespace)
            sh(*in_netns(box.namespace), "ip", "link", "set", mirror, "up")
            config = self.folder / f"agent-{box.switch}.toml"
            config.write_text(CONFIG.format(name=box.switch, listen=box.address, token_file=self.token_file,
                                            controller=self.controller_ip))
            self.agents.append(AgentProcess(config, prefix=in_netns(box.namespace)))
        log.info("switch agents: %s", ", ".join(f"{box.switch} at {box.address}" for box in self.boxes))

    def stop_agents(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.agents.clear()

    def settings(self, racks: dict[str, list[str]]) -> dict:
        """The controller's [dataplane.agent] for this fabric: each box with the servers cabled to its switch."""
        return {"boxes": [" ".join([box.address, *racks.get(box.switch, [])]) for box in self.boxes],
                "token_file": str(self.token_file), "kind": "ebpf"}

    def close(self) -> None:
        self.stop_agents()
        for box in self.built:
            sh("ip", "link", "del", box.link, check=False)
            sh("ip", "netns", "del", box.namespace, check=False)
        self.built.clear()
