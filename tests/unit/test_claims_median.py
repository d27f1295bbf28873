"""The claims' median of the other workers' speeds, kept sorted instead of gathered per cycle report."""

from __future__ import annotations

import random
import statistics

from hermes.server.engine.claims import median_without


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
