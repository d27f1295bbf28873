"""A re-run testbed command moves the earlier run aside instead of deleting it."""

from __future__ import annotations

from hermes.deploy.previous_run import set_aside


def test_an_empty_or_fresh_folder_is_left_alone(tmp_path):
    assert set_aside(tmp_path) is None
    (tmp_path / "logs").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    assert set_aside(tmp_path) is None and (tmp_path / "notes.txt").read_text() == "mine"


def test_the_earlier_run_moves_to_previous_with_every_byte(tmp_path):
    (tmp_path / "model-best.safetensors").write_bytes(b"best")
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "server.log").write_text("line")
    (tmp_path / "notes.txt").write_text("mine")
    first = set_aside(tmp_path, clock=lambda: 0.0)
    assert first == tmp_path / "previous" / "19700101T000000Z"
    assert (first / "model-best.safetensors").read_bytes() == b"best"
    assert (first / "logs" / "server.log").read_text() == "line"
    assert not (tmp_path / "model-best.safetensors").exists() and not (tmp_path / "logs").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"  # not a run output: untouched
    # A second run in the same second gets its own folder: nothing is overwritten.
    (tmp_path / "model-best.safetensors").write_bytes(b"second")
    second = set_aside(tmp_path, clock=lambda: 0.0)
    assert second == tmp_path / "previous" / "19700101T000000Z-2"
    assert (second / "model-best.safetensors").read_bytes() == b"second"
    assert (first / "model-best.safetensors").read_bytes() == b"best"
