#!/usr/bin/env python
"""Presets side by side on the local testbed: time to target, communication, WI, balance.

    python benchmarks/compare_presets.py [--presets hermes,asp,bsp] [--profile hl8] [--clients 4]
        [--dataset digits] [--target-accuracy 0.9] [--max-seconds 120] [--repeats 1]
        [--out runs/compare] [--set KEY=VALUE ...]

For each preset and repeat (seeds 0..repeats-1), one after the other, it runs

    python -m hermes.deploy.testbed ... --preset P --seed S --out OUT/P-rS --quiet

and reads ``OUT/P-rS/summary.json``. It prints:

1. one table of the presets side by side (medians, and min-max over repeats
   when there are several): runs that reached the target, seconds to target
   (from agent launch, as the testbed measures it), "train s" (from the last
   agent's join to the evaluation that reached the target: the same figure
   without the agents' start-up, several seconds on a small machine), wall
   seconds, model updates, data-plane messages (summary ``messages_total``,
   the "API calls" of Hermes Table III), push+pull messages only (the model
   exchange the gate saves; the rest are shard fetches, work requests and
   stats), messages per model update, MB sent and received by the agents, WI
   (mean over workers of local iterations / model requests, Hermes Eq. 7)
   and final accuracy;
2. the same presets against BSP: speed-up (BSP seconds to target / preset
   seconds to target, also on train s) and communication (preset / BSP
   messages, push+pull messages and bytes);
3. per preset, a per-worker table: speed, cycles, pushes, gate skips, WI,
   final DSS/MBS, and the cycle time after the search (median compute
   seconds of the worker's last ``--tail`` cycles), the cluster median of
   those and each worker's ratio to it, with whether the slowest worker
   (lowest emulated speed) is within ``--balance-tolerance`` of the median
   (the Hermes issue's must-show for HL8).

Everything is also written to ``OUT/comparison.json``. A run that fails or
times out is reported and left out of the figures; it never stops the rest.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_info, print_table

from hermes.deploy.bench.aggregate import event_figures

# --------------------------------------------------------------------------- machine


# --------------------------------------------------------------------------- one run


def run_one(args: argparse.Namespace, preset: str, seed: int, out_root: Path) -> dict[str, Any]:
    out = out_root / f"{preset}-r{seed}"
    cmd = [
        sys.executable, "-m", "hermes.deploy.testbed",
        "--clients", str(args.clients), "--profile", args.profile, "--preset", preset,
        "--dataset", args.dataset, "--model", args.model,
        "--max-seconds", f"{args.max_seconds:g}", "--seed", str(seed), "--out", str(out), "--quiet",
    ]
    if args.target_accuracy is not None:
        cmd += ["--target-accuracy", f"{args.target_accuracy:g}"]
    for kv in args.set:
        cmd += ["--set", kv]
    if getattr(args, "pace", None):
        cmd += ["--pace", f"{args.pace:g}"]
    # A summary left by an earlier run in the same folder must not pass for this one.
    (out / "summary.json").unlink(missing_ok=True)
    out_root.mkdir(parents=True, exist_ok=True)
    log_path = out_root / f"{preset}-r{seed}.log"
    timeout = args.run_timeout or (args.max_seconds + 150.0)
    t0 = time.time()
    rec: dict[str, Any] = {"preset": preset, "seed": seed, "out": str(out), "cmd": cmd, "log": str(log_path)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM, not SIGKILL: the testbed then stops its server and agents (their own
        # sessions, which a killed testbed would leave running).
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        rec["error"] = f"timed out after {timeout:.0f}s (testbed exit {proc.returncode})"
    rec["exit_code"] = proc.returncode
    log_path.write_text(_text(stdout) + "\n--- stderr ---\n" + _text(stderr))
    rec["elapsed"] = round(time.time() - t0, 3)
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        rec.setdefault("error", f"exit {rec['exit_code']}; no summary.json ({exc.__class__.__name__})")
        rec["ok"] = False
        return rec
    if rec["exit_code"] != 0:
        rec.setdefault("error", f"exit {rec['exit_code']}")
    rec["ok"] = rec["exit_code"] == 0
    rec.update(run_figures(summary, args.tail))
    rec.update(event_figures(out / "events.jsonl"))
    return rec


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def run_figures(s: dict[str, Any], tail: int) -> dict[str, Any]:
    """The per-run figures the tables show, from one testbed summary."""
    workers = s.get("workers", [])
    updates = s.get("model_updates", 0) or 0
    messages = s.get("messages_total", 0) or 0
    wis = [w["wi"] for w in workers if w.get("wi") is not None]
    base_dss = (s.get("config") or {}).get("cycle_samples")
    per_worker = []
    for w in workers:
        log = w.get("cycle_log") or []
        last = log[-tail:]
        times = [row[3] for row in last]
        final_dss = w.get("dss")
        per_worker.append({
            "name": w.get("name"),
            "id": w.get("id"),
            "speed": w.get("speed"),
            "cycles": w.get("cycles", 0),
            "pushes": w.get("pushes", 0),
            "pulls": w.get("pulls", 0),
            "gate_pushes": w.get("gate_pushes", 0),
            "gate_skips": w.get("gate_skips", 0),
            "wi": w.get("wi"),
            "dss": final_dss,
            "batch_size": w.get("batch_size", w.get("mbs")),  # mbs: summaries before issue 26
            "resizes": max(0, len(w.get("workload_history") or []) - 1),
            "samples": w.get("samples", 0),
            "compute_seconds": w.get("compute_seconds", 0.0),
            "utilization": w.get("utilization", 0.0),
            "exit_code": w.get("exit_code"),
            # Median compute seconds of the last ``tail`` cycles, and how many of them ran the final DSS.
            "tail_cycle_seconds": _median(times),
            "tail_cycles": len(times),
            "tail_at_final_dss": sum(1 for row in last if row[1] == final_dss),
        })
    tails = [w["tail_cycle_seconds"] for w in per_worker if w["tail_cycle_seconds"] is not None]
    cluster = _median(tails)
    for w in per_worker:
        t = w["tail_cycle_seconds"]
        w["ratio_to_median"] = None if t is None or not cluster else t / cluster
    balance: dict[str, Any] = {"cluster_median_seconds": cluster}
    if per_worker and cluster:
        slowest = min(per_worker, key=lambda w: (w["speed"] or 0.0, w["name"] or ""))
        worst = max((w for w in per_worker if w["ratio_to_median"] is not None),
                    key=lambda w: abs(w["ratio_to_median"] - 1.0))
        balance.update({
            "slowest_worker": slowest["name"],
            "slowest_speed": slowest["speed"],
            "slowest_ratio": slowest["ratio_to_median"],
            "worst_worker": worst["name"],
            "worst_ratio": worst["ratio_to_median"],
            "max_over_median": max(w["ratio_to_median"] for w in per_worker if w["ratio_to_median"] is not None),
        })
    return {
        "outcome": s.get("outcome"),
        "reached_target": bool(s.get("reached_target")),
        "seconds_to_target": s.get("seconds_to_target"),
        "wall_seconds": s.get("wall_seconds"),
        "model_updates": updates,
        "messages_total": messages,
        "messages_by_type": s.get("messages_by_type", {}),
        "messages_per_update": messages / updates if updates else None,
        # Model exchange only (push_update + pull_model): what Hermes' gate saves; fetch_shard,
        # request_work and report_stats are the sample and bookkeeping traffic around it.
        "model_messages": sum((s.get("messages_by_type") or {}).get(k, 0) for k in ("push_update", "pull_model")),
        "bytes_sent_mb": (s.get("bytes_sent_total", 0) or 0) / 1e6,
        "bytes_received_mb": (s.get("bytes_received_total", 0) or 0) / 1e6,
        "wi_mean": statistics.fmean(wis) if wis else None,
        "final_accuracy": s.get("final_accuracy"),
        "epochs": s.get("epochs"),
        "base_dss": base_dss,
        "config": s.get("config"),
        "workers": per_worker,
        "balance": balance,
    }


# --------------------------------------------------------------------------- aggregation

METRICS = ["seconds_to_target", "train_seconds_to_target", "wall_seconds", "model_updates", "messages_total",
           "model_messages", "messages_per_update",
           "bytes_sent_mb", "bytes_received_mb", "wi_mean", "final_accuracy"]


def spread(xs: list[float]) -> dict[str, Any] | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("ok")]
    out: dict[str, Any] = {
        "runs": len(runs),
        "ok": len(ok),
        "reached": sum(1 for r in ok if r.get("reached_target")),
        "failed": [{"seed": r["seed"], "error": r.get("error")} for r in runs if not r.get("ok")],
    }
    for m in METRICS:
        if m in ("seconds_to_target", "train_seconds_to_target"):
            vals = [r[m] for r in ok if r.get("reached_target")]
        else:
            vals = [r.get(m) for r in ok]
        out[m] = spread(vals)
    within = [r["balance"].get("slowest_ratio") for r in ok if r.get("balance", {}).get("slowest_ratio") is not None]
    out["slowest_ratio"] = spread(within)
    return out


def versus(agg: dict[str, dict[str, Any]], base: str) -> dict[str, dict[str, Any]]:
    """Ratios of medians against ``base``: speed-up (base time / preset time) and communication (preset / base)."""
    b = agg.get(base)
    res: dict[str, dict[str, Any]] = {}
    if b is None:
        return res

    def med(a: dict[str, Any], k: str) -> float | None:
        return None if a.get(k) is None else a[k]["median"]

    for p, a in agg.items():
        r: dict[str, Any] = {}
        bt, pt = med(b, "seconds_to_target"), med(a, "seconds_to_target")
        r["speedup_time_to_target"] = bt / pt if bt and pt else None
        bt, pt = med(b, "train_seconds_to_target"), med(a, "train_seconds_to_target")
        r["speedup_train_time_to_target"] = bt / pt if bt and pt else None
        for k, name in (("messages_total", "messages_ratio"), ("model_messages", "model_messages_ratio"),
                        ("bytes_sent_mb", "bytes_sent_ratio"),
                        ("bytes_received_mb", "bytes_received_ratio")):
            bv, pv = med(b, k), med(a, k)
            r[name] = pv / bv if bv and pv is not None else None
        bs, bsr = med(b, "bytes_sent_mb"), med(b, "bytes_received_mb")
        ps, psr = med(a, "bytes_sent_mb"), med(a, "bytes_received_mb")
        r["bytes_total_ratio"] = (ps + psr) / (bs + bsr) if None not in (bs, bsr, ps, psr) and bs + bsr else None
        res[p] = r
    return res


# --------------------------------------------------------------------------- printing


def fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:.0f}"
        return f"{v:.{nd}f}"
    return str(v)


def fmt_spread(s: dict[str, Any] | None, nd: int = 2, repeats: int = 1) -> str:
    if s is None:
        return "-"
    med = fmt(s["median"], nd)
    if repeats > 1 and s["n"] > 1:
        return f"{med} [{fmt(s['min'], nd)}-{fmt(s['max'], nd)}]"
    return med


def print_main(presets: list[str], agg: dict[str, dict[str, Any]], repeats: int) -> None:
    rows = []
    for p in presets:
        a = agg[p]
        rows.append([
            p, f"{a['reached']}/{a['runs']}",
            fmt_spread(a["seconds_to_target"], 1, repeats), fmt_spread(a["train_seconds_to_target"], 1, repeats),
            fmt_spread(a["wall_seconds"], 1, repeats),
            fmt_spread(a["model_updates"], 0, repeats), fmt_spread(a["messages_total"], 0, repeats),
            fmt_spread(a["model_messages"], 0, repeats),
            fmt_spread(a["messages_per_update"], 1, repeats),
            fmt_spread(a["bytes_sent_mb"], 2, repeats), fmt_spread(a["bytes_received_mb"], 2, repeats),
            fmt_spread(a["wi_mean"], 2, repeats), fmt_spread(a["final_accuracy"], 3, repeats),
        ])
    note = " (median [min-max] over repeats)" if repeats > 1 else ""
    note += ("; s to target from agent launch; train s from the last agent's join (start-up excluded); "
             "messages = all data-plane requests (summary messages_total); push+pull = model exchange only")
    print_table(
        f"Presets side by side{note}",
        ["preset", "reached", "s to target", "train s", "wall s", "updates", "messages", "push+pull", "msg/update",
         "sent MB", "recv MB", "WI", "final acc"],
        rows,
    )


def print_versus(presets: list[str], vs: dict[str, dict[str, Any]], base: str) -> None:
    if not vs:
        print(f"\nNo comparison against {base}: it was not run or produced no figures.")
        return
    rows = []
    for p in presets:
        r = vs.get(p, {})
        rows.append([
            p,
            "-" if r.get("speedup_time_to_target") is None else f"{r['speedup_time_to_target']:.2f}x",
            "-" if r.get("speedup_train_time_to_target") is None else f"{r['speedup_train_time_to_target']:.2f}x",
            fmt(r.get("messages_ratio")), fmt(r.get("model_messages_ratio")), fmt(r.get("bytes_sent_ratio")), fmt(r.get("bytes_received_ratio")),
            fmt(r.get("bytes_total_ratio")),
        ])
    print_table(
        f"Against {base} (medians). speed-up = {base} seconds to target / preset seconds to target (>1: faster); "
        f"communication = preset / {base} (<1: less)",
        ["preset", f"speed-up vs {base}", "(train s)", f"messages / {base}", f"push+pull / {base}",
         f"sent bytes / {base}",
         f"recv bytes / {base}", f"all bytes / {base}"],
        rows,
    )


def print_workers(preset: str, runs: list[dict[str, Any]], tail: int, tolerance: float) -> None:
    for r in runs:
        title = f"{preset} seed {r['seed']}: per worker"
        if not r.get("ok"):
            print(f"\n{title}: RUN FAILED ({r.get('error')}); log {r.get('log')}")
            if not r.get("workers"):
                continue
        rows = []
        for w in sorted(r.get("workers", []), key=lambda w: (-(w["speed"] or 0), w["name"] or "")):
            rows.append([
                str(w["name"]), fmt(w["speed"], 3), str(w["cycles"]), str(w["pushes"]), str(w["gate_skips"]),
                fmt(w["wi"]), f"{fmt(w['dss'])}/{fmt(w['batch_size'])}", str(w["resizes"]),
                "-" if w["tail_cycle_seconds"] is None else f"{w['tail_cycle_seconds'] * 1e3:.1f}",
                f"{w['tail_at_final_dss']}/{w['tail_cycles']}",
                "-" if w["ratio_to_median"] is None else f"{w['ratio_to_median']:.2f}",
            ])
        b = r.get("balance", {})
        cm = b.get("cluster_median_seconds")
        print_table(
            f"{title} (cycle time = median compute of the last {tail} cycles; "
            f"cluster median {'-' if cm is None else f'{cm * 1e3:.1f} ms'}; outcome: {r.get('outcome')})",
            ["worker", "speed", "cycles", "pushes", "gate skips", "WI", "DSS/MBS", "resizes",
             "cycle ms", "at final DSS", "/ median"],
            rows,
        )
        if b.get("slowest_ratio") is not None:
            ok = abs(b["slowest_ratio"] - 1.0) <= tolerance
            print(f"  slowest worker {b['slowest_worker']} (speed {b['slowest_speed']:.3f}): cycle time "
                  f"{b['slowest_ratio']:.2f}x the cluster median -> within {tolerance:.0%}: {'YES' if ok else 'NO'}; "
                  f"worst worker {b['worst_worker']} at {b['worst_ratio']:.2f}x")


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="hermes,asp,bsp", help="comma-separated presets (default hermes,asp,bsp)")
    p.add_argument("--profile", default="hl8")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="cnn")
    p.add_argument("--target-accuracy", type=float, default=0.9)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--repeats", type=int, default=1, help="runs per preset, seeds 0..repeats-1")
    p.add_argument("--out", default="runs/compare")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override passed to every run (repeatable)")
    p.add_argument("--baseline", default="bsp", help="preset the speed-up and communication ratios are against")
    p.add_argument("--tail", type=int, default=5, help="cycles per worker for the cycle time after search")
    p.add_argument("--balance-tolerance", type=float, default=0.2,
                   help="the slowest worker's cycle time must be within this fraction of the median (default 0.2)")
    p.add_argument("--run-timeout", type=float, default=None,
                   help="seconds before a testbed run is killed (default max-seconds + 150)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    if not presets or args.repeats < 1 or args.tail < 1:
        print("compare_presets: need at least one preset, --repeats >= 1 and --tail >= 1", file=sys.stderr)
        return 2
    out_root = Path(args.out).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    print(f"machine: {machine['cpu_model'] or '?'}; cpu_count={machine['cpu_count']} "
          f"usable={machine['cpus_usable']}; torch {machine['torch']}; python {machine['python']}; "
          f"load {machine['loadavg_at_start']}")
    print(f"runs: presets={','.join(presets)} profile={args.profile} clients={args.clients} dataset={args.dataset} "
          f"model={args.model} target={args.target_accuracy} max_seconds={args.max_seconds:g} "
          f"repeats={args.repeats} overrides={args.set or 'none'} out={out_root}")

    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in presets}
    for seed in range(args.repeats):
        for p in presets:
            rec = run_one(args, p, seed, out_root)
            runs[p].append(rec)
            if rec.get("ok"):
                stt = rec.get("seconds_to_target")
                print(f"  {p:<8} seed {seed}: {rec['outcome']}; "
                      f"{'to target ' + format(stt, '.1f') + 's' if stt is not None else 'target not reached'}"
                      f"{' (train ' + format(rec['train_seconds_to_target'], '.1f') + 's)' if rec.get('train_seconds_to_target') is not None else ''}; "
                      f"wall {rec['wall_seconds']:.1f}s; acc {fmt(rec['final_accuracy'], 3)}; "
                      f"updates {rec['model_updates']}; messages {rec['messages_total']}", flush=True)
            else:
                print(f"  {p:<8} seed {seed}: FAILED: {rec.get('error')} (log {rec['log']})", flush=True)

    agg = {p: aggregate(runs[p]) for p in presets}
    vs = versus(agg, args.baseline)
    print_main(presets, agg, args.repeats)
    print_versus(presets, vs, args.baseline)
    for p in presets:
        print_workers(p, runs[p], args.tail, args.balance_tolerance)
    for p in presets:
        a = agg[p]
        if a["slowest_ratio"] is not None:
            n_ok = sum(1 for r in runs[p] if r.get("ok") and r["balance"].get("slowest_ratio") is not None
                       and abs(r["balance"]["slowest_ratio"] - 1.0) <= args.balance_tolerance)
            print(f"{p}: slowest worker within {args.balance_tolerance:.0%} of the cluster median in "
                  f"{n_ok}/{a['slowest_ratio']['n']} runs (ratio {fmt_spread(a['slowest_ratio'], 2, args.repeats)})")
        for f in a["failed"]:
            print(f"{p}: seed {f['seed']} failed: {f['error']}")

    report = {
        "machine": machine,
        "args": vars(args),
        "presets": presets,
        "aggregate": agg,
        f"versus_{args.baseline}": vs,
        "runs": runs,
    }
    (out_root / "comparison.json").write_text(json.dumps(report, indent=2))
    print(f"\nwritten: {out_root / 'comparison.json'}")
    return 0 if all(r.get("ok") for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
