"""How many cores this process may actually use: its CPU affinity and its cgroup's CPU quota.

``os.cpu_count()`` is the machine's count, which a container or a
``taskset`` never changes: an agent in a 2-CPU container on a 64-core host
that started 64 torch threads would spend its quota on contention. The
usable count is the smaller of

- the affinity mask (``os.sched_getaffinity``; ``os.cpu_count`` where the
  platform has none), and
- the tightest CPU quota of the process's cgroup and its ancestors,
  rounded up: cgroup v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD"),
  cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none).

Everything reads under ``root`` so tests can build a fake ``/proc`` and
``/sys/fs/cgroup``.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["UsableCores", "cgroup_quota", "usable_cores"]


@dataclass(frozen=True)
class UsableCores:
    count: int
    affinity: int
    # CPUs the cgroup quota allows (quota / period, not rounded); None: no quota.
    quota: float | None

    def hints(self) -> dict[str, float | int]:
        """What the agent tells the server at registration (beside ``threads``)."""
        out: dict[str, float | int] = {"usable_cores": self.count, "affinity_cores": self.affinity}
        if self.quota is not None:
            out["cpu_quota"] = round(self.quota, 3)
        return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_quota(text: str | None) -> float | None:
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(quota_text: str | None, period_text: str | None) -> float | None:
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _ancestors(rel: str) -> list[str]:
    """``/a/b`` -> ``["a/b", "a", ""]``: a quota on any ancestor cgroup binds too."""
    parts = [p for p in rel.strip("/").split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_quota(root: Path = Path("/")) -> float | None:
    """The tightest CPU quota (in CPUs) over this process's cgroup and its ancestors; None: unlimited."""
    text = _read(root / "proc/self/cgroup")
    if text is None:
        return None
    quotas: list[float] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            base = root / "sys/fs/cgroup"
            for sub in _ancestors(rel):
                q = _v2_quota(_read(base / sub / "cpu.max"))
                if q is not None:
                    quotas.append(q)
        elif "cpu" in controllers.split(","):
            # v1: mounted as cpu,cpuacct (or cpu alone); inside a container the
            # process's own path is often not visible, the mount root is.
            for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                base = root / "sys/fs/cgroup" / mount
                if not base.is_dir():
                    continue
                for sub in _ancestors(rel):
                    d = base / sub
                    q = _v1_quota(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
                    if q is not None:
                        quotas.append(q)
                break
    return min(quotas) if quotas else None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def usable_cores(*, affinity: int | None = None, root: Path = Path("/")) -> UsableCores:
    """The cores this process may use: min(affinity, ceil(cgroup quota)), at least 1."""
    aff = affinity if affinity is not None else _affinity()
    quota = cgroup_quota(root)
    count = aff if quota is None else min(aff, math.ceil(quota - 1e-9))
    return UsableCores(count=max(1, count), affinity=aff, quota=quota)
