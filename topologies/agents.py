"""One switch agent per switch node of a testbed, each on a box of its own, as a fabric has them.

A box is a network namespace `mbbox-<switch>`: its agent (`mbalancer switch serve`) runs there, holds what its switch
sends the controller on a link of its own (an eBPF switch's mirror link end, moved in from the root namespace; bmv2
sends PacketIns over P4Runtime, which it serves on the LAN's root address) and listens on the box's address on the
management LAN (topologies/management.py: box k at 10.0.1.(2 + k)). Controllers reach every agent over that LAN with
a shared token, never through the local bpffs; the agent reaches its switch's pinned maps (one mount namespace, as
on a real box the agent and its switch share a kernel).
Every get is balanced at its home's leaf (dataplanes/agent/fabric.py), so each box is told which servers hang off it.
The boxes may run different data planes (a mixed fabric): each agent serves its own switch's kind, and the
controller, told no kind, takes whichever each box runs.
"""
from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from dataplanes.agent import DEFAULT_PORT
from dataplanes.agent.process import AgentProcess
from dataplanes.bpf.program import in_netns
from dataplanes.switch_nodes import sh
from topologies.claim import Made
from topologies.management import BRIDGE, LanHost, ManagementLan, box_ip

log = logging.getLogger(__name__)

CONFIG = """# the switch agent of box {name} (topologies/agents.py)
[[servers]]
name = "unused"
ip = "127.0.0.1"
mac = "02:00:00:00:00:00"

[dataplane]
kind = "{kind}"

[dataplane.{kind}]
{section}trusted = [{controllers}]

[dataplane.agent]
listen = "{listen}"
token_file = "{token_file}"
"""


@dataclass(frozen=True)
class Box:
    switch: str
    number: int  # 0, 1, ...: its /30 of the management subnet
    kind: str = "ebpf"  # its switch's data plane, which its agent serves

    @property
    def namespace(self) -> str:
        return f"mbbox-{self.switch}"

    @property
    def agent_ip(self) -> str:
        return box_ip(self.number)

    @property
    def address(self) -> str:
        return f"{self.agent_ip}:{DEFAULT_PORT}"


class SwitchAgents:
    """agents = SwitchAgents(folder, lan, {"leaf1": "ebpf", "spine1": "ebpf"}, ["10.0.0.254"]); agents.start();
    agents.settings(racks); agents.close()."""

    def __init__(self, folder: Path, lan: ManagementLan, switches: Mapping[str, str], controller_ips: Sequence[str]):
        """switches: each switch's data plane (its Mininet switch class gives its agent its section: box_settings,
        box_links); controller_ips: the controllers' addresses on the data network, whose copies the switches trust."""
        self.folder, self.lan, self.controller_ips = folder, lan, tuple(controller_ips)
        self.boxes = [Box(name, number, kind) for number, (name, kind) in enumerate(switches.items())]
        self.token_file = folder / "agents.token"
        self.agents: list[AgentProcess] = []
        self.hosts: dict[str, LanHost] = {}  # switch -> its box on the LAN

    def made(self) -> Made:
        """What start() makes in the root namespace, for the network's claim."""
        return Made(interfaces=[BRIDGE, *(f"{box.switch}-mg" for box in self.boxes)],
                    namespaces=[box.namespace for box in self.boxes])

    def start(self, net) -> "SwitchAgents":
        self.folder.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(secrets.token_hex(16) + "\n")
        self.token_file.chmod(0o600)
        for box in self.boxes:
            self.hosts[box.switch] = self.lan.add_namespace(box.switch, box.namespace, box.agent_ip)
        self.start_agents(net)
        return self

    def start_agents(self, net) -> None:
        """Each box's links moved in (an eBPF switch makes its mirror link anew when it reloads), then its agent."""
        for box in self.boxes:
            switch = net.get(box.switch)
            for link in switch.box_links:
                sh("ip", "link", "set", link, "netns", box.namespace)
                sh(*in_netns(box.namespace), "ip", "link", "set", link, "up")
            if enter := getattr(switch, "enter_box", None):  # what else of the switch lives in its box (a splitter)
                enter(box.namespace)
            section = "".join(f"{name} = {json.dumps(value)}\n" for name, value in switch.box_settings().items())
            config = self.folder / f"agent-{box.switch}.toml"
            config.write_text(CONFIG.format(name=box.switch, kind=box.kind, section=section, listen=box.address,
                                            token_file=self.token_file,
                                            controllers=", ".join(f'"{ip}"' for ip in self.controller_ips)))
            self.agents.append(AgentProcess(config, prefix=in_netns(box.namespace)))
        log.info("switch agents: %s", ", ".join(f"{box.switch} ({box.kind}) at {box.address}" for box in self.boxes))

    def stop_agents(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.agents.clear()

    def settings(self, racks: dict[str, list[str]]) -> dict:
        """The controller's [dataplane.agent] for this fabric: each box with the servers cabled to its switch, and the
        kind every agent must run (none in a mixed fabric: each box runs its own)."""
        kinds = {box.kind for box in self.boxes}
        return {"boxes": [" ".join([box.address, *racks.get(box.switch, [])]) for box in self.boxes],
                "token_file": str(self.token_file), "kind": kinds.pop() if len(kinds) == 1 else ""}

    def close(self) -> None:
        """The agents stop; their boxes go with the LAN (ManagementLan.close)."""
        self.stop_agents()
