"""What a run's dual binary search and gate did, per worker, from its events.jsonl (testbed or ``hermes-sim``).

    python benchmarks/sim_calibration_events.py RUN_DIR... [--first N]

For each run: per worker (by slowdown, the fast agent first) the cycles, the share of cycles at each mini-batch
size, the median compute seconds of a cycle at each (DSS, MBS), the gate's decisions, the first N resizes
(kind, DSS, MBS, predicted and target seconds); and the run's updates and time to target. Markdown on stdout.
Used to find why ``hermes-paper``'s MBS search settles on 32 or 64 on one side and not the other
(docs/simulation.md, "Calibration against the testbed").
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def read_events(run: Path) -> list[dict[str, Any]]:
    out = []
    with (run / "events.jsonl").open() as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a stopped run
    return out


def describe(run: Path, first: int) -> list[str]:
    ev = read_events(run)
    slow = {e["worker"]: e.get("slowdown") for e in ev if e.get("event") == "join"}
    cycles: dict[str, list[dict[str, Any]]] = defaultdict(list)
    resizes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in ev:
        if e.get("event") == "cycle":
            cycles[e["worker"]].append(e)
        elif e.get("event") == "resize":
            resizes[e["worker"]].append(e)
    t0 = next((e["ts"] for e in ev if e.get("event") == "run_start"), 0.0)
    hit = next((e for e in ev if e.get("event") == "target_reached"), None)
    updates = sum(1 for e in ev if e.get("event") == "update_applied")
    lines = [f"### {run}", "",
             f"updates {updates}; target reached: {'no' if hit is None else round(hit['ts'] - t0, 1)} s after run_start", "",
             "| worker | slowdown | cycles | share by MBS | median cycle s by (DSS, MBS) | gate decisions | first resizes |",
             "| --- | ---: | ---: | --- | --- | --- | --- |"]
    for w in sorted(cycles, key=lambda w: (slow.get(w) or 0, w)):
        cs = cycles[w]
        mbs = Counter(c["batch_size"] for c in cs)
        share = ", ".join(f"{b}: {n / len(cs):.0%}" for b, n in sorted(mbs.items()))
        by: dict[tuple[int, int], list[float]] = defaultdict(list)
        for c in cs:
            by[(c["dss"], c["batch_size"])].append(c["compute_seconds"])
        med = ", ".join(f"{d}/{b}: {statistics.median(v) * 1e3:.0f} ms ×{len(v)}" for (d, b), v in sorted(by.items()))
        dec = ", ".join(f"{k} {n}" for k, n in Counter(c.get("decision") for c in cs).most_common())
        rs = "; ".join(f"{r['kind']} {r['dss']}/{r['batch_size']} ({r['predicted_seconds'] * 1e3:.0f} vs "
                       f"{r['target_seconds'] * 1e3:.0f} ms)" for r in resizes[w][:first])
        lines.append(f"| {w} | {slow.get(w)} | {len(cs)} | {share} | {med} | {dec} | {rs} |")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--first", type=int, default=4)
    a = p.parse_args(argv)
    for r in a.runs:
        print("\n".join(describe(Path(r), a.first)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
