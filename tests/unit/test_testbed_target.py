"""How the testbed learns that the run reached its target: from the server, or by itself from an older one."""

from __future__ import annotations

import json

from hermes.deploy import testbed
from hermes.deploy.testbed_cli import build_parser


def _bed(tmp_path, *args: str) -> testbed.Testbed:
    bed = testbed.Testbed(build_parser().parse_args(["--out", str(tmp_path), *args]))
    bed.out.mkdir(parents=True, exist_ok=True)
    return bed


def test_the_server_outcome_decides_and_its_evaluation_time_is_used(tmp_path):
    bed = _bed(tmp_path, "--target-accuracy", "0.9")
    # The status already shows an evaluation above the target, but the server has not
    # stopped yet: the testbed waits for the server instead of stopping the run itself.
    running = {"outcome": "running", "target_accuracy": 0.9, "target_reached_at": None,
               "evaluation": {"accuracy": 0.95, "at": 105.0}}
    assert bed._target_reached(running, t0=100.0) is None
    reached = {"outcome": "target_reached", "target_accuracy": 0.9, "evaluation": {"accuracy": 0.95, "at": 105.0},
               "target_reached_at": {"version": 7, "accuracy": 0.95, "seconds": 9.0, "at": 104.5}}
    assert bed._target_reached(reached, t0=100.0) == 104.5
    # An operator's stop is not a reached target.
    assert bed._target_reached({"outcome": "stopped", "target_accuracy": 0.9, "target_reached_at": None},
                               t0=100.0) is None
    assert not (tmp_path / "events.jsonl").exists()  # the server logs target_reached itself


def test_an_older_server_falls_back_to_the_testbeds_own_detection(tmp_path):
    bed = _bed(tmp_path, "--target-accuracy", "0.9")
    # A server without the target (an older one, or one the testbed stops itself because
    # faults are still to come) has no target_accuracy in its status.
    assert bed._target_reached({"evaluation": {"accuracy": 0.85, "at": 103.0, "version": 4}}, t0=100.0) is None
    assert bed._target_reached({"evaluation": {"accuracy": 0.92, "at": 104.0, "version": 6}}, t0=100.0) == 104.0
    (event,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert (event["event"], event["source"], event["version"], event["seconds"]) == ("target_reached", "testbed", 6, 4.0)


def test_no_target_no_detection(tmp_path):
    bed = _bed(tmp_path)
    assert bed._target_reached({"outcome": "target_reached", "target_reached_at": {"at": 1.0}}, t0=0.0) is None


def test_with_faults_to_inject_the_testbed_keeps_the_target_to_itself(tmp_path):
    bed = _bed(tmp_path, "--target-accuracy", "0.9", "--chaos", "kill-agent:2@v3")
    status = {"outcome": "running", "target_accuracy": None, "target_reached_at": None,
              "evaluation": {"accuracy": 0.93, "at": 104.0, "version": 9}}
    # Faults first: the target does not count while one is still to fire.
    assert bed._target_reached(status, t0=100.0) is None
    bed.chaos.clear()  # what run_chaos does as they fire
    assert bed._target_reached(status, t0=100.0) == 104.0
