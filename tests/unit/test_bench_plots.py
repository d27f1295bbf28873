"""The bench plots, drawn (matplotlib Agg) from the synthetic results and checked by their artists."""

from __future__ import annotations

import copy

import matplotlib.pyplot as plt
import pytest

from hermes.deploy.bench import plots
from hermes.deploy.bench.curves import accuracy_vs_samples, loss_vs_time, training_history
from tests.unit.bench_fixture import TIMES, make_results


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _inside(fig, ax, artist) -> bool:
    fig.canvas.draw()
    box, frame = artist.get_window_extent(), ax.get_window_extent()
    return (frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5
            and frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5)


@pytest.mark.parametrize("times", [TIMES, {k: [None, None, None] for k in TIMES},
                                   {"asp": [None, None, None], "bsp": [10.0, 12.0, 14.0]}])
def test_time_to_target_legend_has_every_variant_and_missed_labels_stay_inside(times) -> None:
    res = make_results(times, baseline=next(iter(times)))
    fig = plots.time_to_target(res)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(times)
    missed = [t for t in ax.texts if t.get_text() == "missed"]
    assert len(missed) == sum(all(v is None for v in ts) for ts in times.values())
    for t in missed:
        assert _inside(fig, ax, t), (t.get_position(), ax.get_xlim(), ax.get_ylim())
    for t in ax.texts:  # the n/N labels above the whiskers too
        assert _inside(fig, ax, t), t.get_text()


def test_workload_plot_does_not_stretch_flat_lines() -> None:
    fig = plots.workload_trajectories(make_results(), "hl8")
    dss_ax, mbs_ax = fig.axes[0], fig.axes[1]
    # Every worker's MBS is 32 throughout: the panel starts at 0 and the lines sit near its top.
    assert all(set(line.get_ydata()) == {32} for line in mbs_ax.get_lines())
    assert mbs_ax.get_ylim() == pytest.approx((0.0, 32 * 1.15))
    # DSS 128 -> 128 + 64 i: from zero too, the largest value below the top.
    bottom, top = dss_ax.get_ylim()
    assert bottom == 0.0 and 320 < top <= 320 * 1.15 + 1e-9
    assert not mbs_ax.yaxis.get_major_formatter().get_useOffset()


def _with_history(res):
    res = copy.deepcopy(res)
    for r in res["runs"]:
        s = r["summary"]
        s["epochs"] = 2.0
        for k, ev in enumerate(s["accuracy_timeline"]):
            ev["loss"] = 2.0 - 1.5 * k
    return res


def test_training_history_counts_samples_and_epochs_at_each_evaluation() -> None:
    summary = _with_history(make_results())["runs"][0]["summary"]
    hist = training_history(summary)
    # Cycles at elapsed 1.0 + c, 128 samples each; workers have 5, 6, 7, 8 cycles (26 in all).
    assert [h["samples"] for h in hist] == [4 * 128, 26 * 128]
    assert hist[0]["epochs"] == pytest.approx(2.0 * 4 / 26) and hist[1]["epochs"] == pytest.approx(2.0)
    assert [h["accuracy"] for h in hist] == [e["accuracy"] for e in summary["accuracy_timeline"]]


def test_loss_curves() -> None:
    res = _with_history(make_results())
    fig = loss_vs_time(res)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(TIMES)
    assert len(ax.get_lines()) == len(res["runs"])  # every repeat
    assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] >= 2.0
    assert loss_vs_time(make_results()) is None  # no loss recorded: no plot


def test_accuracy_against_samples_and_epochs() -> None:
    res = _with_history(make_results())
    fig = accuracy_vs_samples(res)
    by_samples, by_epochs = fig.axes[0], fig.axes[1]
    run_lines = [ln for ln in by_samples.get_lines() if ln.get_label() != "target 0.85" and len(ln.get_xdata()) > 1]
    assert len(run_lines) == len(res["runs"])
    assert max(max(ln.get_xdata()) for ln in run_lines) == 26 * 128
    epochs_max = max(max(ln.get_xdata()) for ln in by_epochs.get_lines() if len(ln.get_xdata()) > 1
                     and ln.get_label() != "target 0.85")
    assert epochs_max == pytest.approx(2.0)
    assert {t.get_text() for t in by_epochs.get_legend().get_texts()} == set(TIMES) | {"target 0.85"}


def test_render_writes_the_new_plots(tmp_path) -> None:
    res = _with_history(make_results())
    names = [p.name for p in plots.render_plots(res, tmp_path)]
    assert "loss_vs_time.png" in names and "accuracy_vs_samples.png" in names
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)
