"""Temporary stand-ins for hermes.sim.devices / hermes.sim.links (branch sim-pop builds them).

Only what the core's tests need, with the interface the two branches agreed on; removed at merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class AlwaysOn:
    def online(self, t: float) -> bool:
        return True

    def next_change(self, t: float) -> float | None:
        return None


ALWAYS_ON = AlwaysOn()


@dataclass(frozen=True)
class Windows:
    """Online in [on, off) windows given as flip times: online before flips[0], offline until flips[1], ..."""

    flips: tuple[float, ...]

    def online(self, t: float) -> bool:
        return sum(1 for f in self.flips if f <= t) % 2 == 0

    def next_change(self, t: float) -> float | None:
        return next((f for f in self.flips if f > t), None)


@dataclass(frozen=True)
class DeviceProfile:
    device_id: str
    family: str
    flops: float
    memory_mb: float = 4096.0
    up_mbps: float = 1000.0
    down_mbps: float = 1000.0
    rtt_s: float = 0.0002
    availability: object = field(default=ALWAYS_ON)


def transfer_seconds(nbytes: int, mbps: float, rtt_s: float) -> float:
    return rtt_s / 2 + nbytes * 8 / (mbps * 1e6)


def hl8(n: int = 4, flops: float = 2e8) -> list[DeviceProfile]:
    """OmniLearn HL8's shape: one device 8x slower than the fastest, the others spread between."""
    slow = [1.0, 2.0, 4.0, 8.0]
    return [DeviceProfile(f"hl8-{i}", "hl8", flops / slow[i % 4]) for i in range(n)]


class FifoLink:
    """The server's link: one FIFO per direction at ``mbps``."""

    def __init__(self, mbps: float) -> None:
        self.mbps = mbps
        self.free = {"up": 0.0, "down": 0.0}

    def reserve(self, t: float, nbytes: int, direction: str) -> float:
        start = max(t, self.free[direction])
        self.free[direction] = start + nbytes * 8 / (self.mbps * 1e6)
        return self.free[direction]
