"""What an operator sees on the server's console, and what the run leaves behind.

A real ``hermes-server`` (bsp, no ``--out``) and two real ``hermes-client``
agents, one slowed down so the barrier waits for it. The console shows
progress lines (version, accuracy, loss, workers, samples/s, whom the
barrier waits for) and no heartbeat or status-poll access lines; HERMES_PORT
is honoured and ``--host 127.0.0.1`` keeps the data plane on loopback; the run's
outputs go to a fresh ``runs/<UTC time>-bsp``, whose model files load with
safetensors' reader into the module in two lines.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from hermes.common.config import RunConfig
from hermes.common.task_registry import resolve_task
from hermes.common.tensors import ModelSpec, flatten
from hermes.deploy.procs import free_port, start, terminate_group, wait_healthy
from tests.conftest import _server_env, parse_metric, wait_for

pytestmark = pytest.mark.integration

PROGRESS = re.compile(r"progress v(\d+) accuracy ([0-9.]+) loss ([0-9.]+).* \| 2/2 workers active \| (\d+) samples/s")


def _agent(url: str, name: str, log: Path, *extra: str):
    env = _server_env({"HERMES_ADMIN_TOKEN": None})
    return start([sys.executable, "-m", "hermes.client.cli", "--server", url, "--name", name, "--no-progress",
                  "--threads", "1", *extra], log_path=log, env=env)


def test_console_progress_barrier_quiet_access_and_default_out(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    # The port from its environment twin, HERMES_PORT (the server used to ignore it).
    server = start([sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1",
                    "--preset", "bsp", "--progress-interval", "0.3", "--heartbeat-interval", "0.5",
                    "--set", "eval_interval_seconds=0.5",
                    # Every heartbeat sent: combined messages leave them out while the data plane speaks,
                    # and this test needs heartbeats to show they stay off the console.
                    "--set", "combine_messages=false"], log_path=log, env=_server_env({"HERMES_PORT": str(port)}),
                   cwd=tmp_path)
    agents = []
    try:
        wait_healthy(server, url, timeout=90, log_path=log)
        agents = [_agent(url, "alpha", tmp_path / "alpha.log"),
                  _agent(url, "bravo", tmp_path / "bravo.log", "--slowdown", "6")]

        def progressed():
            hits = [m for m in PROGRESS.finditer(log.read_text(errors="replace"))]
            return any(int(m[1]) >= 2 and int(m[4]) > 0 for m in hits)

        wait_for(progressed, 120, "progress lines with an evaluated model version >= 2 and samples/s > 0")
        # The slow agent holds the barrier: the line names it, and how many of the two arrived.
        wait_for(lambda: re.search(r"barrier v\d+ waiting for bravo \(1/2\)", log.read_text(errors="replace")),
                 60, "a barrier line waiting for the slow agent")
        # Heartbeats went on all along, and dashboards poll: none of it on the console.
        for _ in range(3):
            assert httpx.get(url + "/v1/status", timeout=10).status_code == 200
        wait_for(lambda: parse_metric(httpx.get(url + "/metrics", timeout=10).text, "hermes_heartbeats_total") >= 4,
                 30, "heartbeats from the agents")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        finally:
            for a in agents:
                terminate_group(a, grace=5)
            terminate_group(server, grace=1)
    text = log.read_text(errors="replace")
    assert code in (0, -signal.SIGTERM), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert '"POST /v1/workers/register HTTP/1.1" 200' in text  # joins are still logged
    assert "/heartbeat" not in text and "GET /v1/status" not in text and "GET /v1/workers" not in text
    # --host 127.0.0.1 keeps the data plane on loopback too.
    assert re.search(r"data plane listening on tcp://127\.0\.0\.1:\d+", text), text[:3000]

    # No --out: a fresh runs/<UTC time>-bsp, said on the console, holding the run's outputs.
    (out,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"\d{8}T\d{6}Z-bsp", out.name)
    assert f"no --out given: this run's outputs go to runs/{out.name}" in text
    summary = json.loads((out / "server_summary.json").read_text())
    assert (summary["final_model_file"], summary["best_model_file"]) == ("model-final.safetensors",
                                                                          "model-best.safetensors")
    for name, version in (("model-final.safetensors", summary["model_version"]),
                          ("model-best.safetensors", summary["best_version"])):
        with safe_open(str(out / name), "pt") as f:
            meta = f.metadata()
        assert ModelSpec.from_dict(json.loads(meta["spec"])).numel == summary["model"]["numel"]
        config = RunConfig(**summary["config"])
        model = resolve_task(config.task, config).model()
        model.load_state_dict(load_file(out / name))
        assert int(meta["version"]) == version and torch.isfinite(flatten(model)).all()
