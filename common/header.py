"""The data plane's header frame: message types, error codes, wire dtypes and the ``Header`` record.

The wire format as a whole (frames, MAC, checksum) is documented in
``hermes.common.wire``, which re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

if TYPE_CHECKING:
    import torch

# 3: one Poly1305 MAC (one-time key per message, nonce in the header) replaced
#    HMAC-SHA256 + CRC32C over the same bytes; the CRC stays for unsigned messages.
# 2: per-message HMAC (mac, session, ts) replaced the bearer token of version 1.
PROTOCOL_VERSION = 3
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
_TYPES = {t.value: t for t in MsgType}


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


# Wire dtype names. bf16 has no numpy twin, so everything goes through torch. The tables are built
# on first use: the header alone imports no torch, so hermes-server can refuse a missing join token
# before paying torch's import (2 s of a 2.9 s refusal, 2026-11-26).
WIRE_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "uint8", "int8")
FLOAT_WIRE_DTYPES = frozenset({"float32", "float16", "bfloat16"})


@functools.cache
def _dtypes() -> tuple[dict[str, torch.dtype], dict[torch.dtype, str]]:
    import torch

    by_name = {name: getattr(torch, name) for name in WIRE_DTYPE_NAMES}
    return by_name, {v: k for k, v in by_name.items()}


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _dtypes()[0][name]
    except KeyError:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"unknown dtype {name!r}; known: {sorted(WIRE_DTYPE_NAMES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _dtypes()[1][dtype]
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
    # CRC32C of the payload in unsigned messages; 0 in signed ones, whose MAC covers the payload.
    checksum: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    proto: int = PROTOCOL_VERSION
    # Signed messages: a fresh random nonce (hex) picks the MAC's one-time key.
    nonce: str = ""
    # Poly1305 tag (hex) over the packed header up to this value (always the
    # last entry, so its characters end the frame) and the payload.
    mac: str = ""

    def pack(self, *, nonce: str | None = None, mac: str | None = None) -> bytes:
        """The msgpack map; ``nonce`` / ``mac``: packed in place of the fields (the signer's, without
        a copy of the header)."""
        packed: bytes = msgpack.packb(
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
                "nonce": self.nonce if nonce is None else nonce,
                "mac": self.mac if mac is None else mac,
            },
            use_bin_type=True,
        )
        return packed

    @classmethod
    def assemble(cls, base: Mapping[str, Any], fields: Mapping[str, Any]) -> Header:
        """A header of ``base``'s fields updated by ``fields``, every field given, set at once rather than through
        the frozen dataclass's ``__init__`` (a setattr a field; issue 31): ``make``, ``unpack`` and the wire's
        encode build headers on hot paths this way. Two mappings, not keywords: re-packing them cost ``make``
        0.6 us (1.5 against 0.9). The same object as ``Header(**...)`` because Header has no
        ``__post_init__``, no slots and no derived state; the names are not checked (the callers name fields)."""
        out = object.__new__(cls)
        out.__dict__.update(base)
        out.__dict__.update(fields)
        return out

    @classmethod
    def make(cls, **fields: Any) -> Header:
        """``Header(**fields)`` for the hot paths that name the fields literally (a request's header, a reply's),
        assembled (1.0 against the dataclass's 1.6 us hot, 2026-11-28; more on a request's cold caches; issue 31)."""
        if "body" not in fields:
            fields["body"] = {}  # its own, as default_factory makes it
        return cls.assemble(_DEFAULTS, fields)

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
        get = obj.get
        proto = get("proto")
        if type(proto) is not int:  # exact types (what msgpack gives) pass without _field's checks (issue 31)
            proto = _field(obj, "proto", int)
        if proto != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"data-plane protocol version {proto} unsupported; this peer speaks {PROTOCOL_VERSION}"
                + (" (version 3 signs with Poly1305 instead of HMAC-SHA256 + CRC32C: install the same "
                   "hermes-edge release on server and agents)" if proto == 2 else ""),
            )
        type_name = get("type")
        if type(type_name) is not str:
            type_name = _field(obj, "type", str)
        msg_type = _TYPES.get(type_name)
        if msg_type is None:
            raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {type_name!r}")
        shapes = []
        raw_shapes = get("shapes", [])
        for s in raw_shapes if type(raw_shapes) is list else _field(obj, "shapes", list, default=[]):
            if not isinstance(s, list) or not all(type(d) is int and d >= 0 for d in s):
                raise ProtocolError(ErrorCode.MALFORMED, f"shape {s!r} is not a list of non-negative ints")
            shapes.append(tuple(s))
        frame_bytes = get("frame_bytes", [])
        if type(frame_bytes) is not list:
            frame_bytes = _field(obj, "frame_bytes", list, default=[])
        if not all(type(n) is int and n >= 0 for n in frame_bytes):
            raise ProtocolError(ErrorCode.MALFORMED, "frame_bytes must be non-negative ints")
        # In the order the fields were always checked (the first bad one is the one named).
        fields: dict[str, Any] = {}
        for key, kind, default in _SCALARS:
            value = get(key, default)
            fields[key] = value if type(value) is kind else _field(obj, key, kind, default)
        body = get("body")
        if type(body) is not dict:
            body = _field(obj, "body", dict, default={})
        for key, kind, default in _SIGNATURE:
            value = get(key, default)
            fields[key] = value if type(value) is kind else _field(obj, key, kind, default)
        # Every field is given: assembled (the frozen __init__'s setattr a field was ~2 us of a request's ~6 us
        # unpack, issue 31).
        fields.update(type=msg_type, proto=proto, shapes=tuple(shapes), frame_bytes=tuple(frame_bytes), body=body)
        return cls.assemble(fields, {})


_MISSING = object()

# Header.make's defaults: every field's that has one, but body's (a fresh dict each); ``type`` has none.
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Header)
                             if f.default is not dataclasses.MISSING}

# The header's scalar fields with their types and defaults, read by ``Header.unpack`` (before and after body).
_SCALARS: tuple[tuple[str, type, Any], ...] = (
    ("worker", str, ""), ("session", str, ""), ("seq", int, 0), ("ts", int, 0), ("model_version", int, 0),
    ("dtype", str, ""), ("checksum", int, 0),
)
_SIGNATURE: tuple[tuple[str, type, Any], ...] = (("nonce", str, ""), ("mac", str, ""))


def _field(obj: dict[str, Any], key: str, kind: type, default: Any = _MISSING) -> Any:
    if key not in obj:
        if default is _MISSING:
            raise ProtocolError(ErrorCode.MALFORMED, f"header field {key!r} is missing")
        return default
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(ErrorCode.MALFORMED, f"header field {key!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def error_frames(code: ErrorCode, message: str, *, seq: int = 0, worker: str = "") -> list[bytes]:
    return [Header(type=MsgType.ERROR, worker=worker, seq=seq, body={"code": code.value, "message": message}).pack()]
