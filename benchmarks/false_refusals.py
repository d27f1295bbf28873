#!/usr/bin/env python
"""False-refusal rate of the default update screening: every preset's testbed run, no attacker.

    python benchmarks/false_refusals.py [--presets hermes,asp,...] [--seeds 1,2,3] [--profile hl8]
        [--clients 4] [--dataset digits] [--max-seconds 40] [--out runs/false-refusals] [--set KEY=VALUE ...]

For each seed and each preset (default: every preset ``hermes-testbed --list-presets``
prints), one after the other, it runs

    python -m hermes.deploy.testbed --preset P --profile hl8 --clients 4 --dataset digits
        --max-seconds S --seed SEED --quiet --out OUT/sSEED/P

with the server's default screening (on), then reads ``OUT/P/server_summary.json``
(``screening``: refusals by reason, quarantined workers, the median accepted
norm) and the agents' push counts from ``OUT/P/summary.json``. Every run is
honest, so every refusal is a false one; the expected count is 0 on every
preset. It prints one table (preset, seed, pushes, refusals by reason, rate,
quarantined, updates down-weighted and clipped, claims clamped, median norm, final
accuracy), one line per preset over the seeds, and writes ``OUT/false_refusals.json``.
The table over the seeds adds the elapsed-time floor's windows and margin (the lowest claimed
compute / wall time of one window and of a worker's median of 5) and the updates judged at a work
scale or with a drift allowance (docs/false-refusals.md 1b, 4).
Down-weighted updates are folded (at the median norm), so they are not refusals; the
events ``direction_tested``, ``effect_tested`` and ``update_downweighted`` in each run's
``events.jsonl`` hold the cosine, norm ratio, probe losses and staleness of every large update.
Exit status 1 when any preset refused an honest push, 2 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_info, print_table


def all_presets() -> list[str]:
    out = subprocess.run([sys.executable, "-m", "hermes.deploy.testbed", "--list-presets"],
                         capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line and not line[0].isspace()]


def run_one(args: argparse.Namespace, preset: str, seed: int) -> dict[str, Any]:
    base = args.out / f"s{seed}"
    out = base / preset
    cmd = [sys.executable, "-m", "hermes.deploy.testbed", "--preset", preset, "--profile", args.profile,
           "--clients", str(args.clients), "--dataset", args.dataset, "--max-seconds", f"{args.max_seconds:g}",
           "--seed", str(seed), "--quiet", "--out", str(out)]
    for kv in args.set:
        cmd += ["--set", kv]
    (out / "summary.json").unlink(missing_ok=True)
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(base / f"{preset}.log", "w") as log_file:
        try:
            rc = subprocess.run(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                timeout=args.max_seconds + 180).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    row: dict[str, Any] = {"preset": preset, "seed": seed, "rc": rc, "seconds": round(time.time() - t0, 1)}
    try:
        summary = json.loads((out / "summary.json").read_text())
        server = json.loads((out / "server_summary.json").read_text())
    except (OSError, ValueError) as exc:
        return row | {"error": f"no summary: {exc}"}
    screening = server.get("screening") or {}
    refusals = screening.get("refusals") or {}
    pushes = sum(w.get("pushes", 0) for w in summary.get("workers", []))
    return row | {
        "pushes": pushes,
        "applied": sum(w.get("applied", 0) for w in summary.get("workers", [])),
        "refusals": refusals,
        "refused": sum(refusals.values()),
        "rate": (sum(refusals.values()) / pushes) if pushes else None,
        "quarantined": screening.get("quarantined", []),
        "downweighted": screening.get("downweighted", 0),
        "clipped": screening.get("clipped", 0),
        "clamped": sum((screening.get("claims_clamped") or {}).values()),
        "min_accepted_cosine": screening.get("min_accepted_cosine"),
        # The elapsed-time floor's margin: windows closed and the lowest claimed compute / wall time.
        "windows": (screening.get("claims_windows") or {}).get("closed"),
        "min_compute_ratio": (screening.get("claims_windows") or {}).get("min_ratio"),
        "min_median_ratio": (screening.get("claims_windows") or {}).get("min_median_ratio"),
        "work_scaled": screening.get("work_scaled"),
        "drift_allowed": screening.get("drift_allowed"),
        **judged(out / "events.jsonl"),
        "median_norm": screening.get("median_norm"),
        "screening_enabled": screening.get("enabled"),
        "model_updates": summary.get("model_updates"),
        "final_accuracy": summary.get("final_accuracy"),
    }


def judged(events: Path) -> dict[str, Any]:
    """The large updates screening judged (direction_tested / effect_tested events): how many, the
    largest norm ratio, the lowest cosine, the most stale, and how many failed each test; apart, the
    updates under the gate whose direction was measured (``band``, screening.uphill_from) and how many of
    those were down-weighted as uphill. The effect re-measured at the median norm (``at``) is not a judgement."""
    direction: list[dict[str, Any]] = []
    effect: list[dict[str, Any]] = []
    band: list[dict[str, Any]] = []
    try:
        with open(events) as fh:
            for line in fh:
                if '"direction_tested"' in line or '"effect_tested"' in line:
                    e = json.loads(line)
                    if e.get("band"):
                        band.append(e)
                    elif e["event"] == "direction_tested":
                        direction.append(e)
                    elif e.get("at") is None and e["norm_ratio"] > 1.0:
                        effect.append(e)
    except OSError:
        return {}
    stale = [e["staleness"] for e in direction + effect if e.get("staleness") is not None]
    return {
        "judged": max(len(direction), len(effect)),
        "max_ratio": max((e["norm_ratio"] for e in direction + effect), default=None),
        "min_cosine": min((e["cosine"] for e in direction), default=None),
        "max_staleness": max(stale, default=None),
        "direction_failed": sum(not e["accepted"] for e in direction),
        "effect_failed": sum(not e["accepted"] for e in effect),
        "band": len(band),
        "band_uphill": sum(not e["accepted"] for e in band),
        "band_min_cosine": min((e["cosine"] for e in band), default=None),
    }


def _cells(r: dict[str, Any]) -> list[Any]:
    return [r["preset"], r["seed"], r.get("pushes", "-"), r.get("applied", "-"), r.get("refused", r.get("error", "-")),
            ",".join(f"{k}={v}" for k, v in sorted((r.get("refusals") or {}).items())) or "-",
            "-" if r.get("rate") is None else f"{r['rate']:.4f}", len(r.get("quarantined", [])),
            r.get("downweighted", "-"), r.get("clipped", "-"), r.get("clamped", "-"),
            "-" if r.get("median_norm") is None else f"{r['median_norm']:.3g}",
            "-" if r.get("final_accuracy") is None else f"{r['final_accuracy']:.3f}"]


def totals(rows: list[dict[str, Any]], preset: str) -> list[str]:
    """One preset over its seeds: sums, and the extremes of the judged updates."""
    mine = [r for r in rows if r["preset"] == preset and "error" not in r]

    def total(key: str) -> str:
        return str(sum(r.get(key) or 0 for r in mine))

    def extreme(key: str, pick: Any) -> str:
        values = [r[key] for r in mine if r.get(key) is not None]
        return f"{pick(values):.3g}" if values else "-"

    return [preset, str(len(mine)), total("pushes"), total("refused"), str(sum(len(r["quarantined"]) for r in mine)),
            total("judged"), total("direction_failed"), total("effect_failed"), total("downweighted"),
            extreme("max_ratio", max), extreme("min_cosine", min), extreme("max_staleness", max), total("clamped"),
            total("windows"), extreme("min_compute_ratio", min), extreme("min_median_ratio", min),
            total("work_scaled"), total("drift_allowed"), total("band"), total("band_uphill"),
            extreme("band_min_cosine", min)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--presets", default="", help="comma-separated (default: every preset)")
    p.add_argument("--profile", default="hl8")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--max-seconds", type=float, default=40.0)
    p.add_argument("--seeds", default="0", help="comma-separated seeds, each run for every preset (default 0)")
    p.add_argument("--out", type=Path, default=Path("runs/false-refusals"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--report", action="store_true",
                   help="run nothing: print the tables of OUT/false_refusals.json again (judged updates from the events)")
    args = p.parse_args(argv)
    if args.report:
        rows = json.loads((args.out / "false_refusals.json").read_text())["runs"]
        for r in rows:
            r.update(judged(args.out / f"s{r['seed']}" / r["preset"] / "events.jsonl"))
        presets = list(dict.fromkeys(r["preset"] for r in rows))
        return report(args, rows, presets)
    presets = [x for x in args.presets.split(",") if x] or all_presets()
    seeds = [int(x) for x in args.seeds.split(",") if x]
    rows = []
    for seed in seeds:
        for preset in presets:
            row = run_one(args, preset, seed)
            rows.append(row)
            print(f"{preset} seed {seed}: {row.get('refused', '?')} refused of {row.get('pushes', '?')} pushes, "
                  f"{row.get('downweighted', '?')} down-weighted ({row['seconds']} s, rc {row['rc']})", flush=True)
    (args.out / "false_refusals.json").write_text(json.dumps(
        {"machine": machine_info(), "args": {k: str(v) for k, v in vars(args).items()}, "runs": rows}, indent=2))
    return report(args, rows, presets)


def report(args: argparse.Namespace, rows: list[dict[str, Any]], presets: list[str]) -> int:
    print_table(
        f"False refusals of the default screening, {args.profile}, {args.clients} agents, {args.dataset}",
        ["preset", "seed", "pushes", "applied", "refused", "by reason", "rate", "quarantined", "down-weighted",
         "clipped", "clamped", "median norm", "final acc"],
        [[str(x) for x in _cells(r)] for r in rows])
    print_table("Over the seeds", ["preset", "runs", "pushes", "refused", "quarantined", "judged", "direction failed",
                                   "effect failed", "down-weighted", "max ratio", "min cosine", "max staleness",
                                   "clamped", "windows", "min compute/wall", "min median of 5", "work-scaled",
                                   "drift-allowed", "2-4x measured", "2-4x uphill", "2-4x min cosine"],
               [totals(rows, p) for p in presets])
    if any("error" in r or r["rc"] != 0 for r in rows):
        return 2
    return 1 if any(r.get("refused") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
