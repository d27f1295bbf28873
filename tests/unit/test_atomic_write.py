"""One atomic-write helper: whole files only, racing writers (threads of one process too), no temp files left."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from hermes.common.atomic_write import write_atomic


def test_text_bytes_and_a_writer_function(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    write_atomic(p, '{"x": 1}')
    assert p.read_text() == '{"x": 1}'
    write_atomic(p, b"\x00\x01", durable=True)
    assert p.read_bytes() == b"\x00\x01"
    write_atomic(p, lambda fh: fh.write(b"abc"))
    assert p.read_bytes() == b"abc"
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "keep.txt"
    p.write_text("old")

    def broken(fh) -> None:
        fh.write(b"half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(p, broken)
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["keep.txt"]


def test_threads_racing_on_one_file_leave_one_whole_version(tmp_path: Path) -> None:
    """The precision cache's old temp name was per process: two in-process agents wrote the same temp file."""
    p = tmp_path / "cache.json"
    payloads = [str(i) * 50_000 for i in range(8)]
    barrier = threading.Barrier(len(payloads))

    def write(text: str) -> None:
        barrier.wait()
        for _ in range(20):
            write_atomic(p, text)

    threads = [threading.Thread(target=write, args=(t,)) for t in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.read_text() in payloads
    assert [q.name for q in tmp_path.iterdir()] == ["cache.json"]
