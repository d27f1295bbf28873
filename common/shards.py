"""Shard records and their assignment to workers.

The training set is cut once into fixed-size shards. Each shard is one
self-describing record, the same bytes whether it travels over the ZeroMQ
data plane or as a Kafka record value::

    b"HSR1" | u32 little-endian header length | msgpack header | array bytes

The header (format 2) holds: ``format`` (2), ``dataset``, ``shard`` (id),
``samples``, ``byteorder`` ("little": every array is little-endian),
``arrays`` (list of {name, dtype, shape, offset, nbytes}, offsets relative to
the first array byte; ``x`` is the inputs, ``y`` the targets, each of shape
``(samples, *per_sample_shape)``) and ``crc32c`` over all array bytes.
``dtype`` is one of :data:`RECORD_DTYPES`; ``bfloat16``, which numpy lacks,
is stored as its raw 16 bits (read it as ``<u2`` and shift into the high
half of a float32). Format 1 (float32/float16/float64/int8-64/uint8 only,
native byte order) is still decoded. A reader needs only msgpack and numpy
(and crc32c to verify); docs/incoming/data.md has a 20-line one.

An epoch is a seeded permutation of shard ids handed out in order, so the
shards of one epoch are disjoint and cover the training set whatever the
workers' speeds.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c
import msgpack
import numpy as np

RECORD_MAGIC = b"HSR1"
RECORD_FORMAT = 2
_FORMATS = (1, 2)
_LEN = struct.Struct("<I")
# Record dtype name -> how its bytes are read with numpy (little-endian storage).
RECORD_DTYPES: dict[str, str] = {
    "bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2", "uint16": "<u2", "int32": "<i4",
    "uint32": "<u4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8",
    "bfloat16": "<u2",
}
_V1_DTYPES = {"float32", "float16", "int64", "int32", "uint8", "int8", "int16", "float64"}


class RecordError(ValueError):
    """A shard record that is truncated, corrupt or not ours."""


@dataclass(frozen=True)
class ShardRecord:
    """One decoded shard. ``x``/``y`` are numpy arrays; a ``bfloat16`` array is its raw
    bits as uint16 (``x_dtype``/``y_dtype`` name the real dtype: see ``hermes.common.arrays``)."""

    dataset: str
    shard: int
    x: np.ndarray
    y: np.ndarray
    x_dtype: str = ""
    y_dtype: str = ""

    @property
    def samples(self) -> int:
        return int(self.y.shape[0])


def dtype_name(arr: np.ndarray, declared: str | None = None) -> str:
    """The record dtype name of an array (``declared`` for a bfloat16 array held as uint16)."""
    name = declared or arr.dtype.name
    if name not in RECORD_DTYPES:
        raise ValueError(f"dtype {name} cannot be carried by shard records (use one of {sorted(RECORD_DTYPES)})")
    if declared == "bfloat16" and arr.dtype != np.uint16:
        raise ValueError(f"a bfloat16 array must be given as its uint16 bits, got {arr.dtype}")
    return name


def encode_record(dataset: str, shard: int, x: np.ndarray, y: np.ndarray, *,
                  x_dtype: str | None = None, y_dtype: str | None = None) -> bytes:
    """One record; ``x_dtype``/``y_dtype`` "bfloat16" mark uint16 arrays holding bfloat16 bits."""
    arrays, blobs, offset = [], [], 0
    for name, arr, declared in (("x", x, x_dtype), ("y", y, y_dtype)):
        try:
            dname = dtype_name(arr, declared)
        except ValueError as exc:
            raise ValueError(f"array {name!r}: {exc}") from None
        arr = np.ascontiguousarray(arr, dtype=np.dtype(RECORD_DTYPES[dname]))
        blob = arr.tobytes()
        arrays.append({"name": name, "dtype": dname, "shape": list(arr.shape), "offset": offset, "nbytes": len(blob)})
        blobs.append(blob)
        offset += len(blob)
    body = b"".join(blobs)
    header: bytes = msgpack.packb(
        {
            "format": RECORD_FORMAT,
            "dataset": dataset,
            "shard": int(shard),
            "samples": int(y.shape[0]),
            "byteorder": "little",
            "arrays": arrays,
            "crc32c": crc32c.crc32c(body),
        },
        use_bin_type=True,
    )
    return RECORD_MAGIC + _LEN.pack(len(header)) + header + body


def decode_record(buf: bytes | memoryview) -> ShardRecord:
    """Parse and verify one record (format 1 or 2); arrays are copies owned by the caller."""
    view = memoryview(buf).cast("B")
    if len(view) < 8 or bytes(view[:4]) != RECORD_MAGIC:
        raise RecordError("not a shard record (bad magic)")
    (hlen,) = _LEN.unpack(view[4:8])
    if 8 + hlen > len(view):
        raise RecordError(f"record truncated: header of {hlen} bytes, record of {len(view)}")
    try:
        header = msgpack.unpackb(view[8 : 8 + hlen], raw=False)
        fmt = header["format"]
        if fmt not in _FORMATS:
            raise RecordError(f"record format {fmt} unsupported (this reader knows {list(_FORMATS)})")
        if fmt >= 2 and header["byteorder"] != "little":
            raise RecordError(f"record byteorder {header['byteorder']!r} unsupported")
        allowed = _V1_DTYPES if fmt == 1 else RECORD_DTYPES
        body = view[8 + hlen :]
        if crc32c.crc32c(body) != header["crc32c"]:
            raise RecordError(f"shard {header.get('shard')}: checksum mismatch")
        arrays, names, end = {}, {}, 0
        for a in header["arrays"]:
            if a["dtype"] not in allowed:
                raise RecordError(f"array {a['name']!r}: dtype {a['dtype']!r} not allowed")
            # Format 1 wrote native order (every machine we ran on was little-endian).
            dtype = np.dtype(RECORD_DTYPES[a["dtype"]] if fmt >= 2 else a["dtype"])
            shape = tuple(int(d) for d in a["shape"])
            # The CRC covers the array bytes only, so the layout is checked too:
            # arrays lie back to back from offset 0 (as encode_record writes them).
            if (math.prod(shape) * dtype.itemsize != a["nbytes"] or any(d < 0 for d in shape)
                    or a["offset"] != end or a["offset"] + a["nbytes"] > len(body)):
                raise RecordError(f"array {a['name']!r}: shape/length mismatch")
            arr = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=a["offset"]).reshape(shape)
            arrays[a["name"]] = arr.astype(dtype.newbyteorder("="), copy=True)
            names[a["name"]] = a["dtype"]
            end += a["nbytes"]
        if end != len(body):
            raise RecordError(f"arrays cover {end} bytes, record body has {len(body)}")
        x, y = arrays["x"], arrays["y"]
        # Inside the try: a header missing samples/dataset/shard, or 0-d arrays,
        # is a corrupt record too (RecordError), not a KeyError/IndexError.
        if x.shape[0] != y.shape[0] or y.shape[0] != header["samples"]:
            raise RecordError("x and y disagree on the sample count")
        return ShardRecord(dataset=header["dataset"], shard=int(header["shard"]), x=x, y=y,
                           x_dtype=names["x"], y_dtype=names["y"])
    except RecordError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError,
            msgpack.UnpackException) as exc:
        raise RecordError(f"malformed record header: {exc!r}") from None


def shard_bounds(num_samples: int, shard_size: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) ranges of at most shard_size covering every sample."""
    if num_samples <= 0 or shard_size <= 0:
        raise ValueError("num_samples and shard_size must be positive")
    return [(s, min(s + shard_size, num_samples)) for s in range(0, num_samples, shard_size)]


@dataclass(frozen=True)
class Assignment:
    epoch: int  # the epoch of the first shard
    shards: tuple[int, ...]
    epochs: tuple[int, ...] = ()  # the epoch of each shard


class ShardQueue:
    """Hands out shard ids epoch by epoch; each epoch is a seeded permutation.

    Deterministic given (num_shards, seed) and the sequence of take() calls.
    Within an epoch the shards handed out are disjoint and, once the epoch is
    drained, cover the whole set. An assignment may run on into the next
    epoch: stopping at the boundary cut the large assignments of fast workers
    short (measured: 25-87% of a resized worker's cycles), which both wasted
    its speed and fed the straggler detector misleading times.
    """

    def __init__(self, num_shards: int, seed: int = 0) -> None:
        if num_shards <= 0:
            raise ValueError("num_shards must be positive")
        self.num_shards = num_shards
        self.seed = seed
        self.epoch = 0
        self._order = self._permutation(0)
        self._next = 0
        # Shards of workers that were lost before finishing them: handed out
        # first, so the epoch still covers them.
        self._requeued: list[tuple[int, int]] = []

    def _permutation(self, epoch: int) -> list[int]:
        rng = np.random.default_rng([self.seed, epoch])
        return [int(i) for i in rng.permutation(self.num_shards)]

    def take(self, count: int) -> Assignment:
        """The next ``count`` shards (at most one epoch's worth)."""
        if count <= 0:
            raise ValueError("count must be positive")
        ids: list[int] = []
        epochs: list[int] = []
        while self._requeued and len(ids) < min(count, self.num_shards):
            shard, epoch = self._requeued.pop(0)
            ids.append(shard)
            epochs.append(epoch)
        for _ in range(min(count, self.num_shards) - len(ids)):
            if self._next >= self.num_shards:
                self.epoch += 1
                self._order = self._permutation(self.epoch)
                self._next = 0
            ids.append(self._order[self._next])
            epochs.append(self.epoch)
            self._next += 1
        return Assignment(epoch=epochs[0], shards=tuple(ids), epochs=tuple(epochs))

    def requeue(self, shards: Sequence[int]) -> None:
        """Hand these shards out again before anything else (their worker was lost)."""
        for shard in shards:
            if not 0 <= shard < self.num_shards:
                raise ValueError(f"shard {shard} out of range [0, {self.num_shards})")
            self._requeued.append((int(shard), self.epoch))

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` (a checkpoint): same permutation, same position."""
        if state.get("num_shards") != self.num_shards or state.get("seed") != self.seed:
            raise ValueError(f"queue state {state} does not fit {self.num_shards} shards with seed {self.seed}")
        self.epoch, self._next = int(state["epoch"]), int(state["next"])
        self._order = self._permutation(self.epoch)
        self._requeued = [(int(s), int(e)) for s, e in state.get("requeued", [])]

    @property
    def progress(self) -> float:
        """Epochs handed out so far, fractional."""
        return self.epoch + self._next / self.num_shards

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "next": self._next, "seed": self.seed, "num_shards": self.num_shards,
                "requeued": [list(p) for p in self._requeued]}


def shards_for(samples: int, shard_size: int) -> int:
    """How many shards carry at least ``samples`` samples."""
    return max(1, math.ceil(samples / shard_size))
