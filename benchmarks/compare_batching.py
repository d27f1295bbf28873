#!/usr/bin/env python
"""Uniform batches (``bsp``) against OmniLearn's dynamic batching (``omnilearn-bsp``), side by side.

    python benchmarks/compare_batching.py [--profile hl8] [--clients 4] [--max-seconds 60]
        [--presets bsp,omnilearn-bsp] [--dataset synthetic] [--pace 2] [--set KEY=VALUE ...]
        [--out runs/batching]

One testbed run per preset, one after the other, on the same profile and
data, each for the full ``--max-seconds`` (no target: we want the steady
state). From each run's per-cycle log it takes the *settled window*: the
last half of the run (``--settle-fraction``), and prints per worker:

- mean compute seconds per optimizer step in the window (a cycle is
  ``cycle_samples // batch_size`` steps for every worker in both presets),
- the step batch it ended with;

and per preset: max/min of those step times (OmniLearn's goal: ~1 once the
controller settles, against ~HL for uniform batches), the wait fraction
(the share of wall time the agents spent waiting on the server, including
the barrier), cluster throughput in the window (samples/s), and the sum of
the workers' *standalone* throughputs: each worker's profile (same slowdown,
same model, its settled batch) trained alone in this process, the best of
three runs of ``--standalone-steps`` steps (the most favourable standalone
figure, so the ratio errs low). Goal: cluster throughput within 10% of that
sum for omnilearn-bsp.

The defaults are sized so that equal step times are *feasible*, which the
goal presumes (``DEFAULT_SETTINGS``, each overridable with ``--set``):

- A step has a fixed cost of about 1 ms on this CNN whatever the batch, and
  the emulated slowdown multiplies it: at HL8 x pace 2 the slowest worker
  needs ~45 ms for a step of b_min = 4. The fast worker matches that only
  near b = 800, so the global batch K*b must be well above 4*128; hence
  ``batch_size=256`` with ``b_max=1024``.
- A round's push, barrier and pull cost tens of milliseconds: eight local
  steps per round (``cycle_samples=2048``) keep that a small share.
- Such cycles need more data than digits' 1,437 training samples (a cycle
  larger than an epoch is cut short): the synthetic set with 40,000 samples.
- ``--pace 2`` halves every agent's CPU demand, so that four agents and the
  server fit on two cores; standalone runs use the same slowdown.

With digits, batch 32 and 4 steps per round the same comparison shows
max/min near 1.3 for omnilearn-bsp but only ~45% of the standalone sum:
the slowest worker at b_min is still the slowest, and round costs dominate.

Everything is written to ``OUT/batching.json`` as well.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from compare_presets import run_one
from machine import machine_info, print_table


def settled_window(summary: dict[str, Any], settle_fraction: float) -> tuple[float, float]:
    """(start, end) elapsed seconds: the run's last ``1 - settle_fraction``, by which the controller
    has had ``settle_fraction`` of the run to settle (a dead-band controller on noisy times keeps
    making small moves, so "after the last change" can be an empty window)."""
    starts = [w["cycle_log"][0][0] for w in summary["workers"] if w["cycle_log"]]
    ends = [w["cycle_log"][-1][0] for w in summary["workers"] if w["cycle_log"]]
    if not starts:
        return 0.0, 0.0
    lo, hi = max(starts), min(ends)
    return lo + settle_fraction * (hi - lo), hi


def worker_figures(summary: dict[str, Any], window: tuple[float, float]) -> list[dict[str, Any]]:
    cfg = summary["config"]
    steps = max(1, cfg["cycle_samples"] // cfg["batch_size"])
    lo, hi = window
    out = []
    for w in summary["workers"]:
        fields = w["cycle_log_fields"]
        cycles = [dict(zip(fields, c)) for c in w["cycle_log"] if lo < c[0] <= hi]
        step_times = [c["compute_seconds"] / steps for c in cycles]
        out.append({
            "name": w["name"], "speed": w["speed"], "slowdown": w["slowdown"], "batch": w.get("batch_size", w.get("mbs")),
            "cycles_in_window": len(cycles), "samples_in_window": sum(c["dss"] for c in cycles),
            "mean_step_seconds": statistics.fmean(step_times) if step_times else None,
            "wait_fraction": w["wait_seconds"] / max(1e-9, summary["wall_seconds"]),
            "utilization": w["utilization"],
        })
    return out


def standalone_throughput(model_name: str, dataset: str, batch: int, slowdown: float, steps: int) -> float:
    """Samples per second of one worker's profile training alone (same trainer the agent runs)."""
    import numpy as np
    import torch

    from hermes.client.trainer import LocalTrainer, resolve_precision
    from hermes.common.datasets import load_dataset
    from hermes.common.models import build_model

    torch.set_num_threads(1)
    train, _ = load_dataset(dataset, seed=0)
    torch.manual_seed(0)
    model = build_model(model_name, input_shape=train.input_shape, num_classes=train.num_classes)
    device = torch.device("cpu")
    trainer = LocalTrainer(model, lr=0.01, momentum=0.0, weight_decay=0.0, device=device,
                           precision=resolve_precision("auto", device), slowdown=slowdown)
    n = batch * steps
    idx = np.arange(n) % len(train.y)
    trainer.train_cycle(train.x[idx[:batch]], train.y[idx[:batch]], batch)  # warm-up
    best = 0.0
    for _ in range(3):
        result = trainer.train_cycle(train.x[idx], train.y[idx], batch)
        best = max(best, result.samples / result.compute_seconds)
    return best


# See the module docstring for why each; a --set of the same key wins.
DEFAULT_SETTINGS = ("num_samples=40000", "batch_size=256", "cycle_samples=2048", "b_max=1024")


def with_defaults(settings: list[str]) -> list[str]:
    given = {kv.split("=", 1)[0] for kv in settings}
    return [kv for kv in DEFAULT_SETTINGS if kv.split("=", 1)[0] not in given] + list(settings)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="bsp,omnilearn-bsp")
    p.add_argument("--profile", default="hl8")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--model", default="cnn")
    p.add_argument("--max-seconds", type=float, default=60.0)
    p.add_argument("--standalone-steps", type=int, default=40)
    p.add_argument("--settle-fraction", type=float, default=0.5,
                   help="share of the run left to the controller before the measured window (default 0.5)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--pace", type=float, default=2.0,
                   help="testbed --pace: slow every agent by this factor, so that the cluster's summed CPU "
                        "demand fits the cores (the standalone runs use the same factor)")
    p.add_argument("--out", default="runs/batching")
    args = p.parse_args(argv)
    args.set = with_defaults(args.set)
    # run_one's knobs that this comparison does not expose.
    args.target_accuracy, args.run_timeout, args.tail = None, None, 5
    out_root = Path(args.out)
    machine = machine_info()
    print(f"machine: {machine}", flush=True)

    results: dict[str, Any] = {"machine": machine, "args": vars(args), "presets": {}}
    for preset in args.presets.split(","):
        print(f"running {preset} on {args.profile} for {args.max_seconds:g}s ...", flush=True)
        rec = run_one(args, preset, 0, out_root)
        if not rec.get("ok"):
            print(f"  {preset}: failed: {rec.get('error')} (log {rec['log']})", flush=True)
            results["presets"][preset] = {"error": rec.get("error")}
            continue
        summary = json.loads((Path(rec["out"]) / "summary.json").read_text())
        window = settled_window(summary, args.settle_fraction)
        workers = worker_figures(summary, window)
        t0 = time.perf_counter()
        for w in workers:
            w["standalone_samples_per_s"] = standalone_throughput(
                args.model, args.dataset, w["batch"], w["slowdown"], args.standalone_steps)
        step_times = [w["mean_step_seconds"] for w in workers if w["mean_step_seconds"]]
        span = window[1] - window[0]
        results["presets"][preset] = {
            "window": [round(window[0], 3), round(window[1], 3)],
            "workers": workers,
            "step_time_max_min": max(step_times) / min(step_times) if len(step_times) == len(workers) else None,
            "wait_fraction": statistics.fmean(w["wait_fraction"] for w in workers),
            "cluster_samples_per_s": sum(w["samples_in_window"] for w in workers) / span if span > 0 else None,
            "standalone_sum_samples_per_s": sum(w["standalone_samples_per_s"] for w in workers),
            "heterogeneity": summary.get("heterogeneity"),
            "resizes": rec.get("resizes", 0),
            "final_accuracy": summary["final_accuracy"],
            "standalone_seconds": round(time.perf_counter() - t0, 2),
        }

    names = [n for n, r in results["presets"].items() if "error" not in r]
    if not names:
        return 1
    rows = []
    for i in range(args.clients):
        row = [results["presets"][names[0]]["workers"][i]["name"],
               f"{results['presets'][names[0]]['workers'][i]['speed']:.3f}"]
        for n in names:
            w = results["presets"][n]["workers"][i]
            ms = w["mean_step_seconds"]
            row += [str(w["batch"]), "-" if ms is None else f"{ms * 1000:.1f}", str(w["cycles_in_window"]),
                    f"{w['standalone_samples_per_s']:.0f}"]
        rows.append(row)
    header = ["worker", "speed"]
    for n in names:
        header += [f"{n} b", f"{n} ms/step", f"{n} cycles", f"{n} alone/s"]
    print_table(f"per worker, settled window ({args.profile}, {args.dataset}/{args.model})", header, rows)

    rows = []
    for n in names:
        r = results["presets"][n]
        ratio = r["cluster_samples_per_s"] / r["standalone_sum_samples_per_s"] if r["cluster_samples_per_s"] else None
        r["throughput_vs_standalone"] = ratio
        rows.append([
            n, f"{r['window'][0]:.1f}-{r['window'][1]:.1f}s", f"{r['step_time_max_min']:.2f}",
            f"{r['wait_fraction']:.1%}", f"{r['cluster_samples_per_s']:.0f}",
            f"{r['standalone_sum_samples_per_s']:.0f}", "-" if ratio is None else f"{ratio:.1%}",
            str(r["resizes"]), f"{r['final_accuracy']:.3f}",
        ])
    print_table("side by side", ["preset", "window", "step max/min", "wait", "cluster samples/s",
                                 "sum standalone/s", "cluster/standalone", "resizes", "final acc"], rows)
    hl = results["presets"][names[0]].get("heterogeneity") or {}
    print(f"heterogeneity level (OmniLearn Eq. 3): profile {hl.get('profile')}, declared {hl.get('declared')}, "
          f"measured {hl.get('measured')}")
    out_root.mkdir(parents=True, exist_ok=True)
    (out_root / "batching.json").write_text(json.dumps(results, indent=2))
    print(f"written: {out_root / 'batching.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
