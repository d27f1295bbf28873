"""Learning curves from a run's history: loss against time, accuracy against samples and epochs.

The server's evaluations (``accuracy_timeline``: version, accuracy, loss,
elapsed) carry no training progress; the workers' cycle logs do (each row's
``elapsed`` and ``dss``, the samples trained in that cycle, on the same
server clock). ``training_history`` joins the two: the samples every worker
had trained by each evaluation, and the epochs that is (the run's final
``epochs`` scaled by the share of its samples trained by then).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from hermes.deploy.bench.aggregate import ok_runs, suite_cells, train_origin  # noqa: E402


def _cycles(summary: dict[str, Any]) -> list[tuple[float, int]]:
    """(elapsed, samples) of every logged cycle of every worker, in time order."""
    out: list[tuple[float, int]] = []
    for w in summary.get("workers") or []:
        fields = w.get("cycle_log_fields") or []
        if "elapsed" not in fields or "dss" not in fields:
            continue
        t, n = fields.index("elapsed"), fields.index("dss")
        out += [(float(row[t]), int(row[n])) for row in w.get("cycle_log") or [] if row[t] is not None]
    return sorted(out)


def training_history(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluations, each with ``samples`` trained by then and ``epochs`` (None without cycle logs)."""
    cycles = _cycles(summary)
    times = [c[0] for c in cycles]
    cumulative: list[int] = []
    total = 0
    for _, n in cycles:
        total += n
        cumulative.append(total)
    final_epochs = summary.get("epochs")
    out = []
    for ev in summary.get("accuracy_timeline") or []:
        if ev.get("elapsed") is None:
            continue
        k = bisect.bisect_right(times, float(ev["elapsed"]))
        samples = cumulative[k - 1] if k else 0
        epochs = (final_epochs * samples / total if isinstance(final_epochs, (int, float)) and total else None)
        out.append({**ev, "samples": samples if cycles else None, "epochs": epochs})
    return out


def _colors(results: dict[str, Any]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    return {v["label"]: cmap(i % 10) for i, v in enumerate(results["suite"]["variants"])}


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def has_loss(results: dict[str, Any]) -> bool:
    return any(_finite(e.get("loss")) for r in ok_runs(results) for e in r["summary"].get("accuracy_timeline") or [])


def has_samples(results: dict[str, Any]) -> bool:
    return any(_cycles(r["summary"]) for r in ok_runs(results))


def loss_vs_time(results: dict[str, Any]) -> Figure | None:
    """Test loss of every repeat against wall time since the last join, one panel per profile."""
    if not has_loss(results):
        return None
    runs, profiles, colors = ok_runs(results), suite_cells(results["suite"]), _colors(results)
    fig, axes = plt.subplots(1, len(profiles), figsize=(5.5 * len(profiles), 4.2), squeeze=False, sharey=True)
    top = 0.0
    for ax, profile in zip(axes[0], profiles):
        seen: set[str] = set()
        for r in (r for r in runs if r["profile"] == profile):
            origin = train_origin(r)
            pts = [(max(0.0, e["elapsed"] - origin), e["loss"]) for e in r["summary"].get("accuracy_timeline") or []
                   if e.get("elapsed") is not None and _finite(e.get("loss"))]
            if not pts:
                continue
            top = max(top, max(p[1] for p in pts))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[r["variant"]], alpha=0.8, linewidth=1.3,
                    marker=".", markersize=3, label=None if r["variant"] in seen else r["variant"])
            seen.add(r["variant"])
        ax.set_title(f"{profile.upper()}: test loss (every repeat)")
        ax.set_xlabel("wall time since the first agent joined (s)")
        ax.grid(alpha=0.3)
    # From zero: a loss that barely moves must look like it barely moves.
    axes[0][0].set_ylim(0, top * 1.08 if top > 0 else 1.0)
    axes[0][0].set_ylabel("test loss (cross-entropy)")
    axes[0][-1].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def accuracy_vs_samples(results: dict[str, Any]) -> Figure | None:
    """Test accuracy against samples trained (left) and epochs (right), per profile, every repeat."""
    if not has_samples(results):
        return None
    runs, profiles, colors = ok_runs(results), suite_cells(results["suite"]), _colors(results)
    target = results["suite"].get("target_accuracy")
    fig, axes = plt.subplots(len(profiles), 2, figsize=(11, 4.0 * len(profiles)), squeeze=False, sharey=True)
    for row, profile in zip(axes, profiles):
        seen: set[str] = set()
        for r in (r for r in runs if r["profile"] == profile):
            hist = [h for h in training_history(r["summary"]) if h["samples"] is not None]
            label = None if r["variant"] in seen else r["variant"]
            seen.add(r["variant"])
            style = {"color": colors[r["variant"]], "alpha": 0.8, "linewidth": 1.3, "drawstyle": "steps-post"}
            row[0].plot([h["samples"] for h in hist], [h["accuracy"] for h in hist], label=label, **style)
            with_epochs = [h for h in hist if h["epochs"] is not None]
            row[1].plot([h["epochs"] for h in with_epochs], [h["accuracy"] for h in with_epochs], label=label,
                        **style)
        for ax, what in ((row[0], "samples trained by all workers"), (row[1], "epochs over the training set")):
            if target is not None:
                ax.axhline(target, color="black", linestyle="--", linewidth=0.8, label=f"target {target:g}")
            ax.set_title(f"{profile.upper()}: test accuracy against {what.split(' ')[0]}", fontsize=10)
            ax.set_xlabel(what)
            ax.set_xlim(left=0)
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        row[0].set_ylabel("test accuracy (fraction correct)")
    axes[0][1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig
