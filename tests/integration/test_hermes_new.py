"""``hermes new DIR``: a task that trains as written, and commands whose flags the CLIs accept;
``hermes-deploy --help`` without paramiko."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 240  # only catches a hang: train.py stops at its target or after 60 s


def _new(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hermes.cli", "new", str(tmp_path / "proj"), *extra],
                          capture_output=True, text=True, timeout=HANG_S)


def test_hermes_new_writes_a_task_that_trains_as_written(tmp_path: Path) -> None:
    made = _new(tmp_path)
    assert made.returncode == 0, made.stderr
    proj = tmp_path / "proj"
    assert sorted(p.name for p in proj.iterdir()) == ["README.md", "task.py", "train.py"]
    # The generated train.py, run as the README says, reaches its target.
    run = subprocess.run([sys.executable, "train.py"], cwd=proj, capture_output=True, text=True, timeout=HANG_S)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1].startswith("target_reached "), run.stdout
    again = _new(tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already holds" in again.stderr
    assert _new(tmp_path, "--force").returncode == 0


def test_the_readmes_commands_use_flags_the_clis_accept(tmp_path: Path) -> None:
    assert _new(tmp_path).returncode == 0
    readme = (tmp_path / "proj" / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith(("hermes-testbed", "hermes-server",
                                                                          "hermes-client"))]
    assert {c.split()[0] for c in commands} == {"hermes-testbed", "hermes-server", "hermes-client"}
    for command in commands:
        program = command.split()[0]
        helptext = subprocess.run([sys.executable, "-c", f"import sys; sys.argv[0] = {program!r}; "
                                   f"from hermes.{_module(program)} import main; main(['--help'])"],
                                  capture_output=True, text=True, timeout=HANG_S).stdout
        for flag in re.findall(r"(--[a-z][a-z-]+)", command):
            assert flag in helptext, f"{program} has no {flag}"


def _module(program: str) -> str:
    return {"hermes-testbed": "deploy.testbed_cli", "hermes-server": "server.cli", "hermes-client": "client.cli"}[program]


BLOCK_PARAMIKO = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "paramiko" or name.startswith("paramiko."):
            raise ModuleNotFoundError("No module named 'paramiko'", name="paramiko")
        return None
sys.meta_path.insert(0, Block())
from hermes.deploy.ssh_cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv", [["--help"], ["status", "-i", "x.toml"]])
def test_hermes_deploy_without_paramiko_is_help_or_one_line(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCK_PARAMIKO, *argv], capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in proc.stderr
    if argv == ["--help"]:
        assert proc.returncode == 0 and "usage: hermes-deploy" in proc.stdout
        assert "note: paramiko is not installed: pip install 'hermes-edge[deploy]'" in proc.stdout
    else:
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            "hermes-deploy: paramiko is not installed: pip install 'hermes-edge[deploy]' (the deploy extra) to run "
            "these commands"]
