"""Hermes Table III (MNIST, CNN) beside ``hermes-sim`` runs in the paper's setting: one folder per framework.

    python benchmarks/sim_table3_paper.py RUNS_DIR

``RUNS_DIR/<label>/summary.json``, labels as in benchmarks/sim_table3.py (bsp, asp, ssp, ebsp, hermes-paper,
hermes-paper-a1.6-b0.15, hermes-paper-a0.9-b0.1, hermes): the paper's columns and the simulation's (virtual
seconds to target, speed-up over bsp, iterations = local cycles over all devices, WI = Hermes Eq. 7 mean over
devices, samples trained, API calls and their ratio to bsp's, the requests sent with the heartbeats, final
accuracy, wall seconds), then each run's requests by type. A run stopped by the wall limit (``sim_table3_paper.sh``) has no summary: its
row comes from its events (last evaluation, cycles) and says so. Markdown on stdout.

API calls: the paper counts "contacting the PS for the dataset, the model, global gradients and any other
relevant information about other nodes" (Hermes Sec. V-B). The engine counts every request it handles
(``messages_by_type``: one per request, replies not counted). The API calls here are one per purpose: those
requests less the heartbeats, which carry none of these (a device sends one while it has nothing else to send:
BSP's barrier waits), plus the requests another carried (``carried_by_type``: with ``combine_messages``, the
default, a work request's reply brings the shards and a push's reply the model, one request for two or three
purposes). ``hermes-paper`` sends one request per purpose (``combine_messages = false``), so for it the two
counts agree; the baselines combine, and counting only what they send would halve theirs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_table3 import NAMES, PAPER, fmt  # type: ignore[import-not-found]  # noqa: E402 (a sibling script)

ORDER = ("bsp", "hermes-paper", "hermes-paper-a1.6-b0.15", "hermes-paper-a0.9-b0.1", "asp", "ssp", "ebsp", "hermes")
NOT_CALLS = ("heartbeat",)


def metrics(summary: dict[str, Any]) -> dict[str, Any]:
    ws = summary["workers"]
    by = summary.get("messages_by_type", {})
    return {"reached": summary["reached_target"], "t": summary["seconds_to_target"],
            "iterations": sum(w["cycles"] for w in ws), "wi": sum(w["wi"] or 0 for w in ws) / len(ws),
            "updates": summary.get("model_updates"), "messages": summary["messages_total"],
            "sent": sum(n for k, n in by.items() if k not in NOT_CALLS),
            "calls": sum(n for k, n in by.items() if k not in NOT_CALLS) + sum(summary.get("carried_by_type", {}).values()),
            "by_type": by, "carried": summary.get("carried_by_type", {}), "samples": sum(w["samples"] for w in ws),
            "accuracy": summary["final_accuracy"], "virtual": summary["virtual_seconds"],
            "wall": summary.get("wall_seconds"), "stopped": False}


def from_events(path: Path) -> dict[str, Any]:
    """A run the wall limit stopped: what its events say (no message counts)."""
    evals, cycles, updates = [], 0, 0
    with path.open() as f:
        for line in f:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # the line the kill cut
            kind = e.get("event")
            cycles += kind == "cycle"
            updates += kind == "update_applied"
            if kind == "evaluation":
                evals.append(e)
    last = evals[-1] if evals else {"accuracy": None, "elapsed": 0.0}
    return {"reached": False, "t": None, "iterations": cycles, "wi": None, "updates": updates, "messages": None,
            "sent": None, "calls": None, "by_type": {}, "carried": {}, "samples": None, "accuracy": last["accuracy"], "virtual": last["elapsed"],
            "wall": None, "stopped": True, "best": max((x["accuracy"] for x in evals), default=None)}


def load(runs: Path, label: str) -> dict[str, Any] | None:
    if (runs / label / "summary.json").exists():
        return metrics(json.loads((runs / label / "summary.json").read_text()))
    if (runs / label / "events.jsonl").exists():
        return from_events(runs / label / "events.jsonl")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir")
    a = p.parse_args(argv)
    got = {lab: m for lab in ORDER if (m := load(Path(a.runs_dir), lab)) is not None}
    base = got.get("bsp")
    print("| framework | paper: iterations | paper: WI | paper: API calls (M) | paper: API calls / BSP's | "
          "paper: speed-up | sim: reached | sim: virtual s | sim: speed-up | sim: iterations | sim: WI | "
          "sim: model updates | sim: samples trained | sim: API calls | sim: API calls / BSP's | "
          "sim: requests sent (less heartbeats) / BSP's | sim: requests with heartbeats | "
          "sim: final accuracy | wall s |")
    print("| --- |" + " ---: |" * 19)
    for lab, m in got.items():
        paper = PAPER.get(lab)
        cols = ([f"{paper[0]:,}", fmt(paper[2]), fmt(paper[4], 1), fmt(paper[4] / PAPER["bsp"][4]),
                 f"{paper[5]:.2f}×"] if paper else ["-"] * 5)
        if base and base["t"] and m["reached"] and m["t"]:
            speed = f"{base['t'] / m['t']:.2f}×"
        elif base and base["t"] and m["virtual"]:
            speed = f"missed (< {base['t'] / m['virtual']:.2f}×)"
        else:
            speed = "-"
        reached = "yes" if m["reached"] else (f"no (wall limit at {m['virtual']:.0f} virtual s)" if m["stopped"] else "no")
        ratio = m["calls"] / base["calls"] if base and base["calls"] and m["calls"] is not None else None
        sent = m["sent"] / base["sent"] if base and base["sent"] and m["sent"] is not None else None
        print(" | ".join([f"| {NAMES.get(lab, '`' + lab + '`')}", *cols, reached, fmt(m["t"], 1), speed,
                          f"{m['iterations']:,}", fmt(m["wi"]), fmt(m["updates"], 0), fmt(m["samples"], 0), fmt(m["calls"], 0),
                          fmt(ratio), fmt(sent), fmt(m["messages"], 0), fmt(m["accuracy"], 4), fmt(m["wall"], 0)]) + " |")
    print()
    kinds = sorted({k for m in got.values() for k in (*m["by_type"], *m["carried"])})
    print("| framework | " + " | ".join(f"{k} sent (carried)" for k in kinds) + " |")
    print("| --- |" + " ---: |" * len(kinds))
    for lab, m in got.items():
        if m["by_type"]:
            print(f"| {NAMES.get(lab, '`' + lab + '`')} | " + " | ".join(
                f"{m['by_type'].get(k, 0):,}" + (f" ({m['carried'][k]:,})" if m["carried"].get(k) else "")
                for k in kinds) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
