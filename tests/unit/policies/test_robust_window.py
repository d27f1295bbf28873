"""Robust rules under asynchronous aggregation (issue 29): the staleness window of
common/policies/robust.py, by hand and on an in-process engine under asp and fedasync.

A poisoned minority inside the window is neutralised; an honest-only window gives nearly the
plain update; staleness dampens rows before the rule (Kardam's order), one row per worker.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from test_engine_inprocess import _Agent, _engine, _run

from hermes.common.clock import ManualClock
from hermes.common.policies.base import get
from hermes.common.policies.robust import RobustParams, StalenessWindow, window_dampened
from hermes.common.wire import MsgType

RULES = ["median", "trimmed-mean", "krum"]


def _window(rule: str, **params) -> StalenessWindow:
    cls = get("aggregation", rule)
    return StalenessWindow.of(cls(RobustParams(**params)), models=False)


def test_rows_are_dampened_by_staleness_before_the_rule():
    rows = torch.ones((3, 2))
    # FedBuff Alg. 1's s(tau) = 1/sqrt(1 + tau): tau 0, 3, 8 -> 1, 1/2, 1/3.
    assert window_dampened(rows, [0, 3, 8], "sqrt")[:, 0].tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    # Relative: min(1, s(tau_j) / s(tau_med)); the median staleness 3 counts fully, fresher rows are not raised.
    assert window_dampened(rows, [0, 3, 15], "relative")[:, 0].tolist() == pytest.approx([1.0, 1.0, 0.5])
    assert window_dampened(rows[:2], [1, 7], "relative")[:, 0].tolist() == pytest.approx([1.0, 0.5])  # lower middle
    # Equal staleness: nothing changes (honest windows give the plain step), unlike the absolute s.
    assert torch.equal(window_dampened(rows, [4, 4, 4], "relative"), rows)
    assert window_dampened(rows, [3, 3, 3], "sqrt")[:, 0].tolist() == pytest.approx([0.5] * 3)
    assert torch.equal(window_dampened(rows, [0, 9, 99], "none"), rows)


def test_one_row_per_worker_newest_first_and_too_stale_rows_leave():
    win = _window("median", window=3, window_age=5)
    for i, worker in enumerate(["a", "b", "a", "c", "d"]):
        win.add(worker, base_version=i, staleness=0, row=torch.full((2,), float(i)))
    # 'a' pushed twice: its newer update replaced its row; 'd' pushed the window past 3: 'b' (oldest) left.
    assert [r.worker_id for r in win.live(version=5)] == ["a", "c", "d"]
    assert [float(r.row[0]) for r in win.live(version=5)] == [2.0, 3.0, 4.0]
    # At version 8, 'a' (from version 2) is 6 versions old, past window_age 5.
    assert [r.worker_id for r in win.live(version=8)] == ["c", "d"]
    # The newest arrival always counts, however stale.
    assert [r.worker_id for r in win.live(version=100)] == ["d"]


@pytest.mark.parametrize("rule", RULES)
def test_with_fewer_rows_than_window_min_the_step_is_clipped_to_the_smallest_row(rule):
    g, rows = _honest(1)
    win = _window(rule, byzantine=0)
    win.add("honest", base_version=0, staleness=0, row=rows[0])
    alone, facts = win.step(version=0)
    assert torch.equal(alone, rows[0]) and "window_clipped" not in facts  # one worker: plain asp
    win.add("attacker", base_version=0, staleness=0, row=-30 * g)
    step, facts = win.step(version=0)
    # The median of two rows is their mean, 14.5x the honest step reversed; clipped, one honest step at most.
    assert step.norm() <= rows[0].norm() * (1 + 1e-6)
    assert rule == "krum" and "window_clipped" not in facts or facts["window_clipped"] < 0.1


def _honest(n: int, dim: int = 64, noise: float = 0.01, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(dim, generator=gen)
    return g, g + noise * torch.randn((n, dim), generator=gen)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("k", [3, 10, 30])
def test_a_poisoned_minority_inside_the_window_is_neutralised(rule, k):
    g, rows = _honest(5)
    win = _window(rule, byzantine=1)
    for i, row in enumerate(rows):
        win.add(f"honest-{i}", base_version=10, staleness=3, row=row)
    # Issue 29's sign flip: the reverse of the honest step at k times its norm, arriving last (and fresh).
    win.add("attacker", base_version=10, staleness=0, row=-k * g)
    step, facts = win.step(version=10)
    assert facts["window"][-1] == "attacker" and facts["combined"] == rule
    # The mean would be (5 g - k g) / 6: reversed for k > 5. The robust step stays the honest one.
    mean = torch.cat([rows, -k * g[None]]).mean(dim=0)
    assert torch.nn.functional.cosine_similarity(step, g, dim=0) > 0.99
    assert (step - g).norm() < 0.05 * g.norm() < (mean - g).norm()


@pytest.mark.parametrize("rule", RULES)
def test_an_honest_window_gives_nearly_the_plain_update(rule):
    g, rows = _honest(4)
    win = _window(rule)
    for i, row in enumerate(rows):
        win.add(f"w{i}", base_version=i, staleness=i, row=row)  # arrived 0..3 versions stale
    step, facts = win.step(version=7)
    assert facts["window_staleness"] == [0, 1, 2, 3]
    # Relative dampening of the rows staler than the median pulls the statistic in a little; the direction holds.
    assert torch.nn.functional.cosine_similarity(step, g, dim=0) > 0.99
    assert 0.7 * g.norm() < step.norm() <= 1.05 * g.norm()
    # Rows that arrived equally stale (asp's honest workers at one speed): the plain update (their mean)
    # within the noise, however long they have been in the window.
    same = _window(rule)
    for i, row in enumerate(rows):
        same.add(f"w{i}", base_version=i, staleness=3, row=row)
    plain, _ = same.step(version=7)
    assert (plain - rows.mean(dim=0)).norm() < 0.03 * g.norm()


def _asp_pushes(engine, agents, values) -> list[float]:
    """Pushes of constant deltas (agent index, value) in order; the model's mean change after each."""
    _, before = engine.state.snapshot()
    moved: list[float] = []

    async def go():
        for i, value in values:
            version = engine.state.version
            reply = await agents[i].request(MsgType.PUSH_UPDATE, {"samples": 4}, payload=agents[i].delta(value),
                                            model_version=version)
            assert reply.header.body["status"] == "applied", reply.header.body
            moved.append(float((engine.state.snapshot()[1] - before).mean()))

    _run(asyncio.wait_for(go(), 30))
    return moved


@pytest.mark.parametrize("rule", RULES)
def test_asp_with_a_robust_rule_folds_the_windows_statistic_at_each_arrival(rule):
    clock = ManualClock()
    engine = _engine(clock, preset="asp", aggregation=rule, **{"robust.byzantine": 0})
    assert engine.policies.aggregation.window is not None
    agents = [_Agent(engine, clock, f"w{i}") for i in range(4)]
    # Three honest workers push 0.1 each (every push is fresh: base = current version), then the attacker -30.
    moved = _asp_pushes(engine, agents, [(0, 0.1), (1, 0.1), (2, 0.1), (3, -30.0), (0, 0.1)])
    # Plain asp would be at 0.3 - 30 after the fourth push; the window's statistic is an honest 0.1 each time.
    assert moved == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5], abs=1e-5)


def test_asp_plain_mean_is_steered_by_the_same_push():
    # The control: without a robust rule the same sequence reverses the model (the test above can fail).
    clock = ManualClock()
    engine = _engine(clock, preset="asp")
    assert engine.policies.aggregation.window is None
    agents = [_Agent(engine, clock, f"w{i}") for i in range(4)]
    moved = _asp_pushes(engine, agents, [(0, 0.1), (1, 0.1), (2, 0.1), (3, -30.0)])
    assert moved[-1] == pytest.approx(0.3 - 30.0, abs=1e-4)


def test_asp_window_rows_are_dampened_by_their_staleness():
    clock = ManualClock()
    # window_min 1: two rows, not clipped to the smaller (the clip has its own test).
    engine = _engine(clock, preset="asp", aggregation="median",
                     **{"robust.window_staleness": "sqrt", "robust.window_min": 1})
    agents = [_Agent(engine, clock, f"w{i}") for i in range(2)]
    _, before = engine.state.snapshot()

    async def go():
        # Both computed from version 0: the first arrives fresh (s = 1) and is the step; the second arrives
        # 1 version stale (FedBuff's s = 1/sqrt(2)): the median of 0.2 and 0.4/sqrt(2).
        for agent, value in ((agents[0], 0.2), (agents[1], 0.4)):
            await agent.request(MsgType.PUSH_UPDATE, {"samples": 4}, payload=agent.delta(value), model_version=0)

    _run(go())
    moved = float((engine.state.snapshot()[1] - before).mean())
    assert moved == pytest.approx(0.2 + (0.2 + 0.4 / math.sqrt(2)) / 2, abs=1e-5)


def test_fedasync_mixes_in_the_median_of_the_workers_models():
    clock = ManualClock()
    engine = _engine(clock, preset="fedasync", **{"fedasync.robust": "median", "fedasync.alpha": 0.5,
                                                  "fedasync.staleness": "constant"})
    rule = engine.policies.aggregation
    assert rule.window is not None and rule.op == "blend" and rule.window.dampening == "none"
    agents = [_Agent(engine, clock, f"w{i}") for i in range(4)]
    _, w0 = engine.state.snapshot()

    async def go():
        # From-baseline pushes: G = the worker's model - w0. Three honest models at w0 + 1, then w0 - 1000.
        for agent, value in ((agents[0], 1.0), (agents[1], 1.0), (agents[2], 1.0), (agents[3], -1000.0)):
            version = engine.state.version
            await agent.request(MsgType.PUSH_UPDATE, {"samples": 4}, payload=agent.delta(value),
                                model_version=version)

    _run(go())
    # x <- (1 - a) x + a (w0 + median G) with a = 0.5 (FedAsync Alg. 1, s = 1): G* = 1 every time, so
    # x - w0 = 1 - 0.5^4 = 0.9375. Plain FedAsync would mix in w0 - 1000 at 0.5: about -500.
    moved = engine.state.snapshot()[1] - w0
    assert torch.allclose(moved, torch.full_like(moved, 1 - 0.5 ** 4), atol=1e-5), moved[:3]
