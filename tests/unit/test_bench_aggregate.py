"""hermes-bench aggregation: medians and min-max over repeats, speed-up vs the baseline, missed targets."""

from __future__ import annotations

import json
import statistics

import pytest
from bench_fixture import TIMES, make_results

from hermes.deploy.bench.aggregate import (
    cycle_seconds,
    event_figures,
    groups,
    run_metrics,
    speedups,
    spread,
    train_origin,
    worker_cycle_stats,
)


def test_spread_drops_missing_values_and_reports_median_min_max():
    sp = spread([3.0, None, 1.0, 2.0, 10.0])
    assert (sp.median, sp.min, sp.max, sp.n) == (2.5, 1.0, 10.0, 4)
    assert spread([None, None]) is None
    assert spread([]) is None


def test_run_metrics_reads_the_summary():
    r = make_results()["runs"][0]
    m = run_metrics(r)
    s = r["summary"]
    assert m["reached"] is True
    assert m["seconds_to_target"] == s["seconds_to_target"]
    assert m["iterations"] == sum(w["cycles"] for w in s["workers"]) == 5 + 6 + 7 + 8
    assert m["model_messages"] == 40 + 44
    assert m["mb_total"] == pytest.approx(12.0)
    assert m["wi_mean"] == pytest.approx(statistics.fmean([1.0, 1.5, 2.0, 2.5]))


def test_time_to_target_of_a_missed_run_is_not_a_number():
    r = next(r for r in make_results()["runs"] if r["variant"] == "asp")
    m = run_metrics(r)
    assert m["reached"] is False and m["seconds_to_target"] is None and m["train_seconds_to_target"] is None
    # ...even if a summary carried a stale figure
    r["summary"]["seconds_to_target"] = 3.0
    assert run_metrics(r)["seconds_to_target"] is None


def test_groups_take_medians_and_ranges_over_repeats():
    gs = groups(make_results())
    g = gs[("hl8", "hermes")]
    assert (g.runs, g.ok, g.reached) == (3, 3, 3)
    t = g.metrics["seconds_to_target"]
    assert (t.median, t.min, t.max, t.n) == (5.0, 4.0, 8.0, 3)
    assert g.metrics["model_updates"].median == 110 and g.metrics["model_updates"].max == 120
    # time to target only over the runs that reached it; other figures over all runs
    ssp = gs[("hl8", "ssp")]
    assert ssp.reached == 2 and ssp.metrics["seconds_to_target"].n == 2
    assert ssp.metrics["seconds_to_target"].median == 7.5
    assert ssp.metrics["wall_seconds"].n == 3


def test_speedup_is_baseline_median_over_variant_median_of_training_time_with_per_repeat_range():
    # The fixture's training time (from the last join) is its time to target less 2 s of start-up.
    sus = speedups(make_results())
    bsp_median = statistics.median(TIMES["bsp"]) - 2.0  # 10
    h = sus[("hl8", "hermes")]
    assert h.status == "ok"
    assert h.median == pytest.approx(bsp_median / 3.0)
    assert (h.min, h.max) == (pytest.approx(bsp_median / 6.0), pytest.approx(bsp_median / 2.0))
    assert sus[("hl8", "bsp")].median == pytest.approx(1.0)
    ssp = sus[("hl8", "ssp")]
    assert ssp.status == "ok" and ssp.n == 2 and ssp.median == pytest.approx(10.0 / 5.5)


def test_results_without_training_time_compare_time_to_target():
    res = make_results()
    for r in res["runs"]:
        del r["events"]["train_seconds_to_target"]
    h = speedups(res)[("hl8", "hermes")]
    assert h.median == pytest.approx(12.0 / 5.0) and (h.min, h.max) == (pytest.approx(1.5), pytest.approx(3.0))


def test_a_variant_that_never_reached_the_target_gets_no_speedup():
    sp = speedups(make_results())[("hl8", "asp")]
    assert sp.status == "missed" and sp.median is None


def test_no_speedup_when_the_baseline_missed():
    times = {**TIMES, "bsp": [None, None, None]}
    sus = speedups(make_results(times))
    assert sus[("hl8", "hermes")].status == "baseline-missed"
    assert sus[("hl8", "asp")].status == "missed"


def test_failed_runs_are_counted_and_left_out():
    res = make_results()
    victim = next(r for r in res["runs"] if r["variant"] == "hermes" and r["repeat"] == 2)
    victim.update(status="failed", error="testbed exited with 1", summary=None)
    g = groups(res)[("hl8", "hermes")]
    assert (g.runs, g.ok) == (3, 2)
    assert g.failures == [{"seed": 2, "error": "testbed exited with 1"}]
    assert g.metrics["seconds_to_target"].max == 5.0


def test_worker_cycle_seconds_pool_repeats_per_worker():
    res = make_results()
    stats = worker_cycle_stats(res, "hl8", "bsp")
    assert [w["name"] for w in stats] == ["worker-1", "worker-2", "worker-3", "worker-4"]
    w3 = stats[2]
    assert len(w3["cycle_seconds"]) == 3 * 7
    # the slowest worker (speed 0.125) has the longest cycles
    assert statistics.median(w3["cycle_seconds"]) > statistics.median(stats[3]["cycle_seconds"])
    w = res["runs"][0]["summary"]["workers"][0]
    assert cycle_seconds(w) == [row[3] for row in w["cycle_log"]]


def test_worker_stats_read_results_written_before_the_batch_size_had_one_name():
    # Before issue 26 the worker records and their cycle logs called the batch size ``mbs``.
    res = make_results()
    for r in res["runs"]:
        for w in r["summary"]["workers"]:
            w["mbs"] = w.pop("batch_size")
            w["cycle_log_fields"] = ["elapsed", "dss", "mbs", *w["cycle_log_fields"][3:]]
    stats = worker_cycle_stats(res, "hl8", "bsp")
    assert [w["batch_size"] for w in stats] == [[32, 32, 32]] * 4
    assert stats == worker_cycle_stats(make_results(), "hl8", "bsp")
    # The oldest files have no field list: compute seconds are the fourth column.
    w = res["runs"][0]["summary"]["workers"][0]
    del w["cycle_log_fields"]
    assert cycle_seconds(w) == [row[3] for row in w["cycle_log"]]


def test_training_time_runs_from_the_last_agents_first_join_to_the_evaluation_that_reached_the_target(tmp_path):
    # Issue 17's "seconds of training": from the last agent's join. A rejoin (w0001 restarted at 109)
    # does not move the start; the evaluation that reached the target (not the later event) ends it.
    events = [
        {"ts": 100.0, "event": "testbed_start"},
        {"ts": 101.0, "event": "evaluation", "elapsed": 1.0, "version": 0, "accuracy": 0.1},
        {"ts": 103.0, "event": "join", "worker": "w0001"},
        {"ts": 104.5, "event": "join", "worker": "w0002"},
        {"ts": 105.0, "event": "update_applied"},
        {"ts": 109.0, "event": "join", "worker": "w0001", "rejoined": True},
        {"ts": 112.0, "event": "evaluation", "elapsed": 12.0, "version": 9, "accuracy": 0.93},
        {"ts": 112.4, "event": "target_reached", "version": 9, "accuracy": 0.93},
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    ev = event_figures(log)
    assert ev["train_seconds_to_target"] == pytest.approx(112.0 - 104.5)
    assert ev["train_start_elapsed"] == pytest.approx(4.5) and ev["first_join_elapsed"] == pytest.approx(3.0)
    assert ev["first_update_after_join"] == pytest.approx(2.0)
    assert train_origin({"events": ev}) == pytest.approx(4.5)
    # Results written before train_start_elapsed existed start their timelines at the first join.
    assert train_origin({"events": {"first_join_elapsed": 3.0}}) == 3.0 and train_origin({}) == 0.0
