"""The registry as the one table of policy names: aliases accepted and normalised, unknown names refused."""

from __future__ import annotations

import pytest

from hermes.common.config import ConfigError, build_config
from hermes.common.policies import base as registry


def test_an_alias_the_registry_accepts_builds_and_is_stored_as_the_canonical_name():
    cfg = build_config("asp", gate="hermes-gup")
    assert cfg.gate == "zscore"
    assert cfg.build_policy("gate").config == cfg.zscore


@pytest.mark.parametrize("kind,alias,name", [
    ("aggregation", "loss-weighted", "loss"),
    ("lr_scaling", "fixed", "none"),
    ("allocation", "task-allocation", "adaptive"),
    ("allocation", "dynamic-partitioning", "partition"),
])
def test_every_kind_takes_the_registrys_aliases(kind, alias, name):
    preset = {"aggregation": "hermes-paper", "allocation": "bsp", "lr_scaling": "asp"}[kind]
    assert registry.canonical(kind, alias) == name
    assert build_config(preset, **{kind: alias}).get(kind) == name


@pytest.mark.parametrize("kind", ["gate", "aggregation", "lr_scaling", "topology", "allocation"])
def test_an_unknown_name_is_one_line_that_lists_the_known_names(kind):
    with pytest.raises(ConfigError) as err:
        build_config("asp", **{kind: "nope"})
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{kind}: ") and f"unknown {kind} 'nope'; known: " in text
    for name in registry.names(kind, aliases=True):
        assert name in text


def test_a_policy_is_built_from_the_core_and_its_own_sections_without_a_run_config():
    from hermes.common.policies.allocation._common import BatchBounds, RebalanceParams
    from hermes.common.policies.allocation.pcontrol import PControlAllocator, PControlParams

    core = registry.Core(lr=0.1, batch_size=32, cycle_samples=128, shard_size=64, seed=0, sync="bsp", barrier=True)
    sections = {"pcontrol": PControlParams(), "batch_bounds": BatchBounds(), "rebalance": RebalanceParams()}
    alloc = registry.build("allocation", "pcontrol", core, sections, epoch_samples=1000)
    assert isinstance(alloc, PControlAllocator) and alloc.fixed_global and alloc.sizes.steps == 4
