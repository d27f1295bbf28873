"""The slowdown emulation's two rules (common/pace.py) and how a run chooses one: agent, testbed, DDP peer, bench."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hermes.client.cli import build_parser
from hermes.client.trainer import LocalTrainer
from hermes.common.models import build_model
from hermes.common.pace import StepPacer
from hermes.deploy.bench.runner import plan
from hermes.deploy.bench.suites import build_suite
from hermes.deploy.profiles import worker_profiles
from hermes.deploy.testbed_commands import agent_args


def test_cpu_mode_multiplies_each_steps_work():
    pacer = StepPacer(4.0)
    assert pacer.sleep_seconds(0.010, 32) == pytest.approx(0.030)
    # Contention that doubled the work is multiplied too: the step lasts 4 x 20 ms.
    assert pacer.sleep_seconds(0.020, 32) == pytest.approx(0.060)


def test_floor_mode_holds_a_step_at_slowdown_times_its_least_cost():
    pacer = StepPacer(4.0, "floor")
    assert pacer.sleep_seconds(0.010, 32) == pytest.approx(0.030)  # the first step is its own reference
    # Twice the work (co-located processes): the step still lasts 4 x 10 ms, not 4 x 20 ms.
    assert pacer.sleep_seconds(0.020, 32) == pytest.approx(0.020)
    # A cheaper step lowers the reference: 4 x 8 ms.
    assert pacer.sleep_seconds(0.008, 32) == pytest.approx(0.024)
    # Per sample: a last chunk of 16 samples is nominally half a step (4 x 4 ms).
    assert pacer.sleep_seconds(0.004, 16) == pytest.approx(0.012)
    # Work beyond the nominal time: no sleep (the host is the bottleneck).
    assert pacer.sleep_seconds(0.050, 32) == 0.0


def test_floor_mode_counts_wall_time_and_makes_up_an_oversleep():
    pacer = StepPacer(4.0, "floor")
    # 10 ms of work, but 25 ms on the wall (waiting for a core): 40 ms nominal, 15 ms left to sleep.
    assert pacer.sleep_seconds(0.010, 32, elapsed=0.025) == pytest.approx(0.015)
    pacer.slept(0.015, 0.022)  # woken 7 ms late
    assert pacer.sleep_seconds(0.010, 32, elapsed=0.010) == pytest.approx(0.023)
    # The credit is spent once, and is never more than one nominal step.
    assert pacer.sleep_seconds(0.010, 32, elapsed=0.010) == pytest.approx(0.030)
    pacer.slept(0.0, 1.0)
    assert pacer.sleep_seconds(0.010, 32, elapsed=0.0) == 0.0
    cpu = StepPacer(4.0)
    cpu.slept(0.03, 0.05)  # cpu mode keeps no credit: the rule of every earlier measurement
    assert cpu.sleep_seconds(0.010, 32, elapsed=0.5) == pytest.approx(0.030)


def test_floor_reference_follows_the_last_window_of_steps():
    pacer = StepPacer(2.0, "floor", window=2)
    pacer.sleep_seconds(0.001, 10)
    pacer.sleep_seconds(0.010, 10)
    # The 1 ms step has left the window of 2: the reference is 10 ms now.
    assert pacer.sleep_seconds(0.010, 10) == pytest.approx(0.010)


def test_no_slowdown_never_sleeps_and_bad_settings_are_refused():
    assert StepPacer(1.0, "floor").sleep_seconds(0.01, 32) == 0.0
    assert StepPacer(1.0).sleep_seconds(0.01, 32) == 0.0
    pacer = StepPacer(2.0, "floor")
    pacer.set_slowdown(3.0)
    assert pacer.sleep_seconds(0.01, 32) == pytest.approx(0.02)
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="slowdown"):
            StepPacer(bad)
        with pytest.raises(ValueError, match="slowdown"):
            pacer.set_slowdown(bad)
    with pytest.raises(ValueError, match="mode"):
        StepPacer(2.0, "wall")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        StepPacer(2.0, "floor", window=0)


@pytest.mark.parametrize(("mode", "works", "expected"), [
    ("cpu", [0.01, 0.03, 0.01], [0.01, 0.03, 0.01]),
    # The second step's work inflated 3x by contention: it outlasts its nominal 20 ms and does not sleep.
    ("floor", [0.01, 0.03, 0.01], [0.01, 0.01]),
    # Each sleep overslept 5 ms (woken late): the next step's sleep is that much shorter.
    ("floor", [0.01, 0.01, 0.01], [0.01, 0.005, 0.005]),
])
def test_the_trainer_sleeps_what_its_mode_says(monkeypatch, mode, works, expected):
    torch.manual_seed(0)
    trainer = LocalTrainer(build_model("cnn", input_shape=(1, 8, 8), num_classes=10), lr=0.01,
                           device=torch.device("cpu"), precision="fp32", slowdown=2.0, slowdown_mode=mode)
    # A clock that moves only by the steps' scripted work and the sleeps (each 5 ms late): no timing here.
    clock, scripted, slept = [0.0], iter(works), []

    def work(t0: float, cpu0: float) -> float:
        w = next(scripted)
        clock[0] += w
        return w

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds + 0.005

    monkeypatch.setattr(trainer, "_work_seconds", work)
    monkeypatch.setattr("hermes.client.trainer.time",
                        SimpleNamespace(perf_counter=lambda: clock[0], thread_time=lambda: 0.0, sleep=sleep))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 96).astype(np.int64)
    trainer.train_cycle(x, y, 32)
    assert slept == pytest.approx(expected)


def test_the_mode_reaches_agents_the_ddp_peer_and_every_bench_run():
    assert build_parser().parse_args(["--slowdown-mode", "floor"]).slowdown_mode == "floor"
    assert build_parser().parse_args([]).slowdown_mode == "cpu"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--slowdown-mode", "wall"])
    a = argparse.Namespace(pace=4.0, device="cpu", topology="ps", task=None, slowdown_mode="floor")
    wp = worker_profiles("hl2", 4)[0]
    args = agent_args(a, wp, server_url="http://127.0.0.1:1", schedules=None, schedule_origin=0.0)
    assert args[args.index("--slowdown-mode") + 1] == "floor"
    assert "--slowdown-mode" not in agent_args(argparse.Namespace(**{**vars(a), "slowdown_mode": "cpu"}), wp,
                                               server_url="http://127.0.0.1:1", schedules=None, schedule_origin=0.0)
    variants = [{"label": "alone", "preset": "bsp", "runner": "alone"}, {"label": "hermes", "preset": "hermes"}]
    for mode, present in (("floor", True), ("cpu", False)):
        suite = build_suite({"name": "s", "variants": variants, "profiles": ["hl2"], "slowdown_mode": mode,
                             "baseline": "alone"})
        for spec in plan(suite):
            run_args = spec.args(suite, Path("/tmp/x"))
            assert ("--slowdown-mode" in run_args) == present
            if present:
                assert run_args[run_args.index("--slowdown-mode") + 1] == "floor"


def test_nominal_mode_holds_every_step_at_slowdown_times_the_given_cost():
    # 0.1 ms a sample: a step of 32 at S = 4 lasts 12.8 ms whatever its own loop's least cost.
    pacer = StepPacer(4.0, "nominal", nominal_sample_seconds=0.0001)
    assert pacer.sleep_seconds(0.003, 32) == pytest.approx(0.0098)
    # A cheaper step does not lower the reference (floor's would: 4 x 2 ms = 8 ms).
    assert pacer.sleep_seconds(0.002, 32, elapsed=0.002) == pytest.approx(0.0108)
    # Waiting for a core within the nominal step does not slow the device; beyond it, no sleep.
    assert pacer.sleep_seconds(0.003, 32, elapsed=0.010) == pytest.approx(0.0028)
    assert pacer.sleep_seconds(0.003, 32, elapsed=0.020) == 0.0
    # Per sample: half a step's samples, half its nominal time.
    assert pacer.sleep_seconds(0.001, 16) == pytest.approx(0.0054)
    # Two loops of different own costs (alone's, an agent's) get the same step: not so under floor.
    alone, agent = (StepPacer(6.0, "nominal", nominal_sample_seconds=0.0001) for _ in range(2))
    assert 0.0035 + alone.sleep_seconds(0.0035, 32) == pytest.approx(0.0033 + agent.sleep_seconds(0.0033, 32))
    floor_alone, floor_agent = StepPacer(6.0, "floor"), StepPacer(6.0, "floor")
    assert 0.0035 + floor_alone.sleep_seconds(0.0035, 32) > 0.0033 + floor_agent.sleep_seconds(0.0033, 32) + 0.001


def test_nominal_mode_slows_the_work_between_cycles_and_the_others_do_not():
    pacer = StepPacer(4.0, "nominal", nominal_sample_seconds=0.0001)
    # 5 ms of CPU (gate, encode, rebase) lasts 20 ms: 7 ms of wall already spent (waiting for a core in it).
    assert pacer.overhead_seconds(0.005, 0.007) == pytest.approx(0.013)
    assert pacer.overhead_seconds(0.005, 0.030) == 0.0
    # Its late wake-up is made up in the next step, with the step's own.
    pacer.slept(0.013, 0.016)
    assert pacer.sleep_seconds(0.003, 32, elapsed=0.003) == pytest.approx(0.0128 - 0.003 - 0.003)
    for other in (StepPacer(4.0), StepPacer(4.0, "floor")):
        assert other.overhead_seconds(0.005, 0.005) == 0.0
    assert StepPacer(1.0, "nominal", nominal_sample_seconds=0.0001).overhead_seconds(0.005, 0.0) == 0.0


def test_nominal_mode_needs_its_cost_and_only_it_takes_one():
    for bad in (None, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="nominal"):
            StepPacer(2.0, "nominal", nominal_sample_seconds=bad)
    with pytest.raises(ValueError, match="nominal"):
        StepPacer(2.0, "floor", nominal_sample_seconds=0.001)
    from hermes.client.cli import _usage_problem
    base = ["--server", "http://127.0.0.1:1"]
    assert "nominal" in (_usage_problem(build_parser().parse_args([*base, "--slowdown-mode", "nominal"])) or "")
    assert "nominal" in (_usage_problem(build_parser().parse_args([*base, "--nominal-sample-ms", "0.1"])) or "")
    assert "nominal" in (_usage_problem(build_parser().parse_args(
        [*base, "--slowdown-mode", "nominal", "--nominal-sample-ms", "0"])) or "")
    assert _usage_problem(build_parser().parse_args(
        [*base, "--slowdown-mode", "nominal", "--nominal-sample-ms", "0.1"])) is None


@pytest.mark.parametrize(("mode", "nominal", "expected"), [("nominal", 0.0001, [0.009]), ("floor", None, [])])
def test_the_agent_loop_slows_its_work_between_cycles_in_nominal_mode_only(monkeypatch, mode, nominal, expected):
    from hermes.client import loop as loop_mod

    # A scripted clock: the topology's finish_cycle takes 4 ms of CPU and 10 ms of wall, 3 ms of it waiting
    # for a reply; at S = 4 the stretch lasts 16 ms of device time, so 16 - (10 - 3) = 9 ms of sleep.
    clock, cpu, slept = [0.0], [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    fake_time = SimpleNamespace(perf_counter=lambda: clock[0], thread_time=lambda: cpu[0], sleep=sleep)
    monkeypatch.setattr("hermes.client.trainer.time", fake_time)
    monkeypatch.setattr(loop_mod, "time", fake_time)
    trainer = LocalTrainer(build_model("cnn", input_shape=(1, 8, 8), num_classes=10), lr=0.01,
                           device=torch.device("cpu"), precision="fp32", slowdown=4.0, slowdown_mode=mode,
                           nominal_sample_seconds=nominal)
    stats = SimpleNamespace(cycles=0, samples=0, compute_seconds=0.0, wait_seconds=0.0, last_loss=None)
    result = SimpleNamespace(samples=32, compute_seconds=0.0, wait_seconds=0.0, loss=0.1)
    works = iter([SimpleNamespace(epoch=0, lr=0.01, batch_size=32, accumulation=1)])

    class Topology:
        grad_hook = None

        def start_cycle(self):
            return None

        def steps(self, work, n):
            return None

        def stop_signal(self, signal):
            return "no more work"

        def finish_cycle(self, work, result):
            clock[0] += 0.010
            cpu[0] += 0.004
            stats.wait_seconds += 0.003
            return "stop"

    session = SimpleNamespace(prefetcher=SimpleNamespace(next=lambda: next(works)),
                              cycle_samples=lambda work: (torch.zeros(32, 1, 8, 8), torch.zeros(32)))
    host = SimpleNamespace(stats=stats, slowdown_now=lambda: 4.0, worker_name="w")
    job = SimpleNamespace(trainer=trainer, task=None)
    monkeypatch.setattr(trainer, "train_cycle", lambda *a, **k: result)
    assert loop_mod.run_cycles(host, job, session, Topology()) == "stop"
    assert slept == pytest.approx(expected)


def test_nominal_reaches_agents_and_every_bench_run(tmp_path):
    a = argparse.Namespace(pace=4.0, device="cpu", topology="ps", task=None, slowdown_mode="nominal",
                           nominal_sample_ms=0.103)
    wp = worker_profiles("hl2", 4)[0]
    args = agent_args(a, wp, server_url="http://127.0.0.1:1", schedules=None, schedule_origin=0.0)
    assert args[args.index("--nominal-sample-ms") + 1] == "0.103"
    assert args[args.index("--slowdown-mode") + 1] == "nominal"
    # The bench measures the nominal once, before any run, hands it to every run and records it.
    from hermes.deploy.bench.runner import execute

    variants = [{"label": "alone", "preset": "bsp", "runner": "alone"}, {"label": "hermes", "preset": "hermes"}]
    suite = build_suite({"name": "s", "variants": variants, "profiles": ["hl2"], "slowdown_mode": "nominal",
                         "baseline": "alone", "repeats": 2})
    probes, launched = [], []

    def probe(s):
        probes.append(s.name)
        return {"nominal_sample_ms": 0.103, "median_sample_ms": 0.11, "batch_size": 32, "steps": 3}

    def launcher(run_args, run_dir, timeout):
        launched.append(run_args)
        (run_dir / "summary.json").write_text("{}")
        return 0, None

    results = execute(suite, tmp_path, launcher=launcher, probe=probe)
    assert probes == ["s"] and len(launched) == 4
    assert all(r[r.index("--nominal-sample-ms") + 1] == "0.103" for r in launched)
    assert results["suite"]["nominal_sample_ms"] == 0.103
    assert json.loads((tmp_path / "nominal.json").read_text())["nominal_sample_ms"] == 0.103
    # A resumed invocation keeps the folder's nominal (its finished runs were paced by it): no probe, no rerun.
    launched.clear()
    execute(suite, tmp_path, launcher=launcher, probe=probe)
    assert probes == ["s"] and launched == []
    # cpu and floor suites never probe.
    execute(suite.with_changes(slowdown_mode="floor"), tmp_path / "f", launcher=launcher, probe=probe)
    assert probes == ["s"]


def test_the_probe_measures_a_cost_per_sample_in_a_fresh_process():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hermes.deploy.bench.nominal", "--dataset", "digits", "--model",
                           "cnn", "--steps", "5", "--warmup", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    figure = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < figure["nominal_sample_ms"] <= figure["median_sample_ms"] and figure["steps"] == 5
    bad = subprocess.run([sys.executable, "-m", "hermes.deploy.bench.nominal", "--dataset", "digits", "--model",
                          "cnn", "--overrides", "{nope"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not JSON" in bad.stderr


def test_a_failing_probe_is_one_line_and_starts_no_run(tmp_path, monkeypatch, capsys):
    import subprocess

    from hermes.deploy.bench import cli, runner

    suite = build_suite({"name": "s", "variants": [{"label": "alone", "preset": "bsp", "runner": "alone"}],
                         "profiles": ["hl2"], "slowdown_mode": "nominal", "baseline": "alone"})

    def failed(*a, **k):
        return subprocess.CompletedProcess(a, 1, stdout="", stderr="Traceback...\nValueError: no such dataset")

    monkeypatch.setattr(runner.subprocess, "run", failed)
    with pytest.raises(runner.ProbeError, match="exited with 1: ValueError: no such dataset"):
        runner.measure_nominal(suite)
    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="hi\n"))
    with pytest.raises(runner.ProbeError, match="no usable figure"):
        runner.measure_nominal(suite)

    def slow(*a, **k):
        raise subprocess.TimeoutExpired(a, 600)

    monkeypatch.setattr(runner.subprocess, "run", slow)
    with pytest.raises(runner.ProbeError, match="more than 600 s"):
        runner.measure_nominal(suite)
    # Through the command: one line, exit 2, nothing launched.
    launched = []
    monkeypatch.setattr(runner, "launch_testbed", lambda *a, **k: launched.append(a) or (0, None))
    assert cli.main(["hl2-alone", "--out", str(tmp_path / "o"), "--links", "lte", "--repeats", "1",
                     "--variants", "alone"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nominal-cost probe took more than 600 s" in err[0] and launched == []
