#!/usr/bin/env python
"""Issue 29's attack matrix, measured: honest and attacked runs side by side, medians of repeats.

    python benchmarks/attack_matrix.py [--suite signflip|claims|takeover|barrier|sybils|journal]
        [--presets asp,fedasync,fedbuff,bsp,hermes] [--ks 0,3,10,30] [--repeats 3] [--out runs/attack-matrix]
    python benchmarks/attack_matrix.py --report runs/attack-matrix/*/attack_matrix.jsonl

One suite per attack family; each run is a live test's run function (a real server with its default
screening, three honest ``hermes-client`` agents on digits, the attacker through the real planes), and
k = 0 is the same run with the attack switched off: the honest run each ratio is taken against.

- ``signflip`` (tests/integration/test_signflip_live.py, ``_signflip_run``): the attacker pushes the
  reverse of the honest global step at k x the median accepted norm, one every 8 honest pushes, for the
  whole run; k = 0 pushes zeros at the same pace.
- ``claims`` (test_lying_claims_live.py): a fourth worker pushing zeros, truthful (k = 0) or lying
  (k = 1: samples 1e9 under bsp; 128 samples in 1e-6 s under edp-sgd).
- ``takeover``, ``barrier``, ``sybils``, ``journal`` (test_attack_matrix_live.py): registrations of
  the honest agents' names; a silent and an always-failing worker at a bsp barrier; a registration flood
  from one join token whose admitted Sybils flip; a bit flipped mid-journal before a resume.

Every run is timed the same way, attacked or not: from the honest agents' start to the first evaluation
at or above the target (0.8) of a model made after the attack began, with the attack going on until
then; the run's own checks decide "held" (target reached, no honest worker refused or quarantined, the
suite's own). The table gives each k's median seconds over the runs that held, its ratio to k = 0's
median, and issue 29's rule: every run held and the ratio <= 1.5. Within one repeat the ks run one
after the other, so the load drifts over all of them alike.

Take the bench lock (docs/testbed-and-bench.md): ``flock -w 900 /work/locks/bench.lock python
benchmarks/attack_matrix.py ...``. Results go to OUT/attack_matrix.jsonl as each run ends, and
the table to OUT/attack_matrix.json; ``--report`` prints the table of any jsonl files (one
invocation may hold only a part of a suite). Exit status 1 when a cell breaks the rule.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import loadavg, print_table

ROOT = Path(__file__).resolve().parents[1]
RULE = 1.5  # issue 29: each attacked run reaches the target within 1.5x the honest run's time


# suite: (default presets, default ks)
SUITES = {
    "signflip": ("asp,fedasync,fedbuff,bsp,hermes", "0,3,10,30"),
    "claims": ("bsp,edp-sgd", "0,1"),
    "takeover": ("asp", "0,1"),
    "barrier": ("bsp", "0,1"),
    "sybils": ("asp", "0,1"),
    "journal": ("asp", "0,1"),
}


def run_suite(suite: str, tmp: Path, preset: str, k: float, env: dict[str, str | None],
              target: float | None = None) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    if suite == "signflip":
        from tests.integration.test_signflip_live import _signflip_run
        return {**_signflip_run(tmp, preset, k, env=env or None), **({"server_env": env} if env else {})}
    if suite == "claims":
        from tests.integration.test_lying_claims_live import _lying_run
        return {**_lying_run(tmp, preset, lie=k > 0), "k": k}
    from tests.integration import test_attack_matrix_live as live
    if target is not None:
        # A takeover run at 0.8 trains 0.9-2.0 s: one evaluation more or less (every 0.5 s) is 25-50% of it.
        live.TARGET = target
    return {**live.RUNS[suite](tmp, preset, attack=k > 0), "k": k, "target": live.TARGET}


def one_run(suite: str, preset: str, k: float, out: Path, env: dict[str, str | None],
            target: float | None = None) -> dict[str, Any]:

    load_before = loadavg()
    t0 = time.monotonic()
    # Absolute: the server runs with its out dir as cwd and would resolve a relative --out again inside it.
    tmp = Path(tempfile.mkdtemp(prefix=f"{preset}-k{k:g}-", dir=out.resolve()))
    try:
        result = run_suite(suite, tmp, preset, k, env, target)
        held, why = True, ""
    except AssertionError as exc:  # the run's own checks: not reached, an honest worker refused, ...
        result, held, why = {"preset": preset, "k": k}, False, str(exc).splitlines()[0][:300]
    # Every run's server events and agents' logs are kept for the post-mortem (~0.2 MB a run); the models are not.
    for model in tmp.rglob("*.safetensors"):
        model.unlink()
    return {**result, **training_seconds(tmp), "suite": suite, "held": held, "why": why, "kept": str(tmp),
            "wall_s": round(time.monotonic() - t0, 1),
            "load_before": load_before, "load_after": loadavg(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                     time.gmtime())}


def training_seconds(tmp: Path) -> dict[str, Any]:
    """Seconds from the server's first applied honest update to the run's stop (which follows the target's
    evaluation within a status poll): the time to target without the agents' start-up (python, torch and the
    data set: 3 s at load 3, 25 s at load 12; it is the same work attacked or not, and its noise hid the
    attacks' effect). Only for runs with one server (the journal suite's two are timed from the agents' start)."""
    logs = list(tmp.rglob("events.jsonl"))
    if len(logs) != 1:
        return {}
    events = [json.loads(line) for line in logs[0].read_text().splitlines() if line.strip()]
    honest = {e["worker"] for e in events if e["event"] == "join" and str(e.get("name", "")).startswith("honest")}
    first = next((e["ts"] for e in events if e["event"] == "update_applied" and honest & set(e["workers"])), None)
    stop = next((e["ts"] for e in events if e["event"] == "stop_requested"), None)
    return {} if first is None or stop is None else {"train_s": round(stop - first, 1)}


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (suite, preset, k), in the order first seen; each ratio against the same suite and preset's k = 0."""
    cells = []
    keys = list(dict.fromkeys((r.get("suite", "signflip"), r["preset"], r["k"]) for r in rows))
    for suite, preset, k in keys:
        same = [r for r in rows if r.get("suite", "signflip") == suite and r["preset"] == preset]
        honest = [r["seconds_to_target"] for r in same if r["k"] == 0 and r["held"]]
        base = statistics.median(honest) if honest else None
        runs = [r for r in same if r["k"] == k]
        held = [r["seconds_to_target"] for r in runs if r["held"]]
        med = statistics.median(held) if held else None
        ratio = None if med is None or base is None or k == 0 else med / base
        ok = len(held) == len(runs) and (k == 0 or (ratio is not None and ratio <= RULE))
        # The same from the first applied honest update (training_seconds): beside the rule, not instead of it.
        train_base = [r["train_s"] for r in same if r["k"] == 0 and r["held"] and "train_s" in r]
        train = [r["train_s"] for r in runs if r["held"] and "train_s" in r]
        train_med = statistics.median(train) if train else None
        train_ratio = (None if train_med is None or not train_base or k == 0
                       else train_med / statistics.median(train_base))
        # The 1-minute load average before and after each run.
        loads = [r[key][0] for r in runs for key in ("load_before", "load_after") if r.get(key)]
        cells.append({"suite": suite, "preset": preset, "k": k, "runs": len(runs), "held": len(held),
                      "median_s": med, "seconds": held, "ratio": ratio, "meets_rule": ok,
                      "train_s": train, "train_median_s": train_med, "train_ratio": train_ratio,
                      "load": [min(loads), max(loads)] if loads else None,
                      "at": [min(r["at"] for r in runs), max(r["at"] for r in runs)],
                      "refusals": [r.get("refusals") for r in runs if r["held"] and k > 0],
                      "failures": [r["why"] for r in runs if not r["held"]]})
    return cells


def show(cells: list[dict[str, Any]], title: str) -> None:
    print_table(title, ["suite", "preset", "k", "held", "seconds", "median s", "x honest", f"<= {RULE}x",
                        "train s", "x honest (train)", "load"],
                [[c["suite"], c["preset"], f"{c['k']:g}", f"{c['held']}/{c['runs']}",
                  ", ".join(f"{x:.1f}" for x in c["seconds"]),
                  "-" if c["median_s"] is None else f"{c['median_s']:.1f}",
                  "-" if c["ratio"] is None else f"{c['ratio']:.2f}", "yes" if c["meets_rule"] else "NO",
                  ", ".join(f"{x:.1f}" for x in c.get("train_s", [])),
                  "-" if c.get("train_ratio") is None else f"{c['train_ratio']:.2f}",
                  "-" if c["load"] is None else f"{c['load'][0]:.1f}-{c['load'][1]:.1f}"] for c in cells])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--suite", choices=tuple(SUITES), default="signflip")
    ap.add_argument("--presets", default=None, help="default: the suite's (" +
                    "; ".join(f"{k}: {v[0]}" for k, v in SUITES.items()) + ")")
    ap.add_argument("--ks", default=None, help="signflip: 0,3,10,30; the other suites: 0,1 (0: the attack off)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/attack-matrix"))
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no repeat that would end past this many seconds (by the longest repeat so far): "
                         "keeps one invocation under the bench lock's limit; run the rest in another")
    ap.add_argument("--server-env", action="append", default=[], metavar="HERMES_X=V",
                    help="signflip: an environment variable for the servers (a screening setting to compare, "
                         "e.g. HERMES_SCREENING__DIRECTION_NORM_FACTOR=2); recorded in each row")
    ap.add_argument("--target", type=float, default=None,
                    help="takeover, barrier, sybils, journal: the accuracy to reach (default 0.8, the live tests')")
    ap.add_argument("--report", type=Path, nargs="+", default=None,
                    help="print the table of these attack_matrix.jsonl files; run nothing")
    ap.add_argument("--markdown", action="store_true", help="with --report: the table as markdown rows")
    args = ap.parse_args()
    if args.report:
        rows = [json.loads(line) for f in args.report for line in f.read_text().splitlines() if line.strip()]
        cells = table(rows)
        if args.markdown:
            for c in cells:
                print(f"| {c['suite']} | {c['preset']} | {c['k']:g} | {c['held']}/{c['runs']} | "
                      + ", ".join(f"{x:.1f}" for x in c["seconds"]) + " | "
                      + ("-" if c["median_s"] is None else f"{c['median_s']:.1f}") + " | "
                      + ("-" if c["ratio"] is None else f"{c['ratio']:.2f}") + " | "
                      + ("yes" if c["meets_rule"] else "**NO**") + " | "
                      + (", ".join(f"{x:.1f}" for x in c["train_s"]) or "-") + " | "
                      + ("-" if c["train_ratio"] is None else f"{c['train_ratio']:.2f}") + " | "
                      + f"{c['at'][0][11:16]}-{c['at'][1][11:16]}, {c['load'][0]:.0f}-{c['load'][1]:.0f} |")
        else:
            show(cells, f"{len(rows)} runs from {len(args.report)} file(s)")
        return 0 if all(c["meets_rule"] for c in cells) else 1
    presets = [p for p in (args.presets or SUITES[args.suite][0]).split(",") if p]
    ks = [float(k) for k in (args.ks or SUITES[args.suite][1]).split(",")]
    if 0.0 not in ks:
        ap.error("--ks must include 0: the honest run each ratio is taken against")
    if args.server_env and args.suite != "signflip":
        ap.error("--server-env is for the signflip suite")
    if args.target is not None and args.suite in ("signflip", "claims"):
        ap.error("--target is for the takeover, barrier, sybils and journal suites")
    env: dict[str, str | None] = dict(kv.split("=", 1) for kv in args.server_env)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "attack_matrix.jsonl"
    rows: list[dict[str, Any]] = []
    started, longest = time.monotonic(), 0.0
    for preset in presets:
        for rep in range(args.repeats):
            if args.budget_s is not None and time.monotonic() - started + longest > args.budget_s:
                print(f"budget: {preset} repeat {rep + 1} not started", flush=True)
                break
            rep_start = time.monotonic()
            for k in ks:
                row = {**one_run(args.suite, preset, k, args.out, env, args.target), "repeat": rep}
                rows.append(row)
                with log.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"{args.suite} {preset} k={k:g} #{rep + 1}: held={row['held']} "
                      f"seconds={row.get('seconds_to_target')} load={row['load_before']} {row['why']}", flush=True)
            longest = max(longest, time.monotonic() - rep_start)
    cells = table(rows)
    (args.out / "attack_matrix.json").write_text(json.dumps({"cells": cells, "rows": rows}, indent=1))
    show(cells, f"{args.suite}, {args.repeats} repeats, load {loadavg()}")
    return 0 if all(c["meets_rule"] for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
