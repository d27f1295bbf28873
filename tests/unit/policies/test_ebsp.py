"""EBSP (Zipline elastic barriers) as pure decision functions."""

from __future__ import annotations

import pytest

from hermes.common.policies.ebsp import ElasticBarrierStrategy, choose_barrier, predict_push_times
from hermes.common.policies.sync import (
    Decision,
    PushInfo,
    Release,
)


def push(worker: str, at: float = 0.0, iteration: int = 1) -> PushInfo:
    return PushInfo(worker_id=worker, base_version=0, current_version=0, samples=32, iteration=iteration, at=at)


def test_predict_push_times_uses_mean_interval():
    assert predict_push_times(10.0, [1.0, 3.0], until=16.0) == [12.0, 14.0, 16.0]
    assert predict_push_times(0.0, [5.0], until=1.0) == [5.0]  # at least one
    with pytest.raises(ValueError):
        predict_push_times(0.0, [], until=1.0)
    with pytest.raises(ValueError):
        predict_push_times(0.0, [0.0], until=1.0)


def test_choose_barrier_worked_example_early_barrier():
    # A every 1 s, B every 1.5 s, C every 2 s; R = 4 -> window ends at A's 4th push (4.0);
    # everyone has pushed once by 2.0, so candidates are 2, 3, 4.
    #   t=2: A 0 + B (2-1.5)=0.5 + C 0   = 0.5   <- best
    #   t=3: A 0 + B 0       + C (3-2)=1 = 1.0
    #   t=4: A 0 + B (4-3)=1 + C 0       = 1.0
    pred = {"A": [1.0, 2.0, 3.0, 4.0], "B": [1.5, 3.0, 4.5], "C": [2.0, 4.0]}
    assert choose_barrier(pred, lookahead=4) == (2.0, {"A": 2, "B": 1, "C": 1})


def test_choose_barrier_worked_example_common_multiple():
    # A every 1, B every 2, C every 3; R = 6: at t=6 all three push together.
    #   t=3: 0+1+0=1, t=4: 0+0+1=1, t=5: 0+1+2=3, t=6: 0
    pred = {"A": [1, 2, 3, 4, 5, 6], "B": [2, 4, 6], "C": [3, 6]}
    assert choose_barrier(pred, lookahead=6) == (6, {"A": 6, "B": 3, "C": 2})
    # R = 4 cuts the window at 4: t=3 and t=4 tie at 1, the earlier wins.
    assert choose_barrier(pred, lookahead=4) == (3, {"A": 3, "B": 1, "C": 1})


def test_choose_barrier_slowest_beyond_window_forces_its_first_push():
    # R = 2 ends at A's 2nd push (2.0) but C's first push is at 10: only t=10.
    pred = {"A": [1.0 * k for k in range(1, 11)], "C": [10.0]}
    t, n = choose_barrier(pred, lookahead=2)
    assert t == 10.0 and n == {"A": 10, "C": 1}


def test_choose_barrier_equal_speeds_is_bsp_and_is_deterministic():
    pred = {"b": [2.0, 4.0], "a": [2.0, 4.0]}
    assert choose_barrier(pred, lookahead=2) == (2.0, {"b": 1, "a": 1})
    assert choose_barrier(dict(reversed(list(pred.items()))), lookahead=2) == choose_barrier(pred, lookahead=2)


def test_choose_barrier_validates():
    with pytest.raises(ValueError):
        choose_barrier({"a": [1.0]}, lookahead=0)
    with pytest.raises(ValueError):
        choose_barrier({}, lookahead=1)
    with pytest.raises(ValueError):
        choose_barrier({"a": []}, lookahead=1)


def ebsp(*workers: str, lookahead: int = 4) -> ElasticBarrierStrategy:
    s = ElasticBarrierStrategy(lookahead=lookahead)
    for w in workers:
        s.on_join(w)
    return s


def run_round(s: ElasticBarrierStrategy, pushes: list[tuple[str, float]]) -> tuple[list[Decision], Release | None]:
    decisions, rel = [], None
    for w, at in pushes:
        decisions.append(s.on_push(push(w, at=at)).decision)
        r = s.take_release()
        if r is not None:
            rel = r
    return decisions, rel


def test_ebsp_without_history_is_bsp():
    s = ebsp("a", "b")
    d, rel = run_round(s, [("a", 1.0), ("b", 3.0)])
    assert d == [Decision.BUFFER, Decision.BUFFER]
    assert rel == Release(("a", "b"), ("a", "b"))
    assert s.quota == {"a": 1, "b": 1}  # no intervals measured yet


def test_ebsp_without_timestamps_stays_bsp():
    s = ebsp("a", "b")
    for _ in range(4):
        d, rel = run_round(s, [("a", 0.0), ("b", 0.0)])
        assert d == [Decision.BUFFER, Decision.BUFFER] and rel is not None
    assert s.quota == {"a": 1, "b": 1}


def test_ebsp_fast_worker_pushes_several_times_per_barrier():
    # a computes in 1 s, b in 2 s. Round 1 (no history) and round 2 (intervals
    # measured from the release at t=2) are BSP.
    s = ebsp("a", "b", lookahead=4)
    assert run_round(s, [("a", 1.0), ("b", 2.0)])[1] == Release(("a", "b"), ("a", "b"))
    assert run_round(s, [("a", 3.0), ("b", 4.0)])[1] == Release(("a", "b"), ("a", "b"))
    # Round 3 from t=4: predicted a: 5, 6, 7, 8; b: 6, 8. R=4 -> window [6, 8];
    # t=6: 0 + 0 = 0 -> barrier at 6 with a twice, b once.
    assert s.last_barrier == 6.0 and s.quota == {"a": 2, "b": 1}
    d, rel = run_round(s, [("a", 5.0), ("a", 6.0), ("b", 6.0)])
    assert d == [Decision.APPLY, Decision.BUFFER, Decision.BUFFER]
    assert rel == Release(("a", "b"), ("a", "b"))  # the buffered last pushes, everyone woken
    assert s.quota == {"a": 2, "b": 1}


def test_ebsp_rejects_a_second_push_at_the_barrier_and_leave_releases():
    s = ebsp("a", "b", "c")
    assert s.on_push(push("a", at=1.0)).decision is Decision.BUFFER
    assert s.on_push(push("a", at=1.1)).decision is Decision.REJECT
    assert s.on_push(push("b", at=2.0)).decision is Decision.BUFFER
    assert s.take_release() is None
    s.on_leave("c")
    assert s.take_release() == Release(("a", "b"), ("a", "b"))


def test_ebsp_leaver_buffered_update_still_counts():
    s = ebsp("a", "b")
    assert s.on_push(push("a", at=1.0)).decision is Decision.BUFFER
    s.on_leave("a")
    assert s.take_release() is None  # b still holds the barrier
    assert s.on_push(push("b", at=2.0)).decision is Decision.BUFFER
    assert s.take_release() == Release(("a", "b"), ("a", "b"))
    assert s.quota == {"b": 1}


def test_ebsp_joiner_mid_round_gets_quota_one():
    s = ebsp("a")
    assert s.on_push(push("a", at=1.0)).decision is Decision.BUFFER
    s.on_join("b")
    assert s.take_release() is None
    assert s.on_push(push("b", at=1.5)).decision is Decision.BUFFER
    assert s.take_release() == Release(("a", "b"), ("a", "b"))


@pytest.mark.parametrize("kw", [{"lookahead": 0}, {"history": 0}, {"lookahead": 1.5}])
def test_ebsp_validates(kw):
    with pytest.raises(ValueError):
        ElasticBarrierStrategy(**kw)
