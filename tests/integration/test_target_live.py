"""A server given a target accuracy stops the run itself and keeps the model that reached it.

Real ``hermes-server`` (uvicorn + ZeroMQ) and real ``hermes-client`` agents on
loopback, no testbed: the server alone notices the target, tells the agents
to stop, refuses later pushes, and writes ``model-best.safetensors``, which
scores on the evaluator's held-out set what the summary says it scored.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from hermes.common.config import RunConfig
from hermes.common.task_registry import resolve_task
from hermes.common.tensors import ModelSpec, flatten
from hermes.server.evaluator import Evaluator
from hermes.server.shardstore import load_splits
from hermes.server.state import ModelState
from hermes.server.tensorfile import read_tensor_metadata
from tests.conftest import JOIN_TOKEN, _server_env, free_ports, kill_agents, running_server, start_agent, wait_for

pytestmark = pytest.mark.integration

TARGET = 0.3



def test_server_stops_at_target_and_keeps_the_best_model(tmp_path: Path) -> None:
    out = tmp_path / "server"
    # No heartbeat timeout: the idle worker below must still be a worker when it pushes after the stop.
    with running_server(out, "--target-accuracy", str(TARGET), "--heartbeat-timeout", "0",
                        sets=("eval_interval_seconds=0.3",)) as srv:
        status = srv.get_json("/v1/status")
        assert (status["outcome"], status["target_accuracy"], status["target_reached_at"]) == ("running", TARGET, None)
        idle = srv.register("idle")
        agents = [start_agent(srv.url, f"agent-{i}", tmp_path / f"agent-{i}.log") for i in range(2)]
        try:
            status = wait_for(lambda: (s := srv.get_json("/v1/status"))["outcome"] == "target_reached" and s,
                               90, "the server to reach its target")
            codes = [a.wait(timeout=30) for a in agents]
        finally:
            kill_agents(agents)
        logs = [(tmp_path / f"agent-{i}.log").read_text(errors="replace") for i in range(2)]
        assert codes == [0, 0], [log[-2000:] for log in logs]
        assert not any("Traceback" in log for log in logs)

        reached = status["target_reached_at"]
        assert reached["accuracy"] >= TARGET and reached["version"] >= 1 and reached["seconds"] > 0
        status = srv.get_json("/v1/status")
        assert status["stopping"] and status["stop_reason"].startswith(f"target accuracy {TARGET} reached")
        assert status["outcome"] == "target_reached" and status["target_reached_at"] == reached
        # The same stop as POST /v1/stop: later pushes are refused and change nothing, nobody new joins.
        version = status["model_version"]
        reply = idle.push(torch.zeros(idle.numel), base_version=version)
        assert reply.header.body["status"] == "rejected" and reply.header.body["reason"] == "run is stopping"
        assert reply.header.body["stop"] is True
        assert srv.healthz()["model_version"] == version
        r = srv.http.post(srv.url + "/v1/workers/register", json={"name": "late"},
                          headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 410 and "the run is over" in r.json()["detail"]
        # An agent that comes late (or reconnects after the stop) is told so and exits 0, not 3.
        late = start_agent(srv.url, "late", tmp_path / "late.log")
        assert late.wait(timeout=120) == 0, (tmp_path / "late.log").read_text(errors="replace")[-2000:]
        late_log = (tmp_path / "late.log").read_text(errors="replace")
        assert "the server's run is over" in late_log
        # No retries with backoff against a finished run: every retry logs "retry N/M" (issue 32: this
        # was a 30 s wall bound).
        assert not re.search(r"retry \d+/\d+", late_log), late_log[-2000:]
        live = srv.get_json("/v1/summary")
        assert live["best_accuracy"] >= reached["accuracy"] and live["outcome"] == "target_reached"
    # running_server sent SIGTERM and checked the clean exit and server_summary.json.

    summary = json.loads((out / "server_summary.json").read_text())
    assert summary["outcome"] == "target_reached" and summary["target_reached_at"] == reached
    assert summary["target_accuracy"] == TARGET and summary["model_version"] == version
    # The shutdown evaluation is the current model's, reported as it is, next to the best one.
    assert summary["evaluations"][-1]["version"] == version
    assert summary["final_accuracy"] == summary["evaluations"][-1]["accuracy"]
    best = max(summary["evaluations"], key=lambda e: e["accuracy"])
    assert summary["best_accuracy"] == best["accuracy"] >= reached["accuracy"]
    assert summary["best_version"] == min(e["version"] for e in summary["evaluations"]
                                          if e["accuracy"] == best["accuracy"])

    assert summary["best_model_file"] == "model-best.safetensors"
    path = out / "model-best.safetensors"
    meta = read_tensor_metadata(path)
    assert int(meta["version"]) == summary["best_version"]
    assert float(meta["accuracy"]) == summary["best_accuracy"]
    # A standard state_dict: the module's own keys, loaded with safetensors' reader in two lines.
    spec = ModelSpec.from_dict(json.loads(meta["spec"]))
    config = RunConfig(**summary["config"])
    task = resolve_task(config.task, config)
    model = task.model()
    model.load_state_dict(load_file(path))
    flat = flatten(model)
    assert flat.dtype == torch.float32 and flat.numel() == spec.numel == summary["model"]["numel"]
    assert summary["final_model_file"] == "model-final.safetensors"
    task.model().load_state_dict(load_file(out / "model-final.safetensors"))
    # Scored again on the evaluator's own held-out subset, by the evaluator's code.
    _, _, test = load_splits(config, task)
    again = Evaluator(task, spec, ModelState(spec, flat), test, max_samples=config.eval_max_samples, interval=1.0,
                      seed=config.seed).evaluate_now()
    assert again.accuracy == pytest.approx(summary["best_accuracy"], abs=0.01)

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    (hit,) = [e for e in events if e["event"] == "target_reached"]
    assert (hit["version"], hit["accuracy"], hit["target_accuracy"]) == (reached["version"], reached["accuracy"], TARGET)
    stop = next(e for e in events if e["event"] == "stop_requested")
    assert names.index("target_reached") < names.index("stop_requested")
    assert stop["reason"] == status["stop_reason"]
    end = next(e for e in events if e["event"] == "run_end")
    assert (end["best_version"], end["best_accuracy"]) == (summary["best_version"], summary["best_accuracy"])
    assert "target accuracy 0.3 reached" in srv.log_text()


def _start_finished(ckpt: Path, out: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """A resumed server whose run is over: running_server's probe registration would be refused."""
    port, data_port = free_ports(2)
    out.mkdir(parents=True)
    log = open(out / "server.log", "wb")  # noqa: SIM115 - the process holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
         "--data-host", "127.0.0.1", "--data-port", str(data_port), "--advertise-host", "127.0.0.1",
         "--preset", "asp", "--out", str(out), "--resume", str(ckpt), *flags],
        stdout=log, stderr=subprocess.STDOUT, env=_server_env())
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, (out / "server.log").read_text(errors="replace")[-3000:]
        try:
            return httpx.get(url + "/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, 60, "the resumed server")
    return proc, url


def test_a_finished_run_stays_finished_across_a_restart(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    with running_server(tmp_path / "first", "--target-accuracy", str(TARGET), "--checkpoint-dir", str(ckpt),
                        "--checkpoint-interval", "3600", sets=("eval_interval_seconds=0.3",),
                        check_exit=False) as first:
        agents = [start_agent(first.url, f"agent-{i}", tmp_path / f"agent-{i}.log") for i in range(2)]
        try:
            reached = wait_for(lambda: first.get_json("/v1/status")["target_reached_at"], 90, "the target")
            # Written when the target was reached, not only at shutdown.
            meta = wait_for(lambda: (m := json.loads((ckpt / "checkpoint.json").read_text()))["target_reached"]
                             and m, 30, "a checkpoint that knows the target was reached")
            best = first.get_json("/v1/status")
        finally:
            for a in agents:
                try:
                    a.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    a.kill()
                    a.wait(timeout=10)
        first.proc.kill()  # no shutdown checkpoint: only what was already durable survives
        first.proc.wait(timeout=10)
    assert meta["target_reached"]["version"] == reached["version"]
    assert meta["best_evaluation"]["accuracy"] >= reached["accuracy"]

    # Same target: the resumed run is over at once, and says so to an agent that reconnects.
    proc, url = _start_finished(ckpt, tmp_path / "second", "--target-accuracy", str(TARGET))
    try:
        status = httpx.get(url + "/v1/status", timeout=10).json()
        assert status["outcome"] == "target_reached" and status["stopping"], status
        assert status["target_reached_at"]["version"] == reached["version"]
        assert status["best_accuracy"] == meta["best_evaluation"]["accuracy"]
        late = start_agent(url, "agent-0", tmp_path / "late.log")
        assert late.wait(timeout=60) == 0, (tmp_path / "late.log").read_text(errors="replace")[-2000:]
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) in (0, -15)
    # The best model survived the restart with its weights: the resumed server writes it again,
    # unless its shutdown evaluation of the current model (updates folded while the target
    # evaluation ran come after the best version) scored higher still.
    restored = read_tensor_metadata(tmp_path / "second" / "model-best.safetensors")
    assert meta["best_evaluation"]["accuracy"] == best["best_accuracy"]
    if int(restored["version"]) == meta["best_evaluation"]["version"]:
        assert float(restored["accuracy"]) == meta["best_evaluation"]["accuracy"]
    else:
        assert int(restored["version"]) == meta["version"] > meta["best_evaluation"]["version"]
        assert float(restored["accuracy"]) > meta["best_evaluation"]["accuracy"]

    # A higher target: the operator resumed it to train on.
    with running_server(tmp_path / "third", "--resume", str(ckpt), "--target-accuracy", "0.99") as third:
        status = third.get_json("/v1/status")
        assert status["outcome"] == "running" and not status["stopping"]
        assert status["best_accuracy"] >= meta["best_evaluation"]["accuracy"]
