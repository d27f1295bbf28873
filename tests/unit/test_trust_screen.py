"""Direction screening and claim bounds (issue 29), in-process: the pure parts and the engine's push path."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from hermes.common.clock import ManualClock
from hermes.common.messages import CycleReport
from hermes.common.policies.robust import staleness_dampened
from hermes.common.policies.sync import BarrierParams, BarrierStrategy, PushInfo, Release
from hermes.common.wire import MsgType
from hermes.server.engine.claims import Claims, work_scale
from hermes.server.engine.direction import DirectionReference
from hermes.server.engine.screening import ScreeningSettings
from hermes.server.engine.telemetry import Telemetry
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from tests.unit.test_engine_inprocess import _Agent, _engine, _run


def _noisy(direction: torch.Tensor, gen: torch.Generator, noise: float = 1.0) -> torch.Tensor:
    return direction + noise * torch.randn(direction.numel(), generator=gen)


def test_the_reference_is_the_median_of_other_workers_latest_entries():
    ref = DirectionReference(4, window=8, sketch=16, min_workers=2)
    ref.accept("a", torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert ref.reference("b") is None, "one other worker: still warming up"
    ref.accept("b", torch.tensor([3.0, 1.0, 0.0, 0.0]))
    ref.accept("c", torch.tensor([2.0, 5.0, 0.0, 0.0]))
    # The pusher's own entry is left out: a's reference is the median of b and c only.
    assert torch.equal(ref.reference("a"), torch.tensor([2.5, 3.0, 0.0, 0.0]))
    # Many entries of one worker count once (its latest): d cannot outvote a, b, c.
    for _ in range(5):
        ref.accept("d", torch.tensor([-100.0, -100.0, 0.0, 0.0]))
    assert torch.equal(ref.reference("x"), torch.tensor([1.5, 0.5, 0.0, 0.0]))


def test_a_large_model_is_sketched_on_a_fixed_subset():
    ref = DirectionReference(1000, window=8, sketch=64, min_workers=1)
    v = torch.arange(1000, dtype=torch.float32)
    assert ref.sketch(v).numel() == 64 and torch.equal(ref.sketch(v), ref.sketch(v.clone()))


def test_honest_noisy_updates_agree_and_a_sign_flip_does_not():
    gen = torch.Generator().manual_seed(0)
    d = torch.randn(2000, generator=gen)
    ref = DirectionReference(2000, window=32, sketch=4096, min_workers=2)
    for i in range(12):
        ref.accept(f"h{i % 3}", _noisy(d, gen))
    honest = [ref.cosine("h0", _noisy(d, gen)) for _ in range(20)]
    assert min(c for c in honest if c is not None) > 0.2
    assert ref.cosine("attacker", -10 * d) < -0.6


def _engine_pushes(settings: ScreeningSettings, preset: str = "asp"):
    clock = ManualClock()
    engine = _engine(clock, preset=preset)
    engine.screening.settings = settings
    engine.screening.probe = engine._screening_probe(settings)
    engine.claims.settings = settings
    return engine, clock


def _three_along_the_descent(settings: ScreeningSettings):
    """An asp engine with ``settings``, three agents, and the probe's descent direction at the median norm 1e-3."""
    engine, clock = _engine_pushes(settings)
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    g = engine.screening.probe.descent()
    return engine, agents, g / float(g.norm()) * 1e-3


async def _history(engine, agents, step: torch.Tensor) -> list[str]:
    """Two rounds of the same honest push from every agent, each at the current version: the median norm
    and the reference the next push is judged against. Their statuses."""
    statuses = []
    for _ in range(2):
        for a in agents:
            reply = await a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=step,
                                    model_version=engine.state.version)
            statuses.append(reply.header.body["status"])
    return statuses


def test_the_engine_refuses_a_scaled_sign_flip_and_keeps_honest_pushes():
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, reference="consensus"))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    attacker = _Agent(engine, clock, "m")
    gen = torch.Generator().manual_seed(1)
    d = torch.randn(engine.spec.numel, generator=gen) * 1e-3

    async def push(agent: _Agent, delta: torch.Tensor) -> dict:
        reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=delta,
                                    model_version=engine.state.version)
        return reply.header.body

    async def go() -> tuple[list[str], list[str]]:
        honest, attacks = [], []
        for _ in range(4):
            for a in agents:
                honest.append((await push(a, _noisy(d, gen, 0.5e-3)))["status"])
        for k in (3, 10, 30):
            attacks.append((await push(attacker, -k * d)).get("reason", "applied"))
            for a in agents:
                honest.append((await push(a, _noisy(d, gen, 0.5e-3)))["status"])
        return honest, attacks

    honest, attacks = _run(go())
    assert set(honest) == {"applied"}
    # k = 3 is within direction_norm_factor (4) x the median: harmless in size, not judged.
    assert attacks[0] == "applied" and all("cosine" in r for r in attacks[1:]), attacks
    assert engine.screening.refusals == {"direction": 2}


def test_against_the_server_descent_direction_a_sign_flip_is_refused_and_a_correction_kept():
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3))
    assert engine.screening.probe is not None
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    attacker = _Agent(engine, clock, "m")
    gen = torch.Generator().manual_seed(3)

    async def push(agent: _Agent, delta: torch.Tensor) -> dict:
        reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=delta,
                                    model_version=engine.state.version)
        return reply.header.body

    def step(scale: float = 1.0) -> torch.Tensor:
        # An honest step: down the server's own loss, with noise; 1e-3 of the model's scale.
        g = engine.screening.probe.descent()
        g = g / float(g.norm()) * 1e-2
        return scale * (g + 0.3 * float(g.norm()) / g.numel() ** 0.5 * torch.randn(g.numel(), generator=gen))

    async def go() -> tuple[list[str], list[str]]:
        honest = [(await push(a, step()))["status"] for _ in range(3) for a in agents]
        # A large honest step (ten times the median norm) down the current loss is a correction: kept.
        honest.append((await push(agents[0], step(10.0)))["status"])
        attacks = [(await push(attacker, -step(k))).get("reason", "applied") for k in (3, 10, 30)]
        return honest, attacks

    honest, attacks = _run(go())
    assert set(honest) == {"applied"}, honest
    assert attacks[0] == "applied" and all("cosine" in r for r in attacks[1:]), attacks
    assert engine.screening.refusals == {"direction": 2}


def test_the_effect_test_refuses_a_large_update_that_raises_the_probe_loss():
    # Direction off and the norm bound wide: the loss probe alone (the check that protected hermes).
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, direction=False, clip=False, norm_factor=1000.0))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    g = engine.screening.probe.descent()
    g = g / float(g.norm()) * 1e-2

    async def go() -> tuple[list[str], str, str]:
        honest = await _history(engine, agents, g)
        up = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-300 * g,
                                     model_version=engine.state.version)
        down = await agents[1].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=10 * g,
                                       model_version=engine.state.version)
        return honest, up.header.body.get("reason", "applied"), down.header.body["status"]

    honest, up, down = _run(go())
    assert set(honest) == {"applied"} and down == "applied"
    assert "probe loss" in up, up
    assert engine.screening.refusals == {"effect": 1}


def test_a_moderately_large_update_that_raises_the_loss_is_down_weighted_not_refused():
    engine, agents, g = _three_along_the_descent(ScreeningSettings(min_history=3, direction=False, effect_margin=1e-6,
                                                                   effect_slack=0.0))

    async def go() -> str:
        await _history(engine, agents, g)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-6 * g,
                                        model_version=engine.state.version)
        return reply.header.body["status"]

    _, before = engine.state.snapshot()
    before = before.clone()
    assert _run(go()) == "applied"
    _, after = engine.state.snapshot()
    # Six steps of +1e-3, then the 6x step against them folded at the median norm (1e-3): 5e-3 net.
    assert abs(float((after - before).norm()) - 5e-3) < 1e-4
    assert engine.screening.public()["downweighted"] == 1 and not engine.screening.refusals


@pytest.mark.parametrize("uphill_below,status", [(-0.05, "applied"), (0.0, "rejected")])
def test_a_large_update_at_right_angles_to_the_descent_that_raises_the_loss_is_down_weighted(uphill_below, status):
    # Cosine -0.01 (edp-sgd's batch-5 worker was refused at -0.016, 9.4x): the rise the effect test saw is
    # curvature, not a step uphill, so it is not evidence enough to refuse (uphill_below 0.0: the old rule).
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, effect_margin=1e-6, effect_slack=0.0,
                                                     uphill_below=uphill_below, work_scale=False))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    d = engine.screening.probe.descent()
    d = d / float(d.norm())
    r = torch.randn(d.numel(), generator=torch.Generator().manual_seed(0))
    r = r - float(r @ d) * d
    side = -0.01 * d + math.sqrt(1 - 0.01**2) * r / float(r.norm())

    async def go() -> str:
        await _history(engine, agents, d * 1e-3)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=side * 2e-2,
                                        model_version=engine.state.version)
        return reply.header.body["status"]

    assert _run(go()) == status
    assert engine.screening.refusals == ({} if status == "applied" else {"effect": 1})
    assert engine.screening.public()["downweighted"] == (1 if status == "applied" else 0)


def test_a_large_update_that_passes_is_folded_clipped_to_the_bound():
    engine, agents, g = _three_along_the_descent(ScreeningSettings(min_history=3))

    async def go() -> str:
        await _history(engine, agents, g)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=20 * g,
                                        model_version=engine.state.version)
        return reply.header.body["status"]

    _, before = engine.state.snapshot()
    before = before.clone()
    assert _run(go()) == "applied"
    _, after = engine.state.snapshot()
    # Six steps of 1e-3, then the 20x one at 4x the median (4e-3): 1e-2 in all, not 2.6e-2.
    assert abs(float((after - before).norm()) - 1e-2) < 1e-4
    assert engine.screening.public()["clipped"] == 1


def test_direction_off_lets_the_same_sign_flip_through():
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, direction=False))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c", "m")]
    d = torch.randn(engine.spec.numel, generator=torch.Generator().manual_seed(2)) * 1e-3

    async def go() -> str:
        for _ in range(3):
            for a in agents[:3]:
                await a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=d, model_version=engine.state.version)
        reply = await agents[3].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-10 * d,
                                        model_version=engine.state.version)
        return reply.header.body["status"]

    assert _run(go()) == "applied"


def _claims(**kw) -> tuple[Claims, ManualClock, list[tuple[str, dict]]]:
    clock = ManualClock()
    seen: list[tuple[str, dict]] = []
    telemetry = Telemetry(ServerMetrics(), EventLog(None, clock=clock))
    telemetry.subscribe(lambda fact, fields: seen.append((fact, dict(fields))))
    return Claims(ScreeningSettings(**kw), telemetry, clock.monotonic), clock, seen


def test_samples_are_bounded_by_the_assigned_work_and_each_clamp_is_evidence():
    claims, _, seen = _claims()
    assert claims.samples("w", 10**9) == 4096  # nothing assigned, no allocator: max_samples_unassigned
    claims.workload = lambda wid: 64
    assert claims.samples("w", 10**9) == 64  # nothing assigned yet: what the allocator would assign
    claims.on_assign("w", 128)
    claims.on_assign("w", 96)
    assert claims.samples("w", 100) == 100
    assert claims.samples("w", 10**9) == 128
    assert [f["field"] for fact, f in seen if fact == "claim_clamped"] == ["samples"] * 3
    assert claims.public() == {"samples": 3}
    # A worker that never asked for work: no more than the others were given.
    assert claims.samples("idle", 10**9) == 96
    off, _, _ = _claims(claims=False)
    assert off.samples("w", 10**9) == 10**9


def test_a_cycle_handed_out_many_assignments_ago_is_bounded_by_its_own_assignment():
    # hermes, 2026-11-27: 4 assignments per request and a prefetch; a resize down to 128 came after
    # the agent held a 192 cycle, which it then reported. A window of the last 4 clamped it 41 times.
    claims, _, seen = _claims()
    claims.on_assign("w", 192)
    for _ in range(7):
        claims.on_assign("w", 128)
    report = CycleReport(dss=192, batch_size=32, compute_seconds=0.1)
    assert claims.cycle("w", report) is report
    assert claims.samples("w", 192) == 192  # the push of that cycle
    for _ in range(7):
        claims.cycle("w", CycleReport(dss=128, batch_size=32, compute_seconds=0.1))
    # Every outstanding assignment trained, 4 of them remembered: 192 has gone.
    assert claims.cycle("w", CycleReport(dss=192, batch_size=32, compute_seconds=0.1)).dss == 128
    assert claims.samples("w", 10**9) == 128
    assert [f["field"] for fact, f in seen if fact == "claim_clamped"] == ["dss", "samples"]


def test_cycle_seconds_are_bounded_by_elapsed_time_and_the_fleet_median_speed():
    claims, clock, _ = _claims(min_compute_fraction=0.25, power_factor=2.0, speed_tolerance=1.0)
    ids = {w: claims.on_assign(w, 128) for w in ("h1", "h2", "liar")}
    clock.advance(1.0)
    honest = CycleReport(dss=128, batch_size=32, compute_seconds=0.8)
    assert claims.cycle("h1", honest.model_copy(update={"assignment": ids["h1"]}), on_push=True).compute_seconds == 0.8
    assert claims.cycle("h2", honest.model_copy(update={"assignment": ids["h2"]}), on_push=True).compute_seconds == 0.8
    lie = claims.cycle("liar", CycleReport(dss=10**6, batch_size=32, compute_seconds=1e-6, assignment=ids["liar"]),
                       on_push=True)
    # dss to the assignment, seconds to 1/4 of the second since the hand-out (512/s), then to 2x the median speed.
    assert lie.dss == 128
    assert abs(lie.dss / lie.compute_seconds - 2 * (128 / 0.8)) < 1e-6
    assert claims.public() == {"dss": 1, "compute_seconds": 2}


def test_a_speed_within_the_bounds_is_left_as_claimed():
    claims, clock, seen = _claims(min_compute_fraction=0.25)
    handed = claims.on_assign("w", 64)
    clock.advance(1.0)
    report = CycleReport(dss=64, batch_size=32, compute_seconds=0.3, assignment=handed)
    assert claims.cycle("w", report, on_push=True) is report and not seen
    assert claims.windows_public() == {"closed": 1, "min_ratio": 0.3, "min_median_ratio": 0.3, "floor": 0.25}


def test_the_elapsed_time_window_starts_at_the_hand_out_or_the_last_reply_and_ends_at_the_push():
    # Issue 29: each cycle judged against its own window, not the time since the last reply. Prefetch:
    # the next assignment is handed out while the worker trains; a barrier: the worker waits for the reply.
    claims, clock, seen = _claims(min_compute_fraction=0.5)
    first = claims.on_assign("w", 64)
    second = claims.on_assign("w", 64)  # prefetched at once
    clock.advance(1.0)
    report = CycleReport(dss=64, batch_size=32, compute_seconds=0.6, assignment=first)
    assert claims.cycle("w", report, on_push=True) is report  # 0.6 of a 1 s window
    clock.advance(5.0)  # held at the barrier: not compute
    claims.on_reply("w")
    clock.advance(1.0)
    # The window of the second starts at the reply, not at its hand-out 7 s ago.
    report = CycleReport(dss=64, batch_size=32, compute_seconds=0.6, assignment=second)
    assert claims.cycle("w", report, on_push=True) is report and not seen
    # No prefetch: the worker waited for its assignment after the reply; the window starts at the hand-out.
    clock.advance(3.0)
    third = claims.on_assign("w", 64)
    clock.advance(1.0)
    report = CycleReport(dss=64, batch_size=32, compute_seconds=0.6, assignment=third)
    assert claims.cycle("w", report, on_push=True) is report and not seen
    # The same claim from a worker whose cycle took 4 s of wall time after its hand-out is raised to half of it.
    fourth = claims.on_assign("v", 64)
    clock.advance(4.0)
    lie = claims.cycle("v", CycleReport(dss=64, batch_size=32, compute_seconds=0.6, assignment=fourth), on_push=True)
    assert lie.compute_seconds == 2.0
    assert [(f["field"], f["claimed"], f["bound"]) for fact, f in seen if fact == "claim_clamped"] == [
        ("compute_seconds", 0.6, 2.0)]
    assert claims.windows_public()["min_ratio"] == 0.15


def test_one_stretched_window_is_noise_and_the_floor_judges_the_median_of_five():
    claims, clock, seen = _claims(min_compute_fraction=0.25)
    for seconds in (0.6, 0.6, 0.1, 0.6):  # one window at 0.1 of its wall time: a loaded machine
        handed = claims.on_assign("w", 64)
        clock.advance(1.0)
        report = CycleReport(dss=64, batch_size=32, compute_seconds=seconds, assignment=handed)
        assert claims.cycle("w", report, on_push=True) is report
    assert not seen
    for _ in range(3):  # again and again: the median of the last five falls under the floor
        handed = claims.on_assign("w", 64)
        clock.advance(1.0)
        last = claims.cycle("w", CycleReport(dss=64, batch_size=32, compute_seconds=0.1, assignment=handed),
                            on_push=True)
    assert last.compute_seconds == 0.25
    assert [f["field"] for fact, f in seen if fact == "claim_clamped"] == ["compute_seconds"] * 2
    assert claims.windows_public()["min_median_ratio"] == 0.1


def test_gate_skipped_cycles_share_the_window_of_the_push_that_follows():
    # hermes: skipped cycles' reports ride on the next work request or push; before issue 29's fix each
    # of them was compared with the whole span (floor off). Their seconds now count together.
    claims, clock, seen = _claims(min_compute_fraction=0.5)
    ids = [claims.on_assign("w", 64) for _ in range(3)]
    for i in ids[:2]:
        clock.advance(1.0)
        skipped = CycleReport(dss=64, batch_size=32, compute_seconds=0.9, assignment=i, pushed=False)
        assert claims.cycle("w", skipped) is skipped  # carried: the window stays open
    clock.advance(1.0)
    pushed = CycleReport(dss=64, batch_size=32, compute_seconds=0.9, assignment=ids[2])
    assert claims.cycle("w", pushed, on_push=True) is pushed and not seen  # 2.7 s of a 3 s window
    assert claims.windows_public()["closed"] == 1


def test_a_cycle_the_floor_raises_keeps_the_agent_s_own_seconds_in_its_event():
    # The "lte stall" (docs/simulation.md, 2026-11-28): the floor's window holds the link's transfers (an fp32
    # push of 434 KB at lte's 10 Mbit/s is 350 ms), so it raised every honest cycle of a run on lte, and the step
    # times read from the ``cycle`` events were the bound's (1.3x nominal), not the agent's (1.01x). The event
    # keeps both: what the server used, and what the agent claimed.
    engine, clock = _engine_pushes(ScreeningSettings())
    seen: list[tuple[str, dict]] = []
    engine.telemetry.subscribe(lambda fact, fields: seen.append((fact, dict(fields))))
    lan, lte = _Agent(engine, clock, "lan"), _Agent(engine, clock, "lte")

    async def push(agent: _Agent, compute_seconds: float, wall: float) -> None:
        handed = engine.claims.on_assign(agent.rec.id, 64, batch_size=32, lr=0.05)
        clock.advance(wall)
        await agent.request(MsgType.PUSH_UPDATE, {"samples": 64, "cycle": {
            "dss": 64, "batch_size": 32, "compute_seconds": compute_seconds, "assignment": handed}},
            payload=agent.delta(1e-3), model_version=engine.state.version)

    async def go() -> None:
        await push(lan, 0.5, 1.0)  # half its window: as claimed
        await push(lte, 0.125, 0.65)  # 0.19 of its window (a cycle on lte): raised to a quarter of it

    _run(go())
    cycles = {f["worker"]: f for fact, f in seen if fact == "cycle"}
    assert cycles[lan.rec.id]["compute_seconds"] == 0.5 and "claimed_compute_seconds" not in cycles[lan.rec.id]
    assert cycles[lte.rec.id]["compute_seconds"] == pytest.approx(0.1625)
    assert cycles[lte.rec.id]["claimed_compute_seconds"] == 0.125
    # The allocator saw the raised seconds, as before: only the record of the claim is new.
    assert [f["bound"] for fact, f in seen if fact == "claim_clamped"] == [pytest.approx(0.1625)]


def test_a_report_without_an_assignment_id_has_no_floor():
    # Agents before CycleReport.assignment (and ids the server never handed this worker): the floor is off.
    claims, clock, seen = _claims(min_compute_fraction=0.5)
    claims.on_assign("w", 64)
    clock.advance(10.0)
    report = CycleReport(dss=64, batch_size=32, compute_seconds=0.01)
    assert claims.cycle("w", report, on_push=True) is report
    other = claims.on_assign("x", 64)
    clock.advance(10.0)
    foreign = CycleReport(dss=64, batch_size=32, compute_seconds=0.01, assignment=other)
    assert claims.cycle("w", foreign, on_push=True) is foreign
    assert not seen and claims.windows_public()["closed"] == 0


def test_lying_samples_do_not_own_a_bsp_round():
    engine, clock = _engine_pushes(ScreeningSettings(), preset="bsp")
    a, liar = _Agent(engine, clock, "a"), _Agent(engine, clock, "liar")
    _, before = engine.state.snapshot()

    async def go() -> None:
        await a.request(MsgType.REQUEST_WORK, {})
        await liar.request(MsgType.REQUEST_WORK, {})
        wl = engine.allocator.workload(a.rec.id).dss
        first = asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": wl}, payload=a.delta(1e-3)))
        await asyncio.sleep(0.05)
        await liar.request(MsgType.PUSH_UPDATE, {"samples": 10**9}, payload=liar.delta(-1e-3))
        await asyncio.wait_for(first, 5)

    _run(go())
    _, after = engine.state.snapshot()
    # Both were assigned the same work: equal weights, the step is (1e-3 - 1e-3) / 2 = 0, not the liar's -1e-3.
    assert engine.state.version == 1
    assert torch.allclose(after, before, atol=1e-7)


# ---------------------------------------------------------------------------
# Barrier deadline (sync bsp)


def _bsp(*workers: str, **params) -> BarrierStrategy:
    s = BarrierStrategy(BarrierParams(**params))
    for w in workers:
        s.on_join(w)
    return s


def _at(worker: str, t: float) -> PushInfo:
    return PushInfo(worker, 0, 0, 1, 1, at=t)


def test_a_silent_worker_is_dropped_from_the_first_round_at_the_deadline_and_then_not_waited_for():
    s = _bsp("a", "b", "silent", min_wait_seconds=5.0, skip_after=2)
    s.on_push(_at("a", 100.0))
    s.on_push(_at("b", 101.0))
    # Without history: 4 x the latest arrival (1 s), at least min_wait_seconds (5 s) after the round began.
    s.on_tick(104.9)
    assert s.take_release() is None
    s.on_tick(105.0)
    assert s.take_release() == Release(("a", "b"), ("a", "b"))
    s.on_push(_at("a", 106.0))
    s.on_push(_at("b", 107.0))
    # The round began at the release (105): latest arrival 2 s in, deadline 8 s.
    s.on_tick(112.9)
    assert s.take_release() is None
    s.on_tick(113.0)
    assert s.take_release() is not None  # second round missed: silent is excused from now on
    s.on_push(_at("a", 114.0))
    s.on_push(_at("b", 115.0))
    assert s.take_release() == Release(("a", "b"), ("a", "b"))  # no wait at all


def test_a_dropped_worker_rejoins_the_barrier_with_its_next_push():
    s = _bsp("a", "b", "w", min_wait_seconds=1.0, skip_after=1)
    s.on_push(_at("a", 0.0))
    s.on_push(_at("b", 0.1))
    s.on_tick(2.0)
    assert s.take_release() is not None and s.excused == {"w"}
    s.on_push(_at("w", 2.5))  # its late update is kept and brings it back
    assert s.excused == set()
    assert s.take_release() is None  # the round now waits for a and b again
    s.on_push(_at("a", 3.0))
    s.on_push(_at("b", 3.1))
    assert s.take_release() == Release(("w", "a", "b"), ("w", "a", "b"))


def test_with_round_history_the_deadline_is_the_iqr_fence_of_round_durations():
    s = _bsp("a", "b", min_wait_seconds=0.5, deadline_factor=2.0)
    t = 0.0
    for d in (1.0, 1.2, 0.8, 1.0, 1.1):
        # The first round begins at its first push; the others at the previous release.
        s.on_push(_at("a", t if t == 0.0 else t + d / 2))
        s.on_push(_at("b", t + d))
        assert s.take_release() is not None
        t += d
    # Q1 1.0, Q3 1.1: fence 1.1 + 1.5 x 0.1 = 1.25, deadline 2 x 1.25 = 2.5 s.
    assert abs(s.deadline() - 2.5) < 1e-9
    s.on_push(_at("a", t + 0.5))
    s.on_tick(t + 2.4)
    assert s.take_release() is None
    s.on_tick(t + 2.5)
    assert s.take_release() == Release(("a",), ("a",))


def test_deadline_off_waits_for_every_worker():
    s = _bsp("a", "b", deadline=False)
    s.on_push(_at("a", 0.0))
    s.on_tick(1e6)
    assert s.take_release() is None


# ---------------------------------------------------------------------------
# Robust rules over FedBuff's buffer


def test_staleness_dampens_rows_before_the_robust_rule():
    stack = torch.tensor([[4.0], [4.0], [4.0]])
    out = staleness_dampened(stack, [0, 3, 8])
    # s(tau) = 1 / sqrt(1 + tau): 1, 1/2, 1/3 (FedBuff Alg. 1).
    assert torch.allclose(out, torch.tensor([[4.0], [2.0], [4.0 / 3.0]]))
    assert staleness_dampened(stack, [0, 0, 0]) is stack  # a barrier's step is unchanged


def test_a_median_over_the_fedbuff_buffer_ignores_one_outlier():
    clock = ManualClock()
    engine = _engine(clock, preset="fedbuff", aggregation="median", fedbuff={"buffer_size": 3})
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "m")]
    _, before = engine.state.snapshot()
    before = before.clone()

    async def go() -> list[str]:
        out = []
        for agent, value in zip(agents, (1e-3, 2e-3, -5.0)):
            reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=agent.delta(value))
            out.append(reply.header.body["status"])
        return out

    assert _run(go()) == ["applied"] * 3
    _, after = engine.state.snapshot()
    # One step at the release (K = 3), the coordinate-wise median of (1e-3, 2e-3, -5): 1e-3.
    assert engine.state.version == 1
    assert torch.allclose(after - before, torch.full_like(before, 1e-3), atol=1e-6)


def test_a_direction_failure_below_the_refusal_size_is_down_weighted_and_above_it_refused():
    # Issue 29's false refusals: an honest 5.2x update at cosine -0.57 with the descent (asp, seed 3)
    # was refused. Refused now only above downweight_below (8) x the median; below, folded at the median.
    engine, agents, g = _three_along_the_descent(ScreeningSettings(min_history=3, effect=False))

    async def go() -> tuple[str, str]:
        await _history(engine, agents, g)
        uphill = (await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-6 * g,
                                          model_version=engine.state.version)).header.body
        flip = (await agents[1].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-12 * g,
                                        model_version=engine.state.version)).header.body
        return uphill["status"], flip.get("reason", "applied")

    _, before = engine.state.snapshot()
    before = before.clone()
    uphill, flip = _run(go())
    assert uphill == "applied" and "cosine" in flip, (uphill, flip)
    _, after = engine.state.snapshot()
    # Six steps of +1e-3 and the 6x one against them at the median norm (1e-3): 5e-3 net.
    assert abs(float((after - before).norm()) - 5e-3) < 1e-4
    assert engine.screening.refusals == {"direction": 1} and engine.screening.public()["downweighted"] == 1


def test_with_downweight_below_zero_every_direction_failure_is_refused():
    engine, agents, g = _three_along_the_descent(ScreeningSettings(min_history=3, effect=False, downweight_below=0.0))

    async def go() -> str:
        await _history(engine, agents, g)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-6 * g,
                                        model_version=engine.state.version)
        return reply.header.body.get("reason", "applied")

    assert "cosine" in _run(go())
    assert engine.screening.refusals == {"direction": 1}


def test_a_large_update_down_the_descent_that_raises_the_loss_is_down_weighted_at_any_size():
    # edp-sgd's large-partition worker: 8x+ the median, along the descent, the probe loss up. With the
    # direction on it is folded at the median norm; the effect alone refuses only with direction off.
    engine, agents, g = _three_along_the_descent(ScreeningSettings(min_history=3, effect_margin=1e-6, effect_slack=0.0,
                                                                   norm_factor=1e6, clip=False))

    async def go() -> str:
        await _history(engine, agents, g)
        # Far down the descent (judged unclipped): overshoots, so the probe loss rises, while the direction agrees.
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=20000 * g,
                                        model_version=engine.state.version)
        return reply.header.body["status"]

    assert _run(go()) == "applied"
    assert not engine.screening.refusals and engine.screening.public()["downweighted"] == 1


def test_a_large_uphill_update_that_raises_the_loss_is_refused_even_within_the_cosine_bound():
    # The sign flip at k = 10 under fedbuff (2026-11-27): cosine -0.09..-0.18 with the descent, within the
    # bound (-0.2 at 10x), while the probe loss rose 0.30 -> 1.94. Uphill and harmful, and large: refused.
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, effect_margin=1e-6, effect_slack=0.0))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    g = engine.screening.probe.descent()
    g = g / float(g.norm())
    gen = torch.Generator().manual_seed(5)
    r = torch.randn(g.numel(), generator=gen)
    r = r - float(torch.dot(r, g)) * g
    r = r / float(r.norm())

    def tilted(cos: float, size: float) -> torch.Tensor:  # |u| = size, cos(u, descent) = cos
        return size * (cos * g + (1.0 - cos * cos) ** 0.5 * r)

    async def go() -> tuple[str, str, str]:
        await _history(engine, agents, 1e-3 * g)
        out = []
        for cos, size in ((-0.1, 12e-3), (-0.1, 6e-3), (0.1, 12e-3)):
            reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=tilted(cos, size),
                                            model_version=engine.state.version)
            out.append(reply.header.body.get("reason", "applied"))
        return out[0], out[1], out[2]

    big_uphill, small_uphill, downhill = _run(go())
    assert "probe loss" in big_uphill, big_uphill
    assert small_uphill == "applied", small_uphill  # 6x: folded at the median norm
    assert downhill == "applied", downhill  # 12x along the descent: clipped, not refused
    assert engine.screening.refusals == {"effect": 1}


def test_one_fast_cycle_is_noise_and_a_speed_claimed_again_and_again_is_clamped():
    claims, _, seen = _claims(power_factor=2.0, speed_tolerance=1.0)
    for w, seconds in (("slow", 1.0), ("mid", 0.5)):
        for _ in range(3):
            claims.on_assign(w, 100)
            claims.cycle(w, CycleReport(dss=100, batch_size=32, compute_seconds=seconds))
    # The others' speeds: 100 and 200 samples/s, median 150; the cap 300. Usual 250, one 1000 (a 0.1 s cycle).
    for seconds in (0.4, 0.4, 0.1, 0.4):
        claims.on_assign("fast", 100)
        report = CycleReport(dss=100, batch_size=32, compute_seconds=seconds)
        assert claims.cycle("fast", report) is report
    assert not seen
    for _ in range(3):  # 1000 samples/s again and again: the median crosses the cap
        claims.on_assign("fast", 100)
        last = claims.cycle("fast", CycleReport(dss=100, batch_size=32, compute_seconds=0.1))
    assert abs(last.dss / last.compute_seconds - 300.0) < 1e-6
    # The first repeat leaves the median at 250 (two fast of five); the next two are clamped.
    assert [f["field"] for fact, f in seen if fact == "claim_clamped"] == ["compute_seconds"] * 2


def test_a_small_batch_assignment_is_judged_at_its_work_scale_and_an_unassigned_update_is_not():
    # edp-sgd seed 2 (2026-11-27): the partition cut the slowest worker's batch to 5 (cycle 20) while the
    # others trained batch-32 cycles of 128; its honest updates reached 14-70x their median norm and 8 were
    # refused. Its work scale, lr x steps / batch, is 6.4x theirs: 20x the median is 3.1x its expected norm.
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, reference="consensus"))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    small, stranger = _Agent(engine, clock, "small"), _Agent(engine, clock, "stranger")
    gen = torch.Generator().manual_seed(3)
    d = torch.randn(engine.spec.numel, generator=gen) * 1e-3

    def cycle(agent: _Agent, dss: int, batch: int) -> dict:
        handed = engine.claims.on_assign(agent.rec.id, dss, batch_size=batch, lr=0.05)
        return {"dss": dss, "batch_size": batch, "compute_seconds": 0.1, "assignment": handed}

    async def push(agent: _Agent, delta: torch.Tensor, body: dict) -> dict:
        reply = await agent.request(MsgType.PUSH_UPDATE, body, payload=delta, model_version=engine.state.version)
        return reply.header.body

    async def go() -> tuple[list[str], list[dict], dict, dict]:
        honest = []
        for _ in range(4):
            for a in agents:
                honest.append((await push(a, _noisy(d, gen, 0.5e-3), {"samples": 128, "cycle": cycle(a, 128, 32)}))
                              ["status"])
        # The same direction, 20x and 40x the median norm: within the work-scaled bounds (4 x 6.4 to clip,
        # 32 x 6.4 to refuse), so folded as they are or clipped, not refused.
        small_replies = [await push(small, k * _noisy(d, gen, 0.5e-3), {"samples": 20, "cycle": cycle(small, 20, 5)})
                         for k in (20, 40)]
        # Without an assignment the server handed out (no id on its report), 40x is judged at x 1: refused
        # as before. Its claimed batch of 5 buys it nothing.
        bare = await push(stranger, 40 * d, {"samples": 20, "cycle": {"dss": 20, "batch_size": 5}})
        flipped = [await push(small, -k * d, {"samples": 20, "cycle": cycle(small, 20, 5)}) for k in (40, 80)]
        return honest, small_replies, bare, flipped

    honest, small_replies, bare, flipped = _run(go())
    assert set(honest) == {"applied"}
    assert [r["status"] for r in small_replies] == ["applied", "applied"], small_replies
    assert engine.screening.work_scaled >= 2
    assert bare["status"] == "rejected" and "× median" in bare["reason"] and "work scale" not in bare["reason"], bare
    # A sign flip at that work scale: at 40x the median (6.25x its expected norm) down-weighted, folded as one
    # honest step of its shape; at 80x (12.5x) refused by direction, as a flip past 8x always was.
    assert flipped[0]["status"] == "applied" and engine.screening.downweighted == 1, flipped
    assert flipped[1]["status"] == "rejected" and "direction" in flipped[1]["reason"], flipped
    assert engine.screening.refusals == {"norm": 1, "direction": 1}


def test_work_scale_off_judges_every_update_against_the_median_alone():
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, reference="consensus", work_scale=False))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    small = _Agent(engine, clock, "small")
    gen = torch.Generator().manual_seed(3)
    d = torch.randn(engine.spec.numel, generator=gen) * 1e-3

    async def go() -> dict:
        for _ in range(4):
            for a in agents:
                handed = engine.claims.on_assign(a.rec.id, 128, batch_size=32, lr=0.05)
                await a.request(MsgType.PUSH_UPDATE, {"samples": 128, "cycle": {
                    "dss": 128, "batch_size": 32, "assignment": handed}}, payload=_noisy(d, gen, 0.5e-3),
                    model_version=engine.state.version)
        handed = engine.claims.on_assign(small.rec.id, 20, batch_size=5, lr=0.05)
        reply = await small.request(MsgType.PUSH_UPDATE, {"samples": 20, "cycle": {
            "dss": 20, "batch_size": 5, "assignment": handed}}, payload=40 * d, model_version=engine.state.version)
        return reply.header.body

    reply = _run(go())
    assert reply["status"] == "rejected" and "norm" in reply["reason"], reply
    assert engine.screening.work_scaled == 0


def _blend_run(settings: ScreeningSettings) -> tuple[list[str], dict, dict, object]:
    """fedasync (a blend: G = local - w0): two workers push fresh steps along d; a third, whose previous push
    was at version 0, trained from version 1 while the model moved on, so its blend step also undoes
    that path. Before it, a newcomer pushes the same step, claiming the same base, as its first push."""
    engine, clock = _engine_pushes(settings, preset="fedasync")
    fresh = [_Agent(engine, clock, n) for n in ("a", "b")]
    slow, newcomer = _Agent(engine, clock, "slow"), _Agent(engine, clock, "newcomer")
    gen = torch.Generator().manual_seed(5)
    d = torch.randn(engine.spec.numel, generator=gen) * 1e-3
    _, w0 = engine.state.snapshot()
    w0 = w0.clone()

    async def push(agent: _Agent, local: torch.Tensor, base: int) -> dict:
        reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=local - w0, model_version=base)
        return reply.header.body

    async def go() -> tuple[list[str], dict, dict]:
        statuses = [(await push(slow, w0 + _noisy(d, gen, 0.3e-3), 0))["status"]]
        base_version, base = engine.state.snapshot()
        base = base.clone()
        for _ in range(12):
            for a in fresh:
                version, current = engine.state.snapshot()
                statuses.append((await push(a, current + _noisy(d, gen, 0.3e-3), version))["status"])
        # The step from a newcomer: it claims the same old base, but the server saw no push of it since.
        mirror = await push(newcomer, base + _noisy(d, gen, 0.3e-3), base_version)
        stale = await push(slow, base + _noisy(d, gen, 0.3e-3), base_version)
        return statuses, stale, mirror

    statuses, stale, mirror = _run(go())
    return statuses, stale, mirror, engine


def test_a_stale_blend_is_judged_against_the_median_plus_the_drift_since_its_base():
    # stale_contain_from off: the drift allowance alone decides (with it on, the newcomer's step is
    # down-weighted instead, the next test).
    statuses, stale, mirror, engine = _blend_run(ScreeningSettings(min_history=3, reference="consensus",
                                                                   stale_contain_from=0))
    assert set(statuses) == {"applied"}, statuses
    assert stale["status"] == "applied", stale
    assert engine.screening.drift_allowed >= 1
    assert mirror["status"] == "rejected", mirror


def test_a_newcomer_claiming_a_stale_base_is_folded_at_the_median_norm_when_that_contains_it():
    statuses, stale, mirror, engine = _blend_run(ScreeningSettings(min_history=3, reference="consensus"))
    assert set(statuses) == {"applied"} and stale["status"] == "applied", (statuses, stale)
    assert mirror["status"] == "applied", mirror
    assert engine.screening.refusals == {} and engine.screening.public()["downweighted"] >= 1


def test_without_the_drift_allowance_the_same_stale_blend_is_refused():
    statuses, stale, mirror, engine = _blend_run(ScreeningSettings(min_history=3, reference="consensus",
                                                                   stale_drift=False, stale_contain_from=0))
    assert set(statuses) == {"applied"}, statuses
    assert stale["status"] == "rejected", stale
    assert engine.screening.drift_allowed == 0


def test_a_push_after_gate_skipped_cycles_carries_their_summed_work_scale():
    # hermes under load (2026-11-27): an honest push carried 5 cycles (an in-flight one and three the gate
    # skipped train on into the since-pull delta) and was refused by effect at 8.6x the one-cycle median.
    claims, clock, _ = _claims()
    ids = [claims.on_assign("w", 128, batch_size=32, lr=0.1) for _ in range(5)]
    one = work_scale(128, 32, 1, 0.1)
    for i in ids[:4]:
        claims.cycle("w", CycleReport(dss=128, batch_size=32, compute_seconds=0.1, assignment=i, pushed=False))
    assert claims.take_scale("w") is None  # nothing pushed yet
    claims.cycle("w", CycleReport(dss=128, batch_size=32, compute_seconds=0.1, assignment=ids[4]), on_push=True)
    assert abs(claims.take_scale("w") - 5 * one) < 1e-12
    assert claims.take_scale("w") is None  # once per push
    # The next push folds one cycle again; a report without an id leaves the scale unknown.
    handed = claims.on_assign("w", 128, batch_size=32, lr=0.1)
    claims.cycle("w", CycleReport(dss=128, batch_size=32, compute_seconds=0.1, assignment=handed), on_push=True)
    assert abs(claims.take_scale("w") - one) < 1e-12
    claims.cycle("w", CycleReport(dss=128, batch_size=32, compute_seconds=0.1), on_push=True)
    assert claims.take_scale("w") is None
    # lr x steps / batch: a batch of 5 for 20 samples is 6.4x a batch of 32 for 128.
    assert abs(work_scale(20, 5, 1, 0.05) / work_scale(128, 32, 1, 0.05) - 6.4) < 1e-9


def test_a_worker_never_handed_work_is_capped_at_the_median_speed():
    # A claimer that only pushes (edp-sgd, 2026-11-27): under the 8x bound alone it took 0.945 of a round.
    claims, _, seen = _claims(speed_tolerance=1.0)
    for w, seconds in (("a", 1.0), ("b", 0.5), ("c", 0.25)):
        claims.on_assign(w, 100)
        claims.cycle(w, CycleReport(dss=100, batch_size=32, compute_seconds=seconds))
    lie = claims.cycle("pusher", CycleReport(dss=100, batch_size=32, compute_seconds=1e-6))
    assert abs(lie.dss / lie.compute_seconds - 200.0) < 1e-6  # the others' median, 200 samples/s
    # Handed work, the same claim is capped at power_factor (8) x that median.
    claims.on_assign("worker", 100)
    handed = claims.cycle("worker", CycleReport(dss=100, batch_size=32, compute_seconds=1e-6))
    assert abs(handed.dss / handed.compute_seconds - 8 * 200.0) < 1e-6
    assert [f["field"] for fact, f in seen if fact == "claim_clamped"] == ["compute_seconds"] * 2


def _tilted(engine, cos: float, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """The descent direction (unit) and a unit vector at ``cos`` to it."""
    g = engine.screening.probe.descent()
    g = g / float(g.norm())
    r = torch.randn(g.numel(), generator=torch.Generator().manual_seed(seed))
    r = r - float(torch.dot(r, g)) * g
    return g, cos * g + (1.0 - cos * cos) ** 0.5 * r / float(r.norm())


def test_an_uphill_update_whose_harm_a_down_weight_contains_is_down_weighted_not_refused():
    # The matrix's honest hermes run (2026-11-27): an update at 8.38x the median norm, pointing slightly
    # uphill, raised the probe loss 0.707 -> 1.23 clipped to 4x and was refused by effect. Folded at the
    # median norm (what a down-weight folds) it raises it less than the bound: refusing protects nothing.
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, effect_margin=1e-6, work_scale=False))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    probe = engine.screening.probe
    g, up = _tilted(engine, -0.1)

    async def history() -> None:
        await _history(engine, agents, 1e-3 * g)

    _run(history())
    _, w = engine.state.snapshot()
    base = probe.loss_of(w)
    rise_median, rise_clip = (probe.loss_of(w + s * up) - base for s in (1e-3, 4e-3))
    assert 0.0 < rise_median < rise_clip, (rise_median, rise_clip)
    # The slack between the two rises: the clipped fold fails the effect test, the down-weighted one passes.
    slack = (rise_median + rise_clip) / 2
    outcome = {}
    for contained_only in (True, False):
        engine.screening.settings = engine.screening.settings.model_copy(
            update={"effect_slack": slack, "refuse_uncontained_only": contained_only})

        async def push() -> str:
            reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=9e-3 * up,
                                            model_version=engine.state.version)
            return reply.header.body.get("reason", "applied")

        _, w = engine.state.snapshot()
        outcome[contained_only] = _run(push())
        if contained_only:
            _, after = engine.state.snapshot()
            # Folded at the median norm: the 9e-3 update moved the model by 1e-3.
            assert abs(float((after - w).norm()) - 1e-3) < 1e-5
    assert outcome[True] == "applied", outcome
    assert "probe loss" in outcome[False], outcome  # the rule before: refused on the clipped verdict
    assert engine.screening.refusals == {"effect": 1} and engine.screening.public()["downweighted"] == 1


def test_with_the_direction_on_but_unmeasured_the_effect_alone_refuses_nothing():
    # The consensus reference in warm-up (too few other workers) measures no cosine: a large update that
    # raises the probe loss is down-weighted, never refused on the effect alone (issue 29).
    settings = ScreeningSettings(min_history=3, reference="consensus", min_workers=10, effect_margin=1e-6,
                                 effect_slack=0.0, work_scale=False)
    engine, clock = _engine_pushes(settings)
    engine.screening.direction.min_workers = settings.min_workers  # built with the default settings' 2
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    g, _ = _tilted(engine, 0.0)

    async def go() -> str:
        await _history(engine, agents, 1e-3 * g)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-20e-3 * g,
                                        model_version=engine.state.version)
        return reply.header.body.get("reason", "applied")

    assert _run(go()) == "applied"
    assert not engine.screening.refusals and engine.screening.public()["downweighted"] == 1


def _windows(claims: Claims, clock: ManualClock, worker: str, dss: int, seconds: float, wall: float,
             n: int = 3) -> CycleReport:
    """``n`` cycles of ``dss`` samples named by their assignment, each claiming ``seconds`` in ``wall`` s of the
    server's clock from hand-out to push; the last one as the server bounded it."""
    out = None
    for _ in range(n):
        handed = claims.on_assign(worker, dss, batch_size=32, lr=0.1)
        clock.advance(wall)
        out = claims.cycle(worker, CycleReport(dss=dss, batch_size=32, compute_seconds=seconds, assignment=handed),
                           on_push=True)
    assert out is not None
    return out


def test_a_fast_worker_whose_windows_vouch_for_its_speed_is_not_held_to_the_fleet_median():
    # edp-sgd seeds 2 and 4 (2026-11-27): the fast worker measured above 16x (power_factor 8 x tolerance 2) the
    # others' median in samples a second once the partition cut their batches to 5-6: 5 honest clamps. A speed
    # the server's own clock agrees with (claimed compute >= min_compute_fraction of the window) is not clamped.
    claims, clock, seen = _claims()
    for w in ("slow1", "slow2", "slow3"):
        _windows(claims, clock, w, 20, 0.5, 0.6)  # 40 samples/s: batches of 5, a step's fixed cost dominates
    fast = _windows(claims, clock, "fast", 256, 0.3, 0.35)  # 853 samples/s: 21x the others' median
    assert fast.compute_seconds == 0.3 and not seen
    # The same speed claimed in 1/100 of the window's wall time: not vouched for, clamped to 8x the median.
    liar = _windows(claims, clock, "liar", 256, 0.3, 30.0)
    assert liar.compute_seconds > 0.3
    assert {f["field"] for fact, f in seen if fact == "claim_clamped"} == {"compute_seconds"}
    assert all(f["worker"] == "liar" for fact, f in seen if fact == "claim_clamped")


def test_a_round_s_powers_are_bounded_against_its_own_members():
    # Attack matrix, edp-sgd (2026-11-27): a liar's power share reached 0.926 beside two honest workers and
    # 0.673 beside three, against the claims' fleet-wide bound. Against the round's own members:
    claims, clock, seen = _claims()
    for w in ("h1", "h2", "h3"):
        _windows(claims, clock, w, 128, 0.8, 1.0)  # vouched: claimed 0.8 of the wall time
    share = {}

    def weights(ids: list[str], powers: list[float]) -> list[float]:
        capped = claims.cap_powers(ids, powers)
        return [p / sum(capped) for p in capped]

    # Never handed work (the matrix's claimer): at most the others' median, one worker's share.
    share["unassigned"] = weights(["liar", "h1", "h2"], [1e8, 100.0, 50.0])[0]
    assert abs(share["unassigned"] - 75 / 225) < 1e-9
    # Handed work but not vouched for (1e-6 s claimed in 1 s windows): power_factor x the round's median.
    _windows(claims, clock, "named", 128, 1e-6, 1.0)
    share["named"] = weights(["named", "h1", "h2"], [1e8, 100.0, 100.0])[0]
    assert abs(share["named"] - 8 / (8 + 2)) < 1e-9  # the live test's bound, 8 / (8 + n_honest), now exact
    # An honest fast worker 20x the others in the round, vouched for by its windows: its power stands.
    assert weights(["h1", "h2", "h3"], [2000.0, 100.0, 100.0])[0] == 2000 / 2200
    assert claims.public()["power"] == 2
    assert [f["worker"] for fact, f in seen if fact == "power_capped"] == ["liar", "named"]
    off, _, _ = _claims(claims=False)
    assert off.cap_powers(["liar", "h1"], [1e8, 1.0]) == [1e8, 1.0]


def test_the_engine_bounds_the_power_rule_s_round_by_the_claims():
    engine, _ = _engine_pushes(ScreeningSettings(), preset="edp-sgd")
    assert engine.policies.aggregation.power_cap == engine.claims.cap_powers


@pytest.mark.parametrize("uphill_from", [2.0, 0.0])
def test_a_flip_under_the_gate_is_down_weighted_and_an_honest_step_there_folds_whole(uphill_from):
    # Issue 29's matrix: the sign flip at k = 3 (-3x the median step, every 8 honest pushes) sat under the 4x
    # gate and was folded as it was, undoing ~3 honest steps each time (asp: 1.51x the honest time). From
    # uphill_from (2) x the median its direction is measured: pointing uphill it folds at the median norm.
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, uphill_from=uphill_from, work_scale=False))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    g, _ = _tilted(engine, 0.0)

    async def push(agent: _Agent, delta: torch.Tensor) -> tuple[str, float]:
        _, before = engine.state.snapshot()
        before = before.clone()
        reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=delta,
                                    model_version=engine.state.version)
        _, after = engine.state.snapshot()
        return reply.header.body.get("reason", "applied"), float((after - before).norm())

    async def go() -> tuple[tuple[str, float], tuple[str, float]]:
        await _history(engine, agents, 1e-3 * g)
        return await push(agents[0], -3e-3 * g), await push(agents[1], 3e-3 * g)

    (flip, flip_moved), (honest, honest_moved) = _run(go())
    assert flip == "applied" and honest == "applied" and not engine.screening.refusals
    assert abs(honest_moved - 3e-3) < 1e-5  # along the descent: folded whole
    if uphill_from:
        assert abs(flip_moved - 1e-3) < 1e-5  # folded at the median norm: one honest step undone, not three
        assert engine.screening.public()["downweighted"] == 1
    else:  # the rule before: under the gate nothing is judged
        assert abs(flip_moved - 3e-3) < 1e-5
        assert engine.screening.public()["downweighted"] == 0


def test_an_update_the_power_rule_folds_at_a_small_share_is_judged_at_that_share():
    # edp-sgd seed 1 (2026-11-27, the fast worker unclamped): the slowest worker, batch 4 beside 94, pushed
    # honest updates at 145-240x the median norm, folded at weight 0.03 of 4 (0.12 of a typical worker's),
    # the probe loss unchanged; the norm bound refused 4. Folded at 1/8 of a typical weight, it may be 8x larger.
    engine, clock = _engine_pushes(ScreeningSettings(min_history=3, work_scale=True))
    agents = [_Agent(engine, clock, n) for n in ("a", "b", "c")]
    small = _Agent(engine, clock, "small")
    g, _ = _tilted(engine, 0.0)
    shares = {small.rec.id: 0.125}
    engine.screening.fold_share = shares.get

    async def go() -> tuple[str, str]:
        await _history(engine, agents, 1e-3 * g)
        within = await small.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=40e-3 * g,
                                     model_version=engine.state.version)
        shares[small.rec.id] = 1.0  # a typical worker's weight: 40x is past the 32x bound
        past = await small.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=40e-3 * g,
                                   model_version=engine.state.version)
        return within.header.body.get("reason", "applied"), past.header.body.get("reason", "applied")

    within, past = _run(go())
    assert within == "applied", within
    assert "norm" in past and "32" in past, past
    assert engine.screening.refusals == {"norm": 1}


def test_the_engine_s_fold_share_is_a_worker_s_share_of_the_compute_powers():
    engine, clock = _engine_pushes(ScreeningSettings(), preset="edp-sgd")
    agents = [_Agent(engine, clock, n) for n in ("a", "b")]
    powers = {agents[0].rec.id: 300.0, agents[1].rec.id: 100.0}
    engine.policies.aggregation.power_of = powers.get
    assert engine._fold_share(agents[0].rec.id) == 2 * 300 / 400
    assert engine._fold_share(agents[1].rec.id) == 2 * 100 / 400
    asp, _ = _engine_pushes(ScreeningSettings())
    assert asp._fold_share(_Agent(asp, clock, "x").rec.id) is None  # not weighed by power


@pytest.mark.parametrize("stale_contain_from,staleness,margin,expected", [
    (1, 3, None, "applied"),    # stale, and a down-weight contains it: folded at the median norm
    (1, 0, None, "cosine"),     # the same update fresh: refused by direction
    (0, 3, None, "cosine"),     # the rule off: refused as before
    (1, 3, 0.0, "cosine"),      # stale, but even a median-norm fold raises the probe loss: refused
])
def test_a_stale_update_failing_the_direction_is_refused_only_when_a_down_weight_would_not_contain_it(
        stale_contain_from, staleness, margin, expected):
    # Issue 29's false refusals: an honest omnilearn-asp update at 9.71x, staleness 3, cosine -0.419 with the
    # descent at the *current* model was refused (seed 3, 2026-11-27). Its base was three versions back.
    settings = ScreeningSettings(min_history=3, work_scale=False, stale_contain_from=stale_contain_from)
    if margin is not None:
        settings = settings.model_copy(update={"effect_margin": margin, "effect_slack": 0.0})
    engine, agents, g = _three_along_the_descent(settings)

    async def go() -> str:
        await _history(engine, agents, g)
        reply = await agents[0].request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=-12 * g,
                                        model_version=engine.state.version - staleness)
        return reply.header.body.get("reason", "applied")

    _, before = engine.state.snapshot()
    before = before.clone()
    outcome = _run(go())
    assert expected in outcome, outcome
    if expected == "applied":
        _, after = engine.state.snapshot()
        # Six steps of +1e-3 and the flip against them at the median norm (1e-3): 5e-3 net.
        assert abs(float((after - before).norm()) - 5e-3) < 1e-4
        assert engine.screening.refusals == {} and engine.screening.public()["downweighted"] == 1
    else:
        assert engine.screening.refusals == {"direction": 1}
