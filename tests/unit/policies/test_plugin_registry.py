"""hermes.register_policy: a user's rule joins the one registry, is chosen by name in the run config."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import hermes
from hermes.common.config import RunConfig
from hermes.common.policies import base
from hermes.common.policies.aggregation import AggregationRule, Mean, Step, Update, Weighing


@pytest.fixture
def cleanup() -> Iterator[list[str]]:
    added: list[str] = []
    yield added
    for name in added:
        base._REGISTRY["aggregation"].pop(name, None)
        base._PLUGINS["aggregation"].discard(name)


class Halves(AggregationRule):
    def weigh(self, updates: list[Update], step: Step, stack: object = None) -> Weighing:  # type: ignore[override]
        return Weighing([0.5] * len(updates))


def test_a_registered_rule_is_chosen_by_name_and_built(cleanup: list[str]) -> None:
    hermes.register_policy("aggregation", "halves-test", Halves)
    cleanup.append("halves-test")
    config = RunConfig(aggregation="halves-test")
    rule = config.build_policy("aggregation")
    # The default build() answers the class itself (rules without state).
    assert rule is Halves and Halves().weigh([Update(samples=3)], Step(version=1)).weights == [0.5]


def test_the_decorator_form_and_registering_again_replaces(cleanup: list[str]) -> None:
    @hermes.register_policy("aggregation", "halves-test2")
    class First(Halves):
        pass

    cleanup.append("halves-test2")

    @hermes.register_policy("aggregation", "halves-test2")
    class Second(Halves):  # a notebook cell run again
        pass

    assert base.get("aggregation", "halves-test2") is Second


def test_a_built_in_name_or_a_non_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="aggregation policy 'mean' registered twice"):
        hermes.register_policy("aggregation", "mean", Halves)
    assert base.get("aggregation", "mean") is Mean
    with pytest.raises(TypeError, match="not a subclass of hermes Policy"):
        hermes.register_policy("aggregation", "plain-test", object)
    with pytest.raises(ValueError, match="unknown policy kind 'compressor'"):
        hermes.register_policy("compressor", "x", Halves)


def test_an_unknown_name_in_the_config_lists_the_plugins_too(cleanup: list[str]) -> None:
    hermes.register_policy("aggregation", "halves-test3", Halves)
    cleanup.append("halves-test3")
    with pytest.raises(ValueError, match="halves-test3"):
        RunConfig(aggregation="nope")


def test_fedadam_example_follows_reddi_alg2() -> None:
    """Two rounds by hand: m, v and the step of Reddi et al. 2021, Alg. 2 lines 9-12."""
    from examples.fedadam import FedAdam

    rule = FedAdam()
    d1 = torch.tensor([[2.0, -1.0], [0.0, -1.0]])  # mean (1, -1)
    d2 = torch.tensor([[0.0, 0.0], [0.0, 4.0]])  # mean (0, 2)
    step1, step2 = rule.combine(d1), rule.combine(d2)
    m1 = 0.1 * torch.tensor([1.0, -1.0])
    v1 = 0.01 * torch.tensor([1.0, 1.0])
    assert torch.allclose(step1, 0.01 * m1 / (v1.sqrt() + 1e-3))
    m2 = 0.9 * m1 + 0.1 * torch.tensor([0.0, 2.0])
    v2 = 0.99 * v1 + 0.01 * torch.tensor([0.0, 4.0])
    assert torch.allclose(step2, 0.01 * m2 / (v2.sqrt() + 1e-3))
    assert FedAdam.eta == 0.01 and (FedAdam.beta1, FedAdam.beta2, FedAdam.tau) == (0.9, 0.99, 1e-3)
