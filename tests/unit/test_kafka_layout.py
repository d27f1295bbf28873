"""The Kafka topic layout of shard records: names, locations, offset ranges (no broker needed)."""

from __future__ import annotations

import pytest

from hermes.common.kafka_layout import (
    TopicLayout,
    coalesce,
    fingerprint,
    location,
    partition_counts,
    shard_at,
    shards_in,
    topic_name,
    validate_ranges,
)


def test_round_robin_layout_round_trips():
    for P in (1, 3, 4, 7):
        for shard in range(50):
            p, o = location(shard, P)
            assert 0 <= p < P and shard_at(p, o, P) == shard
        assert sum(partition_counts(50, P)) == 50
    assert partition_counts(21, 4) == [6, 5, 5, 5]


def test_coalesce_merges_consecutive_offsets_only():
    assert coalesce([(0, 3), (1, 0), (0, 1), (0, 2), (1, 2)]) == [[0, 1, 4], [1, 0, 1], [1, 2, 3]]
    assert coalesce([]) == []
    with pytest.raises(ValueError, match="twice"):
        coalesce([(0, 1), (0, 1)])


def test_ranges_for_covers_exactly_the_distinct_shards():
    layout = TopicLayout("t", partitions=4, num_shards=21, fingerprint="f", max_record_bytes=10, total_bytes=210)
    # 0,4,8 -> partition 0 offsets 0,1,2; 5 -> (1,1); 7 -> (3,1); 8 listed twice (an epoch boundary).
    ranges = layout.ranges_for([8, 0, 4, 5, 7, 8])
    assert ranges == [[0, 0, 3], [1, 1, 2], [3, 1, 2]]
    assert sorted(shards_in(ranges, 4)) == [0, 4, 5, 7, 8]
    with pytest.raises(ValueError, match="out of range"):
        layout.ranges_for([21])


@pytest.mark.parametrize("bad", [
    "nope", [[0, 1]], [[0, 2, 2]], [[4, 0, 1]], [[-1, 0, 1]], [[0, 0, 3], [0, 2, 4]], [[0, True, 2]], [[0, 1.0, 2]],
])
def test_validate_ranges_refuses_malformed(bad):
    with pytest.raises(ValueError):
        validate_ranges(bad, 4)


def test_topic_names_are_kafka_safe_and_content_addressed():
    a = fingerprint([b"abc", b"de"])
    assert a == fingerprint([b"abc", b"de"]) and len(a) == 12
    assert a != fingerprint([b"ab", b"cde"])  # length-prefixed: boundaries count
    name = topic_name("my data/set", "train", 4, a)
    assert name == f"hermes-my_data_set-train-p4-{a}"
    assert len(topic_name("x" * 400, "train", 4, a)) <= 249
