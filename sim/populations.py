"""Device populations for the simulator: the testbed's, the Hermes paper's, generated ones, and FedScale traces.

``build_population(spec, n, seed, link=...)``; ``spec`` is one of

* ``hl1`` ``hl2`` ``hl4`` ``hl8``: the testbed's profiles (:mod:`hermes.deploy.profiles`, the same slowdowns),
  so a simulated run compares 1:1 with ``hermes-testbed``; ``hl8:nominal`` with the profile's speed
  ratios exactly instead of the rates the testbed's agents were measured at;
* ``table2``: the Hermes paper's Table II, 12 workers in five Azure families;
* ``generated`` or ``generated:KEY=VALUE,...``: n devices drawn from the distributions of
  :data:`GENERATED_DEFAULTS` (docs/simulation-populations.md says where each comes from);
* a path: a FedScale-format trace, a ``client_device_capacity`` JSON file or a folder holding it and,
  optionally, ``client_behave_trace.json`` (formats in docs/simulation-populations.md).

``link`` (a testbed link name, :func:`hermes.deploy.links.parse_link`) gives every device that link
instead of its own.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hermes.deploy.links import Link, LinkError, parse_link
from hermes.deploy.profiles import PROFILE_CORES, worker_profiles
from hermes.sim.devices import (
    ALWAYS_ON,
    Availability,
    AvailabilityError,
    DeviceProfile,
    EmpiricalSpells,
    IntervalAvailability,
    TwoStateAvailability,
    churn,
)

log = logging.getLogger(__name__)


class PopulationError(ValueError):
    """A population spec, size or trace file that cannot build a population; the message says which."""


# The testbed agents' effective training FLOP/s on this machine (2 vCPU AMD EPYC, 24 GB), measured from the
# calibration suite's testbed runs (benchmarks/suites/sim-calibration.toml, HL8, mnist1d 20k, the paper's
# CNN size):
#   python benchmarks/sim_calibrate_cost.py device-flops runs/sim-calibration
# times the task's training FLOPs per sample (mnist1d CNN hidden 320: 953,600 by torch.utils.flop_counter,
# forward + backward). The rates move with the machine's load (why is not established: contention for
# the shared cores' caches and clock is a guess): 1.17e9 / 4.31e9 at load average 17-25 (2026-11-27 13:57-15:05 UTC, 30 runs), 2.38e9 / 6.94e9 at
# load 2-16 (2026-11-27 16:48-17:02 UTC, lan bsp, hermes and hermes-paper, 9 runs: these constants; raw
# figures in docs/bench/sim-calibration/device-flops-1648.json, the earlier ones in device-flops.json).
# A simulated run compares 1:1 only with testbed runs taken at a like load (docs/simulation.md#calibration).
# The unslowed agent: samples / compute_seconds, wall time shared with the server and the other agents
# on two cores (median over runs).
TESTBED_FAST_FLOPS = 2.379e9
# A slowed agent sleeps (slowdown - 1) x its step's CPU time (client/trainer.py, _work_seconds), so it
# runs at its thread's CPU-time rate divided by the slowdown: median of samples * slowdown /
# compute_seconds over the slowed agents.
TESTBED_THREAD_FLOPS = 6.940e9
# Testbed agents share the machine's memory: each reports what is available (client/memory_probe.py).
TESTBED_MEMORY_MB = 22_000.0

# Hermes Table II (paper 004, Sec. V-A): family, quantity, vCPUs, RAM GB.
TABLE2: tuple[tuple[str, int, int, int], ...] = (
    ("B1ms", 2, 1, 2),
    ("F2s_v2", 3, 2, 4),
    ("DS2_v2", 3, 2, 7),
    ("E2ds_v4", 2, 2, 16),
    ("F4s_v2", 2, 4, 8),
)
# Table II gives vCPUs, not speeds: each vCPU counts as one uncontended training thread of this machine
# (an assumption; per-core speeds of the families differ by their CPU generations, which the paper
# does not report).
TABLE2_FLOPS_PER_VCPU = TESTBED_THREAD_FLOPS

# FedScale's client_device_capacity "computation" is a model's inference latency in ms per sample
# (fedscale/cloud/internal/client_metadata.py); training takes 3x (forward + 2x backward), as FedScale
# models it. Which model the latencies were measured on is not in the file: we assume a
# MobileNet-V2-class network, 0.3 G multiply-adds = 0.6 GFLOP forward per sample (assumption), so the
# device's training FLOP/s = 3 * 0.6e9 / (3 * ms / 1000) = 0.6e9 / (ms / 1000).
FEDSCALE_REFERENCE_FORWARD_FLOPS = 0.6e9
# Not in FedScale's files: RTT and memory of a trace device (assumptions; --link overrides the RTT).
FEDSCALE_DEFAULT_RTT_S = 0.05
FEDSCALE_DEFAULT_MEMORY_MB = 4096.0
CAPACITY_FILE = "client_device_capacity.json"
BEHAVE_FILE = "client_behave_trace.json"
# A small synthetic trace in those formats (generate_fedscale_sample), shipped with the package.
SAMPLE_TRACE = Path(__file__).resolve().parent / "traces" / "sample"


@dataclass(frozen=True)
class GeneratedSpec:
    """The distributions of a generated population (docs/simulation-populations.md: sources)."""

    # Compute: log-normal around a median. sigma 0.6: FedScale's log-normal device-speed model
    # (client_metadata.get_completion_time_lognormal, tail_skew=0.6, after Papaya). The median is an
    # assumption: a phone-class device at 1 GFLOP/s of training throughput.
    flops: float = 1e9
    flops_sigma: float = 0.6
    # Links: log-normal around deploy/links.py's lte figures (10 Mbit/s up, 30 down, 50 ms: a typical
    # urban LTE pair); the spreads are assumptions.
    up_mbps: float = 10.0
    down_mbps: float = 30.0
    bw_sigma: float = 0.8
    rtt_s: float = 0.05
    rtt_sigma: float = 0.4
    # Churn: offline this share of the time in exponential spells of this mean (assumptions; issue 27:
    # "each device offline about a fifth of the time in random spells"). offline=0: always on.
    offline: float = 0.2
    mean_off_s: float = 60.0


GENERATED_DEFAULTS = GeneratedSpec()
# Phone RAM tiers and their shares (assumption: a mid-2020s Android fleet).
MEMORY_TIERS_MB: tuple[tuple[float, float], ...] = ((2048, 0.10), (3072, 0.15), (4096, 0.30), (6144, 0.25),
                                                   (8192, 0.15), (12288, 0.05))


def build_population(spec: str, n: int | None, seed: int, *, link: str | None = None) -> list[DeviceProfile]:
    """The devices of ``spec`` (module docstring); ``n`` None: the spec's own size (4, 12, the trace's)."""
    if n is not None and (isinstance(n, bool) or n <= 0):
        raise PopulationError(f"number of devices must be positive, got {n}")
    try:
        override = parse_link(link) if link else None
    except LinkError as exc:
        raise PopulationError(str(exc)) from None
    name = spec.strip()
    key = name.lower()
    if key.partition(":")[0] in PROFILE_CORES:
        base, _, mode = key.partition(":")
        if mode not in ("", "nominal"):
            raise PopulationError(f"population {spec!r}: the testbed profiles take no option but ':nominal'")
        devices = testbed_population(base, n or 4, nominal=mode == "nominal")
    elif key == "table2":
        devices = table2_population(n)
    elif key == "generated" or key.startswith("generated:"):
        if n is None:
            raise PopulationError("a generated population needs a number of devices")
        devices = generated_population(n, seed, parse_generated(name.partition(":")[2]))
    elif Path(name).exists():
        devices = trace_population(Path(name), n, seed)
    else:
        raise PopulationError(f"unknown population {spec!r}: expected hl1, hl2, hl4, hl8, table2, "
                              "generated[:KEY=VALUE,...] or the path of a FedScale trace file or folder")
    return [with_link(d, override) for d in devices] if override else devices


def link_mbps(bps: float | None) -> float:
    return math.inf if bps is None else bps / 1e6


def with_link(device: DeviceProfile, link: Link) -> DeviceProfile:
    return replace(device, up_mbps=link_mbps(link.up_bps), down_mbps=link_mbps(link.down_bps), rtt_s=link.rtt)


def testbed_population(profile: str, n: int, *, nominal: bool = False) -> list[DeviceProfile]:
    """The testbed's agents: the same slowdowns (deploy/profiles.py), unshaped links (the testbed's lan).

    As the testbed runs them (default): an unslowed agent at TESTBED_FAST_FLOPS, a slowed one at
    TESTBED_THREAD_FLOPS / slowdown, the rates the testbed's agents were measured at (the testbed's
    slowdown multiplies CPU time, and the unslowed agent shares two cores with four processes, so HL8's
    fastest-to-slowest ratio there is about 2.5, not 8). ``nominal``: every agent at
    TESTBED_FAST_FLOPS / slowdown, the profile's ratios exactly.
    """
    def flops(slowdown: float) -> float:
        if nominal or slowdown == 1.0:
            return TESTBED_FAST_FLOPS / slowdown
        return TESTBED_THREAD_FLOPS / slowdown

    return [DeviceProfile(device_id=f"worker-{wp.index + 1}", family=f"{profile}-{wp.cores}c",
                          flops=flops(wp.slowdown), memory_mb=TESTBED_MEMORY_MB,
                          up_mbps=math.inf, down_mbps=math.inf, rtt_s=0.0, availability=ALWAYS_ON)
            for wp in worker_profiles(profile, n)]


def table2_population(n: int | None = None) -> list[DeviceProfile]:
    """Hermes Table II's 12 workers, family by family in the table's order; n != 12 repeats the pattern."""
    pattern = [(fam, vcpu, ram) for fam, qty, vcpu, ram in TABLE2 for _ in range(qty)]
    count = len(pattern) if n is None else n
    out = []
    for i in range(count):
        fam, vcpu, ram = pattern[i % len(pattern)]
        out.append(DeviceProfile(device_id=f"worker-{i + 1}", family=fam, flops=vcpu * TABLE2_FLOPS_PER_VCPU,
                                 memory_mb=ram * 1024.0, up_mbps=math.inf, down_mbps=math.inf, rtt_s=0.0,
                                 availability=ALWAYS_ON))
    return out


def parse_generated(options: str) -> GeneratedSpec:
    """``offline=0.2,mean_off_s=60,flops=1e9`` -> a GeneratedSpec with those fields replaced."""
    changes: dict[str, float] = {}
    fields = GeneratedSpec.__dataclass_fields__
    for part in filter(None, (p.strip() for p in options.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise PopulationError(f"generated population option {part!r}: expected KEY=VALUE with KEY one of "
                                  f"{', '.join(fields)}")
        try:
            changes[key] = float(value)
        except ValueError:
            raise PopulationError(f"generated population option {part!r}: {value!r} is not a number") from None
    spec = replace(GENERATED_DEFAULTS, **changes)
    positive = ("flops", "up_mbps", "down_mbps", "mean_off_s")
    bad = [k for k in positive if not getattr(spec, k) > 0]
    bad += [k for k in ("flops_sigma", "bw_sigma", "rtt_sigma", "rtt_s") if not getattr(spec, k) >= 0]
    if not 0 <= spec.offline < 1:
        bad.append("offline (a share in [0, 1))")
    if bad:
        raise PopulationError(f"generated population: out of range: {', '.join(bad)}")
    return spec


def generated_population(n: int, seed: int, spec: GeneratedSpec = GENERATED_DEFAULTS, *,
                         spells: EmpiricalSpells | None = None) -> list[DeviceProfile]:
    """n devices drawn independently from ``spec``'s distributions; the same seed, the same devices.

    ``spells`` (e.g. :func:`trace_spells` of a FedScale behaviour trace): on/off spell lengths
    resampled from those instead of ``spec``'s exponential churn.

    Device i's draws do not depend on n (each device has its own stream), so
    the first 100 devices of a 1,000-device population are the 100 devices of
    a 100-device one.
    """
    tiers = np.array([m for m, _ in MEMORY_TIERS_MB])
    shares = np.array([s for _, s in MEMORY_TIERS_MB])
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        z = rng.standard_normal(4)
        flops = spec.flops * math.exp(spec.flops_sigma * z[0])
        up = spec.up_mbps * math.exp(spec.bw_sigma * z[1])
        down = spec.down_mbps * math.exp(spec.bw_sigma * z[2])
        rtt = spec.rtt_s * math.exp(spec.rtt_sigma * z[3])
        memory = float(rng.choice(tiers, p=shares / shares.sum()))
        spells_seed = int(rng.integers(2**63))
        if spells is not None:
            availability: Availability = TwoStateAvailability(spells, spells_seed)
        else:
            availability = churn(spec.offline, spec.mean_off_s, spells_seed) if spec.offline > 0 else ALWAYS_ON
        out.append(DeviceProfile(device_id=f"dev-{i:06d}", family="generated", flops=flops, memory_mb=memory,
                                 up_mbps=up, down_mbps=down, rtt_s=rtt, availability=availability))
    return out


# ---- FedScale traces ---------------------------------------------------------------------------------


def _load_json(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PopulationError(f"{path}: not a readable JSON trace ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise PopulationError(f"{path}: expected a non-empty JSON object keyed by client id")
    return data


def _number(path: Path, cid: str, entry: Mapping[str, Any], key: str) -> float:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise PopulationError(f"{path}: client {cid!r}: {key!r} must be a positive number, got {value!r}")
    return float(value)


def behave_availability(path: Path, cid: str, entry: Any) -> IntervalAvailability:
    """FedScale's client_behave_trace entry -> online in [active[i], inactive[i]], repeating every finish_time.

    FedScale's ``ClientMetadata.is_active`` reads a trace that way
    (``norm_time = cur_time % finish_time``).
    """
    if not isinstance(entry, Mapping):
        raise PopulationError(f"{path}: client {cid!r}: expected an object with active, inactive, finish_time")
    active, inactive, finish = entry.get("active"), entry.get("inactive"), entry.get("finish_time")
    if not isinstance(active, list) or not isinstance(inactive, list) or len(active) != len(inactive):
        raise PopulationError(f"{path}: client {cid!r}: active and inactive must be lists of equal length")
    if isinstance(finish, bool) or not isinstance(finish, (int, float)) or not finish > 0:
        raise PopulationError(f"{path}: client {cid!r}: finish_time must be a positive number, got {finish!r}")
    try:
        intervals = tuple((float(a), float(b)) for a, b in zip(active, inactive, strict=True))
        return IntervalAvailability(intervals, period=float(finish))
    except (TypeError, ValueError, AvailabilityError) as exc:
        raise PopulationError(f"{path}: client {cid!r}: {exc}") from None


def trace_spells(path: Path) -> EmpiricalSpells:
    """The on and off spell lengths of every client of a FedScale behaviour trace, pooled.

    Off spells include the wrap from the last ``inactive`` to the next period's first ``active``.
    """
    behave = _load_json(path / BEHAVE_FILE if path.is_dir() else path)
    on: list[float] = []
    off: list[float] = []
    for cid, entry in behave.items():
        avail = behave_availability(path, cid, entry)
        ivs, period = avail.intervals, avail.period or 0.0
        on += [b - a for a, b in ivs]
        off += [c - b for (_, b), (c, _) in zip(ivs, ivs[1:], strict=False) if c > b]
        if ivs and (wrap := period - ivs[-1][1] + ivs[0][0]) > 0:
            off.append(wrap)
    try:
        return EmpiricalSpells(tuple(on), tuple(off))
    except AvailabilityError as exc:
        raise PopulationError(f"{path}: {exc}") from None


def trace_population(path: Path, n: int | None, seed: int) -> list[DeviceProfile]:
    """Devices from a FedScale capacity file (or a folder with it and, optionally, a behaviour trace).

    Clients are taken in the file's order; n larger than the file cycles
    through it (device ids stay distinct), smaller takes the first n.
    """
    capacity_path = path / CAPACITY_FILE if path.is_dir() else path
    behave_path = path / BEHAVE_FILE if path.is_dir() else None
    capacity = _load_json(capacity_path)
    behave = _load_json(behave_path) if behave_path is not None and behave_path.exists() else None
    ids = list(capacity)
    if behave is not None:
        missing = [c for c in ids if c not in behave]
        if missing:
            raise PopulationError(f"{behave_path}: no behaviour trace for client(s) {missing[:5]}")
    count = len(ids) if n is None else n
    out = []
    for i in range(count):
        cid = ids[i % len(ids)]
        entry = capacity[cid]
        ms = _number(capacity_path, cid, entry, "computation")
        kbps = _number(capacity_path, cid, entry, "communication")
        availability = ALWAYS_ON if behave is None else behave_availability(behave_path or path, cid, behave[cid])
        out.append(DeviceProfile(
            device_id=f"client-{cid}" if i < len(ids) else f"client-{cid}-{i // len(ids)}",
            family="fedscale", flops=FEDSCALE_REFERENCE_FORWARD_FLOPS / (ms / 1000.0),
            memory_mb=FEDSCALE_DEFAULT_MEMORY_MB,
            # FedScale has one bandwidth per client, in kbit/s, for both directions.
            up_mbps=kbps / 1000.0, down_mbps=kbps / 1000.0, rtt_s=FEDSCALE_DEFAULT_RTT_S,
            availability=availability))
    return out


def generate_fedscale_sample(out_dir: Path, n: int = 50, seed: int = 0, *, period_s: float = 3600.0,
                             offline: float = 0.2, mean_off_s: float = 60.0) -> tuple[Path, Path]:
    """Write a small synthetic trace in FedScale's formats (as JSON): what ships in sim/traces/sample/.

    Nothing in it is measured: compute latencies are log-normal around 40 ms per sample (sigma 0.6),
    bandwidths around 10 Mbit/s (sigma 0.8), and each client alternates exponential on/off spells,
    offline ``offline`` of the time, over one ``period_s`` that FedScale's reader repeats.
    """
    if n <= 0 or not 0 < offline < 1 or period_s <= 0 or mean_off_s <= 0:
        raise ValueError("n, period_s and mean_off_s must be positive and offline in (0, 1)")
    rng = np.random.default_rng(seed)
    mean_on_s = mean_off_s * (1 - offline) / offline
    capacity: dict[str, dict[str, float]] = {}
    behave: dict[str, dict[str, Any]] = {}
    for cid in range(1, n + 1):
        capacity[str(cid)] = {"computation": round(float(40.0 * math.exp(0.6 * rng.standard_normal())), 3),
                              "communication": round(float(10_000.0 * math.exp(0.8 * rng.standard_normal())), 1)}
        t, online = 0.0, bool(rng.random() >= offline)
        active: list[float] = []
        inactive: list[float] = []
        while t < period_s:
            length = float(rng.exponential(mean_on_s if online else mean_off_s))
            end = min(t + length, period_s)
            if online and end > t:
                active.append(round(t, 3))
                inactive.append(round(end, 3))
            t, online = end, not online
        behave[str(cid)] = {"active": active, "inactive": inactive, "finish_time": period_s,
                            "duration": period_s, "model": "synthetic"}
    out_dir.mkdir(parents=True, exist_ok=True)
    cap_path, behave_path = out_dir / CAPACITY_FILE, out_dir / BEHAVE_FILE
    cap_path.write_text(json.dumps(capacity, indent=0) + "\n")
    behave_path.write_text(json.dumps(behave) + "\n")
    return cap_path, behave_path
