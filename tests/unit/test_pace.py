"""The slowdown emulation's two rules (common/pace.py) and how a run chooses one: agent, testbed, DDP peer, bench."""

from __future__ import annotations

import argparse
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
