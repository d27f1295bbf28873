"""Every journal record checksummed; a damaged one before the end is told from a torn tail (issue 29)."""

from __future__ import annotations

import json
import struct

import crc32c
import pytest
import torch

from hermes.common.wire import Payload
from hermes.server.checkpoint import (
    RECORD_MARK,
    CheckpointError,
    Journal,
    check_model_file,
    check_resumable,
    journal_damage,
    read_journal,
    scan_journal,
    scan_journals,
)
from hermes.server.tensorfile import write_tensors


def _journal(path, n: int = 10, numel: int = 64) -> list[int]:
    """n records; the byte offset where each starts."""
    j = Journal(path, fsync=False)
    starts = []
    for v in range(1, n + 1):
        starts.append(path.stat().st_size if path.exists() else 0)
        d = torch.full((numel,), float(v))
        j.append(v, "apply", [Payload(d.dtype, (d,), ((numel,),))], [1.0])
    j.close()
    return starts


def _flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_records_are_marked_and_read_back(tmp_path) -> None:
    path = tmp_path / "journal-0.log"
    starts = _journal(path, 3)
    data = path.read_bytes()
    assert all(data[s : s + 4] == RECORD_MARK for s in starts)
    assert [h["version"] for h, _ in read_journal(path)] == [1, 2, 3]


@pytest.mark.parametrize("where", ["length", "header", "delta", "crc"])
def test_one_flipped_bit_mid_journal_counts_the_updates_it_would_lose(tmp_path, where) -> None:
    path = tmp_path / "journal-0.log"
    starts = _journal(path, 10)
    rec4 = starts[4]
    offset = {"length": rec4 + 4, "header": rec4 + 14, "delta": starts[5] - 40, "crc": starts[5] - 2}[where]
    _flip(path, offset)
    scan = scan_journal(path)
    assert [h["version"] for h, _ in scan.records] == [1, 2, 3, 4]
    # The damaged 5th and the 5 intact ones after it.
    assert scan.corrupt_at == rec4 and scan.lost == 6 and scan.tail == 0


def test_a_torn_or_damaged_last_record_is_a_tail_not_damage(tmp_path) -> None:
    path = tmp_path / "journal-0.log"
    starts = _journal(path, 4)
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])
    scan = scan_journal(path)
    assert len(scan.records) == 3 and scan.corrupt_at is None and scan.tail == len(whole) - 7 - starts[3]
    path.write_bytes(whole)
    _flip(path, len(whole) - 20)
    scan = scan_journal(path)
    assert len(scan.records) == 3 and scan.corrupt_at is None and scan.tail > 0


def test_later_journals_count_as_lost_too(tmp_path) -> None:
    starts = _journal(tmp_path / "journal-0.log", 5)
    _journal(tmp_path / "journal-5.log", 3)
    _flip(tmp_path / "journal-0.log", starts[1] + 20)
    damage = journal_damage(scan_journals(tmp_path))
    assert damage is not None and damage[0].path.name == "journal-0.log" and damage[1] == 4 + 3


def test_format_1_journals_still_read(tmp_path) -> None:
    """Records of servers before issue 29: no marker, no header checksum."""
    path = tmp_path / "journal-0.log"
    parts = []
    for v in (1, 2):
        d = torch.full((8,), float(v))
        head = json.dumps({"version": v, "op": "apply", "weights": [1.0],
                           "deltas": [{"dtype": "float32", "numel": 8}]}).encode()
        body = d.numpy().tobytes()
        parts += [struct.pack("<I", len(head)), head, body,
                  struct.pack("<I", crc32c.crc32c(body, crc32c.crc32c(head)))]
    path.write_bytes(b"".join(parts))
    records = read_journal(path)
    assert [h["version"] for h, _ in records] == [1, 2]
    assert torch.equal(records[1][1][0], torch.full((8,), 2.0))


def test_a_missing_or_truncated_model_file_is_one_line(tmp_path) -> None:
    model = tmp_path / "model-3.safetensors"
    meta = {"model_file": model.name}
    with pytest.raises(CheckpointError, match="model-3.safetensors is missing"):
        check_resumable(tmp_path, meta)
    write_tensors(model, {"model": torch.ones(1000), "baseline": torch.zeros(1000)})
    check_model_file(model)
    data = model.read_bytes()
    model.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"truncated \(\d+ bytes of \d+\)"):
        check_resumable(tmp_path, meta)
    model.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="not a readable tensor file"):
        check_resumable(tmp_path, meta)


def test_resume_is_refused_with_the_count_unless_told_to_truncate(tmp_path) -> None:
    write_tensors(tmp_path / "model-0.safetensors", {"model": torch.ones(4), "baseline": torch.zeros(4)})
    starts = _journal(tmp_path / "journal-0.log", 10)
    _flip(tmp_path / "journal-0.log", starts[6] + 30)
    meta = {"model_file": "model-0.safetensors"}
    with pytest.raises(CheckpointError, match=r"would lose 4 acknowledged update\(s\).*--resume-truncate-corrupt"):
        check_resumable(tmp_path, meta)
    check_resumable(tmp_path, meta, truncate_corrupt=True)
