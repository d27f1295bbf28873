"""Emulated links: named profiles and the delaying, optionally pacing TCP relay.

A link is a bandwidth each way and a round-trip time. The testbed gives
every agent one (``--link``/``--links``) and makes every byte the agent
moves (control plane HTTP, ZeroMQ data plane, Kafka) cross it:

* kernel mode (root with iproute2, see :mod:`hermes.deploy.netlab`): the
  agent runs in a network namespace of its own behind a veth pair whose two
  ends are shaped with tbf (upload on the agent's end, download on the
  host's). This kernel has no netem, so the delay is added by the
  :class:`Relay` on the host side, RTT/2 each way, keyed by the agent's
  address.
* process mode (anyone): one :class:`Relay` per agent on loopback both
  delays and paces (token bucket per direction); the agent is started
  through :mod:`hermes.deploy.linkshim`, which rewrites its connections to
  the server's ports into connections to its relay.
* containers (the compose link overrides, deploy/compose.link-*.yml): each
  agent container shapes its own interface with tc, netem delay included
  where the kernel has it (:mod:`hermes.deploy.tc_link`).

Upload is agent to server, download server to agent, as a device owner
would read an LTE contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


class LinkError(ValueError):
    """A link name or a custom link that does not parse."""


@dataclass(frozen=True)
class Link:
    name: str
    up_bps: float | None  # bits per second agent -> server; None: unshaped
    down_bps: float | None  # bits per second server -> agent; None: unshaped
    rtt: float  # seconds added to every round trip

    @property
    def shaped(self) -> bool:
        return self.up_bps is not None or self.down_bps is not None or self.rtt > 0

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "up_mbit": None if self.up_bps is None else self.up_bps / 1e6,
                "down_mbit": None if self.down_bps is None else self.down_bps / 1e6, "rtt_ms": self.rtt * 1e3}


# Nominal figures: wifi an 802.11n/ac home network under load, lte a typical
# urban uplink/downlink pair, constrained a rural or congested edge link.
PROFILES: dict[str, Link] = {
    "lan": Link("lan", None, None, 0.0),
    "wifi": Link("wifi", 50e6, 50e6, 0.005),
    "lte": Link("lte", 10e6, 30e6, 0.050),
    "constrained": Link("constrained", 2e6, 2e6, 0.150),
}

_RATE = re.compile(r"^([0-9]*\.?[0-9]+)(bit|kbit|mbit|gbit)$")
_TIME = re.compile(r"^([0-9]*\.?[0-9]+)(us|ms|s)$")
_RATE_UNIT = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _rate(text: str, whole: str) -> float:
    m = _RATE.match(text.lower())
    if not m or float(m.group(1)) <= 0:
        raise LinkError(f"link {whole!r}: rate {text!r} is not like 10mbit, 512kbit or 1gbit")
    return float(m.group(1)) * _RATE_UNIT[m.group(2)]


def parse_link(text: str) -> Link:
    """``lan``, ``wifi``, ``lte``, ``constrained`` or ``custom:UP/DOWN/RTT`` (``custom:10mbit/30mbit/50ms``)."""
    name = text.strip().lower()
    if name in PROFILES:
        return PROFILES[name]
    if name.startswith("custom:"):
        parts = name[len("custom:"):].split("/")
        if len(parts) != 3:
            raise LinkError(f"link {text!r}: expected custom:UP/DOWN/RTT, e.g. custom:10mbit/30mbit/50ms")
        m = _TIME.match(parts[2])
        if not m:
            raise LinkError(f"link {text!r}: round-trip time {parts[2]!r} is not like 50ms, 0.2s or 800us")
        return Link(name, _rate(parts[0], text), _rate(parts[1], text), float(m.group(1)) * _TIME_UNIT[m.group(2)])
    raise LinkError(f"unknown link {text!r}; known: {', '.join(PROFILES)} or custom:UP/DOWN/RTT")


def agent_links(link: str | None, links: str | None, clients: int) -> list[Link]:
    """One link per agent from ``--link`` (all agents) or ``--links`` (one per agent, comma-separated)."""
    if link and links:
        raise LinkError("give --link (every agent) or --links (one per agent), not both")
    if links:
        names = [n for n in links.split(",") if n.strip()]
        if len(names) != clients:
            raise LinkError(f"--links names {len(names)} links for {clients} agents")
        return [parse_link(n) for n in names]
    return [parse_link(link or "lan")] * clients


@dataclass(frozen=True)
class Route:
    listen_host: str
    listen_port: int  # 0: a free one, read back from Relay.ports
    target_host: str
    target_port: int


# Chunks read per socket read. Smaller when pacing: a 64 KiB chunk is a quarter
# of a second at 2 Mbit/s, and a paced transfer should be smooth at 100 ms scale.
_CHUNK = 65536
_PACED_CHUNK = 8192


class Relay:
    """A TCP relay on its own asyncio thread: each route forwards a listening port to a target.

    ``link_of(peer_ip)`` names the link of a connection by the address it came
    from (None: no delay, no pacing). Each direction is a delay line: bytes read
    at ``t`` are written at ``t + rtt/2``, and with ``pace`` no faster than the
    link's rate in that direction (a token bucket with no burst allowance).
    """

    def __init__(self, routes: list[Route], link_of: Callable[[str], Link | None], *, pace: bool) -> None:
        self.routes = routes
        self.link_of = link_of
        self.pace = pace
        self.ports: list[int] = []
        # Bytes relayed per peer address, [agent -> server, server -> agent]: proof that traffic crossed.
        self.bytes: dict[str, list[int]] = {}
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="link-relay", daemon=True)
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    async def _listen(self) -> None:
        for r in self.routes:
            server = await asyncio.start_server(functools.partial(self._accept, route=r), r.listen_host,
                                                r.listen_port, reuse_address=True)
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close() -> None:
            for s in self._servers:
                s.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route) -> None:
        task = self._loop.create_task(self._connection(reader, writer, route))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route) -> None:
        peer = writer.get_extra_info("peername")
        link = self.link_of(peer[0] if peer else "")
        try:
            t_reader, t_writer = await asyncio.open_connection(route.target_host, route.target_port)
        except OSError as exc:
            log.warning("relay %s:%d -> %s:%d: %s", route.listen_host, route.listen_port,
                        route.target_host, route.target_port, exc)
            writer.close()
            return
        counts = self.bytes.setdefault(peer[0] if peer else "", [0, 0])
        delay = link.rtt / 2 if link else 0.0
        up = link.up_bps if link and self.pace else None
        down = link.down_bps if link and self.pace else None
        try:
            await asyncio.gather(_delay_line(reader, t_writer, delay, up, counts, 0),
                                 _delay_line(t_reader, writer, delay, down, counts, 1))
        finally:
            for w in (writer, t_writer):
                w.close()


async def _delay_line(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float, bps: float | None,
                      counts: list[int], direction: int) -> None:
    loop = asyncio.get_running_loop()
    # Bounded: a slow far side holds the reader back (TCP backpressure) instead of memory.
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=256)
    chunk = _PACED_CHUNK if bps else _CHUNK

    async def reading() -> None:
        try:
            while data := await src.read(chunk):
                await queue.put((loop.time() + delay, data))
        except (ConnectionError, OSError):
            pass
        await queue.put((loop.time() + delay, b""))

    reader_task = loop.create_task(reading())
    free_at = 0.0  # when the paced link finishes sending what it was given
    try:
        while True:
            due, data = await queue.get()
            if not data:
                break
            if bps:
                # Serialization then propagation: the chunk leaves the link when the
                # bytes before it have, at the link's rate.
                free_at = max(free_at, due - delay) + len(data) * 8 / bps
                due = free_at + delay
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            dst.write(data)
            counts[direction] += len(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (ConnectionError, OSError):
        reader_task.cancel()
    finally:
        await asyncio.gather(reader_task, return_exceptions=True)
