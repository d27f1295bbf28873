"""Issue 31's hl2-alone figures over one-seed invocations: per seed, medians and ratios against ``alone``.

    python benchmarks/hl2_seeds.py runs/hl2-5-lte-t1-s0 runs/hl2-5-lte-t1-s1 runs/hl2-5-lte-t1-s2

Each folder is one ``hermes-bench hl2-alone --seed K`` invocation (the bench lock's 10-minute rule splits medians
of 3 into one invocation per seed where they do not fit one); a folder of ``--repeats N`` gives N seeds. For every variant: the training time to target of each seed
(from the last agent's join; ``alone``: from its training start, evaluations left out), the median, the ratio
``alone`` median / variant median, each seed's ratio against that seed's ``alone``, the samples to target and
the load average (1 min) before each run. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def seed_runs(out: Path) -> list[dict[str, dict[str, Any]]]:
    """One invocation's runs, a dict by variant per seed (``--repeats 3`` folders hold three): train s, samples,
    load before, seed (runs that missed the target: train s None)."""
    results = json.loads((out / "results.json").read_text())
    by_seed: dict[Any, dict[str, dict[str, Any]]] = {}
    for rec in results.get("runs", []):
        summary = rec.get("summary") or {}
        events = rec.get("events") or {}
        train = events.get("train_seconds_to_target", summary.get("train_seconds_to_target"))
        if not summary.get("reached_target", train is not None):
            train = None
        workers = summary.get("workers") or []
        load = rec.get("loadavg_before") or [None]
        by_seed.setdefault(rec.get("seed"), {})[rec["variant"]] = {
            "train_s": train, "samples": sum(w.get("samples", 0) for w in workers) or None, "load": load[0],
            "seed": rec.get("seed")}
    return [by_seed[k] for k in sorted(by_seed, key=lambda k: (k is None, k or 0))]


def table(outs: list[Path]) -> list[str]:
    seeds = [runs for o in outs for runs in seed_runs(o)]
    variants: list[str] = []
    for s in seeds:
        variants += [v for v in s if v not in variants]
    alone = [s.get("alone", {}).get("train_s") for s in seeds]
    alone_med = statistics.median([a for a in alone if a is not None]) if any(a is not None for a in alone) else None
    lines = ["| variant | train s per seed | median | vs `alone` (medians) | per seed vs its `alone` | samples per seed "
             "| load before |", "| --- | --- | ---: | ---: | --- | --- | --- |"]
    for v in variants:
        runs = [s.get(v, {}) for s in seeds]
        ts = [r.get("train_s") for r in runs]
        got = [t for t in ts if t is not None]
        med = statistics.median(got) if len(got) == len(ts) else None  # a seed that missed: no median
        ratio = f"{alone_med / med:.2f}x" if (alone_med and med) else "-"
        per_seed = ", ".join(f"{a / t:.2f}" if (a and t) else "-" for a, t in zip(alone, ts))
        lines.append(" | ".join([
            f"| `{v}`", ", ".join(f"{t:.1f}" if t is not None else "missed" for t in ts),
            f"{med:.1f}" if med is not None else "-", ratio, per_seed,
            " / ".join(f"{r['samples']:,}" if r.get("samples") else "-" for r in runs),
            " / ".join(f"{r['load']:.1f}" if r.get("load") is not None else "-" for r in runs)]) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outs", nargs="+", type=Path, help="hermes-bench --out folders, one seed each")
    a = p.parse_args()
    print("\n".join(table(a.outs)))


if __name__ == "__main__":
    main()
