"""The edge suites' comparison table (issue 31) from the run folders of one or more ``hermes-bench`` invocations.

``hermes-bench`` rewrites ``results.json`` with the runs of its last invocation only, and the edge tables are
put together from several invocations (the bench lock's 12-minute rule), so this reads every run folder under
``OUT/runs/`` instead: per link and variant, the training seconds to target (from the last join, as
``hermes-bench report``'s *train s*), median [min-max] over the repeats that reached it, how many did, the final
accuracy, the bytes an agent sent per push against an fp32 push, and the load average before each run.

    python benchmarks/edge_table.py runs/edge-lte [--fp32-bytes 4852648] [--best hermes-ungated-topk-local]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from hermes.common.readable_json import read_object
from hermes.deploy.bench.aggregate import event_figures

# edge-resnet (stem_stride 2): 1,213,162 floats (BatchNorm's statistics included) and the frame's header.
FP32_PUSH_BYTES = 4_852_648


def run_rows(out: Path) -> list[dict[str, Any]]:
    """One row per finished run folder ``OUT/runs/CELL/LABEL/rN``."""
    rows = []
    for summary_path in sorted(out.glob("runs/*/*/r*/summary.json")):
        d = summary_path.parent
        summary, meta = read_object(summary_path), read_object(d / "run.json") or {}
        if summary is None or meta.get("error"):
            continue
        train = event_figures(d / "events.jsonl").get("train_seconds_to_target") if (d / "events.jsonl").is_file() \
            else None
        if train is None and summary.get("reached_target") and summary.get("train_seconds_to_target") is not None:
            train = summary["train_seconds_to_target"]  # the DDP peer's own clock
        if train is None and summary.get("reached_target"):
            train = summary.get("seconds_to_target")
        workers = summary.get("workers") or []
        pushes = sum(int(w.get("pushes") or 0) for w in workers)
        sent = sum(int(w.get("bytes_sent") or 0) for w in workers)
        rows.append({
            "cell": d.parent.parent.name, "label": d.parent.name, "repeat": d.name,
            "reached": bool(summary.get("reached_target")), "train_s": train,
            "final_accuracy": summary.get("final_accuracy"),
            "push_fraction": (sent / pushes) if pushes else None,
            "load": (meta.get("loadavg_before") or [None])[0],
            "load_after": (meta.get("loadavg_after") or [None])[0],
            "started": meta.get("started_at"),
        })
    return rows


def table(rows: list[dict[str, Any]], fp32_bytes: int) -> str:
    lines = ["| link | variant | train s to target, median [min-max] | reached | final accuracy | bytes a push / fp32 "
             "| load before each run |", "| --- | --- | ---: | ---: | --- | ---: | --- |"]
    keys = sorted({(r["cell"], r["label"]) for r in rows})
    for cell, label in keys:
        rs = sorted((r for r in rows if (r["cell"], r["label"]) == (cell, label)), key=lambda r: r["repeat"])
        times = [r["train_s"] for r in rs if r["reached"] and r["train_s"] is not None]
        t = (f"{statistics.median(times):.1f} [{min(times):.1f}-{max(times):.1f}]" if len(times) > 1
             else f"{times[0]:.1f}" if times else "—")
        acc = ", ".join("—" if r["final_accuracy"] is None else f"{r['final_accuracy']:.3f}" for r in rs)
        fr = [r["push_fraction"] / fp32_bytes for r in rs if r["push_fraction"]]
        frac = f"{statistics.median(fr):.3f}" if fr else "—"
        load = ", ".join("?" if r["load"] is None else f"{r['load']:.1f}" for r in rs)
        lines.append(f"| {cell} | `{label}` | {t} | {len(times)}/{len(rs)} | {acc} | {frac} | {load} |")
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]], best: str) -> str:
    """Per link: each other variant's median train s over ``best``'s (how many times sooner ``best`` got there),
    from the repeats that reached the target; and the same ratio repeat by repeat (the same seed, one invocation)."""
    lines = [f"| link | against | median / median (`{best}` that many times sooner) | repeat by repeat |",
             "| --- | --- | ---: | --- |"]
    for cell in sorted({r["cell"] for r in rows}):
        mine = {r["repeat"]: r["train_s"] for r in rows if r["cell"] == cell and r["label"] == best and r["reached"]}
        if not mine:
            continue
        for label in sorted({r["label"] for r in rows if r["cell"] == cell} - {best}):
            theirs = {r["repeat"]: r["train_s"] for r in rows
                      if r["cell"] == cell and r["label"] == label and r["reached"]}
            if not theirs:
                lines.append(f"| {cell} | `{label}` | not reached | |")
                continue
            ratio = statistics.median(theirs.values()) / statistics.median(mine.values())
            each = ", ".join(f"{k}: {theirs[k] / mine[k]:.2f}x" for k in sorted(mine) if k in theirs)
            lines.append(f"| {cell} | `{label}` | {ratio:.2f}x | {each} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a hermes-bench --out folder")
    parser.add_argument("--fp32-bytes", type=int, default=FP32_PUSH_BYTES, help="bytes of one fp32 push")
    parser.add_argument("--json", action="store_true", help="the rows as JSON instead of the table")
    parser.add_argument("--best", help="also print every variant's median time over this variant's")
    args = parser.parse_args()
    rows = run_rows(args.out)
    print(json.dumps(rows, indent=1) if args.json else table(rows, args.fp32_bytes))
    if args.best and not args.json:
        print()
        print(ratios(rows, args.best))


if __name__ == "__main__":
    main()
