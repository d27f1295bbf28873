"""Transfer times on a device's link and on the server's own link, shared by every device.

A link is a bandwidth each way and a round-trip time, as the testbed's
emulated links (:mod:`hermes.deploy.links`): there a relay delays each
direction by RTT/2 and paces it at the link's rate, so one message of
``nbytes`` arrives RTT/2 plus its serialization time after it was sent. A
request and its reply are two transfers: one RTT in all. TCP's slow start and
losses are not modelled (docs/simulation-populations.md lists the deviations).
"""

from __future__ import annotations

import math
from typing import Literal

Direction = Literal["up", "down"]


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


class ServerLink:
    """The server's own link: each direction a FIFO queue at its rate, shared by all devices.

    ``reserve(t, nbytes, direction)`` puts a transfer that reaches the
    server's link at virtual time ``t`` behind the ones reserved before it in
    that direction and returns when its last byte is through. Reservations
    are served in call order (the simulator calls in event order, ties by
    device id), so the result is deterministic. Up and down are independent
    (full duplex). ``math.inf`` bandwidth: the link never queues.
    """

    def __init__(self, up_mbps: float, down_mbps: float) -> None:
        for name, v in (("up_mbps", up_mbps), ("down_mbps", down_mbps)):
            if not v > 0:
                raise ValueError(f"{name} must be positive, got {v}")
        self.mbps: dict[Direction, float] = {"up": up_mbps, "down": down_mbps}
        self.free_at: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        self.busy_seconds: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        self.bytes: dict[Direction, int] = {"up": 0, "down": 0}
        self.queued_seconds: dict[Direction, float] = {"up": 0.0, "down": 0.0}

    def reserve(self, t: float, nbytes: int, direction: Direction) -> float:
        if direction not in self.mbps:
            raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
        duration = serialization_seconds(nbytes, self.mbps[direction])
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
