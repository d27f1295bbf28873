"""The live view's pure parts: the history ring behind /v1/history and the TensorBoard event writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.common.messages import IN_FLIGHT
from hermes.server.dashboard import History
from hermes.server.tensorboard import TensorBoardSink


def _cycle(worker: str, i: int) -> dict:
    return {"worker": worker, "elapsed": float(i), "compute_seconds": 0.1 * i, "dss": 64 * i, "batch_size": 16,
            "pushed": i % 2 == 0, "decision": "zscore", "z": -1.0}


def test_history_keeps_the_newest_points_with_names_and_answers_since() -> None:
    hist = History(lambda wid: {"w1": "edge-a"}[wid], capacity=3)
    for i in range(5):
        hist("cycle", _cycle("w1", i))
    hist("evaluation", {"elapsed": 5.0, "version": 7, "accuracy": 0.5, "loss": 1.0, "seconds": 0.1})
    hist("join", {"worker": "w1", "name": "edge-a"})  # other facts are not series
    everything = hist.since(0)
    assert everything["seq"] == 6
    assert [c["dss"] for c in everything["cycles"]] == [128, 192, 256]  # the ring dropped the oldest two
    assert {c["worker"] for c in everything["cycles"]} == {"edge-a"}
    assert everything["evaluations"] == [{"seq": 6, "elapsed": 5.0, "version": 7, "accuracy": 0.5, "loss": 1.0}]
    later = hist.since(4)
    assert [p["seq"] for p in later["cycles"]] == [5] and [p["seq"] for p in later["evaluations"]] == [6]
    assert hist.since(6) == {"seq": 6, "evaluations": [], "cycles": []}


def test_event_files_read_back_by_tensorboard(tmp_path: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    sink = TensorBoardSink(tmp_path, name_of=lambda wid: "edge-" + wid, totals=lambda: (10, 2000, 3000))
    sink("evaluation", {"version": 3, "accuracy": 0.5, "loss": 1.25})
    for i in range(1, 4):
        sink("cycle", _cycle("a", i))
    sink("cycle", {**_cycle("a", 4), "decision": "always"})  # no gate: counted as neither
    sink("cycle", {**_cycle("a", 5), "decision": IN_FLIGHT, "pushed": False})  # push still in flight: neither
    sink.close()
    sink("evaluation", {"version": 4, "accuracy": 0.6, "loss": 1.0})  # after close: dropped, no error
    acc = accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(s.step, s.value) for s in acc.Scalars("test/accuracy")] == [(3, 0.5)]
    assert [(s.step, s.value) for s in acc.Scalars("dss/edge-a")] == [(1, 64), (2, 128), (3, 192), (4, 256),
                                                                       (5, 320)]
    assert [s.value for s in acc.Scalars("gate_pushes/edge-a")] == [0, 1, 1, 1, 1]
    assert [s.value for s in acc.Scalars("gate_skips/edge-a")] == [1, 1, 2, 2, 2]
    assert [(s.step, s.value) for s in acc.Scalars("messages/total")] == [(3, 10), (3, 10)]  # at eval and at close
