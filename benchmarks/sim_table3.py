"""Hermes Table III (MNIST, CNN) beside a simulated bench of its shape (benchmarks/suites/sim-table3.toml).

    python benchmarks/sim_table3.py BENCH_DIR

Per framework: the paper's iterations, WI, API calls and speed-up over BSP (Hermes paper, Table III, the MNIST
rows), and the simulation's (medians over its repeats): time to target in virtual seconds (*train s*, from
the last device's join), speed-up over bsp, iterations (local cycles over all devices), WI (Eq. 7, mean over
devices) and messages (every request a device sent: the paper's API calls), with API calls and messages
also relative to BSP's, which is the shape to compare (the paper's counts are of its own 12 VMs' runs of
1h45m, ours of seconds). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from hermes.deploy.bench.aggregate import run_metrics

# Hermes Table III, MNIST / CNN rows: iterations, time (min), WI_avg, conv. acc. (%), API calls (M), speed-up.
PAPER: dict[str, tuple[int, float, float, float, float, float]] = {
    "bsp": (9600, 105.38, 1.00, 98.07, 18.9, 1.00),
    "asp": (15325, 55.72, 1.00, 90.625, 24.6, 1.89),
    "ssp": (20955, 221.63, 1.00, 90.79, 29.6, 0.47),
    "ebsp": (3840, 124.28, 5.09, 85.34, 15.5, 0.84),
    "hermes-paper-a0.9-b0.1": (2200, 11.2, 7.41, 97.71, 11.2, 9.4),
    "hermes-paper": (2830, 10.55, 7.90, 98.02, 13.5, 9.9),
    "hermes-paper-a1.6-b0.15": (2250, 7.97, 8.70, 97.82, 11.4, 13.22),
}
NAMES = {"bsp": "BSP", "asp": "ASP", "ssp": "SSP (s = 125)", "ebsp": "E-BSP (R = 150)",
         "hermes-paper-a0.9-b0.1": "Hermes (α = -0.9, β = 0.1)", "hermes-paper": "Hermes (α = -1.3, β = 0.1)",
         "hermes-paper-a1.6-b0.15": "Hermes (α = -1.6, β = 0.15)"}


def median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def table(results: dict[str, Any]) -> list[str]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results["runs"]:
        if r.get("status") == "ok":
            by.setdefault(r["variant"], []).append(run_metrics(r))
    labels = [v["label"] for v in results["suite"]["variants"]]
    base = by.get("bsp", [])
    base_t = median([m["train_seconds_to_target"] for m in base])
    base_msg = median([m["messages_total"] for m in base])
    rows = ["| framework | paper: iterations | paper: WI | paper: API calls (M) | paper: API calls / BSP's | "
            "paper: speed-up | sim: reached | sim: virtual s | sim: speed-up | sim: iterations | sim: WI | "
            "sim: messages | sim: messages / bsp's | sim: final accuracy |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label in labels:
        ms = by.get(label, [])
        paper = PAPER.get(label)
        t = median([m["train_seconds_to_target"] for m in ms])
        msg = median([m["messages_total"] for m in ms])
        cols = ([f"{paper[0]:,}", fmt(paper[2]), fmt(paper[4], 1), fmt(paper[4] / PAPER["bsp"][4]),
                 f"{paper[5]:.2f}×"] if paper else ["-"] * 5)
        speed = f"{base_t / t:.2f}×" if base_t and t else ("missed" if ms and t is None else "-")
        rows.append(" | ".join([f"| {NAMES.get(label, '`' + label + '`')}", *cols,
                                f"{sum(m['reached'] for m in ms)}/{len(ms)}", fmt(t, 1), speed,
                                fmt(median([m["iterations"] for m in ms]), 0), fmt(median([m["wi_mean"] for m in ms])),
                                fmt(msg, 0), fmt(msg / base_msg if msg and base_msg else None),
                                fmt(median([m["final_accuracy"] for m in ms]), 3)]) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_dir")
    a = p.parse_args(argv)
    try:
        results = json.loads((Path(a.bench_dir) / "results.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"sim_table3: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(table(results)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
