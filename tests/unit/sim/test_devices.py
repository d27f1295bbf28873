"""Availability models: always on, trace intervals (FedScale's reading), seeded two-state churn."""

from __future__ import annotations

import math

import pytest

from hermes.sim.devices import (
    ALWAYS_ON,
    Availability,
    AvailabilityError,
    EmpiricalSpells,
    ExponentialSpells,
    IntervalAvailability,
    TwoStateAvailability,
    churn,
    offline_share,
)


def _flips(a: Availability, horizon: float) -> list[float]:
    out, t = [], 0.0
    while (nxt := a.next_change(t)) is not None and nxt < horizon:
        out.append(nxt)
        t = nxt
    return out


def test_always_on_never_flips():
    assert ALWAYS_ON.online(0.0) and ALWAYS_ON.online(1e9)
    assert ALWAYS_ON.next_change(5.0) is None
    assert isinstance(ALWAYS_ON, Availability)


def test_intervals_are_half_open_and_next_change_is_strictly_later():
    a = IntervalAvailability(((10.0, 20.0), (30.0, 40.0)))
    assert [a.online(t) for t in (0, 9.99, 10, 19.99, 20, 25, 30, 40, 50)] == [
        False, False, True, True, False, False, True, False, False]
    assert a.next_change(0.0) == 10.0
    assert a.next_change(10.0) == 20.0  # strictly after t, even at an edge
    assert a.next_change(35.0) == 40.0
    assert a.next_change(40.0) is None


def test_touching_intervals_are_one_spell():
    a = IntervalAvailability(((0.0, 5.0), (5.0, 9.0)))
    assert a.online(5.0) and a.next_change(1.0) == 9.0


def test_a_periodic_trace_repeats_like_fedscale_reads_it():
    # FedScale's ClientMetadata.is_active: norm_time = cur_time % finish_time.
    a = IntervalAvailability(((10.0, 20.0),), period=100.0)
    assert a.online(115.0) and not a.online(125.0) and not a.online(205.0)
    assert a.next_change(125.0) == 210.0
    assert a.next_change(215.0) == 220.0
    assert _flips(a, 300.0) == [10.0, 20.0, 110.0, 120.0, 210.0, 220.0]


def test_a_periodic_trace_online_across_the_wrap_does_not_flip_there():
    a = IntervalAvailability(((0.0, 10.0), (90.0, 100.0)), period=100.0)
    assert a.online(95.0) and a.online(100.0) and a.online(105.0)
    assert a.next_change(95.0) == 110.0
    whole = IntervalAvailability(((0.0, 100.0),), period=100.0)
    assert whole.next_change(50.0) is None and whole.online(1e6)


@pytest.mark.parametrize("intervals, period", [
    (((5.0, 5.0),), None),            # empty
    (((10.0, 20.0), (15.0, 30.0)), None),  # overlapping
    (((10.0, 20.0), (0.0, 5.0)), None),    # unsorted
    (((0.0, 120.0),), 100.0),         # beyond the period
])
def test_bad_intervals_are_refused(intervals, period):
    with pytest.raises(AvailabilityError):
        IntervalAvailability(intervals, period=period)


def test_two_state_is_deterministic_for_a_seed_whatever_the_query_order():
    spells = ExponentialSpells(mean_on_s=40.0, mean_off_s=10.0)
    a, b = TwoStateAvailability(spells, seed=7), TwoStateAvailability(spells, seed=7)
    forward = [a.online(t) for t in range(0, 2000, 3)]
    # b answers a far query first, then the early ones: the same spells.
    assert b.online(1999.0) == a.online(1999.0)
    assert [b.online(t) for t in range(0, 2000, 3)] == forward
    assert _flips(a, 2000.0) == _flips(b, 2000.0)
    other = TwoStateAvailability(spells, seed=8)
    assert _flips(other, 2000.0) != _flips(a, 2000.0)


def test_next_change_is_where_online_flips():
    a = churn(0.3, 20.0, seed=3)
    t = 0.0
    for _ in range(50):
        nxt = a.next_change(t)
        assert nxt is not None and nxt > t
        assert a.online(nxt - 1e-6) == a.online(t) != a.online(nxt)
        t = nxt


def test_a_fifth_offline_in_random_spells():
    # Issue 27/28: "each device offline about a fifth of the time in random spells".
    shares = [offline_share(churn(0.2, 60.0, seed=s), 200_000.0) for s in range(20)]
    mean = sum(shares) / len(shares)
    assert 0.18 < mean < 0.22
    assert all(0.1 < s < 0.3 for s in shares)
    assert ExponentialSpells(240.0, 60.0).offline_fraction == pytest.approx(0.2)


def test_churn_zero_is_always_on_and_bad_shares_are_refused():
    assert churn(0.0, 60.0, seed=0) is ALWAYS_ON
    for bad in (1.0, -0.1, math.nan):
        with pytest.raises(AvailabilityError):
            churn(bad, 60.0, seed=0)


def test_empirical_spells_resample_the_observed_lengths():
    spells = EmpiricalSpells(on_s=(30.0, 50.0), off_s=(10.0,))
    a = TwoStateAvailability(spells, seed=1)
    flips = [0.0, *_flips(a, 5000.0)]
    lengths = {round(b - x, 6) for x, b in zip(flips[1:], flips[2:], strict=False)}
    assert lengths <= {10.0, 30.0, 50.0} and 10.0 in lengths
    assert spells.offline_fraction == pytest.approx(10 / 50)
