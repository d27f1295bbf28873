"""The Hermes presets' must-show on the testbed: a 4-agent HL8 cluster reaches 0.9 on digits,
the gate's and the sizer's figures are coherent, and the fastest worker is given more data
(the paper's configuration); the default preset overlaps its pushes and reaches the target."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_testbed

pytestmark = pytest.mark.integration


def test_hermes_paper_hl8_reaches_target(tmp_path: Path) -> None:
    out = tmp_path / "run-hermes-paper"
    _, s = run_testbed(out, "--profile", "hl8", "--preset", "hermes-paper", "--target-accuracy", "0.9")
    assert s["preset"] == "hermes-paper" and s["profile"] == "hl8" and s["clients"] == 4
    assert s["reached_target"] is True
    # Reached = an evaluation during the run hit the target; the shutdown
    # evaluation may sit a little lower after in-flight updates.
    assert s["best_accuracy"] >= 0.9 and s["final_accuracy"] >= 0.85
    assert s["messages_total"] > 0
    assert len(s["workers"]) == 4

    for w in s["workers"]:
        assert w["exit_code"] == 0, w
        assert w["cycles"] > 0, w
        # A push follows a cycle whose gate said push; a skipped cycle pushes nothing.
        assert w["cycles"] >= w["pushes"], w
        # Every cycle is one gate decision (the gate is on for every cycle of the paper's Hermes).
        assert w["gate_pushes"] + w["gate_skips"] == w["cycles"], w
        if w["pulls"] > 1:
            # WI (Hermes Eq. 7) = cycles / pulls after the initial one: each such pull follows a push,
            # and each push follows at least one cycle.
            assert w["wi"] is not None and w["wi"] >= 1.0, w

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    applied = [e for e in events if e["event"] == "update_applied"]
    assert len(applied) == s["model_updates"]

    # The dual search gave the fastest worker (speed 1.0) a larger dataset share than the base DSS.
    base_dss = s["config"]["cycle_samples"]
    fastest = max(s["workers"], key=lambda w: w["speed"])
    assert fastest["speed"] == pytest.approx(1.0)
    grown = [e for e in events if e["event"] == "resize" and e["worker"] == fastest["id"] and e["dss"] > base_dss]
    assert grown, (
        f"no resize of the fastest worker {fastest['id']} above DSS {base_dss}; resizes: "
        f"{[e for e in events if e['event'] == 'resize']}"
    )


def test_hermes_hl8_overlaps_its_pushes_and_reaches_target(tmp_path: Path) -> None:
    out = tmp_path / "run-hermes"
    _, s = run_testbed(out, "--profile", "hl8", "--preset", "hermes", "--target-accuracy", "0.9")
    assert s["reached_target"] is True and s["best_accuracy"] >= 0.9
    config = s["config"]
    assert config["overlap_push"] is True and config["momentum"] == 0.9 and config["loss"]["reference"] == "pull"
    for w in s["workers"]:
        assert w["exit_code"] == 0, w
        # Every cycle was judged by the gate or ended with the worker's push still in flight.
        assert w["gate_pushes"] + w["gate_skips"] + w["in_flight_cycles"] == w["cycles"], w
        # One push per cycle the gate passed (the last may be refused at the stop, or not sent).
        assert w["pushes"] >= 1 and abs(w["pushes"] - w["gate_pushes"]) <= 1, w
        log = (out / w["log"]).read_text(errors="replace")
        m = re.search(r"overlapped exchanges: ([0-9.]+)s in flight", log)
        assert m is not None and float(m.group(1)) > 0 and "Traceback" not in log, log[-2000:]
