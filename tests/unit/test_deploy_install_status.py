"""hermes-deploy: which torch install puts on a device, and how status tells a finished agent from a failed one.

The start/status/stop scripts run in a real local ``sh`` (what the SSH
session would run on the device) against a stand-in ``venv/bin/hermes-client``
that exits with a chosen code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hermes.deploy import rollout, rollout_agent, rollout_install, ssh_cli
from hermes.deploy.inventory import TORCH_CPU_INDEX, InventoryError, parse_inventory
from hermes.deploy.remote import CommandResult


def _host(**fields):
    return parse_inventory({"hosts": [{"name": "edge", "host": "h", **fields}]}).hosts[0]


PIP = ["venv/bin/python", "-m", "pip", "install"]


def test_cpu_torch_by_default() -> None:
    assert _host().torch == "cpu"
    assert rollout_install.torch_command(_host(), PIP) == PIP + ["--index-url", TORCH_CPU_INDEX, "torch"]


def test_inventory_overrides_the_torch_build() -> None:
    assert rollout_install.torch_command(_host(torch="cuda"), PIP) is None  # pip resolves torch from its index
    assert rollout_install.torch_command(_host(torch="pypi"), PIP) is None
    assert rollout_install.torch_command(_host(torch="torch==2.5.1"), PIP) == PIP + ["torch==2.5.1"]
    # A host with its own index (an offline wheelhouse) gets torch from there.
    own = _host(pip_args=["--no-index", "--find-links", "/wheels"])
    assert rollout_install.torch_command(own, PIP) == PIP + ["torch"]
    with pytest.raises(InventoryError, match="torch"):
        _host(torch="rocm")
    with pytest.raises(InventoryError, match="torch"):
        _host(torch="torch 2")


class LocalShell:
    """Runs a deploy script in a local sh, as the device would."""

    def run(self, script: str, *, timeout: float = 60.0) -> CommandResult:
        r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=timeout)
        return CommandResult(r.returncode, r.stdout, r.stderr)


def _device(tmp_path: Path, agent_body: str):
    wd = tmp_path / "device"
    (wd / "venv" / "bin").mkdir(parents=True)
    fake = wd / "venv" / "bin" / "hermes-client"
    fake.write_text("#!/bin/sh\n" + agent_body + "\n")
    fake.chmod(0o755)
    return _host(workdir=str(wd), server="http://127.0.0.1:1"), wd


def _wait_exit_file(wd: Path) -> str:
    path = wd / rollout_agent.EXIT_FILE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError("the waiting shell never wrote the exit status")


def test_finished_agent_is_reported_finished(tmp_path) -> None:
    host, wd = _device(tmp_path, 'echo training; sleep 2; echo "stopped (done)"; exit 0')
    summary, details = rollout_agent.start(host, LocalShell(), rollout_agent.StartOptions(startup_check=0.5))
    assert "started pid" in summary
    assert _wait_exit_file(wd) == "0"
    summary, details = rollout_agent.status(host, LocalShell())
    assert details["state"] == "finished" and details["exit_code"] == 0 and "stopped (done)" in summary
    table = ssh_cli.format_table("status", [rollout.HostResult("edge", True, summary, details)])
    assert table.splitlines()[1].split()[:2] == ["edge", "FINISHED"]


def test_failed_agent_is_reported_with_its_exit_code(tmp_path) -> None:
    host, wd = _device(tmp_path, 'sleep 1.5; echo "hermes-client: server unreachable"; exit 3')
    rollout_agent.start(host, LocalShell(), rollout_agent.StartOptions(startup_check=0.2))
    assert _wait_exit_file(wd) == "3"
    with pytest.raises(rollout.CommandFailed, match=r"exited with code 3 \(server unreachable\)"):
        rollout_agent.status(host, LocalShell())


def test_stop_reaches_the_agent_and_a_running_one_is_running(tmp_path) -> None:
    # The stand-in leaves on SIGTERM with 0, as hermes-client does.
    host, wd = _device(tmp_path, "trap 'exit 0' TERM; while :; do sleep 0.1; done")
    rollout_agent.start(host, LocalShell(), rollout_agent.StartOptions(startup_check=0.2))
    pid = int((wd / rollout_agent.PID_FILE).read_text())
    try:
        summary, details = rollout_agent.status(host, LocalShell())
        assert details["state"] == "running" and details["pid"] == pid
        summary, _ = rollout_agent.stop(host, LocalShell(), grace=10)
        assert summary == f"stopped pid {pid} (SIGTERM)"
        assert _wait_exit_file(wd) == "0"
    finally:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_agent_that_finishes_within_the_start_check_is_not_a_failed_start(tmp_path) -> None:
    host, wd = _device(tmp_path, "exit 0")
    summary, _ = rollout_agent.start(host, LocalShell(), rollout_agent.StartOptions(startup_check=0.5))
    assert "already finished cleanly" in summary
