#!/usr/bin/env python
"""One preset on both topologies, side by side: parameter server vs collective all-reduce.

    python benchmarks/compare_topologies.py [--preset task-allocation] [--profile hl4] [--clients 4]
        [--target-accuracy 0.9] [--max-seconds 120] [--repeats 1] [--out runs/topologies]

Runs ``hermes-testbed --topology ps`` and ``--topology collective`` one after
the other (same preset, profile, data, seed) and prints for each: whether it
reached the target and when, wall seconds, bytes per worker (data plane sent
+ received, plus for collective the all-reduce traffic through the worker,
ring estimate 2(W-1)/W x buffer per all-reduce), and the wait fraction
(agents' wait seconds / wall, including the barrier or the all-reduce).
Everything is also written to ``OUT/topologies.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from compare_presets import run_one
from machine import machine_info, print_table


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    workers = summary["workers"]
    wall = max(1e-9, summary["wall_seconds"])
    per_worker = [w["bytes_sent"] + w["bytes_received"] + w.get("collective_bytes", 0) for w in workers]
    return {
        "reached": summary["reached_target"],
        "seconds_to_target": summary["seconds_to_target"],
        "wall_seconds": summary["wall_seconds"],
        "final_accuracy": summary["final_accuracy"],
        "bytes_per_worker": statistics.fmean(per_worker),
        "collective_bytes_per_worker": statistics.fmean(w.get("collective_bytes", 0) for w in workers),
        "wait_fraction": statistics.fmean(w["wait_seconds"] / wall for w in workers),
        "compute_fraction": statistics.fmean(w["compute_seconds"] / wall for w in workers),
        "exit_codes": [w["exit_code"] for w in workers],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="task-allocation")
    p.add_argument("--profile", default="hl4")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="cnn")
    p.add_argument("--target-accuracy", type=float, default=0.9)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="runs/topologies")
    args = p.parse_args(argv)
    args.run_timeout, args.tail = None, 5
    out_root = Path(args.out)
    results: dict[str, Any] = {"machine": machine_info(), "args": vars(args), "runs": []}
    print(f"machine: {results['machine']}", flush=True)
    base_sets = list(args.set)
    for seed in range(args.repeats):
        for topology in ("ps", "collective"):
            args.set = base_sets + (["topology=collective", f"world_size={args.clients}"]
                                    if topology == "collective" else [])
            print(f"running {args.preset} on {args.profile}, topology {topology}, seed {seed} ...", flush=True)
            rec = run_one(args, args.preset, seed, out_root / topology)
            entry = {"topology": topology, "seed": seed, "ok": rec.get("ok"), "error": rec.get("error")}
            if rec.get("ok"):
                entry.update(figures(json.loads((Path(rec["out"]) / "summary.json").read_text())))
            else:
                print(f"  failed: {rec.get('error')} (log {rec['log']})", flush=True)
            results["runs"].append(entry)

    def fmt(values: list[float], f: str) -> str:
        if not values:
            return "-"
        med = statistics.median(values)
        return format(med, f) if len(values) == 1 else f"{format(med, f)} [{format(min(values), f)}-{format(max(values), f)}]"

    rows = []
    for topology in ("ps", "collective"):
        runs = [r for r in results["runs"] if r["topology"] == topology and r["ok"]]
        reached = [r for r in runs if r["reached"]]
        rows.append([
            topology, f"{len(reached)}/{args.repeats}",
            fmt([r["seconds_to_target"] for r in reached], ".1f"),
            fmt([r["wall_seconds"] for r in runs], ".1f"),
            fmt([r["bytes_per_worker"] / 1e6 for r in runs], ".2f"),
            fmt([r["collective_bytes_per_worker"] / 1e6 for r in runs], ".2f"),
            fmt([100 * r["wait_fraction"] for r in runs], ".0f"),
            fmt([r["final_accuracy"] for r in runs], ".3f"),
        ])
    print_table(f"{args.preset} on {args.profile}, {args.clients} agents, {args.dataset}/{args.model}, "
                f"target {args.target_accuracy:g}",
                ["topology", "reached", "s to target", "wall s", "MB/worker", "of which all-reduce MB",
                 "wait %", "final acc"], rows)
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "topologies.json").write_text(json.dumps(results, indent=2))
    print(f"written: {out_root / 'topologies.json'}")
    return 0 if all(r["ok"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
