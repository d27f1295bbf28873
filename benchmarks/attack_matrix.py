#!/usr/bin/env python
"""Issue 29's attack matrix, measured: honest and attacked runs side by side, medians of repeats.

    python benchmarks/attack_matrix.py [--suite signflip|claims] [--presets asp,fedasync,fedbuff,bsp,hermes]
        [--ks 0,3,10,30] [--repeats 3] [--out runs/attack-matrix]

Each run is tests/integration/test_signflip_live.py's (``_signflip_run``): a real server with its
default screening, 3 honest ``hermes-client`` agents on digits, and a sign-flip attacker with the
join token that pushes 6 flips of the honest global step at k x the median accepted norm, one
every 8 honest updates; k = 0 is the same run with the attacker only idling (the honest run).
The run's own checks decide "held": the target 0.8 reached by a model evaluated after the last
flip, no honest worker refused or quarantined, flips at k >= 10 refused or folded clipped. The
time is from the agents' start to that evaluation. Within one repeat the ks run one after the
other, so the load drifts over all of them alike; the table gives each k's median seconds, its
ratio to k = 0's median, and issue 29's rule: every attacked run held and the ratio <= 1.5.
``--suite claims`` runs tests/integration/test_lying_claims_live.py's instead: k = 0 a worker pushing
zeros with truthful claims, k = 1 the same worker lying (samples 1e9 under bsp; 128 samples in 1e-6 s
under edp-sgd).

Take the bench lock (docs/testbed-and-bench.md): ``flock -w 900 /work/locks/bench.lock python
benchmarks/attack_matrix.py ...``. Results go to OUT/attack_matrix.jsonl as each run ends, and
the table to OUT/attack_matrix.json. Exit status 1 when a cell breaks the rule.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import loadavg, print_table

ROOT = Path(__file__).resolve().parents[1]
RULE = 1.5  # issue 29: each attacked run reaches the target within 1.5x the honest run's time


def one_run(suite: str, preset: str, k: float, out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.integration.test_lying_claims_live import _lying_run
    from tests.integration.test_signflip_live import _signflip_run

    load_before = loadavg()
    t0 = time.monotonic()
    # Absolute: the server runs with its out dir as cwd and would resolve a relative --out again inside it.
    tmp = Path(tempfile.mkdtemp(prefix=f"{preset}-k{k:g}-", dir=out.resolve()))
    try:
        if suite == "claims":
            result = {**_lying_run(tmp, preset, lie=k > 0), "k": k}
        else:
            result = _signflip_run(tmp, preset, k)
        held, why = True, ""
        shutil.rmtree(tmp)
    except AssertionError as exc:  # the run's own checks: not reached, an honest worker refused, ...
        # Kept (server events, agents' logs) for the post-mortem.
        result, held, why = {"preset": preset, "k": k, "kept": str(tmp)}, False, str(exc).splitlines()[0][:300]
    return {**result, "held": held, "why": why, "wall_s": round(time.monotonic() - t0, 1),
            "load_before": load_before, "load_after": loadavg(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                     time.gmtime())}


def table(rows: list[dict[str, Any]], presets: list[str], ks: list[float]) -> list[dict[str, Any]]:
    cells = []
    for preset in presets:
        honest = [r["seconds_to_target"] for r in rows if r["preset"] == preset and r["k"] == 0 and r["held"]]
        base = statistics.median(honest) if honest else None
        for k in ks:
            runs = [r for r in rows if r["preset"] == preset and r["k"] == k]
            held = [r["seconds_to_target"] for r in runs if r["held"]]
            med = statistics.median(held) if held else None
            ratio = None if med is None or base is None or k == 0 else med / base
            ok = len(held) == len(runs) and (k == 0 or (ratio is not None and ratio <= RULE))
            cells.append({"preset": preset, "k": k, "runs": len(runs), "held": len(held), "median_s": med,
                          "seconds": held, "ratio": ratio, "meets_rule": ok,
                          "refused_flips": [r.get("refusals") for r in runs if r["held"] and k > 0],
                          "failures": [r["why"] for r in runs if not r["held"]]})
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--suite", choices=("signflip", "claims"), default="signflip",
                    help="claims: tests/integration/test_lying_claims_live.py's runs, k 0 truthful, 1 lying "
                         "(samples 1e9 under bsp, 128 samples in 1e-6 s under edp-sgd)")
    ap.add_argument("--presets", default=None, help="signflip: asp,fedasync,fedbuff,bsp,hermes; claims: bsp,edp-sgd")
    ap.add_argument("--ks", default=None, help="signflip: 0,3,10,30; claims: 0,1")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/attack-matrix"))
    args = ap.parse_args()
    claims = args.suite == "claims"
    presets = [p for p in (args.presets or ("bsp,edp-sgd" if claims else "asp,fedasync,fedbuff,bsp,hermes")).split(",")
               if p]
    ks = [float(k) for k in (args.ks or ("0,1" if claims else "0,3,10,30")).split(",")]
    if 0.0 not in ks:
        ap.error("--ks must include 0: the honest run each ratio is taken against")
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "attack_matrix.jsonl"
    rows: list[dict[str, Any]] = []
    for preset in presets:
        for rep in range(args.repeats):
            for k in ks:
                row = {**one_run(args.suite, preset, k, args.out), "repeat": rep}
                rows.append(row)
                with log.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                print(f"{preset} k={k:g} #{rep + 1}: held={row['held']} "
                      f"seconds={row.get('seconds_to_target')} load={row['load_before']} {row['why']}", flush=True)
    cells = table(rows, presets, ks)
    (args.out / "attack_matrix.json").write_text(json.dumps({"cells": cells, "rows": rows}, indent=1))
    print_table(f"{args.suite}, {args.repeats} repeats, load {loadavg()}",
                ["preset", "k", "held", "median s", "x honest", f"<= {RULE}x"],
                [[c["preset"], f"{c['k']:g}", f"{c['held']}/{c['runs']}",
                  "-" if c["median_s"] is None else f"{c['median_s']:.1f}",
                  "-" if c["ratio"] is None else f"{c['ratio']:.2f}", "yes" if c["meets_rule"] else "NO"]
                 for c in cells])
    return 0 if all(c["meets_rule"] for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
