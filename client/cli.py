"""``hermes-client --server URL``: run an edge agent."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys

EXIT_OK, EXIT_CONFIG, EXIT_UNREACHABLE, EXIT_REMOTE, EXIT_GROUP = 0, 2, 3, 4, 5


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"HERMES_{name}", default)


def _env_or(name: str, default: str) -> str:
    """The environment twin of a flag that always has a value."""
    return os.environ.get(f"HERMES_{name}", default)


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
    return _env("JOIN_TOKEN") or None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hermes-client",
        description="Hermes edge agent: joins a parameter server and trains. "
        "Every flag has an environment variable twin (HERMES_SERVER, HERMES_NAME, ...).",
    )
    p.add_argument("--server", default=_env("SERVER"), help="control-plane URL, e.g. http://10.0.0.5:8000 [HERMES_SERVER]")
    p.add_argument("--name", default=_env("NAME", socket.gethostname()), help="stable worker name [HERMES_NAME]")
    p.add_argument("--threads", type=int, default=int(_env_or("THREADS", "0")) or None,
                   help="torch intra-op threads (default: the cores this process may use, from its CPU affinity "
                        "and cgroup quota) [HERMES_THREADS]")
    p.add_argument("--slowdown", type=float, default=float(_env_or("SLOWDOWN", "1.0")),
                   help="emulate a device this many times slower (>= 1) [HERMES_SLOWDOWN]")
    p.add_argument("--slowdown-schedule", default=_env("SLOWDOWN_SCHEDULE", ""),
                   help="speed changes mid-run as SECONDS:SLOWDOWN pairs, e.g. '30:8,60:1' [HERMES_SLOWDOWN_SCHEDULE]")
    p.add_argument("--device", default=_env("DEVICE", "auto"), help="auto, cpu, cuda, cuda:N [HERMES_DEVICE]")
    p.add_argument("--request-timeout", type=float, default=float(_env_or("REQUEST_TIMEOUT", "30")),
                   help="seconds to wait for a data-plane reply [HERMES_REQUEST_TIMEOUT]")
    p.add_argument("--connect-retries", type=int, default=int(_env_or("CONNECT_RETRIES", "8")),
                   help="registration retries (exponential backoff) before giving up [HERMES_CONNECT_RETRIES]")
    p.add_argument("--kafka-bootstrap", default=_env("KAFKA_BOOTSTRAP"),
                   help="Kafka address to read shard records from instead of the one the server names "
                        "[HERMES_KAFKA_BOOTSTRAP]")
    p.add_argument("--schedule-origin", type=float, default=None,
                   help="unix time the --slowdown-schedule seconds count from (default: the agent's start)")
    p.add_argument("--cores", type=float, default=float(_env_or("CORES", "0")) or None,
                   help="compute capacity this device declares, in cores or FLOPs (any unit consistent across "
                        "the cluster); the static allocation policy splits batches by it [HERMES_CORES]")
    p.add_argument("--join-token-file", default=_env("JOIN_TOKEN_FILE"), metavar="FILE",
                   help="file whose first line is the server's join token; or set HERMES_JOIN_TOKEN "
                        "(never a flag: command lines are visible to every user)")
    p.add_argument("--ssl-ca-certfile", default=_env("SSL_CA_CERTFILE"), metavar="PEM",
                   help="CA bundle to verify an https:// server with (default: the system's) [HERMES_SSL_CA_CERTFILE]")
    p.add_argument("--ssl-certfile", default=_env("SSL_CERTFILE"), metavar="PEM",
                   help="client certificate, for servers that require one [HERMES_SSL_CERTFILE]")
    p.add_argument("--ssl-keyfile", default=_env("SSL_KEYFILE"), metavar="PEM",
                   help="private key of --ssl-certfile [HERMES_SSL_KEYFILE]")
    p.add_argument("--task", default=_env("TASK"), metavar="REF",
                   help="the task to train: MODULE:ATTR, path/to/file.py:ATTR or an installed task name; it must be "
                        "the server's (checked at registration). Default: the reference the server names "
                        "[HERMES_TASK]")
    p.add_argument("--max-cycles", type=int, default=None, help="stop after this many training cycles")
    p.add_argument("--no-progress", action="store_true", help="no status line")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"), choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        # kafka-python logs each failed connection attempt; the shard reader reports them once each.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    if not args.server:
        print("hermes-client: --server URL (or HERMES_SERVER) is required", file=sys.stderr)
        return EXIT_CONFIG
    if args.slowdown < 1.0 or (args.threads is not None and args.threads < 1) or (args.cores is not None and args.cores <= 0):
        print("hermes-client: --slowdown must be >= 1, --threads >= 1 and --cores > 0", file=sys.stderr)
        return EXIT_CONFIG

    try:
        schedule = parse_schedule(args.slowdown_schedule)
    except ValueError as exc:
        print(f"hermes-client: --slowdown-schedule: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    try:
        join_token = _join_token(args.join_token_file)
    except OSError as exc:
        print(f"hermes-client: --join-token-file: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        print("hermes-client: --ssl-certfile and --ssl-keyfile go together", file=sys.stderr)
        return EXIT_CONFIG
    for flag in ("ssl_ca_certfile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            print(f"hermes-client: --{flag.replace('_', '-')} {path!r}: no such file", file=sys.stderr)
            return EXIT_CONFIG

    from hermes.client.agent import Agent, AgentOptions
    from hermes.client.collective import CollectiveError
    from hermes.client.transport import RemoteError, ServerUnreachable, StopRequested

    agent = Agent(AgentOptions(
        server=args.server, name=args.name, threads=args.threads, slowdown=args.slowdown, device=args.device,
        request_timeout=args.request_timeout, connect_retries=args.connect_retries,
        progress=not args.no_progress, max_cycles=args.max_cycles, slowdown_schedule=schedule,
        kafka_bootstrap=args.kafka_bootstrap or None, cores=args.cores, schedule_origin=args.schedule_origin,
        join_token=join_token,
        ssl_ca_certfile=args.ssl_ca_certfile, ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
        task=args.task or None,
    ))

    def on_signal(signum, _frame):
        agent.request_stop(f"signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stats = agent.run()
    except StopRequested as exc:
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_OK
    except ServerUnreachable as exc:
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except RemoteError as exc:
        print(f"hermes-client: server refused: {exc}", file=sys.stderr)
        return EXIT_REMOTE
    except CollectiveError as exc:
        print(f"hermes-client: the collective group failed: {exc}", file=sys.stderr)
        return EXIT_GROUP
    except ValueError as exc:  # a bad task (TaskError) or run config: before registering
        print(f"hermes-client: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.getLogger("hermes.client").info(
        "stopped (%s): %d cycles, %d samples, %d/%d updates applied",
        agent.stop_reason or "done", stats.cycles, stats.samples, stats.applied, stats.pushes,
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
