"""hermes-bench runner: resumable (finished runs are skipped, half-written ones redone), suites validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_fixture import summary

from hermes.deploy.bench.runner import execute, plan, refresh_events
from hermes.deploy.bench.suites import (
    SuiteError,
    build_suite,
    builtin_suite,
    check_runnable,
    load_suite,
)


class FakeTestbed:
    """Stands in for ``python -m hermes.deploy.testbed``: writes what a finished run leaves."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail or set()

    def __call__(self, args: list[str], run_dir: Path, timeout: float):
        self.calls.append(args)
        preset = args[args.index("--preset") + 1]
        seed = int(args[args.index("--seed") + 1])
        if preset in self.fail:
            (run_dir / "events.jsonl").write_text("")
            return 1, "testbed exited with 1"
        (run_dir / "summary.json").write_text(json.dumps(summary(preset, seed, 5.0 + seed)))
        (run_dir / "events.jsonl").write_text(
            json.dumps({"ts": 100.0, "event": "evaluation", "elapsed": 1.0, "version": 0, "accuracy": 0.1}) + "\n"
            + json.dumps({"ts": 101.0, "event": "join", "worker": "w0001"}) + "\n")
        return 0, None


def small_suite(**changes):
    # The runner's mechanics on two variants: the fastest device alone, which every suite gets, left out here.
    return build_suite({"name": "t", "presets": ["bsp", "hermes"], "profiles": ["hl8"], "repeats": 2,
                        "max_seconds": 5, "alone": False, **changes})


def test_plan_interleaves_variants_within_each_repeat():
    keys = [s.key for s in plan(small_suite())]
    assert keys == ["hl8/bsp/r0", "hl8/hermes/r0", "hl8/bsp/r1", "hl8/hermes/r1"]
    assert [s.seed for s in plan(small_suite(seed=7))] == [7, 7, 8, 8]


def test_second_invocation_skips_finished_runs(tmp_path):
    fake = FakeTestbed()
    res = execute(small_suite(), tmp_path, launcher=fake)
    assert len(fake.calls) == 4
    assert [r["status"] for r in res["runs"]] == ["ok"] * 4
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["summary"]["preset"] == "bsp"

    again = FakeTestbed()
    lines: list[str] = []
    res2 = execute(small_suite(), tmp_path, launcher=again, progress=lines.append)
    assert again.calls == []
    assert "4 already finished" in lines[0] and "0 to run" in lines[0]
    assert [r["summary"] for r in res2["runs"]] == [r["summary"] for r in res["runs"]]


def test_half_written_and_outdated_runs_are_redone(tmp_path):
    execute(small_suite(), tmp_path, launcher=FakeTestbed())
    half = tmp_path / "runs/hl8/hermes/r1"
    (half / "summary.json").unlink()  # interrupted mid-run: run.json and logs, no summary
    (half / "stale.log").write_text("left over")
    fake = FakeTestbed()
    execute(small_suite(), tmp_path, launcher=fake)
    assert len(fake.calls) == 1 and fake.calls[0][fake.calls[0].index("--out") + 1] == str(half)
    assert not (half / "stale.log").exists()
    # a different budget measures something else: every run is redone
    fake = FakeTestbed()
    execute(small_suite(max_seconds=6), tmp_path, launcher=fake)
    assert len(fake.calls) == 4


def test_failed_runs_are_recorded_and_retried(tmp_path):
    res = execute(small_suite(), tmp_path, launcher=FakeTestbed(fail={"hermes"}))
    failed = [r for r in res["runs"] if r["status"] != "ok"]
    assert [r["key"] for r in failed] == ["hl8/hermes/r0", "hl8/hermes/r1"]
    assert failed[0]["error"] == "testbed exited with 1"
    fake = FakeTestbed()
    execute(small_suite(), tmp_path, launcher=fake)
    assert len(fake.calls) == 2


def test_overrides_reach_the_testbed(tmp_path):
    suite = build_suite({"name": "t", "variants": [{"label": "b64", "preset": "bsp", "overrides": {"batch_size": 64}}],
                         "overrides": {"eval_interval_seconds": 0.5}, "baseline": None, "repeats": 1})
    fake = FakeTestbed()
    execute(suite, tmp_path, launcher=fake)
    args = fake.calls[0]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert sets == ["eval_interval_seconds=0.5", "batch_size=64"]


def test_a_variant_with_screening_off_starts_the_testbed_without_it(tmp_path):
    # Issue 29's defences' cost: the same preset with the server's update screening off, side by side.
    suite = build_suite({"name": "t", "variants": [{"label": "h", "preset": "hermes"},
                                                   {"label": "h-off", "preset": "hermes", "screening": False}],
                         "baseline": None, "repeats": 1, "alone": False})
    fake = FakeTestbed()
    execute(suite, tmp_path, launcher=fake)
    on, off = fake.calls
    assert "--screening" not in on
    assert off[off.index("--screening") + 1] == "off"
    assert plan(suite)[1].identity(suite)["screening"] is False and "screening" not in plan(suite)[0].identity(suite)


def test_unknown_presets_are_named_at_run_time():
    problems = check_runnable(build_suite({"name": "t", "presets": ["bsp", "omnilearn-zz", "nope"]}))
    assert len(problems) == 1
    assert "unknown preset(s) ['nope', 'omnilearn-zz']" in problems[0] and "'bsp'" in problems[0]
    assert check_runnable(builtin_suite("paper-hermes")) == []
    assert check_runnable(builtin_suite("quick")) == []


def test_bad_overrides_are_refused_with_the_field():
    problems = check_runnable(build_suite({"name": "t", "presets": ["bsp"], "overrides": {"lr": -1}}))
    assert problems and "lr" in problems[0]


@pytest.mark.parametrize("data, field", [
    ({"presets": ["bsp"], "repeats": 0}, "repeats"),
    ({"presets": ["bsp"], "profiles": ["hl3"]}, "profiles"),
    ({"presets": ["bsp", "bsp"]}, "duplicate label"),
    ({"presets": ["hermes"]}, "baseline"),
    ({"presets": ["bsp"], "colour": "red"}, "colour"),
])
def test_suite_errors_name_the_field(data, field):
    with pytest.raises(SuiteError, match=field):
        build_suite({"name": "t", **data})


def test_suite_from_toml(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('presets = ["bsp", "hermes"]\nprofiles = ["hl4", "hl8"]\nrepeats = 3\nmax_seconds = 30\n'
                 '[overrides]\nbatch_size = 16\n')
    s = load_suite(f)
    assert s.name == "mine" and [v.label for v in s.variants] == ["bsp", "hermes", "alone"]
    assert s.overrides == {"batch_size": 16} and len(plan(s)) == 18
    f.write_text("repeats = [")
    with pytest.raises(SuiteError, match="not valid TOML"):
        load_suite(f)


def test_a_resumed_invocation_with_nothing_to_run_keeps_the_results_stamp(tmp_path: Path) -> None:
    """The report stamps ``written_at``: the same results must render the same report later."""
    from hermes.common.clock import ManualClock

    clock = ManualClock()
    first = execute(small_suite(), tmp_path, launcher=FakeTestbed(), clock=clock)
    clock.advance(3600.0)
    again = execute(small_suite(), tmp_path, launcher=FakeTestbed(), clock=clock)
    assert again["written_at"] == first["written_at"]
    assert json.loads((tmp_path / "results.json").read_text())["written_at"] == first["written_at"]
    # New results get a new stamp.
    clock.advance(60.0)
    other = tmp_path / "other"
    fresh = execute(small_suite(), other, launcher=FakeTestbed(), clock=clock)
    assert fresh["written_at"] == clock.time()


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "benchmarks" / "suites").glob("*.toml")),
                         ids=lambda p: p.name)
def test_the_checked_in_suites_load_and_can_run_here(path):
    from hermes.deploy.bench.suites import check_runnable, load_suite

    suite = load_suite(path)
    assert suite.name == path.stem and check_runnable(suite) == []


def test_report_times_older_results_again_from_their_event_logs(tmp_path):
    # A run written when training time counted from the first join; its events.jsonl is still there.
    run_dir = tmp_path / "runs/hl8/hermes/r0"
    run_dir.mkdir(parents=True)
    events = [{"ts": 100.0, "event": "evaluation", "elapsed": 1.0, "version": 0, "accuracy": 0.1},
              {"ts": 102.0, "event": "join", "worker": "w0001"}, {"ts": 103.0, "event": "join", "worker": "w0002"},
              {"ts": 110.0, "event": "evaluation", "elapsed": 11.0, "version": 5, "accuracy": 0.95},
              {"ts": 110.2, "event": "target_reached", "version": 5, "accuracy": 0.95}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    old = {"train_seconds_to_target": 8.0, "first_join_elapsed": 3.0}
    results = {"runs": [
        {"run_dir": "runs/hl8/hermes/r0", "summary": {"reached_target": True}, "events": dict(old)},
        # The DDP peer writes no event log: its figures stay.
        {"run_dir": "runs/hl8/ddp/r0", "summary": {"reached_target": True}, "events": {"x": 1}},
        {"run_dir": "runs/hl8/bsp/r0", "summary": None, "events": {}},
    ]}
    assert refresh_events(tmp_path, results) == 1
    assert results["runs"][0]["events"]["train_seconds_to_target"] == 7.0
    assert results["runs"][0]["events"]["train_start_elapsed"] == 4.0
    assert results["runs"][1]["events"] == {"x": 1} and results["runs"][2]["events"] == {}
    assert refresh_events(tmp_path, results) == 0  # already current


def test_every_suite_measures_the_fastest_device_alone(tmp_path):
    """Issue 31: an ``alone`` baseline in every suite, the built-in ones and a user's file, unless it says
    ``alone = false``; ``--variants`` keeps only what it names; the alone run is one device at the profile's
    fastest speed times the suite's pace, no link."""
    from hermes.deploy.bench.suites import BUILTIN, builtin_suite

    for name in BUILTIN:
        runners = {v.label: v.runner for v in builtin_suite(name).variants}
        assert runners.get("alone") == "alone", name
    f = tmp_path / "mine.toml"
    f.write_text('presets = ["hermes"]\nbaseline = "hermes"\n')
    assert [v.label for v in load_suite(f).variants] == ["hermes", "alone"]
    f.write_text('presets = ["hermes"]\nbaseline = "hermes"\nalone = false\n')
    assert [v.label for v in load_suite(f).variants] == ["hermes"]
    suite = build_suite({"name": "t", "presets": ["bsp", "hermes"], "profiles": ["hl4"], "links": ["lte"],
                         "pace": 2.0, "repeats": 1})
    assert [v.label for v in suite.only_variants(["hermes"]).variants] == ["hermes"]
    assert [v.label for v in suite.with_changes(repeats=2).variants] == ["bsp", "hermes", "alone"]
    alone = next(s for s in plan(suite) if s.variant.label == "alone")
    args = alone.testbed_args(suite, tmp_path)
    at = {k: args[args.index(k) + 1] for k in ("--clients", "--profile", "--pace", "--peer")}
    assert at == {"--clients": "1", "--profile": "hl1", "--pace": "2", "--peer": "ddp"} and "--link" not in args
