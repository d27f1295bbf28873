"""Robust aggregation (common/policies/robust.py): the rules' numbers by hand, where the config
accepts them, and a BSP step on an in-process engine that one poisoned update
cannot steer."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_engine_inprocess import _Agent, _engine, _run

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.policies.robust import coordinate_median, krum_scores, krum_select, trimmed_mean
from hermes.common.wire import MsgType


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_coordinate_median_takes_each_coordinates_middle_value():
    # Yin et al. 2018, Def. 1: per coordinate, not per update (no row of the input is the answer).
    assert torch.equal(coordinate_median(_rows([1, 10], [2, 20], [100, -5])), torch.tensor([2.0, 10.0]))
    # An even count: the mean of the two middle values.
    assert torch.equal(coordinate_median(_rows([1], [2], [3], [100])), torch.tensor([2.5]))


def test_trimmed_mean_drops_beta_k_values_at_each_end():
    four = _rows([1, -9], [2, 0], [3, 1], [100, 2])
    # beta 0.25 of 4: one value off each end of each coordinate (Def. 2).
    assert torch.equal(trimmed_mean(four, 0.25), torch.tensor([2.5, 0.5]))
    assert torch.allclose(trimmed_mean(four, 0.0), four.mean(dim=0))  # nothing trimmed: the mean
    assert torch.allclose(trimmed_mean(four, 0.2), four.mean(dim=0))  # floor(0.2 * 4) = 0
    with pytest.raises(ValueError, match="drops all"):
        trimmed_mean(_rows([1], [2]), 0.5)


def test_krum_scores_sum_the_closest_k_minus_f_minus_2_squared_distances():
    # 1-D updates 0, 1, 2, 10 with f = 1: each score is the squared distance to its one closest other.
    scores = krum_scores(_rows([0], [1], [2], [10]), byzantine=1)
    assert scores == pytest.approx([1.0, 1.0, 1.0, 64.0])
    assert krum_select(scores, 1) == [0]  # Krum: the lowest score, ties to the earlier update
    assert krum_select(scores, 3) == [0, 1, 2]  # Multi-Krum m = 3: the outlier is never kept
    # f = 0 with 5 updates: the 3 closest others.
    five = krum_scores(_rows([0], [1], [2], [3], [50]), byzantine=0)
    assert five == pytest.approx([1 + 4 + 9, 1 + 1 + 4, 1 + 1 + 4, 1 + 4 + 9, 47**2 + 48**2 + 49**2])


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum"])
def test_robust_rules_run_under_a_barrier_a_buffer_or_a_staleness_window(rule):
    assert build_config("bsp", aggregation=rule).aggregation == rule
    assert build_config("ebsp", aggregation=rule).aggregation == rule
    # And over FedBuff's buffer, and over a staleness window where updates fold one at a time (issue 29;
    # tests/unit/policies/test_robust_window.py).
    assert build_config("fedbuff", aggregation=rule).aggregation == rule
    assert build_config("asp", aggregation=rule).aggregation == rule
    assert build_config("ssp", aggregation=rule).aggregation == rule
    assert build_config("fedasync", **{"fedasync.robust": rule}).fedasync.robust == rule


def _barrier_step(rule: str, values: list[float], **overrides) -> torch.Tensor:
    """One BSP step of the engine from one push per agent (constant deltas): the model's change."""
    clock = ManualClock()
    engine = _engine(clock, preset="bsp", aggregation=rule, **overrides)
    agents = [_Agent(engine, clock, f"w{i}") for i in range(len(values))]
    _, before = engine.state.snapshot()

    async def go():
        pushes = [asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=a.delta(v)))
                  for a, v in zip(agents, values)]
        return await asyncio.wait_for(asyncio.gather(*pushes), 10)

    replies = _run(go())
    assert all(r.header.body["status"] == "applied" for r in replies)
    assert engine.state.version == 1
    return engine.state.snapshot()[1] - before


# Krum with f = 0 scores each update by its K - 2 = 2 closest others: 0.2's (0.01 + 0.04 per
# parameter) is uniquely the lowest (with one neighbour the closest pair would tie).
STEP = [0.1, 0.2, 0.4, 50.0]


@pytest.mark.parametrize(("rule", "overrides", "expected"), [
    ("mean", {}, sum(STEP) / 4),  # the poisoned update moves the mean step 40x
    ("median", {}, (0.2 + 0.4) / 2),
    ("trimmed-mean", {}, (0.2 + 0.4) / 2),
    ("krum", {"robust.byzantine": 0}, 0.2),
    ("krum", {"robust.byzantine": 0, "robust.keep": 3}, (0.1 + 0.2 + 0.4) / 3),  # Multi-Krum
])
def test_one_poisoned_update_cannot_steer_a_robust_barrier_step(rule, overrides, expected):
    step = _barrier_step(rule, STEP, **overrides)
    assert torch.allclose(step, torch.full_like(step, expected), atol=1e-5), (rule, step[:3])
