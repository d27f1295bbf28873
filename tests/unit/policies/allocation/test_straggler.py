"""Hermes' straggler detection (IQR fences) and the sizer that resizes outliers (Sec. IV-A), with an HL8 simulation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hermes.common.policies.allocation._common import RebalanceParams
from hermes.common.policies.allocation.cost_model import CostModel
from hermes.common.policies.allocation.straggler import (
    DualSearchParams,
    StragglerSizer,
    iqr_bounds,
    iqr_outliers,
    quartiles,
)

from .sizers import paper_sizer, sizer

# HL8 (OmniLearn Table I, BSP cores 6, 6, 4, 32): a worker with c cores is 32/c times slower.
HL8 = [1.0, 5.33, 5.33, 8.0]


def test_quartiles_worked_numbers():
    # sorted [1, 5.33, 5.33, 8], linear method: position p * (n - 1)
    # Q1: 0.75 -> 1 + 0.75 * (5.33 - 1) = 4.2475
    # Q2: 1.5  -> 5.33
    # Q3: 2.25 -> 5.33 + 0.25 * (8 - 5.33) = 5.9975
    assert quartiles(HL8) == pytest.approx((4.2475, 5.33, 5.9975))
    assert quartiles([8.0, 5.33, 1.0, 5.33]) == pytest.approx((4.2475, 5.33, 5.9975))  # order-free


def test_iqr_bounds_worked_numbers():
    # IQR = 5.9975 - 4.2475 = 1.75; fences 4.2475 - 2.625 = 1.6225 and 5.9975 + 2.625 = 8.6225
    assert iqr_bounds(HL8) == pytest.approx((1.6225, 8.6225))


def test_hl8_flags_only_the_fast_worker():
    # 1 < 1.6225 -> fast; 8 < 8.6225 -> NOT slow: the 32-core worker's tiny time widens the box.
    assert iqr_outliers(dict(zip("abcd", HL8))) == {"a": "fast"}


def test_slow_outlier():
    # sorted [5.33, 5.33, 5.33, 8]: Q1 = 5.33, Q3 = 5.33 + 0.25 * 2.67 = 5.9975,
    # IQR = 0.6675, upper fence = 5.9975 + 1.00125 = 6.99875 < 8 -> slow
    assert iqr_bounds([5.33, 5.33, 5.33, 8.0])[1] == pytest.approx(6.99875)
    assert iqr_outliers({"a": 5.33, "b": 5.33, "c": 5.33, "d": 8.0}) == {"d": "slow"}


def test_both_sides_at_once():
    times = {"slow": 30.0, "fast": 0.5, **{f"w{i}": 10.0 + 0.1 * i for i in range(6)}}
    assert iqr_outliers(times) == {"fast": "fast", "slow": "slow"}


def test_value_on_the_fence_is_not_an_outlier():
    # [0, 1, 1, 2]: Q1 = 0.75, Q3 = 1.25, IQR = 0.5, fences exactly [0, 2]
    assert iqr_bounds([0.0, 1.0, 1.0, 2.0]) == pytest.approx((0.0, 2.0))
    assert iqr_outliers({"a": 0.0, "b": 1.0, "c": 1.0, "d": 2.0}) == {}


def test_fewer_than_four_values_never_flag():
    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randint(0, 3)
        times = {f"w{i}": rng.expovariate(1.0) * rng.choice([1, 100]) for i in range(n)}
        assert iqr_outliers(times) == {}


def test_quartiles_match_numpy_and_reject_bad_input():
    rng = np.random.default_rng(0)
    v = rng.exponential(size=11)
    assert quartiles(v) == pytest.approx(tuple(np.percentile(v, [25, 50, 75])))
    with pytest.raises(ValueError, match="empty"):
        quartiles([])
    with pytest.raises(ValueError, match="finite"):
        quartiles([1.0, math.nan])




def feed(s: StragglerSizer, times: dict[str, float], rounds: int = 2) -> None:
    for _ in range(rounds):
        for w, t in times.items():
            s.observe(w, *s.workload(w), t)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"mbs_min": 12}, "mbs_min"), ({"mbs_max": 4}, "mbs_max"), ({"tolerance": -1.0}, "tolerance"),
     ({"cost_fit": "cubic"}, "fit"), ({"min_observations": 0}, "min_observations"), ({"history": 1}, "history")],
)
def test_search_config_validation(kwargs: dict, field: str):
    search = {k: v for k, v in kwargs.items() if k in DualSearchParams.model_fields}
    rebalance = {k: v for k, v in kwargs.items() if k in RebalanceParams.model_fields}
    with pytest.raises(ValueError, match=field):
        StragglerSizer(DualSearchParams(**search), RebalanceParams(**rebalance), base_dss=256, base_batch_size=32,
                       dss_step=64, dss_max=1437, **({"history": kwargs["history"]} if "history" in kwargs else {}))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"base_dss": 0}, "base_dss"), ({"base_dss": 2000}, "base_dss"), ({"base_batch_size": 48}, "base_batch_size"),
     ({"dss_step": 0}, "dss_step"), ({"dss_max": 10}, "dss_max")],
)
def test_sizer_validation(kwargs: dict, field: str):
    args = dict(base_dss=256, base_batch_size=32, dss_step=64, dss_max=1437) | kwargs
    with pytest.raises(ValueError, match=field):
        paper_sizer(**args)


def test_unknown_worker_gets_base_and_bad_observations_are_refused():
    s = sizer()
    assert s.workload("new") == (256, 32)
    with pytest.raises(ValueError, match="seconds"):
        s.observe("a", 256, 32, 0.0)
    with pytest.raises(ValueError, match="dss"):
        s.observe("a", 0, 32, 1.0)


def test_rebalance_waits_for_min_observations():
    s = sizer(min_observations=2)
    times = {"a": 1.0, "b": 5.33, "c": 5.33, "d": 8.0}
    feed(s, times, rounds=1)
    assert s.rebalance() == {}
    feed(s, times, rounds=1)
    assert set(s.rebalance()) == {"a"}


def test_rebalance_resizes_only_outliers_toward_the_median():
    s = sizer()
    times = {"a": 1.0, "b": 5.33, "c": 5.33, "d": 8.0}  # HL8: only "a" is outside the fences
    feed(s, times)
    out = s.rebalance()
    assert set(out) == {"a"}
    # "a": 1.0 s for 8 batches of 32 -> 0.125 s per batch (a = 0 fallback); median 5.33 -> 42.6 batches
    # -> DSS 1344 (42 batches, 5.25 s, -1.5%)
    assert (out["a"].dss, out["a"].batch_size) == (1344, 32)
    assert out["a"].target_seconds == pytest.approx(5.33)
    assert s.workload("a") == (1344, 32)
    assert s.workload("d") == (256, 32)  # not an outlier: untouched


def test_resized_worker_is_not_resized_again_before_it_reports():
    s = sizer()
    feed(s, {"a": 1.0, "b": 5.33, "c": 5.33, "d": 5.33})
    assert set(s.rebalance()) == {"a"}
    assert s.rebalance() == {}  # "a" still shows its old 1.0 s, at the old workload
    for w in "bcd":
        s.observe(w, 256, 32, 4.5)  # the median moves: a fresh search for "a" would now differ
    assert s.rebalance() == {}
    assert s.workload("a") == (1344, 32)
    s.observe("a", *s.workload("a"), 1.0 * 1344 / 256)  # now it reports at the new one
    # 5.25 s against 4.5 s is now a fresh, slow outlier: 0.125 s per batch -> 36 batches = 1152
    out = s.rebalance()
    assert (out["a"].dss, out["a"].batch_size) == (1152, 32)


def test_rebalance_is_deterministic():
    def run() -> dict:
        s = sizer()
        feed(s, {"z": 0.5, "y": 5.0, "x": 5.2, "w": 5.1, "v": 20.0})
        return s.rebalance()

    first = run()
    assert set(first) == {"z", "v"}
    assert first == run()


def test_memory_limit_caps_resizes_and_current_workload():
    s = sizer()
    s.set_memory_limit("a", 500)
    feed(s, {"a": 1.0, "b": 5.33, "c": 5.33, "d": 5.33})
    r = s.rebalance()["a"]
    assert r.dss == 448  # largest multiple of 64 under 500, though the median asks for more
    assert not r.within_tolerance
    s.set_memory_limit("a", 200)
    assert s.workload("a") == (192, r.batch_size)  # cut at once
    with pytest.raises(ValueError, match="max_dss"):
        s.set_memory_limit("a", 10)


def test_forget_drops_everything():
    s = sizer()
    feed(s, {"a": 1.0, "b": 5.33, "c": 5.33, "d": 5.33})
    s.set_memory_limit("a", 128)
    s.rebalance()
    s.forget("a")
    assert s.workload("a") == (256, 32)
    assert s.rebalance() == {}  # three workers left: IQR cannot flag anything


HL8_CORES = {"w1": 6, "w2": 6, "w3": 4, "w4": 32}


def hl8_truth(a0: float = 0.004, b0: float = 0.0005) -> dict[str, CostModel]:
    # The 32-core worker: 4 ms per step + 0.5 ms per sample; a worker with c cores is 32/c times slower.
    return {w: CostModel(a=a0 * 32 / c, b=b0 * 32 / c) for w, c in HL8_CORES.items()}


def simulate(rounds: int, fit: str = "linear") -> list[tuple[dict[str, float], float]]:
    truth = hl8_truth()
    s = paper_sizer(fit=fit, base_dss=256, base_batch_size=32, dss_step=64, dss_max=1437)
    history = []
    for _ in range(rounds):
        times = {}
        for w, model in truth.items():
            dss, batch_size = s.workload(w)
            times[w] = model.cycle_seconds(dss, batch_size)
            s.observe(w, dss, batch_size, times[w])
        history.append((times, float(np.median(list(times.values())))))
        s.rebalance()
    return history


def test_hl8_simulation_brings_the_slowest_worker_near_the_median():
    history = simulate(10)
    ratios = [max(t.values()) / med for t, med in history]
    assert ratios[0] == pytest.approx(1.5)  # w3 (4 cores) at 8/5.33 of the median
    first_ok = next(i for i, r in enumerate(ratios) if r <= 1.2)
    assert first_ok <= 9
    assert all(r <= 1.2 for r in ratios[first_ok:])  # and it stays there
    last, med = history[-1]
    assert last["w4"] / med == pytest.approx(1.0, abs=0.1)  # the 32-core worker now does ~5x the work


def test_linear_fit_predicts_a_new_mbs_constant_k_does_not():
    # A straggler with a heavy per-step cost: K = 0.05 + 0.0005 * MBS; it has run at MBS 32 and 64.
    truth = CostModel(a=0.05, b=0.0005)
    results = {}
    for fit in ("linear", "constant"):
        s = paper_sizer(fit=fit, base_dss=512, base_batch_size=32, dss_step=256, dss_max=1437)
        for w in ("f1", "f2", "f3"):
            s.observe(w, 512, 32, 0.2)
            s.observe(w, 512, 32, 0.2)
        s.observe("slow", 512, 32, truth.cycle_seconds(512, 32))  # 16 * 0.066 = 1.056
        s.observe("slow", 512, 64, truth.cycle_seconds(512, 64))  # 8 * 0.082 = 0.656
        results[fit] = s.rebalance()["slow"]
    errors = {}
    for fit, r in results.items():
        assert r.batch_size not in (32, 64)  # resized to an MBS it has never run
        actual = truth.cycle_seconds(r.dss, r.batch_size)
        errors[fit] = abs(r.predicted_seconds - actual) / actual
    # linear: a = 0.05, b = 0.0005 recovered; picks (256, 256): 0.178 s predicted and actual.
    # constant: K = mean(0.066, 0.082) = 0.074; picks (256, 128): predicts 2 * 0.074 = 0.148,
    # actual 2 * 0.114 = 0.228 -> 35% off.
    assert (results["linear"].dss, results["linear"].batch_size) == (256, 256)
    assert (results["constant"].dss, results["constant"].batch_size) == (256, 128)
    assert errors["linear"] < 0.03, errors
    assert errors["constant"] > 0.25, errors


def _feed(sizer, rounds, times, dss=128, batch_size=32):
    for _ in range(rounds):
        for w, t in times.items():
            sizer.observe(w, dss, batch_size, t)


def test_iqr_alone_misses_a_moderate_straggler_that_the_balance_band_catches():
    # Live case from an mnist1d run: [21.4, 23.7, 38.2, 51.8] ms. Q1 = 23.125,
    # Q3 = 41.6, IQR = 18.475: upper fence 69.3 ms, so 51.8 ms (1.67x the
    # 30.95 ms median) is not an IQR outlier.
    times = {"a": 0.0214, "b": 0.0237, "c": 0.0382, "d": 0.0518}
    assert iqr_outliers(times) == {}
    paper = paper_sizer(base_dss=128, base_batch_size=32, dss_step=32, dss_max=4096)
    _feed(paper, 2, times)
    assert paper.rebalance() == {}
    banded = paper_sizer(balance_band=0.2, base_dss=128, base_batch_size=32, dss_step=32, dss_max=4096)
    _feed(banded, 2, times)
    resized = banded.rebalance()
    # a, b are 31% and 23% under the 30.95 ms median, c 23% and d 67% over:
    # all four are outside the 20% band and move towards it.
    assert set(resized) == {"a", "b", "c", "d"}
    assert resized["d"].dss < resized["c"].dss <= 128 <= resized["b"].dss <= resized["a"].dss
    assert all(r.target_seconds == pytest.approx(0.03095) for r in resized.values())


def test_deadband_leaves_workers_within_tolerance_alone():
    # Three equal workers make any deviation in the fourth an IQR outlier;
    # 5% off the median is within the search tolerance (10%): no churn.
    times = {"a": 0.100, "b": 0.100, "c": 0.100, "d": 0.105}
    assert "d" in iqr_outliers(times)
    sizer = paper_sizer(base_dss=128, base_batch_size=32, dss_step=32, dss_max=4096)
    _feed(sizer, 2, times)
    assert sizer.rebalance() == {}


def test_warmup_cycles_are_kept_out_of_fit_and_detection():
    sizer = paper_sizer(warmup_cycles=1, base_dss=128, base_batch_size=32, dss_step=32, dss_max=4096)
    for w in "abcd":
        sizer.observe(w, 128, 32, 5.0 if w == "d" else 0.1)  # a huge one-off first cycle on d
    _feed(sizer, 2, {"a": 0.1, "b": 0.1, "c": 0.1, "d": 0.1})
    assert sizer.rebalance() == {}


def test_a_cut_short_cycle_is_judged_at_its_assigned_size():
    sizer = paper_sizer(base_dss=256, base_batch_size=32, dss_step=64, dss_max=4096)
    _feed(sizer, 2, {"a": 0.2, "b": 0.2, "c": 0.2}, dss=256)
    # d ran only 64 of its 256 samples (end of the data) in 0.05 s: as fast
    # per sample as the others, so it must not be called a fast outlier.
    _feed(sizer, 2, {"d": 0.05}, dss=64)
    assert sizer.rebalance() == {}
