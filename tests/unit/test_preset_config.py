"""Paper presets, the policy combinations the config refuses (and why), and the
learning-rate / aggregation numbers the presets rely on."""

from __future__ import annotations

import math
import re

import pytest

from hermes.common.config import (
    POLICY_FIELDS,
    PRESET_SOURCES,
    PRESETS,
    ConfigError,
    RunConfig,
    build_config,
    preset_policies,
)
from hermes.common.config_keys import ALIASES
from hermes.common.policies.aggregation import batch_scaled_lr, power_weights
from hermes.common.policies.allocation.pcontrol import PControlAllocator


def fixed_global(cfg: RunConfig) -> bool:
    """Whether pcontrol would hold the global batch fixed (OmniLearn Eq. 8) in this run."""
    return PControlAllocator.fixed_global_batch(cfg.core, cfg.pcontrol)

# ---------------------------------------------------------------------------
# presets


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_with_a_source_and_an_allocator(name):
    cfg = build_config(name)
    assert cfg.preset == name
    assert PRESET_SOURCES[name]
    policies = preset_policies(name)
    assert tuple(policies) == POLICY_FIELDS
    assert policies == {f: getattr(cfg, f) for f in POLICY_FIELDS}
    # The run can be started from it: its allocation policy builds.
    alloc = cfg.build_policy("allocation", dss_max=4096, epoch_samples=1024)
    assert alloc.workload("nobody").dss >= 1


@pytest.mark.parametrize("name,sync,allocation,aggregation,lr_scaling", [
    # OmniLearn BSP: Eq. 6-8 control, gradients weighted lambda_k = b_k / sum(b) (Eq. 4b).
    ("omnilearn-bsp", "bsp", "pcontrol", "samples", "none"),
    # OmniLearn ASP (Alg. 2): no gradient weighting, eta_k = eta * b_k / sum(b) (Eq. 5b).
    ("omnilearn-asp", "asp", "pcontrol", "mean", "batch-scaled"),
    # ACSOS dynamic batching: BSP, weighted by batch (Eq. 2-3).
    ("dynamic-batching", "bsp", "pcontrol", "samples", "none"),
    # Chao et al.: accumulation counts, weighted by each worker's share of the step's samples.
    ("task-allocation", "bsp", "adaptive", "samples", "none"),
    # DP-SGD Alg. 1: partitions by compute power, plain averaging.
    ("dp-sgd", "bsp", "partition", "mean", "none"),
    # EDP-SGD (Sec. 4.2): gradients weighted by normalised compute power.
    ("edp-sgd", "bsp", "partition", "power", "none"),
    # OmniLearn variable batching (Sec. III-A): static split by cores.
    ("variable-batching", "bsp", "static", "samples", "none"),
])
def test_paper_preset_policies(name, sync, allocation, aggregation, lr_scaling):
    p = preset_policies(name)
    assert (p["sync"], p["allocation"], p["aggregation"], p["lr_scaling"]) == (sync, allocation, aggregation, lr_scaling)
    assert p["gate"] == "always"  # only Hermes gates pushes


def test_paper_preset_parameters():
    # OmniLearn Fig. 11: batch bounds (4, 96), dead-band 10%; control once per epoch (Sec. III-B1).
    for name in ("omnilearn-bsp", "omnilearn-asp"):
        cfg = build_config(name)
        assert (cfg.batch_bounds.b_min, cfg.batch_bounds.b_max, cfg.pcontrol.deadband, cfg.pcontrol.interval) == (4, 96, 0.1, "epoch")
    # ACSOS: adjusted at any iteration.
    assert build_config("dynamic-batching").pcontrol.interval == "round"
    # DP-SGD Sec. 4.1 default: the previous epoch's compute power.
    assert build_config("dp-sgd").partition.window == 1


@pytest.mark.parametrize("name,fixed", [
    ("omnilearn-bsp", True), ("dynamic-batching", True), ("omnilearn-asp", False),
    ("bsp", True), ("ebsp", True), ("asp", False), ("ssp", False), ("hermes", False),
])
def test_fixed_global_batch_follows_the_barrier(name, fixed):
    # OmniLearn Eq. 8 fixes sum(b) = K*b for a synchronous step (BSP, EBSP barriers) only.
    assert fixed_global(build_config(name)) is fixed


def test_global_batch_override():
    assert fixed_global(build_config("dynamic-batching", global_batch="free")) is False
    assert fixed_global(build_config("omnilearn-bsp", global_batch="fixed")) is True
    assert fixed_global(build_config("omnilearn-asp", global_batch="free")) is False
    assert fixed_global(build_config("ebsp", allocation="pcontrol", global_batch="fixed")) is True


# ---------------------------------------------------------------------------
# refusals: each names the reason


@pytest.mark.parametrize("preset,overrides,reason", [
    # Adaptive / partition split one synchronous round's work: every worker pushes once per round.
    ("asp", {"allocation": "adaptive"}, "allocation 'adaptive' splits one synchronous round's work"),
    ("ssp", {"allocation": "adaptive"}, "it needs sync 'bsp', not 'ssp'"),
    ("hermes", {"allocation": "adaptive", "gate": "always"}, "it needs sync 'bsp', not 'hermes'"),
    ("ebsp", {"allocation": "adaptive"}, "it needs sync 'bsp', not 'ebsp'"),
    ("asp", {"allocation": "partition"}, "allocation 'partition' splits one synchronous round's work"),
    ("ssp", {"allocation": "partition"}, "it needs sync 'bsp', not 'ssp'"),
    ("hermes", {"allocation": "partition", "gate": "always"}, "it needs sync 'bsp', not 'hermes'"),
    ("ebsp", {"allocation": "partition"}, "it needs sync 'bsp', not 'ebsp'"),
    ("dp-sgd", {"sync": "ebsp"}, "not 'ebsp'"),
    # OmniLearn Eq. 8 needs a synchronous step.
    ("omnilearn-asp", {"global_batch": "fixed"}, "'asp' pushes asynchronously, so there is no global batch to fix"),
    ("ssp", {"allocation": "pcontrol", "global_batch": "fixed"}, "'ssp' pushes asynchronously"),
    # global_batch only means something to the proportional controller.
    ("bsp", {"global_batch": "fixed"}, "global_batch applies to allocation 'pcontrol' only, not 'uniform'"),
    ("variable-batching", {"global_batch": "fixed"}, "global_batch applies to allocation 'pcontrol' only, not 'static'"),
    ("dp-sgd", {"global_batch": "free"}, "not 'partition'"),
    # Eq. 5b under a barrier would count the batch twice (Eq. 4b already weighs it).
    ("bsp", {"lr_scaling": "batch-scaled"}, "would count the batch twice"),
    ("omnilearn-bsp", {"lr_scaling": "batch-scaled"}, "lr_scaling 'batch-scaled' (OmniLearn Eq. 5b) is for asynchronous pushes"),
    ("ebsp", {"lr_scaling": "batch-scaled"}, "under 'ebsp'"),
    # EDP-SGD weights are relative within one synchronous step.
    ("asp", {"aggregation": "power"}, "aggregation 'power' weighs the updates of one synchronous step"),
    ("omnilearn-asp", {"aggregation": "power"}, "every weight would be 1"),
    # Per-step batch bounds.
    ("omnilearn-bsp", {"batch_size": 128}, "batch_size=128 outside [b_min, b_max]=[4, 96]"),
    ("dynamic-batching", {"b_min": 40}, "batch_size=32 outside [b_min, b_max]=[40, 96]"),
    ("omnilearn-bsp", {"b_max": 16}, "batch_size=32 outside [b_min, b_max]=[4, 16]"),
    ("variable-batching", {"batch_size": 2}, "batch_size=2 outside"),
    ("dp-sgd", {"batch_size": 100}, "batch_size=100 outside"),
    ("omnilearn-bsp", {"cycle_samples": 16}, "cycle_samples=16 < batch_size=32"),
])
def test_incoherent_policy_combinations_are_refused_with_the_reason(preset, overrides, reason):
    with pytest.raises(ConfigError, match=re.escape(reason)):
        build_config(preset, **overrides)


@pytest.mark.parametrize("preset,overrides", [
    ("ssp", {"allocation": "pcontrol"}),  # the example: bounded staleness + dynamic batching
    ("ebsp", {"allocation": "pcontrol"}),
    ("asp", {"allocation": "static"}),
    ("bsp", {"allocation": "adaptive"}),
    ("bsp", {"aggregation": "power", "allocation": "partition"}),
    ("ebsp", {"aggregation": "power"}),
    ("ssp", {"lr_scaling": "batch-scaled", "allocation": "pcontrol"}),
    ("omnilearn-asp", {"global_batch": "free"}),
    ("task-allocation", {"batch_size": 128}),  # b_min/b_max bound pcontrol/static/partition batches only
])
def test_legal_combinations_build(preset, overrides):
    cfg = build_config(preset, **overrides)
    for k, v in overrides.items():
        assert cfg.get(ALIASES.get(k, k)) == v


def test_ssp_with_pcontrol_runs_without_a_global_batch():
    cfg = build_config("ssp", allocation="pcontrol")
    assert (cfg.sync, cfg.allocation, fixed_global(cfg)) == ("ssp", "pcontrol", False)
    alloc = cfg.build_policy("allocation", dss_max=4096, epoch_samples=1024)
    assert alloc.fixed_global is False and alloc.ctl.global_batch is None


def test_refusal_is_a_config_error_naming_the_config():
    with pytest.raises(ConfigError) as exc:
        build_config("asp", allocation="adaptive")
    assert isinstance(exc.value, ValueError)
    assert str(exc.value).startswith("config:")  # model-level checks name the config as a whole


# ---------------------------------------------------------------------------
# the numbers: OmniLearn Eq. 5b, EDP-SGD weights


def test_batch_scaled_lr_omnilearn_asp_numbers():
    cfg = build_config("omnilearn-asp")
    k_b = 4 * cfg.batch_size
    # Eq. 5b: eta_k = eta * b_k / sum(b). The preset's eta = 0.2 gives 0.05 at the initial b = B/K.
    assert batch_scaled_lr(cfg.lr, cfg.batch_size, k_b) == pytest.approx(0.05)
    # HL8 batches (16, 16, 11, 85) of B = 128: the step sizes sum back to eta.
    rates = [batch_scaled_lr(cfg.lr, b, 128) for b in (16, 16, 11, 85)]
    assert rates == pytest.approx([0.025, 0.025, 0.2 * 11 / 128, 0.2 * 85 / 128])
    assert sum(rates) == pytest.approx(cfg.lr)
    # A batch above the others' sum (ASP without Eq. 8) still scales linearly.
    assert batch_scaled_lr(0.1, 157, 237) == pytest.approx(0.1 * 157 / 237)


@pytest.mark.parametrize("args", [(0.0, 32, 128), (-0.1, 32, 128), (0.1, 0, 128), (0.1, 32, 0), (0.1, -1, 128)])
def test_batch_scaled_lr_refuses_non_positive(args):
    with pytest.raises(ValueError, match="must be positive"):
        batch_scaled_lr(*args)


def test_power_weights_edp_sgd_numbers():
    # EDP-SGD: g_m weighted by CP_m / sum(CP). HL8 powers ∝ cores (6, 6, 4, 32) / 48.
    w = power_weights([187.5, 187.5, 125.0, 1000.0])
    assert w == pytest.approx([0.125, 0.125, 1 / 12, 2 / 3])
    assert math.isclose(sum(w), 1.0)
    assert power_weights([5.0]) == [1.0]
    assert power_weights([2.0, 2.0, 2.0, 2.0]) == [0.25] * 4  # equal power: the plain mean


@pytest.mark.parametrize("powers", [[], [1.0, -1.0], [1.0, math.nan], [1.0, math.inf], [0.0, 0.0]])
def test_power_weights_refuse_bad_powers(powers):
    with pytest.raises(ValueError, match="finite and positive"):
        power_weights(powers)
