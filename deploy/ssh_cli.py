"""``hermes-deploy``: install, start and watch agents on edge devices over SSH.

Every command runs on all hosts of the inventory (or those named with
``--hosts``) in parallel and prints one row per host; the exit status is 1
when any host failed, 2 for a usage or inventory error.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hermes.common.cli_env import HermesParser
from hermes.deploy.inventory import InventoryError, load_inventory

# The SSH work needs paramiko (the `deploy` extra); --help does not, and says what is missing.
try:
    from hermes.deploy import rollout, rollout_agent, rollout_install
except ModuleNotFoundError as exc:
    if exc.name != "paramiko":
        raise
    MISSING_EXTRA: str | None = ("paramiko is not installed: pip install 'hermes-edge[deploy]' "
                                 "(the deploy extra) to run these commands")
else:
    MISSING_EXTRA = None

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_EPILOG = """\
inventory (TOML; see deploy/inventory.example.toml):
  known_hosts = "~/.ssh/known_hosts"
  [defaults]
  user = "hermes"
  key_file = "~/.ssh/hermes_ed25519"
  server = "http://10.0.0.5:8000"
  [[hosts]]
  name = "jetson-1"
  host = "10.0.0.21"
  threads = 4

typical roll-out:
  hermes-deploy check   -i edge.toml
  hermes-deploy install -i edge.toml            # builds the wheel from this checkout, or --wheel PATH
  hermes-deploy start   -i edge.toml --server http://10.0.0.5:8000 -- --slowdown 2
  hermes-deploy status  -i edge.toml
  hermes-deploy logs    -i edge.toml --dest runs/edge-logs
  hermes-deploy stop    -i edge.toml

Host keys are checked against known_hosts; an unknown key is refused unless
--trust-on-first-use is given, which accepts it and records it there.
"""


def _common() -> HermesParser:
    # A HermesParser like the subcommands it is a parent of (their add_parser takes parents of their type).
    p = HermesParser(add_help=False)
    g = p.add_argument_group("common options")
    g.add_argument("-i", "--inventory", default=None,
                   help="inventory file, TOML (or YAML with PyYAML) [HERMES_DEPLOY_INVENTORY]")
    g.add_argument("--hosts", default="", metavar="NAME[,NAME...]", help="only these hosts (default: all)")
    g.add_argument("--known-hosts", default=None, metavar="PATH",
                   help="known_hosts file to verify host keys against (default: the inventory's "
                        "known_hosts, else ~/.ssh/known_hosts)")
    g.add_argument("--trust-on-first-use", action="store_true",
                   help="accept a host key that is not in known_hosts yet and record it there "
                        "(a key that differs from the recorded one is still refused)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="give up on a host after this long, connection included "
                        "(default 60; install 1800)")
    g.add_argument("--parallel", type=int, default=16, metavar="N", help="hosts worked on at once (default 16)")
    g.add_argument("--json", action="store_true", help="print the per-host results as JSON instead of a table")
    g.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    p = HermesParser(
        prog="hermes-deploy", version=True, env_prefix="HERMES_DEPLOY_",
        description="Roll hermes-client agents out to edge devices over SSH (paramiko): check the devices, "
                    "install the wheel into a venv on each, start/stop the agent detached, and fetch logs "
                    "and artifacts. All hosts in parallel; one row per host.",
        epilog=_EPILOG + (f"\nnote: {MISSING_EXTRA}\n" if MISSING_EXTRA else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser("check", parents=[common], help="connect; report Python version, cores, memory and free disk",
                   description="Connect to each device and report its Python version, CPU cores (usable/total), "
                               "memory, free disk under the work directory, whether torch is importable and "
                               "whether hermes-edge is installed. Fails for a Python older than 3.11.")

    inst = sub.add_parser("install", parents=[common], help="copy the wheel over SFTP and install it into a venv",
                          description="Build the hermes-edge wheel from this checkout (or take --wheel), upload it "
                                      "over SFTP to WORKDIR/wheels and pip-install it into WORKDIR/venv, created "
                                      "with the inventory's python. Reinstalls over an existing venv.")
    inst.add_argument("--wheel", type=Path, help="a built hermes_edge-*.whl (default: build one from --source)")
    inst.add_argument("--source", type=Path, help="project checkout to build the wheel from "
                                                  "(default: the one hermes-deploy runs from)")
    inst.add_argument("--deps", choices=["full", "present"], default=None,
                      help="full: install the wheel with its dependencies (from the device's index); "
                           "present: --no-deps --no-index, the dependencies are on the device already "
                           "(default: each host's 'deps', else full)")
    site = inst.add_mutually_exclusive_group()
    site.add_argument("--system-site-packages", dest="system_site_packages", action="store_true", default=None,
                      help="the venv sees the system site-packages (use a preinstalled torch)")
    site.add_argument("--no-system-site-packages", dest="system_site_packages", action="store_false",
                      help="an isolated venv")
    inst.add_argument("--recreate-venv", action="store_true", help="delete and recreate the venv first")

    st = sub.add_parser("start", parents=[common], help="start hermes-client --server URL detached",
                        description="Start WORKDIR/venv/bin/hermes-client --server URL --name HOST detached "
                                    "(nohup, own session), its pid in WORKDIR/run/agent.pid and its output in "
                                    "WORKDIR/logs/agent.log (the previous one kept as agent.log.1). Arguments "
                                    "after '--' go to hermes-client, after the inventory's client_args.")
    st.add_argument("--server", help="control-plane URL (default: each host's 'server')")
    st.add_argument("--max-cycles", type=int, default=None, help="pass --max-cycles N to the agents")
    st.add_argument("--restart", action="store_true", help="stop a running agent first instead of failing")

    sub.add_parser("status", parents=[common], help="is the agent running? (pid, uptime, last log line)",
                   description="Read the pid file and check the process. A host whose agent is not running "
                               "counts as failed (exit 1).")

    sp = sub.add_parser("stop", parents=[common], help="SIGTERM the agent, SIGKILL after a grace period",
                        description="Send SIGTERM (the agent leaves the run cleanly), wait up to --grace "
                                    "seconds, then SIGKILL its process group; remove the pid file.")
    sp.add_argument("--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL (default 20)")

    lg = sub.add_parser("logs", parents=[common], help="download the agents' log files over SFTP",
                        description="Download WORKDIR/logs/agent.log of each host into DEST/HOST/agent.log.")
    lg.add_argument("--dest", type=Path, default=Path("deploy-logs"), help="local folder (default ./deploy-logs)")
    lg.add_argument("--previous", action="store_true", help="also the previous run's agent.log.1")
    lg.add_argument("--tail", type=int, default=0, metavar="N", help="print the last N lines of each log")

    fe = sub.add_parser("fetch", parents=[common], help="download a run's artifacts or a checkpoint over SFTP",
                        description="Download files or folders (relative to WORKDIR, or absolute) from each "
                                    "host into DEST/HOST/..., e.g. a run's output folder or a final "
                                    "checkpoint. Missing paths are skipped; a host where none exists fails.")
    fe.add_argument("--path", dest="paths", action="append", default=None, metavar="PATH",
                    help="repeatable (default: "
                    f"{'the agent folders' if MISSING_EXTRA else ', '.join(rollout_agent.DEFAULT_FETCH_PATHS)})")
    fe.add_argument("--dest", type=Path, default=Path("deploy-fetch"), help="local folder (default ./deploy-fetch)")
    return p


def _client_args_error(args: list[str]) -> str | None:
    """Check extra hermes-client arguments against its real parser before touching any host."""
    from hermes.client.cli import build_parser as client_parser

    if {"-h", "--help"} & set(args):
        return "--help after '--' would only print hermes-client's help: run hermes-client --help"
    parser = client_parser()
    try:
        _, unknown = parser.parse_known_args(["--server", "http://x", *args])
    except SystemExit:  # a bad value; argparse has printed why
        return f"invalid hermes-client arguments: {' '.join(args)}"
    if unknown:
        return f"unknown hermes-client argument(s): {' '.join(unknown)} (see hermes-client --help)"
    return None


def format_table(command: str, results: list[rollout.HostResult]) -> str:
    width = max([4] + [len(r.host) for r in results])
    lines = [f"{'HOST':<{width}}  {'RESULT':<8}  {'TIME':>6}  {command.upper()}"]
    for r in results:
        # status: an agent whose run ended cleanly is FINISHED, neither running nor failed.
        result = str(r.details.get("result", "ok")).upper() if r.ok and r.details.get("result") else (
            "ok" if r.ok else "FAILED")
        lines.append(f"{r.host:<{width}}  {result:<8}  {r.seconds:>5.1f}s  {r.summary}")
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results) - failed} ok, {failed} failed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if MISSING_EXTRA is not None:
        print(f"hermes-deploy: {MISSING_EXTRA}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL if args.log_level != "debug" else logging.DEBUG)
    if extra and args.command != "start":
        parser.error(f"arguments after '--' are only for start: {' '.join(extra)}")
    if not args.inventory:
        parser.error("an inventory is required: -i FILE (or HERMES_DEPLOY_INVENTORY)")
    try:
        inv = load_inventory(args.inventory)
        hosts = inv.select([h for h in args.hosts.split(",") if h])
    except InventoryError as exc:
        print(f"hermes-deploy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    known_hosts = Path(args.known_hosts).expanduser() if args.known_hosts else inv.known_hosts
    timeout = args.timeout or (1800.0 if args.command == "install" else 60.0)
    opts = rollout.Options(known_hosts=known_hosts, trust_on_first_use=args.trust_on_first_use,
                           timeout=timeout, parallel=args.parallel)

    cleanup: list[str] = []
    try:
        action = _action(args, extra, hosts, cleanup)
    except _Usage as exc:
        print(f"hermes-deploy {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        results = rollout.run_on_hosts(hosts, action, opts)
    finally:
        for d in cleanup:
            shutil.rmtree(d, ignore_errors=True)

    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2, default=str))
    else:
        print(format_table(args.command, results))
        if args.command == "logs" and args.tail > 0:
            for r in results:
                if r.ok:
                    path = Path(r.details["files"]["agent.log"])
                    tail = path.read_text(errors="replace").splitlines()[-args.tail:]
                    print(f"\n==> {r.host}: {path} <==")
                    print("\n".join(tail))
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


class _Usage(Exception):
    pass


def _action(args: argparse.Namespace, extra: list[str], hosts: Any, cleanup: list[str]) -> rollout.HostAction:
    cmd = args.command
    if cmd == "check":
        return rollout_install.check
    if cmd == "install":
        wheel = args.wheel
        if wheel is None:
            source = args.source or rollout_install.find_source_tree()
            if source is None or not (source / "pyproject.toml").is_file():
                raise _Usage("no project checkout to build the wheel from: pass --wheel PATH or --source DIR")
            out = tempfile.mkdtemp(prefix="hermes-deploy-")
            cleanup.append(out)
            try:
                wheel = rollout_install.build_wheel(source, Path(out))
            except (RuntimeError, OSError) as exc:
                raise _Usage(str(exc)) from None
            print(f"built {wheel.name} from {source}", file=sys.stderr)
        elif not wheel.is_file() or not wheel.name.endswith(".whl"):
            raise _Usage(f"--wheel {wheel}: not a wheel file")
        io = rollout_install.InstallOptions(wheel=wheel.resolve(), deps=args.deps,
                                            system_site_packages=args.system_site_packages,
                                            recreate_venv=args.recreate_venv)
        return lambda h, s: rollout_install.install(h, s, io)
    if cmd == "start":
        problem = _client_args_error(extra)
        if problem:
            raise _Usage(problem)
        if args.server is None and any(h.server is None for h in hosts):
            raise _Usage("no server URL: pass --server URL or set 'server' in the inventory")
        so = rollout_agent.StartOptions(server=args.server, client_args=tuple(extra), max_cycles=args.max_cycles,
                                        restart=args.restart)
        return lambda h, s: rollout_agent.start(h, s, so)
    if cmd == "status":
        return rollout_agent.status
    if cmd == "stop":
        return lambda h, s: rollout_agent.stop(h, s, grace=args.grace)
    if cmd == "logs":
        return lambda h, s: rollout_agent.logs(h, s, dest=args.dest, previous=args.previous)
    if cmd == "fetch":
        paths = tuple(args.paths or rollout_agent.DEFAULT_FETCH_PATHS)
        return lambda h, s: rollout_agent.fetch(h, s, dest=args.dest, paths=paths)
    raise _Usage(f"unknown command {cmd}")


if __name__ == "__main__":
    sys.exit(main())
