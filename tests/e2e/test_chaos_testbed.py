"""Chaos on the testbed: real server, real agents, faults injected mid-run.

Kill one of four agents (BSP and Hermes): the server marks it lost after the
heartbeat timeout, BSP barriers stop waiting for it, its shards go back to
the queue, and the run still reaches its target. Kill the server: the
testbed restarts it with ``--resume``, the model version continues from the
checkpoint plus the journal, the agents register again and the run reaches
its target. Faults fire at a model version, not a time, so a loaded
machine cannot fire them before training started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_testbed

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT = 2.0
# Server and testbed clocks start a moment apart (the server's at its start, the testbed's at the
# agents' launch) and see a restart's ends a moment apart (SIGKILL vs the last fold, healthy vs resumed).
TIME_SKEW_S = 2.0
FAST_HEARTBEATS = ("--heartbeat-interval", "0.3", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT))


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _check_agent_killed(out: Path, s: dict, agent: str, *, barrier: bool) -> None:
    assert s["reached_target"] is True, s["outcome"]
    (chaos,) = s["chaos"]
    assert chaos["action"] == "kill-agent" and chaos["agent"] == agent
    killed = next(w for w in s["workers"] if w["name"] == agent)
    assert killed["exit_code"] == -9
    assert all(w["exit_code"] == 0 for w in s["workers"] if w["name"] != agent)
    assert s["model_updates"] > chaos["version_before"], "no progress after the kill"
    events = _events(out)
    lost = [i for i, e in enumerate(events) if e.get("event") == "leave" and e.get("worker") == killed["id"]]
    if barrier or s["wall_seconds"] - chaos["at"] > HEARTBEAT_TIMEOUT + 2:
        # The server noticed (a barrier cannot finish without noticing) ...
        assert lost and events[lost[0]]["state"] == "lost", [events[i] for i in lost]
    if barrier:
        # ... and the barrier went on without the dead worker.
        assert any(e.get("event") == "update_applied" for e in events[lost[0]:]), "no progress after the loss"


# Killed early and with a target far enough away that the run outlasts the
# heartbeat timeout: what is tested is training on after the loss.
# Hermes on digits applies an update every ~30 ms and is at 0.92 by version 14 (a CI run
# reached 0.93 at version 17, the version the kill fired at, a poll late): killing the fast
# worker leaves the three slow ones more of the way to train.
@pytest.mark.parametrize("preset,profile,agent,version,target", [
    pytest.param("bsp", "hl4", "worker-2", 2, "0.9", marks=pytest.mark.slow),  # one per default suite
    ("hermes", "hl8", "worker-4", 1, "0.93"),
])
def test_run_survives_a_killed_agent(preset, profile, agent, version, target, tmp_path):
    out = tmp_path / f"kill-{preset}"
    _, s = run_testbed(out, "--preset", preset, "--profile", profile, "--target-accuracy", target, "--quiet",
                       "--chaos", f"kill-agent:{agent.rsplit('-', 1)[1]}@v{version}", *FAST_HEARTBEATS)
    _check_agent_killed(out, s, agent, barrier=preset == "bsp")


def _check_server_resumed(out: Path, s: dict) -> dict:
    assert s["reached_target"] is True, s["outcome"]
    (chaos,) = s["chaos"]
    assert chaos["action"] == "kill-server"
    resumed = chaos["resumed_from"]
    # Every update acknowledged before the SIGKILL is back (the testbed polled its version
    # before killing, so the server can only have been further along).
    assert chaos["version_before"] > 0 and resumed["version"] >= chaos["version_before"]
    # version_after is read from the resumed server's first status: an agent that had
    # registered again may have pushed already (a CI run saw resumed 34, status 35).
    assert chaos["version_after"] >= resumed["version"]
    assert resumed["version"] == resumed["checkpoint_version"] + resumed["replayed_updates"]
    # ... and training went on from there, not from scratch.
    assert s["model_updates"] > chaos["version_after"]
    versions = [e["version"] for e in s["accuracy_timeline"]]
    assert versions == sorted(versions), "model versions went backwards across the restart"
    assert all(w["exit_code"] == 0 for w in s["workers"])
    for w in s["workers"]:
        log = (out / w["log"]).read_text()
        assert "registering again" in log and "registered again" in log, w["name"]
    return chaos


# Killed early, with the target further off: at 0.9 and version 15 the kill came when hermes was already at the
# target (a run under load evaluated 0.92 at version 15), so the resumed server stopped with no update after it.
def test_run_survives_a_server_restart(tmp_path):
    out = tmp_path / "kill-server"
    _, s = run_testbed(out, "--preset", "hermes", "--profile", "hl8", "--target-accuracy", "0.93", "--quiet",
                       "--chaos", "kill-server@v3", "--checkpoint-interval", "2", *FAST_HEARTBEATS)
    chaos = _check_server_resumed(out, s)
    # Time to target, with and without the restart: the server's training seconds exclude
    # its downtime, the testbed's seconds_to_target (from the agents' launch) include it.
    reached = s["target_reached_at"]
    print(json.dumps({k: s[k] for k in ("seconds_to_target", "downtime_seconds",
                                        "seconds_to_target_excluding_downtime")} | {"server": reached}))
    assert s["downtime_seconds"] == chaos["restart_seconds"] > 0
    assert reached["downtime_seconds"] == pytest.approx(s["downtime_seconds"], abs=TIME_SKEW_S)
    assert reached["seconds"] == pytest.approx(s["seconds_to_target_excluding_downtime"], abs=TIME_SKEW_S)
    assert reached["wall_seconds"] == pytest.approx(s["seconds_to_target"], abs=TIME_SKEW_S)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["bsp", "hermes"])
def test_long_chaos_run(preset, tmp_path):
    """Eight agents, two killed and one of them restarted, and the server killed twice."""
    out = tmp_path / f"long-{preset}"
    _, s = run_testbed(out, "--clients", "8", "--preset", preset, "--profile", "hl8", "--target-accuracy", "0.95",
                       "--max-seconds", "300", "--quiet", "--checkpoint-interval", "5", *FAST_HEARTBEATS,
                       "--chaos", "kill-agent:2@v10", "--chaos", "kill-server@v30", "--chaos", "kill-agent:5@v50",
                       "--chaos", "restart-agent:2@v60", "--chaos", "kill-server@v80", timeout=480)
    assert s["reached_target"] is True, s["outcome"]
    assert [c["action"] for c in s["chaos"]] == ["kill-agent", "kill-server", "kill-agent", "restart-agent",
                                                 "kill-server"]
    for c in s["chaos"]:
        if c["action"] == "kill-server":
            assert c["version_after"] >= c["version_before"] > 0
