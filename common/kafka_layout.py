"""How shard records lie in Kafka topics: names, layout, offset ranges.

Pure functions and small value types shared by the publisher (server) and the
reader (agent); nothing here imports kafka-python.

Layout. A split (``train`` or ``validation``) of a data set is one topic::

    hermes-<dataset>-<split>-p<P>-<fingerprint>

with ``P`` partitions; shard ``i`` is record ``i // P`` of partition
``i % P``, so ``(partition, offset) -> shard = offset * P + partition``. The
record value is the shard record (HSR1 magic, format 2:
``hermes.common.shards``), byte for byte what the ZeroMQ data plane serves; the record key is the shard id as
ASCII. The fingerprint is the first 12 hex digits of a SHA-256 over every
record of the split, so the same data published twice lands in the same
topic, and a changed data set (other seed, shard size, ...) in another one.
The layout is deterministic: a republished topic (after a broker that keeps
data in memory restarted) has every shard at the same offset again, so the
offsets agents were assigned stay valid.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

TOPIC_PREFIX = "hermes"
_TOPIC_SAFE = re.compile(r"[^A-Za-z0-9_-]+")
_T = TypeVar("_T")


class KafkaUnavailable(ConnectionError):
    """The Kafka broker could not be reached within the retry budget."""

    def __init__(self, bootstrap: str, message: str) -> None:
        super().__init__(message)
        self.bootstrap = bootstrap


def fingerprint(records: Iterable[bytes | memoryview]) -> str:
    """12 hex digits of SHA-256 over the records (length-prefixed, in shard order)."""
    h = hashlib.sha256()
    for rec in records:
        h.update(len(rec).to_bytes(8, "little"))
        h.update(rec)
    return h.hexdigest()[:12]


def topic_name(dataset: str, split: str, partitions: int, digest: str, prefix: str = TOPIC_PREFIX) -> str:
    name = "-".join(_TOPIC_SAFE.sub("_", part) for part in (prefix, dataset, split, f"p{partitions}", digest))
    return name[:249]  # Kafka's limit


def location(shard: int, partitions: int) -> tuple[int, int]:
    """(partition, offset) of a shard under the round-robin layout."""
    return shard % partitions, shard // partitions


def shard_at(partition: int, offset: int, partitions: int) -> int:
    return offset * partitions + partition


def shards_in(ranges: Iterable[Sequence[int]], partitions: int) -> list[int]:
    """The shard ids the ranges cover, in range order."""
    return [shard_at(p, o, partitions) for p, s, e in ranges for o in range(s, e)]


def partition_counts(num_shards: int, partitions: int) -> list[int]:
    """How many records each partition holds once a split of num_shards is published."""
    return [len(range(p, num_shards, partitions)) for p in range(partitions)]


def coalesce(locations: Iterable[tuple[int, int]]) -> list[list[int]]:
    """``[[partition, start, end_exclusive], ...]`` covering the (partition, offset) pairs.

    Sorted by partition then offset; consecutive offsets of one partition
    merge into one range. Duplicates are an error: an assignment reads each
    record once.
    """
    out: list[list[int]] = []
    seen: set[tuple[int, int]] = set()
    for p, o in sorted(locations):
        if (p, o) in seen:
            raise ValueError(f"offset {o} of partition {p} listed twice")
        seen.add((p, o))
        if out and out[-1][0] == p and out[-1][2] == o:
            out[-1][2] = o + 1
        else:
            out.append([p, o, o + 1])
    return out


def validate_ranges(ranges: object, partitions: int) -> list[tuple[int, int, int]]:
    """Ranges from a message, checked: ints, 0 <= p < P, 0 <= start < end, no overlap."""
    if not isinstance(ranges, (list, tuple)):
        raise ValueError("ranges must be a list of [partition, start, end]")
    out: list[tuple[int, int, int]] = []
    for r in ranges:
        if (not isinstance(r, (list, tuple)) or len(r) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in r)):
            raise ValueError(f"range {r!r} is not [partition, start, end]")
        p, s, e = r
        if not (0 <= p < partitions and 0 <= s < e):
            raise ValueError(f"range {r!r} out of bounds for {partitions} partitions")
        out.append((p, s, e))
    by_part: dict[int, list[tuple[int, int]]] = {}
    for p, s, e in out:
        by_part.setdefault(p, []).append((s, e))
    for p, spans in by_part.items():
        spans.sort()
        for (_s0, e0), (s1, _) in zip(spans, spans[1:]):
            if s1 < e0:
                raise ValueError(f"ranges of partition {p} overlap at offset {s1}")
    return out


@dataclass(frozen=True)
class TopicLayout:
    """One published split: where each of its shards lies."""

    topic: str
    partitions: int
    num_shards: int
    fingerprint: str
    max_record_bytes: int
    total_bytes: int

    def ranges_for(self, shards: Sequence[int]) -> list[list[int]]:
        """Ranges covering the distinct shards (an assignment that runs across an
        epoch boundary may name a shard twice: it is read once)."""
        for s in shards:
            if not 0 <= s < self.num_shards:
                raise ValueError(f"shard {s} out of range [0, {self.num_shards})")
        return coalesce(location(s, self.partitions) for s in {int(s) for s in shards})

    def describe(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "partitions": self.partitions, "shards": self.num_shards,
            "fingerprint": self.fingerprint, "max_record_bytes": self.max_record_bytes,
            "bytes": self.total_bytes, "layout": "shard = offset * partitions + partition",
        }


def connect_with_retries(bootstrap: str, factory: Callable[[], _T], *, retries: int, backoff: float,
                         what: str = "connect", max_backoff: float = 8.0, log: logging.Logger | None = None,
                         should_stop: Callable[[], bool] | None = None) -> _T:
    """``factory()`` until it returns, at most ``retries + 1`` times, sleeping
    ``backoff, 2*backoff, ...`` (capped at ``max_backoff``) between attempts.

    Raises :class:`KafkaUnavailable` naming the bootstrap address once the
    budget is spent. Only connection-type failures are retried: a
    configuration error from kafka-python surfaces at once.
    """
    import time

    from kafka.errors import KafkaConfigurationError, KafkaError

    t0 = time.monotonic()
    delay, last = backoff, "no attempt made"
    for attempt in range(retries + 1):
        try:
            return factory()
        except KafkaConfigurationError:
            raise
        except (KafkaError, OSError) as exc:
            text = str(exc)
            last = text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"
        if attempt < retries:
            if log is not None:
                log.warning("Kafka broker at %s not reachable (%s); retry %d/%d in %.1fs",
                            bootstrap, last, attempt + 1, retries, delay)
            if should_stop is not None and should_stop():
                break
            time.sleep(delay)
            delay = min(delay * 2, max_backoff)
    raise KafkaUnavailable(
        bootstrap,
        f"Kafka broker at {bootstrap} unreachable ({what}) after {attempt + 1} attempt(s) "
        f"over {time.monotonic() - t0:.1f}s: {last}",
    )
