"""Shard records and their assignment to workers.

The training set is cut once into fixed-size shards. Each shard is one
self-describing record, the same bytes whether it travels over the ZeroMQ
data plane or (later) as a Kafka record value::

    b"HSR1" | u32 little-endian header length | msgpack header | array bytes

The header holds: ``format`` (1), ``dataset``, ``shard`` (id), ``samples``,
``arrays`` (list of {name, dtype, shape, offset, nbytes}, offsets relative to
the first array byte) and ``crc32c`` over all array bytes.

An epoch is a seeded permutation of shard ids handed out in order, so the
shards of one epoch are disjoint and cover the training set whatever the
workers' speeds.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import msgpack
import numpy as np

RECORD_MAGIC = b"HSR1"
RECORD_FORMAT = 1
_LEN = struct.Struct("<I")
_NP_DTYPES = {"float32", "float16", "int64", "int32", "uint8", "int8", "int16", "float64"}


class RecordError(ValueError):
    """A shard record that is truncated, corrupt or not ours."""


@dataclass(frozen=True)
class ShardRecord:
    dataset: str
    shard: int
    x: np.ndarray
    y: np.ndarray

    @property
    def samples(self) -> int:
        return int(self.y.shape[0])


def encode_record(dataset: str, shard: int, x: np.ndarray, y: np.ndarray) -> bytes:
    arrays, blobs, offset = [], [], 0
    for name, arr in (("x", x), ("y", y)):
        arr = np.ascontiguousarray(arr)
        if arr.dtype.name not in _NP_DTYPES:
            raise ValueError(f"array {name!r} has dtype {arr.dtype} which records cannot carry")
        blob = arr.tobytes()
        arrays.append({"name": name, "dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset, "nbytes": len(blob)})
        blobs.append(blob)
        offset += len(blob)
    body = b"".join(blobs)
    header = msgpack.packb(
        {
            "format": RECORD_FORMAT,
            "dataset": dataset,
            "shard": int(shard),
            "samples": int(y.shape[0]),
            "arrays": arrays,
            "crc32c": crc32c.crc32c(body),
        },
        use_bin_type=True,
    )
    return RECORD_MAGIC + _LEN.pack(len(header)) + header + body


def decode_record(buf: bytes | memoryview) -> ShardRecord:
    """Parse and verify one record; arrays are copies owned by the caller."""
    view = memoryview(buf).cast("B")
    if len(view) < 8 or bytes(view[:4]) != RECORD_MAGIC:
        raise RecordError("not a shard record (bad magic)")
    (hlen,) = _LEN.unpack(view[4:8])
    if 8 + hlen > len(view):
        raise RecordError(f"record truncated: header of {hlen} bytes, record of {len(view)}")
    try:
        header = msgpack.unpackb(view[8 : 8 + hlen], raw=False)
        if header["format"] != RECORD_FORMAT:
            raise RecordError(f"record format {header['format']} unsupported (want {RECORD_FORMAT})")
        body = view[8 + hlen :]
        if crc32c.crc32c(body) != header["crc32c"]:
            raise RecordError(f"shard {header.get('shard')}: checksum mismatch")
        arrays, end = {}, 0
        for a in header["arrays"]:
            if a["dtype"] not in _NP_DTYPES:
                raise RecordError(f"array {a['name']!r}: dtype {a['dtype']!r} not allowed")
            dtype = np.dtype(a["dtype"])
            shape = tuple(int(d) for d in a["shape"])
            # The CRC covers the array bytes only, so the layout is checked too:
            # arrays lie back to back from offset 0 (as encode_record writes them).
            if (math.prod(shape) * dtype.itemsize != a["nbytes"] or any(d < 0 for d in shape)
                    or a["offset"] != end or a["offset"] + a["nbytes"] > len(body)):
                raise RecordError(f"array {a['name']!r}: shape/length mismatch")
            arrays[a["name"]] = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=a["offset"]).reshape(shape).copy()
            end += a["nbytes"]
        if end != len(body):
            raise RecordError(f"arrays cover {end} bytes, record body has {len(body)}")
        x, y = arrays["x"], arrays["y"]
        # Inside the try: a header missing samples/dataset/shard, or 0-d arrays,
        # is a corrupt record too (RecordError), not a KeyError/IndexError.
        if x.shape[0] != y.shape[0] or y.shape[0] != header["samples"]:
            raise RecordError("x and y disagree on the sample count")
        return ShardRecord(dataset=header["dataset"], shard=int(header["shard"]), x=x, y=y)
    except RecordError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, msgpack.UnpackException) as exc:
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

    def restore(self, state: dict) -> None:
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

    def state(self) -> dict:
        return {"epoch": self.epoch, "next": self._next, "seed": self.seed, "num_shards": self.num_shards,
                "requeued": [list(p) for p in self._requeued]}


def shards_for(samples: int, shard_size: int) -> int:
    """How many shards carry at least ``samples`` samples."""
    return max(1, math.ceil(samples / shard_size))
