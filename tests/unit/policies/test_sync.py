"""Sync strategies as pure decision functions: ASP apply / stale reject, BSP barriers."""

from __future__ import annotations

import pytest

from hermes.common.policies.base import get, names
from hermes.common.policies.sync import (
    AsyncStrategy,
    BarrierStrategy,
    Decision,
    PushInfo,
    Release,
    SyncStrategy,
)


def strategy(name: str, **params: object) -> SyncStrategy:
    """A sync policy by its registered name, built with ``params``."""
    built = get("sync", name)(**params)
    assert isinstance(built, SyncStrategy)
    return built


def push(worker: str, base: int = 0, current: int = 0, samples: int = 32, iteration: int = 1) -> PushInfo:
    return PushInfo(worker_id=worker, base_version=base, current_version=current, samples=samples, iteration=iteration)


# ---------------------------------------------------------------------------
# ASP


def test_push_info_staleness():
    assert push("a", base=3, current=7).staleness == 4
    assert push("a", base=7, current=7).staleness == 0


def test_asp_applies_everything_without_a_bound():
    s = AsyncStrategy()
    s.on_join("a")
    for staleness in (0, 1, 50, 10_000):
        v = s.on_push(push("a", base=0, current=staleness))
        assert v.decision is Decision.APPLY
    assert s.take_release() is None  # nothing is ever held


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_asp_rejects_beyond_max_staleness(bound):
    s = AsyncStrategy(max_staleness=bound)
    s.on_join("a")
    at = s.on_push(push("a", base=10, current=10 + bound))
    assert at.decision is Decision.APPLY
    over = s.on_push(push("a", base=10, current=10 + bound + 1))
    assert over.decision is Decision.REJECT
    assert str(bound + 1) in over.reason and str(bound) in over.reason
    assert s.take_release() is None


def test_asp_does_not_require_membership():
    # An ASP decision depends on staleness only; membership is the engine's job.
    s = AsyncStrategy(max_staleness=2)
    assert s.on_push(push("stranger", base=5, current=6)).decision is Decision.APPLY


# ---------------------------------------------------------------------------
# BSP


def bsp(*workers: str) -> BarrierStrategy:
    s = BarrierStrategy()
    for w in workers:
        s.on_join(w)
    return s


def test_bsp_buffers_until_all_active_pushed():
    s = bsp("a", "b", "c")
    assert s.on_push(push("a")).decision is Decision.BUFFER
    assert s.take_release() is None
    assert s.on_push(push("c")).decision is Decision.BUFFER
    assert s.take_release() is None
    assert s.on_push(push("b")).decision is Decision.BUFFER
    rel = s.take_release()
    assert rel == Release(aggregate=("a", "c", "b"), wake=("a", "c", "b"))  # arrival order
    assert s.take_release() is None  # released once


def test_bsp_rounds_repeat():
    s = bsp("a", "b")
    for _ in range(3):
        s.on_push(push("a"))
        assert s.take_release() is None
        s.on_push(push("b"))
        assert set(s.take_release().aggregate) == {"a", "b"}


def test_bsp_single_worker_releases_every_push():
    s = bsp("solo")
    s.on_push(push("solo"))
    assert s.take_release() == Release(("solo",), ("solo",))


def test_bsp_leave_completes_the_barrier():
    s = bsp("a", "b", "c")
    s.on_push(push("a"))
    s.on_push(push("b"))
    assert s.take_release() is None
    s.on_leave("c")  # the straggler leaves: nobody waits for it
    assert s.take_release() == Release(("a", "b"), ("a", "b"))


def test_bsp_update_of_a_worker_that_left_still_counts():
    s = bsp("a", "b", "c")
    s.on_push(push("a"))
    s.on_leave("a")
    assert s.take_release() is None
    s.on_push(push("b"))
    assert s.take_release() is None
    s.on_push(push("c"))
    assert set(s.take_release().aggregate) == {"a", "b", "c"}


def test_bsp_no_release_without_pushes():
    s = bsp("a", "b")
    s.on_leave("a")
    s.on_leave("b")
    assert s.take_release() is None


def test_bsp_double_push_in_a_round_is_rejected():
    s = bsp("a", "b")
    assert s.on_push(push("a")).decision is Decision.BUFFER
    second = s.on_push(push("a", iteration=2))
    assert second.decision is Decision.REJECT
    assert "already" in second.reason
    assert s.take_release() is None  # the duplicate did not count as b's push
    s.on_push(push("b"))
    assert s.take_release().aggregate == ("a", "b")  # a appears once
    # Next round a may push again.
    assert s.on_push(push("a", iteration=3)).decision is Decision.BUFFER


def test_bsp_join_mid_round_holds_the_barrier():
    s = bsp("a", "b")
    s.on_push(push("a"))
    s.on_join("c")
    s.on_push(push("b"))
    assert s.take_release() is None  # c is active now and has not pushed
    s.on_push(push("c"))
    assert s.take_release().aggregate == ("a", "b", "c")


def test_bsp_rejoin_is_idempotent():
    s = bsp("a", "b")
    s.on_join("a")
    assert s.active == {"a", "b"}
    s.on_leave("zzz")  # unknown leave is harmless
    assert s.active == {"a", "b"}


# ---------------------------------------------------------------------------
# registry


def test_strategies_by_registered_name():
    assert isinstance(strategy("asp"), AsyncStrategy)
    assert strategy("asp", max_staleness=4).max_staleness == 4
    assert isinstance(strategy("bsp"), BarrierStrategy)
    assert set(names("sync")) >= {"asp", "bsp"}
    with pytest.raises(ValueError, match="unknown sync 'nope'"):
        strategy("nope")
    with pytest.raises(TypeError):
        strategy("bsp", max_staleness=1)


def test_strategies_are_independent_instances():
    a, b = strategy("bsp"), strategy("bsp")
    a.on_join("x")
    assert b.active == set()
