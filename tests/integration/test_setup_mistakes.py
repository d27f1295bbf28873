"""Each hermes-server set-up mistake: one line on stderr, its exit code, torch never imported, nothing written.

The server as users start it (``python -m hermes.server.cli``); these checks
run before torch is imported, so each answer takes about a second (measured
by benchmarks/startup.py; a 5 s wall-clock limit here failed by chance on a
loaded machine, issue 32).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hermes.deploy.procs import free_port
from tests.conftest import _server_env

pytestmark = pytest.mark.integration

HANG_S = 120  # only a hang fails on time


def _server(*args: str, env: dict[str, str | None] | None = None, cwd: Path | None = None) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", *args], capture_output=True, text=True,
                          timeout=HANG_S, env=_server_env({**(env or {}), "PYTHONPROFILEIMPORTTIME": "1"}), cwd=cwd)
    # The interpreter's import profile ("import time: self [us] | cumulative | name") is not the server's output.
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("import time:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "torch" not in imported, f"torch imported before: {lines[0]}"
    return proc.returncode, lines[0]


def _listening(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_control_port_in_use(tmp_path):
    with _listening() as busy:
        port = busy.getsockname()[1]
        code, line = _server("--host", "127.0.0.1", "--port", str(port), "--out", str(tmp_path / "out"))
    assert code == 2
    assert line.startswith(f"hermes-server: control port {port} on 127.0.0.1 is in use") and "--port" in line
    assert not (tmp_path / "out").exists()  # nothing written: not OUT, not the admin token


def test_data_port_in_use(tmp_path):
    with _listening() as busy:
        port = busy.getsockname()[1]
        code, line = _server("--host", "127.0.0.1", "--port", str(free_port()), "--data-port", str(port),
                             "--out", str(tmp_path / "out"))
    assert code == 2
    assert line.startswith(f"hermes-server: data port {port} on 127.0.0.1 is in use") and "--data-port" in line
    assert not (tmp_path / "out").exists()


def test_out_holding_another_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-best.safetensors").write_bytes(b"the finished run's best model")
    (out / "server_summary.json").write_text("{}")
    code, line = _server("--host", "127.0.0.1", "--port", str(free_port()), "--out", str(out))
    assert code == 2
    assert f"--out {out} holds another run's outputs (server_summary.json, model-best.safetensors)" in line
    assert "--resume" in line and "--overwrite" in line
    assert (out / "model-best.safetensors").read_bytes() == b"the finished run's best model"
    assert sorted(p.name for p in out.iterdir()) == ["model-best.safetensors", "server_summary.json"]


def test_a_port_in_use_is_found_before_overwrite_deletes_anything(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-best.safetensors").write_bytes(b"best")
    with _listening() as busy:
        code, line = _server("--host", "127.0.0.1", "--port", str(busy.getsockname()[1]), "--out", str(out),
                             "--overwrite")
    assert code == 2 and "control port" in line
    assert (out / "model-best.safetensors").read_bytes() == b"best"


def test_resume_and_overwrite_together(tmp_path):
    code, line = _server("--resume", str(tmp_path / "ckpt"), "--overwrite", "--port", str(free_port()))
    assert code == 2 and "resume and overwrite exclude each other" in line


def test_unknown_preset_suggests_the_closest():
    code, line = _server("--preset", "bsb", "--port", str(free_port()))
    assert code == 2 and line == "hermes-server: configuration error: --preset: unknown preset 'bsb'; did you mean 'bsp'?"
    code, line = _server("--port", str(free_port()), env={"HERMES_PRESET": "hermse"})
    assert code == 2 and "HERMES_PRESET='hermse': unknown preset 'hermse'; did you mean 'hermes'?" in line


def test_config_key_typo_suggests_the_key(tmp_path):
    code, line = _server("--set", "learning_rate=0.1", "--port", str(free_port()))
    assert code == 2 and line == "hermes-server: configuration error: learning_rate: unknown config key; did you mean 'lr'?"
    config = tmp_path / "run.toml"
    config.write_text("batchsize = 32\n")
    code, line = _server("--config", str(config), "--port", str(free_port()))
    assert code == 2 and "batchsize" in line and "did you mean 'batch_size'?" in line


@pytest.mark.parametrize("env, named", [
    ({"HERMES_PORT": "abc"}, "HERMES_PORT='abc': Input should be a valid integer"),
    ({"HERMES_DATA_PORT": "70000"}, "HERMES_DATA_PORT='70000': Input should be less than or equal to 65535"),
    ({"HERMES_HEARTBEAT_TIMEOUT_SECONDS": "soon"}, "HERMES_HEARTBEAT_TIMEOUT_SECONDS='soon'"),
    ({"HERMES_INSECURE": "maybe"}, "HERMES_INSECURE='maybe': Input should be a valid boolean"),
])
def test_bad_environment_value(env, named):
    code, line = _server(env=env)
    assert code == 2 and line.startswith("hermes-server: configuration error: ") and named in line


def test_bad_flag_value_is_one_line_not_the_usage():
    code, line = _server("--port", "abc")
    assert code == 2 and line == ("hermes-server: error: argument --port: invalid int value: 'abc' "
                                  "(see hermes-server --help)")


def test_version():
    proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--version"], capture_output=True, text=True,
                          timeout=60, env=_server_env())
    assert proc.returncode == 0 and proc.stdout.startswith("hermes-server ") and proc.stdout.split()[1][0].isdigit()
