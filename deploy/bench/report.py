"""``report.md`` from ``results.json``: a pure function, so any results can be re-rendered.

Numbers are medians over repeats with the min-max range in brackets; a
variant that did not reach the target in some repeats says how many did,
and one that never did gets a statement instead of a number.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any

from hermes.deploy.bench.aggregate import (
    Group,
    Speedup,
    Spread,
    groups,
    speed_key,
    speedup,
    speedups,
    suite_cells,
    worker_cycle_stats,
)
from hermes.deploy.bench.plots import plot_names

PLOT_CAPTIONS = {
    "accuracy_vs_time.png": "Test accuracy against wall time, every repeat of every variant",
    "time_to_target.png": "Seconds to the target accuracy (median, min-max whiskers)",
    "compute_time_boxplots.png": "Per-worker compute seconds per local cycle, by variant and profile",
    "communication.png": "Messages and bytes per run",
    "loss_vs_time.png": "Test loss against wall time, every repeat of every variant",
    "accuracy_vs_samples.png": "Test accuracy against samples trained and epochs, every repeat of every variant",
}


def fmt(v: float | None, nd: int = 2) -> str:
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def fmt_spread(sp: Spread | None, nd: int = 2) -> str:
    if sp is None:
        return "-"
    if sp.n == 1:
        return fmt(sp.median, nd)
    return f"{fmt(sp.median, nd)} [{fmt(sp.min, nd)}–{fmt(sp.max, nd)}]"


def fmt_speedup(sp: Speedup | None, g: Group, baseline: str, role: str = "baseline") -> str:
    if g.label == baseline and sp is not None and sp.status == "ok":
        return f"1.00× ({role})"
    if sp is None:
        return "-"
    if sp.status == "no-runs":
        return "no finished run"
    if sp.status == "missed":
        return f"missed the target ({g.reached}/{g.ok} reached)"
    if sp.status == "baseline-missed":
        return f"n/a: {baseline} missed the target"
    text = f"{sp.median:.2f}×" + (f" [{sp.min:.2f}–{sp.max:.2f}]" if sp.n > 1 else "")
    if g.reached < g.ok:
        text += f" ({g.reached}/{g.ok} reached; over those)"
    return text


def _table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    align = align or ["l"] + ["r"] * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |",
            *("| " + " | ".join(r) + " |" for r in rows)]


def render_report(results: dict[str, Any]) -> str:
    suite = results["suite"]
    runs = results.get("runs", [])
    gs = groups(results)
    sus = speedups(results, gs)
    baseline = suite.get("baseline")
    # The peer (torch DDP), when the suite runs one: Table III's speed-up over it, beside the baseline's.
    peer = next((v["label"] for v in suite["variants"] if v.get("runner") == "ddp" and v["label"] != baseline), None)
    target = suite.get("target_accuracy")
    ok = sum(1 for r in runs if r.get("status") == "ok")
    out: list[str] = [f"# hermes-bench: {suite['name']}", ""]
    cluster = (f"{suite['clients']} simulated devices (hermes-sim; every time is virtual seconds; server cost "
               f"`{suite.get('server_cost')}`)" if suite.get("engine") == "sim"
               else f"{suite['clients']} agents on one machine (hermes-testbed)")
    if suite.get("description"):
        out += [suite["description"], ""]
    written = results.get("written_at")
    out += [
        f"- matrix: {len(suite['variants'])} variants × {len(suite['profiles'])} profiles "
        f"({', '.join(p.upper() for p in suite['profiles'])}) × {suite['repeats']} repeats "
        f"(seeds {suite['seed']}–{suite['seed'] + suite['repeats'] - 1}); {ok}/{len(runs)} runs finished",
        f"- cluster: {cluster}, data set `{suite['dataset']}`, model `{suite['model']}`",
        f"- budget per run: target accuracy {target if target is not None else 'none'}, at most "
        f"{suite['max_seconds']:g} s" + (f"; overrides {suite['overrides']}" if suite.get("overrides") else ""),
        "- variants: " + "; ".join(
            f"`{v['label']}` = preset `{v['preset']}`" + (f" with {v['overrides']}" if v.get("overrides") else "")
            for v in suite["variants"]),
    ]
    if written:
        out.append(f"- written {_dt.datetime.fromtimestamp(written, _dt.UTC):%Y-%m-%d %H:%M UTC}")
    if suite["repeats"] < 3:
        out += ["", f"> {suite['repeats']} repeat(s) per variant: too few for claims. Use at least 3 "
                "(`--repeats 3`) before quoting any figure."]
    out += ["", "Cells read `median [min–max]` over the repeats that produced the figure. *Time to target* counts "
            "from agent launch to the evaluation that reached the target; *train s* from the last agent's join "
            "(agent start-up excluded); both only over runs that reached the target (see *reached*). The `ddp` "
            "peer's clock starts after every rank joined and leaves its evaluations out: both its columns are "
            "its *train s*."]
    if suite.get("engine") == "sim":
        out += ["Engine `sim`: every row is a simulated run and every time virtual seconds (*wall* is what the "
                "simulation took here); `ddp` is bsp with one mini-batch per cycle, timed as the others; `alone` is "
                "the population's fastest device with all the data; `ideal` every device at the mean speed."]
    if baseline:
        out += ["*Speed-up* = the median *train s* of "
                f"`{baseline}` / the variant's median (every side timed from its workers' join); the range divides "
                f"`{baseline}`'s median by each repeat's time."
                + (f" *Speed-up vs {peer}* is the same against the `{peer}` peer's median." if peer else "")]
    out += ["*Iterations* = local training cycles over all workers; *messages* = every request a worker sent, "
            "data plane and control plane (register, heartbeat, leave, regroup: the papers' API calls; with "
            "combine_messages a push answers the pull), *push+pull* = the model exchange requests alone; *WI* = worker independence, local "
            "cycles / model pulls (Hermes Eq. 7), mean over workers."]

    for profile in suite_cells(suite):
        out += ["", f"## {profile.upper()}", ""]
        # How the links were emulated, per variant (kernel, process, modelled for DDP, none) and per agent.
        modes = sorted({f"{r['variant']}: {((r.get('summary') or {}).get('links') or {}).get('mode', 'none')}"
                        for r in results.get("runs", []) if r.get("profile") == profile and r.get("summary")})
        if any(not m.endswith(": none") for m in modes):
            out += [f"Links emulated ({'; '.join(modes)}).", ""]
        statements = []
        rows = []
        for v in suite["variants"]:
            g = gs[(profile, v["label"])]
            m = g.metrics
            sp = sus.get((profile, v["label"]))
            peer_sp = speedup(gs[(profile, peer)], g) if peer else None
            rows.append([
                f"`{v['label']}`", f"{g.reached}/{g.runs}" if target is not None else f"{g.ok}/{g.runs}",
                fmt_spread(m.get("seconds_to_target"), 1), fmt_spread(m.get("train_seconds_to_target"), 1),
                *([fmt_speedup(sp, g, baseline)] if baseline else []),
                *([fmt_speedup(peer_sp, g, peer, "peer")] if peer else []),
                fmt_spread(m.get("iterations"), 0), fmt_spread(m.get("model_updates"), 0),
                fmt_spread(m.get("messages_total"), 0), fmt_spread(m.get("model_messages"), 0),
                fmt_spread(m.get("mb_total"), 1), fmt_spread(m.get("wi_mean"), 2),
                fmt_spread(m.get("final_accuracy"), 3), fmt_spread(m.get("wall_seconds"), 1),
            ])
            if baseline and v["label"] != baseline and sp is not None:
                statements.append(_statement(v["label"], g, sp, gs[(profile, baseline)], baseline, target))
        header = ["variant", "reached" if target is not None else "finished", "time to target (s)", "train s",
                  *([f"speed-up vs {baseline}"] if baseline else []),
                  *([f"speed-up vs {peer}"] if peer else []), "iterations", "model updates", "messages",
                  "push+pull", "MB sent+recv", "WI", "final accuracy", "wall (s)"]
        out += _table(header, rows)
        if statements:
            out += ["", *[f"- {s}" for s in statements]]
        out += ["", f"### {profile.upper()}: per worker (all repeats pooled)", ""]
        wrows = []
        for v in suite["variants"]:
            for w in worker_cycle_stats(results, profile, v["label"]):
                cs = w["cycle_seconds"]
                q = statistics.quantiles(cs, n=4) if len(cs) > 1 else [cs[0]] * 3 if cs else [None] * 3
                wrows.append([f"`{v['label']}`", w["name"], fmt(w["speed"], 2),
                              fmt(statistics.median(w["cycles"]), 0) if w["cycles"] else "-",
                              fmt(q[1], 3), f"{fmt(q[0], 3)}–{fmt(q[2], 3)}" if cs else "-",
                              _values(w["dss"]), _values(w["batch_size"])])
        out += _table(["variant", "worker", "relative speed", "cycles (median)", "compute s / cycle (median)",
                       "IQR", "final DSS", "final batch size"], wrows, ["l", "l", "r", "r", "r", "r", "r", "r"])
        wl = f"workload_{profile}.png"
        if wl in plot_names(results):
            out += ["", f"![{profile.upper()}: dataset size and mini-batch size per worker over time]({wl})"]

    names = plot_names(results)
    if names:
        out += ["", "## Plots", ""]
        for name in names:
            if name in PLOT_CAPTIONS:
                out += [f"![{PLOT_CAPTIONS[name]}]({name})", ""]

    out += ["", "## Runs", ""]
    rrows = []
    for r in runs:
        s = r.get("summary") or {}
        load = r.get("loadavg_before")
        rrows.append([f"`{r['key']}`", str(r.get("seed")), r.get("status", "?") if r.get("status") != "ok"
                      else str(s.get("outcome")), fmt(s.get("seconds_to_target"), 1), fmt(s.get("wall_seconds"), 1),
                      fmt(s.get("final_accuracy"), 3), str(s.get("model_updates", "-")),
                      str(s.get("messages_total", "-")), fmt(load[0], 2) if load else "-"])
    out += _table(["run", "seed", "outcome", "s to target", "wall s", "final accuracy", "updates", "messages",
                   "load avg (1 min) before"], rrows, ["l", "r", "l", "r", "r", "r", "r", "r", "r"])
    failures = [r for r in runs if r.get("status") != "ok"]
    if failures:
        out += ["", "Failed runs (left out of every figure; re-running the bench redoes them):", ""]
        out += [f"- `{r['key']}` (seed {r.get('seed')}): {r.get('error')}" for r in failures]

    out += ["", "## Machine and versions", ""]
    mach = results.get("machine") or {}
    out += _table(["", ""], [
        ["CPU", f"{mach.get('cpu_model') or '?'} ({mach.get('cpus_usable')} usable of {mach.get('cpu_count')})"],
        ["platform", str(mach.get("platform"))],
        ["python", str(mach.get("python"))],
        *[[k, str(v) if v else "not installed"] for k, v in (results.get("versions") or {}).items()],
    ], ["l", "l"])
    loads = [r["loadavg_before"][0] for r in runs if r.get("loadavg_before")]
    if loads:
        cpus = mach.get("cpus_usable") or 1
        busy = max(loads) > 0.5 * cpus
        out += ["", f"1-minute load average before the runs: {min(loads):.2f}–{max(loads):.2f} on {cpus} CPUs"
                + (". The machine was busy: other processes competed with the testbed, so absolute times are "
                   "inflated and noisier than on an idle machine; the runs are interleaved (repeat-major) so "
                   "the load falls on every variant alike." if busy else ".")]
    return "\n".join(out) + "\n"


def _statement(label: str, g: Group, sp: Speedup, base: Group, baseline: str, target: float | None) -> str:
    key = speed_key(base, g)
    t = g.metrics.get(key)
    if sp.status == "missed":
        return (f"`{label}` did not reach {target:g} accuracy in any of its {g.ok} runs "
                f"(best {fmt_spread(g.metrics.get('best_accuracy'), 3)}): no speed-up to state.")
    if sp.status == "baseline-missed":
        return f"`{baseline}` never reached the target, so `{label}` has no speed-up over it."
    if sp.status != "ok" or t is None:
        return f"`{label}`: no finished runs."
    bt = base.metrics[key]
    assert bt is not None  # status "ok": speedup() found the baseline's time under this key
    what = "training time" if key == "train_seconds_to_target" else "time"
    spread_txt = f" (range {sp.min:.2f}–{sp.max:.2f}× over {sp.n} repeats)" if sp.n > 1 else " (one run: no spread)"
    partial = f"; only {g.reached} of {g.ok} runs reached the target" if g.reached < g.ok else ""
    base_partial = f", {base.reached}/{base.ok} reached" if base.reached < base.ok else ""
    return (f"`{label}`: {sp.median:.2f}× the speed of `{baseline}` to {target:g} accuracy{spread_txt}: "
            f"{fmt(t.median, 1)} s vs {fmt(bt.median, 1)} s median {what}{base_partial}{partial}.")


def _values(xs: list[Any]) -> str:
    vals = [x for x in xs if x is not None]
    if not vals:
        return "-"
    uniq = sorted(set(vals))
    return str(uniq[0]) if len(uniq) == 1 else f"{min(vals)}–{max(vals)}"
