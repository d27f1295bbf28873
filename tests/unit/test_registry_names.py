"""A worker name belongs to one live agent process (server/registry.py)."""

from __future__ import annotations

import pytest

from hermes.common.clock import ManualClock
from hermes.server.registry import NameInUse, Registry

A, B = "a" * 16, "b" * 16


def _registry() -> tuple[Registry, ManualClock]:
    clock = ManualClock()
    return Registry(8, clock=clock), clock


def test_second_live_process_is_refused_until_the_holder_goes_silent() -> None:
    reg, clock = _registry()
    first, rejoined = reg.register("edge", takeover_after=3.0, hints={"instance": A})
    assert not rejoined
    clock.advance(1.0)
    with pytest.raises(NameInUse, match="in use by another live agent") as exc:
        reg.register("edge", takeover_after=3.0, hints={"instance": B})
    assert exc.value.retry_after == pytest.approx(2.0)
    assert reg.get(first.id).hints["instance"] == A  # the holder keeps its registration
    # The holder died without a goodbye (no heartbeat since): the restarted agent takes the name over.
    clock.advance(2.5)
    rec, rejoined = reg.register("edge", takeover_after=3.0, hints={"instance": B})
    assert rejoined and rec.id == first.id and rec.hints["instance"] == B


def test_same_process_lost_or_left_holders_and_old_agents_rejoin() -> None:
    reg, clock = _registry()
    rec, _ = reg.register("edge", takeover_after=3.0, hints={"instance": A})
    # The same process registering again (it was told its registration is gone).
    assert reg.register("edge", takeover_after=3.0, hints={"instance": A})[1]
    # A holder the server marked lost, or that left: free to take.
    rec.state = "lost"
    assert reg.register("edge", takeover_after=3.0, hints={"instance": B})[1]
    rec.state = "left"
    assert reg.register("edge", takeover_after=3.0, hints={"instance": A})[1]
    # Agents that send no instance (older ones) rejoin as before.
    assert reg.register("edge", takeover_after=3.0, hints={})[1]
