"""benchmarks/link_backlog_share.py: the share of a push's backlog a request sent during it waited for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import link_backlog_share as lbs  # noqa: E402


def _trace(folder: Path, share: float) -> None:
    """An agent's trace: a 1 s push (0.6 s up, 0.3 s down), requests alone take 0.1 s, and during the push they
    take 0.1 s plus ``share`` of what of the push is still to cross (half the 0.2 s RTT before its reply)."""
    lines = [{"kind": "argv", "argv": "python -m hermes.client.cli --name worker-1"}]
    lines += [{"kind": "req", "type": t, "t0": 0.0, "t": 0.1} for t in ("PULL_MODEL", "FETCH_SHARD", "REQUEST_WORK")]
    lines += [{"kind": "req", "type": "REQUEST_WORK", "t0": t0, "t": t0 + 0.1} for t0 in (5.0, 6.0, 7.0)]
    lines.append({"kind": "req", "type": "PUSH_UPDATE", "t0": 10.0, "t": 11.0})
    for into in (0.1, 0.3, 0.5):  # going up: 0.5, 0.3, 0.1 s of it left
        lines.append({"kind": "req", "type": "REQUEST_WORK", "t0": 10.0 + into, "t": 10.0 + into + 0.1 + share * (0.6 - into)})
    for into in (0.65, 0.75):  # coming down: the reply is in at 1.0, its model done 0.1 s before
        left = min(max(0.0, 1.0 - into - 0.1), 0.3)
        lines.append({"kind": "req", "type": "REQUEST_WORK", "t0": 10.0 + into, "t": 10.0 + into + 0.1 + share * left})
    folder.mkdir()
    (folder / "1.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


@pytest.mark.parametrize("share", [0.0, 0.65, 1.0])
def test_the_share_is_read_back_from_the_requests_during_a_push(tmp_path, share):
    _trace(tmp_path / "t", share)
    pts = lbs.points(tmp_path / "t", up_s=0.6, down_s=0.3, half_rtt=0.1)
    assert [d for _, _, d in pts] == ["up", "up", "up", "down", "down"]
    assert lbs.share(pts) == pytest.approx(share, abs=1e-9)
    assert lbs.main([str(tmp_path / "t"), "--push-bytes", "750000", "--up", "10", "--down", "20", "--rtt", "0.2"]) == 0
