"""hermes-bench micro's compressed rows (issue 31): top-k, int8 and PowerSGD pushes and int8 pulls go through a real
hermes-server (each push answered "applied", else the bench raises) beside the bare pyzmq pair moving the same
bytes, and every row reports the server's pieces and a ratio."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.micro import bench_compressed_dataplane, ratio_rows

pytestmark = pytest.mark.integration  # starts hermes-server and the bare router


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
        assert set(r["pieces"]) == {"decompress", "bare_decode", "validate", "apply", "bare_add"}
        assert r["ratio_auth_apply"] == r["server_ms"] / r["bare_auth_apply_ms"]
    table = ratio_rows({"compressed_dataplane": rows})
    assert len(table) == 3 * 2 + 2 and table[0][0].startswith("data plane push topk tiny")
