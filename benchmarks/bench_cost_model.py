#!/usr/bin/env python
"""Per-mini-batch cost K depends on the mini-batch size: measure it, fit it, compare with a constant K.

    python benchmarks/bench_cost_model.py [--datasets digits,mnist1d] [--precisions bf16,fp32]
        [--dss 512] [--mbs 8,16,32,64,128,256] [--fit-mbs 16,32] [--repeats 9] [--json PATH]

Hermes Eq. 3 predicts a worker's cycle time as t = K * DSS / MBS with K the
time of one mini-batch, taken as a constant of the device. This benchmark
times the agent's real training loop (``LocalTrainer.train_cycle`` with the
``cnn`` of the model zoo, one thread, bf16 autocast and fp32) over DSS
samples at each MBS, interleaving the MBS values within every repeat so load
from elsewhere hits all of them alike, and reports medians of the
``compute_seconds`` the agent reports to the server (the figure the sizer
fits).

Then, from the observations at two MBS values only (``--fit-mbs``, as the
server sees them after one resize), it fits ``fit_cost_model`` (K = a + b*MBS)
and ``constant_k_model`` (the paper's constant K) and prints each model's
predicted cycle time against the measured one at every other MBS, with the
relative error. A third row fits the linear model on every MBS, to show how
well a + b*MBS describes the device at all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
from machine import cpu_model, loadavg

from hermes.client.trainer import LocalTrainer
from hermes.common.datasets import load_dataset
from hermes.common.models import build_model, count_parameters
from hermes.common.policies.allocation.cost_model import CostModel, constant_k_model, fit_cost_model


def machine_line() -> str:
    return (f"machine: {cpu_model() or '?'}; cpu_count={os.cpu_count()}; torch {torch.__version__}; "
            f"threads={torch.get_num_threads()}; python {platform.python_version()}; load {loadavg()}")


def measure(dataset: str, precision: str, dss: int, mbs_list: list[int], repeats: int, warmup: int,
            lr: float) -> dict[str, Any]:
    train, _ = load_dataset(dataset, seed=0)
    if len(train) < dss:
        raise SystemExit(f"{dataset}: only {len(train)} training samples, fewer than --dss {dss}")
    x, y = np.ascontiguousarray(train.x[:dss]), np.ascontiguousarray(train.y[:dss])
    trainers: dict[int, LocalTrainer] = {}
    numel = 0
    for mbs in mbs_list:
        torch.manual_seed(0)
        model = build_model("cnn", input_shape=train.input_shape, num_classes=train.num_classes)
        numel = count_parameters(model)
        trainers[mbs] = LocalTrainer(model, lr=lr, momentum=0.0, weight_decay=0.0, device=torch.device("cpu"),
                                     precision=precision, slowdown=1.0, seed=mbs)
    compute: dict[int, list[float]] = {m: [] for m in mbs_list}
    wall: dict[int, list[float]] = {m: [] for m in mbs_list}
    steps: dict[int, int] = {}
    for r in range(warmup + repeats):
        # Rotate the order each repeat: no MBS always runs right after another.
        order = mbs_list[r % len(mbs_list):] + mbs_list[: r % len(mbs_list)]
        for mbs in order:
            t0 = time.perf_counter()
            res = trainers[mbs].train_cycle(x, y, mbs)
            w = time.perf_counter() - t0
            steps[mbs] = res.steps
            if r >= warmup:
                compute[mbs].append(res.compute_seconds)
                wall[mbs].append(w)
    rows = []
    for mbs in mbs_list:
        c = compute[mbs]
        q = statistics.quantiles(c, n=4) if len(c) > 1 else [c[0]] * 3
        med = statistics.median(c)
        rows.append({
            "mbs": mbs, "steps": steps[mbs], "cycle_s": med, "p25_s": q[0], "p75_s": q[2],
            "wall_s": statistics.median(wall[mbs]), "per_batch_s": med / steps[mbs], "per_sample_s": med / dss,
            "samples": c,
        })
    return {"dataset": dataset, "input_shape": list(train.input_shape), "precision": precision, "dss": dss,
            "params": numel, "rows": rows}


def predictions(m: dict[str, Any], fit_mbs: list[int]) -> dict[str, Any]:
    dss = m["dss"]
    by_mbs = {r["mbs"]: r for r in m["rows"]}
    obs = [(mbs, dss, s) for mbs in fit_mbs for s in by_mbs[mbs]["samples"]]
    all_obs = [(r["mbs"], dss, s) for r in m["rows"] for s in r["samples"]]
    every = [r["mbs"] for r in m["rows"]]
    models: dict[str, tuple[CostModel, list[int]]] = {
        f"linear K=a+b*MBS (fit on MBS {','.join(map(str, fit_mbs))})":
            (fit_cost_model(obs, max_history=len(obs)), fit_mbs),
        f"constant K (paper, fit on MBS {','.join(map(str, fit_mbs))})":
            (constant_k_model(obs, max_history=len(obs)), fit_mbs),
        "linear K=a+b*MBS (fit on every MBS)": (fit_cost_model(all_obs, max_history=len(all_obs)), every),
    }
    out = {}
    for name, (cm, used) in models.items():
        preds = []
        for r in m["rows"]:
            p = cm.cycle_seconds(dss, r["mbs"])
            preds.append({"mbs": r["mbs"], "predicted_s": p, "measured_s": r["cycle_s"],
                          "rel_error": (p - r["cycle_s"]) / r["cycle_s"], "in_fit": r["mbs"] in used})
        held_out = [abs(p["rel_error"]) for p in preds if not p["in_fit"]]
        out[name] = {"a": cm.a, "b": cm.b, "predictions": preds,
                     "mean_abs_rel_error_held_out": statistics.fmean(held_out) if held_out else None,
                     "max_abs_rel_error_held_out": max(held_out) if held_out else None}
    return out


def print_measure(m: dict[str, Any]) -> None:
    print(f"\n== {m['dataset']} (input {tuple(m['input_shape'])}), cnn with {m['params']} parameters, "
          f"precision {m['precision']}, DSS {m['dss']}: LocalTrainer.train_cycle compute seconds (median of "
          f"{len(m['rows'][0]['samples'])})")
    print(f"   {'MBS':>4} {'steps':>5} {'cycle ms':>9} {'p25-p75 ms':>15} {'wall ms':>8} {'per batch ms':>12} "
          f"{'per sample us':>13} {'batch / MBS8 batch':>18}")
    base = m["rows"][0]["per_batch_s"]
    for r in m["rows"]:
        print(f"   {r['mbs']:>4} {r['steps']:>5} {r['cycle_s'] * 1e3:>9.2f} "
              f"{r['p25_s'] * 1e3:>7.2f}-{r['p75_s'] * 1e3:<7.2f} {r['wall_s'] * 1e3:>8.2f} "
              f"{r['per_batch_s'] * 1e3:>12.3f} {r['per_sample_s'] * 1e6:>13.2f} {r['per_batch_s'] / base:>18.2f}")


def print_predictions(m: dict[str, Any], preds: dict[str, Any]) -> None:
    mbs_list = [r["mbs"] for r in m["rows"]]
    print("   predicted cycle ms (relative error vs measured; * = MBS used in the fit):")
    head = f"   {'model':<44} {'a ms':>7} {'b us/smp':>8} " + " ".join(f"{'MBS ' + str(x):>16}" for x in mbs_list)
    print(head + f" {'held-out |err| mean/max':>24}")
    print(f"   {'measured':<44} {'':>7} {'':>8} " + " ".join(f"{r['cycle_s'] * 1e3:>16.2f}" for r in m["rows"]))
    for name, p in preds.items():
        cells = []
        for q in p["predictions"]:
            cells.append(f"{q['predicted_s'] * 1e3:.2f} ({q['rel_error']:+.0%}){'*' if q['in_fit'] else ' '}".rjust(16))
        mean, mx = p["mean_abs_rel_error_held_out"], p["max_abs_rel_error_held_out"]
        tail = "-" if mean is None else f"{mean:.0%} / {mx:.0%}"
        print(f"   {name:<44} {p['a'] * 1e3:>7.3f} {p['b'] * 1e6:>8.2f} " + " ".join(cells) + f" {tail:>24}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="digits,mnist1d", help="comma-separated: digits, mnist1d (default both)")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--dss", type=int, default=512)
    ap.add_argument("--mbs", default="8,16,32,64,128,256")
    ap.add_argument("--fit-mbs", default="16,32", help="the two (or more) MBS values the models are fitted on")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--json", help="write all figures here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    mbs_list = [int(v) for v in args.mbs.split(",") if v]
    fit_mbs = [int(v) for v in args.fit_mbs.split(",") if v]
    if len(set(fit_mbs)) < 2 or not set(fit_mbs) <= set(mbs_list):
        print("--fit-mbs needs two or more distinct values from --mbs", file=sys.stderr)
        return 2
    print(machine_line())
    report: dict[str, Any] = {"args": vars(args), "results": []}
    for dataset in [d for d in args.datasets.split(",") if d]:
        for precision in [p for p in args.precisions.split(",") if p]:
            try:
                m = measure(dataset, precision, args.dss, mbs_list, args.repeats, args.warmup, args.lr)
            except ImportError as exc:  # mnist1d is an optional extra
                print(f"\n== {dataset}: skipped ({exc})")
                break
            preds = predictions(m, fit_mbs)
            print_measure(m)
            print_predictions(m, preds)
            report["results"].append({**m, "models": preds})
    print("\nK = seconds per mini-batch. A constant K (Hermes Eq. 3) says a cycle of DSS samples costs K*DSS/MBS, "
          "so doubling MBS halves it; the per-batch column shows K grows with MBS instead. The linear fit from two "
          "MBS values separates the fixed per-step cost a from the per-sample cost b.")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
