"""``hermes-client --server URL``: run an edge agent."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from typing import Any

from hermes.client.preflight import (
    DataPortGiven,
    NotReachable,
    check_server_url,
    default_name,
    first_contact,
    tls_context,
)
from hermes.common.cli_env import HermesParser
from hermes.common.pace import SLOWDOWN_MODES

EXIT_OK, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_REMOTE, EXIT_GROUP = 0, 2, 3, 4, 5


def parse_schedule(text: str) -> tuple[tuple[float, float], ...]:
    steps = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        at, sep, factor = part.partition(":")
        if not sep:
            raise ValueError(f"step {part!r}: expected SECONDS:SLOWDOWN")
        step = (float(at), float(factor))
        if step[0] < 0 or step[1] < 1.0:
            raise ValueError(f"step {part!r}: seconds must be >= 0 and slowdown >= 1")
        steps.append(step)
    return tuple(sorted(steps))


def _join_token(path: str | None) -> str | None:
    if path:
        lines = [ln.strip() for ln in open(path, encoding="utf-8").read().splitlines() if ln.strip()]
        if not lines:
            raise OSError(f"{path} is empty")
        return lines[0]
    return os.environ.get("HERMES_JOIN_TOKEN") or None


def build_parser() -> HermesParser:
    p = HermesParser(
        prog="hermes-client", version=True,
        description="Hermes edge agent: joins a parameter server and trains. "
        "Every flag has an environment variable twin (HERMES_SERVER, HERMES_NAME, ...).",
    )
    p.add_argument("--server", help="control-plane URL, e.g. http://10.0.0.5:8000 (the server's --port, not its data port)")
    p.add_argument("--name", help="stable worker name (default: this host's name; host-2, host-3 ... for "
                                  "further agents running on the same host)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default or 0: the cores this process may use, from its CPU "
                        "affinity and cgroup quota)")
    p.add_argument("--slowdown", type=float, default=1.0, help="emulate a device this many times slower (>= 1)")
    p.add_argument("--slowdown-mode", choices=SLOWDOWN_MODES, default="cpu",
                   help="how the slowdown is emulated: cpu multiplies each step's work (default), floor its "
                        "uncontended cost, so contention from co-located processes does not slow it further "
                        "(common/pace.py); nominal: floor from --nominal-sample-ms, and the device's CPU between "
                        "cycles slowed too")
    p.add_argument("--nominal-sample-ms", type=float, default=None,
                   help="--slowdown-mode nominal: the task's uncontended train-step cost per sample, in ms "
                        "(hermes-bench measures it)")
    p.add_argument("--slowdown-schedule", default="",
                   help="speed changes mid-run as SECONDS:SLOWDOWN pairs, e.g. '30:8,60:1'")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--request-timeout", type=float, default=30.0, help="seconds to wait for a data-plane reply")
    p.add_argument("--connect-retries", type=int, default=8,
                   help="registration retries (exponential backoff, about 45 s for 8) before giving up")
    p.add_argument("--data-plane-check-timeout", type=float, default=3.0, metavar="SECONDS",
                   help="at the first registration, how long to try reaching the data plane the server "
                        "advertises before exiting with a hint about --advertise-host (0: no check)")
    p.add_argument("--kafka-bootstrap",
                   help="Kafka address to read shard records from instead of the one the server names")
    p.add_argument("--schedule-origin", type=float, default=None,
                   help="unix time the --slowdown-schedule seconds count from (default: the agent's start)")
    p.add_argument("--cores", type=float, default=None,
                   help="compute capacity this device declares, in cores or FLOPs (any unit consistent across "
                        "the cluster); the static allocation policy splits batches by it")
    p.add_argument("--join-token-file", metavar="FILE",
                   help="file whose first line is the server's join token; or set HERMES_JOIN_TOKEN "
                        "(never a flag: command lines are visible to every user)")
    p.add_argument("--ssl-ca-certfile", metavar="PEM",
                   help="CA bundle to verify an https:// server with (default: the system's)")
    p.add_argument("--ssl-certfile", metavar="PEM", help="client certificate, for servers that require one")
    p.add_argument("--ssl-keyfile", metavar="PEM", help="private key of --ssl-certfile")
    p.add_argument("--task", metavar="REF",
                   help="the task to train: MODULE:ATTR, path/to/file.py:ATTR or an installed task name; it must be "
                        "the server's (checked at registration). Default: the reference the server names")
    p.add_argument("--max-cycles", type=int, default=None, help="stop after this many training cycles")
    p.add_argument("--max-nonfinite-cycles", type=int, default=3, metavar="N",
                   help="local cycles in a row with a NaN/Inf loss, each dropped and retried from the global "
                        "model, before the agent gives up with exit 4 (default 3)")
    p.add_argument("--no-progress", action="store_true", help="no status line")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _usage_problem(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot work (one line), or None."""
    if not args.server:
        return "--server URL (or HERMES_SERVER) is required"
    problem = check_server_url(args.server)
    if problem:
        return problem
    if args.slowdown < 1.0:
        return f"--slowdown {args.slowdown:g}: must be >= 1 (1 = this device's own speed)"
    if (args.slowdown_mode == "nominal") != (args.nominal_sample_ms is not None) or not (
            args.nominal_sample_ms is None or 0 < args.nominal_sample_ms < math.inf):
        return "--nominal-sample-ms (a number of ms > 0) goes with --slowdown-mode nominal, and only with it"
    for flag, value in (("--threads", args.threads), ("--cores", args.cores)):
        if value is not None and value < 0:
            return f"{flag} {value:g}: must be >= 0 (0 or unset: decided from this device)"
    if args.data_plane_check_timeout < 0 or args.request_timeout <= 0 or args.connect_retries < 0:
        return "--data-plane-check-timeout must be >= 0, --request-timeout > 0 and --connect-retries >= 0"
    try:
        parse_schedule(args.slowdown_schedule)
    except ValueError as exc:
        return f"--slowdown-schedule: {exc}"
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        return "--ssl-certfile and --ssl-keyfile go together"
    for flag in ("ssl_ca_certfile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            return f"--{flag.replace('_', '-')} {path!r}: no such file"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        # kafka-python logs each failed connection attempt; the shard reader reports them once each.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    # 0 keeps its old meaning for both: decide from this device.
    args.threads, args.cores = args.threads or None, args.cores or None
    problem = _usage_problem(args)
    if problem:
        print(f"hermes-client: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        join_token = _join_token(args.join_token_file)
    except OSError as exc:
        print(f"hermes-client: --join-token-file: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    # SIGTERM/Ctrl-C end the wait for the server as they end the agent later.
    stop = threading.Event()
    agent = None

    def on_signal(signum, _frame):
        stop.set()
        if agent is not None:
            agent.request_stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = _first_contact(args, stop)
    if code is not None:
        return code
    name = args.name or default_name()

    from hermes.client.agent import Agent, AgentOptions

    agent = Agent(AgentOptions(
        server=args.server, name=name, threads=args.threads, slowdown=args.slowdown, device=args.device,
        slowdown_mode=args.slowdown_mode, nominal_sample_ms=args.nominal_sample_ms,
        request_timeout=args.request_timeout, connect_retries=args.connect_retries,
        progress=not args.no_progress, max_cycles=args.max_cycles,
        slowdown_schedule=parse_schedule(args.slowdown_schedule),
        kafka_bootstrap=args.kafka_bootstrap or None, cores=args.cores, schedule_origin=args.schedule_origin,
        join_token=join_token,
        ssl_ca_certfile=args.ssl_ca_certfile, ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
        data_plane_check_timeout=args.data_plane_check_timeout, task=args.task or None,
        max_nonfinite_cycles=max(1, args.max_nonfinite_cycles),
    ))
    if stop.is_set():
        agent.request_stop("signal during start-up")
    return _run(agent, name)


def _first_contact(args: argparse.Namespace, stop: threading.Event) -> int | None:
    """Before torch is imported: is a control plane there at all? An exit code when not."""
    try:
        tls = tls_context(args.ssl_ca_certfile, args.ssl_certfile, args.ssl_keyfile)
        first_contact(args.server, retries=args.connect_retries, ssl_context=tls, stop=stop)
    except DataPortGiven:
        print(f"hermes-client: {args.server} answers in ZeroMQ: this looks like the server's data port; the "
              "control port is the server's --port (HTTP, default 8000; the server's start-up line names both)",
              file=sys.stderr)
        return EXIT_CONFIG
    except NotReachable as exc:
        print(f"hermes-client: {exc} (is the server running, and is --server its control port?)", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (OSError, ValueError) as exc:  # unreadable certificate files
        print(f"hermes-client: TLS set-up: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if stop.is_set():
        print(f"hermes-client: stopped while waiting for the server at {args.server}", file=sys.stderr)
        return EXIT_OK
    return None


def _run(agent: Any, name: str) -> int:
    from hermes.client.agent import DataPlaneUnreachable, NameTaken
    from hermes.client.collective import CollectiveError
    from hermes.client.topology import LossNotFinite
    from hermes.client.transport import RemoteError, ServerUnreachable, StopRequested
    from hermes.common.wire import ProtocolError

    try:
        stats = agent.run()
    except StopRequested as exc:
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_OK
    except DataPlaneUnreachable as exc:
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ServerUnreachable as exc:
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except NameTaken as exc:
        print(f"hermes-client: the server refused the name {name!r}: {exc.message}", file=sys.stderr)
        return EXIT_REMOTE
    except RemoteError as exc:
        print(f"hermes-client: server refused: {exc}", file=sys.stderr)
        return EXIT_REMOTE
    except ProtocolError as exc:  # a reply this agent cannot read (another version's server?)
        print(f"hermes-client: {exc.message}", file=sys.stderr)
        return EXIT_REMOTE
    except LossNotFinite as exc:  # exit 4, as when the server refused such a push
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_REMOTE
    except CollectiveError as exc:
        print(f"hermes-client: the collective group failed: {exc}", file=sys.stderr)
        return EXIT_GROUP
    except ValueError as exc:  # a bad task (TaskError) or run config: before registering
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    log = logging.getLogger("hermes.client")
    log.info("stopped (%s): %d cycles, %d samples, %d/%d updates applied, %d refused (%d while quarantined), "
             "%d non-finite cycles dropped", agent.stop_reason or "done", stats.cycles, stats.samples,
             stats.applied, stats.pushes, stats.rejected, stats.quarantined_refusals, stats.nonfinite_cycles)
    if stats.pushes and not stats.applied and stats.refused == stats.pushes:
        # Training whose every update was thrown away is not a success.
        print(f"hermes-client: the server refused all {stats.pushes} updates of this agent; the last reason: "
              f"{stats.last_refusal or 'none given'}", file=sys.stderr)
        return EXIT_REMOTE
    if stats.quarantined_refusals:
        log.warning("%d updates were refused while this worker was quarantined", stats.quarantined_refusals)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
