"""Accuracy at a fixed training budget (issue 31): compressed against the same preset uncompressed.

The edge suites stop a run at its first evaluation at or above the target, so their final accuracies say where
the evaluation grid landed. Run the variants with a target no run reaches (``--target-accuracy 0.99``) and a wall
budget past the training budget, then this reads every run folder ``OUT/runs/CELL/LABEL/rN`` and reports, per run,
the server's evaluations up to ``--budget`` seconds of training (from the last agent's join, the clock of
``hermes-bench report``'s *train s*): the last one, and the mean of the last ``--last`` of them (evaluation noise
damped; the test subset is the same seeded one in every evaluation, so the test set's sampling error is not).

    python benchmarks/edge_budget_accuracy.py runs/edgeacc5 --budget 40 [--last 3] \
        [--pair hermes-ungated-topk-local,hermes-ungated-local]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from hermes.common.readable_json import read_object
from hermes.deploy.bench.aggregate import event_figures


def budget_row(timeline: list[dict[str, Any]], origin: float, budget: float, last: int) -> dict[str, Any] | None:
    """The evaluations at or before ``budget`` training seconds; None if the run did not train that long."""
    points = [(float(e["elapsed"]) - origin, float(e["accuracy"])) for e in timeline
              if e.get("elapsed") is not None and isinstance(e.get("accuracy"), (int, float))]
    if not points or max(t for t, _ in points) < budget:
        return None  # stopped (or evaluated for the last time) before the budget: not comparable
    within = [(t, a) for t, a in points if t <= budget]
    if not within:
        return None
    tail = within[-last:]
    return {"last_t": within[-1][0], "last": within[-1][1], "mean_last": statistics.fmean(a for _, a in tail),
            "n_tail": len(tail), "evaluations": len(within)}


def run_rows(out: Path, budget: float, last: int) -> list[dict[str, Any]]:
    rows = []
    for summary_path in sorted(out.glob("runs/*/*/r*/summary.json")):
        d = summary_path.parent
        summary, meta = read_object(summary_path), read_object(d / "run.json") or {}
        if summary is None or meta.get("error") or not (d / "events.jsonl").is_file():
            continue
        origin = event_figures(d / "events.jsonl").get("train_start_elapsed")
        if origin is None:
            continue
        row = budget_row(summary.get("accuracy_timeline") or [], float(origin), budget, last)
        rows.append({"label": d.parent.name, "repeat": d.name, "budget": row,
                     "load": (meta.get("loadavg_before") or [None])[0],
                     "load_after": (meta.get("loadavg_after") or [None])[0]})
    return rows


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--budget", type=float, default=40.0, help="training seconds (default 40)")
    p.add_argument("--last", type=int, default=3, help="evaluations averaged at the budget (default 3)")
    p.add_argument("--pair", default="hermes-ungated-topk-local,hermes-ungated-local",
                   help="compressed,uncompressed labels for the per-repeat difference")
    p.add_argument("--test-samples", type=int, default=500, help="samples an evaluation scores (the suite's 500)")
    a = p.parse_args(argv)
    rows = run_rows(Path(a.out), a.budget, a.last)
    if not rows:
        print(f"no finished runs under {a.out}/runs", file=sys.stderr)
        return 2
    print(f"| variant | repeat | last evaluation <= {a.budget:g} s (at s) | mean of last {a.last} | load before -> after |")
    print("| --- | --- | ---: | ---: | --- |")
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        b = r["budget"]
        by[(r["label"], r["repeat"])] = r
        cell = f"{pct(b['last'])} ({b['last_t']:.1f})" if b else "did not train that long"
        mean = pct(b["mean_last"]) if b else "-"
        print(f"| `{r['label']}` | {r['repeat']} | {cell} | {mean} | {r['load']} -> {r['load_after']} |")
    comp, plain = a.pair.split(",")
    diffs_last, diffs_mean = [], []
    for (label, rep), r in sorted(by.items()):
        other = by.get((plain, rep))
        if label != comp or other is None or r["budget"] is None or other["budget"] is None:
            continue
        diffs_last.append(r["budget"]["last"] - other["budget"]["last"])
        diffs_mean.append(r["budget"]["mean_last"] - other["budget"]["mean_last"])
    for label in (comp, plain):
        got = [r["budget"] for (lab, _), r in by.items() if lab == label and r["budget"]]
        if got:
            print(f"{label}: median last {pct(statistics.median(b['last'] for b in got))}, median mean-of-last "
                  f"{pct(statistics.median(b['mean_last'] for b in got))} over {len(got)} repeats")
    if diffs_last:
        print(f"{comp} - {plain}, points, per repeat: last {', '.join(f'{100 * d:+.1f}' for d in diffs_last)} "
              f"(median {100 * statistics.median(diffs_last):+.1f}); mean of last "
              f"{', '.join(f'{100 * d:+.1f}' for d in diffs_mean)} (median {100 * statistics.median(diffs_mean):+.1f})")
    # Binomial standard error of one accuracy on n test samples, at the runs' median accuracy.
    accs = [r["budget"]["last"] for r in rows if r["budget"]]
    at = statistics.median(accs) if accs else 0.8
    se = math.sqrt(at * (1 - at) / a.test_samples)
    print(f"one evaluation's standard error at accuracy {at:.3f} on {a.test_samples} test samples: "
          f"{100 * se:.1f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
