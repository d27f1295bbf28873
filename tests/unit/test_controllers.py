"""Allocation policy math: the papers' equations and numbers as test cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.common.policies.aggregation import batch_scaled_lr, power_weights
from hermes.common.policies.allocation.dynamic_partitioning import compute_power
from hermes.common.policies.allocation.memory_model import fit_memory_model, max_batch_for_memory
from hermes.common.policies.allocation.proportional_control import PControlParams, ProportionalController
from hermes.common.policies.allocation.rounding import InfeasibleAllocation, round_preserving_sum
from hermes.common.policies.allocation.static import static_batches
from hermes.common.policies.allocation.task_allocation import AdaptiveAccumulation, task_allocation_targets


def controller(batches: dict[str, int], *, b_min: int = 1, b_max: int = 1 << 30, global_batch: int | None = None,
               **settings: object) -> ProportionalController:
    """The controller under the papers' rules (no drop margin, smoothing restarts, caps never lifted) unless
    ``settings`` (``pcontrol`` fields) say otherwise; bounds as wide as the test needs."""
    paper: dict[str, object] = {"carry_smoothing": False, "drop_margin": 0.0, "drop_cap_updates": 0}
    return ProportionalController(batches, PControlParams(**(paper | settings)), b_min=b_min, b_max=b_max,
                                  global_batch=global_batch)


HL8_BSP_CORES = [6, 6, 4, 32]  # OmniLearn Table I, HL8, BSP


# ---------------------------------------------------------------------------
# Static batches (OmniLearn Eq. 4a) and exact rounding (Eq. 8 constraint)


def test_static_batches_hl8():
    # 128 * (6, 6, 4, 32) / 48 = (16, 16, 10.67, 85.33): largest remainder gives the unit to 10.67.
    assert static_batches(HL8_BSP_CORES, 128) == [16, 16, 11, 85]
    assert static_batches([12, 12, 12, 12], 128) == [32, 32, 32, 32]  # HL1 is uniform batching


def test_round_preserving_sum_respects_bounds_and_redistributes():
    # Fig. 8 bounds (12, 96): worker 3's 10.67 is lifted to 12, the others share 116.
    assert round_preserving_sum(HL8_BSP_CORES, 128, 12, 96) == [16, 16, 12, 84]
    # Upper bound binds: 300 * 32/48 = 200 > 96; the rest share 204.
    out = round_preserving_sum(HL8_BSP_CORES, 300, 12, 96)
    assert sum(out) == 300 and out[3] == 96 and all(12 <= b <= 96 for b in out)
    assert round_preserving_sum([0, 0, 0], 10) == [4, 3, 3]  # all-zero: even split, ties to lower index
    assert round_preserving_sum([1, 0], 5, 0, [2, 10]) == [2, 3]  # zero-valued worker takes the rest


def test_round_preserving_sum_infeasible_is_a_clear_error():
    with pytest.raises(InfeasibleAllocation, match="sum\\(lower\\)=48"):
        round_preserving_sum([1, 1, 1, 1], 40, 12, 96)
    with pytest.raises(InfeasibleAllocation, match="sum\\(upper\\)=384"):
        round_preserving_sum([1, 1, 1, 1], 400, 12, 96)
    with pytest.raises(InfeasibleAllocation):
        round_preserving_sum([1, 1], 10, [6, 1], [5, 9])
    with pytest.raises(ValueError):
        round_preserving_sum([1, -1], 10)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=12),
    b=st.integers(1, 256),
    b_min=st.integers(1, 16),
    span=st.integers(0, 512),
)
def test_eq8_global_batch_is_exact_for_random_cases(values, b, b_min, span):
    k = len(values)
    total = k * b  # OmniLearn Eq. 8: sum(b_k) = K*b
    b_max = b_min + span
    if k * b_min > total or k * b_max < total:
        with pytest.raises(InfeasibleAllocation):
            round_preserving_sum(values, total, b_min, b_max)
        return
    out = round_preserving_sum(values, total, b_min, b_max)
    assert sum(out) == total
    assert all(b_min <= o <= b_max for o in out)
    # Largest remainder stays within one unit of the real water-filled share when no bound binds.
    if sum(values) > 0 and all(b_min < total * v / sum(values) < b_max for v in values):
        assert all(abs(o - total * v / sum(values)) < 1 + 1e-6 for o, v in zip(out, values))


# ---------------------------------------------------------------------------
# Proportional controller (OmniLearn Eq. 6-8, ACSOS Eq. 4-5)


def simulate(ctrl: ProportionalController, speeds: dict[str, float], epochs: int, overhead: float = 0.0,
             iterations: int = 5) -> list[dict[str, int]]:
    """Workers whose compute time is overhead + b_k / speed_k; one control step per epoch."""
    history = []
    for _ in range(epochs):
        for _ in range(iterations):
            for w, s in speeds.items():
                ctrl.observe(w, overhead + ctrl.batch(w) / s)
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


def test_memory_model_fit_and_bound():
    # OmniLearn Eq. 9 / Fig. 6: memory = 1 GiB fixed + 3 MiB per sample (batches as in Fig. 6a).
    m0_true, m1_true = 2**30, 3 * 2**20
    samples = [(b, m0_true + m1_true * b) for b in (1, 32, 64, 128, 512, 1024)]
    m0, m1 = fit_memory_model(samples)
    assert m0 == pytest.approx(m0_true, rel=1e-9) and m1 == pytest.approx(m1_true, rel=1e-9)
    # 2 GiB budget: (2^31 - 2^30) / (3 * 2^20) = 341.33 -> 341.
    assert max_batch_for_memory(m0, m1, 2**31) == 341
    c = controller({"a": 32}, b_min=4, b_max=1024)
    c.set_b_max("a", max_batch_for_memory(m0, m1, 2**31))
    assert c.b_max_of("a") == 341
    with pytest.raises(ValueError, match="does not fit"):
        max_batch_for_memory(m0, m1, m0)
    with pytest.raises(ValueError, match="two or more"):
        fit_memory_model([(32, 1.0), (32, 2.0)])


# ---------------------------------------------------------------------------
# Chao et al. Eq. 10 / appendix Eq. 22


def appendix_solution(w: list[float], v: list[float]) -> list[float]:
    """Solve A u = b (Chao appendix Eq. 19-21) numerically."""
    n = len(w)
    a = np.zeros((n, n))
    rhs = np.zeros(n)
    for i in range(n - 1):
        a[i, i], a[i, i + 1] = 1 / v[i], -1 / v[i + 1]
        rhs[i] = w[i + 1] / v[i + 1] - w[i] / v[i]
    a[n - 1, :] = 1.0
    return list(np.linalg.solve(a, rhs))


@pytest.mark.parametrize(
    "w,t",
    [([10, 10], [2.0, 1.0]), ([5, 10, 15], [1.0, 4.0, 2.0]), ([8, 8, 8, 8], [1.0, 1.0, 2.0, 4.0])],
)
def test_eq10_matches_appendix_eq22_and_linear_system(w, t):
    new = task_allocation_targets(w, t)
    # Eq. 22 closed form: u_i = v_i / sum(v) * sum(w) - w_i with v_i ∝ w_i / t_i.
    v = [wi / ti for wi, ti in zip(w, t)]
    u22 = [vi / sum(v) * sum(w) - wi for vi, wi in zip(v, w)]
    u21 = appendix_solution(w, v)
    assert new == pytest.approx([wi + ui for wi, ui in zip(w, u22)])
    assert new == pytest.approx([wi + ui for wi, ui in zip(w, u21)])
    assert sum(new) == pytest.approx(sum(w))  # Eq. 4/16: C constant, Eq. 5/17: sum(u) = 0
    # Eq. 8: after re-allocation every worker's compute time is the same.
    new_times = [ni / vi for ni, vi in zip(new, v)]
    assert max(new_times) == pytest.approx(min(new_times))


def test_adaptive_accumulation_stops_when_ratio_is_stable():
    per_step = [0.2, 0.1, 0.4]  # seconds per micro-batch, fixed hardware
    alg = AdaptiveAccumulation(current=[5, 5, 5], epsilon=0.05, patience=2)
    seen = []
    for _ in range(10):
        times = [w * s for w, s in zip(alg.current, per_step)]
        seen.append(alg.update(times))
        if alg.stopped:
            break
    assert alg.stopped and len(seen) <= 4  # Chao: "after 4-5 epochs ... basically stable"
    assert sum(seen[-1]) == 15 and seen[-1] == [4, 9, 2]  # 15 * (5, 10, 2.5) / 17.5 = (4.3, 8.6, 2.1)
    assert alg.update([100.0, 1.0, 1.0]) == seen[-1]  # stopped: no more re-allocation


# ---------------------------------------------------------------------------
# DP-SGD Algorithm 1, EDP-SGD weights, OmniLearn Eq. 5b


def test_compute_power():
    assert compute_power(1000, 4.0) == 250.0  # DP-SGD Eq. 2


def test_power_weights_and_batch_scaled_lr():
    assert power_weights([1.0, 3.0]) == [0.25, 0.75]  # EDP-SGD: CP_m / sum(CP)
    with pytest.raises(ValueError):
        power_weights([1.0, 0.0])
    # OmniLearn Eq. 5b at HL8 static batches (16, 16, 11, 85), eta = 0.1, B = 128.
    assert batch_scaled_lr(0.1, 85, 128) == pytest.approx(0.1 * 85 / 128)
    assert batch_scaled_lr(0.1, 32, 128) == pytest.approx(0.025)  # uniform: eta / K


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
