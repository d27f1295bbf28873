"""The data-plane codec: round trips, frame splitting, zero copy, every ProtocolError path."""

from __future__ import annotations

import math

import msgpack
import pytest
import torch

from hermes.common.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    ErrorCode,
    Header,
    MsgType,
    ProtocolError,
    checksum_of,
    decode,
    dtype_from_name,
    dtype_name,
    encode,
    error_frames,
    numel_of,
    split_frames,
)

SHAPES = ((3, 4), (5,), (2, 1, 3))  # 12 + 5 + 6 = 23 elements


def _values(dtype: torch.dtype, n: int = 23) -> torch.Tensor:
    # Values exactly representable in every float wire dtype (bf16 has 8 bits of mantissa).
    return (torch.arange(n, dtype=torch.float32) * 0.5 - 4.0).to(dtype)


def _push_header(**kw) -> Header:
    base = dict(type=MsgType.PUSH_UPDATE, worker="w0001", session="s1", seq=7, model_version=3,
                shapes=SHAPES, body={"samples": 32, "loss": 0.25})
    base.update(kw)
    return Header(**base)


def _as_bytes(frames) -> list[bytes]:
    return [bytes(f) for f in frames]


def _header_map(**changes) -> dict:
    d = msgpack.unpackb(_push_header().pack(), raw=False)
    for k, v in changes.items():
        if v is None:
            d.pop(k)
        else:
            d[k] = v
    return d


# ---------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_float_dtypes(dtype):
    flat = _values(dtype)
    frames = encode(_push_header(), flat)
    assert len(frames) == 2
    msg = decode(_as_bytes(frames))
    h = msg.header
    assert h.type is MsgType.PUSH_UPDATE
    assert (h.worker, h.session, h.seq, h.model_version, h.proto) == ("w0001", "s1", 7, 3, PROTOCOL_VERSION)
    assert h.body == {"samples": 32, "loss": 0.25}
    assert h.dtype == dtype_name(dtype)
    assert h.shapes == SHAPES
    assert h.frame_bytes == (23 * flat.element_size(),)
    assert h.checksum == checksum_of([bytes(frames[1])])
    p = msg.payload
    assert p is not None and p.dtype == dtype and p.numel == 23
    assert torch.equal(p.flat(), flat)
    tensors = p.tensors()
    assert [tuple(t.shape) for t in tensors] == list(SHAPES)
    assert torch.equal(tensors[0], flat[:12].view(3, 4))
    assert torch.equal(tensors[1], flat[12:17])
    assert torch.equal(tensors[2], flat[17:].view(2, 1, 3))


def test_round_trip_header_only():
    frames = encode(Header(type=MsgType.PULL_MODEL, worker="w1", session="s", seq=99, body={"dtype": "float16"}))
    assert len(frames) == 1
    msg = decode(frames)
    assert msg.payload is None
    assert msg.header.type is MsgType.PULL_MODEL and msg.header.seq == 99
    assert msg.header.body == {"dtype": "float16"}


def test_round_trip_raw_bytes_payload():
    blob = bytes(range(256)) * 3
    msg = decode(_as_bytes(encode(Header(type=MsgType.SHARD, body={"shard": 4}), blob)))
    assert msg.header.dtype == "uint8"
    assert msg.header.shapes == ((len(blob),),)
    assert bytes(msg.payload.flat().numpy()) == blob


def test_default_shapes_is_flat():
    flat = _values(torch.float32)
    msg = decode(_as_bytes(encode(Header(type=MsgType.MODEL), flat)))
    assert msg.header.shapes == ((23,),)


def test_empty_tensor_payload():
    frames = encode(Header(type=MsgType.MODEL, shapes=((0,),)), torch.empty(0))
    assert len(frames) == 1  # no payload frames at all
    msg = decode(frames)
    assert msg.payload is None
    assert msg.header.shapes == ((0,),)


def test_encode_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="23 elements"):
        encode(_push_header(), torch.zeros(22))


def test_encode_rejects_unwireable_dtype():
    with pytest.raises(ProtocolError) as ei:
        encode(Header(type=MsgType.MODEL), torch.zeros(3, dtype=torch.complex64))
    assert ei.value.code is ErrorCode.BAD_DTYPE


def test_encode_handles_non_contiguous_tensor():
    base = torch.arange(46, dtype=torch.float32)
    strided = base[::2]
    assert not strided.is_contiguous()
    msg = decode(_as_bytes(encode(Header(type=MsgType.MODEL), strided)))
    assert torch.equal(msg.payload.flat(), strided)


def test_error_frames_round_trip():
    frames = error_frames(ErrorCode.CHECKSUM, "payload checksum mismatch", seq=12, worker="w0002")
    msg = decode(frames)
    assert msg.header.type is MsgType.ERROR
    assert msg.header.seq == 12 and msg.header.worker == "w0002"
    assert msg.header.body == {"code": "checksum", "message": "payload checksum mismatch"}


def test_dtype_names():
    for name in ("float32", "float16", "bfloat16", "int32", "uint8"):
        assert dtype_name(dtype_from_name(name)) == name
    with pytest.raises(ProtocolError) as ei:
        dtype_from_name("float8")
    assert ei.value.code is ErrorCode.BAD_DTYPE


def test_numel_of():
    assert numel_of(SHAPES) == 23
    assert numel_of(()) == 0
    assert numel_of(((),)) == 1  # a scalar


# ---------------------------------------------------------------------------
# frame splitting


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("max_frame_bytes", [1, 3, 4, 10, 17, 64, 92, 1000])
def test_multi_frame_split_is_aligned_and_round_trips(dtype, max_frame_bytes):
    flat = _values(dtype)
    item = flat.element_size()
    nbytes = flat.numel() * item
    frames = encode(_push_header(), flat, max_frame_bytes=max_frame_bytes)
    payload = frames[1:]
    step = max(item, (max_frame_bytes // item) * item)
    assert len(payload) == math.ceil(nbytes / step)
    assert all(len(f) % item == 0 for f in payload), "frames must cut on element boundaries"
    assert all(len(f) <= max(max_frame_bytes, item) for f in payload)
    assert sum(len(f) for f in payload) == nbytes
    msg = decode(_as_bytes(frames))
    assert msg.header.frame_bytes == tuple(len(f) for f in payload)
    assert len(msg.payload.chunks) == len(payload)
    assert torch.equal(msg.payload.flat(), flat)
    offsets = [off for off, _ in msg.payload.offsets()]
    assert offsets == [i * (step // item) for i in range(len(payload))]
    assert [tuple(t.shape) for t in msg.payload.tensors()] == list(SHAPES)


def test_split_frames_exact_multiple():
    flat = torch.zeros(16, dtype=torch.float32)  # 64 bytes
    assert [len(f) for f in split_frames(flat, 16)] == [16, 16, 16, 16]
    assert [len(f) for f in split_frames(flat, 64)] == [64]
    assert [len(f) for f in split_frames(flat, 65)] == [64]
    assert split_frames(torch.empty(0), 16) == []


# ---------------------------------------------------------------------------
# zero copy


def test_encode_is_zero_copy():
    flat = torch.zeros(8, dtype=torch.float32)
    frames = encode(Header(type=MsgType.MODEL), flat)
    flat[3] = 1.5
    assert torch.frombuffer(bytearray(frames[1]), dtype=torch.float32)[3].item() == 1.5


def test_decode_is_zero_copy_single_frame():
    flat = _values(torch.float32)
    frames = [bytearray(f) for f in encode(_push_header(), flat)]
    msg = decode(frames)
    chunk = msg.payload.chunks[0]
    # Same memory: the chunk's data pointer is the frame's buffer ...
    addr = torch.frombuffer(frames[1], dtype=torch.uint8).data_ptr()
    assert chunk.data_ptr() == addr
    # ... and writing the buffer shows through the decoded tensor.
    frames[1][0:4] = torch.tensor([123.0]).numpy().tobytes()
    assert chunk[0].item() == 123.0
    assert msg.payload.flat()[0].item() == 123.0  # one frame: flat() is the chunk itself


def test_decode_is_zero_copy_per_chunk_for_multi_frame():
    flat = _values(torch.float16)
    frames = [bytearray(f) for f in encode(_push_header(), flat, max_frame_bytes=8)]
    msg = decode(frames)
    assert len(msg.payload.chunks) == len(frames) - 1 > 1
    for buf, chunk in zip(frames[1:], msg.payload.chunks):
        assert chunk.data_ptr() == torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
        assert chunk.numel() * 2 == len(buf)


# ---------------------------------------------------------------------------
# every ProtocolError path


def _valid_frames(**kw) -> list[bytes]:
    return _as_bytes(encode(_push_header(**kw), _values(torch.float32)))


def _replace_header(frames: list[bytes], header: dict) -> list[bytes]:
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def _code(frames, **kw) -> ErrorCode:
    with pytest.raises(ProtocolError) as ei:
        decode(frames, **kw)
    assert ei.value.message and str(ei.value).startswith(ei.value.code.value + ": ")
    return ei.value.code


def test_error_empty_message():
    assert _code([]) is ErrorCode.MALFORMED


def test_error_message_too_large():
    frames = _valid_frames()
    total = sum(len(f) for f in frames)
    assert _code(frames, max_message_bytes=total - 1) is ErrorCode.TOO_LARGE
    decode(frames, max_message_bytes=total)  # exactly at the limit is fine


def test_error_header_too_large():
    big = msgpack.packb({**_header_map(), "body": {"pad": "x" * MAX_HEADER_BYTES}})
    assert len(big) > MAX_HEADER_BYTES
    assert _code([big]) is ErrorCode.TOO_LARGE
    with pytest.raises(ProtocolError):
        Header.unpack(big)


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x81", b"\x93\x01", bytes(range(200, 240)), b"\x80\x00"],
                         ids=["empty", "never_used_byte", "truncated_map", "truncated_array", "garbage", "trailing"])
def test_error_not_msgpack(raw):
    assert _code([raw]) is ErrorCode.MALFORMED


@pytest.mark.parametrize("obj", [[1, 2], "push_update", 5, None, 1.5, True], ids=lambda o: type(o).__name__)
def test_error_header_not_a_map(obj):
    with pytest.raises(ProtocolError) as ei:
        Header.unpack(msgpack.packb(obj))
    assert ei.value.code is ErrorCode.MALFORMED
    assert "map" in ei.value.message


def test_error_non_string_keys():
    assert _code([msgpack.packb({1: "x"})]) is ErrorCode.MALFORMED


def test_error_binary_in_header():
    assert _code([msgpack.packb(_header_map(body={"b": b"\x00"}), use_bin_type=True)]) is ErrorCode.MALFORMED


@pytest.mark.parametrize("field", ["proto", "type"])
def test_error_missing_required_field(field):
    with pytest.raises(ProtocolError) as ei:
        Header.unpack(msgpack.packb(_header_map(**{field: None})))
    assert ei.value.code is ErrorCode.MALFORMED
    assert repr(field) in ei.value.message


def test_optional_fields_default():
    h = Header.unpack(msgpack.packb({"proto": PROTOCOL_VERSION, "type": "pull_model"}))
    assert (h.worker, h.session, h.seq, h.ts, h.model_version, h.dtype, h.mac) == ("", "", 0, 0, 0, "", "")
    assert (h.shapes, h.frame_bytes, h.checksum, h.body) == ((), (), 0, {})


@pytest.mark.parametrize(
    "field,value",
    [
        ("proto", "1"), ("proto", True), ("proto", 1.0), ("type", 1), ("worker", 5), ("session", None), ("mac", 7), ("ts", "now"),
        ("seq", "3"), ("seq", False), ("model_version", 2.5), ("dtype", 4), ("shapes", "23"),
        ("shapes", [[-1]]), ("shapes", [["3"]]), ("shapes", [[True]]), ("shapes", [3]), ("shapes", [[1.0]]),
        ("frame_bytes", 92), ("frame_bytes", [-1]), ("frame_bytes", ["92"]), ("frame_bytes", [False]),
        ("checksum", "abc"), ("checksum", None), ("body", [1]), ("body", "x"),
    ],
)
def test_error_wrong_field_type(field, value):
    with pytest.raises(ProtocolError) as ei:
        Header.unpack(msgpack.packb({**_header_map(), field: value}))
    assert ei.value.code is ErrorCode.MALFORMED
    assert field in ei.value.message or "shape" in ei.value.message


@pytest.mark.parametrize("proto", [0, 1, PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 100, -1])
def test_error_unsupported_version(proto):
    with pytest.raises(ProtocolError) as ei:
        Header.unpack(msgpack.packb(_header_map(proto=proto)))
    assert ei.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert str(proto) in ei.value.message


@pytest.mark.parametrize("name", ["explode", "", "PUSH_UPDATE", "push-update"])
def test_error_unknown_type(name):
    with pytest.raises(ProtocolError) as ei:
        Header.unpack(msgpack.packb(_header_map(type=name)))
    assert ei.value.code is ErrorCode.UNKNOWN_TYPE


def test_error_frame_count_mismatch():
    frames = _valid_frames()
    assert _code(frames[:1]) is ErrorCode.MALFORMED
    assert _code(frames + [b"\x00" * 4]) is ErrorCode.MALFORMED


def test_error_frame_length_mismatch():
    frames = _valid_frames()
    assert _code([frames[0], frames[1][:-4]]) is ErrorCode.MALFORMED
    assert _code([frames[0], frames[1] + b"\x00\x00\x00\x00"]) is ErrorCode.MALFORMED


def test_error_unknown_dtype():
    frames = _valid_frames()
    h = msgpack.unpackb(frames[0])
    assert _code(_replace_header(frames, {**h, "dtype": "complex64"})) is ErrorCode.BAD_DTYPE
    assert _code(_replace_header(frames, {**h, "dtype": ""})) is ErrorCode.BAD_DTYPE


def test_error_shapes_disagree_with_bytes():
    frames = _valid_frames()
    h = msgpack.unpackb(frames[0])
    assert _code(_replace_header(frames, {**h, "shapes": [[24]]})) is ErrorCode.BAD_SHAPE
    assert _code(_replace_header(frames, {**h, "shapes": [[3, 4]]})) is ErrorCode.BAD_SHAPE
    # Same bytes but a 2-byte dtype: twice as many elements as the shapes say.
    assert _code(_replace_header(frames, {**h, "dtype": "float16"})) is ErrorCode.BAD_SHAPE


def test_error_frame_not_element_aligned():
    frames = _valid_frames()
    h = msgpack.unpackb(frames[0])
    data = frames[1]
    split = [data[:6], data[6:]]
    bad = _replace_header(frames[:1], {**h, "frame_bytes": [6, len(data) - 6]}) + split
    assert _code(bad) is ErrorCode.MALFORMED


def test_error_checksum():
    frames = _valid_frames()
    flipped = bytearray(frames[1])
    flipped[5] ^= 0x10
    assert _code([frames[0], bytes(flipped)]) is ErrorCode.CHECKSUM
    h = msgpack.unpackb(frames[0])
    assert _code(_replace_header(frames, {**h, "checksum": (h["checksum"] + 1) % 2**32})) is ErrorCode.CHECKSUM
    # With verification off the corrupted payload decodes (the caller opted out).
    msg = decode([frames[0], bytes(flipped)], verify_checksum=False)
    assert msg.payload.numel == 23


def test_checksum_covers_frame_boundaries_in_order():
    flat = _values(torch.float32)
    frames = _as_bytes(encode(_push_header(), flat, max_frame_bytes=16))
    # Swapping two equal-length payload frames keeps every length but breaks the checksum.
    swapped = [frames[0], frames[2], frames[1], *frames[3:]]
    assert _code(swapped) is ErrorCode.CHECKSUM


def test_default_limit_is_large():
    assert DEFAULT_MAX_MESSAGE_BYTES >= 64 * 1024 * 1024


def test_a_uint8_payload_is_sent_as_one_view_of_its_memory_and_a_strided_one_as_a_copy():
    """The compressed push's path (one torch call): a contiguous uint8 tensor's frame is its own memory; a strided
    one goes the general way (a contiguous copy) with the same bytes; a payload over the frame limit is still cut."""
    t = torch.arange(200, dtype=torch.uint8)
    (frame,) = split_frames(t)
    t[3] = 99
    assert frame[3] == 99  # a view, not a copy
    strided = t[::2]
    assert bytes(split_frames(strided)[0]) == bytes(strided.contiguous().numpy())
    assert [len(f) for f in split_frames(t, 64)] == [64, 64, 64, 8]
    msg = decode(encode(Header(type=MsgType.PUSH_UPDATE), t))
    assert torch.equal(msg.payload.chunks[0], t)


def test_header_make_is_the_dataclass_header():
    """Header.make (the hot paths' constructor) builds the object Header(...) does: equal, packed alike, a body of
    its own when none is given."""
    fields = {"type": MsgType.PUSH_UPDATE, "worker": "w-1", "session": "s", "seq": 7, "ts": 5, "model_version": 3,
              "shapes": ((2, 3),), "body": {"samples": 32}}
    assert Header.make(**fields) == Header(**fields)
    assert Header.make(**fields).pack() == Header(**fields).pack()
    a, b = Header.make(type=MsgType.PULL_MODEL), Header.make(type=MsgType.PULL_MODEL)
    assert a == Header(type=MsgType.PULL_MODEL) and a.body == {} and a.body is not b.body
