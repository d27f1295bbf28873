"""Issue 27's calibration table: a testbed bench's results beside a simulated bench's, cell by cell.

    python benchmarks/sim_calibration_table.py TESTBED_DIR SIM_DIR [--time-tol 0.25] [--msg-tol 0.15]

Both folders are ``hermes-bench`` outputs of the same matrix (benchmarks/suites/sim-calibration.toml and
sim-calibration-sim.toml). Per (link, variant): the testbed's median over its repeats and the simulation's
median over its seeds of the time to target and of ``messages_total``, their ratio, and whether it is within the
tolerance. Time is *train s* (from the last worker's join to the evaluation that reached the target: the bench's
``train_seconds_to_target``) on both sides: the testbed's agents spend several seconds starting (process, torch
import) that the simulation does not model, the same for every preset. Medians over the runs that reached the
target; a side where none did gets '-'. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from hermes.deploy.bench.aggregate import run_metrics


def cells(results: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results["runs"]:
        if r.get("status") == "ok":
            out.setdefault((r.get("link") or "lan", r["variant"]), []).append(run_metrics(r))
    return out


def median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def verdict(ratio: float | None, tol: float) -> str:
    if ratio is None:
        return "-"
    return "ok" if abs(ratio - 1.0) <= tol else "MISS"


def table(testbed: dict[str, Any], sim: dict[str, Any], time_tol: float, msg_tol: float) -> list[str]:
    tb, sm = cells(testbed), cells(sim)
    rows = ["| link | preset | testbed reached | testbed train s | sim reached | sim s (virtual) | time ratio | "
            "testbed messages | sim messages | message ratio |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key in sorted(set(tb) | set(sm)):
        t, s = tb.get(key, []), sm.get(key, [])
        tt = median([m["train_seconds_to_target"] for m in t])
        st = median([m["train_seconds_to_target"] for m in s])
        tm, smsg = median([m["messages_total"] for m in t]), median([m["messages_total"] for m in s])
        tr = st / tt if tt and st is not None else None
        mr = smsg / tm if tm and smsg is not None else None
        rows.append(f"| {key[0]} | {key[1]} | {sum(m['reached'] for m in t)}/{len(t)} | {fmt(tt)} | "
                    f"{sum(m['reached'] for m in s)}/{len(s)} | {fmt(st)} | {fmt(tr, 2)} {verdict(tr, time_tol)} | "
                    f"{fmt(tm, 0)} | {fmt(smsg, 0)} | {fmt(mr, 2)} {verdict(mr, msg_tol)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("testbed_dir")
    p.add_argument("sim_dir")
    p.add_argument("--time-tol", type=float, default=0.25, help="relative tolerance on time to target (0.25)")
    p.add_argument("--msg-tol", type=float, default=0.15, help="relative tolerance on messages (0.15)")
    a = p.parse_args(argv)
    try:
        testbed = json.loads((Path(a.testbed_dir) / "results.json").read_text())
        sim = json.loads((Path(a.sim_dir) / "results.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"sim_calibration_table: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(table(testbed, sim, a.time_tol, a.msg_tol)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
