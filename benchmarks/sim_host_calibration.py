"""Issue 27's calibration with the host model (``hermes-sim --host``): testbed cells, their contention, the sim runs, the table.

    python benchmarks/sim_host_calibration.py share TESTBED_BENCH_DIR...            # per testbed run: r, background
    python benchmarks/sim_host_calibration.py sim --testbed DIR... --out SIMDIR [--cells lan/asp,...] [--seeds 0,1,2]
                                             [--seed-background] [--host-extra ,sleeper=auto]
    python benchmarks/sim_host_calibration.py table --testbed DIR... --sim SIMDIR [--json FILE]
    # the floor rule's cells (hermes-testbed --slowdown-mode floor; docs/simulation.md):
    python benchmarks/sim_host_calibration.py sim --testbed DIR... --out SIMDIR --target 0.9 --background 0 \
        --jitter 0 --host-extra ,floor=1
    # the nominal rule's (hermes-testbed --slowdown-mode nominal --pace P): the nominal cost and the pace each
    # testbed folder recorded (results.json's suite), the host's thread at the nominal cost (docs/simulation.md):
    python benchmarks/sim_host_calibration.py sim --testbed DIR... --out SIMDIR --target 0.9 --background 0 \
        --jitter 0 --nominal
    python benchmarks/sim_host_calibration.py table --testbed DIR... --sim SIMDIR --target 0.9 --rule nominal

Testbed side: ``hermes-bench run benchmarks/suites/sim-calibration.toml`` folders (any number; a cell's runs are
pooled over them). For each run:

* **train s** to a target: from the last agent's join to the first evaluation at or above it (the bench's
  ``train_seconds_to_target`` for the suite's own target, the accuracy timeline for a lower one);
* **messages** to it: ``messages_total``, or for a lower target than the run stopped at, ``messages_total``
  times the model version of the evaluation that reached it over the run's updates (the same on both sides);
* **share**: the share of a core the agents' training got, ``r = sum(CPU) / sum(compute - sleep)`` over the
  agents, where ``CPU = samples x training FLOPs per sample / THREAD_FLOPS`` (this machine's uncontended
  thread, ``sim/host.py``) and ``sleep = (slowdown - 1) x CPU`` (the agent's emulated slowdown);
* **background**: the other runnable processes that share implies, ``cores / r - 1 - sum over the slowed
  agents of 1 / (1 + (slowdown - 1) r)`` (under processor sharing a computing agent runs at
  ``cores / (1 + background + the other agents computing)``; a slowed agent computes a fraction
  ``1 / (1 + (s - 1) r)`` of its time). The cell's background is the median over its runs.

Sim side: one ``hermes-sim`` per cell and seed with ``--host testbed:background=B`` (B the cell's), the suite's
task, ``--jitter 0.23`` (the calibration suite's), the testbed's budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from hl2_alone_breakdown import own_seconds

from hermes.sim.host import CORES, THREAD_FLOPS, Host, HostSpec

TRAIN_FLOPS = 953_600.0  # the calibration task's training FLOPs a sample (sim.run.flops_per_sample)
TARGET = 0.9
# Cells where the testbed does not reach 0.9 reliably within its budget (docs/simulation.md says which runs): they
# are calibrated at a target all their testbed runs reached (lan hermes-paper: 0.87-0.90 at its 120 s; lte fedbuff:
# 0.88-0.89 at 300 s).
TARGETS = {("lan", "hermes-paper"): 0.85, ("lte", "fedbuff"): 0.85}
JITTER = 0.23
# --fast-rate: cores enough that no job of the 4-agent run ever shares one (the floor rule's "no contention").
FAST_RATE_CORES = 8.0
TASK = ["--dataset", "mnist1d", "--set", "num_samples=20000", "--set", 'model_kwargs={"hidden": 320}']


# --target: one target for every cell (the floor rule's testbed runs reach 0.9 in every cell re-run).
TARGET_OVERRIDE: float | None = None


def target_of(link: str, preset: str) -> float:
    if TARGET_OVERRIDE is not None:
        return TARGET_OVERRIDE
    return TARGETS.get((link, preset), TARGET)


def at_target(summary: dict[str, Any], target: float, start: float) -> tuple[float | None, float | None]:
    """(train seconds, messages) to the first evaluation at or above ``target``; (None, None) if never."""
    for e in summary.get("accuracy_timeline", []):
        if e.get("accuracy") is not None and e["accuracy"] >= target:
            updates = summary.get("model_updates") or 0
            msgs = summary["messages_total"]
            if updates and e.get("version") is not None and e["version"] < updates:
                msgs = msgs * e["version"] / updates
            return e["elapsed"] - start, msgs
    return None, None


def share(summary: dict[str, Any], events: Path | None = None) -> float | None:
    """From the workers' totals; with the run's events each worker's CPU is priced by its cycles' batch sizes
    (``Host.cycle_factor``: the per-step part of a step; 1 at batch 32). A worker's ``compute_seconds`` in the
    summary is the agent's own report, never the claims floor's raise (that is in the ``cycle`` events only)."""
    factor: dict[str, list[float]] = {}
    if events is not None and events.exists():
        host = Host(HostSpec())
        for e in joins_and_cycles(events)[1]:
            n = int(e["dss"])
            acc = factor.setdefault(e["worker"], [0.0, 0.0])
            acc[0] += n * host.cycle_factor(n, -(-n // max(1, int(e.get("batch_size") or 32))))
            acc[1] += n
    cpu = wall = 0.0
    for w in summary.get("workers", []):
        f = factor.get(w.get("id"), [1.0, 1.0])
        c = (w.get("samples") or 0) * TRAIN_FLOPS / THREAD_FLOPS * (f[0] / f[1] if f[1] else 1.0)
        s = float(w.get("slowdown") or 1.0)
        busy = (w.get("compute_seconds") or 0.0) - (s - 1) * c
        if c > 0 and busy > 0:
            cpu, wall = cpu + c, wall + busy
    return cpu / wall if wall else None


def joins_and_cycles(events: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """A run's joins (each worker's emulated slowdown) and its cycles with a DSS, from its ``events.jsonl``
    (a line cut by the run's end skipped); each cycle with ``own_compute_seconds``, the agent's own seconds
    where the server's claims floor raised them (``hl2_alone_breakdown.own_seconds``)."""
    slow: dict[str, float] = {}
    cycles: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    with events.open() as f:
        for line in f:
            if '"join"' not in line and '"cycle"' not in line and '"claim_clamped"' not in line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    for e in own_seconds(records):
        if e.get("event") == "join":
            slow[e["worker"]] = float(e.get("slowdown") or 1.0)
        elif e.get("event") == "cycle" and e.get("dss"):
            cycles.append(e)
    return slow, cycles


def fast_flops(events: Path) -> float | None:
    """The unslowed agent's training FLOP/s at REFERENCE_BATCH over its cycles (the floor rule's S = 1 agent has no
    slack: it runs at whatever share of a core it gets), from a run's events: its cycles' samples x FLOPs x the
    batch's cost factor (``Host.cycle_factor``) over their compute seconds."""
    if not events.exists():
        return None
    host = Host(HostSpec())
    slow, cycles = joins_and_cycles(events)
    work = secs = 0.0
    for e in cycles:
        if slow.get(e["worker"]) == 1.0:
            n = int(e["dss"])
            work += n * TRAIN_FLOPS * host.cycle_factor(n, -(-n // max(1, int(e.get("batch_size") or 32))))
            secs += float(e.get("own_compute_seconds") or 0.0)
    return work / secs if secs > 0 else None


def nominal_settings(dirs: list[str], link: str, preset: str) -> tuple[float, float] | None:
    """(nominal ms a sample, pace) of the cell's testbed runs under ``--slowdown-mode nominal`` (each folder's
    ``results.json`` suite: ``nominal_sample_ms``, ``pace``); None if they ran under another rule. One figure per
    cell: its folders must agree (the calibration passes one ``--nominal-sample-ms`` to all of them)."""
    seen = set()
    for d in dirs:
        res = json.loads((Path(d) / "results.json").read_text())
        suite = res.get("suite") or {}
        if not any(r.get("status") == "ok" and (r["link"] or "lan") == link and r["preset"] == preset
                   for r in res["runs"]):
            continue
        if suite.get("slowdown_mode") != "nominal":
            return None
        seen.add((float(suite["nominal_sample_ms"]), float(suite.get("pace") or 1.0)))
    if len(seen) > 1:
        raise SystemExit(f"{link}/{preset}: its testbed folders ran at different nominal costs or paces: {sorted(seen)}")
    return seen.pop() if seen else None


def background(r: float, slowdowns: list[float], cores: float = CORES) -> float:
    others = sum(1 / (1 + (s - 1) * r) for s in slowdowns if s > 1)
    return max(0.0, cores / r - 1 - others)


def testbed_runs(dirs: list[str]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for d in dirs:
        res = json.loads((Path(d) / "results.json").read_text())
        for run in res["runs"]:
            if run.get("status") != "ok":
                continue
            summ = json.loads((Path(d) / run["run_dir"] / "summary.json").read_text())
            ev = run.get("events") or {}
            start = float(ev.get("train_start_elapsed") or 0.0)
            t = target_of(run["link"] or "lan", run["preset"])
            secs, msgs = at_target(summ, t, start)
            if t == TARGET and summ.get("reached_target") and ev.get("train_seconds_to_target") is not None:
                secs, msgs = ev["train_seconds_to_target"], summ["messages_total"]
            r = share(summ, Path(d) / run["run_dir"] / "events.jsonl")
            slow = [float(w.get("slowdown") or 1.0) for w in summ["workers"]]
            cells.setdefault((run["link"] or "lan", run["preset"]), []).append({
                "key": f"{d}:{run['key']}", "seed": run["seed"], "target": t, "train_s": secs, "messages": msgs,
                "stopped_messages": summ["messages_total"], "share": r,
                "background": background(r, slow) if r else None, "load_before": run.get("loadavg_before"),
                "fast_flops": fast_flops(Path(d) / run["run_dir"] / "events.jsonl"),
                "load_after": run.get("loadavg_after"), "final_accuracy": summ.get("final_accuracy"),
                "precisions": sorted({str(w.get("precision")) for w in summ["workers"] if w.get("precision")})})
    return cells


def earlier_runs(spec: str | None) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Testbed runs kept from an earlier table's JSON (``FILE:lte/asp,lte/fedbuff``: those cells' runs), for
    cells whose raw run folders are gone: their per-run figures (train s, messages, share, background)."""
    if not spec:
        return {}
    path, _, cells = spec.rpartition(":")
    wanted = {tuple(c.split("/")) for c in cells.split(",")}
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in json.loads(Path(path).read_text()):
        key = (row["link"], row["preset"])
        if key in wanted:
            out.setdefault(key, []).extend({**r, "earlier": path} for r in row["testbed_runs"])
    return out


def all_testbed_runs(a: argparse.Namespace) -> dict[tuple[str, str], list[dict[str, Any]]]:
    cells = testbed_runs(a.testbed) if a.testbed else {}
    for key, runs in earlier_runs(getattr(a, "earlier", None)).items():
        cells.setdefault(key, []).extend(runs)
    return cells


def cell_background(runs: list[dict[str, Any]]) -> float | None:
    """The median of the runs' backgrounds; None where none has one (under the nominal rule every agent sleeps,
    the unslowed one too, so ``share`` prices no run)."""
    xs = [r["background"] for r in runs if r["background"] is not None]
    return statistics.median(xs) if xs else None


def share_main(a: argparse.Namespace) -> int:
    for (link, preset), runs in sorted(testbed_runs(a.dirs).items()):
        for r in runs:
            ff = f"{r['fast_flops'] / 1e9:.2f}" if r.get("fast_flops") else "-"
            print(f"{link:4} {preset:13} seed {r['seed']} share {_fmt(r['share'], 3)} background {_fmt(r['background'], 2)} "
                  f"S=1 GFLOP/s {ff} "
                  f"train s {r['train_s']} messages {r['messages']} load {r['load_before']} -> {r['load_after']}")
        print(f"{link:4} {preset:13} cell background {_fmt(cell_background(runs), 2)}")
    return 0


def previous_cells(path: str | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The earlier session's testbed medians (its raw runs are gone): ``{"lan/bsp": {"train_s", "messages",
    "reached", "background"}}``, the background from its report's per-worker compute seconds a cycle."""
    if not path:
        return {}
    raw = json.loads(Path(path).read_text())
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for k, v in raw["cells"].items():
        link, _, preset = k.partition("/")
        out[(link, preset)] = v
    return out


def cell_precision(wanted: str, runs: list[dict[str, Any]], cell: str) -> str | None:
    """The precision the cell's sims train in: ``wanted``, or with ``testbed`` the one its testbed agents chose
    (``precision auto`` times the device: bf16 on this machine, 2026-11-28); None (and why) when they differ."""
    if wanted != "testbed":
        return wanted
    chosen = {p for r in runs for p in r.get("precisions") or []}
    if len(chosen) != 1:
        print(f"{cell}: its testbed agents trained in {sorted(chosen) or 'no recorded precision'}; give --precision",
              file=sys.stderr)
        return None
    return chosen.pop()


def sim_main(a: argparse.Namespace) -> int:
    cells = all_testbed_runs(a)
    previous = previous_cells(a.previous)
    wanted = [tuple(c.split("/")) for c in a.cells.split(",")] if a.cells else sorted(cells)
    for link, preset in wanted:
        runs = cells.get((link, preset))
        if a.background is not None:  # one background for every cell (the floor rule's runs: 0)
            b = a.background
        elif runs:
            b = round(cell_background(runs) or 0.0, 2)
        elif (link, preset) in previous:
            b = round(float(previous[(link, preset)]["background"]), 2)
        else:
            print(f"{link}/{preset}: no testbed runs", file=sys.stderr)
            continue
        budget = a.max_seconds or (300.0 if link == "lte" and preset in ("asp", "fedbuff") else 180.0)
        for seed in (int(s) for s in a.seeds.split(",")):
            out = Path(a.out) / f"{link}-{preset}-s{seed}"
            if (out / "summary.json").exists():
                continue
            if a.seed_background and a.background is None:  # the testbed run of this seed's own background, not the cell's median
                mine = [r["background"] for r in runs or [] if int(r["seed"]) == seed and r["background"] is not None]
                if not mine:
                    print(f"{link}/{preset} seed {seed}: no testbed run of that seed", file=sys.stderr)
                    continue
                b = round(float(mine[0]), 2)
            extra = a.host_extra
            if a.fast_rate:  # no contention; every agent at this seed's testbed S = 1 agent's rate over its slowdown
                mine_f = [r.get("fast_flops") for r in runs or [] if int(r["seed"]) == seed and r.get("fast_flops")]
                if not mine_f:
                    print(f"{link}/{preset} seed {seed}: no testbed run of that seed with an S = 1 rate", file=sys.stderr)
                    continue
                extra += f",cores={FAST_RATE_CORES:g},thread_flops={float(mine_f[0]):.4g}"
            if a.nominal:  # every agent paced to S x pace x the testbed's nominal; its thread at the nominal's rate
                given = [float(x) for x in a.nominal_settings.split(",")] if a.nominal_settings else None
                settings = (given[0], given[1]) if given else nominal_settings(a.testbed, link, preset)
                if settings is None:
                    print(f"{link}/{preset}: its testbed runs are not under --slowdown-mode nominal", file=sys.stderr)
                    continue
                ms, pace = settings
                extra += f",nominal={ms:g},pace={pace:g}"
                if a.nominal_thread:
                    extra += f",thread_flops={TRAIN_FLOPS / (ms / 1000.0):.6g}"
            precision = cell_precision(a.precision, runs or [], f"{link}/{preset}")
            if precision is None:
                continue
            cmd = [sys.executable, "-m", "hermes.sim.cli", "--population", "hl8", "--preset", preset, *TASK,
                   *(["--set", f"precision={precision}"] if precision != "auto" else []),
                   "--target-accuracy", str(target_of(link, preset)), "--max-seconds", str(budget), "--seed", str(seed),
                   "--link", link, "--host", f"testbed:background={b}{extra}", "--jitter", str(a.jitter),
                   *(["--device-link", a.device_link] if a.device_link else []),
                   "--out", str(out), "--quiet"]
            print(" ".join(cmd), flush=True)
            subprocess.run(cmd, check=False)
    return 0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def median_with_misses(reached: list[float], runs: int) -> float | None:
    """The median of ``runs`` runs of which ``reached`` got there, a miss slower than any; None if that is a miss."""
    values = sorted(reached) + [float("inf")] * (runs - len(reached))
    med = statistics.median(values) if values else float("inf")
    return med if med != float("inf") else None


def _fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def table_main(a: argparse.Namespace) -> int:
    rule = a.rule or ("floor" if a.floor else None)
    cells: dict[tuple[str, str], Any] = dict(all_testbed_runs(a))
    previous = previous_cells(a.previous)
    for key in previous:
        cells.setdefault(key, None)
    rows, out = [], []
    for (link, preset), runs in sorted(cells.items()):
        t = target_of(link, preset)
        old = runs is None
        if old:  # the earlier session's medians: its raw runs are gone
            p = previous[(link, preset)]
            n_reached, n_runs = (int(x) for x in p["reached"].split("/"))
            tb_t = [p["train_s"]] * n_reached if p["train_s"] is not None else []
            tb_m = [p["messages"]] * n_reached if p["train_s"] is not None else []
            runs = [{"train_s": p["train_s"], "share": p.get("share"), "background": p["background"],
                     "previous": True}] * n_runs
        else:
            tb_t = [r["train_s"] for r in runs if r["train_s"] is not None]
            tb_m = [r["messages"] for r in runs if r["train_s"] is not None]
        sims = []
        for path in sorted(Path(a.sim).glob(f"{link}-{preset}-s*/summary.json")):
            s = json.loads(path.read_text())
            secs, msgs = at_target(s, t, 0.0)
            sims.append({"seed": path.parent.name.rpartition("-s")[2],
                         "train_s": secs, "messages": msgs, "host": s.get("host")})
        sm_t = [x["train_s"] for x in sims if x["train_s"] is not None]
        sm_m = [x["messages"] for x in sims if x["train_s"] is not None]
        # The median of 3 on both sides: a run that missed counts as slower than every one that reached.
        tb_med = median_with_misses(tb_t, len(runs))
        sm_med = median_with_misses(sm_t, len(sims))
        tr = sm_med / tb_med if tb_med and sm_med else None
        sm_mm, tb_mm = _median(sm_m), _median(tb_m)
        mr = sm_mm / tb_mm if sm_mm is not None and tb_mm else None
        ok_t = tr is not None and abs(tr - 1) <= 0.25
        ok_m = mr is not None and abs(mr - 1) <= 0.15
        b = cell_background(runs)
        shares = [r["share"] for r in runs if r["share"]]
        sim_b = sorted({float(x["host"]["background"]) for x in sims if x["host"]})
        row = {"link": link, "preset": preset, "target": t, "testbed_reached": f"{len(tb_t)}/{len(runs)}",
               "testbed_train_s": tb_med, "testbed_messages": _median(tb_m), "share": _median(shares),
               "background": b, "sim_background": sim_b, "sim_reached": f"{len(sm_t)}/{len(sims)}", "sim_s": sm_med,
               "sim_messages": _median(sm_m), "time_ratio": tr, "message_ratio": mr, "time_ok": ok_t,
               "messages_ok": ok_m, "testbed_runs": runs, "sim_runs": sims}
        row["testbed_session"] = "previous" if old else "this"
        rows.append(row)
        mixed = any(r.get("earlier") for r in runs)
        if rule:  # the floor and nominal rules' cells: no core share, every sim at background 0
            row["rule"] = rule
            out.append(f"| {link} | {preset} | {rule} | {t:g} | {row['testbed_reached']} | {_fmt(tb_med)} | "
                       f"{_fmt(_median(tb_m), 0)} | {row['sim_reached']} | {_fmt(sm_med)} | {_fmt(_median(sm_m), 0)} | "
                       f"{_fmt(tr, 2)} {'ok' if ok_t else 'MISS'} | {_fmt(mr, 2)} {'ok' if ok_m else 'MISS'} |")
            continue
        out.append(f"| {link} | {preset}{' (a)' if old else ''}{' (b)' if mixed else ''} | {t:g} | {row['testbed_reached']} | {_fmt(tb_med)} | {_fmt(_median(tb_m), 0)} | "
                   f"{_fmt(row['share'], 2)} | {_fmt(b)} ({'/'.join(f'{x:.1f}' for x in sim_b) or '-'}) | {row['sim_reached']} | {_fmt(sm_med)} | {_fmt(_median(sm_m), 0)} | "
                   f"{_fmt(tr, 2)} {'ok' if ok_t else 'MISS'} | {_fmt(mr, 2)} {'ok' if ok_m else 'MISS'} |")
    if rule:
        print("| link | preset | rule | target | testbed reached | testbed train s | testbed messages | sim reached | "
              "sim s (virtual) | sim messages | time ratio | message ratio |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    else:
        print("| link | preset | target | testbed reached | testbed train s | testbed messages | testbed core share | "
          "background (sim's) | sim reached | sim s (virtual) | sim messages | time ratio | message ratio |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(out))
    print("\n| link | preset | seed | testbed train s | testbed messages | sim s (virtual) | sim messages |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        by_seed = {str(x["seed"]): x for x in row["sim_runs"]}
        for r in sorted(row["testbed_runs"], key=lambda r: int(r.get("seed") or 0)):
            x = by_seed.get(str(r.get("seed")), {})
            print(f"| {row['link']} | {row['preset']} | {r.get('seed')} | {_fmt(r.get('train_s'))} | "
                  f"{_fmt(r.get('messages'), 0)} | {_fmt(x.get('train_s'))} | {_fmt(x.get('messages'), 0)} |")
    passed = sum(r["time_ok"] and r["messages_ok"] for r in rows)
    print(f"\n{passed} of {len(rows)} cells within both tolerances")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("share")
    s.add_argument("dirs", nargs="+")
    m = sub.add_parser("sim")
    m.add_argument("--testbed", nargs="*", default=[])
    m.add_argument("--previous", default=None, help="the earlier session's testbed medians (JSON)")
    m.add_argument("--earlier", default=None, help="FILE:link/preset,...: testbed runs kept in an earlier table's JSON")
    m.add_argument("--out", required=True)
    m.add_argument("--cells", default="")
    m.add_argument("--seeds", default="0,1,2")
    m.add_argument("--max-seconds", type=float, default=None)
    m.add_argument("--host-extra", default="", help="appended to each run's --host spec, e.g. ',wakeups=0'")
    m.add_argument("--fast-rate", action="store_true",
                   help="the floor rule's S = 1 model: no contention (cores 8) and the host's thread rate that seed's "
                        "testbed run's unslowed agent trained at (fast_flops)")
    m.add_argument("--nominal", action="store_true",
                   help="the nominal rule: --host nominal=MS,pace=P from the testbed folders' recorded settings")
    m.add_argument("--nominal-settings", default=None, metavar="MS,PACE",
                   help="with --nominal: this nominal cost a sample (ms) and pace instead of the testbed folders' "
                        "(a cell whose testbed runs are not in yet)")
    m.add_argument("--nominal-thread", action=argparse.BooleanOptionalAction, default=True,
                   help="with --nominal: the host's thread rate at the nominal cost a sample (TRAIN_FLOPS / it; "
                        "default), else THREAD_FLOPS")
    m.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "testbed"],
                   help="the sims' training precision: auto (the simulator's, fp32), fp32, bf16, or testbed: the one "
                        "the cell's testbed agents chose (needs --testbed)")
    m.add_argument("--device-link", default=None, metavar="per-message|queue[:SHARE]",
                   help="hermes-sim's --device-link for every run (default: the simulator's, per-message)")
    m.add_argument("--seed-background", action="store_true",
                   help="each seed at the background of the testbed run with that seed (else the cell's median)")
    t = sub.add_parser("table")
    t.add_argument("--testbed", nargs="*", default=[])
    t.add_argument("--previous", default=None, help="the earlier session's testbed medians (JSON)")
    t.add_argument("--earlier", default=None, help="FILE:link/preset,...: testbed runs kept in an earlier table's JSON")
    t.add_argument("--sim", required=True)
    t.add_argument("--json", default=None)
    t.add_argument("--floor", action="store_true",
                   help="the floor rule's table: no core share or background columns (its sims run at background 0)")
    t.add_argument("--rule", default=None,
                   help="the rule column's word for a table without core share or background (e.g. nominal; "
                        "--floor is --rule floor)")
    for q in (m, t):
        q.add_argument("--target", type=float, default=None,
                       help="one target accuracy for every cell (default: 0.9, or TARGETS' lower one)")
    m.add_argument("--background", type=float, default=None,
                   help="this background for every cell and seed (default: the testbed runs' own)")
    m.add_argument("--jitter", type=float, default=JITTER,
                   help=f"per-cycle compute noise sigma (default {JITTER}, the cpu rule's; the floor rule's runs: 0)")
    a = p.parse_args(argv)
    global TARGET_OVERRIDE
    TARGET_OVERRIDE = getattr(a, "target", None)
    return {"share": share_main, "sim": sim_main, "table": table_main}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
