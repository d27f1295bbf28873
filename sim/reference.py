"""The two reference populations a comparison needs beside the real one: the fastest device alone, and the
ideal cluster.

* ``fastest_alone``: the device with the most FLOP/s (ties: the smallest device id), by itself. It trains
  on all the data (the engine shards the whole training set over the devices it has) and crosses no link:
  a device training alone talks to nobody, as the testbed bench's ``alone`` row (one DDP rank, no link).
* ``homogeneous``: every device at the population's mean FLOP/s, the same total compute spread evenly, as
  the testbed bench's ``ideal`` row (hl1 at the profile's mean speed); links and availability unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from hermes.sim.devices import ALWAYS_ON, DeviceProfile

__all__ = ["fastest_alone", "homogeneous"]


def fastest_alone(profiles: Sequence[DeviceProfile]) -> list[DeviceProfile]:
    """The fastest device, with no link and always on (a device alone neither sends nor churns a run)."""
    if not profiles:
        return []
    best = min(profiles, key=lambda d: (-d.flops, d.device_id))
    return [replace(best, up_mbps=math.inf, down_mbps=math.inf, rtt_s=0.0, availability=ALWAYS_ON)]


def homogeneous(profiles: Sequence[DeviceProfile]) -> list[DeviceProfile]:
    """Every device at the mean FLOP/s of ``profiles`` (the sum of speeds kept)."""
    if not profiles:
        return []
    mean = sum(d.flops for d in profiles) / len(profiles)
    return [replace(d, flops=mean) for d in profiles]
