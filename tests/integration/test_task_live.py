"""Bring your own task, over real sockets (issue 14).

A server and agents started as users start them (``--task path/to/file.py:ATTR``)
train a regression MLP with MSE loss, an R² metric and AdamW until ``--target
r2=...``, and the server, asked to ``--exit-when-done``, exits 0 with its
files written. An agent holding another task is refused before registering
anything, naming both tasks; broken tasks stop the server and the agent at
start-up with one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import JOIN_TOKEN, _server_env, free_ports, parse_metric, port_is_free, running_server

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parent / "task_fixtures.py"
TARGET_R2 = 0.95
# Only a hang fails on time: how fast a broken task is refused is measured by benchmarks/startup.py
# (docs/performance.md), not asserted. A CPU-second guard here (6 CPU s against 5.09-5.23 measured
# under the suite's own load, 2026-11-26) still failed by chance (issue 32).
HANG_S = 120


def _ref(attr: str) -> str:
    return f"{FIXTURES}:{attr}"


def _agent_cmd(url: str, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hermes.client.cli", "--server", url, "--name", name, "--no-progress",
            "--connect-retries", "2", *extra]


def _agent_env() -> dict[str, str]:
    return {**_server_env(), "HERMES_JOIN_TOKEN": JOIN_TOKEN}


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=HANG_S)


def _registrations(srv) -> float:
    """Registration attempts the server counted, whatever their outcome."""
    text = srv.metrics_text()
    outcomes = {line.split('outcome="', 1)[1].split('"', 1)[0] for line in text.splitlines()
                if line.startswith("hermes_registrations_total{") and 'outcome="' in line}
    return sum(parse_metric(text, "hermes_registrations_total", outcome=o) for o in outcomes)


def test_a_custom_task_trains_to_its_target_and_a_mismatched_agent_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "server"
    with running_server(out, "--task", _ref("regression"), "--target", f"r2={TARGET_R2}", "--exit-when-done",
                        "--max-seconds", "300",
                        # Both agents must take part: without the start gate the first one to join can reach
                        # the target alone before the second registers (seen in CI, 2026-11-24).
                        sets=("eval_interval_seconds=0.3", "min_workers=2")) as srv:
        status = srv.get_json("/v1/status")
        assert (status["task"], status["target"], status["outcome"]) == ("tiny-regression", f"r2={TARGET_R2:g}",
                                                                          "running")
        spec_before = srv.get_json("/v1/workers")

        # Another architecture under another name: refused (409 -> exit 4) before any state exists.
        refused = _run(_agent_cmd(srv.url, "intruder", "--task", _ref("other")), _agent_env(), tmp_path)
        assert refused.returncode == 4, refused.stderr
        line = refused.stderr.strip().splitlines()[-1]
        assert "tiny-regression" in line and "wider-regression" in line, refused.stderr
        assert srv.get_json("/v1/workers") == spec_before  # no ghost worker
        assert srv.counter("hermes_registrations_total", outcome="task_mismatch") == 1

        # A broken task on the agent: one line, exit 2, and refused before it asked the server for
        # anything: no registration attempt of any outcome, no worker, nothing in its folder.
        attempts = _registrations(srv)
        (tmp_path / "broken").mkdir()
        broken = _run(_agent_cmd(srv.url, "broken", "--task", _ref("vector_loss"), "--log-level", "warning"),
                      _agent_env(), tmp_path / "broken")
        assert broken.returncode == 2, broken.stderr
        assert broken.stderr.strip() == ("hermes-client: task tiny-regression: loss: returned shape (4,), "
                                         "expected a scalar"), broken.stderr
        assert broken.stdout == "", broken.stdout
        assert _registrations(srv) == attempts
        assert srv.get_json("/v1/workers") == spec_before
        assert list((tmp_path / "broken").iterdir()) == []

        # Two agents: one names the task, the other takes the server's reference.
        logs = [open(tmp_path / f"agent-{i}.log", "wb") for i in range(2)]  # noqa: SIM115 - the agents hold them
        agents = [subprocess.Popen(_agent_cmd(srv.url, "agent-0", "--task", _ref("regression")), stdout=logs[0],
                                   stderr=subprocess.STDOUT, env=_agent_env(), cwd=tmp_path),
                  subprocess.Popen(_agent_cmd(srv.url, "agent-1"), stdout=logs[1], stderr=subprocess.STDOUT,
                                   env=_agent_env(), cwd=tmp_path)]
        try:
            # --exit-when-done: the server ends itself once the target is reached and the agents left.
            srv.proc.wait(timeout=240)
            for a in agents:
                a.wait(timeout=60)
        finally:
            for a in agents:
                if a.poll() is None:
                    a.kill()
            for fh in logs:
                fh.close()
        assert srv.proc.returncode == 0, srv.log_text()[-3000:]
        assert [a.returncode for a in agents] == [0, 0], [(tmp_path / f"agent-{i}.log").read_text()[-2000:]
                                                          for i in range(2)]

    summary = json.loads((out / "server_summary.json").read_text())
    assert summary["outcome"] == "target_reached"
    reached = summary["target_reached_at"]
    assert reached["metric"] == "r2" and reached["value"] >= TARGET_R2
    assert summary["stop_reason"] == f"target r2={TARGET_R2:g} reached at version {reached['version']}"
    assert summary["model"]["task"] == "tiny-regression" and summary["model"]["name"] == "Sequential"
    assert summary["best_metric"] == "r2" and summary["best_metrics"]["r2"] >= TARGET_R2
    assert set(summary["final_metrics"]) == {"r2", "mse"} and summary["final_accuracy"] is None
    assert {w["name"] for w in summary["workers"]} >= {"agent-0", "agent-1"}
    assert "intruder" not in {w["name"] for w in summary["workers"]}
    # The agents trained on float targets with the task's loss (one that registered just as the
    # target was reached may have had no cycle left), and the model file was written.
    assert sum(w["samples"] for w in summary["workers"] if w["name"].startswith("agent-")) > 0
    assert (out / "model-best.safetensors").is_file()


@pytest.mark.parametrize(("attr", "expected"), [
    ("not_a_task", "not_a_task is a int, expected a hermes.Task or a zero-argument callable returning one"),
    ("non_tensor_data", "task tiny-regression: train_data: item 0 is (list, float), expected a pair of tensors"),
    ("vector_loss", "task tiny-regression: loss: returned shape (4,), expected a scalar"),
    ("throwing_metric", "task tiny-regression: metrics['boom']: raised RuntimeError: metric exploded"),
    (None, "task no_such_module_xyz:task: no module named 'no_such_module_xyz'"),
])
def test_a_broken_task_stops_the_server_before_it_binds(tmp_path: Path, attr: str | None, expected: str) -> None:
    ref = _ref(attr) if attr else "no_such_module_xyz:task"
    port, data_port = free_ports(2)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
           "--data-port", str(data_port), "--collective-port", "0", "--insecure", "--out", str(out), "--task", ref]
    proc = _run(cmd, {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}, tmp_path)
    # Exit 2 with one line: uvicorn never started (it would have logged), the lifespan never ran (exit 3).
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("hermes-server: "), lines
    assert proc.stdout == "", proc.stdout
    # Before the expensive work: nothing written (no OUT, no token, no checkpoint, no log), no port kept.
    assert not out.exists() and list(tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.rglob("*"))
    assert port_is_free(port) and port_is_free(data_port)


def test_nothing_listens_while_the_server_loads_its_task(tmp_path: Path) -> None:
    """The task is loaded and checked before any port listens (server/cli.py serve): the task itself looks."""
    port, data_port = free_ports(2)
    seen_file = tmp_path / "seen.json"
    cmd = [sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
           "--data-port", str(data_port), "--collective-port", "0", "--insecure", "--out", str(tmp_path / "out"),
           "--task", _ref("probe_ports")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env.update(TASK_PROBE_PORTS=f"127.0.0.1:{port},127.0.0.1:{data_port}", TASK_PROBE_OUT=str(seen_file))
    proc = _run(cmd, env, tmp_path)
    assert proc.returncode == 2 and "probe done" in proc.stderr, (proc.returncode, proc.stderr)
    # The factory ran (the file exists) and saw neither port listening.
    assert json.loads(seen_file.read_text()) == {f"127.0.0.1:{port}": False, f"127.0.0.1:{data_port}": False}


def test_budgets_and_task_flags_are_in_every_cli_help() -> None:
    for module in ("hermes.server.cli", "hermes.client.cli", "hermes.deploy.testbed"):
        text = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                              timeout=60).stdout
        assert "--task" in text, module
        if module != "hermes.client.cli":
            assert "--target" in text and "--max-epochs" in text and "--max-updates" in text, module
    server_help = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--help"], capture_output=True,
                                 text=True, timeout=60).stdout
    assert "--exit-when-done" in server_help and "--max-seconds" in server_help

