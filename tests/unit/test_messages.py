"""common/messages.py, the agent's side: replies parsed once at the boundary, requests built from the bodies."""

from __future__ import annotations

import pytest

from hermes.client.prefetch import Prefetcher, StopSignal
from hermes.common.control_messages import HeartbeatReply, RegisterResponse
from hermes.common.messages import (
    CycleReport,
    KafkaRanges,
    PushReply,
    PushUpdate,
    WorkReply,
    batch_size_of,
    parse_body,
    parse_reply,
    request_body,
)
from hermes.common.wire import ErrorCode, ProtocolError


def _assignment(**kw) -> WorkReply:
    return WorkReply(epoch=2, shards=[3, 4], batch_size=16, cycle_samples=40, accumulation=2, lr=0.05, **kw)


def test_a_work_reply_reads_back_what_the_server_wrote_stop_and_newer_fields_aside() -> None:
    sent = _assignment(data=KafkaRanges(source="kafka", bootstrap="k:9092", topic="t", partitions=4,
                                        ranges=[[0, 0, 2]]), then=[_assignment()])
    body = {**sent.body(), "stop": True, "a_newer_servers_field": 1}
    got = WorkReply.from_body(body)
    assert got.stop and got.model_copy(update={"stop": False}) == sent
    assert got.data.topic == "t" and got.then is not None and got.then[0].data.source == "zmq"


@pytest.mark.parametrize(("body", "field"), [
    ({"epoch": 0, "shards": [], "cycle_samples": 8, "lr": 0.1}, "'batch_size': Field required"),
    ({"epoch": 0, "shards": [], "batch_size": "many", "cycle_samples": 8, "lr": 0.1}, "'batch_size'"),
    ({"epoch": 0, "shards": [], "batch_size": 8, "cycle_samples": 8, "lr": 0.1,
      "then": [{"epoch": 0, "shards": []}]}, "'then.0.batch_size'"),
])
def test_a_malformed_reply_is_one_line_naming_the_reply_and_the_field(body: dict, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        WorkReply.from_body(body)
    assert info.value.code is ErrorCode.MALFORMED
    text = info.value.message
    assert text.startswith("server's WORK reply: body field") and field in text and "\n" not in text


def test_a_reply_that_is_not_an_object_is_refused_in_one_line() -> None:
    with pytest.raises(ProtocolError, match=r"server's heartbeat reply is not an object: \[1, 2\]"):
        parse_reply(HeartbeatReply, [1, 2], "heartbeat")


def test_the_register_reply_types_its_data_source() -> None:
    reply = {"worker_id": "w1", "token": "t", "rejoined": False, "protocol_version": 3, "data_plane": "tcp://h:1",
             "model_spec": {}, "run_config": {}, "validation_shards": [1], "server_time_ms": 5,
             "heartbeat_interval_seconds": 5.0, "max_message_bytes": 0,
             "data_source": {"source": "kafka", "topic": "v", "partitions": 2, "ranges": [[0, 0, 1]]}}
    reg = parse_reply(RegisterResponse, reply, "register")
    assert reg.source() == KafkaRanges(source="kafka", topic="v", partitions=2, ranges=[[0, 0, 1]])
    with pytest.raises(ProtocolError, match="server's register reply: body field 'token': Field required"):
        parse_reply(RegisterResponse, {k: v for k, v in reply.items() if k != "token"}, "register")


def test_push_replies_and_heartbeats_read_only_what_the_agent_needs() -> None:
    answer = parse_reply(PushReply, {"status": "rejected", "reason": "stale", "staleness": 9, "stop": False},
                         "PUSH_REPLY")
    assert (answer.status, answer.reason, answer.model, answer.stop) == ("rejected", "stale", None, False)
    beat = parse_reply(HeartbeatReply, {"state": "active", "model_version": 3, "stop": False,
                                        "collective_broken": 2}, "heartbeat")
    assert beat.collective_broken == 2


def test_the_batch_size_has_one_name_on_the_wire_and_agents_that_said_mbs_still_count() -> None:
    update = PushUpdate(samples=4, copy=False, cycle=CycleReport(dss=4, batch_size=2))
    body = request_body(update)
    assert body["cycle"]["batch_size"] == 2 and "mbs" not in body["cycle"] and body["copy"] is False
    assert parse_body(PushUpdate, body) == update
    old = parse_body(CycleReport, {"dss": 4, "mbs": 2})
    assert old.batch_size == 2
    # The event log and the registry keep it under the same one name.
    assert list(old.fields())[:2] == ["dss", "batch_size"] and old.fields()["batch_size"] == 2


class _Client:
    def __init__(self, body: dict) -> None:
        self.body = body

    def request(self, type_, body, **kw):
        class _Reply:
            header = type("H", (), {"body": self.body})
            payload = None

        return _Reply()

    def close(self) -> None:
        pass


def test_the_prefetcher_stops_the_agent_with_the_malformed_replys_one_line() -> None:
    pre = Prefetcher(lambda: _Client({"epoch": 0, "shards": [], "lr": 0.1, "cycle_samples": 1}))
    pre.start()
    try:
        got = pre.next()
    finally:
        pre.stop()
    assert isinstance(got, StopSignal) and isinstance(got.error, ProtocolError)
    assert got.reason == "prefetch failed: malformed: server's WORK reply: body field 'batch_size': Field required"


def test_hermes_client_says_a_malformed_reply_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from hermes.client import cli

    class _Agent:
        def run(self) -> None:
            WorkReply.from_body({"epoch": 0})

    assert cli._run(_Agent(), "w") == cli.EXIT_REMOTE
    err = capsys.readouterr().err
    assert err.startswith("hermes-client: server's WORK reply: body field 'shards': Field required (and ")
    assert err.count("\n") == 1


def test_a_record_written_before_the_batch_size_had_one_name_still_reads() -> None:
    assert batch_size_of({"dss": 64, "mbs": 16}) == 16  # an events.jsonl / summary.json line before issue 26
    assert batch_size_of({"dss": 64, "batch_size": 32, "mbs": 16}) == 32
    assert batch_size_of({"dss": 64}) is None
