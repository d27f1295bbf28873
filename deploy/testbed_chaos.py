"""``hermes-testbed --chaos``: the schedule of faults a testbed run injects.

``--chaos`` injects faults on a schedule: SIGKILL an agent (and start it
again later), or SIGKILL the server and restart it with ``--resume`` from
the run's checkpoints. Each step fires at a time after the agents started
(``@SECONDS``) or once the model reaches a version (``@vN``); the testbed
(:meth:`hermes.deploy.testbed.Testbed.run_chaos`) fires them in the order
given, and its summary records what was done and the model version before
the kill and after the resume.

``--churn`` makes agents leave and come back for the whole run
(``parse_churn``: a schedule, or a random availability model); the testbed's
``ChurnDriver`` stops each leaving agent with SIGKILL or SIGTERM wherever it
is (mid-cycle, mid-push, held at a barrier) and starts it again under the same
name, and ``check_journal`` checks afterwards that nothing accepted was lost.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChaosStep:
    at: float  # seconds after the agents started, or
    action: str  # kill-agent | restart-agent | kill-server
    agent: int = 0  # 1-based index for the agent actions
    at_version: int | None = None  # ... once the model reaches this version (``@vN``)

    def due(self, elapsed: float, version: int | None) -> bool:
        if self.at_version is not None:
            return version is not None and version >= self.at_version
        return elapsed >= self.at


_WHEN = r"@(v\d+|[0-9.]+)$"
_CHAOS = re.compile(r"^(kill-agent|restart-agent):(\d+)" + _WHEN + r"|^(kill-server)" + _WHEN)


def _when(text: str) -> dict[str, Any]:
    return {"at": 0.0, "at_version": int(text[1:])} if text.startswith("v") else {"at": float(text)}


def parse_chaos(items: list[str], clients: int) -> list[ChaosStep]:
    steps = []
    for item in items:
        m = _CHAOS.match(item.strip())
        if not m:
            raise ValueError(f"{item!r}: expected kill-agent:N@WHEN, restart-agent:N@WHEN or kill-server@WHEN, "
                             "WHEN being seconds after the agents started or vN (once the model reaches version N)")
        if m.group(1):
            n = int(m.group(2))
            if not 1 <= n <= clients:
                raise ValueError(f"{item!r}: agent {n} not in 1..{clients}")
            steps.append(ChaosStep(action=m.group(1), agent=n, **_when(m.group(3))))
        else:
            steps.append(ChaosStep(action="kill-server", **_when(m.group(5))))
    return steps



# ---- churn: agents that leave and come back (``--churn``, issue 28; docs/churn.md) ----------------

_SIGNALS = ("SIGKILL", "SIGTERM")


@dataclass(frozen=True)
class ChurnEvent:
    at: float  # seconds after the agents started
    agent: int  # 1-based
    action: str  # leave | join
    signal: str = ""  # leave: SIGKILL (no goodbye) or SIGTERM (the agent leaves)


_SCHEDULE_STEP = re.compile(r"^(leave|kill|term|join)@([0-9.]+)$")
_RANDOM_KEYS = {"offline": float, "mean_spell": float, "seed": int}


def parse_churn(spec: str, clients: int, horizon: float) -> list[ChurnEvent]:
    """``--churn SPEC``: the leave and join events of a run, in time order.

    A schedule ``N:leave@T,join@T;M:kill@T,...`` (``leave`` takes SIGKILL and
    SIGTERM in turn, in time order; ``kill`` and ``term`` name the signal), or a random
    availability model ``random:offline=F,mean_spell=S,seed=K``: each agent
    alternates online and offline spells, both exponential, offline ones of
    mean S and online ones of mean S (1 - F) / F, so it is offline a fraction F
    of the time in the long run; each leave's signal is drawn at random.
    Events past ``horizon`` (the run's time limit) are dropped.
    """
    spec = spec.strip()
    if spec.startswith("random:"):
        return _random_churn(spec[len("random:"):], clients, horizon)
    events: list[ChurnEvent] = []
    leaves = 0
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        agent_text, sep, steps = part.partition(":")
        if not sep or not agent_text.strip().isdigit():
            raise ValueError(f"{part!r}: expected N:leave@T,join@T (N an agent, T seconds after the agents started)")
        agent = int(agent_text)
        if not 1 <= agent <= clients:
            raise ValueError(f"{part!r}: agent {agent} not in 1..{clients}")
        online = True
        for step in filter(None, (s.strip() for s in steps.split(","))):
            m = _SCHEDULE_STEP.match(step)
            if not m:
                raise ValueError(f"{step!r}: expected leave@T, kill@T, term@T or join@T")
            action, at = m.group(1), float(m.group(2))
            if (action == "join") == online:
                raise ValueError(f"{part!r}: agent {agent} must leave and join in turn, starting online")
            online = action == "join"
            if action == "join":
                events.append(ChurnEvent(at, agent, "join"))
            else:
                events.append(ChurnEvent(at, agent, "leave", {"kill": "SIGKILL", "term": "SIGTERM"}.get(action, "")))
    if not events:
        raise ValueError(f"{spec!r}: no churn events")
    out = []
    for e in sorted(events, key=lambda e: (e.at, e.agent)):
        if e.action == "leave" and not e.signal:  # leave: SIGKILL and SIGTERM in turn, in time order
            e, leaves = ChurnEvent(e.at, e.agent, "leave", _SIGNALS[leaves % 2]), leaves + 1
        if e.at <= horizon:
            out.append(e)
    return out


def _random_churn(text: str, clients: int, horizon: float) -> list[ChurnEvent]:
    import random

    params: dict[str, float] = {"offline": 0.2, "mean_spell": 10.0, "seed": 0}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _RANDOM_KEYS:
            raise ValueError(f"{item!r}: expected offline=F, mean_spell=S or seed=K")
        try:
            params[key] = _RANDOM_KEYS[key](value)
        except ValueError:
            raise ValueError(f"{item!r}: {key} must be a number") from None
    offline, spell = params["offline"], params["mean_spell"]
    if not 0.0 < offline < 1.0 or not spell > 0.0:
        raise ValueError(f"random churn needs 0 < offline < 1 and mean_spell > 0, got {offline} and {spell}")
    online_mean = spell * (1.0 - offline) / offline
    events = []
    for agent in range(1, clients + 1):
        # One stream per agent: adding an agent does not move the others' spells.
        rng = random.Random(int(params["seed"]) * 100_003 + agent)
        t = rng.expovariate(1.0 / online_mean)
        while t < horizon:
            events.append(ChurnEvent(round(t, 3), agent, "leave", rng.choice(_SIGNALS)))
            t += rng.expovariate(1.0 / spell)
            if t >= horizon:
                break
            events.append(ChurnEvent(round(t, 3), agent, "join"))
            t += rng.expovariate(1.0 / online_mean)
    return sorted(events, key=lambda e: (e.at, e.agent))


def offline_fractions(log: list[dict[str, Any]], clients: int, wall: float) -> dict[str, float]:
    """Each agent's share of the run spent stopped, from the churn log (a leave not followed by a join
    lasts to the end)."""
    out = {}
    for agent in range(1, clients + 1):
        down, since = 0.0, None
        for entry in log:
            if entry["agent"] != f"worker-{agent}":
                continue
            if entry["action"] == "leave" and since is None:
                since = entry["at"]
            elif entry["action"] == "join" and since is not None:
                down, since = down + entry["at"] - since, None
        if since is not None:
            down += max(0.0, wall - since)
        out[f"worker-{agent}"] = round(down / wall, 3) if wall > 0 else 0.0
    return out


_ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _journal_versions(path: Path) -> list[int]:
    """The versions of a server journal's complete records (format: server/checkpoint.py ``Journal``)."""
    data = path.read_bytes()
    versions, pos = [], 0
    while pos + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        try:
            head = json.loads(data[pos + 4:pos + 4 + n])
            size = sum(d["numel"] * _ELEMENT_BYTES[d["dtype"]] for d in head["deltas"])
        except (ValueError, KeyError, TypeError):
            break
        end = pos + 4 + n + size + 4
        if end > len(data):
            break
        versions.append(int(head["version"]))
        pos = end
    return versions


def check_journal(events_path: Path, checkpoint_dir: Path, final_version: int | None,
                  workers: list[dict[str, Any]]) -> dict[str, Any]:
    """Nothing accepted is lost: every fold the server acknowledged is in the versions, and the versions in
    the last checkpoint and its journal.

    Checks that the folds (``update_applied`` events) are versions 1..V without a gap, V being the final
    model version; that the last checkpoint's version plus its journal's records reach V without a gap; and
    that the workers' applied counts add up to the updates the folds took. ``ok`` is all of them.
    """
    folds: list[int] = []
    contributions = 0
    for line in events_path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "update_applied":
            folds.append(int(e["version"]))
            contributions += len(e.get("workers") or ())
    out: dict[str, Any] = {"final_version": final_version, "folds": len(folds), "contributions": contributions,
                           "workers_applied": sum(int(w.get("applied", 0)) for w in workers)}
    problems = []
    if final_version is None:
        problems.append("no final version")
    elif sorted(folds) != list(range(1, final_version + 1)):
        problems.append(f"folds are not versions 1..{final_version}")
    if out["workers_applied"] != contributions:
        problems.append(f"workers' applied counts add up to {out['workers_applied']}, the folds took {contributions}")
    meta = checkpoint_dir / "checkpoint.json"
    if meta.is_file():
        version = int(json.loads(meta.read_text())["version"])
        journal = checkpoint_dir / f"journal-{version}.log"
        records = _journal_versions(journal) if journal.is_file() else []
        out |= {"checkpoint_version": version, "journal_records": len(records)}
        if records != list(range(version + 1, version + 1 + len(records))):
            problems.append(f"journal-{version}.log is not versions {version + 1}.. in order")
        elif final_version is not None and version + len(records) != final_version:
            problems.append(f"checkpoint {version} + {len(records)} journaled != final version {final_version}")
    else:
        problems.append("no checkpoint")
    out["problems"] = problems
    out["ok"] = not problems
    return out


class ChurnDriver:
    """Fires the churn events that are due; the testbed supplies how an agent is stopped and started.

    ``stop(agent, signal)`` signals the agent's process (True when it was running); ``start(agent)``
    starts it again under the same name (a process still shutting down after its SIGTERM is killed
    first). Each event fired goes to ``log`` with the model version it met.
    """

    def __init__(self, events: list[ChurnEvent], *, stop: Callable[[int, str], bool],
                 start: Callable[[int], None], version: Callable[[], int | None], finite: bool = False) -> None:
        self.pending = list(events)
        # A schedule ends; the random model's events go on to the time limit.
        self.finite = finite
        self.stop, self.start, self.version = stop, start, version
        self.log: list[dict[str, Any]] = []

    def tick(self, elapsed: float) -> list[dict[str, Any]]:
        fired = []
        while self.pending and self.pending[0].at <= elapsed:
            ev = self.pending.pop(0)
            entry: dict[str, Any] = {"action": ev.action, "agent": f"worker-{ev.agent}", "at": round(elapsed, 3),
                                     "planned": ev.at, "version": self.version()}
            if ev.action == "leave":
                entry |= {"signal": ev.signal, "was_running": self.stop(ev.agent, ev.signal)}
            else:
                self.start(ev.agent)
            log.info("churn: %s worker-%d at %.1fs%s", ev.action, ev.agent, elapsed,
                     f" ({ev.signal})" if ev.signal else "")
            self.log.append(entry)
            fired.append(entry)
        return fired
