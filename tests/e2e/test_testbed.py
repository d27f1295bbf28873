"""The foundation's must-show: a 4-agent HL4 testbed reaches 0.9 on digits with ASP and BSP,
and its summary is complete and agrees with the run's event log."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tests.conftest import run_testbed

pytestmark = pytest.mark.integration

WORKER_KEYS = {"id", "speed", "samples", "compute_seconds", "wait_seconds", "utilization",
               "pushes", "pulls", "bytes_sent", "bytes_received"}
TOP_KEYS = {"preset", "profile", "clients", "wall_seconds", "final_accuracy", "final_loss", "reached_target",
            "seconds_to_target", "model_updates", "workers"}


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def _port_free(port: int) -> bool:
    # SO_REUSEADDR as a restarting server would set it: TIME_WAIT remnants of
    # closed connections do not count, a listener that is still there does.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# asp opt-in (-m slow): the default suite stays under 15 min (2026-11-26: 21 s of it); the asynchronous
# presets reach targets in test_hermes_testbed (hermes, hermes-paper) and the chaos runs.
@pytest.mark.parametrize("preset", [pytest.param("asp", marks=pytest.mark.slow), "bsp"])
def test_testbed_reaches_target(preset: str, tmp_path: Path) -> None:
    out = tmp_path / f"run-{preset}"
    proc, s = run_testbed(out, "--profile", "hl4", "--preset", preset, "--target-accuracy", "0.9")
    assert "version=" in proc.stdout and "final accuracy" in proc.stdout  # live progress + summary printed

    assert TOP_KEYS <= s.keys()
    assert s["preset"] == preset and s["profile"] == "hl4" and s["clients"] == 4
    assert s["reached_target"] is True
    # The server itself stopped the run at the evaluation that reached the
    # target (the testbed handed it --target-accuracy), and kept that model,
    # or a better one evaluated later, as model-best.safetensors.
    reached = s["target_reached_at"]
    assert s["server_outcome"] == "target_reached" and reached["accuracy"] >= 0.9
    assert s["best_accuracy"] >= reached["accuracy"] and s["best_version"] >= reached["version"]
    assert s["best_model_file"] == "model-best.safetensors" and (out / s["best_model_file"]).is_file()
    # The shutdown evaluation is the current model's. Updates already in
    # flight when the target was evaluated (folded while the evaluation ran)
    # still count. Under BSP those move it little. Under ASP, stale pushes
    # from the slow workers swing digits accuracy by tens of points from one
    # evaluation to the next (timelines seen: 0.80 -> 0.69 -> 0.975; a clean
    # CI run ended at 0.70 after reaching 0.91 when the testbed still
    # stopped the run), so there it must only stay far above chance: the
    # model a user keeps is the best one above.
    assert s["final_accuracy"] >= (0.85 if preset == "bsp" else 0.5)
    # Within its budget is told by the outcome (not "time limit"), not a wall bound (issue 32).
    assert 0 < s["seconds_to_target"] <= s["wall_seconds"] and s["outcome"] == "target reached", s["outcome"]
    assert len(s["workers"]) == 4
    speeds = sorted(w["speed"] for w in s["workers"])
    assert speeds == pytest.approx(sorted([9 / 24, 9 / 24, 6 / 24, 1.0]))
    for w in s["workers"]:
        assert WORKER_KEYS <= w.keys()
        assert w["samples"] > 0 and w["pushes"] > 0 and w["pulls"] >= w["pushes"]
        assert 0 < w["utilization"] <= 1
        assert w["compute_seconds"] > 0 and w["wait_seconds"] >= 0
        assert w["bytes_sent"] > 0 and w["bytes_received"] > 0
        assert w["exit_code"] == 0

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    applied = [e for e in events if e["event"] == "update_applied"]
    # Every model update is one logged step; the summary's count is that count.
    assert len(applied) == s["model_updates"]
    folded = sum(len(e["workers"]) for e in applied)
    assert folded == sum(w["applied"] for w in s["workers"])
    if preset == "bsp":
        # One update per worker per barrier, never more.
        assert all(len(e["workers"]) == len(set(e["workers"])) for e in applied)
        assert all(len(e["workers"]) == 4 for e in applied[:-1])
    start = next(e for e in events if e["event"] == "testbed_start")

    # Clean shutdown: no process of this run left, ports freed.
    assert _processes_mentioning(str(out)) == []
    assert _port_free(start["control_port"]) and _port_free(start["data_port"])


@pytest.mark.slow  # the default suite keeps one run per family under 15 min (2026-11-26); tests/unit/test_sync_ssp_ebsp.py covers the rules
@pytest.mark.parametrize("preset", ["ssp", "ebsp"])
def test_bounded_staleness_and_elastic_barrier_presets_train(preset: str, tmp_path: Path) -> None:
    _, s = run_testbed(tmp_path / f"run-{preset}", "--profile", "hl8", "--preset", preset,
                       "--target-accuracy", "0.85", "--quiet")
    assert s["reached_target"] is True and s["best_accuracy"] >= 0.85
    pushes = {w["speed"]: w["pushes"] for w in s["workers"]}
    if preset == "ssp":
        # Nobody runs more than ssp_staleness (3) pushes ahead of the slowest, plus the push in flight at stop.
        assert max(pushes.values()) - min(pushes.values()) <= 3 + 1
    else:
        # Elastic barrier: the fast worker pushes several times per barrier instead of waiting.
        assert pushes[1.0] > 2 * min(pushes.values())
    assert all(w["exit_code"] == 0 for w in s["workers"])
