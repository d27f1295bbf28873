"""One testbed run's emulated links: kernel namespaces or process relays, set up and torn down.

The link model and the relay are :mod:`hermes.deploy.links`, the namespaces
:mod:`hermes.deploy.netlab`; this module picks between them for a run and
tells the testbed how to start each agent behind its link.
"""

from __future__ import annotations

import functools
from typing import Any

from hermes.deploy.links import Link, Relay, Route
from hermes.deploy.netlab import Netlab, kernel_available


def _same_link(link: Link, _peer: str) -> Link:
    return link


class TestbedLinks:
    """Every agent's link for one testbed run: the namespaces or relays, set up and torn down.

    ``mode`` is ``kernel``, ``process`` or ``auto`` (kernel where
    :func:`hermes.deploy.netlab.kernel_available`); with every link ``lan``
    nothing is set up and the mode is ``none``.
    """

    __test__ = False  # not a pytest class, whatever its name

    def __init__(self, links: list[Link], mode: str = "auto") -> None:
        self.links = links
        if not any(link.shaped for link in links):
            self.mode = "none"
        elif mode == "auto":
            self.mode = "kernel" if kernel_available() else "process"
        else:
            self.mode = mode
        self.lab: Any = None
        self.relays: list[Relay | None] = []
        self.rewrites: list[str] = []
        self._relayed_at_close: list[list[int] | None] | None = None

    @property
    def advertise_host(self) -> str:
        """The address every agent can reach the server's ports (and the broker) at."""
        return self.lab.service_ip if self.lab is not None else "127.0.0.1"

    def prepare(self) -> None:
        if self.mode == "kernel":
            self.lab = Netlab(self.links).setup()

    def start(self, ports: list[int]) -> None:
        """Relays to the server's ``ports`` (control, data plane, broker) on 127.0.0.1."""
        if self.mode == "kernel":
            routes = [Route(self.lab.service_ip, p, "127.0.0.1", p) for p in ports]
            self.relays = [Relay(routes, self.lab.link_of, pace=False).start()]
        elif self.mode == "process":
            for link in self.links:
                if not link.shaped:
                    self.relays.append(None)
                    self.rewrites.append("")
                    continue
                relay = Relay([Route("127.0.0.1", 0, "127.0.0.1", p) for p in ports],
                              functools.partial(_same_link, link), pace=True).start()
                self.relays.append(relay)
                self.rewrites.append(",".join(f"127.0.0.1:{p}=127.0.0.1:{r}" for p, r in zip(ports, relay.ports)))

    def agent_command(self, index: int, module: str, args: list[str], python: str) -> tuple[list[str], dict[str, str]]:
        """The command line and extra environment that start ``module`` behind agent ``index``'s link."""
        if self.mode == "kernel" and self.links[index].shaped:
            return self.lab.wrap(index, [python, "-m", module, *args]), {}
        if self.mode == "process" and self.links[index].shaped:
            from hermes.deploy.linkshim import ENV

            return [python, "-m", "hermes.deploy.linkshim", module, *args], {ENV: self.rewrites[index]}
        return [python, "-m", module, *args], {}

    def server_host(self, index: int) -> str:
        """The host agent ``index`` names in ``--server``."""
        return self.lab.service_ip if self.mode == "kernel" and self.links[index].shaped else "127.0.0.1"

    def relayed(self, index: int) -> list[int] | None:
        """[bytes up, bytes down] agent ``index``'s link carried through its relay (None: not relayed)."""
        if self._relayed_at_close is not None:
            return self._relayed_at_close[index]
        if self.mode == "kernel" and self.links[index].shaped:
            relay = self.relays[0] if self.relays else None
            return relay.bytes.get(self.lab.agent_ip(index), [0, 0]) if relay and self.lab else None
        if self.mode == "process" and index < len(self.relays) and (relay := self.relays[index]) is not None:
            return [sum(c[0] for c in relay.bytes.values()), sum(c[1] for c in relay.bytes.values())]
        return None

    def describe(self, names: list[str]) -> dict[str, Any]:
        return {"mode": self.mode, "agents": {
            n: {**link.describe(), "relayed_bytes": self.relayed(i)} for i, (n, link) in enumerate(zip(names, self.links))}}

    def close(self) -> None:
        if self.relays and self._relayed_at_close is None:
            self._relayed_at_close = [self.relayed(i) for i in range(len(self.links))]
        for relay in self.relays:
            if relay is not None:
                relay.stop()
        self.relays = []
        if self.lab is not None:
            self.lab.close()
            self.lab = None
