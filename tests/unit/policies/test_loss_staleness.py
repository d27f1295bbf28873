"""loss.staleness: a since-pull delta's Eq. 5-6 share scaled by FedAsync's staleness function (Sec. 5.2)."""

from __future__ import annotations

import pytest

from hermes.common.config import ConfigError, build_config
from hermes.common.policies.aggregation import LossParams, LossWeighted, Step, Update, loss_blend_weight


def _weight(tau: int, /, **params: object) -> float:
    rule = LossWeighted(LossParams(reference="pull", **params))  # type: ignore[arg-type]
    return rule.weigh([Update(128, tau, candidate_loss=0.5)], Step(version=200, global_loss=0.5)).weights[0]


def test_constant_is_hermes_share_at_any_staleness():
    assert _weight(0) == _weight(90) == pytest.approx(loss_blend_weight(0.5, 0.5))  # Eq. 6: 0.5


@pytest.mark.parametrize(("staleness", "scale"), [
    (0, 1.0), (4, 1.0),  # up to b = 4 versions stale: the whole share
    (5, 5 / 6), (9, 0.5), (99, 0.05),  # past b: (b + 1) / (tau + 1) with a = 1 / (b + 1)
])
def test_hinge_with_a_one_over_b_plus_one_is_b_plus_one_over_tau_plus_one(staleness: int, scale: float):
    got = _weight(staleness, staleness="hinge", staleness_a=0.2, staleness_b=4)
    assert got == pytest.approx(0.5 * scale)


def test_the_papers_hinge_numbers_hold_in_the_loss_rule():
    # FedAsync Sec. 6: hinge a = 10, b = 4: s(5) = 1/11, s(6) = 1/21.
    assert _weight(5, staleness="hinge", staleness_a=10, staleness_b=4) == pytest.approx(0.5 / 11)
    assert _weight(6, staleness="hinge", staleness_a=10, staleness_b=4) == pytest.approx(0.5 / 21)
    # polynomial a = 0.5: s(3) = 0.5
    assert _weight(3, staleness="polynomial", staleness_a=0.5) == pytest.approx(0.25)


@pytest.mark.parametrize("concurrent", [5, 10, 100, 1000])
def test_a_round_of_c_pushes_moves_the_model_about_b_plus_one_shares_whatever_c(concurrent: int):
    # C workers at once: each delta about C - 1 versions stale; their weights sum to ~ (b + 1) shares.
    total = concurrent * _weight(concurrent - 1, staleness="hinge", staleness_a=0.2, staleness_b=4)
    assert total == pytest.approx(0.5 * 5)
    undamped = concurrent * _weight(concurrent - 1)
    assert undamped == pytest.approx(0.5 * concurrent)  # what diverged at C = 100


def test_the_first_push_is_the_model_whole():
    rule = LossWeighted(LossParams(reference="pull", staleness="hinge", staleness_a=0.2, staleness_b=4))
    assert rule.weigh([Update(128, 50, candidate_loss=0.5)], Step(version=0)).weights == [1.0]


def test_the_fact_is_logged_only_when_damping():
    rule = LossWeighted(LossParams(reference="pull", staleness="hinge", staleness_a=0.2, staleness_b=4))
    w = rule.weigh([Update(128, 9, candidate_loss=0.5)], Step(version=20, global_loss=0.5))
    assert w.facts["staleness_scale"] == 0.5 and w.share == pytest.approx(0.5)
    plain = LossWeighted(LossParams(reference="pull"))
    assert "staleness_scale" not in plain.weigh([Update(128, 9, candidate_loss=0.5)],
                                                Step(version=20, global_loss=0.5)).facts


def test_staleness_needs_the_pull_reference():
    with pytest.raises(ConfigError, match="loss.staleness"):
        build_config(preset="hermes-paper", **{"loss.staleness": "hinge"})
    with pytest.raises(ConfigError):
        build_config(preset="hermes", **{"loss.staleness": "linear"})


# loss.concurrency_scale: the share times min(1, m / n), n the workers training at once.


def _crowd(n: int, tau: int = 0, m: int = 5) -> float:
    rule = LossWeighted(LossParams(reference="pull", concurrency_scale=m))
    return rule.weigh([Update(128, tau, candidate_loss=0.5)], Step(version=200, global_loss=0.5, training=n)).weights[0]


@pytest.mark.parametrize(("n", "scale"), [(1, 1.0), (4, 1.0), (5, 1.0), (10, 0.5), (100, 0.05), (1000, 0.005)])
def test_concurrency_scale_is_m_over_n_past_m(n: int, scale: float):
    assert _crowd(n) == pytest.approx(0.5 * scale)


@pytest.mark.parametrize("n", [100, 1000])
def test_a_first_round_of_n_pushes_from_one_model_adds_m_shares_unlike_a_staleness_rule(n: int):
    # n devices start together: their deltas arrive 0..n-1 versions stale while n train at once.
    crowd = sum(_crowd(n, tau) for tau in range(n))
    assert crowd == pytest.approx(0.5 * 5)
    hinge = sum(_weight(tau, staleness="hinge", staleness_a=0.2, staleness_b=4) for tau in range(n))
    assert hinge > 1.9 * crowd  # the harmonic sum (b+1)(1 + ln(n/(b+1))): 1,000 devices' first round overshot


def test_concurrency_scale_is_off_without_a_count_and_needs_the_pull_reference():
    rule = LossWeighted(LossParams(reference="pull", concurrency_scale=5))
    assert rule.needs_training_count
    assert not LossWeighted(LossParams(reference="pull")).needs_training_count
    assert rule.weigh([Update(128, 0, candidate_loss=0.5)], Step(version=3, global_loss=0.5)).weights == [0.5]
    with pytest.raises(ConfigError, match="loss.concurrency_scale"):
        build_config(preset="hermes-paper", **{"loss.concurrency_scale": 5})
    assert build_config(preset="hermes").loss.concurrency_scale == 5
