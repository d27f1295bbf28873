"""overlap_push (client/overlap.py) and pull_dtype: the rebase, the one push in flight, the config
rules, and the server answering a push's pull in the asked dtype."""

from __future__ import annotations

import threading

import pytest
import torch
from test_engine_inprocess import _Agent, _engine, _run

from hermes.client.overlap import OverlappedPush, rebase
from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.wire import MsgType, ProtocolError


def test_rebase_keeps_the_progress_made_while_the_push_was_in_flight():
    base = torch.tensor([1.0, 2.0, 3.0])
    pushed = base + torch.tensor([0.5, 0.0, -0.5])  # cycle k, pushed
    local = pushed + torch.tensor([0.25, 0.25, 0.0])  # cycle k+1, trained meanwhile
    server = base + torch.tensor([0.2, 0.1, -0.2])  # the server folded a share of cycle k and others
    out = rebase(server, local, pushed)
    assert torch.equal(out, torch.tensor([1.45, 2.35, 2.8]))
    # The next push (the change since the model it is now based on) is exactly cycle k+1's progress.
    assert torch.allclose(out - server, torch.tensor([0.25, 0.25, 0.0]))


class _FakeClient:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_one_push_in_flight_its_reply_taken_once_and_the_socket_closed():
    made: list[_FakeClient] = []
    release = threading.Event()

    def make() -> _FakeClient:
        made.append(_FakeClient())
        return made[-1]

    overlap = OverlappedPush(make)  # type: ignore[arg-type]
    assert not overlap.pending and not overlap.answered
    pushed = torch.ones(3)
    overlap.send(lambda client: ("reply", client) if release.wait(10) else None, pushed=pushed)  # type: ignore[arg-type,return-value]
    assert overlap.pending and not overlap.answered
    with pytest.raises(RuntimeError, match="already in flight"):
        overlap.send(lambda client: None, pushed=pushed)  # type: ignore[arg-type,return-value]
    release.set()
    reply, got = overlap.take()
    assert reply == ("reply", made[0]) and got is pushed
    assert not overlap.pending and overlap.exchange_seconds > 0
    with pytest.raises(RuntimeError, match="no push in flight"):
        overlap.take()
    # The same socket for the next push; closed at the end.
    overlap.send(lambda client: ("second", client), pushed=pushed)  # type: ignore[arg-type,return-value]
    assert overlap.take()[0] == ("second", made[0]) and len(made) == 1
    assert not made[0].closed
    overlap.close()
    assert made[0].closed and not overlap.pending


def test_what_the_push_raised_is_raised_where_its_reply_is_taken():
    class Gone(Exception):
        pass

    closed: list[bool] = []

    class Client:
        def close(self) -> None:
            closed.append(True)

    overlap = OverlappedPush(Client)  # type: ignore[arg-type]

    def fails(client: Client) -> None:
        raise Gone("server unreachable")

    overlap.send(fails, pushed=torch.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(Gone, match="unreachable"):
        overlap.take()
    overlap.close()
    assert closed == [True]


@pytest.mark.parametrize("preset", ["asp", "hermes", "hermes-paper", "ssp", "fedbuff"])
def test_overlap_is_allowed_under_asynchronous_sync(preset):
    # hermes-paper sends one request per purpose (the paper's): overlapping needs combined replies.
    assert build_config(preset, overlap_push=True, combine_messages=True).overlap_push


@pytest.mark.parametrize(("overrides", "message"), [
    ({"preset": "bsp"}, "needs an asynchronous sync .*not 'bsp'"),
    ({"preset": "ebsp"}, "not 'ebsp'"),
    ({"preset": "hermes", "combine_messages": False}, "needs combine_messages"),
])
def test_overlap_is_refused_where_the_next_cycle_must_wait(overrides, message):
    preset = overrides.pop("preset")
    with pytest.raises(ValueError, match=message):
        build_config(preset, overlap_push=True, **overrides)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_push_reply_brings_the_model_in_the_pull_dtype(dtype):
    clock = ManualClock()
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    reply = _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "pull": True, "pull_dtype": dtype},
                               payload=agent.delta(0.25)))
    assert reply.header.body["model"] == "included"
    flat = reply.payload.flat()
    want = getattr(torch, dtype)
    assert flat.dtype == want
    assert torch.equal(flat, engine.state.snapshot()[1].to(want))


def test_an_unknown_pull_dtype_is_a_bad_request():
    clock = ManualClock()
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    with pytest.raises(ProtocolError, match="pull_dtype"):
        _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "pull": True, "pull_dtype": "int8"},
                           payload=agent.delta(0.25)))
