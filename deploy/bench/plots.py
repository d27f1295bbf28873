"""PNG plots of a bench's ``results.json`` (matplotlib, Agg backend: no display needed).

Every plot is a pure function of the results; ``plot_names`` says which
files a given results.json yields, so the report can link them without
drawing anything.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: a bench runs on headless machines
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

from hermes.deploy.bench.aggregate import (  # noqa: E402
    cycle_seconds,
    groups,
    natural_key,
    ok_runs,
    suite_cells,
    train_origin,
    worker_cycle_stats,
)
from hermes.deploy.bench.curves import accuracy_vs_samples, has_loss, has_samples, loss_vs_time  # noqa: E402

log = logging.getLogger(__name__)

DPI = 110


def _colors(results: dict[str, Any]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {v["label"]: cmap(i % 10) for i, v in enumerate(results["suite"]["variants"])}


def _labels(results: dict[str, Any]) -> list[str]:
    return [v["label"] for v in results["suite"]["variants"]]


def _timeline_origin(rec: dict[str, Any]) -> float:
    # Timelines start at the last agent's join (server clock), the origin of "train s".
    return train_origin(rec)


def accuracy_vs_time(results: dict[str, Any]) -> Figure | None:
    runs = ok_runs(results)
    if not runs:
        return None
    profiles = suite_cells(results["suite"])
    colors = _colors(results)
    fig, axes = plt.subplots(1, len(profiles), figsize=(5.5 * len(profiles), 4.2), squeeze=False, sharey=True)
    target = results["suite"].get("target_accuracy")
    for ax, profile in zip(axes[0], profiles):
        seen: set[str] = set()
        for r in runs:
            if r["profile"] != profile:
                continue
            tl = r["summary"].get("accuracy_timeline") or []
            origin = _timeline_origin(r)
            # Evaluations before the last join score the initial model: draw them at 0.
            xs = [max(0.0, e["elapsed"] - origin) for e in tl if e.get("elapsed") is not None]
            ys = [e["accuracy"] for e in tl if e.get("elapsed") is not None]
            label = r["variant"] if r["variant"] not in seen else None
            seen.add(r["variant"])
            ax.plot(xs, ys, color=colors[r["variant"]], alpha=0.8, linewidth=1.3, label=label,
                    drawstyle="steps-post")
        if target is not None:
            ax.axhline(target, color="black", linestyle="--", linewidth=0.8, label=f"target {target:g}")
        ax.set_title(f"{profile.upper()}: test accuracy (every repeat)")
        ax.set_xlabel("wall time since the first agent joined (s)")
        ax.grid(alpha=0.3)
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("test accuracy (fraction correct)")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def time_to_target(results: dict[str, Any]) -> Figure | None:
    if results["suite"].get("target_accuracy") is None or not ok_runs(results):
        return None
    gs = groups(results)
    profiles, labels = suite_cells(results["suite"]), _labels(results)
    colors = _colors(results)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(labels) * len(profiles)), 4.2))
    width = 0.8 / len(labels)
    top = max((sp.max for g in gs.values() if (sp := g.metrics.get("seconds_to_target"))), default=1.0)
    # x in data units, y as a fraction of the axes: a label stays inside whatever the bars' scale.
    marks = blended_transform_factory(ax.transData, ax.transAxes)
    for j, label in enumerate(labels):
        for i, profile in enumerate(profiles):
            g = gs[(profile, label)]
            x = i + (j - (len(labels) - 1) / 2) * width
            sp = g.metrics.get("seconds_to_target")
            if sp is None:
                ax.text(x, 0.03, "missed" if g.ok else "no run", rotation=90, ha="center", va="bottom",
                        fontsize=8, color=colors[label], transform=marks, clip_on=True)
                continue
            ax.bar(x, sp.median, width * 0.9, color=colors[label],
                   yerr=[[sp.median - sp.min], [sp.max - sp.median]], capsize=3)
            ax.text(x, sp.max, f"{g.reached}/{g.runs}", ha="center", va="bottom", fontsize=7, clip_on=True)
    ax.set_xticks(range(len(profiles)), [p.upper() for p in profiles])
    ax.set_xlim(-0.5, len(profiles) - 0.5)
    ax.set_ylim(0, top * 1.15)  # room for the n/N labels above the whiskers
    ax.set_xlabel("heterogeneity profile")
    ax.set_ylabel(f"seconds to {results['suite']['target_accuracy']:g} accuracy (s)")
    ax.set_title("Time to target: median, whiskers min-max;\nlabel = runs that reached the target", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    # Every variant, whether or not it reached the target anywhere.
    ax.legend(handles=[Patch(color=colors[lb], label=lb) for lb in labels], fontsize=8)
    fig.tight_layout()
    return fig


def compute_boxplots(results: dict[str, Any]) -> Figure | None:
    runs = ok_runs(results)
    if not any(cycle_seconds(w) for r in runs for w in r["summary"].get("workers") or []):
        return None
    profiles, labels = suite_cells(results["suite"]), _labels(results)
    fig, axes = plt.subplots(len(profiles), len(labels), figsize=(3.4 * len(labels), 3.2 * len(profiles)),
                             squeeze=False, sharey="row")
    colors = _colors(results)
    for i, profile in enumerate(profiles):
        for j, label in enumerate(labels):
            ax = axes[i][j]
            stats = worker_cycle_stats(results, profile, label)
            data = [w["cycle_seconds"] for w in stats]
            if any(data):
                bp = ax.boxplot([d or [float("nan")] for d in data], showfliers=True, patch_artist=True,
                                flierprops={"markersize": 2})
                for box in bp["boxes"]:
                    box.set_facecolor(colors[label])
                    box.set_alpha(0.6)
                ax.set_xticks(range(1, len(stats) + 1),
                              [f"{w['name'].replace('worker-', 'w')}\n×{w['speed']:.2f}" for w in stats], fontsize=7)
            else:
                ax.text(0.5, 0.5, "no cycles logged", ha="center", va="center", transform=ax.transAxes)
            ax.set_title(f"{profile.upper()} · {label}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
            if j == 0:
                ax.set_ylabel("compute per local cycle (s)")
            if i == len(profiles) - 1:
                ax.set_xlabel("worker (× relative speed)")
    fig.suptitle("Per-worker compute time per cycle, all repeats pooled (OmniLearn Fig. 7)", fontsize=10)
    fig.tight_layout()
    return fig


def workload_trajectories(results: dict[str, Any], profile: str) -> Figure | None:
    """Assigned DSS and MBS of each worker over time, first repeat of each variant (OmniLearn Figs. 8/11)."""
    runs = [r for r in ok_runs(results) if r["profile"] == profile]
    labels = [lb for lb in _labels(results) if any(r["variant"] == lb for r in runs)]
    if not labels:
        return None
    fig, axes = plt.subplots(len(labels), 2, figsize=(11, 2.6 * len(labels)), squeeze=False, sharex=True)
    for i, label in enumerate(labels):
        rec = min((r for r in runs if r["variant"] == label), key=lambda r: r["repeat"])
        origin = _timeline_origin(rec)
        for w in sorted(rec["summary"].get("workers") or [], key=lambda w: natural_key(w["name"])):
            hist = w.get("workload_history") or []
            if not hist:
                continue
            # The assignment in force, held until the worker's last logged cycle (or its last change).
            fields = w.get("cycle_log_fields") or ["elapsed"]
            end = max([row[fields.index("elapsed")] for row in w.get("cycle_log") or []] + [hist[-1][0]])
            t = [max(0.0, h[0] - origin) for h in hist] + [max(0.0, end - origin)]
            for col, idx in ((0, 1), (1, 2)):
                axes[i][col].plot(t, [h[idx] for h in hist] + [hist[-1][idx]], drawstyle="steps-post",
                                  linewidth=1.4, label=f"{w['name']} (×{w['speed']:.2f})")
        # From zero, with the top above the largest value: a flat line stays flat, and a step from
        # 126 to 128 does not fill the panel (matplotlib autoscales to the data's own spread).
        for col in (0, 1):
            top = max((line.get_ydata().max() for line in axes[i][col].get_lines() if len(line.get_ydata())),
                      default=1)
            axes[i][col].set_ylim(0, max(1.0, float(top)) * 1.15)
            axes[i][col].ticklabel_format(axis="y", useOffset=False, style="plain")
        axes[i][0].set_ylabel(f"{label}\ndataset size (DSS, samples)", fontsize=9)
        axes[i][1].set_ylabel("mini-batch size (MBS, samples)", fontsize=9)
        for col, what in ((0, "samples per cycle"), (1, "mini-batch size")):
            axes[i][col].set_title(f"{profile.upper()} · {label} · seed {rec['seed']}: {what}", fontsize=9)
            axes[i][col].grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("wall time since the first agent joined (s)")
    axes[0][1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def communication(results: dict[str, Any]) -> Figure | None:
    if not ok_runs(results):
        return None
    gs = groups(results)
    profiles, labels = suite_cells(results["suite"]), _labels(results)
    colors = _colors(results)
    fig, axes = plt.subplots(1, 2, figsize=(max(10.0, 2.2 * len(labels) * len(profiles)), 4.2))
    width = 0.8 / len(labels)
    panels = (("messages_total", "model_messages", "requests sent by workers (count)", "Messages per run"),
              ("mb_total", "mb_sent", "bytes sent + received by the agents (MB)", "Traffic per run"))
    for ax, (total_key, part_key, ylabel, title) in zip(axes, panels):
        for j, label in enumerate(labels):
            for i, profile in enumerate(profiles):
                g = gs[(profile, label)]
                sp, part = g.metrics.get(total_key), g.metrics.get(part_key)
                if sp is None:
                    continue
                x = i + (j - (len(labels) - 1) / 2) * width
                ax.bar(x, sp.median, width * 0.9, color=colors[label], alpha=0.45,
                       yerr=[[sp.median - sp.min], [sp.max - sp.median]], capsize=3,
                       label=label if i == 0 else None)
                if part is not None:
                    ax.bar(x, part.median, width * 0.9, color=colors[label], hatch="//", edgecolor="white")
        ax.set_xticks(range(len(profiles)), [p.upper() for p in profiles])
        ax.set_ylabel(ylabel)
        ax.set_title(title + (" (hatched: push + pull only)" if total_key == "messages_total"
                              else " (hatched: sent by the agents)"), fontsize=10)
        ax.set_xlabel("heterogeneity profile (median, whiskers min-max over repeats)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _workload_of(profile: str, results: dict[str, Any]) -> Figure | None:
    return workload_trajectories(results, profile)


def _drawers(results: dict[str, Any]) -> dict[str, Callable[[dict[str, Any]], Figure | None]]:
    d: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
        "accuracy_vs_time.png": accuracy_vs_time,
        "time_to_target.png": time_to_target,
        "compute_time_boxplots.png": compute_boxplots,
        "communication.png": communication,
        "loss_vs_time.png": loss_vs_time,
        "accuracy_vs_samples.png": accuracy_vs_samples,
    }
    for profile in suite_cells(results["suite"]):
        d[f"workload_{profile}.png"] = functools.partial(_workload_of, profile)
    return d


def plot_names(results: dict[str, Any]) -> list[str]:
    """The PNG files ``render_plots`` writes for these results: those with something to draw."""
    runs = ok_runs(results)
    if not runs:
        return []
    names = ["accuracy_vs_time.png"]
    if results["suite"].get("target_accuracy") is not None:
        names.append("time_to_target.png")
    if any(cycle_seconds(w) for r in runs for w in r["summary"].get("workers") or []):
        names.append("compute_time_boxplots.png")
    names.append("communication.png")
    if has_loss(results):
        names.append("loss_vs_time.png")
    if has_samples(results):
        names.append("accuracy_vs_samples.png")
    names += [f"workload_{p}.png" for p in suite_cells(results["suite"]) if any(r["profile"] == p for r in runs)]
    return names


def render_plots(results: dict[str, Any], out: Path) -> list[Path]:
    drawers = _drawers(results)
    names = plot_names(results)
    for stale in set(drawers) - set(names):
        (out / stale).unlink(missing_ok=True)
    written = []
    for name in names:
        fig = drawers[name](results)
        if fig is None:  # plot_names promised data: a bug, but the rest of the report still matters
            log.warning("plot %s had nothing to draw", name)
            continue
        fig.savefig(out / name, dpi=DPI)
        plt.close(fig)
        written.append(out / name)
    log.info("wrote %d plots in %s", len(written), out)
    return written
