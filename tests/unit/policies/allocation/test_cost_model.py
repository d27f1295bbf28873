"""Hermes' cost model K(MBS) (Sec. IV-A, Eq. 3): worked numbers, the linear fit and the paper's constant K."""

from __future__ import annotations

import math

import pytest

from hermes.common.policies.allocation.cost_model import CostModel, constant_k_model, fit_cost_model

# HL8 (OmniLearn Table I, BSP cores 6, 6, 4, 32): a worker with c cores is 32/c times slower.
HL8 = [1.0, 5.33, 5.33, 8.0]


def test_cost_model_eq3_numbers():
    m = CostModel(a=0.01, b=0.001)
    assert m.per_batch(32) == pytest.approx(0.042)  # 0.01 + 0.001 * 32
    assert m.cycle_seconds(256, 32) == pytest.approx(8 * 0.042)  # 256 / 32 = 8 batches
    assert m.cycle_seconds(100, 32) == pytest.approx(4 * 0.042)  # ceil(100 / 32) = 4: a short batch is a step
    assert CostModel(a=0.05, b=0.0).cycle_seconds(640, 64) == pytest.approx(0.5)  # the paper's K * DSS / MBS


@pytest.mark.parametrize("kwargs, field", [({"a": -1.0, "b": 0.0}, "a"), ({"a": 0.0, "b": math.nan}, "b")])
def test_cost_model_validation(kwargs: dict, field: str):
    with pytest.raises(ValueError, match=field):
        CostModel(**kwargs)


def test_cost_model_rejects_bad_sizes():
    with pytest.raises(ValueError, match="batch_size"):
        CostModel(0.1, 0.1).per_batch(0)
    with pytest.raises(ValueError, match="dss"):
        CostModel(0.1, 0.1).cycle_seconds(0, 8)


def true_obs(model: CostModel, pairs: list[tuple[int, int]]) -> list[tuple[int, int, float]]:
    return [(batch_size, dss, model.cycle_seconds(dss, batch_size)) for dss, batch_size in pairs]


def test_fit_recovers_a_and_b_from_three_mbs():
    truth = CostModel(a=0.01, b=0.002)
    obs = true_obs(truth, [(256, 16), (100, 16), (256, 32), (300, 32), (512, 64)])  # includes partial batches
    fitted = fit_cost_model(obs)
    assert fitted.a == pytest.approx(0.01, rel=1e-9)
    assert fitted.b == pytest.approx(0.002, rel=1e-9)


def test_fit_with_one_mbs_assumes_cost_per_sample():
    # per-batch times 0.05 and 0.07 at MBS 32 -> a = 0, b = mean(0.05, 0.07) / 32 = 0.001875
    fitted = fit_cost_model([(32, 256, 8 * 0.05), (32, 128, 4 * 0.07)])
    assert (fitted.a, fitted.b) == (0.0, pytest.approx(0.06 / 32))


def test_fit_clamps_negative_intercept():
    # y = -0.01 + 0.001 * MBS at MBS 32, 64 -> y = 0.022, 0.054; LSQ a = -0.01 < 0
    # refit through the origin: b = (32 * 0.022 + 64 * 0.054) / (32^2 + 64^2) = 4.16 / 5120 = 0.0008125
    fitted = fit_cost_model([(32, 32, 0.022), (64, 64, 0.054)])
    assert fitted.a == 0.0
    assert fitted.b == pytest.approx(0.0008125)


def test_fit_clamps_negative_slope():
    # per-batch y = 0.05 at MBS 32 and 0.04 at MBS 64: b < 0 -> b = 0, a = mean = 0.045
    fitted = fit_cost_model([(32, 32, 0.05), (64, 64, 0.04)])
    assert (fitted.a, fitted.b) == (pytest.approx(0.045), 0.0)


def test_fit_uses_only_recent_history():
    slow, fast = CostModel(1.0, 0.1), CostModel(0.01, 0.002)
    old = true_obs(slow, [(256, 16), (256, 64)] * 3)
    recent = true_obs(fast, [(256, 16), (256, 32), (256, 64)] * 4)  # 12 observations
    fitted = fit_cost_model(old + recent, max_history=12)
    assert (fitted.a, fitted.b) == pytest.approx((0.01, 0.002))
    assert fit_cost_model(old + recent, max_history=20).b > 0.01  # the old ones pull it away


def test_constant_k_is_the_papers_model():
    # per-batch 0.1 (8 batches in 0.8 s) and 0.3 (2 batches in 0.6 s) -> K = 0.2, b = 0
    k = constant_k_model([(32, 256, 0.8), (64, 128, 0.6)])
    assert (k.a, k.b) == (pytest.approx(0.2), 0.0)


@pytest.mark.parametrize(
    "obs, field",
    [
        ([], "observations"),
        ([(0, 10, 1.0)], "batch_size"),
        ([(8, 0, 1.0)], "dss"),
        ([(8, 10, -1.0)], "seconds"),
        ([(8, 10, math.inf)], "seconds"),
    ],
)
def test_fit_rejects_bad_observations(obs: list, field: str):
    with pytest.raises(ValueError, match=field):
        fit_cost_model(obs)


