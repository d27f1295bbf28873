"""The request hot path's shortcuts (issue 31) give what the general code gave: the header copy in ``encode``,
``Header.unpack``'s exact-type path and its errors, the data plane's frame-by-frame receive and part-by-part
send over a real ZeroMQ pair, and the codecs' cached element count."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from types import SimpleNamespace

import msgpack
import pytest
import zmq

from hermes.common import codecs
from hermes.common.header import PROTOCOL_VERSION, ErrorCode, Header, MsgType, ProtocolError
from hermes.common.wire import encode
from hermes.server.dataplane import _recv_message, _send_message

HANG_S = 30.0


def _full_header() -> Header:
    return Header(type=MsgType.PUSH_UPDATE, worker="w0007", session="s" * 16, seq=9, ts=123, model_version=4,
                  dtype="float32", shapes=((2, 3), (4,)), frame_bytes=(40,), checksum=77,
                  body={"samples": 32, "codec": {"name": "topk", "k": 3}}, nonce="n" * 32, mac="m" * 32)


def test_assembled_from_a_header_is_dataclasses_replace() -> None:
    h = _full_header()
    changes = dict(dtype="uint8", shapes=((10,),), frame_bytes=(10,), checksum=0, nonce="", mac="")
    got, want = Header.assemble(h.__dict__, changes), dataclasses.replace(h, **changes)
    assert got == want and got.__dict__ == want.__dict__
    assert h.dtype == "float32"  # the original is untouched
    # What makes the copy the same object: no slots, no __post_init__ (a change here must revisit Header.assemble).
    assert not hasattr(Header, "__slots__") and not hasattr(Header, "__post_init__")


def test_unpack_round_trips_every_field() -> None:
    h = _full_header()
    assert Header.unpack(h.pack()) == h
    minimal = msgpack.packb({"type": "push_update", "proto": PROTOCOL_VERSION})
    got = Header.unpack(minimal)
    assert got == Header(type=MsgType.PUSH_UPDATE)
    got.body["x"] = 1  # a fresh default each time, never shared
    assert Header.unpack(minimal).body == {}


def _raw(**over: object) -> bytes:
    fields = {"type": "push_update", "proto": PROTOCOL_VERSION, "worker": "w", "session": "s", "seq": 1, "ts": 2,
              "model_version": 0, "dtype": "", "shapes": [], "frame_bytes": [], "checksum": 0, "body": {},
              "nonce": "", "mac": ""}
    fields.update(over)
    return msgpack.packb(fields)


@pytest.mark.parametrize(("over", "message"), [
    ({"seq": True}, "header field 'seq' must be int, got bool"),
    ({"worker": 5}, "header field 'worker' must be str, got int"),
    ({"checksum": "0"}, "header field 'checksum' must be int, got str"),
    ({"body": []}, "header field 'body' must be dict, got list"),
    ({"nonce": 1}, "header field 'nonce' must be str, got int"),
    ({"mac": None}, "header field 'mac' must be str, got NoneType"),
    ({"shapes": {}}, "header field 'shapes' must be list, got dict"),
    ({"frame_bytes": 3}, "header field 'frame_bytes' must be list, got int"),
    ({"proto": None}, "header field 'proto' must be int, got NoneType"),
    ({"type": 1}, "header field 'type' must be str, got int"),
    # Several bad fields: the first in the order the fields were always read is the one named.
    ({"body": [], "nonce": 1}, "header field 'body' must be dict, got list"),
    ({"ts": 1.5, "body": []}, "header field 'ts' must be int, got float"),
])
def test_unpack_refuses_wrong_types_as_before(over: dict[str, object], message: str) -> None:
    with pytest.raises(ProtocolError) as err:
        Header.unpack(_raw(**over))
    assert err.value.code is ErrorCode.MALFORMED
    assert err.value.message == message


def test_unpack_names_a_missing_required_field() -> None:
    with pytest.raises(ProtocolError, match="header field 'proto' is missing"):
        Header.unpack(msgpack.packb({"type": "push_update"}))


def test_codec_element_count_is_the_same_cached_or_not() -> None:
    shapes = ((3, 4), (5,), (2, 1, 3))
    assert codecs._numel(shapes) == 23
    assert codecs._numel([list(s) for s in shapes]) == 23  # a list (not hashable): counted, not cached
    assert codecs._numel(()) == 0


def test_data_plane_receive_and_send_keep_messages_whole() -> None:
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        with pytest.raises(zmq.Again):
            _recv_message(router)  # nothing queued: never blocks
        payload = bytes(range(256)) * 400  # above pyzmq's copy threshold: sent zero-copy
        frames = encode(dataclasses.replace(_full_header(), shapes=()), payload, key=b"k" * 32)
        for i in range(2):
            dealer.send_multipart([*frames, f"tail {i}".encode()], copy=False)
        got = []
        deadline = time.monotonic() + HANG_S
        while len(got) < 2 and time.monotonic() < deadline:
            try:
                got.append(_recv_message(router))
            except zmq.Again:
                router.poll(100)
        assert len(got) == 2
        for i, msg in enumerate(got):
            assert [m.bytes for m in msg[1:]] == [bytes(f) for f in frames] + [f"tail {i}".encode()]
        identity = got[0][0].bytes
        _send_message(router, identity, [b"reply", memoryview(payload), zmq.Frame(b"last")])
        _send_message(router, identity, [b"second"])
        assert dealer.poll(int(HANG_S * 1000))
        assert dealer.recv_multipart() == [b"reply", payload, b"last"]
        assert dealer.poll(int(HANG_S * 1000))
        assert dealer.recv_multipart() == [b"second"]
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


def _toy_engine(clock):
    import numpy as np

    from hermes.common.config import build_config
    from hermes.common.datasets import ArrayDataset
    from hermes.common.models import build_model
    from hermes.common.task import Task
    from hermes.server.engine import Engine
    from hermes.server.engine.screening import ScreeningSettings
    from hermes.server.events import EventLog
    from hermes.server.metrics import ServerMetrics

    def split(name: str, n: int, seed: int) -> ArrayDataset:
        rng = np.random.default_rng(seed)
        x = np.ascontiguousarray(rng.standard_normal((n, 8)).astype(np.float32))
        return ArrayDataset(name, x, rng.integers(0, 3, n).astype(np.int64), num_classes=3)

    config = build_config("asp", model="mlp", shard_size=16, eval_max_samples=32)
    return Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=4,
                  max_message_bytes=1 << 24, splits=(split("toy", 128, 0), split("toy-validation", 64, 1),
                                                     split("toy-test", 32, 2)),
                  clock=clock, screening=ScreeningSettings(enabled=False),
                  task=Task(model=lambda: build_model("mlp", input_shape=(8,), num_classes=3), name="toy"))


def test_int8_pulls_serve_the_version_cached_and_echo_the_codec_asked() -> None:
    """A cached int8 pull (no snapshot asked of the state) sends the bytes a fresh quantisation of the current
    model gives, under the current version; a new version is quantised again; the codec entry echoed is the
    one each request asked for."""
    import asyncio

    import torch

    from hermes.common.clock import ManualClock
    from hermes.common.codec_spec import CodecSpec
    from hermes.common.codecs import Int8Codec
    from hermes.common.wire import decode

    clock = ManualClock()
    engine = _toy_engine(clock)
    rec, _ = engine.register("a")
    seq = iter(range(1, 100))

    async def request(type_: MsgType, body: dict, payload: torch.Tensor | None = None, version: int = 0):
        header = Header(type=type_, worker=rec.id, session="s", seq=next(seq), ts=int(clock.time() * 1000),
                        model_version=version, body=body, shapes=engine.spec.shapes if payload is not None else ())
        return decode(await engine.handle(encode(header, payload, key=rec.key)))

    def fresh() -> bytes:
        _, flat = engine.state.snapshot()
        return Int8Codec(64, False, 0).encode(flat, engine.spec.shapes).data.numpy().tobytes()

    async def go() -> None:
        int8 = {"name": "int8", "chunk": 64}
        first = await request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": int8})
        again = await request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": int8})
        for msg in (first, again):
            assert msg.header.model_version == 0 and msg.header.body["codec"] == int8
            assert msg.payload is not None and msg.payload.flat().numpy().tobytes() == fresh()
        other = await request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": {**int8, "rank": 2}})
        assert other.header.body["codec"] == CodecSpec(name="int8", chunk=64, rank=2).model_dump(exclude_none=True)
        assert other.payload is not None and other.payload.flat().numpy().tobytes() == fresh()
        pushed = await request(MsgType.PUSH_UPDATE, {"samples": 4, "loss": 0.5},
                               payload=torch.full((engine.spec.numel,), 0.25), version=0)
        assert pushed.header.body["status"] == "applied"
        after = await request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": int8}, version=0)
        assert after.header.model_version == 1 and after.header.body["codec"] == int8
        assert after.payload is not None and after.payload.flat().numpy().tobytes() == fresh()
        assert after.payload.flat().numpy().tobytes() != first.payload.flat().numpy().tobytes()

    asyncio.run(go())


def test_agent_waits_in_slices_for_a_late_reply_and_stops_on_cancel() -> None:
    """The agent's receive with a timeout (not poll then receive): a reply later than one 0.25 s slice is
    still taken; a cancel during a wait ends it with RequestCancelled; no reply at all is a timeout."""
    import threading

    from hermes.client.transport import DataClient, RequestCancelled, ServerUnreachable

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    token = "t" * 43
    cancel = threading.Event()
    dc = DataClient(f"tcp://127.0.0.1:{port}", "w0001", token, timeout=HANG_S, retries=0, cancel=cancel)

    def answer_late(delay: float) -> None:
        assert router.poll(int(HANG_S * 1000))
        identity, first = router.recv_multipart()[:2]
        asked = Header.unpack(first)
        time.sleep(delay)
        reply = Header(type=MsgType.STATS_ACK, worker=asked.worker, session=asked.session, seq=asked.seq)
        router.send_multipart([identity, *encode(reply, None, key=token.encode())])

    try:
        late = threading.Thread(target=answer_late, args=(0.6,))
        late.start()
        got = dc.request(MsgType.REPORT_STATS, {})
        late.join(HANG_S)
        assert got.header.type is MsgType.STATS_ACK and got.header.seq == 1
        threading.Timer(0.4, cancel.set).start()
        t0 = time.monotonic()
        with pytest.raises(RequestCancelled):
            dc.request(MsgType.REPORT_STATS, {})
        assert time.monotonic() - t0 < HANG_S
        cancel.clear()
        with pytest.raises(ServerUnreachable):
            dc.request(MsgType.REPORT_STATS, {}, timeout=0.3)
    finally:
        dc.close()
        router.close(linger=0)
        ctx.term()


def test_unpack_sets_the_fields_the_constructor_sets() -> None:
    h = _full_header()
    got = Header.unpack(h.pack())
    assert type(got) is Header and got.__dict__ == h.__dict__ and repr(got) == repr(h)
    assert set(got.__dict__) == {f.name for f in dataclasses.fields(Header)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.seq = 10  # type: ignore[misc]


@pytest.mark.parametrize("max_frame_bytes", [1 << 20, 1000])
def test_encode_frames_a_tensor_as_a_prepared_payload_does(max_frame_bytes: int) -> None:
    """A tensor framed in ``encode`` (no PreparedPayload) gives the bytes, the header fields and the checksum
    that framing it as a PreparedPayload gives; signed, the MAC verifies; its errors are the same."""
    import torch

    from hermes.common.wire import decode, prepare, verify_mac

    t = torch.arange(2500, dtype=torch.float32)
    h = Header(type=MsgType.PUSH_UPDATE, worker="w", session="s", seq=3, body={"samples": 1})
    plain = encode(h, t, max_frame_bytes=max_frame_bytes)
    framed = encode(h, prepare(t, max_frame_bytes=max_frame_bytes))
    assert len(plain) == len(framed) == 1 + -(-t.numel() * 4 // max_frame_bytes)
    assert plain[0] == framed[0]  # unsigned: the same header bytes, checksum included
    assert [bytes(f) for f in plain[1:]] == [f.bytes for f in framed[1:]]
    key = b"k" * 32
    signed = encode(h, t, key=key, max_frame_bytes=max_frame_bytes)
    msg = decode(signed)
    assert verify_mac(signed[0], msg.header, signed[1:], key)
    want = Header.unpack(framed[0])
    assert (msg.header.dtype, msg.header.shapes, msg.header.frame_bytes, msg.header.checksum) == (
        want.dtype, want.shapes, want.frame_bytes, 0)
    assert msg.payload is not None and torch.equal(msg.payload.flat(), t)
    raw = encode(h, bytes(range(200)), key=key)  # bytes: sent as uint8, as before
    assert Header.unpack(raw[0]).dtype == "uint8" and bytes(raw[1]) == bytes(range(200))
    with pytest.raises(ValueError, match="shapes describe 3 elements"):
        encode(dataclasses.replace(h, shapes=((3,),)), t)
    with pytest.raises(ProtocolError) as err:
        encode(h, torch.zeros(3, dtype=torch.complex64))
    assert err.value.code is ErrorCode.BAD_DTYPE


def test_agent_sends_and_receives_messages_whole() -> None:
    """The agent's part-by-part send and receive (client/transport.py) over a real DEALER/ROUTER pair: messages
    stay whole and in order; with nothing to receive the receive timeout raises ``zmq.Again``."""
    from hermes.client.transport import _recv_parts, _send_parts

    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.rcvtimeo = 50
        with pytest.raises(zmq.Again):
            _recv_parts(dealer)
        payload = bytes(range(256)) * 400  # above pyzmq's copy threshold: sent zero-copy
        _send_parts(dealer, [b"head", memoryview(payload), zmq.Frame(b"tail")])
        _send_parts(dealer, [b"alone"])
        got = []
        for _ in range(2):
            assert router.poll(int(HANG_S * 1000))
            got.append(router.recv_multipart())
        assert got[0][1:] == [b"head", payload, b"tail"] and got[1][1:] == [b"alone"]
        router.send_multipart([got[0][0], b"r1", payload])
        router.send_multipart([got[0][0], b"r2"])
        dealer.rcvtimeo = int(HANG_S * 1000)
        assert [f.bytes for f in _recv_parts(dealer)] == [b"r1", payload]
        assert [f.bytes for f in _recv_parts(dealer)] == [b"r2"]
    finally:
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()


class _StubEngine:
    """What the data plane asks of an engine, with a handler that answers at once, or waits for ``gate`` (as a
    push held at a barrier does), or refuses; each reply says what a context variable held when the handler
    started (nothing, unless a request's context leaked into the next) and when it answered (its own seq)."""

    max_message_bytes = 1 << 20

    def __init__(self) -> None:
        import asyncio
        import contextvars
        from types import SimpleNamespace

        from hermes.common.clock import SYSTEM_CLOCK
        from hermes.server.metrics import ServerMetrics

        self.clock = SYSTEM_CLOCK
        self.metrics = ServerMetrics()
        self.registry = SimpleNamespace(get=lambda worker: worker or None)
        self.gate = asyncio.Event()
        self.var: contextvars.ContextVar[int] = contextvars.ContextVar("stub_request")

    async def handle(self, frames: list, header: Header | None = None, size: int | None = None) -> list:
        import asyncio

        assert header is not None
        before = self.var.get(None)
        self.var.set(header.seq)
        if header.body.get("wait"):
            await self.gate.wait()
            await asyncio.sleep(0)  # a bare yield too
        if header.body.get("refuse"):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "refused")
        return [Header(type=MsgType.STATS_ACK, seq=header.seq, body={"before": before, "own": self.var.get()}).pack()]


@contextlib.contextmanager
def _served_plane(**plane_kwargs: object) -> Iterator[SimpleNamespace]:
    """A ``DataPlane`` over ``_StubEngine`` on an event loop of its own thread, and three DEALERs connected to it:
    ``on_loop(fn)`` runs ``fn`` on that loop; ``ask``/``answer`` send a REPORT_STATS request (``pad``: a second
    frame of those bytes) and read a reply's header."""
    import asyncio
    import threading

    from hermes.server.dataplane import DataPlane

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(fn):  # noqa: ANN001, ANN202 - a test helper
        async def call():  # noqa: ANN202
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), loop).result(HANG_S)

    def ask(sock: zmq.Socket, seq: int, pad: bytes = b"", **body: object) -> None:
        head = Header(type=MsgType.REPORT_STATS, worker="w", seq=seq, body=dict(body)).pack()
        sock.send_multipart([head, pad] if pad else [head])

    def answer(sock: zmq.Socket) -> Header:
        assert sock.poll(int(HANG_S * 1000))
        return Header.unpack(sock.recv_multipart()[0])

    def wait_inflight(n: int) -> None:
        deadline = time.monotonic() + HANG_S
        while on_loop(lambda: len(plane._inflight)) != n:
            assert time.monotonic() < deadline
            time.sleep(0.01)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(plane.stop(), loop).result(HANG_S)

    engine = on_loop(_StubEngine)
    plane = DataPlane(engine, "127.0.0.1", 0, **plane_kwargs)  # type: ignore[arg-type]
    port = asyncio.run_coroutine_threadsafe(plane.start(), loop).result(HANG_S)
    ctx = zmq.Context()
    socks = [ctx.socket(zmq.DEALER) for _ in range(3)]
    try:
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://127.0.0.1:{port}")
        yield SimpleNamespace(engine=engine, plane=plane, socks=socks, on_loop=on_loop, ask=ask, answer=answer,
                              wait_inflight=wait_inflight, stop=stop)
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(HANG_S)


def test_data_plane_answers_at_once_and_continues_waiting_requests_in_tasks() -> None:
    """The data plane runs each request's handler on the turn that received it: one that answers at once is
    answered and forgotten (no task, nothing left counted); one that waits goes on in a task, counted in flight,
    while others are answered, and ends with its own context; a refusal is an error reply; stopping cancels a
    request still waiting."""
    with _served_plane() as t:
        plane, socks, on_loop, ask, answer = t.plane, t.socks, t.on_loop, t.ask, t.answer
        ask(socks[0], 1, wait=True)
        ask(socks[1], 2)
        got = answer(socks[1])  # answered while the first waits
        assert (got.seq, got.body) == (2, {"before": None, "own": 2})
        assert on_loop(lambda: (len(plane._inflight), plane.inflight_bytes > 0)) == (1, True)
        ask(socks[1], 3, refuse=True)
        refused = answer(socks[1])
        assert refused.type is MsgType.ERROR and refused.body["code"] == ErrorCode.BAD_REQUEST.value
        on_loop(t.engine.gate.set)
        got = answer(socks[0])
        assert (got.seq, got.body) == (1, {"before": None, "own": 1})
        for seq in range(4, 9):
            ask(socks[1], seq)
            assert answer(socks[1]).body == {"before": None, "own": seq}
        assert on_loop(lambda: (len(plane._inflight), plane.inflight_bytes, plane._per_peer)) == (0, 0, {})
        on_loop(t.engine.gate.clear)
        ask(socks[2], 9, wait=True)
        t.wait_inflight(1)
        task = on_loop(lambda: next(iter(plane._inflight)))
        t.stop()
        assert task.cancelled()


def test_data_plane_in_flight_budget_counts_waiting_requests() -> None:
    """``max_inflight_bytes`` bounds the bytes of requests being handled: requests waiting in their tasks hold
    theirs, one that would go over is refused ``unavailable`` (counted and logged), and once they are answered
    the next is admitted. (A request answered on the turn it arrives holds its bytes only while it runs.)"""
    import logging

    pad = b"x" * 4000
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("hermes.server.dataplane").addHandler(handler)
    try:
        with _served_plane(max_inflight_bytes=10_000) as t:
            plane, socks, on_loop, ask, answer = t.plane, t.socks, t.on_loop, t.ask, t.answer
            ask(socks[0], 1, pad, wait=True)
            ask(socks[1], 2, pad, wait=True)
            t.wait_inflight(2)
            ask(socks[2], 3, pad)  # 3 x ~4 KB > 10,000 bytes
            refused = answer(socks[2])
            assert refused.type is MsgType.ERROR and refused.body["code"] == ErrorCode.UNAVAILABLE.value
            hits = on_loop(lambda: t.engine.metrics.limit_hits.labels(limit="inflight_bytes")._value.get())
            assert hits == 1 and any("in-flight memory budget hit" in r.getMessage() for r in records)
            on_loop(t.engine.gate.set)
            assert {answer(socks[0]).seq, answer(socks[1]).seq} == {1, 2}
            ask(socks[2], 4, pad)
            assert answer(socks[2]).body == {"before": None, "own": 4}
            assert on_loop(lambda: (len(plane._inflight), plane.inflight_bytes)) == (0, 0)
            t.stop()
    finally:
        logging.getLogger("hermes.server.dataplane").removeHandler(handler)
