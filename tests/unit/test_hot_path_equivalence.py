"""The request hot path's shortcuts (issue 31) give what the general code gave: the header copy in ``encode``,
``Header.unpack``'s exact-type path and its errors, the data plane's frame-by-frame receive and part-by-part
send over a real ZeroMQ pair, and the codecs' cached element count."""

from __future__ import annotations

import dataclasses
import time

import msgpack
import pytest
import zmq

from hermes.common import codecs
from hermes.common.header import PROTOCOL_VERSION, ErrorCode, Header, MsgType, ProtocolError
from hermes.common.wire import _replaced, encode
from hermes.server.dataplane import _recv_message, _send_message

HANG_S = 30.0


def _full_header() -> Header:
    return Header(type=MsgType.PUSH_UPDATE, worker="w0007", session="s" * 16, seq=9, ts=123, model_version=4,
                  dtype="float32", shapes=((2, 3), (4,)), frame_bytes=(40,), checksum=77,
                  body={"samples": 32, "codec": {"name": "topk", "k": 3}}, nonce="n" * 32, mac="m" * 32)


def test_replaced_is_dataclasses_replace() -> None:
    h = _full_header()
    changes = dict(dtype="uint8", shapes=((10,),), frame_bytes=(10,), checksum=0, nonce="", mac="")
    got, want = _replaced(h, **changes), dataclasses.replace(h, **changes)
    assert got == want and got.__dict__ == want.__dict__
    assert h.dtype == "float32"  # the original is untouched
    # What makes the copy the same object: no slots, no __post_init__ (a change here must revisit _replaced).
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
