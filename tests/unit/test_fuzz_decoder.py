"""Fuzzing the data-plane decoder: a Message or a ProtocolError, never anything else.

The server's loop turns ProtocolError into an error reply; any other exception
would be an ``internal`` error at best. So for arbitrary bytes, arbitrary
frame lists, structured-but-mutated headers and corrupted valid messages,
``decode`` and ``Header.unpack`` must either succeed or raise ProtocolError,
and what they return must be self-consistent.
"""

from __future__ import annotations

import math

import msgpack
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.common.wire import (
    FLOAT_WIRE_DTYPES,
    PROTOCOL_VERSION,
    Header,
    Message,
    MsgType,
    ProtocolError,
    checksum_of,
    decode,
    encode,
    numel_of,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL_LIMIT = 1 << 16

HEADER_KEYS = ["type", "proto", "worker", "session", "seq", "ts", "mac", "model_version", "dtype", "shapes", "frame_bytes",
               "checksum", "body"]
DTYPE_NAMES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "uint8", "int8",
               "complex64", "", "f4"]
TYPE_NAMES = [t.value for t in MsgType] + ["explode", ""]

ints = st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), st.integers(-3, 64))
scalars = st.one_of(
    st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.binary(max_size=12),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=4)),
    max_leaves=12,
)
# Values biased toward what the real fields hold, so the decoder gets past the first checks.
field_values = {
    "type": st.one_of(st.sampled_from(TYPE_NAMES), values),
    "proto": st.one_of(st.just(PROTOCOL_VERSION), values),
    "dtype": st.one_of(st.sampled_from(DTYPE_NAMES), values),
    "shapes": st.one_of(st.lists(st.lists(st.integers(-1, 9), max_size=3), max_size=3), values),
    "frame_bytes": st.one_of(st.lists(st.integers(-1, 80), max_size=4), values),
    "checksum": st.one_of(st.integers(0, 2**32 - 1), values),
    "seq": st.one_of(st.integers(0, 2**32), values),
    "model_version": st.one_of(st.integers(0, 10), values),
}


@st.composite
def headers(draw) -> dict:
    """A real-looking header with a few fields dropped or replaced by values of random types."""
    out = {
        "type": draw(st.sampled_from(TYPE_NAMES)), "proto": PROTOCOL_VERSION, "worker": "w0001", "session": "s",
        "ts": draw(st.integers(0, 2**45)), "mac": draw(st.text(alphabet="0123456789abcdef", max_size=64)),
        "seq": draw(st.integers(0, 2**32)), "model_version": 0, "dtype": draw(st.sampled_from(DTYPE_NAMES)),
        "shapes": draw(st.lists(st.lists(st.integers(0, 6), max_size=3), max_size=3)),
        "frame_bytes": draw(st.lists(st.integers(0, 48), max_size=3)),
        "checksum": draw(st.integers(0, 2**32 - 1)), "body": draw(st.dictionaries(st.text(max_size=5), values, max_size=3)),
    }
    for key in draw(st.lists(st.sampled_from(HEADER_KEYS), unique=True, max_size=3)):
        if draw(st.integers(0, 3)) == 0:
            del out[key]
        else:
            out[key] = draw(field_values.get(key, values))
    if draw(st.integers(0, 4)) == 0:
        out.update(draw(st.dictionaries(st.text(max_size=5), values, max_size=2)))
    return out


@st.composite
def header_and_frames(draw) -> tuple[dict, list[bytes]]:
    header = draw(headers())
    fb = header.get("frame_bytes")
    if (isinstance(fb, list) and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 64 for n in fb)
            and draw(st.booleans())):
        # Frames of exactly the announced lengths, so decoding reaches the dtype/shape/checksum checks.
        frames = [draw(st.binary(min_size=n, max_size=n)) for n in fb]
    else:
        frames = draw(st.lists(st.binary(max_size=64), max_size=3))
    return header, frames


def _pack(obj) -> bytes | None:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        return None


def _check(frames) -> Message | None:
    """Decode; only ProtocolError may escape, and a returned Message must be consistent."""
    try:
        msg = decode(frames, max_message_bytes=SMALL_LIMIT)
    except ProtocolError as exc:
        assert exc.code is not None and isinstance(exc.message, str)
        return None
    assert isinstance(msg, Message)
    h = msg.header
    assert isinstance(h.type, MsgType) and h.proto == PROTOCOL_VERSION
    assert len(h.frame_bytes) == len(frames) - 1
    if msg.payload is not None:
        p = msg.payload
        assert p.numel == numel_of(h.shapes)
        assert sum(c.numel() * c.element_size() for c in p.chunks) == sum(h.frame_bytes)
        # Unsigned messages carry the CRC; a signed one's MAC is checked by its receiver (verify_mac).
        assert h.mac or checksum_of([bytes(f) for f in frames[1:]]) == h.checksum
        assert sum(t.numel() for t in p.tensors()) == p.numel
    return msg


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_header_bytes(raw):
    try:
        h = Header.unpack(raw)
    except ProtocolError:
        return
    assert isinstance(h, Header)


@FUZZ
@given(st.lists(st.binary(max_size=120), min_size=0, max_size=5))
def test_arbitrary_frame_lists(frames):
    _check(frames)


@FUZZ
@given(header_and_frames())
def test_structured_mutated_headers(header_frames):
    header, payload_frames = header_frames
    raw = _pack(header)
    if raw is None:
        return
    try:
        h = Header.unpack(raw)
    except ProtocolError:
        h = None
    if h is not None:
        # Whatever was accepted has the declared types.
        assert isinstance(h.worker, str) and isinstance(h.session, str) and isinstance(h.mac, str) and isinstance(h.body, dict)
        assert isinstance(h.seq, int) and isinstance(h.checksum, int) and isinstance(h.dtype, str)
        assert all(isinstance(d, int) and d >= 0 for s in h.shapes for d in s)
        assert all(isinstance(n, int) and n >= 0 for n in h.frame_bytes)
    _check([raw, *payload_frames])


@st.composite
def consistent_messages(draw) -> list[bytes]:
    """A header that agrees with its payload frames (so decoding reaches the payload checks), then mutated."""
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16", "int32", "uint8", "float64"]))
    item = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    shapes = draw(st.lists(st.lists(st.integers(0, 4), max_size=3), max_size=3))
    n = sum(math.prod(s) for s in shapes)
    data = draw(st.binary(min_size=n * item, max_size=n * item))
    cut = draw(st.integers(1, 64))
    step = max(item, cut // item * item)
    frames = [data[i : i + step] for i in range(0, len(data), step)]
    header = {
        "type": draw(st.sampled_from(TYPE_NAMES[:-2])), "proto": PROTOCOL_VERSION, "worker": "w", "session": "s", "ts": 0, "mac": "",
        "seq": 1, "model_version": 0, "dtype": dtype, "shapes": shapes,
        "frame_bytes": [len(f) for f in frames], "checksum": checksum_of(frames), "body": {},
    }
    mutation = draw(st.sampled_from(["none", "flip", "truncate", "drop", "extra", "field", "split"]))
    if mutation == "flip" and data:
        i = draw(st.integers(0, len(frames) - 1))
        if frames[i]:
            j = draw(st.integers(0, len(frames[i]) - 1))
            frames[i] = frames[i][:j] + bytes([frames[i][j] ^ draw(st.integers(1, 255))]) + frames[i][j + 1 :]
    elif mutation == "truncate" and frames:
        i = draw(st.integers(0, len(frames) - 1))
        frames[i] = frames[i][: draw(st.integers(0, len(frames[i])))]
    elif mutation == "drop" and frames:
        frames.pop(draw(st.integers(0, len(frames) - 1)))
    elif mutation == "extra":
        frames.insert(draw(st.integers(0, len(frames))), draw(st.binary(max_size=16)))
    elif mutation == "field":
        header[draw(st.sampled_from(HEADER_KEYS))] = draw(values)
    elif mutation == "split" and data:
        at = draw(st.integers(0, len(data)))
        frames = [data[:at], data[at:]]
        header["frame_bytes"] = [at, len(data) - at]
    raw = _pack(header)
    return [raw, *frames] if raw is not None else [b"\xc1", *frames]


@FUZZ
@given(consistent_messages())
def test_mutated_valid_messages(frames):
    _check(frames)


@FUZZ
@given(
    st.sampled_from(sorted(FLOAT_WIRE_DTYPES)),
    st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=4),
    st.integers(1, 100),
    st.integers(0, 2**31),
)
def test_encode_decode_round_trip_property(dtype_name, shapes, max_frame_bytes, seed):
    shapes = tuple(tuple(s) for s in shapes)
    n = numel_of(shapes)
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(n, generator=g).to(getattr(torch, dtype_name))
    frames = [bytes(f) for f in encode(Header(type=MsgType.PUSH_UPDATE, seq=seed, shapes=shapes), flat,
                                        max_frame_bytes=max_frame_bytes)]
    msg = _check(frames)
    assert msg is not None
    assert msg.header.seq == seed and msg.header.shapes == shapes
    if n == 0:
        assert msg.payload is None
    else:
        assert msg.header.dtype == dtype_name
        assert torch.equal(msg.payload.flat(), flat)
        for t, s in zip(msg.payload.tensors(), shapes):
            assert tuple(t.shape) == s
