"""Hosts on one machine, the way Jepsen builds them: each "host" is a network namespace
joined to this one by a veth pair, and a partition is made for real on its link (packets
dropped one way or both, or the link taken down), then healed."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass

KINDS = ("host cannot reach server", "server cannot answer", "link down", "flapping link")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", *args], check=True, capture_output=True, timeout=30)


def missing() -> str | None:
    """Why this machine cannot make namespaces, or None (root with ip and iptables)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"needs {tool}: apt-get install {package} (.ci/run does)"
    return None


@dataclass
class Host:
    """One namespace: its name, the veth end on this side, its address and the server's."""

    namespace: str
    link: str  # this side's end of the veth pair
    inner: str  # the namespace's end
    address: str
    server: str
    rules: list[tuple[str, ...]]

    @property
    def run(self) -> list[str]:
        """The prefix that runs a command on this host."""
        return ["ip", "netns", "exec", self.namespace]


class Hosts:
    """`count` namespaces on a subnet of their own (10.S.N.0/24); everything is removed by
    `destroy`, partitions included."""

    def __init__(self, count: int) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
        self.subnet = 100 + random.randrange(150)
        self.hosts: list[Host] = []
        for n in range(1, count + 1):
            namespace, link, inner = f"pdr{tag}n{n}", f"pdr{tag}h{n}", f"pdr{tag}i{n}"
            server, address = f"10.{self.subnet}.{n}.1", f"10.{self.subnet}.{n}.2"
            self.hosts.append(Host(namespace, link, inner, address, server, []))

    @property
    def network(self) -> str:
        return f"10.{self.subnet}.0.0/16"

    def create(self) -> None:
        for host in self.hosts:
            ip("netns", "add", host.namespace)
            ip("netns", "exec", host.namespace, "ip", "link", "set", "lo", "up")
            ip("link", "add", host.link, "type", "veth", "peer", "name", host.inner)
            ip("link", "set", host.inner, "netns", host.namespace)
            ip("addr", "add", f"{host.server}/24", "dev", host.link)
            ip("link", "set", host.link, "up")
            inside = ["netns", "exec", host.namespace, "ip"]
            ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.inner)
            ip(*inside, "link", "set", host.inner, "up")

    def partition(self, host: Host, kind: str) -> None:
        """Cut `host` off: its packets to the server dropped, the server's answers dropped,
        or its link down. (A flapping link is driven by the caller: down, up, down...)"""
        if kind == "host cannot reach server":
            rule = ("INPUT", "-i", host.link, "-j", "DROP")
        elif kind == "server cannot answer":
            rule = ("OUTPUT", "-o", host.link, "-j", "DROP")
        else:
            ip("link", "set", host.link, "down")
            return
        iptables("-I", *rule)
        host.rules.append(rule)

    def heal(self, host: Host) -> None:
        for rule in host.rules:
            iptables("-D", *rule)
        host.rules.clear()
        ip("link", "set", host.link, "up")

    def destroy(self) -> None:
        for host in self.hosts:
            for rule in host.rules:
                subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, timeout=30)
