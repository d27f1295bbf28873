"""Transfer times on a device's link and on the server's own link, shared by every device.

A link is a bandwidth each way and a round-trip time, as the testbed's
emulated links (:mod:`hermes.deploy.links`): there a relay delays each
direction by RTT/2 and paces it at the link's rate, so one message of
``nbytes`` arrives RTT/2 plus its serialization time after it was sent. A
request and its reply are two transfers: one RTT in all. TCP's slow start and
losses are not modelled (docs/simulation-populations.md lists the deviations).

What a shaped link carries is more than the message: each TCP segment of at most
``MSS`` bytes goes with ``HEADER_BYTES`` of Ethernet, IP and TCP headers, and the
testbed's tbf counts them (it meters the packet, headers included), as a real
uplink's rate does. ``framed_transfer_seconds`` charges them (``--framing tcp``);
``transfer_seconds`` the message alone.
"""

from __future__ import annotations

import math
from typing import Literal

Direction = Literal["up", "down"]

# Linux's TCP over Ethernet: a 1,500-byte MTU less 20 bytes of IPv4, 20 of TCP and 12 of the timestamps option
# (on by default) leaves 1,448 bytes of payload a segment; each segment is 1,514 bytes on the wire with the
# 14-byte Ethernet header: 66 bytes, 4.6%, that a shaped link's rate is spent on besides the message.
MSS = 1448
HEADER_BYTES = 66


def wire_bytes(nbytes: int) -> int:
    """The bytes a link carries for a message of ``nbytes``: its TCP segments with their headers."""
    return nbytes + HEADER_BYTES * -(-nbytes // MSS)


def serialization_seconds(nbytes: int, mbps: float) -> float:
    """Seconds to put ``nbytes`` on a link of ``mbps`` megabits per second (math.inf: no time)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if not mbps > 0:
        raise ValueError(f"bandwidth must be positive, got {mbps} Mbit/s")
    if math.isinf(mbps):
        return 0.0
    return nbytes * 8 / (mbps * 1e6)


def transfer_seconds(nbytes: int, mbps: float, rtt_s: float) -> float:
    """One message, one direction: half the round trip plus serialization at the link's rate.

    The testbed's relay does exactly this per direction (deploy/links.py,
    ``_delay_line``: due = sent + RTT/2, paced at the rate), so a push and
    its reply cost ``transfer_seconds(push) + transfer_seconds(reply)``,
    one RTT plus both serializations.
    """
    if rtt_s < 0:
        raise ValueError(f"rtt must be >= 0, got {rtt_s}")
    return rtt_s / 2 + serialization_seconds(nbytes, mbps)


def framed_transfer_seconds(nbytes: int, mbps: float, rtt_s: float) -> float:
    """``transfer_seconds`` of the message's bytes on the wire (``wire_bytes``): what the testbed's tbf meters.

    The testbed's lte exchanges measured it: a hermes agent's overlapped push of 434 KB and the 434 KB model in
    its reply took 0.536-0.548 s in flight (the agents' "overlapped exchanges" log lines, 2026-11-28), against
    0.514 s for the bytes alone (0.348 up + 0.116 down + one 50 ms RTT) and 0.535 s framed.
    """
    return transfer_seconds(wire_bytes(nbytes), mbps, rtt_s)


class ServerLink:
    """The server's own link: each direction a FIFO queue at its rate, shared by all devices.

    ``reserve(t, nbytes, direction)`` puts a transfer that reaches the
    server's link at virtual time ``t`` behind the ones reserved before it in
    that direction and returns when its last byte is through. Reservations
    are served in call order (the simulator calls in event order, ties by
    device id), so the result is deterministic. Up and down are independent
    (full duplex). ``math.inf`` bandwidth: the link never queues.
    """

    def __init__(self, up_mbps: float, down_mbps: float, *, framed: bool = False) -> None:
        for name, v in (("up_mbps", up_mbps), ("down_mbps", down_mbps)):
            if not v > 0:
                raise ValueError(f"{name} must be positive, got {v}")
        self.mbps: dict[Direction, float] = {"up": up_mbps, "down": down_mbps}
        self.framed = framed  # the link carries the messages' TCP segments with their headers (wire_bytes)
        self.free_at: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        self.busy_seconds: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        self.bytes: dict[Direction, int] = {"up": 0, "down": 0}
        self.queued_seconds: dict[Direction, float] = {"up": 0.0, "down": 0.0}

    def reserve(self, t: float, nbytes: int, direction: Direction) -> float:
        if direction not in self.mbps:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        duration = serialization_seconds(wire_bytes(nbytes) if self.framed else nbytes, self.mbps[direction])
        start = max(t, self.free_at[direction])
        finish = start + duration
        self.free_at[direction] = finish
        self.busy_seconds[direction] += duration
        self.queued_seconds[direction] += start - t
        self.bytes[direction] += nbytes
        return finish

    def stats(self) -> dict[str, float]:
        """Totals for the summary: bytes, busy and queueing seconds per direction."""
        return {f"{k}_{d}": float(v[d]) for k, v in (("bytes", self.bytes), ("busy_s", self.busy_seconds),
                                                    ("queued_s", self.queued_seconds)) for d in ("up", "down")}
