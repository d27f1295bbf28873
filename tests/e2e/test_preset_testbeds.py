"""Issue 5's must-show: every other seed system runs as a preset of the same engine and
reaches 0.85 on digits at HL8 with 4 agents, with the policy visible in what it did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_testbed

pytestmark = pytest.mark.integration

HL8_SPEEDS = {"worker-1": 6 / 32, "worker-2": 6 / 32, "worker-3": 4 / 32, "worker-4": 1.0}


def _events(out: Path, kind: str) -> list[dict]:
    return [e for line in (out / "events.jsonl").read_text().splitlines() if (e := json.loads(line))["event"] == kind]


def _final_batches(s: dict) -> dict[str, int]:
    return {w["name"]: w["batch_size"] for w in s["workers"]}


# The default suite keeps one run per policy family (OmniLearn in BSP and ASP, Chao's dynamic batching);
# the other presets' runs are `slow` (about 40 s each), to keep the default suite short.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("preset", [
    "omnilearn-bsp", pytest.param("omnilearn-asp", marks=_SLOW), pytest.param("dynamic-batching", marks=_SLOW),
    pytest.param("variable-batching", marks=_SLOW),
    pytest.param("task-allocation", marks=_SLOW), pytest.param("dp-sgd", marks=_SLOW),
    pytest.param("edp-sgd", marks=_SLOW),
])
def test_preset_reaches_target_at_hl8(preset: str, tmp_path: Path) -> None:
    out = tmp_path / preset
    proc, s = run_testbed(out, "--profile", "hl8", "--preset", preset, "--target-accuracy", "0.85")
    assert s["reached_target"] is True, (s["outcome"], s["best_accuracy"])
    assert s["best_accuracy"] >= 0.85
    assert all(w["exit_code"] == 0 for w in s["workers"])
    # HL of the running cluster (OmniLearn Eq. 3): 32/4 from the profile and the declared cores.
    assert s["heterogeneity"]["profile"] == 8.0 and s["heterogeneity"]["declared"] == 8.0
    assert s["heterogeneity"]["measured"] > 2.0

    batches = _final_batches(s)
    cfg = s["config"]
    if preset == "variable-batching":
        # OmniLearn Eq. 4a: b_k = c_k / sum(c) * K*b with cores (6, 6, 4, 32) and b = 32.
        assert batches == {"worker-1": 16, "worker-2": 16, "worker-3": 11, "worker-4": 85}
    elif preset == "task-allocation":
        acc = {w["name"]: w["accumulation"] for w in s["workers"]}
        assert sum(acc.values()) == 4 * (cfg["cycle_samples"] // cfg["batch_size"])  # Chao Eq. 4: sum(w) constant
        assert set(batches.values()) == {cfg["batch_size"]}  # the micro-batch never changes
        assert acc["worker-4"] > acc["worker-3"]
    else:
        # The run stops at the target after a few epochs, before a controller
        # has necessarily settled (test_batches_follow_dynamic_heterogeneity
        # follows one to equilibrium); here: it acted, within its constraints.
        assert _events(out, "resize"), "the controller never moved a batch at HL8"
        assert all(cfg["batch_bounds"]["b_min"] <= b <= cfg["batch_bounds"]["b_max"] for b in batches.values())
        if cfg["allocation"] == "pcontrol" and cfg["sync"] == "bsp":
            assert sum(batches.values()) == 4 * cfg["batch_size"]  # OmniLearn Eq. 8: global batch K*b kept
    if preset == "edp-sgd":
        # Sec. 4.2: after the first epoch the updates are weighed by compute power, not uniformly.
        weighted = [e["weights"] for e in _events(out, "update_applied") if len(e["weights"]) == 4]
        assert any(max(w) > 2 * min(w) for w in weighted)
    if preset == "omnilearn-asp":
        # OmniLearn Eq. 5b: eta_k = eta * b_k / sum(b); the agents log the lr they were given.
        given = [e for e in _events(out, "assignment")]
        ratios = {round(e["lr"] / e["batch_size"], 9) for e in given}
        assert len({e["lr"] for e in given}) > 1  # batches moved, and the learning rate with them
        # lr / b_k = eta / sum(b): one value while the batch sum stays put; a handful across changes.
        assert len(ratios) < len(given) / 4
    if preset in ("omnilearn-bsp", "dynamic-batching"):
        assert "workload worker-" in proc.stdout  # each adjustment is printed as it happens


def _batches_at(s: dict, t: float) -> dict[str, int]:
    """Each worker's step batch at second ``t`` of the testbed's clock (the agents' schedule clock)."""
    out = {w["name"]: s["config"]["batch_size"] for w in s["workers"]}
    for c in s["workload_changes"]:
        if c["elapsed"] <= t:
            out[c["name"]] = c["batch_size"]
    return out


@pytest.mark.slow  # a 70 s schedule; run with -m slow
def test_batches_follow_dynamic_heterogeneity(tmp_path: Path) -> None:
    # OmniLearn Fig. 11: HL1 -> HL4 -> HL8 -> HL1 mid-run; the controller follows every step.
    # --pace 2: four full-speed agents on this machine's 2 cores would contend for the CPU
    # at HL1, and the controller would chase that noise instead of the schedule.
    # A global batch of 4 x 128 (bounds [4, 512]) leaves the controller room at HL4 and at HL8:
    # with 4 x 32 (bounds [4, 96]) both levels pin the batches to the same bounds. The
    # synthetic set is big enough for the fast worker's cycles (digits is one of them).
    out = tmp_path / "dynamic"
    proc, s = run_testbed(out, "--profile", "hl1", "--preset", "omnilearn-bsp", "--pace", "2",
                          "--dataset", "synthetic", "--set", "num_samples=40000", "--set", "batch_size=128",
                          "--set", "cycle_samples=512", "--set", "b_max=512",
                          "--speed-schedule", "0:hl1,12:hl4,30:hl8,48:hl1", "--max-seconds", "70")
    assert "workload worker-" in proc.stdout  # every adjustment printed as it happens
    assert s["workload_changes"] and all({"elapsed", "name", "batch_size"} <= c.keys() for c in s["workload_changes"])
    hl4, hl8 = _batches_at(s, 29), _batches_at(s, 47)
    # worker-4 is the fastest at HL4 and HL8 (speeds 1 : 0.25 at HL4, 1 : 0.125 at HL8).
    assert hl4["worker-4"] > 1.5 * hl4["worker-3"], hl4
    assert hl8["worker-4"] > 2 * hl8["worker-3"], hl8
    # HL8 is more skewed than HL4: the slowest worker's share shrinks further.
    assert hl8["worker-3"] / hl8["worker-4"] < hl4["worker-3"] / hl4["worker-4"], (hl4, hl8)
    for batches in (hl4, hl8):
        assert sum(batches.values()) == 4 * s["config"]["batch_size"]  # OmniLearn Eq. 8 throughout
    back = _batches_at(s, 10**9)
    # Equal speeds again: the slow worker's batch grows back and the fast one's shrinks.
    assert back["worker-3"] > 1.5 * hl8["worker-3"] and back["worker-4"] < 0.75 * hl8["worker-4"], (hl8, back)
