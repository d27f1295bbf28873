"""Each device's ms a step against its nominal step, in finished ``hermes-bench hl2-alone`` folders (issue 31).

    python benchmarks/hl2_step_ms.py runs/hl2-7-lte-s0 runs/hl2-7-lte-s1 ...

Per run and device: p5, p50 and p95 of its ms per step of ``batch`` samples and its nominal step, ``slowdown x
nominal ms a sample x batch`` (``slowdown`` = the suite's pace over the device's speed; the nominal cost per
sample from ``results.json``'s suite, ``slowdown_mode = "nominal"``). An agent's step: each training cycle's
compute seconds (its sleeps included, the work between cycles not) over its samples, times ``batch``, from
the server's ``cycle`` events up to the evaluation that reached the target: the agent's own seconds, not the
claims floor's raise of them (``hl2_alone_breakdown.own_seconds``; on lte every fp32 bsp cycle was raised).
``alone``'s: each step's wall time (sleep included), from its summary (``step_ms``, ``deploy/ddp_rank.py``). ``p50 / nominal`` above 1 is a device
that did not hold its nominal speed: the pace rule of docs/compression.md (sixth pass). Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hl2_alone_breakdown import events as read_events
from hl2_alone_breakdown import own_seconds, pct


def agent_steps(events: Path, batch: int = 32) -> dict[str, list[float]]:
    """ms per step of each worker (by name) up to the target, from a run's ``events.jsonl``."""
    names: dict[str, str] = {}
    steps: dict[str, list[float]] = {}
    for e in own_seconds(read_events(events)):
        kind = e.get("event")
        if kind == "join":
            names[str(e.get("worker"))] = str(e.get("name"))
        elif kind == "cycle" and e.get("dss"):
            n = float(e["dss"]) / batch  # steps of alone's batch, whatever the cycle's own
            if n >= 1:
                name = names.get(str(e.get("worker")), str(e.get("worker")))
                steps.setdefault(name, []).append(1000.0 * float(e["own_compute_seconds"]) / n)
        elif kind == "target_reached":
            break
    return steps


def rows(out: Path) -> list[dict[str, Any]]:
    results = json.loads((out / "results.json").read_text())
    suite = results.get("suite") or {}
    nominal, pace = suite.get("nominal_sample_ms"), float(suite.get("pace") or 1.0)
    found = []
    for rec in results.get("runs", []):
        summary = rec.get("summary") or {}
        run_dir = out / str(rec.get("run_dir") or "")
        batch = (summary.get("ddp") or {}).get("batch_per_rank") or 32
        for w in summary.get("workers", []):
            speed = float(w.get("speed") or 1.0)
            if rec.get("runner") == "alone":
                slowdown = float(w.get("slowdown") or pace / speed)
                st = w.get("step_ms") or {}
                p5, p50, p95 = st.get("p5"), st.get("p50"), st.get("p95")
            else:
                slowdown = pace / speed
                xs = agent_steps(run_dir / "events.jsonl").get(str(w.get("name")), []) \
                    if (run_dir / "events.jsonl").is_file() else []
                p5, p50, p95 = pct(xs, 0.05), pct(xs, 0.5), pct(xs, 0.95)
            nom = slowdown * float(nominal) * batch if nominal else None
            found.append({"run": rec.get("key"), "device": w.get("name"), "speed": speed, "p5": p5, "p50": p50,
                          "p95": p95, "nominal": nom, "ratio": (p50 / nom) if (p50 and nom) else None})
    return found


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}" if isinstance(x, float) else str(x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outs", type=Path, nargs="+", help="hermes-bench --out folders")
    a = p.parse_args()
    print("| run | device | speed | ms a step p5 | p50 | p95 | nominal ms | p50 / nominal |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for out in a.outs:
        for r in rows(out):
            print("| " + " | ".join(_f(r[k]) for k in ("run", "device", "speed", "p5", "p50", "p95", "nominal",
                                                         "ratio")) + " |")


if __name__ == "__main__":
    main()
