"""Every journal record checksummed; a damaged one before the end is told from a torn tail (issue 29)."""

from __future__ import annotations

import json
import struct

import crc32c
import pytest
import torch

from hermes.common.tensors import ModelSpec
from hermes.common.wire import Payload
from hermes.server.checkpoint import (
    LOST,
    RECORD_MARK,
    Checkpointer,
    CheckpointError,
    Journal,
    check_model_file,
    check_resumable,
    journal_damage,
    read_journal,
    scan_journal,
    scan_journals,
)
from hermes.server.state import ModelState
from hermes.server.tensorfile import write_tensors


def _journal(path, n: int = 10, numel: int = 64, first: int = 1) -> list[int]:
    """n records, versions from ``first``, record v's delta all v; the byte offset where each starts."""
    j = Journal(path, fsync=False)
    starts = []
    for v in range(first, first + n):
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
    # The damaged 5th is lost; the 5 intact ones after it are verified by their own checksums (salvage).
    assert [h["version"] for h, _ in scan.salvaged] == [6, 7, 8, 9, 10] and scan.missing == [5]
    assert scan.corrupt_at == rec4 and scan.lost == 1 and scan.tail == 0 and scan.sound


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


def test_later_journals_are_not_lost_with_the_damaged_record(tmp_path) -> None:
    starts = _journal(tmp_path / "journal-0.log", 5)
    _journal(tmp_path / "journal-5.log", 3, first=6)
    _flip(tmp_path / "journal-0.log", starts[1] + 20)
    damage = journal_damage(scan_journals(tmp_path))
    assert damage is not None and damage[0].path.name == "journal-0.log" and damage[1] == 1


def test_where_the_versions_after_the_damage_do_not_rise_everything_after_it_is_lost(tmp_path) -> None:
    # Records after the damage that do not continue the versions (a file pieced together from two runs):
    # replaying them would not be a lost update, so the old rule holds: the damaged one and all after it.
    starts = _journal(tmp_path / "journal-0.log", 5)
    _journal(tmp_path / "journal-0.log", 3)  # versions 1-3 again, appended
    _journal(tmp_path / "journal-5.log", 2, first=6)
    _flip(tmp_path / "journal-0.log", starts[3] + 20)
    scans = scan_journals(tmp_path)
    assert not scans[0].sound and scans[0].lost == 1 + 1 + 3
    damage = journal_damage(scans)
    assert damage is not None and damage[1] == 5 + 2


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
    # The damaged 7th only: the 3 after it are verified by their own checksums and would be replayed.
    with pytest.raises(CheckpointError, match=r"3 intact record\(s\) after it; resuming would lose 1 acknowledged "
                                              r"update\(s\).*--resume-truncate-corrupt.*replay the intact ones"):
        check_resumable(tmp_path, meta)
    check_resumable(tmp_path, meta, truncate_corrupt=True)


_SPEC = ModelSpec(name="toy", input_shape=(4,), entries=(("w", (64,)),))


def _replayed(directory, *, truncate_corrupt: bool) -> tuple[ModelState, Checkpointer]:
    state = ModelState(_SPEC, torch.zeros(64))
    ckpt = Checkpointer(None, directory, interval=3600.0, durable_acks=True)  # type: ignore[arg-type]
    ckpt.truncate_corrupt = truncate_corrupt
    ckpt._replay(state)
    return state, ckpt


def test_the_operator_s_resume_skips_exactly_the_damaged_record_and_replays_the_verified_ones(tmp_path) -> None:
    # Issue 29's matrix: one bit flipped mid-journal and the resume (with the override) dropped every record
    # after the damaged one, 10 of 20 acknowledged updates. A real journal file, one byte flipped mid-file.
    path = tmp_path / "journal-0.log"
    _journal(path, 20)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    scan = scan_journal(path)
    assert len(scan.missing) == 1 and len(scan.records) + len(scan.salvaged) == 19
    damaged = scan.missing[0]
    with pytest.raises(CheckpointError, match="would lose 1 acknowledged"):
        _replayed(tmp_path, truncate_corrupt=False)
    assert path.read_bytes() == bytes(data)  # refused: nothing touched
    state, ckpt = _replayed(tmp_path, truncate_corrupt=True)
    _, model = state.snapshot()
    # Every update but the damaged one (record v adds v to every element); the version counts the lost one too.
    assert state.version == 20 and ckpt.dropped_updates == 1
    assert torch.equal(model, torch.full((64,), float(sum(range(1, 21)) - damaged)))
    assert (tmp_path / "journal-0.log.damaged").read_bytes() == bytes(data)
    # The journal now holds the intact records and an empty one for the lost version: clean, the same again.
    again = scan_journal(path)
    assert again.corrupt_at is None and again.tail == 0
    assert [h["version"] for h, _ in again.records] == list(range(1, 21))
    assert [h["op"] for h, _ in again.records if h["version"] == damaged] == [LOST]
    state2, ckpt2 = _replayed(tmp_path, truncate_corrupt=False)
    assert state2.version == 20 and torch.equal(state2.snapshot()[1], model) and ckpt2.dropped_updates == 0
    # The resumed server appends after them.
    j = Journal(path, fsync=False)
    d = torch.full((64,), 100.0)
    j.append(21, "apply", [Payload(d.dtype, (d,), ((64,),))], [1.0])
    j.close()
    assert [h["version"] for h, _ in read_journal(path)][-2:] == [20, 21]


def test_a_second_damaged_resume_keeps_the_first_one_s_damaged_file(tmp_path) -> None:
    # Nothing overwrites a user's earlier results: each --resume-truncate-corrupt keeps its own evidence.
    path = tmp_path / "journal-0.log"
    _journal(path, 20)
    _flip(path, path.stat().st_size // 4)
    first = path.read_bytes()
    _replayed(tmp_path, truncate_corrupt=True)
    _flip(path, 3 * path.stat().st_size // 4)
    second = path.read_bytes()
    state, ckpt = _replayed(tmp_path, truncate_corrupt=True)
    assert ckpt.dropped_updates == 1 and state.version == 20
    assert (tmp_path / "journal-0.log.damaged").read_bytes() == first
    assert (tmp_path / "journal-0.log.damaged.1").read_bytes() == second
