"""Shard fetch throughput: Kafka reader vs ZeroMQ data plane vs a bare kafka-python consumer.

    python benchmarks/bench_kafka.py [--num-samples 100000] [--shard-size 256] [--kafka HOST:PORT] [--json PATH]

One run, the same records, printed side by side. A real ``hermes-server``
(subprocess) loads a synthetic data set and publishes its train split to
Kafka (a Tansu broker started here on loopback, or ``--kafka HOST:PORT``);
then one epoch of train shards is read, in the same seeded order cut into
the same assignments (``--assignment-shards`` shards each, as the server's
ShardQueue hands them out), by:

- ``hermes kafka reader``: ``KafkaShardReader.read`` per assignment (explicit
  assignment + seek per range, every record CRC-checked and decoded) - the
  agent's prefetch path;
- ``hermes zmq data plane``: ``FETCH_SHARD`` per shard on a ``DataClient``,
  decoded and checked the same way - the path without a broker;
- ``bare kafka-python consumer``, twice: the same assignments read the same
  way (assign + seek per record, one record per fetch, values untouched) -
  what the reader costs on top; and the whole topic in order (explicit
  assignment of every partition, seek to the beginning, poll until every
  record arrived, no decode) - the ceiling for this client library against
  this broker;
- and, to split the costs: the bare consumer plus ``decode_record`` on each
  value, our reader with one consumer instead of four (``--readers``), and
  our reader given the whole epoch as one assignment (long sequential
  ranges, no per-assignment seeks).

Each path runs ``--repeats`` times, alternating, and the median is printed
(MB/s of record bytes and records/s). Tansu keeps data in memory and grows
(about 2 GB resident after a 50 MB benchmark), so the default data set is
about 19 MB; the broker's RSS is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hermes.client.kafka_source import KafkaShardReader
from hermes.client.transport import DataClient
from hermes.common.kafka_layout import TopicLayout
from hermes.common.shards import decode_record
from hermes.common.wire import MsgType
from hermes.deploy.bench.machine import loadavg, machine_info
from hermes.deploy.procs import StartupError, free_ports, start, wait_healthy

logging.getLogger("kafka").setLevel(logging.CRITICAL)


# The servers these benchmarks start are theirs alone: a fresh join token each run.
JOIN_TOKEN = secrets.token_urlsafe(32)


def http_json(url: str, body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {JOIN_TOKEN}"},
                                 method="POST" if body is not None else "GET")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def start_server(bootstrap: str, args, log_dir: str) -> tuple[subprocess.Popen, str]:
    port, data_port = free_ports(2)
    cmd = [sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
           "--data-host", "127.0.0.1", "--data-port", str(data_port), "--preset", "asp",
           "--kafka", bootstrap, "--kafka-partitions", str(args.partitions), "--log-level", "warning",
           "--set", "dataset=synthetic", "--set", f"num_samples={args.num_samples}",
           "--set", f"shard_size={args.shard_size}", "--set", "eval_interval_seconds=1000",
           "--set", "model=mlp"]
    log_path = Path(log_dir) / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")} | {"HERMES_JOIN_TOKEN": JOIN_TOKEN}
    proc = start(cmd, log_path=log_path, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout=300, log_path=log_path, interval=0.3)
    except StartupError as exc:
        raise SystemExit(str(exc)) from None
    return proc, url


def timed(fn: Callable[[], tuple[int, int]]) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    records, nbytes = fn()
    return time.perf_counter() - t0, records, nbytes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-samples", type=int, default=100_000, help="synthetic data set size (train is 72%%)")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--assignment-shards", type=int, default=8, help="shards per assignment (default 8)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--readers", default="4:8,1:8",
                   help="KafkaShardReader settings to compare, PARALLEL:FETCH_RECORDS pairs (default 4:8,1:8: "
                        "4 consumers vs 1, fetches of up to 8 records)")
    p.add_argument("--kafka", default=None, help="HOST:PORT of a running broker (default: start Tansu here)")
    p.add_argument("--json", default=None, help="also write the figures here")
    return p


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run every path on the same records; print the table and return the figures."""
    import kafka
    from kafka import KafkaConsumer, TopicPartition
    from kafka.record import util as record_util

    info = machine_info()
    print(f"== machine: {info.get('cpu_model')} ({info.get('cpus_usable')} usable CPUs), load {loadavg()}")
    print(f"   kafka-python {kafka.__version__}; record-batch CRC32C in "
          f"{'C (crc32c package)' if record_util.crc32c_c is not None else 'pure Python (install crc32c!)'}")

    broker = None
    tmp = tempfile.mkdtemp(prefix="bench-kafka-")
    if args.kafka:
        bootstrap = args.kafka
    else:
        from hermes.deploy.broker import TansuBroker

        broker = TansuBroker(log_path=Path(tmp) / "tansu.log").start()
        bootstrap = broker.bootstrap
    server = None
    try:
        t0 = time.perf_counter()
        server, url = start_server(bootstrap, args, tmp)
        summary = http_json(url + "/v1/summary")
        topic = summary["data_plane"]["topics"]["train"]
        print(f"   broker {bootstrap} ({'Tansu, started here' if broker else 'external'}); server up and "
              f"published in {time.perf_counter() - t0:.1f}s (publish {summary['data_plane']['publish_seconds']:.2f}s)")
        layout = TopicLayout(topic["topic"], topic["partitions"], topic["shards"], topic["fingerprint"],
                             topic["max_record_bytes"], topic["bytes"])
        print(f"   topic {layout.topic}: {layout.num_shards} records, {layout.total_bytes / 1e6:.1f} MB, "
              f"{layout.partitions} partitions, record {layout.max_record_bytes / 1e3:.0f} kB")
        reg = http_json(url + "/v1/workers/register", {"name": "bench"})
        data = DataClient(reg["data_plane"], reg["worker_id"], reg["token"], timeout=30)

        rng = np.random.default_rng(0)
        order = [int(s) for s in rng.permutation(layout.num_shards)]
        k = args.assignment_shards
        assignments = [order[i:i + k] for i in range(0, len(order), k)]

        def check(record, shard) -> None:
            if record.shard != shard:
                raise SystemExit(f"shard {shard}: got {record.shard}")

        readers = {}
        for item in args.readers.split(","):
            par, _, fr = item.partition(":")
            readers[item] = KafkaShardReader(bootstrap, parallel=int(par), fetch_records=int(fr or 8))
        discarded: dict[str, int] = {}

        def kafka_reader(f: str, whole: bool = False):
            reader = readers[f]
            name = (f"hermes kafka reader{', whole epoch as 1 assignment' if whole else ''} "
                    f"[{reader.parallel} consumer{'s' if reader.parallel > 1 else ''}, fetch<={f.partition(':')[2] or 8}]")

            def run() -> tuple[int, int]:
                n = nbytes = waste = 0
                for a in ([order] if whole else assignments):
                    res = reader.read(layout.topic, layout.partitions, layout.ranges_for(a),
                                      max_record_bytes=layout.max_record_bytes)
                    if res.missing:
                        raise SystemExit(f"reader missed {res.missing}: {res.failure}")
                    for s in a:
                        check(res.records[s], s)
                    n += len(res.records)
                    nbytes += res.bytes
                    waste += res.discarded_bytes
                discarded[name] = waste
                return n, nbytes
            return name, run

        def zmq_plane() -> tuple[int, int]:
            n = nbytes = 0
            for a in assignments:
                for s in a:
                    reply = data.request(MsgType.FETCH_SHARD, {"shard": s})
                    raw = reply.payload.flat().numpy()
                    check(decode_record(memoryview(raw)), s)
                    n += 1
                    nbytes += len(raw)
            return n, nbytes

        def bare(decode: bool):
            def run() -> tuple[int, int]:
                c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
                try:
                    tps = [TopicPartition(layout.topic, q) for q in range(layout.partitions)]
                    c.assign(tps)
                    c.seek_to_beginning(*tps)
                    n = nbytes = 0
                    while n < layout.num_shards:
                        for tp, recs in c.poll(timeout_ms=1000).items():
                            for r in recs:
                                if decode:
                                    check(decode_record(memoryview(r.value)), r.offset * layout.partitions + tp.partition)
                                n += 1
                                nbytes += len(r.value)
                    return n, nbytes
                finally:
                    c.close()
            return run

        def bare_seeking() -> tuple[int, int]:
            """The same assignments with a bare consumer: assign + seek per record, one record per fetch."""
            c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                              fetch_max_bytes=layout.max_record_bytes, fetch_max_wait_ms=100)
            try:
                n = nbytes = 0
                for a in assignments:
                    for s in sorted(a, key=lambda s: (s % layout.partitions, s // layout.partitions)):
                        tp = TopicPartition(layout.topic, s % layout.partitions)
                        c.assign([tp])
                        c.seek(tp, s // layout.partitions)
                        got = None
                        while got is None:
                            for recs in c.poll(timeout_ms=1000).values():
                                for r in recs:
                                    if r.offset == s // layout.partitions:
                                        got = r.value
                        n += 1
                        nbytes += len(got)
                return n, nbytes
            finally:
                c.close()

        paths: list[tuple[str, Callable[[], tuple[int, int]]]] = []
        for f in readers:
            paths.append(kafka_reader(f))
        paths.append(("hermes zmq data plane (FETCH_SHARD)", zmq_plane))
        paths.append(("bare kafka-python consumer, same assignments (seek per record)", bare_seeking))
        paths.append(("bare kafka-python consumer, whole topic in order (no decode)", bare(False)))
        paths.append(("bare kafka-python consumer, whole topic in order + decode_record", bare(True)))
        for f in readers:
            paths.append(kafka_reader(f, whole=True))

        times: dict[str, list[float]] = {name: [] for name, _ in paths}
        sizes: dict[str, tuple[int, int]] = {}
        for _name, fn in paths:  # warm-up: connections, caches
            fn()
        for rep in range(args.repeats):
            for name, fn in (paths if rep % 2 == 0 else paths[::-1]):
                secs, n, nbytes = timed(fn)
                times[name].append(secs)
                sizes[name] = (n, nbytes)
        rows = []
        for name, _ in paths:
            secs = statistics.median(times[name])
            n, nbytes = sizes[name]
            rows.append({"path": name, "seconds": round(secs, 4), "records": n, "mb": round(nbytes / 1e6, 3),
                         "mb_per_s": round(nbytes / 1e6 / secs, 1), "records_per_s": round(n / secs, 1),
                         "read_ahead_mb": round(discarded.get(name, 0) / 1e6, 2) if name in discarded else None})
        print(f"\n== one epoch of train shards: {layout.num_shards} records, {layout.total_bytes / 1e6:.1f} MB, "
              f"assignments of {k} shards, median of {args.repeats}")
        print(f"   {'path':<74} {'seconds':>8} {'MB/s':>8} {'records/s':>10} {'read-ahead MB':>13}")
        for r in rows:
            ra = "-" if r["read_ahead_mb"] is None else f"{r['read_ahead_mb']:.2f}"
            print(f"   {r['path']:<74} {r['seconds']:>8.3f} {r['mb_per_s']:>8.1f} {r['records_per_s']:>10.1f} {ra:>13}")
        rss = broker.rss_bytes() if broker else 0
        if broker:
            print(f"   Tansu resident memory at the end: {rss / 1e6:.0f} MB")
        for reader in readers.values():
            reader.close()
        data.close()
        result = {"machine": info, "loadavg": loadavg(), "bootstrap": bootstrap, "topic": layout.describe(),
                  "rows": rows, "broker_rss_bytes": rss}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        if broker is not None:
            broker.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    measure(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
