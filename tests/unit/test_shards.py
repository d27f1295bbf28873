"""Shard records (encode/verify) and the epoch-by-epoch ShardQueue."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
import torch

from hermes.common.shards import (
    RECORD_MAGIC,
    Assignment,
    RecordError,
    ShardQueue,
    decode_record,
    encode_record,
    shard_bounds,
    shards_for,
)


def _arrays(n: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return x, y


# ---------------------------------------------------------------------------
# records


@pytest.mark.parametrize("xdtype", [np.float32, np.float16, np.uint8, np.float64, np.bool_, np.int8, np.int16,
                                    np.uint16, np.int32, np.uint32, np.int64])
def test_record_round_trip(xdtype):
    x, y = _arrays()
    x = x.astype(xdtype)
    rec = decode_record(encode_record("digits", 7, x, y))
    assert rec.dataset == "digits" and rec.shard == 7 and rec.samples == 5
    assert rec.x.dtype == xdtype and rec.y.dtype == np.int64
    np.testing.assert_array_equal(rec.x, x)
    np.testing.assert_array_equal(rec.y, y)


def test_record_arrays_are_owned_copies():
    x, y = _arrays()
    buf = bytearray(encode_record("digits", 0, x, y))
    rec = decode_record(buf)
    assert rec.x.flags.owndata or rec.x.base is not None
    assert rec.x.flags.writeable
    buf[-1] ^= 0xFF  # mutating the buffer afterwards does not reach the decoded arrays
    np.testing.assert_array_equal(rec.y, y)


def test_record_accepts_memoryview_and_non_contiguous_input():
    x, y = _arrays(8)
    xs = x[::2]
    ys = y[::2]
    assert not xs.flags.c_contiguous
    rec = decode_record(memoryview(encode_record("d", 1, xs, ys)))
    np.testing.assert_array_equal(rec.x, xs)
    np.testing.assert_array_equal(rec.y, ys)


def test_record_empty_shard():
    x = np.zeros((0, 3), dtype=np.float32)
    y = np.zeros((0,), dtype=np.int64)
    rec = decode_record(encode_record("d", 0, x, y))
    assert rec.samples == 0 and rec.x.shape == (0, 3)


def test_record_layout():
    x, y = _arrays(2)
    raw = encode_record("digits", 3, x, y)
    assert raw[:4] == RECORD_MAGIC
    (hlen,) = struct.unpack("<I", raw[4:8])
    header = msgpack.unpackb(raw[8 : 8 + hlen])
    assert header["format"] == 2 and header["shard"] == 3 and header["samples"] == 2
    assert header["byteorder"] == "little"
    assert [a["name"] for a in header["arrays"]] == ["x", "y"]
    assert len(raw) == 8 + hlen + x.nbytes + y.nbytes


def test_record_refuses_unsupported_dtype():
    x, y = _arrays()
    with pytest.raises(ValueError, match="dtype"):
        encode_record("d", 0, x.astype(np.complex64), y)


def test_corrupt_body_byte_is_a_checksum_error():
    x, y = _arrays()
    raw = bytearray(encode_record("digits", 1, x, y))
    raw[-3] ^= 0x01
    with pytest.raises(RecordError, match="checksum"):
        decode_record(bytes(raw))


def test_bad_magic():
    x, y = _arrays()
    raw = bytearray(encode_record("digits", 1, x, y))
    raw[0:4] = b"HSR2"
    with pytest.raises(RecordError, match="magic"):
        decode_record(bytes(raw))
    with pytest.raises(RecordError):
        decode_record(b"")


def test_truncated_at_every_length():
    x, y = _arrays(3)
    raw = encode_record("digits", 2, x, y)
    for n in range(len(raw)):
        with pytest.raises(RecordError):
            decode_record(raw[:n])


def test_trailing_bytes_are_refused():
    x, y = _arrays(3)
    with pytest.raises(RecordError):
        decode_record(encode_record("digits", 2, x, y) + b"\x00")


def test_every_single_byte_corruption_is_caught_or_harmless():
    """Flip each byte in turn: a RecordError, never another exception, never wrong arrays."""
    x, y = _arrays(2)
    raw = encode_record("digits", 2, x, y)
    for i in range(len(raw)):
        for mask in (0x01, 0x20, 0xFF):
            bad = bytearray(raw)
            bad[i] ^= mask
            try:
                rec = decode_record(bytes(bad))
            except RecordError:
                continue
            # Only header metadata outside the checksum can change undetected;
            # the data itself must be intact.
            np.testing.assert_array_equal(rec.x, x)
            np.testing.assert_array_equal(rec.y, y)


def test_header_variants_are_record_errors():
    x, y = _arrays(2)
    raw = encode_record("digits", 2, x, y)
    (hlen,) = struct.unpack("<I", raw[4:8])
    header = msgpack.unpackb(raw[8 : 8 + hlen])
    body = raw[8 + hlen :]

    def rebuild(h) -> bytes:
        hb = msgpack.packb(h, use_bin_type=True)
        return RECORD_MAGIC + struct.pack("<I", len(hb)) + hb + body

    variants = {
        "format": {**header, "format": 3},
        "byteorder": {**header, "byteorder": "big"},
        "no_byteorder": {k: v for k, v in header.items() if k != "byteorder"},
        "v1_with_v2_dtype": {**header, "format": 1, "arrays": [{**header["arrays"][0], "dtype": "bfloat16"},
                                                               header["arrays"][1]]},
        "no_arrays": {k: v for k, v in header.items() if k != "arrays"},
        "no_samples": {k: v for k, v in header.items() if k != "samples"},
        "no_dataset": {k: v for k, v in header.items() if k != "dataset"},
        "no_shard": {k: v for k, v in header.items() if k != "shard"},
        "samples_wrong": {**header, "samples": 3},
        "bad_dtype": {**header, "arrays": [{**header["arrays"][0], "dtype": "object"}, header["arrays"][1]]},
        "shape_mismatch": {**header, "arrays": [{**header["arrays"][0], "shape": [3, 1, 8, 8]}, header["arrays"][1]]},
        "offset_past_end": {**header, "arrays": [header["arrays"][0], {**header["arrays"][1], "offset": 10**6}]},
        "negative_offset": {**header, "arrays": [header["arrays"][0], {**header["arrays"][1], "offset": -8}]},
        "header_is_list": [1, 2, 3],
        "shard_is_inf": {**header, "shard": float("inf")},
        "shard_is_string": {**header, "shard": "two"},
        "zero_dim_arrays": {**header, "arrays": [
            {**header["arrays"][0], "shape": [], "nbytes": 4},
            {**header["arrays"][1], "shape": [], "nbytes": 8},
        ]},
    }
    for name, h in variants.items():
        with pytest.raises(RecordError):
            decode_record(rebuild(h))
            pytest.fail(f"variant {name} decoded")


# ---------------------------------------------------------------------------
# bounds


@pytest.mark.parametrize("n,size", [(1, 1), (10, 3), (64, 64), (65, 64), (1437, 64), (5, 100)])
def test_shard_bounds_cover_all_samples(n, size):
    bounds = shard_bounds(n, size)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(b[0] == a[1] for a, b in zip(bounds, bounds[1:])), "contiguous, no gap, no overlap"
    assert all(0 < stop - start <= size for start, stop in bounds)
    assert all(stop - start == size for start, stop in bounds[:-1])
    assert len(bounds) == -(-n // size) == shards_for(n, size)


def test_shard_bounds_refuses_nonpositive():
    for n, size in [(0, 4), (4, 0), (-1, 4)]:
        with pytest.raises(ValueError):
            shard_bounds(n, size)


def test_shards_for():
    assert shards_for(128, 64) == 2
    assert shards_for(129, 64) == 3
    assert shards_for(1, 64) == 1
    assert shards_for(0, 64) == 1


# ---------------------------------------------------------------------------
# ShardQueue


def _drain(q: ShardQueue, sizes, epochs: int) -> list[Assignment]:
    out: list[Assignment] = []
    i = 0
    while True:
        a = q.take(sizes[i % len(sizes)])
        i += 1
        if a.epoch >= epochs:
            return out
        out.append(a)


@pytest.mark.parametrize("num_shards", [1, 7, 23])
@pytest.mark.parametrize("sizes", [[1], [2], [3], [5], [7], [23], [40], [2, 5, 1], [4, 9]])
def test_every_epoch_is_disjoint_and_covering(num_shards, sizes):
    q = ShardQueue(num_shards, seed=3)
    assignments = _drain(q, sizes, epochs=4)
    by_epoch: dict[int, list[int]] = {}
    for a in assignments:
        assert a.shards, "an assignment is never empty"
        assert len(a.shards) == min(len(a.shards), num_shards) and len(a.epochs) == len(a.shards)
        assert a.epoch == a.epochs[0]
        for shard, epoch in zip(a.shards, a.epochs):
            by_epoch.setdefault(epoch, []).append(shard)
    assert sorted(by_epoch)[:4] == [0, 1, 2, 3]
    for epoch in range(4):
        ids = by_epoch[epoch]
        assert len(ids) == len(set(ids)), f"epoch {epoch} hands a shard out twice"
        assert sorted(ids) == list(range(num_shards)), f"epoch {epoch} does not cover the set"
    # Epochs only move forward, within and across assignments.
    epochs = [e for a in assignments for e in a.epochs]
    assert epochs == sorted(epochs)
    # An assignment is as large as asked (up to one epoch's worth): never cut at an epoch end.
    for i, a in enumerate(assignments):
        assert len(a.shards) == min(sizes[i % len(sizes)], num_shards)


def test_take_sizes_at_epoch_end():
    q = ShardQueue(10, seed=0)
    assert len(q.take(4).shards) == 4
    assert len(q.take(4).shards) == 4
    last = q.take(4)
    # The remainder of epoch 0, topped up from epoch 1: a full-size assignment.
    assert last.epoch == 0 and last.epochs == (0, 0, 1, 1) and len(last.shards) == 4
    nxt = q.take(4)
    assert nxt.epoch == 1 and nxt.epochs == (1, 1, 1, 1)
    assert not set(last.shards[2:]) & set(nxt.shards)


def test_progress_and_state():
    q = ShardQueue(10, seed=5)
    assert q.progress == 0.0
    q.take(4)
    assert q.progress == pytest.approx(0.4)
    q.take(6)
    assert q.progress == pytest.approx(1.0)
    q.take(1)
    assert q.progress == pytest.approx(1.1)
    assert q.state() == {"epoch": 1, "next": 1, "seed": 5, "num_shards": 10, "requeued": []}


def test_deterministic_per_seed():
    a = _drain(ShardQueue(23, seed=11), [3, 4], epochs=3)
    b = _drain(ShardQueue(23, seed=11), [3, 4], epochs=3)
    assert a == b


def test_different_seeds_differ():
    orders = {tuple(ShardQueue(23, seed=s).take(23).shards) for s in range(5)}
    assert len(orders) == 5


def test_epochs_are_reshuffled():
    q = ShardQueue(23, seed=0)
    e0 = q.take(23).shards
    e1 = q.take(23).shards
    assert sorted(e0) == sorted(e1) and e0 != e1


def test_queue_refuses_bad_arguments():
    with pytest.raises(ValueError):
        ShardQueue(0)
    q = ShardQueue(3)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            q.take(bad)


# ---------------------------------------------------------------------------
# format 2: any dtype, any target shape; format 1 still read


@pytest.mark.parametrize(("xdtype", "ydtype", "yshape"), [
    (torch.int64, torch.int64, (4, 7)),      # token ids -> next-token targets
    (torch.float32, torch.float32, (4, 3)),  # regression with 3 outputs
    (torch.uint8, torch.int64, (4,)),        # raw pixels
    (torch.bfloat16, torch.bfloat16, (4, 2)),
    (torch.bool, torch.float16, (4,)),
])
def test_tensors_of_any_dtype_round_trip(xdtype, ydtype, yshape):
    from hermes.common.arrays import to_array, to_tensor

    g = torch.Generator().manual_seed(1)
    x = (torch.randn((4, 7), generator=g) * 50).to(xdtype)
    y = (torch.randn(yshape, generator=g) * 50).to(ydtype)
    (xa, xn), (ya, yn) = to_array(x), to_array(y)
    rec = decode_record(encode_record("t", 5, xa, ya, x_dtype=xn, y_dtype=yn))
    assert (rec.x_dtype, rec.y_dtype) == (str(xdtype).removeprefix("torch."), str(ydtype).removeprefix("torch."))
    assert torch.equal(to_tensor(rec.x, rec.x_dtype), x) and to_tensor(rec.x, rec.x_dtype).dtype == xdtype
    assert torch.equal(to_tensor(rec.y, rec.y_dtype), y) and to_tensor(rec.y, rec.y_dtype).dtype == ydtype


def test_bfloat16_must_come_as_its_bits():
    x, y = _arrays()
    with pytest.raises(ValueError, match="uint16 bits"):
        encode_record("d", 0, x, y, x_dtype="bfloat16")


def _v1_record(shard: int, x: np.ndarray, y: np.ndarray) -> bytes:
    """A record exactly as format-1 writers (hermes <= this change) wrote it."""
    import crc32c

    body = x.tobytes() + y.tobytes()
    arrays = [{"name": "x", "dtype": x.dtype.name, "shape": list(x.shape), "offset": 0, "nbytes": x.nbytes},
              {"name": "y", "dtype": y.dtype.name, "shape": list(y.shape), "offset": x.nbytes, "nbytes": y.nbytes}]
    header = msgpack.packb({"format": 1, "dataset": "digits", "shard": shard, "samples": len(y), "arrays": arrays,
                            "crc32c": crc32c.crc32c(body)}, use_bin_type=True)
    return RECORD_MAGIC + struct.pack("<I", len(header)) + header + body


def test_format_1_records_still_decode():
    x, y = _arrays(3)
    rec = decode_record(_v1_record(4, x, y))
    assert rec.shard == 4 and (rec.x_dtype, rec.y_dtype) == ("float32", "int64")
    np.testing.assert_array_equal(rec.x, x)
    np.testing.assert_array_equal(rec.y, y)


_BARE_READER = r"""
import struct, sys, zlib
import msgpack, numpy as np
raw = open(sys.argv[1], "rb").read()
assert raw[:4] == b"HSR1"
(hlen,) = struct.unpack("<I", raw[4:8])
h = msgpack.unpackb(raw[8:8 + hlen])
assert h["format"] in (1, 2) and h.get("byteorder", "little") == "little"
body = raw[8 + hlen:]
STORAGE = {"bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2", "uint16": "<u2", "int32": "<i4",
           "uint32": "<u4", "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8", "bfloat16": "<u2"}
out = {}
for a in h["arrays"]:
    arr = np.frombuffer(body, dtype=STORAGE[a["dtype"]], count=int(np.prod(a["shape"])), offset=a["offset"])
    arr = arr.reshape(a["shape"])
    if a["dtype"] == "bfloat16":  # the high half of a float32
        arr = (arr.astype("<u4") << 16).view("<f4")
    out[a["name"]] = arr
assert not [m for m in sys.modules if m.split(".")[0] in ("hermes", "torch")], "hermes or torch imported"
np.savez(sys.argv[2], x=out["x"], y=out["y"], shard=h["shard"], samples=h["samples"])
"""


@pytest.mark.parametrize("xdtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_bare_reader_decodes_a_record_with_msgpack_and_numpy_only(tmp_path, xdtype):
    """The documented format is enough: a script that imports neither hermes nor torch reads it."""
    import subprocess
    import sys

    from hermes.common.arrays import to_array

    x = torch.linspace(-3, 3, 24).reshape(4, 6).to(xdtype)
    y = torch.tensor([[0.5, 1.0], [2.0, -1.0], [0.0, 3.5], [1.5, 1.25]], dtype=torch.float32)
    (xa, xn), (ya, yn) = to_array(x), to_array(y)
    (tmp_path / "rec.bin").write_bytes(encode_record("t", 9, xa, ya, x_dtype=xn, y_dtype=yn))
    script = tmp_path / "bare.py"
    script.write_text(_BARE_READER)
    # -I: isolated (no cwd, no user site): hermes is not importable by accident either way.
    subprocess.run([sys.executable, "-I", str(script), str(tmp_path / "rec.bin"), str(tmp_path / "out.npz")],
                   check=True, timeout=60, cwd=tmp_path)
    got = np.load(tmp_path / "out.npz")
    assert int(got["shard"]) == 9 and int(got["samples"]) == 4
    np.testing.assert_array_equal(got["x"], x.float().numpy())
    np.testing.assert_array_equal(got["y"], y.numpy())
