"""HermesGUP update gate (Hermes Alg. 1, Eq. 4): worked numbers, edge cases, the authors' window bug."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from hermes.common.policies.gate import (
    GateDecision,
    GateParams,
    ZScoreGate,
    inclusive_z_bound,
    relaxed_alpha,
    window_zscore,
)


def gate_with(window: list[float], silent: int = 0, config: GateParams = GateParams()) -> ZScoreGate:
    return ZScoreGate.from_state(config, {"window": window, "silent_cycles": silent})


def inclusive_z(values: list[float]) -> float:
    """What the authors' code computes: z of the last value against a window that already holds it."""
    n = len(values)
    mu = sum(values) / n
    sigma = math.sqrt(sum((v - mu) ** 2 for v in values) / n)
    return (values[-1] - mu) / sigma


# ---------------------------------------------------------------------------
# Worked numbers


def test_clear_improvement_pushes():
    # previous [1.0, 0.9, 0.8]: mu = 0.9, sigma = sqrt((0.01 + 0 + 0.01) / 3) = 0.0816497
    # x = 0.6: z = (0.6 - 0.9) / 0.0816497 = -3.674 <= -1.3 -> push
    d = gate_with([1.0, 0.9, 0.8]).observe(0.6)
    expected = GateDecision(push=True, z=pytest.approx(-3.674235, abs=1e-6), alpha=-1.3, silent_cycles=0, reason="zscore")
    assert d == expected


def test_small_improvement_does_not_push():
    # same window, x = 0.85: z = -0.05 / 0.0816497 = -0.612 > -1.3 -> no push
    d = gate_with([1.0, 0.9, 0.8]).observe(0.85)
    assert not d.push
    assert d.reason == "above_threshold"
    assert d.z == pytest.approx(-0.612372, abs=1e-6)


def test_z_uses_previous_losses_only():
    # If x were in its own window [1.0, 0.9, 0.8, 0.6]: mu = 0.825, sigma = 0.1479, z = -1.521.
    # Ours excludes it: z = -3.674 (above). The two must differ.
    z_ours = window_zscore(0.6, (1.0, 0.9, 0.8))
    assert z_ours == pytest.approx(-3.674235, abs=1e-6)
    assert inclusive_z([1.0, 0.9, 0.8, 0.6]) == pytest.approx(-1.521278, abs=1e-6)


def test_threshold_is_inclusive():
    # previous [0, 2]: mu = 1, sigma = 1 (exact in binary); x = -0.5 -> z = -1.5 == alpha -> push
    d = gate_with([0.0, 2.0], config=GateParams(alpha=-1.5)).observe(-0.5)
    assert d.z == -1.5 and d.push


def test_population_std_not_sample_std():
    # previous [1, 3]: mu = 2, ddof=0 sigma = 1 (ddof=1 would be 1.414); x = 0.5 -> z = -1.5
    assert window_zscore(0.5, [1.0, 3.0]) == pytest.approx(-1.5)


# ---------------------------------------------------------------------------
# Warm-up and the authors' bug


def test_warmup_needs_two_previous_losses():
    g = ZScoreGate()
    first = g.observe(1.0)  # no previous loss
    second = g.observe(0.1)  # one previous loss: no spread yet, even for a huge drop
    for d in (first, second):
        assert d.push is False and d.reason == "warmup" and d.z is None
    assert (first.silent_cycles, second.silent_cycles) == (0, 1)  # warm-up cycles are silent
    assert g.window_losses == (1.0, 0.1)  # warm-up losses fill the window


def test_two_previous_losses_can_fire():
    # previous [1.0, 0.9]: mu = 0.95, sigma = 0.05; x = 0.8 -> z = -3.0 -> push
    g = ZScoreGate()
    g.observe(1.0)
    g.observe(0.9)
    d = g.observe(0.8)
    assert d.push and d.reason == "zscore"
    assert d.z == pytest.approx(-3.0)


def test_inclusive_window_of_two_can_never_fire():
    # The authors' rule on the same losses: window [0.9, 0.8] holding x = 0.8 gives
    # mu = 0.85, sigma = 0.05, z = -1: the bound sqrt(n - 1) = 1 for n = 2, and -1 > -1.3.
    assert inclusive_z([0.9, 0.8]) == pytest.approx(-1.0)
    assert inclusive_z_bound(2) == 1.0 < 1.3
    # n = 3 is the first inclusive window that can reach -1.3: sqrt(2) = 1.414.
    assert inclusive_z_bound(3) == pytest.approx(math.sqrt(2)) and inclusive_z_bound(3) > 1.3


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_inclusive_bound_holds_and_is_tight(n: int):
    rng = random.Random(n)
    for _ in range(500):
        values = [rng.gauss(0, 1) for _ in range(n)]
        assert abs(inclusive_z(values)) <= inclusive_z_bound(n) + 1e-9
    # Tight: n - 1 equal values and one outlier reach it exactly.
    assert abs(inclusive_z([0.0] * (n - 1) + [1.0])) == pytest.approx(inclusive_z_bound(n))


# ---------------------------------------------------------------------------
# Degenerate inputs


def test_flat_window_equal_loss_gives_zero():
    d = gate_with([1.0, 1.0, 1.0]).observe(1.0)
    assert d.z == 0.0 and not d.push and d.reason == "above_threshold"


def test_flat_window_slightly_lower_loss_is_large_and_finite():
    # sigma = 0 -> sigma_eff = max(0, 1e-12, 1e-6 * 1.0) = 1e-6; z = -0.001 / 1e-6 = -1000
    d = gate_with([1.0, 1.0]).observe(0.999)
    assert math.isfinite(d.z) and d.z == pytest.approx(-1000.0)
    assert d.push


def test_flat_window_at_zero_uses_absolute_floor():
    # mu = 0 -> sigma_eff = 1e-12; x = -1e-9 -> z = -1000
    d = gate_with([0.0, 0.0]).observe(-1e-9)
    assert d.z == pytest.approx(-1000.0) and d.push


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_loss_is_silent_and_not_stored(bad: float):
    g = gate_with([1.0, 0.9, 0.8], silent=3)
    d = g.observe(bad)
    assert d == GateDecision(push=False, z=None, alpha=-1.3, silent_cycles=3, reason="non_finite")
    assert g.window_losses == (1.0, 0.9, 0.8)
    assert g.silent_cycles == 4
    # The window is intact: the next finite loss is scored as if the bad one never came.
    assert g.observe(0.6).z == pytest.approx(-3.674235, abs=1e-6)


def test_non_finite_during_warmup():
    g = ZScoreGate()
    assert g.observe(math.nan).reason == "non_finite"
    assert g.window_losses == ()
    assert g.observe(1.0).reason == "warmup"


# ---------------------------------------------------------------------------
# Threshold relaxation (Hermes Alg. 1 lines 11-12)


def test_relaxation_schedule_over_twenty_silent_cycles():
    g = ZScoreGate()
    decisions = [g.observe(1.0) for _ in range(20)]  # flat losses: z = 0, never fires before alpha >= 0
    assert [d.silent_cycles for d in decisions] == list(range(20))
    expected = [-1.3] * 5 + [-1.2] * 5 + [-1.1] * 5 + [-1.0] * 5
    assert [d.alpha for d in decisions] == pytest.approx(expected)
    assert not any(d.push for d in decisions)
    assert g.alpha == pytest.approx(-0.9)  # silent 20 -> floor(20/5) = 4 steps


def test_relaxed_alpha_lets_a_smaller_improvement_through():
    # previous [1.0, 0.8]: mu = 0.9, sigma = 0.1; x = 0.775 -> z = -1.25
    assert not gate_with([1.0, 0.8], silent=4).observe(0.775).push  # alpha -1.3
    d = gate_with([1.0, 0.8], silent=5).observe(0.775)  # alpha -1.2
    assert d.push and d.alpha == pytest.approx(-1.2) and d.z == pytest.approx(-1.25)


def test_relaxation_is_unbounded_so_any_finite_z_fires():
    g = ZScoreGate()
    for _ in range(200):
        d = g.observe(1.0)  # z = 0 forever
        if d.push:
            break
    else:
        pytest.fail("gate never fired on flat losses")
    # alpha reaches 0 after 13 steps of 0.1, i.e. silent 65 (70 if rounding leaves it a hair below 0)
    assert d.silent_cycles in (65, 70) and d.alpha >= 0.0


def test_push_resets_silence_and_alpha_but_keeps_window():
    g = gate_with([1.0, 0.8], silent=12)
    assert g.alpha == pytest.approx(-1.1)
    d = g.observe(0.5)  # z = -4 -> push
    assert d.push and d.silent_cycles == 12
    assert g.silent_cycles == 0
    assert g.alpha == -1.3
    assert g.window_losses == (1.0, 0.8, 0.5)


def test_window_evicts_oldest_beyond_w():
    g = ZScoreGate(GateParams(window=3))
    for loss in (5.0, 4.0, 3.0, 2.0, 1.0):
        g.observe(loss)
    assert g.window_losses == (3.0, 2.0, 1.0)


def test_relaxed_alpha_function():
    cfg = GateParams(alpha=-2.0, beta=0.5, lam=3)
    assert [relaxed_alpha(cfg, s) for s in (0, 2, 3, 5, 6, 9)] == pytest.approx([-2.0, -2.0, -1.5, -1.5, -1.0, -0.5])
    with pytest.raises(ValueError, match="silent_cycles"):
        relaxed_alpha(cfg, -1)


# ---------------------------------------------------------------------------
# Config and state


def test_defaults_match_table_one():
    assert GateParams() == GateParams(window=10, alpha=-1.3, beta=0.1, lam=5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"window": 1}, "window"),
        ({"window": 2.0}, "window"),
        ({"lam": 0}, "lam"),
        ({"beta": -0.1}, "beta"),
        ({"beta": math.inf}, "beta"),
        ({"alpha": math.nan}, "alpha"),
        ({"alpha": -math.inf}, "alpha"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict, field: str):
    with pytest.raises(ValueError, match=field):
        GateParams(**kwargs)


def test_config_is_frozen():
    with pytest.raises(ValidationError, match="frozen"):
        GateParams().window = 3  # type: ignore[misc]


def test_state_round_trip_continues_identically():
    rng = random.Random(7)
    losses = [1.0 / (1 + i) + rng.uniform(-0.05, 0.05) for i in range(30)]
    a = ZScoreGate()
    for x in losses[:17]:
        a.observe(x)
    b = ZScoreGate.from_state(a.config, a.state())
    assert b.window_losses == a.window_losses and b.silent_cycles == a.silent_cycles
    assert [a.observe(x) for x in losses[17:]] == [b.observe(x) for x in losses[17:]]


def test_from_state_keeps_newest_when_window_shrank():
    g = ZScoreGate.from_state(GateParams(window=2), {"window": [3.0, 2.0, 1.0], "silent_cycles": 0})
    assert g.window_losses == (2.0, 1.0)


@pytest.mark.parametrize(
    "state, field",
    [
        ({"window": [1.0, math.nan], "silent_cycles": 0}, "window"),
        ({"window": "1.0", "silent_cycles": 0}, "window"),
        ({"window": [1.0], "silent_cycles": -1}, "silent_cycles"),
        ({"window": [1.0]}, "silent_cycles"),
    ],
)
def test_from_state_rejects_bad_state(state: dict, field: str):
    with pytest.raises(ValueError, match=field):
        ZScoreGate.from_state(GateParams(), state)


@pytest.mark.parametrize("mode,expected", [
    # Hermes Table I: alpha = -1.3, beta = 0.1, lambda = 5; silent cycles 0..7 before the decision.
    ("step", [-1.3, -1.3, -1.3, -1.3, -1.3, -1.2, -1.2, -1.2]),  # ours: +beta every lambda silent cycles
    ("paper", [-1.3, -1.3, -1.3, -1.3, -1.3, -1.2, -1.1, -1.0]),  # Alg. 1 l. 11-12: +beta per iteration once N_iter >= lambda
    ("multiplicative", [-1.3, -1.3, -1.3, -1.3, -1.3, -1.17, -1.053, -0.9477]),  # alpha * (1 - beta) per such iteration
])
def test_alpha_relaxation_modes_table_i(mode, expected):
    from hermes.common.policies.gate import GateParams as GC
    from hermes.common.policies.gate import relaxed_alpha as ra

    cfg = GC(window=10, alpha=-1.3, beta=0.1, lam=5, relaxation=mode)
    assert [ra(cfg, s) for s in range(8)] == pytest.approx(expected)


def test_gate_policy_from_registry_uses_the_config_switch():
    from hermes.common.config import build_config
    from hermes.common.policies.base import get

    cfg = build_config("hermes", gate_relaxation="paper")
    gate = cfg.build_policy("gate")
    assert gate.config.relaxation == "paper" and gate.config.alpha == -1.3
    assert get("gate", "zscore").needs_validation_loss and build_config("bsp").build_policy("gate") is None


# ---------------------------------------------------------------------------
# resync_factor (a deviation; unset is Alg. 1)


def test_a_loss_far_above_the_windows_best_says_resync_and_stays_out_of_the_window():
    config = GateParams(resync_factor=4.0)
    gate = gate_with([0.10, 0.20, 0.15], silent=2, config=config)
    # The window's best is 0.10: 0.4 is 4x it, not above; 0.41 is.
    at = gate.observe(0.4)
    assert (at.push, at.resync, at.reason) == (False, False, "above_threshold")
    gate = gate_with([0.10, 0.20, 0.15], silent=2, config=config)
    d = gate.observe(0.41)
    assert (d.push, d.resync, d.reason, d.z) == (False, True, "diverged", None)
    assert gate.window_losses == (0.10, 0.20, 0.15) and gate.silent_cycles == 3
    nan = gate.observe(math.nan)
    assert (nan.resync, nan.reason) == (True, "non_finite")


def test_without_resync_factor_a_diverged_loss_is_just_another_skip():
    gate = gate_with([0.10, 0.20, 0.15])
    d = gate.observe(2.3)
    assert (d.push, d.resync, d.reason) == (False, False, "above_threshold")
    assert gate.window_losses[-1] == 2.3  # Alg. 1 keeps every loss in the window
    assert gate.observe(math.inf).resync is False


@pytest.mark.parametrize("factor", [1.0, 0.5, math.inf, math.nan])
def test_resync_factor_must_be_a_finite_number_above_one(factor):
    with pytest.raises(ValueError, match="resync_factor"):
        GateParams(resync_factor=factor)
