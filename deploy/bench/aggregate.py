"""From run summaries to the figures the report shows: pure functions (``event_figures``
alone reads a file: a run's event log, when the run is collected).

Every number in ``report.md`` comes from here, computed from ``results.json``
alone, so a report can be re-rendered and checked against the summaries.
Time to target counts only runs that reached the target; how many did is
always shown next to it, and a variant that never reached it gets no
speed-up number but a statement that it missed.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes.common.messages import batch_size_of

# Metrics per run, in the order the main table shows them.
METRICS = ("seconds_to_target", "train_seconds_to_target", "wall_seconds", "iterations", "model_updates",
           "messages_total", "model_messages", "mb_total", "wi_mean", "final_accuracy", "best_accuracy")


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float
    n: int


def spread(xs: list[float | None]) -> Spread | None:
    vals = [float(x) for x in xs if x is not None]
    if not vals:
        return None
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def suite_cells(suite: dict[str, Any]) -> list[str]:
    """The suite's columns of runs: each profile, and ``PROFILE@LINK`` for every link but lan."""
    return [p if link == "lan" else f"{p}@{link}" for p in suite["profiles"] for link in suite.get("links", ["lan"])]


def event_figures(path: Path) -> dict[str, Any]:
    """Timings from a run's event log that its summary does not carry.

    ``train_seconds_to_target`` runs from the last agent's join (each
    agent's first: a rejoin after a restart is not a start) to the evaluation
    that reached the target, issue 17's "seconds of training": seconds to
    target without the agents' start-up (process start, torch import,
    registration), which on a small machine is several seconds and the same
    for every preset. The DDP peer's clock starts once every rank joined
    too. ``train_start_elapsed`` is that join on the server's clock (the one
    ``accuracy_timeline[*].elapsed`` uses), so timelines can start at it.
    """
    try:
        events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return {}
    counts: dict[str, int] = {}
    for e in events:
        counts[e.get("event", "?")] = counts.get(e.get("event", "?"), 0) + 1
    # Each worker's first join (a rejoin after a restart is not a start); the earliest of them is the first join.
    first_joins: dict[Any, float] = {}
    for e in events:
        if e.get("event") == "join":
            first_joins.setdefault(e.get("worker"), e["ts"])
    joins = list(first_joins.values())
    applied = [e["ts"] for e in events if e.get("event") == "update_applied"]
    reached = next((e for e in events if e.get("event") == "target_reached"), None)
    start = next((e["ts"] for e in events if e.get("event") == "testbed_start"), None)
    # The server's clock origin, from any event that carries both clocks.
    origin = next((e["ts"] - e["elapsed"] for e in events
                   if e.get("event") == "evaluation" and e.get("elapsed") is not None), None)
    out: dict[str, Any] = {"event_counts": counts, "resizes": counts.get("resize", 0)}
    if joins and start is not None:
        out["first_join_after_start"] = round(min(joins) - start, 3)
    if joins and origin is not None:
        out["first_join_elapsed"] = round(min(joins) - origin, 3)
        out["train_start_elapsed"] = round(max(joins) - origin, 3)
    if joins and applied:
        out["first_update_after_join"] = round(min(applied) - min(joins), 3)
    if reached is not None and joins:
        # The evaluation that reached the target (seconds_to_target ends there too), else when the testbed saw it.
        ev = next((e for e in events if e.get("event") == "evaluation" and e.get("version") == reached.get("version")
                   and e.get("accuracy") == reached.get("accuracy")), reached)
        out["train_seconds_to_target"] = round(ev["ts"] - max(joins), 3)
    return out


def train_origin(record: dict[str, Any]) -> float:
    """Where a run's training starts on the server's clock: the last agent's join (older results: the first)."""
    ev = record.get("events") or {}
    return float(ev.get("train_start_elapsed", ev.get("first_join_elapsed")) or 0.0)


def run_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """The per-run figures of one ``results.json`` run record (its summary and event figures)."""
    s = record.get("summary") or {}
    ev = record.get("events") or {}
    workers = s.get("workers") or []
    wis = [w["wi"] for w in workers if w.get("wi") is not None]
    by_type = s.get("messages_by_type") or {}
    reached = bool(s.get("reached_target"))
    return {
        "reached": reached,
        "seconds_to_target": s.get("seconds_to_target") if reached else None,
        # The DDP peer has no event log: it measures the same span itself (from its ranks' join).
        "train_seconds_to_target": ev.get("train_seconds_to_target", s.get("train_seconds_to_target"))
        if reached else None,
        "wall_seconds": s.get("wall_seconds"),
        # Local training cycles over all workers: the "iterations" of Hermes Table III.
        "iterations": sum(w.get("cycles", 0) or 0 for w in workers),
        "model_updates": s.get("model_updates"),
        "messages_total": s.get("messages_total"),
        # The model exchange alone (what Hermes' gate saves); the rest is shard and bookkeeping traffic.
        "model_messages": sum(by_type.get(k, 0) for k in ("push_update", "pull_model")),
        "mb_total": ((s.get("bytes_sent_total") or 0) + (s.get("bytes_received_total") or 0)) / 1e6,
        "mb_sent": (s.get("bytes_sent_total") or 0) / 1e6,
        "mb_received": (s.get("bytes_received_total") or 0) / 1e6,
        "wi_mean": statistics.fmean(wis) if wis else None,
        "final_accuracy": s.get("final_accuracy"),
        "best_accuracy": s.get("best_accuracy"),
    }


def cycle_seconds(worker: dict[str, Any]) -> list[float]:
    """Compute seconds of each local cycle a worker logged (slowdown included)."""
    # Files without the field list predate it; their third column was the batch size.
    fields = worker.get("cycle_log_fields") or ["elapsed", "dss", "batch_size", "compute_seconds"]
    i = fields.index("compute_seconds")
    return [row[i] for row in worker.get("cycle_log") or [] if len(row) > i and row[i] is not None]


@dataclass
class Group:
    """All repeats of one variant on one profile."""

    profile: str
    label: str
    preset: str
    runs: int = 0
    ok: int = 0
    reached: int = 0
    metrics: dict[str, Spread | None] = field(default_factory=dict)
    per_run: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def ok_runs(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in results.get("runs", []) if r.get("status") == "ok" and r.get("summary")]


def groups(results: dict[str, Any]) -> dict[tuple[str, str], Group]:
    """(profile, variant label) -> its repeats, in the suite's order."""
    suite = results["suite"]
    out: dict[tuple[str, str], Group] = {}
    for profile in suite_cells(suite):
        for v in suite["variants"]:
            out[(profile, v["label"])] = Group(profile, v["label"], v["preset"])
    for r in results.get("runs", []):
        g = out.get((r["profile"], r["variant"]))
        if g is None:
            continue
        g.runs += 1
        if r.get("status") == "ok" and r.get("summary"):
            m = run_metrics(r)
            m["seed"] = r.get("seed")
            g.per_run.append(m)
        else:
            g.failures.append({"seed": r.get("seed"), "error": r.get("error") or r.get("status")})
    for g in out.values():
        g.ok = len(g.per_run)
        g.reached = sum(1 for m in g.per_run if m["reached"])
        g.metrics = {k: spread([m[k] for m in g.per_run]) for k in (*METRICS, "mb_sent", "mb_received")}
    return out


@dataclass(frozen=True)
class Speedup:
    """Baseline median time to target / this variant's, or why there is no number.

    ``status``: ``ok``; ``missed`` (the variant never reached the target);
    ``baseline-missed`` (the baseline never did); ``no-runs``. The min-max
    spread is over the variant's repeats against the baseline's median.
    """

    status: str
    median: float | None = None
    min: float | None = None
    max: float | None = None
    n: int = 0


def speed_key(baseline: Group, g: Group) -> str:
    """The time a speed-up compares: training time from the workers' join (``train s``, issue 17's
    measure: the DDP peer's clock starts there too, after its ranks' start-up), where both sides
    have it; results written before it was recorded fall back to time to target."""
    key = "train_seconds_to_target"
    return key if baseline.metrics.get(key) is not None and g.metrics.get(key) is not None else "seconds_to_target"


def speedup(baseline: Group, g: Group) -> Speedup:
    if g.ok == 0:
        return Speedup("no-runs")
    if g.metrics.get("seconds_to_target") is None:
        return Speedup("missed")
    if baseline.metrics.get("seconds_to_target") is None:
        return Speedup("baseline-missed")
    key = speed_key(baseline, g)
    base, mine = baseline.metrics[key], g.metrics[key]
    assert base is not None and mine is not None  # speed_key picks a key both have
    ratios = [base.median / m[key] for m in g.per_run if m[key]]
    return Speedup("ok", base.median / mine.median, min(ratios), max(ratios), len(ratios))


def speedups(results: dict[str, Any], gs: dict[tuple[str, str], Group] | None = None) -> dict[tuple[str, str], Speedup]:
    base_label = results["suite"].get("baseline")
    gs = gs if gs is not None else groups(results)
    if not base_label:
        return {}
    return {key: speedup(gs[(key[0], base_label)], g) for key, g in gs.items()}


def worker_cycle_stats(results: dict[str, Any], profile: str, label: str) -> list[dict[str, Any]]:
    """Per worker (by name) of one group: its cycle compute seconds pooled over repeats, and final DSS/batch size."""
    by_name: dict[str, dict[str, Any]] = {}
    for r in ok_runs(results):
        if r["profile"] != profile or r["variant"] != label:
            continue
        for w in r["summary"].get("workers") or []:
            d = by_name.setdefault(w["name"], {"name": w["name"], "speed": w.get("speed"), "cycle_seconds": [],
                                               "dss": [], "batch_size": [], "cycles": []})
            d["cycle_seconds"].extend(cycle_seconds(w))
            d["cycles"].append(w.get("cycles", 0))
            d["dss"].append(w.get("dss"))
            d["batch_size"].append(batch_size_of(w))
    return sorted(by_name.values(), key=lambda d: natural_key(d["name"]))


def natural_key(name: str) -> tuple[int, str]:
    """worker-2 before worker-10."""
    return (len(name), name)
