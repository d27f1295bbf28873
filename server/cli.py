"""``hermes-server``: start the parameter server under uvicorn.

Before anything is written (OUT, the admin token, a checkpoint) the server
checks what can go wrong at start-up and says so in one line, exit 2:
settings from flags and ``HERMES_*`` alike (``console_checks``), the run
config, the output folder and the ports (``preflight``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from hermes.common.config import PRESETS, ConfigError
from hermes.server.preflight import (
    PreflightError,
    UsageParser,
    add_env_twins,
    claim_ports,
    explain,
    operator_fields,
    reachability_warning,
    version_text,
)

if TYPE_CHECKING:
    from hermes.common.task import Task


def build_parser() -> argparse.ArgumentParser:
    p = UsageParser(
        prog="hermes-server", description="Hermes parameter server (FastAPI + ZeroMQ). Every flag has an "
        "environment twin, HERMES_<NAME> (shown in brackets); a flag beats its twin.",
        epilog="Publish a data set's shard records to Kafka ahead of a run (or again after a broker "
               "that keeps data in memory restarted): hermes-server shards publish --help",
    )
    p.add_argument("--version", action="version", version=version_text("hermes-server"))
    p.add_argument("--host", help="control-plane bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="control-plane HTTP port (default 8000)")
    p.add_argument("--data-host", help="data-plane bind address (default: --host's)")
    p.add_argument("--data-port", type=int, help="data-plane ZeroMQ port (default 0: pick a free one)")
    p.add_argument("--advertise-host", help="host agents use to reach the data plane (default 127.0.0.1)")
    p.add_argument("--collective-port", type=int, default=None,
                   help="topology collective: port of the rendezvous store, MASTER_PORT (default: a free one)")
    p.add_argument("--preset", help=f"named policy bundle (default hermes): {', '.join(sorted(PRESETS))}")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override, repeatable")
    p.add_argument("--target-accuracy", type=float, default=None, metavar="ACC",
                   help="stop the run once a test evaluation reaches this accuracy, 0 < ACC <= 1 "
                        "[HERMES_TARGET_ACCURACY]; the best model is kept as OUT/model-best.safetensors")
    p.add_argument("--out", dest="out_dir",
                   help="directory for events.jsonl, server_summary.json, model-final.safetensors and "
                        "model-best.safetensors (default: a new runs/<UTC time>-<preset>); one that holds another "
                        "run's outputs is refused unless --resume or --overwrite")
    p.add_argument("--overwrite", action="store_true", default=None,
                   help="replace another run's outputs in --out (and its checkpoint in --checkpoint-dir)")
    p.add_argument("--max-workers", type=int, help="most workers registered at once (default 256)")
    run = p.add_argument_group("the task and when the run ends")
    run.add_argument("--task", default=None, metavar="REF",
                     help="what to train: MODULE:ATTR, path/to/file.py:ATTR (a hermes.Task or a function returning "
                          "one) or a name installed under the hermes.tasks entry points; default 'builtin' (the "
                          "config's model and dataset)")
    run.add_argument("--target", default=None, metavar="METRIC=VALUE",
                     help="stop once an evaluation reaches this, e.g. r2=0.8; the task says whether higher or "
                          "lower is better")
    run.add_argument("--max-epochs", type=float, default=None, help="stop after this many epochs")
    run.add_argument("--max-updates", type=int, default=None, help="stop after this many model updates")
    run.add_argument("--max-seconds", type=float, default=None, help="stop this many seconds into the run")
    run.add_argument("--exit-when-done", action="store_true", default=None,
                     help="once the run stops (target, budget or /v1/stop), let the agents leave, write the "
                          "summary and models, and exit 0")
    p.add_argument("--max-message-bytes", type=int, default=None)
    p.add_argument("--kafka", dest="kafka_bootstrap", metavar="HOST:PORT", default=None,
                   help="publish shard records to this Kafka broker and have agents read them from it "
                        "[HERMES_KAFKA_BOOTSTRAP]; without it records travel over the ZeroMQ data plane")
    p.add_argument("--kafka-partitions", type=int, default=None, help="partitions per shard topic (default 4)")
    p.add_argument("--kafka-retries", type=int, default=None,
                   help="broker connection retries with exponential backoff before giving up (default 5)")
    sec = p.add_argument_group(
        "security", "The join token comes from HERMES_JOIN_TOKEN or --join-token-file (never a flag: command "
        "lines are visible to every user); the server refuses to start without one unless --insecure.")
    sec.add_argument("--join-token-file", metavar="FILE", help="file whose first line is the join token")
    sec.add_argument("--admin-token-file", metavar="FILE",
                     help="file whose first line is the admin token for /v1/stop [HERMES_ADMIN_TOKEN]; "
                          "default: a random one written to OUT/admin.token")
    sec.add_argument("--insecure", action="store_true",
                     help="accept agents without a join token (trusted networks only)")
    sec.add_argument("--protect-reads", action="store_true",
                     help="the read endpoints (status, workers, config, summary, history, metrics) need the join or "
                          "the admin token as a bearer token; /healthz stays open, and so does the /ui page, "
                          "which takes the token from /ui#token=... or asks for it [HERMES_PROTECT_READS]")
    sec.add_argument("--screening", choices=["on", "off"], default=None,
                     help="screen every update before it is folded (default on) [HERMES_SCREENING]")
    sec.add_argument("--screening-norm-factor", type=float, default=None, metavar="K",
                     help="refuse an update whose norm exceeds K x the median of recent accepted ones (default 32)")
    sec.add_argument("--quarantine-after", type=int, default=None, metavar="N",
                     help="refuse every later push of a worker refused N times in a row (default 5; 0 = never)")
    sec.add_argument("--ssl-certfile", metavar="PEM", help="TLS certificate of the control plane")
    sec.add_argument("--ssl-keyfile", metavar="PEM", help="private key of --ssl-certfile")
    sec.add_argument("--ssl-ca-certfile", metavar="PEM",
                     help="CA bundle to verify agents' client certificates with (mutual TLS: agents must "
                          "present one)")
    sec.add_argument("--register-rate", type=float, default=None,
                     help="registrations per second per client address (default 2; 0 = no limit)")
    sec.add_argument("--register-burst", type=int, default=None, help="registration burst per address (default 32)")
    sec.add_argument("--http-read-timeout", type=float, default=None, dest="http_read_timeout_seconds",
                     help="seconds to wait for each chunk of a request body before answering 408 (default 10)")
    sec.add_argument("--replay-window", type=float, default=None, dest="replay_window_seconds",
                     help="seconds a signed data-plane message stays valid (default 300)")
    ft = p.add_argument_group("fault tolerance")
    ft.add_argument("--heartbeat-interval", type=float, default=None, dest="heartbeat_interval_seconds",
                    help="seconds between agent heartbeats (default 5)")
    ft.add_argument("--heartbeat-timeout", type=float, default=None, dest="heartbeat_timeout_seconds",
                    help="silence after which a worker is marked lost (default 30; 0 = never)")
    ft.add_argument("--checkpoint-dir", metavar="DIR", help="write checkpoints here [HERMES_CHECKPOINT_DIR]")
    ft.add_argument("--checkpoint-interval", type=float, default=None, dest="checkpoint_interval_seconds",
                    help="seconds between checkpoints (default 60; one is also written on shutdown)")
    ft.add_argument("--resume", metavar="DIR", help="continue the run checkpointed in DIR (and keep checkpointing there)")
    ft.add_argument("--resume-truncate-corrupt", action="store_true", default=None, dest="resume_truncate_corrupt",
                    help="with --resume: resume past a damaged journal record, skipping it and replaying the verified "
                         "records after it (refused by default, naming how many would be lost) [HERMES_RESUME_TRUNCATE_CORRUPT=1]")
    ft.add_argument("--no-durable-acks", dest="durable_acks", action="store_false", default=None,
                    help="acknowledge updates without journaling them first (a crash then loses every update "
                         "since the last checkpoint)")
    p.add_argument("--tensorboard", dest="tensorboard_dir", metavar="DIR", default=None,
                   help="write TensorBoard scalars (accuracy, loss, per-worker cycle time, MBS, DSS, gate decisions, "
                        "messages) to DIR [HERMES_TENSORBOARD_DIR]; the live page is /ui either way")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="(default info)")
    p.add_argument("--access-log", action="store_true", default=None,
                   help="log every HTTP request; by default successful heartbeats and status polls are not logged")
    p.add_argument("--progress-interval", type=float, dest="progress_interval_seconds", metavar="SECONDS",
                   help="seconds between progress lines (version, metrics, workers, samples/s, what a barrier "
                        "waits for); default 10, 0 = none")
    add_env_twins(p)
    return p


def ssl_options(args: Any) -> dict[str, Any]:
    """uvicorn's TLS arguments (from the settings); with a CA bundle, clients must present a certificate it signed."""
    import ssl

    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        raise ConfigError("--ssl-certfile and --ssl-keyfile go together")
    if args.ssl_ca_certfile and not args.ssl_certfile:
        raise ConfigError("--ssl-ca-certfile (client certificates) needs --ssl-certfile and --ssl-keyfile")
    for flag in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certfile"):
        path = getattr(args, flag)
        if path and not os.path.isfile(path):
            raise ConfigError(f"--{flag.replace('_', '-')} {path!r}: no such file")
    if not args.ssl_certfile:
        return {}
    out: dict[str, Any] = {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile}
    if args.ssl_ca_certfile:
        out |= {"ssl_ca_certs": args.ssl_ca_certfile, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return out


def _writable(directory: str) -> None:
    """A --tensorboard DIR that cannot be written is a configuration error before uvicorn starts."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--tensorboard {directory!r}: cannot create it ({exc.strerror})") from None
    if not os.access(directory, os.W_OK):
        raise ConfigError(f"--tensorboard {directory!r}: not writable by this user")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["shards", "publish"]:
        from hermes.server.shards_publish import main as publish_main

        return publish_main(argv[2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from pydantic import ValidationError

        from hermes.server.settings import ServerSettings, parse_set
    except ImportError as exc:
        print(f"hermes-server needs the server extra: pip install 'hermes-edge[server]' ({exc})", file=sys.stderr)
        return 2
    fields: dict[str, Any] = {
        "data_host": args.data_host,
        "data_port": args.data_port,
        "advertise_host": args.advertise_host,
        "preset": args.preset,
        "target_accuracy": args.target_accuracy,
        "task": args.task,
        "target": args.target,
        "max_epochs": args.max_epochs,
        "max_updates": args.max_updates,
        "max_seconds": args.max_seconds,
        "config": args.config,
        "out_dir": args.out_dir,
        "max_workers": args.max_workers,
        "kafka_bootstrap": args.kafka_bootstrap,
        "kafka_partitions": args.kafka_partitions,
        "kafka_retries": args.kafka_retries,
        "collective_port": args.collective_port,
        "join_token_file": args.join_token_file,
        "admin_token_file": args.admin_token_file,
        "register_rate": args.register_rate,
        "register_burst": args.register_burst,
        "replay_window_seconds": args.replay_window_seconds,
        "http_read_timeout_seconds": args.http_read_timeout_seconds,
        "heartbeat_interval_seconds": args.heartbeat_interval_seconds,
        "heartbeat_timeout_seconds": args.heartbeat_timeout_seconds,
        "checkpoint_dir": args.resume or args.checkpoint_dir,
        "checkpoint_interval_seconds": args.checkpoint_interval_seconds,
        "durable_acks": args.durable_acks,
        "resume_truncate_corrupt": args.resume_truncate_corrupt,
        "tensorboard_dir": args.tensorboard_dir,
    }
    if args.exit_when_done:
        fields["exit_when_done"] = True
    if args.insecure:
        fields["insecure"] = True
    if args.protect_reads:
        fields["protect_reads"] = True
    if args.resume:
        if args.checkpoint_dir and args.checkpoint_dir != args.resume:
            print("hermes-server: --resume DIR continues checkpointing in DIR; drop --checkpoint-dir",
                  file=sys.stderr)
            return 2
        fields["resume"] = True
    if args.max_message_bytes:
        fields["max_message_bytes"] = args.max_message_bytes
    screening = {k: v for k, v in (("enabled", None if args.screening is None else args.screening == "on"),
                                   ("norm_factor", args.screening_norm_factor),
                                   ("quarantine_after", args.quarantine_after)) if v is not None}
    if screening:
        fields["screening"] = screening
    fields |= operator_fields(args)
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        if args.set:  # only when given: an empty --set must not hide HERMES_RUN
            given["run"] = parse_set(args.set)
        settings = ServerSettings(**given)
    except ValidationError as exc:
        print(f"hermes-server: configuration error: {explain(exc, given, parser)}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"hermes-server: configuration error: {exc}", file=sys.stderr)
        return 2
    return serve(settings)


def serve(settings: Any) -> int:
    """Check the run config, OUT and the ports (nothing written yet), then build the app and run uvicorn."""
    from hermes.server.console import configure_logging
    from hermes.server.outdir import OutDirError, check_out_dir, default_out_dir

    configure_logging(settings.log_level)
    try:
        config = settings.run_config()  # a typo'd key is named here, with the key it was probably meant to be
        # The tokens before the task: a missing join token is refused in ~3 s (imports), not after
        # the task's data set is loaded and checked (~8 s for the default digits, 2026-11-26).
        from hermes.server.credentials import Credentials

        Credentials(settings)
        default_out = settings.out_dir is None
        if default_out:
            settings = settings.model_copy(update={"out_dir": str(default_out_dir(config.preset))})
        check_out_dir(settings.out_dir, resume=settings.resume, overwrite=settings.overwrite)
        tls = ssl_options(settings)
        claim_ports(settings, hold=False)
        if settings.tensorboard_dir:
            _writable(settings.tensorboard_dir)
        if settings.checkpoint_dir:
            # A wrong --resume is refused before the task's data is loaded (torch only where checkpoints are asked for).
            from hermes.server.checkpoint import CheckpointError, check_directory, check_resumable

            try:
                meta = check_directory(settings.checkpoint_dir, resume=settings.resume, overwrite=settings.overwrite)
                if meta is not None:
                    # A missing or truncated model file, or a damaged journal record: one line, exit 2.
                    check_resumable(settings.checkpoint_dir, meta, truncate_corrupt=settings.resume_truncate_corrupt)
            except CheckpointError as exc:
                raise ConfigError(str(exc)) from None
        # The task before any port listens: a broken one is refused with nothing listening, and
        # fastapi/uvicorn/the app are not imported for it (0.5-0.7 s, python -X importtime, 2026-11-27).
        from hermes.common.task_registry import check_task, resolve_task

        task = resolve_task(config.task, config)
        check_task(task, config, role="server")
        control = claim_ports(settings)
    except (ConfigError, ValueError, OutDirError) as exc:
        print(f"hermes-server: configuration error: {exc}", file=sys.stderr)
        return 2
    except PreflightError as exc:
        print(f"hermes-server: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # the checkpoint module without the server extra
        print(f"hermes-server needs the server extra: pip install 'hermes-edge[server]' ({exc})", file=sys.stderr)
        return 2
    warning = reachability_warning(settings)
    if warning is not None:
        print(f"hermes-server: warning: {warning}", file=sys.stderr)
    try:
        return _run(settings, tls, control, task, default_out=default_out)
    finally:
        control.close()


def _run(settings: Any, tls: dict[str, Any], control: Any, task: Task, *, default_out: bool) -> int:
    try:
        import uvicorn

        from hermes.server.app import create_app
        from hermes.server.checkpoint import CheckpointError
        from hermes.server.outdir import OutDirError
    except ImportError as exc:
        print(f"hermes-server needs the server extra: pip install 'hermes-edge[server]' ({exc})", file=sys.stderr)
        return 2
    try:
        app = create_app(settings, task)
    except (ConfigError, ValueError, CheckpointError, OutDirError, OSError) as exc:
        print(f"hermes-server: configuration error: {exc}", file=sys.stderr)
        return 2
    if default_out:  # said once the run is sure to start there
        print(f"hermes-server: no --out given: this run's outputs go to {settings.out_dir}", file=sys.stderr)
    if settings.kafka_bootstrap:
        # Fail before uvicorn starts, with the address in the message; the
        # lifespan then publishes (and would fail the same way).
        from hermes.common.kafka_layout import KafkaUnavailable
        from hermes.server.kafka_publish import KafkaOptions, wait_for_broker

        try:
            wait_for_broker(KafkaOptions(settings.kafka_bootstrap, retries=settings.kafka_retries))
        except ImportError as exc:
            print(f"hermes-server: --kafka needs kafka-python: pip install 'hermes-edge[kafka]' ({exc})",
                  file=sys.stderr)
            return 2
        except KafkaUnavailable as exc:
            print(f"hermes-server: {exc}", file=sys.stderr)
            return 3
    # On the socket claimed above: uvicorn binds nothing itself, so no port can be lost between the check
    # and the start (uvicorn used to run the app's start-up, then fail to bind and shut it down again).
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                                           timeout_graceful_shutdown=10, **tls))
    # --exit-when-done: the app ends the process as SIGTERM would (lifespan shutdown, files written).
    app.state.exit_now = lambda: setattr(server, "should_exit", True)
    try:
        server.run(sockets=[control])
    except KeyboardInterrupt:
        pass
    # As uvicorn.run: a start-up that failed (the app's lifespan refused) is exit 3.
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
