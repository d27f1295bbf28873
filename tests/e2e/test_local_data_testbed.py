"""Device-local, non-IID data at HL8 with the Hermes preset, as a user runs it (``hermes-testbed --task``).

Each agent trains on ``local_digits_task.local_data(worker_name)`` (4 of the
10 digit classes, different ones per agent); the server holds only the test
split. No shard record crosses the network (the server's ``shard_bytes`` and
every agent's fetched shard bytes are 0, and nobody sent FETCH_SHARD), and
the dual search still sizes each agent's local cycles until the cycle times
are equal: slowest/median of the agents' median cycle time <= 1.25 over the
second half of the run (measured 1.025-1.226 on 2026-11-24 on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import run_testbed

TASK = str(Path(__file__).with_name("local_digits_task.py")) + ":task"


@pytest.mark.slow  # a 60 s HL8 run; tests/integration/test_local_data_live.py covers local data by default
def test_local_data_hl8_sends_no_shard_bytes_and_equalises_cycle_times(tmp_path: Path) -> None:
    out = tmp_path / "run-local"
    _, s = run_testbed(out, "--profile", "hl8", "--preset", "hermes", "--task", TASK, "--max-seconds", "60",
                       "--quiet")
    assert s["data_location"] == "local"
    assert s["shard_bytes"] == 0 and s["shard_bytes_fetched_total"] == 0
    assert "fetch_shard" not in s["messages_by_type"], s["messages_by_type"]
    assert len(s["workers"]) == 4
    for w in s["workers"]:
        assert w["exit_code"] == 0 and w["cycles"] > 5, w
        assert w["shard_bytes_fetched"] == 0 and w["data_source"] in ("none", None), w
    # The model learnt from data the server never saw (4 classes per agent, 10 in the test set).
    assert s["best_accuracy"] >= 0.5

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assignments = [e for e in events if e["event"] == "assignment"]
    assert assignments and all(e["shards"] == [] and e["local_samples"] == e["dss"] for e in assignments)
    # The dual search resized the local cycles (the fastest agent's grows past the base DSS).
    base = s["config"]["cycle_samples"]
    fastest = max(s["workers"], key=lambda w: w["speed"])
    assert any(e["event"] == "resize" and e["worker"] == fastest["id"] and e["dss"] > base for e in events)

    cycles = [e for e in events if e["event"] == "cycle"]
    half = max(e["elapsed"] for e in cycles) / 2
    per: dict[str, list[float]] = {}
    for e in cycles:
        if e["elapsed"] >= half:
            per.setdefault(e["worker"], []).append(e["compute_seconds"])
    medians = {w: statistics.median(v) for w, v in per.items()}
    assert len(medians) == 4, medians
    ratio = max(medians.values()) / statistics.median(medians.values())
    print(f"\nlocal data, HL8, hermes: slowest/median cycle {ratio:.3f} ({medians})")
    assert ratio <= 1.25, medians
