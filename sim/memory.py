"""What the simulated devices hold in memory, by what they are doing (issue 27: "an idle device keeps no model
copy that its policy does not need").

Every ``SAMPLE_EVERY_S`` virtual seconds the devices are counted in three
states: *training* (registered, online, holding a training slot, or every
registered device when nothing bounds concurrency), *waiting* (registered and
online without a slot: ``concurrency.limit``'s queue) and *idle* (offline or
not registered). For each state: how many devices reference a model version
(the weights of a version are held once in ``VersionStore``, whoever
references it), and the bytes each state's devices hold of their own: own
weights, the weights an overlapped push carried, a proximal anchor that is not
a version, optimizer state, prefetched samples, the push codec's error-feedback residual. The sample with the most
device-held bytes is kept (``summary["sim"]["device_memory"]``); so is a count at the stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hermes.sim.device import SimDevice
    from hermes.sim.run import Simulation

__all__ = ["SAMPLE_EVERY_S", "keep_larger", "sample", "sampler"]

# Virtual seconds between two counts (one pass over the devices each: 10,000 devices, about 20 ms).
SAMPLE_EVERY_S = 5.0
STATES = ("training", "waiting", "idle")


def _nbytes(tensors: Iterable[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def own_bytes(d: SimDevice) -> dict[str, int]:
    """Bytes this device holds of its own (not shared with another device), by kind."""
    opt = 0 if d.opt_state is None else sum(_nbytes(s.values()) for s in d.opt_state.values())
    data = sum(_nbytes((w.x, w.y)) for w in d.works) + (0 if d.carry is None else _nbytes(d.carry))
    anchor = d.anchor if d.anchor is not None and all(d.anchor is not v for v in d.sim.versions.flat.values()) else None
    # compression.push with error feedback: what the codec dropped, kept for the next push (a model's size).
    residual = getattr(d.push_codec, "residual", None)
    return {"weights": _nbytes((d.local,)), "pushed": _nbytes((d.inflight_pushed,)), "anchor": _nbytes((anchor,)),
            "optimizer": opt, "samples": data, "codec": _nbytes((residual,))}


def state_of(d: SimDevice, sim: Simulation, now: float) -> str:
    if not d.worker_id or d.worker_id not in sim.driver.active or not d.profile.availability.online(now):
        return "idle"
    admission = sim.engine.admission
    # By the holders, not by ``open``: a stop opens the admission for everyone held.
    return "training" if admission.limit <= 0 or d.worker_id in admission.holders else "waiting"


def sample(sim: Simulation) -> dict[str, Any]:
    """One count of every device: per state, devices, those referencing a version, bytes held by kind."""
    now = sim.driver.now()
    out: dict[str, Any] = {s: {"devices": 0, "with_version": 0, "bytes": {}} for s in STATES}
    for d in sim.devices:
        row = out[state_of(d, sim, now)]
        row["devices"] += 1
        row["with_version"] += d.version is not None
        for kind, n in own_bytes(d).items():
            row["bytes"][kind] = row["bytes"].get(kind, 0) + n
    for row in out.values():
        row["bytes_per_device"] = round(sum(row["bytes"].values()) / row["devices"]) if row["devices"] else 0
    out["at_virtual_s"] = round(now, 3)
    out["versions_held"] = len(sim.versions.flat)
    out["version_bytes"] = _nbytes(sim.versions.flat.values())
    out["device_bytes"] = sum(sum(out[s]["bytes"].values()) for s in STATES)
    return out


def keep_larger(keep: dict[str, Any], got: dict[str, Any]) -> None:
    """``keep`` becomes ``got`` when it holds more (device-held and version bytes) or is empty."""
    if not keep or got["device_bytes"] + got["version_bytes"] > keep["device_bytes"] + keep["version_bytes"]:
        keep.clear()
        keep.update(got)


async def sampler(sim: Simulation, keep: dict[str, Any]) -> None:
    """Counts at each SAMPLE_EVERY_S until the run stops; ``keep`` gets the count with the most bytes."""
    while not sim.over:
        await asyncio.sleep(SAMPLE_EVERY_S)
        if not sim.over:
            keep_larger(keep, sample(sim))
