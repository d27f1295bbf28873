"""combine_messages on the server: what a push or a work request carries instead of separate requests.

In-process like test_engine_inprocess (its engine and signing agent): the
push answers the pull, the work request carries the skipped cycles and the
stats and gets its shards inline, and the old separate requests still work.
"""

from __future__ import annotations

import pytest
import torch
from test_engine_inprocess import _Agent, _engine, _run

from hermes.common.clock import ManualClock
from hermes.common.messages import MAX_CYCLES_PER_MESSAGE
from hermes.common.shards import decode_record
from hermes.common.wire import MsgType, ProtocolError

STATS = {"samples": 40, "bytes_sent": 7, "bytes_received": 9, "compute_seconds": 2.5, "precision": "fp32"}


def _cycle(pushed: bool, dss: int = 32) -> dict:
    return {"dss": dss, "batch_size": 8, "compute_seconds": 0.5, "decision": "improved" if pushed else "no_improvement",
            "pushed": pushed, "val_loss": 1.0, "z": -2.0 if pushed else 0.1, "alpha": -1.3}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_a_push_with_pull_returns_the_new_model_and_counts_no_pull_request(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    _, before = engine.state.snapshot()

    async def go():
        first = await agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "pull": True}, payload=agent.delta(0.25))
        # A stale push (base 0, the model is at 1) still gets the newest model back.
        second = await agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "pull": True}, payload=agent.delta(0.5))
        return first, second

    first, second = _run(go())
    assert first.header.type is MsgType.PUSH_REPLY and first.header.body["status"] == "applied"
    assert first.header.body["model"] == "included" and first.header.model_version == 1
    assert torch.allclose(first.payload.flat(), before + 0.25)
    assert second.header.body["model"] == "included" and second.header.model_version == engine.state.version
    assert torch.equal(second.payload.flat(), engine.state.snapshot()[1])
    assert engine.message_counts == {"push_update": 2}
    assert engine.carried_counts == {"pull_model": 2} and agent.rec.pulls == 2


def test_a_push_whose_base_is_current_after_it_gets_unchanged_and_no_payload(clock):
    # fedbuff buffers the first push: the model is still the one the agent trained from.
    engine = _engine(clock, preset="fedbuff", **{"fedbuff.buffer_size": 2})
    agent = _Agent(engine, clock, "a")
    reply = _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "pull": True}, payload=agent.delta(0.1)))
    assert engine.state.version == 0
    assert reply.header.body["model"] == "unchanged" and reply.payload is None


def test_a_push_carries_skipped_cycles_and_stats_in_order(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    body = {"samples": 4, "cycle": _cycle(True), "cycles": [_cycle(False), _cycle(False, dss=48)], "stats": STATS}
    reply = _run(agent.request(MsgType.PUSH_UPDATE, body, payload=agent.delta(0.1)))
    assert reply.header.body["status"] == "applied" and "model" not in reply.header.body
    rec = agent.rec
    assert rec.cycles == 3 and rec.gate_skips == 2 and rec.gate_pushes == 1
    # The skipped cycles come first, the pushed one last.
    assert [c[1] for c in rec.cycle_log] == [32, 48, 32] and rec.cycle_log[-1][5] is True
    assert (rec.samples, rec.compute_seconds, rec.precision) == (40, 2.5, "fp32")
    assert engine.message_counts == {"push_update": 1}
    assert engine.carried_counts == {"report_stats": 1, "report_stats:cycle": 2}


def test_a_work_request_carries_cycles_and_stats_and_gets_its_shards_inline(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    body = {"inline_shards": True, "cycles": [_cycle(False)], "stats": STATS}
    reply = _run(agent.request(MsgType.REQUEST_WORK, body))
    work = reply.header.body
    assert reply.header.type is MsgType.WORK and work["shards"]
    lengths, raw = work["lengths"], reply.payload.flat().numpy().tobytes()
    assert len(lengths) == len(work["shards"]) and sum(lengths) == len(raw)
    offset = 0
    for shard, n in zip(work["shards"], lengths):
        assert decode_record(memoryview(raw)[offset:offset + n]).shard == shard
        assert raw[offset:offset + n] == engine.shards.record(shard)
        offset += n
    assert agent.rec.cycles == 1 and agent.rec.gate_skips == 1 and agent.rec.samples == 40
    assert engine.shard_bytes_served["train"] == len(raw)
    assert engine.message_counts == {"request_work": 1}
    assert engine.carried_counts == {"fetch_shard": 1, "report_stats": 1, "report_stats:cycle": 1}


def test_the_separate_requests_still_work_without_the_new_fields(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")

    async def go():
        work = await agent.request(MsgType.REQUEST_WORK, {})
        ack = await agent.request(MsgType.REPORT_STATS, {**STATS, "cycle": _cycle(False)})
        push = await agent.request(MsgType.PUSH_UPDATE, {"samples": 4}, payload=agent.delta(0.1))
        return work, ack, push

    work, ack, push = _run(go())
    assert work.payload is None and "lengths" not in work.header.body
    assert ack.header.type is MsgType.STATS_ACK and agent.rec.cycles == 1
    assert push.payload is None and "model" not in push.header.body
    assert engine.carried_counts == {}


@pytest.mark.parametrize("body, field", [
    ({"samples": 4, "cycles": [_cycle(False)] * (MAX_CYCLES_PER_MESSAGE + 1)}, "cycles"),
    ({"samples": 4, "stats": {"samples": -1, "bytes_sent": 0, "bytes_received": 0}}, "stats.samples"),
    ({"samples": 4, "pull": "yes"}, "pull"),
])
def test_a_push_with_bad_carried_fields_is_refused_before_anything_changes(clock, body, field):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    with pytest.raises(ProtocolError, match=field.replace(".", r"\.")):
        _run(agent.request(MsgType.PUSH_UPDATE, body, payload=agent.delta(0.1)))
    assert engine.state.version == 0 and agent.rec.cycles == 0 and agent.rec.samples == 0


def test_one_work_request_hands_out_several_assignments_with_all_their_shards(clock):
    engine = _engine(clock, cycle_samples=32)  # two of the toy set's eight shards each
    agent = _Agent(engine, clock, "a")
    reply = _run(agent.request(MsgType.REQUEST_WORK, {"inline_shards": True, "assignments": 3}))
    first = reply.header.body
    works = [first, *first["then"]]
    assert len(works) == 3 and all("then" not in w for w in first["then"])
    shards = [s for w in works for s in w["shards"]]
    wl = engine.allocator.workload(agent.rec.id)
    assert all(w["cycle_samples"] == wl.dss and w["batch_size"] == wl.batch_size for w in works)
    # Three assignments' worth of shards, each handed out once, in the order they are to be trained.
    assert len(shards) == len(set(shards)) == 6
    assert engine.membership.outstanding[agent.rec.id] == [tuple(w["shards"]) for w in works]
    raw, offset = reply.payload.flat().numpy().tobytes(), 0
    for shard, n in zip(shards, first["lengths"], strict=True):
        assert raw[offset:offset + n] == engine.shards.record(shard)
        offset += n
    assert offset == len(raw)
    assert engine.message_counts == {"request_work": 1}
    assert engine.carried_counts == {"request_work": 2, "fetch_shard": 3}


def test_more_assignments_than_the_limit_are_refused(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    with pytest.raises(ProtocolError, match="assignments"):
        _run(agent.request(MsgType.REQUEST_WORK, {"assignments": 17}))
    assert engine.membership.outstanding.get(agent.rec.id, []) == []
