"""The testbed's ``--slowdown-mode floor`` (common/pace.py) against the simulator: its nominal steps, measured.

    python benchmarks/sim_host_floor.py measure [--repeats 200] [--json FILE]   # a step's least CPU, by batch
    python benchmarks/sim_host_floor.py steps RUN_DIR... [--nominal FILE]      # did each agent hold its step?

Under ``floor`` a slowed testbed agent's step lasts ``S x`` its uncontended cost, which the agent estimates as the
least CPU seconds per sample over its last 64 steps (``StepPacer``); the unslowed agent (S = 1) has no slack and
runs at whatever share of a core it gets. ``measure`` gives that least cost as this machine has it: one torch
thread, the agent's ``LocalTrainer.train_cycle`` on ``4 x B`` samples in batches of ``B`` (four steps a call, so
a call's own overhead counts a quarter), ``time.thread_time``; the least, the 5th percentile and the median per
step over ``--repeats`` calls, per batch. Run it on a quiet machine under the bench lock: the least is what the
agents' pacers find when a step runs with the other vCPU idle (on this 2-vCPU machine a step's CPU time nearly
doubles when the other vCPU is busy, so the median is not the uncontended cost).

``steps`` reads testbed runs' ``events.jsonl`` (a ``hermes-bench`` folder or a run folder): per worker and
(DSS, MBS), the median cycle's compute seconds per step against ``S x`` the measured least cost per step (the
nominal step); a ratio near 1 is a step held at its nominal time, above 1 a step the host could not keep up
with (the S = 1 agent always: its nominal is the uncontended cost itself).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from sim_host_calibration import joins_and_cycles

from hermes.sim.host import FLOOR_STEP_S, nominal_step_seconds

BATCHES = (16, 32, 64, 128)


def measure(a: argparse.Namespace) -> int:
    import torch
    from sim_host_calibrate import calibration_trainer

    from hermes.common.task_registry import batch_of
    from hermes.deploy.bench.machine import loadavg

    torch.set_num_threads(1)
    _task, _spec, train, trainer = calibration_trainer(a.hidden)
    load_before = loadavg()
    by_batch: dict[str, dict[str, float]] = {}
    for bs in BATCHES:
        x, y = batch_of(train, list(range(4 * bs)))
        trainer.train_cycle(x, y, bs)  # warm-up
        per_step = []
        for _ in range(a.repeats):
            t0 = time.thread_time()
            trainer.train_cycle(x, y, bs)
            per_step.append((time.thread_time() - t0) / 4)
        by_batch[str(bs)] = {"min_s": min(per_step), "p5_s": float(np.percentile(per_step, 5)),
                             "median_s": statistics.median(per_step)}
    figures = {"step_cpu_by_batch": by_batch, "repeats": a.repeats, "hidden": a.hidden,
               "load_before": load_before, "load_after": loadavg(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(figures, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=2))
    return 0


def _runs(path: Path) -> list[Path]:
    if (path / "events.jsonl").exists():
        return [path]
    return sorted(p.parent for p in path.glob("runs/*/*/*/events.jsonl"))


def held(run: Path, table: tuple[tuple[float, float], ...]) -> list[dict[str, Any]]:
    slow, cycles = joins_and_cycles(run / "events.jsonl")
    by: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for e in cycles:
        if e.get("own_compute_seconds") is not None:
            by[(e["worker"], int(e["dss"]), int(e.get("batch_size") or 32))].append(float(e["own_compute_seconds"]))
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    if summary.get("engine") == "sim":  # a hermes-sim run: S from its devices' FLOP/s (its joins say 1)
        workers = summary.get("workers", [])
        top = max((float(x.get("flops") or 0.0) for x in workers), default=0.0)
        slow = {x["id"]: top / float(x["flops"]) for x in workers if x.get("flops")}
    rows = []
    for (w, dss, mbs), secs in sorted(by.items(), key=lambda kv: (slow.get(kv[0][0], 1.0), kv[0])):
        steps = -(-dss // mbs)
        s = slow.get(w, 1.0)
        nominal = s * nominal_step_seconds(dss / steps, table)
        per_step = statistics.median(secs) / steps
        rows.append({"run": str(run), "worker": w, "slowdown": s, "dss": dss, "mbs": mbs, "cycles": len(secs),
                     "step_ms": per_step * 1e3, "nominal_ms": nominal * 1e3, "ratio": per_step / nominal})
    return rows


def steps(a: argparse.Namespace) -> int:
    table = FLOOR_STEP_S
    if a.nominal:
        raw = json.loads(Path(a.nominal).read_text())["step_cpu_by_batch"]
        table = tuple(sorted((float(b), float(v["min_s"]) / float(b)) for b, v in raw.items()))
    print("| run | worker | S | DSS/MBS | cycles | median step ms | nominal ms | ratio |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for d in a.dirs:
        for run in _runs(Path(d)):
            for r in held(run, table):
                if r["cycles"] < a.min_cycles:
                    continue
                parts = Path(r["run"]).parts
                label = f"{parts[-5]}/{parts[-1]}" if len(parts) > 5 and parts[-4] == "runs" else r["run"]
                print(f"| {label} | {r['worker']} | "
                      f"{r['slowdown']:g} | {r['dss']}/{r['mbs']} | {r['cycles']} | {r['step_ms']:.1f} | "
                      f"{r['nominal_ms']:.1f} | {r['ratio']:.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--repeats", type=int, default=200)
    m.add_argument("--hidden", type=int, default=320)
    m.add_argument("--json", default=None)
    s = sub.add_parser("steps")
    s.add_argument("dirs", nargs="+")
    s.add_argument("--nominal", default=None, help="a measure --json file (default: sim/host.py's FLOOR_STEP_S)")
    s.add_argument("--min-cycles", type=int, default=10)
    a = p.parse_args(argv)
    return {"measure": measure, "steps": steps}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
