"""Data-plane wire format: one msgpack header frame + raw tensor frames.

A message on the wire is a ZeroMQ multipart message::

    [header (msgpack map)] [payload frame 0] [payload frame 1] ...

The header (``hermes.common.header.Header``) names the message type,
protocol version (3), sender, session, seq, timestamp, model version, the
payload's dtype and logical shapes, the byte length of every payload frame,
the body, and for signed messages a random ``nonce`` and the ``mac``: a
Poly1305 tag over every header byte before it and every payload byte, under
a one-time key derived from the worker's secret and the nonce (the argument
is in ``hermes.common.signing``). ``mac`` is always the last entry, so its
32 hex characters end the frame. Unsigned messages (error replies, tools,
tests) carry instead a CRC32C of the payload in ``checksum``; signed ones
carry 0 there: one pass over the payload, not a MAC and a CRC over the same
bytes. A peer speaking another version is refused with
``unsupported_version`` naming both versions.

The payload is one flat vector (the tensors of ``shapes`` concatenated in
order) cut into frames of at most ``MAX_FRAME_BYTES``: above 32 MB glibc
stops reusing freed blocks and loopback throughput falls to a third.

Nothing here pickles or copies a payload: frames are sent zero-copy
(``copy=False``), hashed in place and decoded with ``torch.frombuffer``
over the received buffer.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import crc32c
import torch

from hermes.common.header import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FLOAT_WIRE_DTYPES,
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    REQUEST_TYPES,
    ErrorCode,
    Header,
    MsgType,
    ProtocolError,
    dtype_from_name,
    dtype_name,
    error_frames,
    numel_of,
)
from hermes.common.signing import MAC_HEX_CHARS, NONCE_HEX_CHARS, mac_hex, macs_equal, new_nonce

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES", "FLOAT_WIRE_DTYPES", "MAX_FRAME_BYTES", "MAX_HEADER_BYTES", "PROTOCOL_VERSION",
    "REQUEST_TYPES", "ErrorCode", "Header", "Message", "MsgType", "Payload", "PreparedPayload", "ProtocolError",
    "checksum_of", "decode", "dtype_from_name", "dtype_name", "encode", "error_frames", "numel_of", "prepare",
    "split_frames", "verify_mac",
]


# fp16/bf16 chunks are read in blocks of this many elements: an fp32 temporary of a
# whole 10M vector is fresh memory from the kernel on every call (glibc's mmap threshold).
NORM_BLOCK = 1 << 20
# Half-precision payloads up to this many elements (16 MB in fp32) are widened once and kept
# until the fold; bigger ones block by block, as they are read (no 32 MB+ temporaries).
WIDEN_MAX_NUMEL = 4 << 20


def checksum_of(frames: Iterable[memoryview | bytes]) -> int:
    value = 0
    for f in frames:
        value = crc32c.crc32c(f, value)
    return value


def _as_bytes_view(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor (bf16 included)."""
    if t.dim() == 1 and t.dtype is torch.uint8:
        # A compressed payload (bytes as uint8): one torch call, not six. Each request runs on cold caches after its
        # wait, where the six cost ~20 us of the agent's encode, not their ~3 us hot (issue 31, 2026-11-28).
        try:
            view = t.numpy().data
        except (RuntimeError, TypeError):  # not in CPU memory (numpy() refuses it): the general way below
            view = None
        if view is not None and view.contiguous:
            return view
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    # numpy has no bf16/fp16-safe path for every dtype: reinterpret as bytes.
    return t.view(torch.uint8).numpy().data.cast("B")


def split_frames(flat: torch.Tensor, max_frame_bytes: int = MAX_FRAME_BYTES) -> list[memoryview]:
    """Cut a flat tensor into element-aligned byte frames of at most max_frame_bytes."""
    view = _as_bytes_view(flat)
    if len(view) == 0:
        return []
    if len(view) <= max_frame_bytes:
        return [view]
    item = flat.element_size()
    step = max(item, (max_frame_bytes // item) * item)
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

    @cached_property
    def norm(self) -> float:
        """L2 norm accumulated in fp32, inf when an element is not finite or the sum of squares
        overflows. Computed once: validation and screening both read it, one pass between them.

        A half-precision payload is widened to fp32 here (``widened``), and the fold adds that
        buffer: one fp16 -> fp32 conversion per update, not two (issue 17's fused check-and-add).
        Each block's sum of squares is an fp32 ``dot`` (BLAS), a third cheaper than
        ``vector_norm`` at 1M elements; it overflows to inf exactly where the sum of squares does.
        """
        total = 0.0
        for _, piece in self.fp32_pieces(NORM_BLOCK):
            total += float(torch.dot(piece, piece))
        return math.sqrt(total) if math.isfinite(total) else math.inf

    def know_norm(self, sum_of_squares: float) -> None:
        """Set ``norm`` from a sum of squares the decoder read more cheaply than a pass over the payload (a top-k
        push's k values: the rest are zeros), under the same rule: inf unless finite."""
        self.__dict__["norm"] = math.sqrt(sum_of_squares) if math.isfinite(sum_of_squares) else math.inf

    @cached_property
    def widened(self) -> tuple[torch.Tensor, ...] | None:
        """The chunks in fp32, one buffer, for a half-precision payload of at most
        ``WIDEN_MAX_NUMEL`` elements; None otherwise (fp32 chunks are read as they are, bigger
        payloads are widened block by block where they are read). Dropped by the fold
        (``release_widened``): it is 2x the payload's own bytes."""
        if self.dtype == torch.float32 or self.numel > WIDEN_MAX_NUMEL:
            return None
        buf = torch.empty(self.numel, dtype=torch.float32)
        out, off = [], 0
        for c in self.chunks:
            # copy_ into one preallocated buffer: cheaper than c.to(float32) per chunk.
            out.append(buf[off : off + c.numel()].copy_(c))
            off += c.numel()
        return tuple(out)

    def release_widened(self) -> None:
        """Forget the fp32 copy (after the fold, or while the payload waits in a buffer)."""
        self.__dict__.pop("widened", None)

    def fp32_pieces(self, block: int | None = None) -> Iterable[tuple[int, torch.Tensor]]:
        """(offset, fp32 tensor) covering the payload in order: fp32 chunks as they are, the
        ``widened`` buffer when there is one, else fp32 copies of ``NORM_BLOCK``-element blocks.
        ``block``: cut every piece to at most that many elements."""
        wide = self.widened
        off = 0
        for i, c in enumerate(self.chunks):
            if c.dtype == torch.float32:
                src, step = c, block or max(c.numel(), 1)
            elif wide is not None:
                src, step = wide[i], block or max(c.numel(), 1)
            else:
                src, step = c, min(block or NORM_BLOCK, NORM_BLOCK)
            for j in range(0, c.numel(), step):
                piece = src[j : j + step]
                yield off + j, piece if piece.dtype == torch.float32 else piece.to(torch.float32)
            off += c.numel()

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
    """The frames of a tensor, cut once and sent many times (the server's
    model snapshot is pulled by every worker)."""

    tensor: torch.Tensor  # keeps the frames' memory alive
    frames: tuple[memoryview, ...]
    dtype: str

    @cached_property
    def checksum(self) -> int:
        """CRC32C of the frames: only unsigned messages carry one, so it is computed on first use."""
        return checksum_of(self.frames)

    @cached_property
    def zmq_frames(self) -> tuple[Any, ...]:
        """The frames as zmq.Frame objects made once. Sending one again (copy=False) shares its
        buffer by reference count instead of registering a new zero-copy buffer, whose release
        wakes pyzmq's garbage-collector thread on every send."""
        import zmq

        return tuple(zmq.Frame(f, copy=False) for f in self.frames)


def prepare(flat: torch.Tensor, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> PreparedPayload:
    return PreparedPayload(flat, tuple(split_frames(flat, max_frame_bytes)), dtype_name(flat.dtype))


def encode(
    header: Header,
    flat: torch.Tensor | bytes | PreparedPayload | None = None,
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
    key: bytes | None = None,
) -> list[Any]:
    """Build the frames of one message. ``flat`` is sent zero-copy.

    With ``key`` the header carries a fresh nonce and the MAC of header and
    payload (see hermes.common.signing); without, the payload's CRC32C.

    ``flat`` is a tensor (any wire dtype) or raw bytes (sent as uint8). The
    caller must keep it alive and unmodified until ZeroMQ has sent it (send
    with ``copy=False`` and do not mutate the tensor in the meantime). A
    PreparedPayload goes out as its cached zmq.Frame objects.
    """
    if flat is None:
        return [_pack_signed(header, (), key)]
    if isinstance(flat, (bytes, bytearray, memoryview)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only bytes, never written through
            flat = torch.frombuffer(flat, dtype=torch.uint8) if len(flat) else torch.empty(0, dtype=torch.uint8)
    if isinstance(flat, PreparedPayload):
        frames: Sequence[memoryview] = flat.frames
        dtype, numel = flat.dtype, flat.tensor.numel()
        checksum = 0 if key is not None else flat.checksum
        out: Sequence[Any] = flat.zmq_frames if frames else frames
    else:
        # Framed here, not through a PreparedPayload sent once (issue 31: the agent's push); the frames' views
        # keep the tensor's memory alive as the PreparedPayload's tensor did.
        frames = out = split_frames(flat, max_frame_bytes)
        dtype, numel = dtype_name(flat.dtype), flat.numel()
        checksum = 0 if key is not None else checksum_of(frames)
    if header.shapes and numel_of(header.shapes) != numel:
        raise ValueError(f"shapes describe {numel_of(header.shapes)} elements but tensor has {numel}")
    # dataclasses.replace without its generic pass over every field and the frozen __init__: a third of a push's
    # encode outside the MAC (issue 31).
    full = Header.assemble(header.__dict__, {
        "dtype": dtype,
        "shapes": header.shapes or ((numel,),),
        "frame_bytes": tuple(len(f) for f in frames),
        "checksum": checksum,
        "nonce": "",
        "mac": "",
    })
    return [_pack_signed(full, frames, key), *out]


def _pack_signed(header: Header, frames: Sequence[Any], key: bytes | None) -> bytes:
    if key is None:
        return header.pack()
    # Packed with a placeholder of the final length: the MAC covers every
    # header byte before it, then takes its place.
    nonce = new_nonce()
    raw = header.pack(nonce=nonce, mac="0" * MAC_HEX_CHARS)
    signed = memoryview(raw)[:-MAC_HEX_CHARS]
    return raw[:-MAC_HEX_CHARS] + mac_hex(key, nonce, signed, frames).encode()


def verify_mac(header_frame: Any, header: Header, payload_frames: Sequence[Any], key: bytes) -> bool:
    """True when the header frame ends in its ``mac`` and that is the tag, under ``key`` and the
    header's nonce, of every header byte before it and every payload byte. Checked on the received
    bytes in place, not a re-encoding: any change to them (a renamed key, another encoding of a
    value) fails."""
    raw = _buffer(header_frame)
    if len(header.mac) != MAC_HEX_CHARS or len(header.nonce) != NONCE_HEX_CHARS:
        return False
    if raw[-MAC_HEX_CHARS:] != header.mac.encode():
        return False
    return macs_equal(header.mac, mac_hex(key, header.nonce, raw[:-MAC_HEX_CHARS], payload_frames))


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return memoryview(frame)
    view: memoryview = frame.buffer  # zmq.Frame received with copy=False
    return view


def decode(frames: Sequence[Any], *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
           verify_checksum: bool = True, header: Header | None = None) -> Message:
    """Parse and validate the framing of one message (not its meaning).

    Raises ProtocolError for anything malformed: bad header, frame count or
    length mismatch, oversize, unknown dtype, checksum mismatch. A signed
    message (one with a ``mac``) is not checksummed here: its receiver checks
    the MAC (``verify_mac``), which covers the same bytes. ``header``: the
    already unpacked first frame (the data plane's admission read it).
    """
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty message")
    bufs = [_buffer(f) for f in frames]
    total = sum(len(b) for b in bufs)
    if total > max_message_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message of {total} bytes exceeds the limit of {max_message_bytes}")
    if header is None:
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
    item = dtype.itemsize
    expected = numel_of(header.shapes) * item
    if expected != total - len(bufs[0]):
        raise ProtocolError(
            ErrorCode.BAD_SHAPE, f"shapes describe {expected} bytes of {header.dtype}, payload has {total - len(bufs[0])}"
        )
    if any(len(b) % item for b in data):
        raise ProtocolError(ErrorCode.MALFORMED, f"payload frame not a multiple of the {header.dtype} item size")
    if verify_checksum and not header.mac and checksum_of(data) != header.checksum:
        raise ProtocolError(ErrorCode.CHECKSUM, "payload checksum mismatch")
    with warnings.catch_warnings():
        # Received ZeroMQ frames are read-only; we never write through these views.
        warnings.simplefilter("ignore", UserWarning)
        chunks = tuple(torch.frombuffer(b, dtype=dtype) for b in data if len(b))
    return Message(header, Payload(dtype=dtype, chunks=chunks, shapes=header.shapes))
