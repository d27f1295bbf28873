"""Engine work per push or join that must not grow with the number of workers: the claims' median of the
other workers' speeds (kept sorted), the workers-by-state gauge (counted when scraped)."""

from __future__ import annotations

import random
import statistics

import pytest

from hermes.common.clock import ManualClock
from hermes.server.engine.claims import median_without
from tests.unit.test_engine_inprocess import _Agent, _engine, _run


def test_median_without_is_statistics_median_of_the_others():
    rng = random.Random(0)
    for n in range(0, 40):
        speeds = sorted(rng.choice([rng.uniform(1, 100), 5.0]) for _ in range(n))
        assert median_without(speeds, None) == (statistics.median(speeds) if speeds else None)
        for mine in set(speeds):
            others = list(speeds)
            others.remove(mine)
            assert median_without(speeds, mine) == (statistics.median(others) if others else None), (speeds, mine)


def test_median_without_on_the_papers_fleet_shape():
    # OmniLearn HL8: speeds 1, 2, 4, 8; the fastest's others are 1, 2, 4 (median 2), the slowest's 2, 4, 8 (4).
    assert median_without([1.0, 2.0, 4.0, 8.0], 8.0) == 2.0
    assert median_without([1.0, 2.0, 4.0, 8.0], 1.0) == 4.0
    assert median_without([3.0], 3.0) is None


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_the_workers_gauge_counts_each_state_when_scraped(clock):
    engine = _engine(clock)
    a, _b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")
    _run(engine.leave(a.rec.id, "silent", state="lost"))
    text = engine.metrics.render().decode()
    assert 'hermes_workers{state="active"} 1.0' in text
    assert 'hermes_workers{state="lost"} 1.0' in text and 'hermes_workers{state="left"} 0.0' in text
