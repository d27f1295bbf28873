"""hermes-deploy without a network: inventory validation, the agent's command line, the CLI's help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("paramiko", reason="paramiko is not installed (pip install -e '.[dev]')")

from hermes.deploy import rollout, rollout_agent, ssh_cli
from hermes.deploy.inventory import InventoryError, load_inventory, parse_inventory

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("check", "install", "start", "status", "stop", "logs", "fetch")


def _inv(tmp_path: Path, text: str, name: str = "edge.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_merge_and_paths_resolve(tmp_path) -> None:
    (tmp_path / "keys").mkdir()
    inv = load_inventory(_inv(tmp_path, """
        known_hosts = "kh"
        [defaults]
        user = "pi"
        key_file = "keys/id_ed25519"
        python = "/usr/bin/python3.11"
        server = "http://10.0.0.5:8000"
        [[hosts]]
        name = "jetson-1"
        host = "10.0.0.21"
        threads = 4
        device = "cuda"
        env = { OMP_NUM_THREADS = 4 }
        forward_env = ["HERMES_JOIN_TOKEN"]
        [[hosts]]
        name = "pi-1"
        host = "pi1.local"
        port = 2222
        user = "hermes"
        use_agent = true
    """))
    a, b = inv.hosts
    assert inv.known_hosts == tmp_path / "kh"
    assert a.user == "pi" and a.key_file == tmp_path / "keys" / "id_ed25519" and not a.use_agent
    assert a.threads == 4 and a.device == "cuda" and a.env == (("OMP_NUM_THREADS", "4"),)
    assert a.forward_env == ("HERMES_JOIN_TOKEN",) and a.deps == "full" and a.workdir == "hermes-edge"
    assert b.port == 2222 and b.user == "hermes" and b.use_agent and b.server == "http://10.0.0.5:8000"
    assert inv.select(["pi-1"]) == (b,)
    with pytest.raises(InventoryError, match="unknown host.*nope"):
        inv.select(["nope"])


@pytest.mark.parametrize(("body", "pattern"), [
    ('name = "a"\nhost = "h"\nport = 70000', r"host a: field 'port'"),
    ('name = "a"\nhost = "h"\nthreads = 0', r"host a: field 'threads'"),
    ('name = "a"\nhost = "h"\ndeps = "some"', r"host a: field 'deps'"),
    ('name = "a"\nhost = "h"\nprot = 22', r"host a: unknown field\(s\) prot"),
    ('name = "a"', r"host a: field 'host': is required"),
    ('host = "h"', r"host #1: field 'name': is required"),
    ('name = "a b"\nhost = "h"', r"field 'name'"),
    ('name = "a"\nhost = "h"\nserver = "10.0.0.5:8000"', r"host a: field 'server'.*http"),
    ('name = "a"\nhost = "h"\npassword = "hunter2"', r"field 'password': no passwords"),
    ('name = "a"\nhost = "h"\nenv = { HERMES_JOIN_TOKEN = "x" }', r"host a: field 'env'.*forward_env"),
    ('name = "a"\nhost = "h"\nuse_agent = false', r"host a: field 'use_agent'"),
    ('name = "a"\nhost = "h"\nextras = ["server; rm -rf /"]', r"host a: field 'extras'"),
])
def test_errors_name_the_host_and_the_field(tmp_path, body, pattern) -> None:
    with pytest.raises(InventoryError, match=pattern):
        load_inventory(_inv(tmp_path, "[[hosts]]\n" + body + "\n"))


def test_file_level_errors(tmp_path) -> None:
    with pytest.raises(InventoryError, match="no hosts"):
        load_inventory(_inv(tmp_path, 'known_hosts = "x"\n'))
    with pytest.raises(InventoryError, match="duplicate host name 'a'"):
        load_inventory(_inv(tmp_path, '[[hosts]]\nname = "a"\nhost = "h"\n[[hosts]]\nname = "a"\nhost = "g"\n'))
    with pytest.raises(InventoryError, match="not valid TOML"):
        load_inventory(_inv(tmp_path, "[[hosts]\n"))
    with pytest.raises(InventoryError, match="defaults.*passphrase"):
        load_inventory(_inv(tmp_path, '[defaults]\npassphrase = "x"\n[[hosts]]\nname = "a"\nhost = "h"\n'))
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "missing.toml")


def test_yaml_inventory(tmp_path) -> None:
    pytest.importorskip("yaml")
    inv = load_inventory(_inv(tmp_path, "hosts:\n  - name: a\n    host: 10.0.0.1\n    threads: 2\n", "edge.yaml"))
    assert inv.hosts[0].threads == 2


def test_example_inventory_is_valid() -> None:
    inv = load_inventory(REPO_ROOT / "deploy" / "inventory.example.toml")
    assert len(inv.hosts) >= 2
    assert all(h.server and h.server.startswith("http") for h in inv.hosts)


def test_agent_command_line() -> None:
    inv = parse_inventory({"hosts": [{"name": "j1", "host": "h", "threads": 4, "device": "cuda",
                                      "client_args": ["--slowdown", "2"]}]})
    opts = rollout_agent.StartOptions(server="http://s:8000", client_args=("--log-level", "debug"), max_cycles=5)
    argv = rollout_agent.agent_argv(inv.hosts[0], opts)
    assert argv == ["venv/bin/hermes-client", "--server", "http://s:8000", "--name", "j1", "--no-progress",
                    "--threads", "4", "--device", "cuda", "--slowdown", "2", "--log-level", "debug",
                    "--max-cycles", "5"]
    # Every flag exists in the real hermes-client parser.
    from hermes.client.cli import build_parser

    build_parser().parse_args(argv[1:])
    with pytest.raises(rollout.CommandFailed, match="no server URL"):
        rollout_agent.agent_argv(inv.hosts[0], rollout_agent.StartOptions())


def test_remote_paths() -> None:
    assert rollout.remote_path("~/hermes-edge", "venv") == "hermes-edge/venv"
    assert rollout.remote_path("/opt/hermes", "logs", "agent.log") == "/opt/hermes/logs/agent.log"
    assert rollout.remote_path("~") == "."
    assert rollout.shown("hermes-edge/venv") == "~/hermes-edge/venv"


def test_help_documents_each_command(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        ssh_cli.main(["--help"])
    assert exc.value.code == 0
    top = capsys.readouterr().out
    for cmd in COMMANDS:
        assert re.search(rf"^\s+{cmd}\s+\S", top, re.MULTILINE), f"{cmd} missing from --help:\n{top}"
        with pytest.raises(SystemExit) as exc:
            ssh_cli.main([cmd, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        assert f"hermes-deploy {cmd}" in text and "--inventory" in text and "--trust-on-first-use" in text
    assert "--wheel" in _help(capsys, "install") and "--deps" in _help(capsys, "install")
    assert "--server" in _help(capsys, "start") and "--grace" in _help(capsys, "stop")


def _help(capsys, cmd: str) -> str:
    with pytest.raises(SystemExit):
        ssh_cli.main([cmd, "--help"])
    return capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path, capsys) -> None:
    inv = _inv(tmp_path, '[[hosts]]\nname = "a"\nhost = "127.0.0.1"\nport = 1\nserver = "http://s:1"\n')
    assert ssh_cli.main(["check", "-i", str(tmp_path / "nope.toml")]) == 2
    assert ssh_cli.main(["check", "-i", str(inv), "--hosts", "zzz"]) == 2
    assert ssh_cli.main(["start", "-i", str(inv), "--", "--slowdwn", "2"]) == 2
    assert "unknown hermes-client argument(s): --slowdwn" in capsys.readouterr().err
    assert ssh_cli.main(["install", "-i", str(inv), "--wheel", str(inv)]) == 2
    with pytest.raises(SystemExit) as exc:
        ssh_cli.main(["check"])  # no inventory
    assert exc.value.code == 2


def test_table() -> None:
    text = ssh_cli.format_table("check", [rollout.HostResult("a", True, "fine", seconds=0.25),
                                          rollout.HostResult("bbbb", False, "unreachable: x", seconds=1)])
    assert text.splitlines()[1].split()[:2] == ["a", "ok"]
    assert text.splitlines()[2].split()[:2] == ["bbbb", "FAILED"]
    assert text.splitlines()[-1] == "1 ok, 1 failed"
