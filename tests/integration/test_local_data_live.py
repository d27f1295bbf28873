"""Device-local data at the boundaries: start-up refusals and registration checks on a real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hermes.common.wire import MsgType
from tests.conftest import JOIN_TOKEN

LOCAL_TASK = str(Path(__file__).parents[1] / "e2e" / "local_digits_task.py") + ":task"


def test_a_preset_that_partitions_server_data_is_refused_at_start_up(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--task", LOCAL_TASK, "--preset", "edp-sgd",
                           "--insecure", "--port", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hermes-server:")]
    assert len(errors) == 1 and "cannot train on device-local data" in errors[0] and "partition" in errors[0]
    assert "Traceback" not in proc.stderr


def test_a_shard_fed_run_refuses_an_agent_declaring_local_samples(live_server):
    r = live_server.http.post(live_server.url + "/v1/workers/register",
                              json={"name": "local-one", "local_samples": 100},
                              headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
    assert r.status_code == 409 and "serves shards" in r.json()["detail"]
    assert "local-one" not in {w["name"] for w in live_server.workers().values()}


def test_a_shard_fed_run_reports_the_shard_bytes_it_serves(live_server):
    w = live_server.register()

    before = live_server.get_json("/v1/status")["shard_bytes"]
    reply = w.request(MsgType.FETCH_SHARD, body={"shards": [0, 1]})
    status = live_server.get_json("/v1/status")
    assert status["data_location"] == "server"
    assert status["shard_bytes"] - before == sum(reply.header.body["lengths"])
