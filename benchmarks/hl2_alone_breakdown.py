"""Where a cluster's time goes, per agent, in a finished ``hermes-bench`` suite (issue 31, ``hl2-alone``).

    python benchmarks/hl2_alone_breakdown.py runs/hl2-alone [--cells hl2@lte] [--variants hermes,hermes-topk]

For every run: training time to target (from the last agent's join; ``alone``: from its training start) and time
from launch (the cluster: from the agents' launch; ``alone``: from its training process's start, evaluations
left out on both sides as on the training clock), the samples every worker trained on before the target, and
per agent: cycles, compute, waiting (of it: waiting for shard records), seconds an overlapped exchange was in
flight, pushes, pulls, bytes sent per push and received per pull (shard records left out), shard bytes.
Reads the runs' summaries and agent logs only; prints Markdown.

``--exchanges``: per cluster run, from its server's ``events.jsonl`` up to the evaluation that reached the target:
the staleness (versions) and loss-weighted share of the applied updates, the server's evaluations (how many, the
CPU seconds they took beside the agents on the same cores), and per agent the mean seconds a push was in flight
(from its log) and the cycles it trained per push: where a cluster spends its extra samples on a slow link.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

_IN_FLIGHT = re.compile(r"overlapped exchanges: ([0-9.]+)s in flight, ([0-9.]+)s waited for")


def _in_flight(log: Path) -> tuple[float, float] | None:
    try:
        m = _IN_FLIGHT.search(log.read_text(errors="replace"))
    except OSError:
        return None
    return (float(m.group(1)), float(m.group(2))) if m else None


def run_rows(run_dir: Path, record: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run's headline figures and its per-agent rows."""
    s = json.loads((run_dir / "summary.json").read_text())
    ev = record.get("events") or {}
    train = ev.get("train_seconds_to_target", s.get("train_seconds_to_target"))
    launch = s.get("launch_seconds_to_target", s.get("seconds_to_target"))
    if s.get("preset") == "ddp" and "launch_seconds_to_target" not in s:
        launch = None  # older peer summaries: time from launch not recorded
    head = {"train_s": train, "launch_s": launch, "samples": sum(w.get("samples", 0) for w in s["workers"]),
            "updates": s.get("model_updates"), "final": s.get("final_accuracy")}
    rows = []
    for w in s["workers"]:
        flight = _in_flight(run_dir / str(w.get("log", ""))) if w.get("log") else None
        shard = w.get("shard_bytes_fetched", 0) or 0
        pushes, pulls = w.get("pushes", 0) or 0, w.get("pulls", 0) or 0
        rows.append({
            "name": w.get("name"), "speed": w.get("speed"), "cycles": w.get("cycles"), "samples": w.get("samples"),
            "compute": w.get("compute_seconds"), "wait": w.get("wait_seconds"),
            "prefetch_wait": w.get("prefetch_wait_seconds"), "in_flight": flight[0] if flight else None,
            "flight_waited": flight[1] if flight else None, "pushes": pushes, "pulls": pulls,
            "sent_per_push": (w.get("bytes_sent", 0) / pushes) if pushes else None,
            "recv_per_pull": ((w.get("bytes_received", 0) - shard) / pulls) if pulls else None,
            "shard_bytes": shard, "in_flight_cycles": w.get("in_flight_cycles"),
        })
    return head, rows


def events(path: Path) -> Iterator[dict[str, Any]]:
    """A run's ``events.jsonl``, record by record; a line cut by the run's end is skipped."""
    for line in path.read_text(errors="replace").splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def own_seconds(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The records, each ``cycle`` with ``own_compute_seconds``: the agent's claim, not the server's bound.

    The server's claims floor (``server/engine/claims.py``) raises a cycle's ``compute_seconds`` to a quarter of
    the wall time from its assignment to its push, which on a slow link is mostly the push's transfer: every fp32
    bsp cycle on lte (docs/simulation.md, "the lte stall"). Since 2026-11-28 a raised cycle's event carries
    ``claimed_compute_seconds``; before, the claim is the first ``claim_clamped`` of that worker's
    ``compute_seconds`` since its previous cycle (the claims judge a report, then the engine records it)."""
    claimed: dict[str, float] = {}
    for e in records:
        kind, worker = e.get("event"), str(e.get("worker"))
        if kind == "claim_clamped" and e.get("field") == "compute_seconds":
            claimed.setdefault(worker, float(e["claimed"]))
        elif kind == "cycle":
            first = claimed.pop(worker, None)
            own = e.get("claimed_compute_seconds", first)
            e = {**e, "own_compute_seconds": e.get("compute_seconds") if own is None else own}
        yield e


def pct(xs: list[float], q: float) -> float | None:
    """The q-quantile of ``xs`` by rank (None: no values)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def exchange_row(run_dir: Path) -> dict[str, Any] | None:
    """A cluster run's exchange figures up to its target (None: no events log)."""
    path = run_dir / "events.jsonl"
    if not path.is_file():
        return None
    stale: list[float] = []
    shares: list[float] = []
    evals: list[float] = []
    t0 = t_end = None
    for e in events(path):
        kind = e.get("event")
        if kind == "join" and t0 is None:
            t0 = e.get("ts")
        elif kind == "update_applied":
            stale += [float(x) for x in e.get("staleness", [])]
            shares += [float(x) for x in e.get("weights", [])]
        elif kind == "evaluation":
            evals.append(float(e.get("seconds", 0.0)))
        elif kind == "target_reached":
            t_end = e.get("ts")
            break
    span = (t_end - t0) if (t0 is not None and t_end is not None) else None
    return {"updates": len(stale), "stale_p50": pct(stale, 0.5), "stale_p90": pct(stale, 0.9),
            "share_p50": pct(shares, 0.5), "evals": len(evals), "eval_s": sum(evals),
            "eval_share": (sum(evals) / span) if span else None}


def _f(x: Any, nd: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a hermes-bench --out folder (results.json, runs/)")
    p.add_argument("--cells", help="comma-separated cells (hl2, hl2@lte, ...); default all")
    p.add_argument("--variants", help="comma-separated variant labels; default all")
    p.add_argument("--agents", action="store_true", help="also print the per-agent rows of every run")
    p.add_argument("--exchanges", action="store_true",
                   help="also print every cluster run's staleness, evaluation cost and exchange time per push")
    a = p.parse_args()
    results = json.loads((a.out / "results.json").read_text())
    cells = set(a.cells.split(",")) if a.cells else None
    variants = set(a.variants.split(",")) if a.variants else None
    table: dict[tuple[str, str], list[dict[str, Any]]] = {}
    agents: list[str] = []
    exchanges: list[str] = []
    for rec in results.get("runs", []):
        key = rec.get("key", "")
        cell, variant, rep = (key.split("/") + ["", "", ""])[:3]
        if (cells and cell not in cells) or (variants and variant not in variants):
            continue
        run_dir = a.out / rec.get("run_dir", f"runs/{cell}/{variant}/{rep}")
        if not (run_dir / "summary.json").is_file():
            continue
        head, rows = run_rows(run_dir, rec)
        table.setdefault((cell, variant), []).append(head)
        ex = exchange_row(run_dir) if a.exchanges else None
        if ex is not None:
            per_push = [r["in_flight"] / r["pushes"] for r in rows if r["in_flight"] is not None and r["pushes"]]
            cyc_push = [r["cycles"] / r["pushes"] for r in rows if r["cycles"] and r["pushes"]]
            exchanges.append(" | ".join(_f(v) for v in (
                key, head["train_s"], head["samples"], ex["updates"], ex["stale_p50"], ex["stale_p90"],
                ex["share_p50"], ex["evals"], ex["eval_s"], ex["eval_share"],
                " / ".join(f"{x:.3f}" for x in per_push), " / ".join(f"{x:.1f}" for x in cyc_push))))
        if a.agents:
            for r in rows:
                agents.append(" | ".join(_f(v) for v in (key, r["name"], r["speed"], r["cycles"], r["samples"],
                                                         r["compute"], r["wait"], r["prefetch_wait"], r["in_flight"],
                                                         r["pushes"], r["pulls"], r["sent_per_push"],
                                                         r["recv_per_pull"], r["shard_bytes"])))
    print("| cell | variant | runs | train s (median [min-max]) | from launch s | samples to target | final acc |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for (cell, variant), heads in sorted(table.items()):
        def med(k: str) -> str:
            xs = [h[k] for h in heads if h[k] is not None]
            if not xs:
                return "-"
            return f"{statistics.median(xs):,.1f} [{min(xs):,.1f}-{max(xs):,.1f}]"
        print(f"| {cell} | {variant} | {len(heads)} | {med('train_s')} | {med('launch_s')} | "
              f"{med('samples').replace('.0', '')} | {med('final')} |")
    if exchanges:
        print("\n| run | train s | samples | updates | staleness p50 | p90 | share p50 | evaluations | their s | "
              "their s / train s | s in flight a push, per agent | cycles a push, per agent |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
        for line in exchanges:
            print(f"| {line} |")
    if agents:
        print("\n| run | agent | speed | cycles | samples | compute s | wait s | of it shards s | exchange in "
              "flight s | pushes | pulls | B sent / push | B recv / pull (no shards) | shard B |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for line in agents:
            print(f"| {line} |")


if __name__ == "__main__":
    main()
