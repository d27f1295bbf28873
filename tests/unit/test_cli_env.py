"""One command-line convention across hermes-client, -testbed, -deploy, -bench (common/cli_env.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from hermes.common.cli_env import HermesParser, deprecated_alias, env_name, package_version


def _parser() -> HermesParser:
    p = HermesParser(prog="tool", version=True)
    p.add_argument("--request-timeout", type=float, default=30.0, help="seconds")
    p.add_argument("--log-level", default="info", choices=["debug", "info"])
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--threads", dest="max_threads", type=int, default=1)
    deprecated_alias(p, "--max-threads", "--threads")
    return p


def test_environment_twin_is_the_default_and_the_flag_wins(monkeypatch) -> None:
    monkeypatch.setenv("HERMES_REQUEST_TIMEOUT", "2.5")
    monkeypatch.setenv("HERMES_QUIET", "yes")
    args = _parser().parse_args([])
    assert args.request_timeout == 2.5 and args.quiet is True
    assert _parser().parse_args(["--request-timeout", "7"]).request_timeout == 7.0
    monkeypatch.setenv("HERMES_QUIET", "0")
    assert _parser().parse_args([]).quiet is False


@pytest.mark.parametrize(("var", "value", "says"), [
    ("HERMES_REQUEST_TIMEOUT", "soon", "HERMES_REQUEST_TIMEOUT='soon' (the environment twin of --request-timeout): "
                                       "not a valid float"),
    ("HERMES_LOG_LEVEL", "infoo", "choose from debug, info (did you mean info?)"),
    ("HERMES_QUIET", "maybe", "expected 1/true/yes/on or 0/false/no/off"),
])
def test_bad_environment_value_is_one_line_naming_the_variable(monkeypatch, capsys, var, value, says) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args([])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: ") and says in err, err


def test_help_names_each_twin_once_and_not_for_repeatable_or_hidden_flags(capsys) -> None:
    text = _parser().format_help()
    for var in ("HERMES_REQUEST_TIMEOUT", "HERMES_LOG_LEVEL", "HERMES_QUIET", "HERMES_THREADS"):
        assert text.count(f"[{var}]") == 1, text
    assert "HERMES_SET" not in text and "--max-threads" not in text and "HERMES_VERSION" not in text


def test_help_and_version_work_whatever_the_environment_holds(monkeypatch, capsys) -> None:
    monkeypatch.setenv("HERMES_REQUEST_TIMEOUT", "soon")
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"tool {package_version()}"
    assert package_version() != "unknown"  # installed (editable) in the venv


def test_unknown_flag_and_choice_suggest_the_closest(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["--request-timout", "3"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "unrecognized arguments: --request-timout 3 (did you mean --request-timeout?); see tool --help" in err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--log-level", "debg"])
    assert "(did you mean debug?)" in capsys.readouterr().err
    # No prefix matching.
    with pytest.raises(SystemExit):
        _parser().parse_args(["--request", "3"])


def test_deprecated_alias_works_and_warns(capsys) -> None:
    args = _parser().parse_args(["--max-threads", "3"])
    assert args.max_threads == 3
    assert "tool: --max-threads is deprecated; use --threads" in capsys.readouterr().err


def test_subcommands_take_the_tools_prefix_and_required_flags_come_from_the_environment(monkeypatch) -> None:
    p = HermesParser(prog="deploy", env_prefix="HERMES_DEPLOY_")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True)
    sub.add_parser("go", parents=[common])
    monkeypatch.setenv("HERMES_DEPLOY_OUT", "/tmp/x")
    monkeypatch.setenv("HERMES_OUT", "/wrong")
    assert p.parse_args(["go"]).out == "/tmp/x"
    assert "[HERMES_DEPLOY_OUT]" in sub.choices["go"].format_help()


def test_shared_dest_switches(monkeypatch) -> None:
    def parser() -> HermesParser:
        p = HermesParser(prog="t")
        p.add_argument("--site", dest="site", action="store_true", default=None)
        p.add_argument("--no-site", dest="site", action="store_false")
        return p

    assert parser().parse_args([]).site is None
    monkeypatch.setenv("HERMES_NO_SITE", "1")
    assert parser().parse_args([]).site is False
    monkeypatch.setenv("HERMES_SITE", "1")  # the later flag's twin wins, as its flag would on a command line
    assert parser().parse_args([]).site is False


def test_env_name_rules() -> None:
    p = argparse.ArgumentParser()
    a = p.add_argument("-i", "--inventory")
    h = p.add_argument("--hidden", help=argparse.SUPPRESS)
    assert env_name(a) == "HERMES_INVENTORY" and env_name(a, prefix="HERMES_DEPLOY_") == "HERMES_DEPLOY_INVENTORY"
    assert env_name(a, {"inventory": None}) is None and env_name(h) is None


# ---- every tool -------------------------------------------------------------

TOOLS = {
    "hermes-client": "hermes.client.cli",
    "hermes-testbed": "hermes.deploy.testbed",
    "hermes-deploy": "hermes.deploy.ssh_cli",
    "hermes-bench": "hermes.deploy.bench.cli",
}
# Where a tool's build_parser lives when it is not the module ``-m`` runs.
PARSER_MODULES = {"hermes-testbed": "hermes.deploy.testbed_cli"}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_has_version_and_twins(tool: str) -> None:
    r = subprocess.run([sys.executable, "-m", TOOLS[tool], "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"{tool} {package_version()}", (r.stdout, r.stderr)
    module = __import__(PARSER_MODULES.get(tool, TOOLS[tool]), fromlist=["build_parser"])
    parsers = [module.build_parser()]
    subs = [a for a in parsers[0]._actions if isinstance(a, argparse._SubParsersAction)]
    parsers += [s for a in subs for s in a.choices.values()]
    for parser in parsers:
        assert isinstance(parser, HermesParser) and not parser.allow_abbrev
        text = parser.format_help()
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS and env_name(
                    action, parser.env_names, parser.env_prefix or "HERMES_"):
                assert f"[{env_name(action, parser.env_names, parser.env_prefix or 'HERMES_')}]" in text


def test_tool_prefixes() -> None:
    from hermes.deploy import ssh_cli, testbed_cli

    tb = testbed_cli.build_parser()
    assert "[HERMES_TESTBED_THREADS]" in tb.format_help() and "[HERMES_TESTBED_TENSORBOARD]" in tb.format_help()
    assert "HERMES_TESTBED_LIST_PRESETS" not in tb.format_help()
    deploy = ssh_cli.build_parser()
    deploy.parse_known_args(["check", "-i", "x"])  # subcommands take the prefix when the tool parses
    start = next(a for a in deploy._actions if isinstance(a, argparse._SubParsersAction)).choices["check"]
    assert "[HERMES_DEPLOY_INVENTORY]" in start.format_help()


def test_testbed_passes_tensorboard_to_the_server(tmp_path, monkeypatch) -> None:
    from hermes.deploy import testbed
    from hermes.deploy.testbed_cli import build_parser

    args = build_parser().parse_args(["--out", str(tmp_path / "run"), "--tensorboard", "tb"])
    bed = testbed.Testbed(args)
    seen: list[list[str]] = []
    monkeypatch.setattr(testbed, "wait_healthy", lambda *a, **k: None)
    monkeypatch.setattr(bed, "_spawn", lambda name, cmd, info, env=None: seen.append(cmd) or
                        testbed.Proc(name, None, tmp_path / "log", info))  # type: ignore[arg-type]
    monkeypatch.chdir(tmp_path)
    bed.start_server()
    cmd = seen[0]
    assert cmd[cmd.index("--tensorboard") + 1] == str(tmp_path / "tb")
    args = build_parser().parse_args(["--out", str(tmp_path / "run2")])
    bed = testbed.Testbed(args)
    monkeypatch.setattr(bed, "_spawn", lambda name, cmd, info, env=None: seen.append(cmd) or
                        testbed.Proc(name, None, tmp_path / "log", info))  # type: ignore[arg-type]
    bed.start_server()
    assert "--tensorboard" not in seen[1]


@pytest.mark.parametrize("argv,says", [
    (["--threads", "-2"], "--threads -2: must be >= 0"),
    (["--cores", "-1"], "--cores -1: must be >= 0"),
    (["--slowdown", "0.5"], "--slowdown 0.5: must be >= 1"),
])
def test_agent_out_of_range_numbers_name_the_flag_and_its_range(capsys, argv, says) -> None:
    from hermes.client.cli import main

    assert main(["--server", "http://127.0.0.1:1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_agent_zero_threads_and_cores_mean_decide_here() -> None:
    from hermes.client.cli import _usage_problem, build_parser

    args = build_parser().parse_args(["--server", "http://127.0.0.1:1", "--threads", "0", "--cores", "0"])
    args.threads, args.cores = args.threads or None, args.cores or None
    assert _usage_problem(args) is None
