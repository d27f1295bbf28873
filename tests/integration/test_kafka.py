"""Shard records through a real Kafka-protocol broker (Tansu on loopback).

Publishing and reading with explicit partition assignment and seek; corrupt
records; an unreachable broker; a broker restart mid-read; the server's WORK
replies naming Kafka ranges; the agent's prefetcher falling back to the
ZeroMQ data plane; and a testbed run with ``--kafka auto``.

Restart policy under test: Tansu keeps data in memory, so a restart loses
every topic. Both outcomes are covered: (1) the data is republished (the
deterministic layout puts every shard back at its offset) and the reader
resumes from the next unread assigned offset; (2) nobody republishes and the
reader reports exactly the unread shards as missing, which the prefetcher
then fetches over ZeroMQ. Either way each assigned shard arrives once.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import (
    _server_env,
    free_ports,
    port_is_free,
    run_testbed,
    running_server,
)

pytest.importorskip("kafka")

from hermes.client.kafka_source import KafkaShardReader
from hermes.client.prefetch import Prefetcher, Work
from hermes.client.shard_fetch import ShardFetcher, ShardStats
from hermes.client.transport import DataClient
from hermes.common.config import build_config
from hermes.common.kafka_layout import KafkaUnavailable, location, shards_in
from hermes.common.messages import KafkaRanges
from hermes.common.wire import MsgType
from hermes.server.kafka_publish import KafkaOptions, publish_split, publish_stores
from hermes.server.shardstore import ShardStore, load_splits, split_stores

pytestmark = pytest.mark.integration

logging.getLogger("kafka").setLevel(logging.CRITICAL)

# Small, fast failure budgets for the tests.
# Waits that only fail on a hang; how fast a read or a republish goes is not asserted (issue 32).
HANG_S = 120
FAST = dict(connect_retries=2, backoff=0.2, connect_timeout=1.0, stall_seconds=1.0, missing_grace=0.5)


@pytest.fixture(scope="module")
def stores():
    """digits (the embedded default): 21 train shards, 3 validation shards of 64 samples."""
    config = build_config("asp")
    # Named as the server names them: the layouts below are the server's.
    return split_stores(*load_splits(config), config.shard_size)


def _same(record, store: ShardStore, shard: int) -> bool:
    x, y = store.rows(shard)
    return record.shard == shard and np.array_equal(record.x, x.numpy()) and np.array_equal(record.y, y.numpy())


class StubDataPlane:
    """Answers FETCH_SHARD from a ShardStore, as the server does (for ShardFetcher tests)."""

    def __init__(self, store: ShardStore) -> None:
        self.store = store
        self.asked: list[int] = []

    def request(self, type_, body):
        self.asked.append(body["shard"])
        raw = np.frombuffer(self.store.record(body["shard"]), dtype=np.uint8)

        class _Payload:
            def flat(self):
                class _T:
                    def numpy(self):
                        return raw
                return _T()

        class _Reply:
            payload = _Payload()

        return _Reply()


# ---------------------------------------------------------------------------
# publish + read


def test_publish_is_idempotent_and_read_by_explicit_assignment(kafka_broker, stores):
    train, validation = stores
    opts = KafkaOptions(kafka_broker.bootstrap, partitions=4, retries=1)
    first = publish_stores(train, validation, dataset="digits", opts=opts)
    again = publish_stores(train, validation, dataset="digits", opts=opts)
    layout = first["train"].layout
    assert layout.topic.startswith("hermes-digits-train-p4-") and layout.num_shards == train.num_shards == 21
    assert again["train"].layout == layout and again["train"].reused and again["validation"].reused

    reader = KafkaShardReader(kafka_broker.bootstrap, **FAST)
    try:
        assigned = [13, 2, 17, 6, 0, 20]
        ranges = layout.ranges_for(assigned)
        seen: list[int] = []
        res = reader.read(layout.topic, 4, ranges, max_record_bytes=layout.max_record_bytes, on_record=seen.append)
        assert res.missing == [] and res.failure is None and res.corrupt == 0
        assert sorted(seen) == sorted(assigned) and sorted(res.records) == sorted(assigned)
        assert all(_same(res.records[s], train, s) for s in assigned)
        assert res.bytes == sum(len(train.record(s)) for s in assigned)
        # A whole epoch, every record once.
        res = reader.read(layout.topic, 4, layout.ranges_for(range(21)), max_record_bytes=layout.max_record_bytes)
        assert sorted(res.records) == list(range(21)) and res.missing == []
    finally:
        reader.close()

    # No consumer group was involved: explicit assignment only, nothing committed.
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    try:
        assert list(admin.list_groups()) == []
    finally:
        admin.close()


class _LazySequences(torch.utils.data.Dataset):
    """bfloat16 inputs and int64 token targets generated per index: a Dataset that is not array-backed."""

    def __len__(self) -> int:
        return 300

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn((5, 4), generator=g).to(torch.bfloat16), torch.randint(0, 50, (5,), generator=g)


def test_a_lazy_dataset_of_any_dtype_is_published_record_by_record_and_read_back(kafka_broker):
    """Publishing streams the store (a cache of 2 KiB: records are encoded again when sent) and
    the reader gets the same tensors, bfloat16 included."""
    from hermes.client.shard_fetch import records_to_tensors

    store = ShardStore(_LazySequences(), 32, name="lazy", cache_bytes=2048)
    opts = KafkaOptions(kafka_broker.bootstrap, partitions=2, retries=1)
    layout = publish_split(store, dataset="lazy", split="train", opts=opts).layout
    assert layout.num_shards == 10 and store.encoded >= 20  # fingerprint pass + send pass, nothing held
    reader = KafkaShardReader(kafka_broker.bootstrap, **FAST)
    try:
        res = reader.read(layout.topic, 2, layout.ranges_for(range(10)), max_record_bytes=layout.max_record_bytes)
    finally:
        reader.close()
    assert sorted(res.records) == list(range(10)) and res.missing == []
    x, y = records_to_tensors([res.records[s] for s in range(10)])
    assert x.dtype == torch.bfloat16 and x.shape == (300, 5, 4) and y.dtype == torch.int64
    for i in (0, 31, 32, 299):
        want_x, want_y = _LazySequences()[i]
        assert torch.equal(x[i], want_x) and torch.equal(y[i], want_y)


def test_publish_cli_step_matches_the_server_layout(kafka_broker, stores):
    train, _ = stores
    r = subprocess.run(
        [sys.executable, "-m", "hermes.server.cli", "shards", "publish", "--kafka", kafka_broker.bootstrap,
         "--preset", "asp", "--set", "dataset=digits", "--json", "--log-level", "warning"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    records = [train.record(i) for i in range(train.num_shards)]
    expected = publish_split(records, dataset="digits", split="train",
                             opts=KafkaOptions(kafka_broker.bootstrap, retries=1)).layout
    assert out["train"]["topic"] == expected.topic and out["train"]["shards"] == 21
    assert out["validation"]["shards"] == 3


# ---------------------------------------------------------------------------
# corrupt records


def _topic_with_corrupt_record(bootstrap: str, store: ShardStore, bad: int, name: str, P: int = 4) -> None:
    """The standard layout, but shard ``bad``'s array bytes are flipped (its CRC no longer matches)."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, P, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, batch_size=1, max_in_flight_requests_per_connection=1)
    for i in range(store.num_shards):
        rec = bytearray(store.record(i))
        if i == bad:
            rec[-100] ^= 0xFF
        md = producer.send(name, value=bytes(rec), partition=i % P).get(timeout=10)
        assert (md.partition, md.offset) == location(i, P)
    producer.close()


def test_corrupt_record_is_rejected_refetched_then_served_by_the_data_plane(kafka_broker, stores, caplog):
    train, _ = stores
    topic = "hermes-test-corrupt"
    _topic_with_corrupt_record(kafka_broker.bootstrap, train, bad=9, name=topic)
    assigned = [1, 9, 10, 13]
    ranges = [[p, o, o + 1] for p, o in sorted(location(s, 4) for s in assigned)]
    reader = KafkaShardReader(kafka_broker.bootstrap, max_refetch=2, **FAST)
    with caplog.at_level(logging.WARNING, logger="hermes.client.kafka_source"):
        res = reader.read(topic, 4, ranges)
    reader.close()
    assert res.missing == [9] and res.failure_kind == "corrupt"
    assert res.corrupt == 3 and res.refetches == 2  # first read + 2 refetches, all rejected
    assert sorted(res.records) == [1, 10, 13]
    assert "checksum mismatch" in caplog.text and "refetch 1/2" in caplog.text

    # The prefetcher's fetcher completes the assignment over the data plane.
    plane, stats = StubDataPlane(train), ShardStats()
    fetcher = ShardFetcher(plane, stats, reader_options=FAST)
    spec = KafkaRanges(source="kafka", bootstrap=kafka_broker.bootstrap, topic=topic, partitions=4, ranges=ranges)
    records, _ = fetcher.fetch(assigned, spec)
    fetcher.close()
    assert [r.shard for r in records] == assigned and all(_same(r, train, r.shard) for r in records)
    assert plane.asked == [9]
    rep = stats.report()
    assert rep["shard_records"] == {"kafka": 3, "zmq": 1} and rep["data_source"] == "kafka+zmq"
    assert rep["corrupt_records"] == 3 and rep["kafka_fallbacks"] == 1


def test_transient_corruption_is_cured_by_a_refetch(kafka_broker, stores, monkeypatch):
    train, validation = stores
    layout = publish_stores(train, validation, dataset="digits",
                            opts=KafkaOptions(kafka_broker.bootstrap, retries=1))["train"].layout
    import hermes.client.kafka_lane as ks

    real, flipped = ks.decode_record, []

    def flaky(buf):
        rec = real(buf)
        if rec.shard == 5 and not flipped:  # the first copy of shard 5 arrives damaged
            flipped.append(5)
            raise ks.RecordError("shard 5: checksum mismatch")
        return rec

    monkeypatch.setattr(ks, "decode_record", flaky)
    reader = KafkaShardReader(kafka_broker.bootstrap, **FAST)
    res = reader.read(layout.topic, 4, layout.ranges_for([4, 5, 6]), max_record_bytes=layout.max_record_bytes)
    reader.close()
    assert res.missing == [] and res.corrupt == 1 and res.refetches == 1
    assert sorted(res.records) == [4, 5, 6] and _same(res.records[5], train, 5)


# ---------------------------------------------------------------------------
# an unreachable broker


def test_unreachable_broker_is_a_clear_bounded_error():
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    reader = KafkaShardReader(address, connect_retries=2, backoff=0.2, connect_timeout=1.0)
    with pytest.raises(KafkaUnavailable, match=address) as info:
        reader.connect()
    # Bounded by its attempts (1 + 2 retries), counted in the message; the wall time is not asserted (issue 32).
    assert "3 attempt" in str(info.value) and info.value.bootstrap == address

    # The agent's fetcher reports it and serves the shards over the data plane instead.
    config = build_config("asp")
    train, _, _ = load_splits(config)
    store = ShardStore(train, config.shard_size)
    stats = ShardStats()
    fetcher = ShardFetcher(StubDataPlane(store), stats, reader_options=dict(FAST, connect_retries=1))
    spec = KafkaRanges(source="kafka", bootstrap=address, topic="t", partitions=4, ranges=[[0, 0, 1]])
    records, _ = fetcher.fetch([0], spec)
    assert records[0].shard == 0 and stats.report()["shard_records"] == {"kafka": 0, "zmq": 1}
    assert stats.report()["kafka_fallbacks"] == 1
    # Circuit open: the next assignment does not pay the retry budget again: it does not try Kafka
    # (no second fallback counted) and goes straight to the data plane.
    fetcher.fetch([0], spec)
    assert stats.report()["kafka_fallbacks"] == 1
    assert stats.report()["shard_records"] == {"kafka": 0, "zmq": 2}
    fetcher.close()


def test_server_start_fails_naming_an_unreachable_broker(tmp_path):
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    env = _server_env()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for cmd in (
        [sys.executable, "-m", "hermes.server.cli", "--port", str(free_ports(1)[0]), "--kafka", address,
         "--kafka-retries", "0", "--out", str(tmp_path)],
        [sys.executable, "-m", "hermes.server.cli", "shards", "publish", "--kafka", address, "--retries", "0"],
    )]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, (proc.returncode, out[-2000:], err[-2000:])
        # The retry loop itself (backoff, attempts) is exercised by the reader test above.
        assert f"Kafka broker at {address} unreachable" in err and "after 1 attempt(s)" in err
        assert "Traceback" not in err


# ---------------------------------------------------------------------------
# a broker restart mid-read


# Offsets 0, 2 and 4 of each of the 4 partitions: single-record ranges, so
# every record takes a fetch of its own and a broker killed mid-read cannot
# have sent the rest already.
SCATTERED = [o * 4 + p for o in (0, 2, 4) for p in range(4)]


def _read_in_thread(reader, layout, assigned, kill_after: int):
    """Start reading; the reader blocks after ``kill_after`` records until released."""
    seen: list[int] = []
    reached, release = threading.Event(), threading.Event()
    out: dict = {}

    def on_record(shard):
        seen.append(shard)
        if len(seen) == kill_after:
            reached.set()
            assert release.wait(HANG_S)

    def run():
        out["res"] = reader.read(layout.topic, layout.partitions, layout.ranges_for(assigned),
                                 max_record_bytes=layout.max_record_bytes, on_record=on_record)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert reached.wait(HANG_S), "reader never got going"
    return t, seen, release, out


def test_restart_then_republish_resumes_from_the_assigned_offsets(broker_factory, stores):
    train, validation = stores
    broker = broker_factory()
    opts = KafkaOptions(broker.bootstrap, retries=3, backoff=0.2)
    layout = publish_stores(train, validation, dataset="digits", opts=opts)["train"].layout
    assigned = SCATTERED
    reader = KafkaShardReader(broker.bootstrap, **dict(FAST, missing_grace=15.0, connect_retries=6))
    t, seen, release, out = _read_in_thread(reader, layout, assigned, kill_after=3)
    broker.kill()          # crash mid-read: the in-memory topics are gone
    release.set()
    time.sleep(1.5)        # the reader stalls and starts reconnecting
    broker.start()         # same port, empty
    again = publish_stores(train, validation, dataset="digits", opts=opts)["train"]
    assert again.layout == layout  # same topic, same offsets
    t.join(HANG_S)
    reader.close()
    res = out["res"]
    assert res.missing == [] and res.failure is None, res.failure
    # Who reconnects is not fixed: kafka-python's consumer often reconnects to
    # the same port by itself before our stall timer fires (reconnects == 0, as
    # in a CI run); either way the read must resume at the unread offsets.
    assert sorted(seen) == sorted(assigned), "a shard was skipped or read twice"
    assert all(_same(res.records[s], train, s) for s in assigned)


def test_restart_without_republish_reports_exactly_the_unread_shards(broker_factory, stores):
    train, validation = stores
    broker = broker_factory()
    layout = publish_stores(train, validation, dataset="digits",
                            opts=KafkaOptions(broker.bootstrap, retries=1))["train"].layout
    assigned = SCATTERED
    reader = KafkaShardReader(broker.bootstrap, **FAST)
    t, seen, release, out = _read_in_thread(reader, layout, assigned, kill_after=4)
    broker.kill()
    release.set()
    time.sleep(0.5)
    broker.start()  # back, but without the data
    t.join(HANG_S)
    reader.close()
    res = out["res"]
    assert res.failure_kind == "missing_data" and broker.bootstrap in res.failure
    assert len(seen) == len(set(seen)) and set(seen) | set(res.missing) == set(assigned)
    assert not set(seen) & set(res.missing) and len(res.missing) > 0


# ---------------------------------------------------------------------------
# the server names Kafka; the agent's prefetcher reads it and falls back


def _events(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "events.jsonl").read_text().splitlines() if line.strip()]



def test_server_assigns_kafka_ranges_and_the_prefetcher_survives_a_broker_restart(broker_factory, stores, tmp_path):
    train, _ = stores
    broker = broker_factory()
    with running_server(tmp_path / "srv", "--kafka", broker.bootstrap, "--kafka-partitions", "3") as server:
        assert server.get_json("/v1/summary")["data_plane"]["source"] == "kafka"
        reg = server.register_raw("kafka-agent")
        src = reg["data_source"]
        assert src["source"] == "kafka" and src["bootstrap"] == broker.bootstrap and src["partitions"] == 3
        assert sorted(shards_in(src["ranges"], 3)) == sorted(reg["validation_shards"])

        stats = ShardStats()
        pre = Prefetcher(lambda: DataClient(server.data_address, reg["worker_id"], reg["token"], timeout=10),
                         stats=stats, reader_options=FAST)
        pre.start()
        works: list[Work] = []
        try:
            for _ in range(3):
                works.append(pre.next())
            kafka_before = stats.report()["shard_records"]["kafka"]
            broker.restart()  # the in-memory topics are gone
            for _ in range(4):
                works.append(pre.next())
            lost = stats.report()
            assert lost["kafka_data_missing"] >= 1 and lost["shard_records"]["zmq"] > 0
            # The agent's stats report tells the server; it republishes (same layout, same offsets)...
            reporter = DataClient(server.data_address, reg["worker_id"], reg["token"], timeout=10)
            reporter.request(MsgType.REPORT_STATS, {"samples": 0, "bytes_sent": 0, "bytes_received": 0, **lost})
            reporter.close()
            deadline = time.monotonic() + HANG_S
            while not any(e.get("event") == "shards_republished" for e in _events(server.out_dir)):
                assert time.monotonic() < deadline, "the server did not republish"
                time.sleep(0.2)
            # ...and the prefetcher reads from Kafka again.
            for _ in range(4):
                works.append(pre.next())
        finally:
            pre.stop()
        assert all(isinstance(w, Work) for w in works), works
        rep = stats.report()
        assert kafka_before > 0 and rep["kafka_fallbacks"] >= 1
        assert rep["shard_records"]["kafka"] > lost["shard_records"]["kafka"], "Kafka not used after the republish"
        republished = [e for e in _events(server.out_dir) if e["event"] == "shards_republished"]
        assert republished[0]["same_layout"] is True
        for w in works:  # every assignment arrived whole and right
            want_x = torch.cat([train.rows(s)[0] for s in w.shards])
            assert torch.equal(w.x, want_x)
        assigned = [tuple(e["shards"]) for e in _events(server.out_dir)
                    if e["event"] == "assignment" and e["worker"] == reg["worker_id"]]
        # Received in order, none skipped (the prefetcher may hold one more it had asked for).
        assert [w.shards for w in works] == assigned[:len(works)]
        r = server.http.post(f"{server.url}/v1/workers/{reg['worker_id']}/leave",
                             headers={"X-Hermes-Token": reg["token"]})
        assert r.status_code == 200


# ---------------------------------------------------------------------------
# end to end


def _tansu_processes() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tansu" in cmd and "broker" in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def test_testbed_with_kafka_auto_reaches_the_target(tmp_path, kafka_broker):
    # kafka_broker: only so the test is skipped where no broker can run; --kafka auto starts its own.
    out = tmp_path / "run"
    proc, s = run_testbed(out, "--profile", "hl4", "--target-accuracy", "0.9", "--kafka", "auto", timeout=300)
    assert "shard records via Kafka" in proc.stdout
    assert s["reached_target"] is True
    # The evaluation that stopped the run; the final one, taken at shutdown after the
    # updates still in flight, may sit a little lower (seen: 0.897 after 0.93).
    assert max(e["accuracy"] for e in s["accuracy_timeline"]) >= 0.9 and s["final_accuracy"] >= 0.8
    assert s["kafka"]["mode"] == "auto" and s["data_plane"]["source"] == "kafka"
    assert len(s["workers"]) == 4
    for w in s["workers"]:
        assert w["exit_code"] == 0
        assert w["data_source"] == "kafka", w
        assert w["shard_bytes"]["kafka"] > 0 and w["shard_bytes"].get("zmq", 0) == 0
        assert w["shard_bytes_fetched"] == w["shard_bytes"]["kafka"]
        assert w["prefetch_wait_seconds"] >= 0 and w["prefetch_wait_steady_seconds"] <= w["prefetch_wait_seconds"]
        assert w["corrupt_records"] == 0 and w["kafka_fallbacks"] == 0
    # The broker it started is gone (other brokers may come and go: tests run side by side).
    bootstrap = s["kafka"]["bootstrap"]
    assert not [p for p in _tansu_processes() if f"tcp://{bootstrap} " in p], _tansu_processes()
    assert port_is_free(int(bootstrap.rpartition(":")[2]))
    assert (out / "logs" / "kafka.log").is_file()
