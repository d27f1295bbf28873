"""``hermes-server shards publish``: write a data set's shard records into Kafka.

The same step the server runs in its lifespan when started with ``--kafka``,
as a command of its own: run it ahead of a run, or again after a broker that
keeps its data in memory (Tansu) restarted. Topics are named from the data
set and a content fingerprint and the layout is deterministic, so publishing
the same data again is a no-op, and republishing after data loss puts every
shard back at the offset agents were assigned.

    hermes-server shards publish --kafka 127.0.0.1:9092 --set dataset=digits
    python -m hermes.server.shards_publish --kafka kafka:9092 --preset hermes --kafka-partitions 8
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from hermes.common.cli_env import HermesParser, deprecated_alias
from hermes.common.config import PRESETS, ConfigError


def build_parser() -> argparse.ArgumentParser:
    # The server's names and twins for the same settings (--kafka-partitions, HERMES_KAFKA_BOOTSTRAP ...).
    p = HermesParser(prog="hermes-server shards publish", description=__doc__.split("\n\n")[0], version=True,
                     env_names={"kafka": "HERMES_KAFKA_BOOTSTRAP"})
    p.add_argument("--kafka", metavar="HOST:PORT", help="Kafka bootstrap address")
    p.add_argument("--kafka-partitions", type=int, default=4, help="partitions per topic (default 4)")
    p.add_argument("--kafka-retries", type=int, default=5,
                   help="connection retries with exponential backoff (default 5)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="run preset (only its data settings matter)")
    p.add_argument("--task", default=None, metavar="REF",
                   help="the task whose training data to publish (default: the config's, builtin) [HERMES_TASK]")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override (dataset, num_samples, shard_size, seed, ...), repeatable")
    p.add_argument("--json", action="store_true", help="print the topic layout as JSON")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    deprecated_alias(p, "--partitions", "--kafka-partitions")
    deprecated_alias(p, "--retries", "--kafka-retries")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kafka-python logs every failed connection attempt; our retry loop says it once.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    prog = "hermes-server shards publish"
    if not args.kafka:
        print(f"{prog}: --kafka HOST:PORT (or HERMES_KAFKA_BOOTSTRAP) is required", file=sys.stderr)
        return 2
    if args.kafka_partitions < 1:
        print(f"{prog}: --kafka-partitions must be >= 1", file=sys.stderr)
        return 2
    try:
        import kafka  # noqa: F401
    except ImportError as exc:
        print(f"{prog}: needs kafka-python: pip install 'hermes-edge[kafka]' ({exc})", file=sys.stderr)
        return 2
    from hermes.common.kafka_layout import KafkaUnavailable
    from hermes.common.task_registry import resolve_task
    from hermes.server.kafka_publish import KafkaOptions, PublishError, publish_stores
    from hermes.server.settings import ServerSettings, parse_set
    from hermes.server.shardstore import load_splits, split_stores

    try:
        settings = ServerSettings(**{k: v for k, v in {"preset": args.preset, "config": args.config, "task": args.task,
                                                        "run": parse_set(args.set)}.items() if v is not None})
        config = settings.run_config()
        # A task that cannot be loaded (TaskError, a ValueError) is a configuration error too.
        task = resolve_task(config.task, config)
        train, validation, test = load_splits(config, task)
    except (ConfigError, ValueError) as exc:
        print(f"{prog}: configuration error: {exc}", file=sys.stderr)
        return 2
    opts = KafkaOptions(args.kafka, partitions=args.kafka_partitions, retries=args.kafka_retries)
    try:
        published = publish_stores(*split_stores(train, validation, test, config.shard_size,
                                                   task.name or config.dataset),
                                   dataset=config.dataset, opts=opts)
    except KafkaUnavailable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 3
    except PublishError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    out = {split: v.layout.describe() | {"reused": v.reused, "seconds": round(v.seconds, 3)}
           for split, v in published.items()}
    if args.json:
        print(json.dumps({"bootstrap": args.kafka, **out}, indent=2))
    else:
        for split, d in out.items():
            print(f"{split:<10} {d['topic']}  {d['shards']} records, {d['bytes'] / 1e6:.2f} MB, "
                  f"{d['partitions']} partitions, {'already published' if d['reused'] else 'published'} "
                  f"in {d['seconds']:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
