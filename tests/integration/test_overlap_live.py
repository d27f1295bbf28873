"""overlap_push on a live server with real agents: each push's reply (the model, in the pull_dtype)
is taken after the next cycle, the run still reaches its target, and every push answered its pull."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import kill_agents, running_server, start_agent, wait_for

pytestmark = pytest.mark.integration

TARGET = 0.8


def test_overlapped_agents_reach_the_target_with_half_precision_models(tmp_path: Path) -> None:
    with running_server(tmp_path / "srv", "--preset", "asp", "--target-accuracy", str(TARGET),
                        sets=("eval_interval_seconds=0.3", "overlap_push=true", "pull_dtype=float16")) as srv:
        agents = [start_agent(srv.url, f"agent-{i}", tmp_path / f"agent-{i}.log", "--slowdown", str(s))
                  for i, s in enumerate((1, 3))]
        try:
            wait_for(lambda: srv.get_json("/v1/status")["outcome"] == "target_reached", 120,
                     "the overlapped run to reach its target")
            codes = [a.wait(timeout=60) for a in agents]
        finally:
            kill_agents(agents)
        logs = [(tmp_path / f"agent-{i}.log").read_text(errors="replace") for i in range(2)]
        assert codes == [0, 0], [log[-2000:] for log in logs]
        assert not any("Traceback" in log for log in logs)
        summary = srv.get_json("/v1/summary")
    assert summary["config"]["overlap_push"] is True and summary["config"]["pull_dtype"] == "float16"
    sent, carried = summary["messages_by_type"], summary["carried_by_type"]
    # One PULL_MODEL per agent (its first model); every push's reply brought the next one.
    assert sent["pull_model"] == 2 and sent["push_update"] == carried["pull_model"] > 4
    numel = summary["model"]["numel"]
    workers = [w for w in summary["workers"] if w["name"].startswith("agent-")]
    assert len(workers) == 2
    for w in workers:
        assert w["pushes"] >= 1
        # The models came as fp16: what the worker received beyond its shards is under 2.2 bytes a
        # parameter per model (4 in fp32; the rest is headers and replies without a model).
        models = w["bytes_received"] - w["shard_bytes_fetched"]
        assert models < 2.2 * numel * (w["pulls"] + 1), (models, numel, w["pulls"])
    for log in logs:
        m = re.search(r"overlapped exchanges: ([0-9.]+)s in flight, ([0-9.]+)s waited for", log)
        assert m is not None, log[-2000:]
        assert float(m.group(1)) > 0
