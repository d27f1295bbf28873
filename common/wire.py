"""Data-plane wire format: one msgpack header frame + raw tensor frames.

A message on the wire is a ZeroMQ multipart message::

    [header (msgpack map)] [payload frame 0] [payload frame 1] ...

The header names the message type, protocol version, sender, model version,
the payload's dtype and logical shapes, the byte length of every payload
frame and a CRC32C over all payload bytes. The payload is one flat vector
(the tensors of ``shapes`` concatenated in order) cut into frames of at most
``MAX_FRAME_BYTES``: above 32 MB glibc stops reusing freed blocks and
loopback throughput falls to a third.

Nothing here pickles; frames are sent and received zero-copy (``copy=False``)
and decoded with ``torch.frombuffer`` over the received buffer.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import crc32c
import msgpack
import torch

from hermes.common.signing import MAC_HEX_CHARS, mac_hex, macs_equal

# 2: per-message HMAC (mac, session, ts) replaced the bearer token of version 1.
PROTOCOL_VERSION = 2
MAX_FRAME_BYTES = 32 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 512 * 1024 * 1024


class MsgType(str, enum.Enum):
    PUSH_UPDATE = "push_update"
    PUSH_REPLY = "push_reply"
    PULL_MODEL = "pull_model"
    MODEL = "model"
    REQUEST_WORK = "request_work"
    WORK = "work"
    FETCH_SHARD = "fetch_shard"
    SHARD = "shard"
    REPORT_STATS = "report_stats"
    STATS_ACK = "stats_ack"
    ERROR = "error"


REQUEST_TYPES = frozenset(
    {MsgType.PUSH_UPDATE, MsgType.PULL_MODEL, MsgType.REQUEST_WORK, MsgType.FETCH_SHARD, MsgType.REPORT_STATS}
)


class ErrorCode(str, enum.Enum):
    MALFORMED = "malformed"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_WORKER = "unknown_worker"
    UNAUTHORIZED = "unauthorized"
    REPLAY = "replay"
    BAD_SHAPE = "bad_shape"
    BAD_DTYPE = "bad_dtype"
    NON_FINITE = "non_finite"
    TOO_LARGE = "too_large"
    CHECKSUM = "checksum"
    BAD_REQUEST = "bad_request"
    STALE = "stale"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


class ProtocolError(Exception):
    """A message that violates the wire contract; carries the code to reply with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


# Wire dtype names. bf16 has no numpy twin, so everything goes through torch.
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
FLOAT_WIRE_DTYPES = frozenset({"float32", "float16", "bfloat16"})


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"unknown dtype {name!r}; known: {sorted(_DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"dtype {dtype} cannot travel on the wire") from None


def numel_of(shapes: Sequence[Sequence[int]]) -> int:
    return sum(math.prod(s) for s in shapes)


@dataclass(frozen=True)
class Header:
    type: MsgType
    worker: str = ""
    # Random per connection; (session, seq) is strictly increasing and ts (ms,
    # server clock) fresh, which is how replays are told apart.
    session: str = ""
    seq: int = 0
    ts: int = 0
    model_version: int = 0
    dtype: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()
    frame_bytes: tuple[int, ...] = ()
    checksum: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    proto: int = PROTOCOL_VERSION
    # HMAC-SHA256 (hex) over the packed header up to this value (always the
    # last entry, so its 64 characters end the frame) and the payload.
    mac: str = ""

    def pack(self) -> bytes:
        return msgpack.packb(
            {
                "type": self.type.value,
                "proto": self.proto,
                "worker": self.worker,
                "session": self.session,
                "seq": self.seq,
                "ts": self.ts,
                "model_version": self.model_version,
                "dtype": self.dtype,
                "shapes": [list(s) for s in self.shapes],
                "frame_bytes": list(self.frame_bytes),
                "checksum": self.checksum,
                "body": self.body,
                "mac": self.mac,
            },
            use_bin_type=True,
        )

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> Header:
        if len(raw) > MAX_HEADER_BYTES:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
        try:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
        except Exception as exc:  # msgpack raises a zoo of types for garbage
            raise ProtocolError(ErrorCode.MALFORMED, f"header is not msgpack: {exc}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(ErrorCode.MALFORMED, "header must be a msgpack map")
        proto = _field(obj, "proto", int)
        if proto != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_VERSION, f"protocol version {proto} unsupported; this peer speaks {PROTOCOL_VERSION}"
            )
        type_name = _field(obj, "type", str)
        try:
            msg_type = MsgType(type_name)
        except ValueError:
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name!r}") from None
        shapes_raw = _field(obj, "shapes", list, default=[])
        shapes = []
        for s in shapes_raw:
            if not isinstance(s, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s):
                raise ProtocolError(ErrorCode.MALFORMED, f"shape {s!r} is not a list of non-negative ints")
            shapes.append(tuple(s))
        frame_bytes = _field(obj, "frame_bytes", list, default=[])
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in frame_bytes):
            raise ProtocolError(ErrorCode.MALFORMED, "frame_bytes must be non-negative ints")
        body = _field(obj, "body", dict, default={})
        return cls(
            type=msg_type,
            proto=proto,
            worker=_field(obj, "worker", str, default=""),
            session=_field(obj, "session", str, default=""),
            seq=_field(obj, "seq", int, default=0),
            ts=_field(obj, "ts", int, default=0),
            model_version=_field(obj, "model_version", int, default=0),
            dtype=_field(obj, "dtype", str, default=""),
            shapes=tuple(shapes),
            frame_bytes=tuple(frame_bytes),
            checksum=_field(obj, "checksum", int, default=0),
            body=body,
            mac=_field(obj, "mac", str, default=""),
        )


_MISSING = object()


def _field(obj: dict, key: str, kind: type, default: Any = _MISSING) -> Any:
    if key not in obj:
        if default is _MISSING:
            raise ProtocolError(ErrorCode.MALFORMED, f"header field {key!r} is missing")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(ErrorCode.MALFORMED, f"header field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def checksum_of(frames: Iterable[memoryview | bytes]) -> int:
    value = 0
    for f in frames:
        value = crc32c.crc32c(f, value)
    return value


def _as_bytes_view(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (bf16 included)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    # numpy has no bf16/fp16-safe path for every dtype: reinterpret as bytes.
    return t.view(torch.uint8).numpy().data.cast("B")


def split_frames(flat: torch.Tensor, max_frame_bytes: int = MAX_FRAME_BYTES) -> list[memoryview]:
    """Cut a flat tensor into element-aligned byte frames of at most max_frame_bytes."""
    view = _as_bytes_view(flat)
    item = flat.element_size()
    step = max(item, (max_frame_bytes // item) * item)
    if len(view) == 0:
        return []
    return [view[i : i + step] for i in range(0, len(view), step)]


@dataclass(frozen=True)
class Payload:
    """A decoded flat payload: a list of chunk tensors viewing the received frames."""

    dtype: torch.dtype
    chunks: tuple[torch.Tensor, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return sum(c.numel() for c in self.chunks)

    def offsets(self) -> Iterable[tuple[int, torch.Tensor]]:
        off = 0
        for c in self.chunks:
            yield off, c
            off += c.numel()

    def flat(self) -> torch.Tensor:
        """The whole vector; copies only when the payload spans several frames."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        if not self.chunks:
            return torch.empty(0, dtype=self.dtype)
        return torch.cat(self.chunks)

    def tensors(self) -> list[torch.Tensor]:
        flat = self.flat()
        out, off = [], 0
        for s in self.shapes:
            n = math.prod(s)
            out.append(flat[off : off + n].view(s))
            off += n
        return out


@dataclass(frozen=True)
class Message:
    header: Header
    payload: Payload | None = None


@dataclass(frozen=True)
class PreparedPayload:
    """Frames and checksum of a tensor, computed once and sent many times
    (the server's model snapshot is pulled by every worker)."""

    tensor: torch.Tensor  # keeps the frames' memory alive
    frames: tuple[memoryview, ...]
    checksum: int
    dtype: str


def prepare(flat: torch.Tensor, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> PreparedPayload:
    frames = tuple(split_frames(flat, max_frame_bytes))
    return PreparedPayload(flat, frames, checksum_of(frames), dtype_name(flat.dtype))


def encode(
    header: Header,
    flat: torch.Tensor | bytes | PreparedPayload | None = None,
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    key: bytes | None = None,
) -> list:
    """Build the frames of one message. ``flat`` is sent zero-copy.

    With ``key`` the header carries the HMAC of header and payload (see
    hermes.common.signing).

    ``flat`` is a tensor (any wire dtype) or raw bytes (sent as uint8). The
    caller must keep it alive and unmodified until ZeroMQ has sent it (send
    with ``copy=False`` and do not mutate the tensor in the meantime).
    """
    if flat is None:
        return [_pack_signed(header, (), key)]
    if isinstance(flat, (bytes, bytearray, memoryview)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only bytes, never written through
            flat = torch.frombuffer(flat, dtype=torch.uint8) if len(flat) else torch.empty(0, dtype=torch.uint8)
    if not isinstance(flat, PreparedPayload):
        flat = prepare(flat, max_frame_bytes=max_frame_bytes)
    numel = flat.tensor.numel()
    if header.shapes and numel_of(header.shapes) != numel:
        raise ValueError(f"shapes describe {numel_of(header.shapes)} elements but tensor has {numel}")
    full = Header(
        type=header.type,
        worker=header.worker,
        session=header.session,
        seq=header.seq,
        ts=header.ts,
        model_version=header.model_version,
        dtype=flat.dtype,
        shapes=header.shapes or ((numel,),),
        frame_bytes=tuple(len(f) for f in flat.frames),
        checksum=flat.checksum,
        body=header.body,
    )
    return [_pack_signed(full, flat.frames, key), *flat.frames]


def _pack_signed(header: Header, frames: Sequence[Any], key: bytes | None) -> bytes:
    if key is None:
        return header.pack()
    # Packed with a placeholder of the final length: the MAC covers every
    # header byte before it, then takes its place.
    raw = replace(header, mac="0" * MAC_HEX_CHARS).pack()
    return raw[:-MAC_HEX_CHARS] + mac_hex(key, raw[:-MAC_HEX_CHARS], frames).encode()


def verify_mac(header_frame: Any, header: Header, payload_frames: Sequence[Any], key: bytes) -> bool:
    """True when the header frame ends in its ``mac`` and that is the HMAC, under ``key``, of
    every header byte before it and every payload byte. Checked on the received bytes, not a
    re-encoding: any change to them (a renamed key, another encoding of a value) fails."""
    raw = bytes(_buffer(header_frame))
    if len(header.mac) != MAC_HEX_CHARS or raw[-MAC_HEX_CHARS:] != header.mac.encode():
        return False
    return macs_equal(header.mac, mac_hex(key, raw[:-MAC_HEX_CHARS], payload_frames))


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return memoryview(frame)
    return frame.buffer  # zmq.Frame received with copy=False


def decode(frames: Sequence[Any], *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, verify_checksum: bool = True) -> Message:
    """Parse and validate the framing of one message (not its meaning).

    Raises ProtocolError for anything malformed: bad header, frame count or
    length mismatch, oversize, unknown dtype, checksum mismatch.
    """
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty message")
    bufs = [_buffer(f) for f in frames]
    total = sum(len(b) for b in bufs)
    if total > max_message_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {total} bytes exceeds the limit of {max_message_bytes}")
    header = Header.unpack(bufs[0])
    data = bufs[1:]
    if len(data) != len(header.frame_bytes):
        raise ProtocolError(
            ErrorCode.MALFORMED, f"header announces {len(header.frame_bytes)} payload frames, got {len(data)}"
        )
    for i, (b, n) in enumerate(zip(data, header.frame_bytes)):
        if len(b) != n:
            raise ProtocolError(ErrorCode.MALFORMED, f"payload frame {i} has {len(b)} bytes, header says {n}")
    if not data:
        return Message(header)
    dtype = dtype_from_name(header.dtype)
    item = torch.empty(0, dtype=dtype).element_size()
    expected = numel_of(header.shapes) * item
    if expected != total - len(bufs[0]):
        raise ProtocolError(
            ErrorCode.BAD_SHAPE, f"shapes describe {expected} bytes of {header.dtype}, payload has {total - len(bufs[0])}"
        )
    if any(len(b) % item for b in data):
        raise ProtocolError(ErrorCode.MALFORMED, f"payload frame not a multiple of the {header.dtype} item size")
    if verify_checksum and checksum_of(data) != header.checksum:
        raise ProtocolError(ErrorCode.CHECKSUM, "payload checksum mismatch")
    with warnings.catch_warnings():
        # Received ZeroMQ frames are read-only; we never write through these views.
        warnings.simplefilter("ignore", UserWarning)
        chunks = tuple(torch.frombuffer(b, dtype=dtype) for b in data if len(b))
    return Message(header, Payload(dtype=dtype, chunks=chunks, shapes=header.shapes))


def error_frames(code: ErrorCode, message: str, *, seq: int = 0, worker: str = "") -> list[bytes]:
    return [Header(type=MsgType.ERROR, worker=worker, seq=seq, body={"code": code.value, "message": message}).pack()]
