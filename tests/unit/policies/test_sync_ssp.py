"""SSP (bounded staleness) as pure decision functions."""

from __future__ import annotations

import pytest

from hermes.common.policies.base import get, names
from hermes.common.policies.ebsp import ElasticBarrierStrategy
from hermes.common.policies.sync import (
    Decision,
    PushInfo,
    Release,
    StaleSynchronousStrategy,
    SyncStrategy,
)


def strategy(name: str, **params: object) -> SyncStrategy:
    """A sync policy by its registered name, built with ``params``."""
    built = get("sync", name)(**params)
    assert isinstance(built, SyncStrategy)
    return built


def push(worker: str, at: float = 0.0, iteration: int = 1) -> PushInfo:
    return PushInfo(worker_id=worker, base_version=0, current_version=0, samples=32, iteration=iteration, at=at)


def test_push_info_at_is_optional_and_backwards_compatible():
    p = PushInfo("a", 1, 3, 32, 2)
    assert p.at == 0.0 and p.staleness == 2
    assert PushInfo("a", 1, 3, 32, 2, at=5.5).at == 5.5


def test_registered():
    assert {"ssp", "ebsp"} <= set(names("sync"))
    assert isinstance(strategy("ssp", staleness=2), StaleSynchronousStrategy)
    assert isinstance(strategy("ebsp", lookahead=4, history=5), ElasticBarrierStrategy)


def ssp(s: int, *workers: str) -> StaleSynchronousStrategy:
    st = StaleSynchronousStrategy(staleness=s)
    for w in workers:
        st.on_join(w)
    return st


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_ssp_rejects_bad_staleness(bad):
    with pytest.raises(ValueError, match="staleness"):
        StaleSynchronousStrategy(staleness=bad)


def test_ssp_fast_worker_runs_s_ahead_then_waits():
    s = ssp(2, "fast", "slow")
    # Clock 1 and 2 are within min_clock(0) + 2: applied, replied at once.
    assert s.on_push(push("fast")).decision is Decision.APPLY
    assert s.on_push(push("fast")).decision is Decision.APPLY
    assert s.take_release() is None
    # Clock 3 > 0 + 2: folded in, but the reply is held.
    v = s.on_push(push("fast"))
    assert v.decision is Decision.APPLY_AND_WAIT
    assert "3" in v.reason and "2" in v.reason
    assert s.take_release() is None  # slowest has not moved
    # The slow worker's first push raises the minimum to 1: 3 <= 1 + 2.
    assert s.on_push(push("slow")).decision is Decision.APPLY
    assert s.take_release() == Release(aggregate=(), wake=("fast",))
    assert s.take_release() is None


def test_ssp_zero_is_lock_step():
    s = ssp(0, "a", "b")
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT
    assert s.take_release() is None
    assert s.on_push(push("b")).decision is Decision.APPLY  # b is the slowest: never held
    assert s.take_release() == Release((), ("a",))


def test_ssp_releases_several_held_workers_in_hold_order():
    s = ssp(0, "a", "b", "c")
    assert s.on_push(push("c")).decision is Decision.APPLY_AND_WAIT
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT
    assert s.take_release() is None
    assert s.on_push(push("b")).decision is Decision.APPLY
    assert s.take_release() == Release((), ("c", "a"))


def test_ssp_only_releases_workers_within_the_new_bound():
    s = ssp(1, "a", "b")
    assert s.on_push(push("a")).decision is Decision.APPLY  # 1 <= 0 + 1
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT  # 2 > 0 + 1
    assert s.waiting == ["a"]
    assert s.on_push(push("b")).decision is Decision.APPLY  # min 1: 2 <= 2 -> a released
    assert s.take_release() == Release((), ("a",))
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT  # 3 > 1 + 1
    assert s.take_release() is None


def test_ssp_leave_of_the_slowest_releases_the_held():
    s = ssp(0, "a", "b")
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT
    s.on_leave("b")
    assert s.take_release() == Release((), ("a",))


def test_ssp_held_worker_that_leaves_is_woken():
    s = ssp(0, "a", "b")
    assert s.on_push(push("a")).decision is Decision.APPLY_AND_WAIT
    s.on_leave("a")
    assert s.take_release() == Release((), ("a",))


def test_ssp_joiner_starts_at_min_clock_and_does_not_stall():
    s = ssp(1, "a", "b")
    for _ in range(5):
        s.on_push(push("a"))
        s.on_push(push("b"))
        while s.take_release():
            pass
    assert s.clock == {"a": 5, "b": 5}
    s.on_join("c")
    assert s.clock["c"] == 5
    # a is allowed to 6 = 5 + 1 without waiting for c's first push.
    assert s.on_push(push("a")).decision is Decision.APPLY
    assert s.on_push(push("c")).decision is Decision.APPLY


def test_ssp_rejoin_restarts_at_min_clock_and_stranger_is_applied():
    s = ssp(0, "a")
    assert s.on_push(push("ghost")).decision is Decision.APPLY
    assert "ghost" not in s.clock
    s.on_push(push("a"))
    s.on_join("b")
    assert s.clock["b"] == 1
    s.on_leave("b")
    s.on_push(push("a"))
    s.on_join("b")
    assert s.clock["b"] == 2


def test_ssp_no_busy_wait_release_is_none_without_held():
    s = ssp(3, "a")
    for _ in range(10):
        assert s.on_push(push("a")).decision is Decision.APPLY  # alone: always the slowest
        assert s.take_release() is None


def ebsp(*workers: str, lookahead: int = 4) -> ElasticBarrierStrategy:
    s = ElasticBarrierStrategy(lookahead=lookahead)
    for w in workers:
        s.on_join(w)
    return s
