"""Quarantine weighs refusals over time and cycles (server/engine/quarantine.py, issue 29)."""

from __future__ import annotations

import pytest

from hermes.common.clock import ManualClock
from hermes.server.engine.quarantine import Quarantine
from hermes.server.quarantine_params import QuarantineSettings
from hermes.server.registry import WorkerRecord


def _setup(**kw: float) -> tuple[Quarantine, WorkerRecord, ManualClock]:
    clock = ManualClock()
    q = Quarantine(5, QuarantineSettings(**kw), clock=clock)
    return q, WorkerRecord(id="w0001", name="edge", token="t" * 16, joined_at=0.0), clock


def test_a_burst_of_refusals_within_milliseconds_is_one_piece_of_evidence() -> None:
    q, w, clock = _setup()
    # The fedasync burst of issue 29: 5 refusals in 70 ms (at new versions, too).
    for i in range(5):
        assert not q.refused(w, version=10 + i)
        clock.advance(0.014)
    assert not q.holds(w.id) and not w.quarantined
    assert q.score(w.id) == pytest.approx(1.0, abs=0.01)


def test_refusals_at_one_model_version_count_once() -> None:
    q, w, clock = _setup()
    for _ in range(10):
        q.refused(w, version=3)
        clock.advance(2.0)
    assert not q.holds(w.id)


def test_steady_refusals_over_seconds_and_cycles_quarantine() -> None:
    q, w, clock = _setup()
    verdicts = []
    for i in range(6):
        verdicts.append(q.refused(w, version=i))
        clock.advance(1.0)
    # A refusal a second: 1 + 2^(-1/60) + ... + 2^(-4/60) = 4.89 after five, 5.83 after six.
    assert verdicts == [False] * 5 + [True]
    assert q.holds(w.id) and w.quarantined
    assert "after 6 refused updates" in q.reason(w.id)


def test_the_score_halves_every_half_life_and_with_each_accepted_update() -> None:
    q, w, clock = _setup(half_life_seconds=10.0)
    q.refused(w, version=1)
    clock.advance(10.0)
    assert q.score(w.id) == pytest.approx(0.5)
    assert q.accepted(w) is None
    assert q.score(w.id) == pytest.approx(0.25)


def test_an_honest_worker_refused_now_and_then_is_never_quarantined() -> None:
    # One refusal in ten pushes, a push a second, for ten minutes.
    q, w, clock = _setup()
    for i in range(600):
        clock.advance(1.0)
        if i % 10 == 0:
            q.refused(w, version=i)
        else:
            assert q.accepted(w) is None
    assert not q.holds(w.id)


def _quarantine(q: Quarantine, w: WorkerRecord, clock: ManualClock) -> None:
    for i in range(20):
        q.refused(w, version=i)
        clock.advance(1.0)
        if q.holds(w.id):
            return
    raise AssertionError("never quarantined")


def test_probation_releases_after_accepted_updates_in_a_row_and_a_refusal_starts_it_again() -> None:
    q, w, clock = _setup(probation=3)
    _quarantine(q, w, clock)
    assert "1/3" in (q.accepted(w) or "")
    assert "2/3" in (q.accepted(w) or "")
    q.refused(w, version=1000)  # failed probation: the count starts again
    clock.advance(1.0)
    assert "1/3" in (q.accepted(w) or "")
    assert "2/3" in (q.accepted(w) or "")
    assert q.accepted(w) is None  # the third in a row: released, folded
    assert not q.holds(w.id) and not w.quarantined and q.released["probation"] == 1
    assert q.score(w.id) == 0.0


def test_the_operator_releases_and_probation_zero_waits_for_it() -> None:
    q, w, clock = _setup(probation=0)
    _quarantine(q, w, clock)
    for _ in range(10):
        assert "operator release" in (q.accepted(w) or "")
    assert "only the operator" in q.reason(w.id)
    assert q.release(w) and not q.holds(w.id) and q.released["operator"] == 1
    assert not q.release(w)  # not quarantined any more


def test_threshold_zero_never_quarantines() -> None:
    clock = ManualClock()
    q = Quarantine(0, QuarantineSettings(), clock=clock)
    w = WorkerRecord(id="w0001", name="edge", token="t" * 16, joined_at=0.0)
    for i in range(50):
        q.refused(w, version=i)
        clock.advance(5.0)
    assert not q.holds(w.id)
