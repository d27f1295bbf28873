"""Aggregation weights: exact numbers and refusals."""

from __future__ import annotations

import pytest

from hermes.common.policies.aggregation import (
    aggregation_weights,
    batch_scaled_lr,
    mean_weights,
    power_weights,
    sample_weights,
)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_mean_weights(k):
    w = mean_weights(k)
    assert w == [1.0 / k] * k
    assert sum(w) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("k", [0, -1])
def test_mean_weights_refuses_empty(k):
    with pytest.raises(ValueError):
        mean_weights(k)


@pytest.mark.parametrize(
    "samples,expected",
    [
        ([32, 64, 32], [0.25, 0.5, 0.25]),
        ([10], [1.0]),
        ([1, 3], [0.25, 0.75]),
        ([0, 8], [0.0, 1.0]),
        ([16, 16, 16, 16], [0.25, 0.25, 0.25, 0.25]),
        ([128, 32, 64, 32, 0], [0.5, 0.125, 0.25, 0.125, 0.0]),
    ],
)
def test_sample_weights_exact(samples, expected):
    assert sample_weights(samples) == expected  # exact: these are dyadic fractions
    assert aggregation_weights("samples", samples) == expected


def test_sample_weights_sum_to_one():
    w = sample_weights([3, 7, 11, 13])
    assert w == pytest.approx([3 / 34, 7 / 34, 11 / 34, 13 / 34])
    assert sum(w) == pytest.approx(1.0, abs=1e-12)


def test_sample_weights_accept_tuples():
    assert sample_weights((1, 1)) == [0.5, 0.5]


@pytest.mark.parametrize("samples", [[], [0], [0, 0], [-1, 5], [4, -4, 8]])
def test_sample_weights_refuse(samples):
    with pytest.raises(ValueError, match="sample counts"):
        sample_weights(samples)


def test_aggregation_weights_mean_ignores_samples():
    assert aggregation_weights("mean", [1, 1000]) == [0.5, 0.5]
    assert aggregation_weights("mean", [0]) == [1.0]


def test_aggregation_weights_unknown_rule():
    with pytest.raises(ValueError, match="unknown aggregation rule 'median'"):
        aggregation_weights("median", [1, 2])


def test_power_weights_and_batch_scaled_lr():
    assert power_weights([1.0, 3.0]) == [0.25, 0.75]  # EDP-SGD: CP_m / sum(CP)
    with pytest.raises(ValueError):
        power_weights([1.0, 0.0])
    # OmniLearn Eq. 5b at HL8 static batches (16, 16, 11, 85), eta = 0.1, B = 128.
    assert batch_scaled_lr(0.1, 85, 128) == pytest.approx(0.1 * 85 / 128)
    assert batch_scaled_lr(0.1, 32, 128) == pytest.approx(0.025)  # uniform: eta / K
