"""``hermes-server``: start the parameter server under uvicorn."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from hermes.common.config import PRESETS, ConfigError


def _parse_set(items: list[str]) -> dict[str, Any]:
    """``--set lr=0.1 --set model_kwargs='{"hidden": [64]}'``: values are JSON when they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hermes-server", description="Hermes parameter server (FastAPI + ZeroMQ).",
        epilog="Publish a data set's shard records to Kafka ahead of a run (or again after a broker "
               "that keeps data in memory restarted): hermes-server shards publish --help",
    )
    p.add_argument("--host", default="0.0.0.0", help="control-plane bind address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000, help="control-plane HTTP port (default 8000)")
    p.add_argument("--data-host", default="0.0.0.0", help="data-plane bind address")
    p.add_argument("--data-port", type=int, default=0, help="data-plane ZeroMQ port (0 = pick a free one)")
    p.add_argument("--advertise-host", default="127.0.0.1", help="host agents use to reach the data plane")
    p.add_argument("--collective-port", type=int, default=None,
                   help="topology collective: port of the rendezvous store, MASTER_PORT (default: a free one)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="named policy bundle (default asp)")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override, repeatable")
    p.add_argument("--out", dest="out_dir", help="directory for events.jsonl and server_summary.json")
    p.add_argument("--max-workers", type=int, default=256)
    p.add_argument("--max-message-bytes", type=int, default=None)
    p.add_argument("--kafka", dest="kafka_bootstrap", metavar="HOST:PORT", default=None,
                   help="publish shard records to this Kafka broker and have agents read them from it "
                        "[HERMES_KAFKA_BOOTSTRAP]; without it records travel over the ZeroMQ data plane")
    p.add_argument("--kafka-partitions", type=int, default=None, help="partitions per shard topic (default 4)")
    p.add_argument("--kafka-retries", type=int, default=None,
                   help="broker connection retries with exponential backoff before giving up (default 5)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["shards", "publish"]:
        from hermes.server.shards_publish import main as publish_main

        return publish_main(argv[2:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        # kafka-python logs every failed connection attempt; our retry loops report them once each.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        import uvicorn

        from hermes.server.app import create_app
        from hermes.server.settings import ServerSettings
    except ImportError as exc:
        print(f"hermes-server needs the server extra: pip install 'hermes-edge[server]' ({exc})", file=sys.stderr)
        return 2
    fields: dict[str, Any] = {
        "data_host": args.data_host,
        "data_port": args.data_port,
        "advertise_host": args.advertise_host,
        "preset": args.preset,
        "config": args.config,
        "out_dir": args.out_dir,
        "max_workers": args.max_workers,
        "kafka_bootstrap": args.kafka_bootstrap,
        "kafka_partitions": args.kafka_partitions,
        "kafka_retries": args.kafka_retries,
        "collective_port": args.collective_port,
    }
    if args.max_message_bytes:
        fields["max_message_bytes"] = args.max_message_bytes
    try:
        fields["run"] = _parse_set(args.set)
        settings = ServerSettings(**{k: v for k, v in fields.items() if v is not None})
        app = create_app(settings)
    except (ConfigError, ValueError) as exc:
        print(f"hermes-server: configuration error: {exc}", file=sys.stderr)
        return 2
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
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
