"""hermes-bench micro's compressed rows (issue 31): top-k, int8 and PowerSGD pushes and int8 pulls go through a real
hermes-server (each push answered "applied", else the bench raises) beside the bare pyzmq pair moving the same
bytes (micro_bare.py: the same MAC, and the receiver's work), and every row reports the server's pieces and a
ratio."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks.micro import bench_compressed_dataplane, ratio_rows
from benchmarks.micro_bare import bare_check, bare_decode, bare_quantise
from hermes.common.codec_spec import CodecSpec
from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec, decode

pytestmark = pytest.mark.integration  # starts hermes-server and the bare routers


def test_compressed_pushes_and_int8_pulls_are_measured_against_bare_pyzmq(tmp_path: Path) -> None:
    rows = bench_compressed_dataplane(2, str(tmp_path), 1, size="tiny", hidden=[64, 32])
    assert [r["op"] for r in rows] == ["push topk", "push int8", "push powersgd", "pull int8, cached",
                                       "pull int8 right after a push"]
    numel = rows[0]["numel"]
    # The bytes on the wire are the codec's: top-1% as k (index, value) pairs; int8 a byte each and a scale a chunk.
    assert rows[0]["payload_bytes"] == 8 * -(-numel // 100)
    assert rows[1]["payload_bytes"] == numel + 4 * -(-numel // 1024) == rows[3]["payload_bytes"]
    for r in rows:
        assert r["server_ms"] > 0 and r["bare_auth_ms"] > 0 and r["ratio_auth"] == r["server_ms"] / r["bare_auth_ms"]
    for r in rows[:3]:
        assert set(r["pieces"]) == {"apply", "bare_apply", "decompress", "bare_decode", "validate", "fold",
                                    "bare_add"}
    for r in (*rows[:3], rows[4]):
        assert r["ratio_auth_apply"] == r["server_ms"] / r["bare_auth_apply_ms"]
    for r in rows[:4]:
        # CPU per request on both sides, from the processes' own counters.
        assert set(r["cpu"]) in ({"server", "bare_auth_apply"}, {"server", "bare_auth"})
    # The pull after a push also against the bare pull after a bare push (the same conditions).
    assert set(rows[4]["cpu"]) == {"server", "bare_auth_apply", "bare_after_push"}
    assert rows[4]["ratio_after_push"] == rows[4]["server_ms"] / rows[4]["bare_after_push_ms"]
    assert all(v > 0 for r in rows for v in r["cpu"].values())
    table = ratio_rows({"compressed_dataplane": rows})
    # Per push: the round trip, its CPU and the apply in process; per pull: the round trip and its CPU (and the
    # pull after a push its CPU against the bare pull after a bare push).
    assert len(table) == 3 * 3 + 2 * 2 + 1 and table[0][0].startswith("data plane push topk tiny")


def test_the_bare_work_decodes_what_our_codecs_encode() -> None:
    """The baseline does the same work as the server: its decode (which shares no code with ours) gives the same
    dense update, and its quantisation the same number of bytes as the server's int8 pull."""
    shapes = ((40, 30), (40,), (7, 40), (7,))
    n = sum(math.prod(s) for s in shapes)
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    for codec in (TopKCodec(0.05), Int8Codec(16, True, 0), PowerSgdCodec(2, 0)):
        enc = codec.encode(x, shapes)
        spec = {**enc.spec.model_dump(exclude_none=True), "codec": enc.spec.name, "shapes": [list(s) for s in shapes]}
        raw = memoryview(enc.data.numpy())
        assert torch.equal(bare_decode(spec, raw), decode(enc.data, enc.spec, shapes))
        bare_check(spec, raw, bare_decode(spec, raw))
    # The bare finite check reads what ours reads: a top-k push's non-finite value is caught from its k values.
    bad = x.clone()
    bad[3] = math.inf
    enc = TopKCodec(0.05).encode(bad, shapes)
    spec = {**enc.spec.model_dump(exclude_none=True), "codec": "topk", "shapes": [list(s) for s in shapes]}
    with pytest.raises(ValueError, match="non-finite"):
        bare_check(spec, memoryview(enc.data.numpy()), bare_decode(spec, memoryview(enc.data.numpy())))
    ours = Int8Codec(16, False, 0).encode(x, shapes).data
    theirs = bare_quantise(x, 16)
    assert theirs.numel() == ours.numel()
    assert torch.allclose(decode(theirs, CodecSpec(name="int8", chunk=16), shapes),
                          decode(ours, CodecSpec(name="int8", chunk=16), shapes))
