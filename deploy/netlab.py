"""Per-agent network namespaces behind shaped veth pairs (kernel link mode; root and iproute2).

Layout for a testbed of pid P and a /16 ``10.S.0.0`` chosen free at start:

* agent ``i`` runs in namespace ``hlkP-i``; its veth end ``hkPnI`` holds
  ``10.S.i.2/30`` and its default route goes to the host end ``hkPhI``
  (``10.S.i.1/30``);
* the service address ``10.S.255.1/32`` sits on the host's loopback
  (label ``lo:hkP``): every agent reaches the server, the data plane and the
  broker there, through its own veth, whatever address the server
  advertises at registration;
* tbf shapes the agent end's egress (upload) and the host end's egress
  (download). No netem in this kernel: the delay is the relay's
  (:mod:`hermes.deploy.links`).

Everything is named after the testbed's pid, so :func:`sweep_stale` removes
what a testbed that died without cleaning up (SIGKILL) left behind.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import subprocess

from hermes.deploy.links import Link

log = logging.getLogger(__name__)

_NS = re.compile(r"^hlk(\d+)-\d+$")
_LABEL = re.compile(r"\blo:hk(\d+)$")


class NetlabError(RuntimeError):
    """A namespace, veth or qdisc could not be set up."""


def kernel_available() -> bool:
    """Root, with ``ip`` and ``tc`` on the path."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _run(*cmd: str) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetlabError(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_namespaces() -> list[str]:
    """The link namespaces whose testbed is gone (hlkPID-i of a PID no longer running)."""
    names = (line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.split())
    return [n for n in names if (m := _NS.match(n)) and not _alive(int(m.group(1)))]


def sweep_stale() -> int:
    """Delete the namespaces and service addresses of testbeds that are gone; how many things went."""
    removed = 0
    for name in stale_namespaces():
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        removed += 1
    for line in _run("ip", "-o", "-4", "addr", "show", "dev", "lo").splitlines():
        m = _LABEL.search(line)
        if m and not _alive(int(m.group(1))):
            addr = line.split()[3]
            subprocess.run(["ip", "addr", "del", addr, "dev", "lo"], capture_output=True, check=False)
            removed += 1
    if removed:
        log.info("removed %d stale link namespaces/addresses", removed)
    return removed


def _free_subnet() -> int:
    used = set(re.findall(r"inet 10\.(\d+)\.", _run("ip", "-o", "-4", "addr", "show")))
    candidates = [s for s in range(100, 250) if str(s) not in used]
    if not candidates:
        raise NetlabError("no free 10.S.0.0/16 for the link namespaces")
    return random.choice(candidates)


def tbf_args(bps: float) -> list[str]:
    """tbf's arguments for a rate (``tc qdisc add ... <these>``); :mod:`hermes.deploy.tc_link` shares them."""
    # burst: at least 10 ms of traffic and 32 KiB (tbf needs rate/HZ and a GSO
    # segment); limit: 500 ms of queue, so TCP sees a deep buffer rather than
    # drops (measured: a 100 ms limit halved lte's 10 Mbit/s upload).
    rate_bytes = bps / 8
    burst = max(32768, int(rate_bytes * 0.01))
    limit = max(2 * burst, int(rate_bytes * 0.5))
    return ["tbf", "rate", f"{int(bps)}bit", "burst", str(burst), "limit", str(limit)]


class Netlab:
    """The namespaces of one testbed run. Use as a context manager or call :meth:`close`."""

    def __init__(self, links: list[Link], tag: int | None = None) -> None:
        self.links = links
        self.tag = tag if tag is not None else os.getpid()
        self.subnet = 0
        self.namespaces: list[str] = []
        self.service_ip = ""
        self._lo_addr = ""

    def agent_ip(self, index: int) -> str:
        return f"10.{self.subnet}.{index}.2"

    def namespace(self, index: int) -> str:
        return f"hlk{self.tag}-{index}"

    def link_of(self, peer_ip: str) -> Link | None:
        parts = peer_ip.split(".")
        if len(parts) == 4 and parts[0] == "10" and parts[1] == str(self.subnet) and parts[3] == "2":
            index = int(parts[2])
            if 0 <= index < len(self.links):
                return self.links[index]
        return None

    def setup(self) -> Netlab:
        sweep_stale()
        self._claim_subnet()
        try:
            for i, link in enumerate(self.links):
                self._agent(i, link)
        except NetlabError:
            self.close()
            raise
        log.info("link namespaces up: %d agents behind veth pairs on 10.%d.0.0/16, service address %s",
                 len(self.links), self.subnet, self.service_ip)
        return self

    def _claim_subnet(self, attempts: int = 8) -> None:
        """A free 10.S.0.0/16, claimed by adding its service address to lo: the kernel refuses the
        same address twice, so two testbeds setting up at once (a parallel test run) cannot both
        take S; the one that loses picks again."""
        for _ in range(attempts):
            subnet = _free_subnet()
            addr = f"10.{subnet}.255.1/32"
            done = subprocess.run(["ip", "addr", "add", addr, "dev", "lo", "label", f"lo:hk{self.tag}"],
                                  capture_output=True, text=True, check=False)
            if done.returncode == 0:
                self.subnet, self.service_ip, self._lo_addr = subnet, f"10.{subnet}.255.1", addr
                return
            if "already assigned" not in done.stderr and "exists" not in done.stderr:  # iproute2 versions differ
                raise NetlabError(f"ip addr add {addr} dev lo: {done.stderr.strip() or done.stdout.strip()}")
        raise NetlabError(f"no free 10.S.0.0/16 for the link namespaces after {attempts} tries")

    def _agent(self, i: int, link: Link) -> None:
        ns, host_if, ns_if = self.namespace(i), f"hk{self.tag}h{i}", f"hk{self.tag}n{i}"
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", ns)
        _run("ip", "addr", "add", f"10.{self.subnet}.{i}.1/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "-n", ns, "addr", "add", f"{self.agent_ip(i)}/30", "dev", ns_if)
        _run("ip", "-n", ns, "link", "set", ns_if, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "route", "add", "default", "via", f"10.{self.subnet}.{i}.1")
        if link.up_bps is not None:
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ns_if, "root", *tbf_args(link.up_bps))
        if link.down_bps is not None:
            _run("tc", "qdisc", "add", "dev", host_if, "root", *tbf_args(link.down_bps))

    def wrap(self, index: int, cmd: list[str]) -> list[str]:
        """``cmd`` run inside agent ``index``'s namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace(index), *cmd]

    def close(self) -> None:
        # Deleting a namespace destroys its veth end, and with it the host end.
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)
        self.namespaces = []
        if self._lo_addr:
            subprocess.run(["ip", "addr", "del", self._lo_addr, "dev", "lo"], capture_output=True, check=False)
            self._lo_addr = ""

    def __enter__(self) -> Netlab:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.close()
