"""The proportional controller (OmniLearn Eq. 6-8, ACSOS Eq. 4-5): the papers' numbers and rules as test cases."""

from __future__ import annotations

import pytest

from hermes.common.policies.allocation.proportional_control import (
    PControlParams,
    ProportionalController,
    deadband_passes,
)


def controller(batches: dict[str, int], *, b_min: int = 1, b_max: int = 1 << 30, global_batch: int | None = None,
               **settings: object) -> ProportionalController:
    """The controller under the papers' rules (no drop margin, smoothing restarts, caps never lifted) unless
    ``settings`` (``pcontrol`` fields) say otherwise; bounds as wide as the test needs."""
    paper: dict[str, object] = {"carry_smoothing": False, "drop_margin": 0.0, "drop_cap_updates": 0}
    return ProportionalController(batches, PControlParams(**(paper | settings)), b_min=b_min, b_max=b_max,
                                  global_batch=global_batch)


HL8_BSP_CORES = [6, 6, 4, 32]  # OmniLearn Table I, HL8, BSP


def simulate(ctrl: ProportionalController, speeds: dict[str, float], epochs: int, overhead: float = 0.0,
             iterations: int = 5) -> list[dict[str, int]]:
    """Workers whose compute time is overhead + b_k / speed_k; one control step per epoch."""
    history = []
    for _ in range(epochs):
        for _ in range(iterations):
            for w, s in speeds.items():
                ctrl.observe(w, overhead + ctrl.batch_size(w) / s)
        history.append(ctrl.update())
    return history


def test_eq6_single_step_is_b_times_tbar_over_t():
    # ACSOS: b(1) = b(0) * t_bar / t_k. a: 32 in 0.5 s, b: 32 in 1.5 s; t_bar = 1.0.
    c = controller({"a": 32, "b": 32}, deadband=0.0)
    c.observe("a", 0.5)
    c.observe("b", 1.5)
    assert c.update() == {"a": 64, "b": 21}  # 32*1/0.5, 32*1/1.5 = 21.33


def test_fig8_hl8_unconstrained_worked_numbers():
    # OmniLearn Fig. 8 setting: HL8, b = 32 everywhere, (b_min, b_max) = (12, 96),
    # deadband 15 %, no global rule. t = 32/(6, 6, 4, 32) = (5.33, 5.33, 8, 1), t_bar = 4.917:
    # b' = (29.5, 29.5, 19.67, 157.3 -> 96) -> (30, 30, 20, 96); Eq. 7: |30-32|/30 = 6.7 % < 15 %,
    # so a, b keep 32 -> (32, 32, 20, 96). Next epoch t = (5.33, 5.33, 5, 3), t_bar = 4.67:
    # b' = (28, 28, 18.7, 149 -> 96); |28-32|/28 = 14.3 % and |19-20|/19 = 5 % < 15 %: steady.
    speeds = dict(zip("abcd", HL8_BSP_CORES))
    c = controller({w: 32 for w in speeds}, b_min=12, b_max=96, deadband=0.15)
    hist = simulate(c, speeds, epochs=6)
    assert hist[0] == {"a": 32, "b": 32, "c": 20, "d": 96}
    assert all(h == hist[0] for h in hist)
    assert c.adjustments == 1


@pytest.mark.parametrize("overhead", [0.0, 0.5, 2.0])
def test_eq6_converges_within_2_to_4_adjustments_at_hl8(overhead):
    # OmniLearn Fig. 8: from equal batches to throughput-proportional ones in 2-4 adjustments.
    # Global batch kept at 4 * 32 (Eq. 8), bounds (4, 96), deadband 10 % (Fig. 11 settings).
    speeds = dict(zip("abcd", HL8_BSP_CORES))
    c = controller({w: 32 for w in speeds}, b_min=4, b_max=96, deadband=0.1, global_batch=128)
    hist = simulate(c, speeds, epochs=20, overhead=overhead)
    assert all(sum(h.values()) == 128 for h in hist)  # Eq. 8, every step
    assert 1 <= c.adjustments <= 4
    final = hist[-1]
    assert all(h == final for h in hist[c.adjustments:])  # then steady
    if overhead == 0.0:
        # Throughput-proportional: 128 * (6, 6, 4, 32) / 48 = (16, 16, 10.7, 85.3).
        assert final == {"a": 16, "b": 16, "c": 11, "d": 85}
    times = [overhead + final[w] / s for w, s in speeds.items()]
    before = [overhead + 32 / s for s in speeds.values()]
    assert max(times) / min(times) < 1.3 < max(before) / min(before)


def test_deadband_suppresses_changes_below_threshold():
    # b' = 32 * 1.0/0.95 = 33.7 -> 34: |34-32|/34 = 5.9 % < 10 %: no change.
    c = controller({"a": 32, "b": 32}, deadband=0.1)
    c.observe("a", 0.95)
    c.observe("b", 1.05)
    assert c.update() == {"a": 32, "b": 32} and c.adjustments == 0
    # The same measurements with a 5 % band do change the batches.
    c = controller({"a": 32, "b": 32}, deadband=0.05)
    c.observe("a", 0.95)
    c.observe("b", 1.05)
    assert c.update() == {"a": 34, "b": 30} and c.adjustments == 1


def test_deadband_under_global_batch_gates_the_whole_step():
    # All proposals within 10 %: nothing changes, the sum stays 120.
    c = controller({"a": 40, "b": 40, "c": 40}, deadband=0.1, global_batch=120)
    for w, t in (("a", 0.97), ("b", 1.03), ("c", 1.0)):
        c.observe(w, t)
    assert c.update() == {"a": 40, "b": 40, "c": 40} and c.adjustments == 0
    # Only a's move is big, but the whole Eq. 6 + Eq. 8 allocation is adopted:
    # X = (80, 40, 40) -> 120 * X / 160 = (60, 30, 30).
    c = controller({"a": 40, "b": 40, "c": 40}, deadband=0.1, global_batch=120)
    for w, t in (("a", 0.5), ("b", 1.0), ("c", 1.0)):
        c.observe(w, t)
    assert c.update() == {"a": 60, "b": 30, "c": 30}


def test_ewma_smoothing_alpha():
    c = controller({"a": 32}, alpha=0.3)
    c.observe("a", 1.0)
    c.observe("a", 2.0)
    assert c.smoothed("a") == pytest.approx(0.3 * 2.0 + 0.7 * 1.0)
    # One outlier moves the estimate by less than a third of the jump.
    c.observe("a", 10.0)
    assert c.smoothed("a") < 1.3 + (10 - 1.3) / 3


def test_update_waits_for_every_worker_to_be_measured():
    c = controller({"a": 32, "b": 32}, deadband=0.0)
    c.observe("a", 0.1)
    assert c.update() == {"a": 32, "b": 32}


def test_throughput_drop_after_increase_lowers_b_max():
    # ACSOS: throughput drops after raising b0 -> b, so b_max := b0.
    c = controller({"a": 32, "b": 32}, deadband=0.0)
    c.observe("a", 0.5)  # X_a = 64/s
    c.observe("b", 1.0)
    assert c.update() == {"a": 48, "b": 24}  # t_bar 0.75: 32*0.75/0.5, 32*0.75/1.0
    c.observe("a", 1.0)  # at 48, X_a = 48/s < 64/s: memory-bound, throughput fell
    c.observe("b", 0.75)
    assert c.update()["a"] == 32  # proposal 48*0.875/1.0 = 42, capped by the new b_max
    assert c.b_max_of("a") == 32
    assert c.b_max_of("b") == c.b_max  # b was never increased


def test_no_b_max_change_when_throughput_holds():
    c = controller({"a": 32, "b": 32}, deadband=0.0)
    c.observe("a", 0.5)
    c.observe("b", 1.0)
    c.update()
    c.observe("a", 0.75)  # 48 in 0.75 s: still 64/s
    c.observe("b", 0.75)
    c.update()
    assert c.b_max_of("a") == c.b_max


def test_throughput_drop_within_the_margin_is_noise_and_a_cap_expires():
    c = controller({"a": 32, "b": 32}, deadband=0.0, drop_margin=0.25, drop_cap_updates=2)
    c.observe("a", 0.5)  # X_a = 64/s
    c.observe("b", 1.0)
    assert c.update() == {"a": 48, "b": 24}
    c.observe("a", 0.9)  # at 48: 53/s, 17% below 64/s: inside the 25% margin, no cap
    c.observe("b", 0.75)
    c.update()
    assert c.b_max_of("a") == c.b_max
    # A real fall: raise a again, then measure 40% less throughput.
    c2 = controller({"a": 32, "b": 32}, deadband=0.0, drop_margin=0.25, drop_cap_updates=2)
    c2.observe("a", 0.5)
    c2.observe("b", 1.0)
    c2.update()  # a -> 48
    c2.observe("a", 1.25)  # 38.4/s: 40% below 64/s
    c2.observe("b", 0.75)
    c2.update()
    assert c2.b_max_of("a") == 32
    for _ in range(2):  # the cap holds for drop_cap_updates control steps ...
        c2.observe("a", 0.5)
        c2.observe("b", 1.0)
        c2.update()
        assert c2.b_max_of("a") == 32
    c2.observe("a", 0.5)
    c2.observe("b", 1.0)
    c2.update()
    assert c2.b_max_of("a") == c2.b_max  # ... then it is lifted: the resources may have changed


def test_carried_smoothing_rescales_the_estimate_by_the_batch_ratio():
    # t ∝ b: the estimate at b=48 starts from the b=32 estimate times 48/32, and one noisy
    # cycle at the new batch moves it by alpha only (a restart would take it whole).
    c = controller({"a": 32, "b": 32}, deadband=0.0, alpha=0.3, carry_smoothing=True)
    c.observe("a", 0.5)
    c.observe("b", 1.0)
    assert c.update() == {"a": 48, "b": 24}
    assert c.smoothed("a") == pytest.approx(0.75) and c.smoothed("b") == pytest.approx(0.75)
    c.observe("a", 3.0)  # an outlier
    assert c.smoothed("a") == pytest.approx(0.3 * 3.0 + 0.7 * 0.75)


def _step(ctl: ProportionalController, times: dict[str, float]) -> dict[str, int]:
    for w, t in times.items():
        ctl.observe(w, t)
    return ctl.update()


@pytest.mark.parametrize("order,expected_a", [("after-bounds", 90), ("before-bounds", 96)])
def test_deadband_before_bounds_is_omnilearn_algorithm_1(order, expected_a):
    # a: b = 90 at t = 0.9 s, b: t = 1.1 s, mean 1.0 s: Eq. 6 gives b*_a = 90 / 0.9 * 1.0 = 100.
    # Bounded to OmniLearn Fig. 11's b_max = 96: |96 - 90| / 96 = 0.0625 < 0.09 (ours: no change);
    # Alg. 1 tests b* itself: |100 - 90| / 100 = 0.1 >= 0.09, then clamps to 96.
    ctl = controller({"a": 90, "b": 32}, b_min=4, b_max=96, deadband=0.09, deadband_order=order)
    assert _step(ctl, {"a": 0.9, "b": 1.1})["a"] == expected_a


def test_deadband_reference_acsos_numbers():
    # ACSOS: threshold 0.05, "the new batch sizes on all workers must be at least change by 5%".
    assert deadband_passes(100, 105, 105.0, deadband=0.05, reference="old")  # 5 / 100 = 0.05
    assert not deadband_passes(100, 105, 105.0, deadband=0.05, reference="new")  # 5 / 105 = 0.048 (Eq. 7)
    assert deadband_passes(100, 95, 95.0, deadband=0.05, reference="new")  # 5 / 95 = 0.053
    assert not deadband_passes(100, 100, 104.0, deadband=0.0)  # no change never counts


@pytest.mark.parametrize("reference,expected_a", [("new", 100), ("old", 105)])
def test_deadband_reference_in_the_controller(reference, expected_a):
    # a at 1.0 s, b at 1.1 s: mean 1.05 s, b*_a = 100 * 1.05 / 1.0 = 105.
    ctl = controller({"a": 100, "b": 100}, b_min=4, b_max=200, deadband=0.05,
                                 deadband_reference=reference)
    assert _step(ctl, {"a": 1.0, "b": 1.1})["a"] == expected_a


@pytest.mark.parametrize("rule,expected", [("proportional", {"a": 48, "b": 16}), ("uniform", {"a": 53, "b": 11})])
def test_global_rule_eq8_literal(rule, expected):
    # b = 32 each, t = 1 s and 3 s: Eq. 6 gives b' = 64 and 21.33 (sum 85.33), B = K*b = 64.
    # Eq. 8: dB = 21.33, each loses dB/K = 10.67 -> 53.33, 10.67 -> 53, 11 (sum kept).
    # Ours: b_k = B * X_k / sum(X) -> 48, 16.
    ctl = controller({"a": 32, "b": 32}, b_min=1, b_max=1000, deadband=0.0, global_batch=64,
                                 global_rule=rule)
    new = _step(ctl, {"a": 1.0, "b": 3.0})
    assert new == expected and sum(new.values()) == 64


def test_drop_margin_zero_is_the_acsos_rule():
    # ACSOS: "if we observe a drop in worker throughput after increasing its batch from b0 to b, then b_max = b0".
    def run(margin: float) -> int:
        ctl = controller({"a": 32, "b": 32}, b_min=4, b_max=96, deadband=0.0, drop_margin=margin)
        _step(ctl, {"a": 1.0, "b": 2.0})  # a grows from 32 (throughput 32/s)
        grown = ctl.batch_size("a")
        _step(ctl, {"a": grown / 31.0, "b": 2.0})  # ... and then runs at 31/s: a 3% fall
        return ctl.b_max_of("a")
    assert run(0.0) == 32  # the paper: capped at b0
    assert run(0.25) == 96  # ours: a 3% fall is noise on a shared CPU
